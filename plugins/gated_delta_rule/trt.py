"""TensorRT plugins of the gated delta rule ops (`gdn_trt::gated_delta_rule_*`): JIT QDPs, and AOT ones.

Imported only where `tensorrt` imports (`gdn-trt build` and the TensorRT runtime import it before parsing or
deserialising: a JIT plugin must be registered in the process that runs the engine). Each op is registered from
its `OpSpec`: output `o` [T, HV, V] in the dtype of q, then the pool / stash / capture outputs aliased to their
inputs (the builder enables `ALIASED_PLUGIN_IO_10_03`). The impl runs the Triton entry points of `triton.py` on
TensorRT's stream, updating the aliased buffers in place.

Ahead of time (TensorRT >= 10.9, `gdn-trt build --plugins aot`): `@trtp.aot_impl` hands TensorRT one compiled
kernel per plugin (`plugins/aot.py`): the recurrent ops have one each; the chunked op, which launches four kernels,
is exported as four pass plugins (`spec.AOT_CHAINS`: solve, w/u, state, output; `gdn-trt export --aot`), each with
an `@aot_impl` and a JIT impl that launches the same wrapper kernel. The chunked op itself stays JIT only. With both
impls registered, the build chooses with TensorRT's network flag PREFER_AOT_PYTHON_PLUGINS or
PREFER_JIT_PYTHON_PLUGINS (`export/build.py`).
"""

from __future__ import annotations

import importlib

from ..spec import AOT_CHAINS, AOT_PLUGINS, GDN_CHUNKED, GDN_RECURRENT, GDN_RECURRENT_STASH, OpSpec
from ..trt_common import register_aot, register_op, register_pass
from .io import dispatch

SPECS = (GDN_RECURRENT, GDN_RECURRENT_STASH, GDN_CHUNKED)


def _output(descs: dict, attrs: dict):
    o = descs["v"].like()  # [T, HV, V]
    o.dtype = descs["q"].dtype
    return o


def _launcher(spec: OpSpec):
    def launch(t: dict, attrs: dict, out) -> None:
        o = dispatch(spec, importlib.import_module("gdn_trt.plugins.gated_delta_rule.triton"), t)
        # the entry points allocate o; TensorRT owns the output buffer (an `out=` launcher would save this copy)
        out.copy_(o)

    return launch


for _spec in SPECS:
    register_op(_spec, _output, _launcher(_spec))
for _spec in AOT_CHAINS[GDN_CHUNKED]:
    register_pass(_spec)
for _spec in (*SPECS, *AOT_CHAINS[GDN_CHUNKED]):
    if _spec in AOT_PLUGINS:
        register_aot(_spec)
