"""Polygraphy runners over one exported graph: eager torch, ONNX Runtime, TensorRT.

- `TorchRunner` (a `BaseRunner`) runs the layers' mode eagerly through the same `ModeGraph` wrapper the exporter
  traced (the fed weight inputs bound to the layers' buffers, as in the graph), on CPU (float64-checked
  references) or CUDA (Triton kernels); buffers are copied first because eager runs update them in place.
- `onnxrt_runner` is Polygraphy's `OnnxrtRunner` on the exported file: the custom nodes run their function bodies.
- `trt_runner` is Polygraphy's `TrtRunner` on a plan from `gdn-trt build` (or built now from the ONNX file); the
  plugin modules are imported first, since JIT plugins must be registered in the deserialising process.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx
from polygraphy.common import TensorMetadata

from gdn_trt.model.layer import GdnLayer

from .onnx_export import ModeGraph
from .spec import GraphSpec

_NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32}


class TorchRunner(BaseRunner):
    """The PyTorch layers of the graph (one, or a stack's run) in its mode, with the graph's inputs and outputs."""

    def __init__(self, layers: GdnLayer | list[GdnLayer], spec: GraphSpec, device: str = "cpu"):
        super().__init__(name=f"torch-{device}", prefix="torch-runner")
        self.layers = [layers] if isinstance(layers, GdnLayer) else list(layers)
        self.spec, self.device = spec, torch.device(device)
        self.graph: ModeGraph | None = None

    def activate_impl(self):
        self.graph = ModeGraph([la.to(self.device) for la in self.layers], self.spec).eval()

    def get_input_metadata_impl(self):
        meta = TensorMetadata()
        for t in self.spec.inputs:
            meta.add(t.name, _NP.get(t.dtype), [d if isinstance(d, int) else -1 for d in t.dims])
        return meta

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        args = [torch.from_numpy(np.array(feed_dict[n], copy=True)).to(self.device) for n in self.spec.input_names]
        with torch.no_grad():
            outs = self.graph(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.inference_time = time.perf_counter() - start
        return OrderedDict((n, o.detach().cpu().numpy()) for n, o in zip(self.spec.output_names, outs))

    def deactivate_impl(self):
        self.graph = None


def onnxrt_runner(path: Path) -> OnnxrtRunner:
    """ONNX Runtime (CPU provider) on the exported file; external weights are found beside it."""
    return OnnxrtRunner(SessionFromOnnx(str(path), providers=["cpu"]), name="onnxrt")


def trt_runner(spec: GraphSpec, onnx_path: Path, plan: Path | None = None, bucket: int = 0):
    """TensorRT on `plan` (from `gdn-trt build`) or on an engine built now from `onnx_path`, at profile `bucket`.
    Raises `TrtUnavailable` with install instructions when TensorRT does not import."""
    from .build import engine_loader, import_tensorrt, load_plugins

    import_tensorrt()
    load_plugins()
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    # an in-memory build takes the AOT kernels for an AOT-form graph (TensorRT >= 10.9), the JIT plugins otherwise
    loader = EngineFromBytes(plan.read_bytes()) if plan else engine_loader(spec, onnx_path,
                                                                           "aot" if spec.aot else "jit")
    return TrtRunner(loader, name="trt", optimization_profile=bucket)
