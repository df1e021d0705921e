"""Entry points of the fused glue: shape checks, then CPU -> `naive.py`, CUDA -> `triton.py`.

The layer calls these on its fused path (CUDA by default, `GdnLayer.fused_glue`). Unlike the GDN and conv ops they
are plain functions, not torch.library operators: nothing here is exported (ONNX export and torch.compile trace the
layer's torch code, which computes the same functions op by op), so an operator schema would buy nothing and its
dispatch would add host time to each of the ~6 calls per layer and step. The checks read shapes, strides and dtypes
only (no tensor data: safe under CUDA-graph capture), so a bad call raises before any kernel runs.

Why hand-written kernels and not torch.compile of the layer body (measured on the H200, 2026-12-03,
bench/results/2026-12-03-glue.md): Inductor's fused glue was no faster (Qwen3-Next prefill 4096: 41.8 us vs 42.4;
decode N = 1: 6.6 us vs 3.8), and every compiled call copied the pools that the in-place ops mutate (261 us per
layer for 256 slots, 454 us per decode replay against 43.7), besides a compile per token count.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import library
from ..causal_conv1d import op as conv_op
from ..causal_conv1d.io import ConvParams
from ..gated_delta_rule import op as gdn_op
from ..gated_delta_rule.io import GdnInputs
from ..packing import Packing
from ..spec import Activation
from . import naive
from .io import PleNorms, check_rows, check_same, check_vector

_BACKENDS = library.Backends(naive, "gdn_trt.plugins.glue.triton")
# the skinny GEMM (gemm.py) takes a projection where its launch for that M bucket and width beat cuBLAS on the H200
# (`gemm.dispatched`: the per-row times of `gemm.TABLE`, written by `bench/gemm.py --sweep --apply`), and only from
# GEMM_MIN_N rows and GEMM_MIN_K columns: the sweep tunes the launches on N >= 2048, K >= 2048 (Qwen3-Next's out_proj
# and in_proj); on Qwen4-Exp's hc up-projection [10240, 320] (three K steps per program) cuBLAS stays ahead:
# 4.32 against our 4.67 us at M = 1 and 4.33 against 4.72 at M = 8 (bench/results/2026-12-03-gemm-uncut.md).
GEMM_MIN_N = 1024
GEMM_MIN_K = 1024
_GEMM_DTYPES = (torch.bfloat16, torch.float16)


def _impl(x: Tensor):
    return _BACKENDS.for_device(x.device)


def _check_adds(x: Tensor, adds: Sequence[Tensor]) -> None:
    if len(adds) > 2:
        raise ValueError(f"at most two residual deltas, got {len(adds)}")
    check_rows("x", x, x.shape[0] if x.dim() else 0)
    for a in adds:
        check_rows("residual delta", a, x.shape[0], x.shape[1])
    check_same(x, *adds)


def add_rms_norm(x: Tensor, adds: Sequence[Tensor], w: Tensor, eps: float, group: int) -> tuple[Tensor, Tensor]:
    """r = x + (adds[0] + adds[1]) and h = RMSNorm(1 + w) of r over groups of `group` channels; x, adds [T, D],
    w [D]. Returns (h, r) [T, D] (r is x when `adds` is empty)."""
    _check_adds(x, adds)
    if group < 1 or x.shape[1] % group:
        raise ValueError(f"the norm group ({group}) must divide the row width {x.shape[1]}")
    check_vector("norm weight", w, x.shape[1])
    return _impl(x).add_rms_norm(x, tuple(adds), w, eps, group)


def hc_norm(x: Tensor, adds: Sequence[Tensor], w: Tensor, inject: Tensor, eps: float
            ) -> tuple[Tensor, Tensor, Tensor]:
    """The hc sublayer entry: (hn, r) as `add_rms_norm` per stream of C = D / n channels and the inject logits
    hn inject^T by stream group (naive.hc_norm). x, adds [T, D]; w [D]; inject [n, D].
    Returns (hn, r, logits [T, n, n] in fp32, or fp64 for fp64 inputs)."""
    _check_adds(x, adds)
    if inject.dim() != 2 or inject.shape[1] != x.shape[1] or x.shape[1] % inject.shape[0] or \
            not inject.is_contiguous():
        raise ValueError(f"inject must be a contiguous [n, {x.shape[1]}] weight with n dividing {x.shape[1]}, "
                         f"got {tuple(inject.shape)}")
    check_vector("hc norm weight", w, x.shape[1])
    return _impl(x).hc_norm(x, tuple(adds), w, inject, eps)


def gated_rms_norm(o: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """w * RMSNorm(o) * act(z) per value head; o, z [T, HV, V] (z may be a strided view), w [V]."""
    if o.dim() != 3 or z.shape != o.shape or z.stride(2) != 1:
        raise ValueError(f"o and z must be [T, HV, V] (z with unit stride along V), got {tuple(o.shape)}, "
                         f"{tuple(z.shape)} strides {z.stride()}")
    if act not in ("silu", "sigmoid"):
        raise ValueError(f"act must be silu or sigmoid, got {act!r}")
    check_vector("gated norm weight", w, o.shape[2])
    check_same(o, z)
    return _impl(o).gated_rms_norm(o, z, w, eps, act)


def silu_mul(gu: Tensor) -> Tensor:
    """SwiGLU: gu [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
    check_rows("gate_up", gu, gu.shape[0] if gu.dim() else 0)
    if gu.shape[1] % 2:
        raise ValueError(f"gate_up must have an even width, got {gu.shape[1]}")
    return _impl(gu).silu_mul(gu)


def silu_div(x: Tensor, n: int) -> Tensor:
    """silu(x / n), x [T, R]."""
    check_rows("x", x, x.shape[0] if x.dim() else 0)
    return _impl(x).silu_div(x, n)


def hc_mix(hn: Tensor, up: Tensor, n: int) -> Tensor:
    """Mean over the n streams of sigmoid(up) * hn: hn, up [T, n*C] -> [T, C]."""
    check_rows("hn", hn, hn.shape[0] if hn.dim() else 0)
    check_rows("up", up, hn.shape[0], hn.shape[1])
    if hn.shape[1] % n:
        raise ValueError(f"{n} streams do not divide the width {hn.shape[1]}")
    check_same(hn, up)
    return _impl(hn).hc_mix(hn, up, n)


def hc_inject(streams: Tensor, logits: Tensor, y: Tensor) -> Tensor:
    """streams [T, n*C] + 2 sigmoid(logits.sum(1) / n) [T, n] * y [T, C] on each stream -> the new streams
    [T, n*C]; logits [T, n, n] from `hc_norm`."""
    T = streams.shape[0] if streams.dim() else 0
    check_rows("y", y, T)
    n = logits.shape[1] if logits.dim() == 3 else 0
    if logits.dim() != 3 or tuple(logits.shape) != (T, n, n) or not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be [{T}, n, n] (hc_norm's), got {tuple(logits.shape)}")
    check_rows("streams", streams, T, n * y.shape[1])
    check_same(streams, y)
    return _impl(streams).hc_inject(streams, logits, y)


def ple_gate(key: Tensor, value: Tensor, streams: Tensor, norms: PleNorms) -> tuple[Tensor, Tensor]:
    """The PLE gate (naive.ple_gate): key, streams [T, n*C], value [T, C] -> (gv, u) [T, n*C]."""
    T = key.shape[0] if key.dim() else 0
    check_rows("value", value, T)
    C = value.shape[1]
    check_rows("key", key, T)
    if key.shape[1] % C:
        raise ValueError(f"key width {key.shape[1]} is not a multiple of the value width {C}")
    check_rows("streams", streams, T, key.shape[1])
    for name in ("key", "query", "conv"):
        check_vector(f"PLE norm_{name}", getattr(norms, name), key.shape[1])
    check_same(key, value, streams)
    return _impl(key).ple_gate(key, value, streams, norms)


def _skinny(x: Tensor, w: Tensor) -> bool:
    """Whether the skinny GEMM can take x w^T at all: CUDA, bf16 or fp16, N >= GEMM_MIN_N, K >= GEMM_MIN_K, x
    unit-strided along K, w contiguous, M within the table."""
    return (x.is_cuda and x.dtype in _GEMM_DTYPES and x.dim() == 2 and w.dim() == 2 and w.dtype == x.dtype
            and w.device == x.device and w.shape[0] >= GEMM_MIN_N and x.shape[1] == w.shape[1] >= GEMM_MIN_K
            and x.stride(1) == 1 and w.is_contiguous() and 1 <= x.shape[0] <= _impl(x).gemm.TABLE[-1].max_m)


def linear(x: Tensor, w: Tensor) -> Tensor:
    """y = x w^T of one of the layer's projections: x [M, K], w [N, K] -> [M, N]. A decode-sized call on CUDA
    (`_skinny`) whose launch in `gemm.TABLE` beat cuBLAS runs the skinny Triton GEMM (gemm.py); every other call,
    the CPU and fp32 ones included, is F.linear exactly as before."""
    if _skinny(x, w) and _impl(x).gemm.dispatched(x.shape[0], w.shape[0]):
        return _impl(x).linear(x, w)
    return F.linear(x, w)


def conv_in_gemm(x: Tensor, w: Tensor) -> bool:
    """Whether `linear_conv(x, w, ...)` runs as one launch (the skinny GEMM takes the call and
    `triton.Tuning.conv_in_gemm` is on); the layer calls it only then, and the projection and the conv kernel
    separately otherwise. Not only where `gemm.dispatched`: at M = 33..64 on in_proj the table's launch trails cuBLAS
    (16.9 against 16.0 us), which the saved conv launch may repay, so the fused layer's projection there is the
    skinny GEMM's where the unfused one's is cuBLAS's (equal within the GEMM's rounding, not bit for bit); the A/B of
    the whole step (bench/switches.py) decides."""
    return _skinny(x, w) and _impl(x).TUNING.conv_in_gemm


def linear_conv(x: Tensor, w: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> Tensor:
    """The in-projection and the conv update of a decode step in one: y = x w^T [M, N], whose first D columns
    (D = the conv's channels, D <= N) are replaced by the causal conv update of those columns as
    `causal_conv1d.op.update` computes it, which writes each sequence's window after its token to conv_pool[slot].
    For the modes with one token per sequence (`ModeSpec.one_token_per_sequence`): token m is sequence m, so
    pack.cu_seqlens must be 0..M (not read: the caller's mode guarantees it). The conv must be the GDN conv: width
    4, dilation 1, silu. On CUDA a call the skinny GEMM can take (`_skinny`) runs it with the conv in its epilogue
    (gemm._conv_store): one launch instead of two, and the projection's conv columns are never read back; any other
    CUDA call runs `linear` and the conv op."""
    M = x.shape[0] if x.dim() == 2 else -1
    cw = conv.weight
    D = cw.shape[0] if cw.dim() == 2 else -1
    if w.dim() != 2 or x.dim() != 2 or x.shape[1] != w.shape[1] or not 0 < D <= w.shape[0]:
        raise ValueError(f"x [M, K] and w [N, K] with N >= the conv's channels, got {tuple(x.shape)}, "
                         f"{tuple(w.shape)} and a conv weight {tuple(cw.shape)}")
    if cw.shape[1] != 4 or conv.dilation != 1 or conv.activation != Activation.SILU:
        raise ValueError(f"the fused conv is the GDN conv (width 4, dilation 1, silu), got width {cw.shape[1]}, "
                         f"dilation {conv.dilation}, activation {conv.activation}")
    if tuple(conv_pool.shape[1:]) != (3, D) or conv_pool.dim() != 3 or not conv_pool.is_contiguous() \
            or not cw.is_contiguous():
        raise ValueError(f"conv_pool must be a contiguous [S, 3, {D}] tensor and the conv weight contiguous, got "
                         f"{tuple(conv_pool.shape)}")
    check_same(x, w, cw, conv_pool)
    pack.check_shapes(M)
    if pack.num_seqs != M or pack.slots.device != x.device:
        raise ValueError(f"one token per sequence on x's device: {M} tokens on {x.device}, {pack.num_seqs} "
                         f"sequences on {pack.slots.device}")
    if x.is_cuda and not _skinny(x, w):  # the two ops the unfused layer runs
        y = linear(x, w)
        y[:, :D] = conv_op.update(y[:, :D], conv, pack, conv_pool)[0]
        return y
    return _impl(x).linear_conv(x, w, conv, pack, conv_pool)


def norm_in_decode(x: GdnInputs, pack: Packing) -> bool:
    """Whether `recurrent_norm(x, pack, ...)` runs as one launch (CUDA, `triton.Tuning.norm_in_decode` on, and the
    recurrent kernel's tuning takes its one-tile form for this call: `decode_norm.takes`); the layer calls it only
    then, and the GDN op and `gated_rms_norm` separately otherwise."""
    return x.q.is_cuda and _impl(x.q).TUNING.norm_in_decode and _impl(x.q).decode_norm.takes(x, pack)


def recurrent_norm(x: GdnInputs, pack: Packing, ssm_pool: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """The decode step of the gated delta rule and its output's gated norm in one: y = gated_rms_norm(o, z, w, eps,
    act) [T, HV, V] of o = `gated_delta_rule.op.recurrent(x, pack, ssm_pool)`, which updates ssm_pool[slot] in
    place. On CUDA a call `norm_in_decode` takes runs as one launch (decode_norm.py: the norm in the recurrent
    kernel's epilogue, o never read back by another kernel); any other CUDA call runs the two ops."""
    x.check(pack, ssm_pool)
    T, HV, V = x.v.shape
    if tuple(z.shape) != (T, HV, V) or z.stride(2) != 1:
        raise ValueError(f"z must be [{T}, {HV}, {V}] with unit stride along V, got {tuple(z.shape)} strides "
                         f"{z.stride()}")
    if act not in ("silu", "sigmoid"):
        raise ValueError(f"act must be silu or sigmoid, got {act!r}")
    check_vector("gated norm weight", w, V)
    check_same(x.v, z)
    if x.q.is_cuda and not norm_in_decode(x, pack):
        return gated_rms_norm(gdn_op.recurrent(x, pack, ssm_pool)[0], z, w, eps, act)
    return _impl(x.q).recurrent_norm(x, pack, ssm_pool, z, w, eps, act)
