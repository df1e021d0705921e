"""Gated delta rule: reference, Triton kernels, torch op, ONNX and TensorRT forms."""
