"""Causal depthwise conv with state: reference, Triton kernels, torch op, ONNX and TensorRT forms."""
