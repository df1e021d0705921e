"""TensorRT plugins of the gated delta rule ops (`gdn_trt::gated_delta_rule_*`, JIT QDPs).

Imported only where `tensorrt` imports (`gdn-trt build` and the TensorRT runtime import it before parsing or
deserialising: a JIT plugin must be registered in the process that runs the engine). Each op is registered from
its `OpSpec`: output `o` [T, HV, V] in the dtype of q, then the pool / stash / capture outputs aliased to their
inputs (the builder enables `ALIASED_PLUGIN_IO_10_03`). The impl runs the Triton entry points of `triton.py` on
TensorRT's stream, updating the aliased buffers in place.

No `@aot_impl` yet: an AOT plugin (TensorRT >= 10.9) is one PTX kernel per op whose parameters are the input
pointers, then int32 scalars only, then the output pointers. The chunked op launches four kernels, so it cannot be
one; the recurrent ops are one kernel each and are candidates once a wrapper kernel takes that parameter order
with the fp32 `scale` as a constexpr, both Triton scratch sizes are 0 and the PTX version fits the driver (the
full list: docs/tensorrt.md, open item 5).
"""

from __future__ import annotations

import importlib

from ..spec import GDN_CHUNKED, GDN_RECURRENT, GDN_RECURRENT_STASH, OpSpec
from ..trt_common import register_op
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
