"""torch ops of the gated delta rule (`torch.ops.gdn_trt.gated_delta_rule_*`) and their Python entry points.

The model calls `recurrent`, `recurrent_stash` and `chunked` below. In eager runs they call the in-place operators
(buffers written in place, CPU -> `naive.py`, CUDA -> `triton.py`); while `torch.export` traces (ONNX export) they
call the functional operators, which the exporter maps onto the `gdn_trt` ONNX nodes.
"""

from __future__ import annotations

from types import ModuleType
from typing import Sequence

import torch
from torch import Tensor

from .. import library
from ..packing import Capture, Packing
from ..spec import GDN_CHUNKED, GDN_RECURRENT, GDN_RECURRENT_STASH, OpSpec
from . import naive
from .io import GdnInputs, dispatch

_BACKENDS = library.Backends(naive, "gdn_trt.plugins.gated_delta_rule.triton")


def _adapter(spec: OpSpec, m: ModuleType, args: Sequence) -> Tensor:
    return dispatch(spec, m, dict(zip(spec.inputs, args)))


def _fake(q: Tensor, k: Tensor, v: Tensor, *rest) -> Tensor:
    return v.new_empty(v.shape, dtype=q.dtype)


for _spec in (GDN_RECURRENT, GDN_RECURRENT_STASH, GDN_CHUNKED):
    library.register(_spec, _BACKENDS, _adapter, _fake)


def _flat(x: GdnInputs, pack: Packing) -> tuple[Tensor, ...]:
    return (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, pack.cu_seqlens, pack.slots)


def _functional() -> bool:
    return torch.compiler.is_exporting()


def recurrent(x: GdnInputs, pack: Packing, ssm_pool: Tensor) -> tuple[Tensor, Tensor]:
    """Decode modes. Returns (o [T, HV, V], ssm_pool after the step)."""
    if _functional():
        return library.op(GDN_RECURRENT, inplace=False)(*_flat(x, pack), ssm_pool)
    return library.op(GDN_RECURRENT, inplace=True)(*_flat(x, pack), ssm_pool), ssm_pool


def recurrent_stash(x: GdnInputs, pack: Packing, ssm_pool: Tensor, ssm_stash: Tensor) -> tuple[Tensor, Tensor]:
    """Verify modes: the pool is read only. Returns (o, ssm_stash [T, HV, K, V] with the state after each token)."""
    if _functional():
        return library.op(GDN_RECURRENT_STASH, inplace=False)(*_flat(x, pack), ssm_pool, ssm_stash)
    return library.op(GDN_RECURRENT_STASH, inplace=True)(*_flat(x, pack), ssm_pool, ssm_stash), ssm_stash


def chunked(x: GdnInputs, pack: Packing, ssm_pool: Tensor, capture: Capture) -> tuple[Tensor, Tensor, Tensor]:
    """Prefill modes. Returns (o, ssm_pool after the step, capture buffer)."""
    if _functional():
        return library.op(GDN_CHUNKED, inplace=False)(*_flat(x, pack), ssm_pool, capture.at, capture.buf)
    o = library.op(GDN_CHUNKED, inplace=True)(*_flat(x, pack), ssm_pool, capture.at, capture.buf)
    return o, ssm_pool, capture.buf
