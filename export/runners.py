"""Polygraphy runners over one exported graph: eager torch, ONNX Runtime, ONNX's reference evaluator, TensorRT.

- `TorchRunner` (a `BaseRunner`) runs the layers' mode eagerly through the same `ModeGraph` wrapper the exporter
  traced (the fed weight inputs bound to the layers' buffers, as in the graph), on CPU (float64-checked
  references) or CUDA (Triton kernels); buffers are copied first because eager runs update them in place.
- `onnxrt_runner` is Polygraphy's `OnnxrtRunner` on the exported file: the custom nodes run their function bodies.
- `OnnxRefRunner` is ONNX's reference evaluator (`onnx.reference.ReferenceEvaluator`) on the exported file, in the
  graph's own dtypes: it is how a bfloat16 export is run on a CPU, since ONNX Runtime's CPU provider has no bf16
  kernel for most ops (`Add(14)` is the first a GDN graph meets: NOT_IMPLEMENTED at session creation).
- `trt_runner` is Polygraphy's `TrtRunner` on a plan from `gdn-trt build` (or built now from the ONNX file); the
  plugin modules are imported first, since JIT plugins must be registered in the deserialising process.

Feeds and outputs are numpy arrays where numpy has the dtype and torch tensors otherwise (bfloat16): Polygraphy's
Comparator and data loaders take either.
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
from polygraphy.datatype import DataType

from gdn_trt.model.layer import GdnLayer

from .onnx_export import ModeGraph
from .spec import GraphSpec

def as_torch(x) -> torch.Tensor:
    """A feed (numpy array or torch tensor) as a torch tensor of its own (the caller may write it)."""
    return x.clone() if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x, copy=True))


def from_torch(t: torch.Tensor):
    """numpy where numpy has the dtype, else the torch tensor itself (on the CPU)."""
    t = t.detach().cpu()
    return t if t.dtype == torch.bfloat16 else t.numpy()


def spec_metadata(spec: GraphSpec) -> TensorMetadata:
    meta = TensorMetadata()
    for t in spec.inputs:
        meta.add(t.name, DataType.from_dtype(t.torch_dtype), [d if isinstance(d, int) else -1 for d in t.dims])
    return meta


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
        return spec_metadata(self.spec)

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        args = [as_torch(feed_dict[n]).to(self.device) for n in self.spec.input_names]
        with torch.no_grad():
            outs = self.graph(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.inference_time = time.perf_counter() - start
        return OrderedDict((n, from_torch(o)) for n, o in zip(self.spec.output_names, outs))

    def deactivate_impl(self):
        self.graph = None


def onnxrt_runner(path: Path) -> OnnxrtRunner:
    """ONNX Runtime (CPU provider) on the exported file; external weights are found beside it."""
    return OnnxrtRunner(SessionFromOnnx(str(path), providers=["cpu"]), name="onnxrt")


class OnnxRefRunner(BaseRunner):
    """ONNX's reference evaluator on the exported file (its external weights loaded from beside it): every node in
    the dtypes the graph declares, bfloat16 as `ml_dtypes` arrays (numpy computes each bf16 op in float32 and
    rounds its result, as torch's CPU ops do). Pure numpy, one node at a time: fine for the tiny presets and single
    layers, minutes for a real model's prefill graph."""

    def __init__(self, path: Path, spec: GraphSpec):
        super().__init__(name="onnxref", prefix="onnxref-runner")
        self.path, self.spec = Path(path), spec
        self.evaluator = None

    def activate_impl(self):
        import onnx
        from onnx.reference import ReferenceEvaluator

        self.evaluator = ReferenceEvaluator(onnx.load(str(self.path)))

    def get_input_metadata_impl(self):
        return spec_metadata(self.spec)

    def infer_impl(self, feed_dict):
        import ml_dtypes  # onnx's own dependency: numpy's bfloat16

        start = time.perf_counter()
        feeds = {}
        for name in self.spec.input_names:
            x = feed_dict[name]
            if isinstance(x, torch.Tensor):
                x = (x.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16) if x.dtype == torch.bfloat16
                     else x.cpu().numpy())
            feeds[name] = np.array(x, copy=True)
        outs = self.evaluator.run(None, feeds)
        self.inference_time = time.perf_counter() - start
        res = OrderedDict()
        for name, o in zip(self.spec.output_names, outs):
            o = np.asarray(o)
            res[name] = (torch.from_numpy(o.view(np.int16).copy()).view(torch.bfloat16)
                         if o.dtype == ml_dtypes.bfloat16 else o)
        return res

    def deactivate_impl(self):
        self.evaluator = None


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
