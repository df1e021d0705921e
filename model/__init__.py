"""The PyTorch definition of the GDN layer: config, checkpoints, the layer and its modes."""
