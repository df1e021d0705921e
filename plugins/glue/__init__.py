"""Fused glue of the GDN layer (norms, gates, residual arithmetic): reference, Triton kernels, entry points."""
