"""Plugin-free engine builds with TensorRT-RTX, ahead of time on a CPU: TensorRT's own ONNX parser and builder
check the exported graphs (the `gdn_trt` nodes replaced by their function bodies, inlined first).

TensorRT-RTX 1.7.1 cannot host the Python plugins (its bindings have no `tensorrt.plugin` and no `add_plugin*`) and
does not run on Hopper (its compute capabilities stop short of SM90: on the H200 it builds and refuses to run), so
this is a check of the graphs, not a deployment path: `build_plugin_free` returns the serialized plan's size for a
target compute capability (SM86 by default; a CPU-only machine needs an explicit one). Module: the bare bindings
wheel installs `tensorrt_rtx_bindings`, the meta wheel `tensorrt_rtx`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import onnx
import onnx.inliner

if TYPE_CHECKING:  # only the annotation: this module also loads where torch is absent (a cp312 TensorRT-RTX env)
    from .spec import GraphSpec

INSTALL = ("TensorRT-RTX is not installed: pip install tensorrt-rtx-cu13-libs==1.7.1.116 "
           "tensorrt-rtx-cu13-bindings==1.7.1.116 (cp312 wheels, ~96 MB; not in the default install)")


def import_rtx():
    """The TensorRT-RTX module, or ImportError with the install line."""
    for name in ("tensorrt_rtx", "tensorrt_rtx_bindings"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(INSTALL)


def build_plugin_free(onnx_path: Path, spec: GraphSpec, sm: str = "SM86") -> int:
    """Parse `onnx_path` with its custom nodes inlined, one profile per GraphSpec bucket; returns the plan's bytes.
    Raises RuntimeError with the parser's or builder's errors."""
    trt = import_rtx()
    model = onnx.inliner.inline_local_functions(onnx.load(str(onnx_path)))
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString(), str(onnx_path)):
        errors = [parser.get_error(i).desc() for i in range(parser.num_errors)]
        raise RuntimeError(f"{onnx_path}: TensorRT-RTX cannot parse it: {errors}")
    config = builder.create_builder_config()
    config.num_compute_capabilities = 1
    config.set_compute_capability(getattr(trt.ComputeCapability, sm), 0)
    for i in range(len(spec.buckets)):
        profile = builder.create_optimization_profile()
        for name, (mn, opt, mx) in spec.profile(i).items():
            profile.set_shape(name, mn, opt, mx)
        config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(f"{onnx_path}: TensorRT-RTX parsed it but the build failed (see its log above)")
    return plan.nbytes
