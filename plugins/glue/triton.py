"""Triton kernels of the fused glue: same names, arguments and results as `naive.py`.

Why these kernels: in the layer's torch code every norm, gate and residual add is several elementwise kernels and
dtype copies (an RMSNorm(1 + w) alone is eight: upcast, square, mean, add, rsqrt, two products, downcast), and at
decode each of them costs a launch (~2 us of device time) for a few kilobytes of data. Each kernel here reads its
inputs once and writes its outputs once, computing in fp32 in registers:
- `add_rms_norm`: the residual add(s) and the RMSNorm(1 + w), one program per (row, stream);
- `hc_norm`: the same for an hc sublayer, plus its inject logits hn inject^T: the [n, n*C] inject weight is tiny,
  so each (row, stream) program, which holds that stream's normed channels, also forms their share of the n dot
  products (a [n, C] tile, one 2D reduction) and `hc_inject` sums the n shares and applies 2 sigmoid(. / n); this
  saves a GEMM launch and a gate kernel. (The first version ran one program per row over the n streams with n + 1
  reductions per stream: 20.3 us at decode N = 1 on the H200 for Qwen4-Exp, a single SM's serial latency,
  bench/results/2026-12-03-glue.md.)
- `gated_rms_norm`: the GDN output norm per value head times act(z), reading z in place from the projection
  (a strided column slice: its row and head strides are kernel arguments, nothing is copied);
- `silu_mul` (SwiGLU), `silu_div` (the hc low-rank activation), `hc_mix` (sigmoid gates, product, mean over the
  streams), `hc_inject` (the hc residual), `ple_gate` (the PLE key/query norms, gate, value product and conv norm).
- `linear` is the skinny GEMM of `gemm.py` (decode-sized projections), `linear_conv` the same with the conv update
  in its epilogue, and `recurrent_norm` the GDN decode with the gated norm in its epilogue (`decode_norm.py`),
  kept here so that this module has every entry name of `naive.py`.
The kernels round intermediates to the activation dtype where the torch code does (each torch op on bf16 rounds
its result): in bf16 they then agree with the torch code to a few units of the last place instead of drifting by
the sum of the skipped roundings; in fp32 those casts are no-ops.

CUDA-graph safe: no host reads of tensor data, outputs sized from shapes only, launches on the current stream.
Operands may have any row stride; their last dim must be contiguous (the checks in `op.py` say so).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from typing import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import pdl
from ..causal_conv1d.io import ConvParams
from ..gated_delta_rule.io import GdnInputs
from ..packing import Packing
from . import decode_norm
from .decode_norm import gated_rows
from . import gemm  # noqa: F401 (op.linear asks gemm.dispatched)
from .gemm import linear  # noqa: F401 (the Triton entry of naive.linear)
from .io import PleNorms


@dataclass(frozen=True)
class Tuning:
    """Launch parameters. Every kernel is memory-bound and row-local, so the only choices are how many elements a
    program holds and how many warps share them (not swept: at decode these kernels are launch-bound, at prefill
    they stream rows of several kilobytes)."""

    block: int = 1024  # channels per program of the elementwise kernels
    rows: int = 16  # value-head rows per program of the gated norm (V = 128: 2048 elements)
    warps: int = 4
    wide_warps: int = 8  # row kernels holding 4096 or more elements per program
    # the decode step's conv update in the in-projection's epilogue (`linear_conv`), where the layer uses it. Off:
    # its GPU tests pass, but the step's graph replay took 0.971 / 1.100 / 1.014 / 1.000x the unfused one's at
    # N = 1 / 8 / 64 / 256 (H200, bench/results/2026-12-05-switches.md): the conv kernel was mostly hidden beside
    # in_proj already (PDL), and at M = 33..64 the fused in_proj is the skinny GEMM, which trails cuBLAS there. With
    # the TMA launch as that GEMM (bench/results/2026-12-05-gemm-step-tma-conv.md) the N = 64 step took 440.0 us
    # against the unfused cuBLAS step's 429.6 (the fused in_proj 23.4 us, the GDN decode after it 74.4 against 70.9).
    # GDN_TRT_CONV_IN_GEMM=1 turns it on (the A/B switch of the benches: bench/gpu-all.sh conv)
    conv_in_gemm: bool = os.environ.get("GDN_TRT_CONV_IN_GEMM", "0") == "1"
    # the decode step's gated output norm in the GDN decode kernel's epilogue (`recurrent_norm`, decode_norm.py),
    # where the layer uses it. Off: its GPU tests pass, but the replay took 0.991 / 1.013 / 1.025 / 1.039x the
    # unfused one's (same run): the separate norm overlapped the decode's tail, the fused one runs after it in the
    # last program of each head. GDN_TRT_NORM_IN_DECODE=1 turns it on (bench/gpu-all.sh norm)
    norm_in_decode: bool = os.environ.get("GDN_TRT_NORM_IN_DECODE", "0") == "1"


TUNING = Tuning()


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Every output comes from here (shapes only; tests swap it to poison outputs with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _warps(block: int) -> int:
    return TUNING.wide_warps if block >= 4096 else TUNING.warps


@triton.jit
def _rms(b_x, b_w, eps, G: tl.constexpr):
    """RMSNorm(1 + w) of one group of G channels held as fp32 b_x (masked lanes 0), weight b_w; fp32 result."""
    b_rs = tl.rsqrt(tl.sum(b_x * b_x, 0) / G + eps)
    return b_x * b_rs * (1.0 + b_w.to(tl.float32))


@triton.jit
def norm_kernel(
    x, d0, d1, w, inject, h, r, logits,  # x, d0, d1 [T, D]; w [D]; inject [NG, D]; h, r [T, D]; logits [T, NG, NG]
    s_x, s_d0, s_d1, eps,
    D: tl.constexpr, G: tl.constexpr, NG: tl.constexpr, BG: tl.constexpr, BN: tl.constexpr,
    N_ADD: tl.constexpr, INJECT: tl.constexpr, PDL: tl.constexpr = False,
):
    """One (row, group of G channels): r = x + (d0 + d1), h = RMSNorm(1 + w) of r, and with INJECT the group's
    share of the NG inject logits, logits[t, g, i] = <h[t, group g], inject[i, group g]> (one 2D reduction)."""
    pdl.enter(PDL)
    i_t, i_g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    dt = h.dtype.element_ty
    o_g = tl.arange(0, BG)
    m_g = o_g < G
    o_c = i_g * G + o_g
    # every load is issued before the first reduction (a reduction's barrier keeps later loads behind it)
    b_r = tl.load(x + i_t * s_x + o_c, mask=m_g, other=0.0)
    b_w = tl.load(w + o_c, mask=m_g, other=0.0)
    if INJECT:
        o_n = tl.arange(0, BN)
        m_iw = (o_n < NG)[:, None] & m_g[None, :]
        b_iw = tl.load(inject + o_n[:, None] * D + o_c[None, :], mask=m_iw, other=0.0)
    if N_ADD > 0:
        b_d = tl.load(d0 + i_t * s_d0 + o_c, mask=m_g, other=0.0)
        if N_ADD > 1:  # the torch code adds the two deltas first (the PLE output gv + conv)
            b_d = (b_d.to(tl.float32) + tl.load(d1 + i_t * s_d1 + o_c, mask=m_g, other=0.0).to(tl.float32)).to(dt)
        b_r = (b_r.to(tl.float32) + b_d.to(tl.float32)).to(dt)
        tl.store(r + i_t * D + o_c, b_r, mask=m_g)
    b_h = _rms(b_r.to(tl.float32), b_w, eps, G).to(dt)
    tl.store(h + i_t * D + o_c, b_h, mask=m_g)
    if INJECT:
        b_l = tl.sum(b_h.to(tl.float32)[None, :] * b_iw.to(tl.float32), 1)
        tl.store(logits + (i_t * NG + i_g) * NG + o_n, b_l, mask=o_n < NG)


@triton.jit
def gated_norm_kernel(
    o, z, w, y,  # o, y [T, HV, V] contiguous; z [T, HV, V] with strides (s_zt, s_zh, 1); w [V]
    R, s_zt, s_zh, eps,
    HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, BR: tl.constexpr, SILU: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """BR (token, value head) rows: y = (w * RMSNorm(o)) * act(z)."""
    pdl.enter(PDL)
    dt = y.dtype.element_ty
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    m_r = o_r < R
    i_t, i_h = o_r // HV, o_r % HV
    o_v = tl.arange(0, BV)
    m_v = o_v < V
    m = m_r[:, None] & m_v[None, :]
    b_o = tl.load(o + o_r[:, None] * V + o_v[None, :], mask=m, other=0.0).to(tl.float32)
    b_z = tl.load(z + i_t[:, None] * s_zt + i_h[:, None] * s_zh + o_v[None, :], mask=m, other=0.0).to(tl.float32)
    b_w = tl.load(w + o_v, mask=m_v, other=0.0).to(tl.float32)
    tl.store(y + o_r[:, None] * V + o_v[None, :], gated_rows(b_o, b_z, b_w, eps, V, SILU, dt), mask=m)


@triton.jit
def silu_kernel(x, y, s_x, n, COLS: tl.constexpr, BC: tl.constexpr, GATED: tl.constexpr, PDL: tl.constexpr = False):
    """GATED: y = silu(x[:, :COLS]) * x[:, COLS:] (SwiGLU); else y = silu(x / n). y [T, COLS]."""
    pdl.enter(PDL)
    dt = y.dtype.element_ty
    i_t = tl.program_id(0).to(tl.int64)
    o_c = tl.program_id(1) * BC + tl.arange(0, BC)
    m_c = o_c < COLS
    b_x = tl.load(x + i_t * s_x + o_c, mask=m_c, other=0.0).to(tl.float32)
    if not GATED:
        b_x = (b_x / n).to(dt).to(tl.float32)
    b_y = (b_x * tl.sigmoid(b_x)).to(dt)
    if GATED:
        b_y = (b_y.to(tl.float32) * tl.load(x + i_t * s_x + COLS + o_c, mask=m_c, other=0.0).to(tl.float32)).to(dt)
    tl.store(y + i_t * COLS + o_c, b_y, mask=m_c)


@triton.jit
def hc_mix_kernel(hn, up, x, s_hn, s_up, C: tl.constexpr, NG: tl.constexpr, BC: tl.constexpr,
                  PDL: tl.constexpr = False):
    """x[t] = mean_i sigmoid(up[t, i]) * hn[t, i] over the NG streams of C channels."""
    pdl.enter(PDL)
    dt = x.dtype.element_ty
    i_t = tl.program_id(0).to(tl.int64)
    o_c = tl.program_id(1) * BC + tl.arange(0, BC)
    m_c = o_c < C
    b_acc = tl.zeros([BC], dtype=tl.float32)
    for i in tl.static_range(NG):
        b_s = tl.sigmoid(tl.load(up + i_t * s_up + i * C + o_c, mask=m_c, other=0.0).to(tl.float32)).to(dt)
        b_h = tl.load(hn + i_t * s_hn + i * C + o_c, mask=m_c, other=0.0).to(tl.float32)
        b_acc += (b_s.to(tl.float32) * b_h).to(dt).to(tl.float32)
    tl.store(x + i_t * C + o_c, (b_acc / NG).to(dt), mask=m_c)


@triton.jit
def hc_inject_kernel(s, logits, y, out, s_s, s_y, C: tl.constexpr, NG: tl.constexpr, BN: tl.constexpr,
                     BC: tl.constexpr, PDL: tl.constexpr = False):
    """out[t, i] = s[t, i] + inj[t, i] * y[t] on each of the NG streams, inj = 2 sigmoid(sum_g logits[t, g, i] / NG)
    (each program finishes the row's NG x NG partial logits itself: 64 bytes from L2)."""
    pdl.enter(PDL)
    dt = out.dtype.element_ty
    i_t = tl.program_id(0).to(tl.int64)
    o_c = tl.program_id(1) * BC + tl.arange(0, BC)
    m_c = o_c < C
    o_n = tl.arange(0, BN)
    m_n = o_n < NG
    b_l = tl.sum(tl.load(logits + i_t * NG * NG + o_n[:, None] * NG + o_n[None, :], mask=m_n[:, None] & m_n[None, :],
                         other=0.0), 0)
    # the torch code's roundings: F.linear's output, / n, sigmoid (then 2x, exact)
    b_l = (b_l.to(dt).to(tl.float32) / NG).to(dt).to(tl.float32)
    b_inj = 2.0 * tl.sigmoid(b_l).to(dt).to(tl.float32)
    b_y = tl.load(y + i_t * s_y + o_c, mask=m_c, other=0.0).to(tl.float32)
    for i in tl.static_range(NG):
        b_j = tl.sum(tl.where(o_n == i, b_inj, 0.0), 0)
        b_p = (b_j * b_y).to(dt).to(tl.float32)
        b_s = tl.load(s + i_t * s_s + i * C + o_c, mask=m_c, other=0.0).to(tl.float32)
        tl.store(out + i_t * NG * C + i * C + o_c, (b_s + b_p).to(dt), mask=m_c)


@triton.jit
def ple_gate_kernel(
    key, value, s, w_key, w_query, w_conv, gv, u,  # key, s, gv, u [T, NG*C]; value [T, C]; w_* [NG*C]
    s_k, s_v, s_s, eps, sqrt_c,
    C: tl.constexpr, NG: tl.constexpr, BC: tl.constexpr, PDL: tl.constexpr = False,
):
    """One (token, stream): the gate of stream i from its normed key and query, gv = sigmoid(gate) * value and
    u = RMSNorm_conv(gv)."""
    pdl.enter(PDL)
    dt = gv.dtype.element_ty
    i_t, i_g = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_v = tl.arange(0, BC)
    m_c = o_v < C
    o_c = i_g * C + o_v
    # every load is issued before the first reduction (a reduction's barrier keeps later loads behind it)
    b_k = tl.load(key + i_t * s_k + o_c, mask=m_c, other=0.0).to(tl.float32)
    b_q = tl.load(s + i_t * s_s + o_c, mask=m_c, other=0.0).to(tl.float32)
    b_v = tl.load(value + i_t * s_v + o_v, mask=m_c, other=0.0).to(tl.float32)
    b_wk = tl.load(w_key + o_c, mask=m_c, other=0.0)
    b_wq = tl.load(w_query + o_c, mask=m_c, other=0.0)
    b_wc = tl.load(w_conv + o_c, mask=m_c, other=0.0)
    b_k = _rms(b_k, b_wk, eps, C)
    b_q = _rms(b_q, b_wq, eps, C)
    b_p = (b_k.to(dt).to(tl.float32) * b_q.to(dt).to(tl.float32)).to(dt).to(tl.float32)
    b_g = (tl.sum(b_p, 0).to(dt).to(tl.float32) / sqrt_c).to(dt).to(tl.float32)
    b_a = tl.sqrt(tl.maximum(tl.abs(b_g), 1e-6).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    b_g = tl.where(b_g > 0, b_a, tl.where(b_g < 0, -b_a, 0.0))
    b_sg = tl.sigmoid(b_g).to(dt).to(tl.float32)
    b_gv = (b_sg * b_v).to(dt)
    tl.store(gv + i_t * NG * C + o_c, b_gv, mask=m_c)
    tl.store(u + i_t * NG * C + o_c, _rms(b_gv.to(tl.float32), b_wc, eps, C).to(dt), mask=m_c)


def _norm(x: Tensor, adds: Sequence[Tensor], w: Tensor, inject: Tensor | None, eps: float, groups: int):
    T, D = x.shape
    G = D // groups
    h = _new((T, D), x.dtype, x.device)
    r = _new((T, D), x.dtype, x.device) if adds else x
    logits = _new((T, groups, groups), torch.float32, x.device) if inject is not None else None
    if T > 0:
        d = (*adds, x, x)[:2]  # unused operands point at x
        BG = triton.next_power_of_2(G)
        norm_kernel[(T, groups)](
            x, d[0], d[1], w, w if inject is None else inject, h, r, h if logits is None else logits,
            x.stride(0), d[0].stride(0), d[1].stride(0), eps, D=D, G=G, NG=groups, BG=BG,
            BN=max(2, triton.next_power_of_2(groups)), N_ADD=len(adds), INJECT=inject is not None,
            num_warps=_warps(BG), **pdl.options(x.device))
    return h, r, logits


def add_rms_norm(x: Tensor, adds: Sequence[Tensor], w: Tensor, eps: float, group: int) -> tuple[Tensor, Tensor]:
    """r = x + (adds[0] + adds[1]) (0-2 adds) and h = RMSNorm(1 + w) of r per `group` channels; (h, r) [T, D]."""
    h, r, _ = _norm(x, adds, w, None, eps, x.shape[1] // group)
    return h, r


def hc_norm(x: Tensor, adds: Sequence[Tensor], w: Tensor, inject: Tensor, eps: float
            ) -> tuple[Tensor, Tensor, Tensor]:
    """`add_rms_norm` per stream and the inject logits by stream group: (hn [T, D], r [T, D], logits [T, n, n])."""
    return _norm(x, adds, w, inject, eps, inject.shape[0])


def gated_rms_norm(o: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """o [T, HV, V] (contiguous), z [T, HV, V] (any row and head strides) -> w * RMSNorm(o) * act(z)."""
    T, HV, V = o.shape
    o = o.contiguous()
    y = _new((T, HV, V), o.dtype, o.device)
    R = T * HV
    if R > 0:
        BV = triton.next_power_of_2(V)
        BR = max(1, min(TUNING.rows, TUNING.rows * 128 // BV))
        gated_norm_kernel[(triton.cdiv(R, BR),)](
            o, z, w, y, R, z.stride(0), z.stride(1), eps, HV=HV, V=V, BV=BV, BR=BR, SILU=act == "silu",
            num_warps=TUNING.warps, **pdl.options(o.device))
    return y


def _silu(x: Tensor, cols: int, n: int, gated: bool) -> Tensor:
    T = x.shape[0]
    y = _new((T, cols), x.dtype, x.device)
    if T > 0 and cols > 0:
        BC = min(TUNING.block, triton.next_power_of_2(cols))
        silu_kernel[(T, triton.cdiv(cols, BC))](x, y, x.stride(0), n, COLS=cols, BC=BC, GATED=gated,
                                               num_warps=TUNING.warps, **pdl.options(x.device))
    return y


def silu_mul(gu: Tensor) -> Tensor:
    """gu [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
    return _silu(gu, gu.shape[1] // 2, 1, True)


def silu_div(x: Tensor, n: int) -> Tensor:
    """silu(x / n), x [T, R]."""
    return _silu(x, x.shape[1], n, False)


def _streams_grid(T: int, C: int) -> tuple[tuple[int, int], int]:
    BC = min(TUNING.block, triton.next_power_of_2(C))
    return (T, triton.cdiv(C, BC)), BC


def hc_mix(hn: Tensor, up: Tensor, n: int) -> Tensor:
    """hn, up [T, n*C] -> mean over streams of sigmoid(up) * hn [T, C]."""
    T, D = hn.shape
    x = _new((T, D // n), hn.dtype, hn.device)
    if T > 0:
        grid, BC = _streams_grid(T, D // n)
        hc_mix_kernel[grid](hn, up, x, hn.stride(0), up.stride(0), C=D // n, NG=n, BC=BC, num_warps=TUNING.warps,
                            **pdl.options(x.device))
    return x


def hc_inject(streams: Tensor, logits: Tensor, y: Tensor) -> Tensor:
    """streams [T, n*C] + 2 sigmoid(logits.sum(1) / n) [T, n] * y [T, C] per stream -> [T, n*C]."""
    T, n = logits.shape[:2]
    C = y.shape[1]
    out = _new(tuple(streams.shape), streams.dtype, streams.device)
    if T > 0:
        grid, BC = _streams_grid(T, C)
        hc_inject_kernel[grid](streams, logits.contiguous(), y, out, streams.stride(0), y.stride(0), C=C, NG=n,
                               BN=max(2, triton.next_power_of_2(n)), BC=BC, num_warps=TUNING.warps,
                               **pdl.options(out.device))
    return out


def ple_gate(key: Tensor, value: Tensor, streams: Tensor, norms: PleNorms) -> tuple[Tensor, Tensor]:
    """key, streams [T, n*C], value [T, C] -> (gv, u) [T, n*C] (see naive.ple_gate)."""
    T, C = value.shape
    n = key.shape[1] // C
    gv, u = _new(tuple(key.shape), key.dtype, key.device), _new(tuple(key.shape), key.dtype, key.device)
    if T > 0:
        BC = triton.next_power_of_2(C)
        ple_gate_kernel[(T, n)](key, value, streams, norms.key, norms.query, norms.conv, gv, u, key.stride(0),
                                value.stride(0), streams.stride(0), norms.eps, C ** 0.5, C=C, NG=n, BC=BC,
                                num_warps=_warps(BC), **pdl.options(gv.device))
    return gv, u


def linear_conv(x: Tensor, w: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> Tensor:
    """`naive.linear_conv` in one launch of the skinny GEMM with the conv update in its epilogue (a call the GEMM
    can take, `op._skinny`; at every M of the table, also where cuBLAS alone would be faster: the fusion saves the
    conv's launch and its read of the projection). The launch triggers its dependent late (`gemm.Config.late`): the
    next kernel is the GDN decode, whose programs would otherwise wait on the SMs through the GEMM, as the conv's
    did."""
    return gemm.launch(x, w, _late(gemm.config_for(x.shape[0], w.shape[0])), (conv.weight, conv_pool, pack.slots))


@functools.lru_cache(maxsize=64)
def _late(cfg: gemm.Config) -> gemm.Config:
    """`cfg` with the late trigger (a dataclass `replace` per call would cost host time on eager decode steps)."""
    return replace(cfg, late=True)


def recurrent_norm(x: GdnInputs, pack: Packing, ssm_pool: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """`naive.recurrent_norm` in one launch: the recurrent kernel's one-tile decode with the gated norm in its
    epilogue (decode_norm.py)."""
    return decode_norm.launch(x, pack, ssm_pool, z, w, eps, act)
