"""TensorRT plugins of the causal conv ops (`gdn_trt::causal_conv1d_*`, JIT QDPs).

Imported only where `tensorrt` imports. Each op is registered from its `OpSpec`: output `y` like `x` [T, D], then
the pool / stash / capture outputs aliased to their inputs; attributes `dilation` and `activation` arrive as INT32
plugin fields (the ONNX parser converts INT attributes to INT32 fields), declared as one-element int32 arrays
(`trt_common.ATTR_TYPE`: an `int` declaration fails on TensorRT < 11.2 with numpy >= 2.4) and handed to `launch`
as ints. The impl runs the Triton entry points of `triton.py` on TensorRT's stream.

No `@aot_impl` yet: the prefill op launches more than one kernel, and the update kernels take `dilation` and
`activation` as constexprs, so an AOT build needs one PTX per attribute value (attributes are not serialised with
AOT plugins); the AOT requirements are listed in docs/tensorrt.md.
"""

from __future__ import annotations

import importlib

from ..spec import CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, OpSpec
from ..trt_common import register_op
from .io import dispatch

SPECS = (CONV_UPDATE, CONV_UPDATE_STASH, CONV_PREFILL)


def _output(descs: dict, attrs: dict):
    return descs["x"].like()


def _launcher(spec: OpSpec):
    def launch(t: dict, attrs: dict, out) -> None:
        y = dispatch(spec, importlib.import_module("gdn_trt.plugins.causal_conv1d.triton"), t, attrs)
        out.copy_(y)

    return launch


for _spec in SPECS:
    register_op(_spec, _output, _launcher(_spec))
