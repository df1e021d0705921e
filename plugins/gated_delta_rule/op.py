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
from ..causal_conv1d.io import ConvParams
from ..packing import Capture, Packing
from ..spec import GDN_CHUNKED, GDN_RECURRENT, GDN_RECURRENT_STASH, Activation, OpSpec
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


def conv_recurrent(x: GdnInputs, conv: ConvParams, pack: Packing, conv_pool: Tensor, ssm_pool: Tensor) -> Tensor:
    """The decode step's conv update and recurrence in one call (CPU: `naive.conv_recurrent`, the two references in
    turn; CUDA: one launch, `triton_fused`): x.q, x.k, x.v are the conv's input, one token per sequence (T = N).
    Returns o [N, HV, V]; conv_pool[slot] and ssm_pool[slot] are updated in place. A plain function like the fused
    glue (`plugins/glue/op.py`): the layer calls it on its fused path only, so nothing exports it. Shapes, dtypes
    and devices are checked before anything runs (no tensor data read)."""
    x.check(pack, ssm_pool)
    T, H, K = x.q.shape
    HV, V = x.v.shape[1:]
    D = 2 * H * K + HV * V
    if pack.num_seqs != T:
        raise ValueError(f"conv_recurrent takes one token per sequence, got {T} tokens for {pack.num_seqs} sequences")
    w = conv.weight
    if conv.dilation != 1 or conv.activation not in (Activation.NONE, Activation.SILU):
        raise ValueError(f"conv_recurrent runs the GDN conv (dilation 1, no activation or silu), got dilation "
                         f"{conv.dilation}, activation {conv.activation}")
    if w.dim() != 2 or w.shape[0] != D or w.shape[1] < 2 or not w.is_contiguous() or w.dtype != x.q.dtype \
            or w.device != x.q.device:
        raise ValueError(f"the conv weight must be a contiguous {x.q.dtype} [{D}, W >= 2] on {x.q.device}, got "
                         f"{w.dtype} {tuple(w.shape)} on {w.device}")
    want = (ssm_pool.shape[0], w.shape[1] - 1, D)
    if tuple(conv_pool.shape) != want or conv_pool.dtype != x.q.dtype or conv_pool.device != x.q.device \
            or not conv_pool.is_contiguous():
        raise ValueError(f"conv_pool must be a contiguous {x.q.dtype} {want} on {x.q.device} (the SSM pool's slots), "
                         f"got "
                         f"{conv_pool.dtype} {tuple(conv_pool.shape)} on {conv_pool.device}")
    return _BACKENDS.for_device(x.q.device).conv_recurrent(x, conv, pack, conv_pool, ssm_pool)
