"""TensorRT plugins of the causal conv ops (`gdn_trt::causal_conv1d_*`): JIT QDPs, and AOT ones.

Imported only where `tensorrt` imports. Each op is registered from its `OpSpec`: output `y` like `x` [T, D], then
the pool / stash / capture outputs aliased to their inputs; attributes `dilation` and `activation` arrive as INT32
plugin fields (the ONNX parser converts INT attributes to INT32 fields), declared as one-element int32 arrays
(`trt_common.ATTR_TYPE`: an `int` declaration fails on TensorRT < 11.2 with numpy >= 2.4) and handed to `launch`
as ints. The impl runs the Triton entry points of `triton.py` on TensorRT's stream.

Ahead of time (TensorRT >= 10.9): `@trtp.aot_impl` hands TensorRT one compiled kernel per plugin (`plugins/aot.py`),
with `dilation` and `activation` as constexprs (an AOT plugin's attributes are read at build time and not serialised:
one kernel per value). The update ops have one kernel each; the prefill op, two launches, is exported as two pass
plugins (`spec.AOT_CHAINS`: chunk, state; `gdn-trt export --aot`), each with an `@aot_impl` and a JIT impl of the
same wrapper kernel. The prefill op itself stays JIT only.
"""

from __future__ import annotations

import importlib

from ..spec import AOT_CHAINS, AOT_PLUGINS, CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, OpSpec
from ..trt_common import register_aot, register_op, register_pass
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
for _spec in AOT_CHAINS[CONV_PREFILL]:
    register_pass(_spec)
for _spec in (*SPECS, *AOT_CHAINS[CONV_PREFILL]):
    if _spec in AOT_PLUGINS:
        register_aot(_spec)
