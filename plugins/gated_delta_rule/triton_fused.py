"""Triton kernel of the decode step's conv update and gated delta rule in one launch (`triton.conv_recurrent`).

Unfused, a decode layer runs the conv update (`causal_conv1d`: y = silu(conv(x)) for the q, k, v channels,
the window shifted in `conv_pool`) and then the recurrence on y. Here the recurrence's programs compute the conv
of the channels they read themselves, from the projection (x), the conv history and the conv weights, so y never
goes to memory and the layer has one launch less. The grid and the state tile are the recurrent kernel's (one
program per V-tile, value head and sequence; `triton._rec_tiling`), and so is the arithmetic: y is rounded to the
activation dtype as the conv kernel stores it, then the token step of `triton_recurrent._step`.

Who writes the conv history: a program's v channels (its value head's V-tile) are its own, so it shifts their
window itself. The q and k channels of a key head are read by all G * NV programs of its value heads and V-tiles
(G = HV / H), so only the last of them to have read them may shift them: each program counts itself in a counter
per (slot, key head) after its reads, and the one that finds G * NV - 1 there shifts the window and puts the
counter back to 0 (`counts`: zeros between launches; `triton._sync_counts`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import pdl
from .triton_recurrent import _step, softplus


@triton.jit
def conv_channels(p_x, hist, weight, ch, m, D: tl.constexpr, W: tl.constexpr, BS: tl.constexpr, ACT: tl.constexpr,
                  DT: tl.constexpr):
    """One token's causal conv (dilation 1) of channels ch (mask m): x at p_x + (ch - ch[0]) (the token's values of
    these channels), the history rows [W - 1, channels] (as a [BS, channels] tile) at hist + row * D + ch, weight [D, W]; in fp32, rounded to
    DT (as the conv kernel stores its output) and returned in fp32. One load of each operand, all in flight at once."""
    o_s = tl.arange(0, BS)
    m_s = (o_s < W - 1)[:, None] & m[None, :]
    b_h = tl.load(hist + o_s[:, None] * D + ch[None, :], mask=m_s, other=0.0).to(tl.float32)
    b_w = tl.load(weight + ch[None, :] * W + o_s[:, None], mask=m_s, other=0.0).to(tl.float32)
    b_y = tl.load(weight + ch * W + (W - 1), mask=m, other=0.0).to(tl.float32) * \
        tl.load(p_x, mask=m, other=0.0).to(tl.float32) + tl.sum(b_w * b_h, 0)
    if ACT == 1:
        b_y = b_y * tl.sigmoid(b_y)
    return b_y.to(DT).to(tl.float32)


@triton.jit
def gdn_conv_decode_kernel(
    q, k, v, a, b, A_log, dt_bias,  # q, k [N, H, K] and v [N, HV, V]: the conv's input (strided views); a, b [N, HV]
    weight,  # [D, W] the conv weight, contiguous; D = 2 H K + HV V: channels q | k | v
    o,  # [N, HV, V] contiguous
    pool,  # [S, HV, K, V] fp32
    conv_pool,  # [S, W - 1, D] activation dtype
    slots,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
    scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, ACT: tl.constexpr,
    BS: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, STREAM: tl.constexpr, PDL: tl.constexpr = False,
):
    """One token per sequence (row n is sequence n's token). Program (V-tile, value head, sequence)."""
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    NV: tl.constexpr = (V + BV - 1) // BV
    D: tl.constexpr = 2 * H * K + HV * V
    i_h = i_hv // (HV // H)
    slot = tl.load(slots + i_n).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_c = tl.arange(0, BV)
    m_k = o_k < K
    m_v = i_v * BV + o_c < V
    m_h = m_k[:, None] & m_v[None, :]
    o_h = o_k[:, None] * V + o_c[None, :]
    p_o = o + (i_n * HV + i_hv) * V + i_v * BV
    if slot < 0:  # padding sequence: a zero output row, no state touched
        pdl.enter(PDL)
        tl.store(p_o + o_c, tl.zeros([BV], dtype=o.dtype.element_ty), mask=m_v)
        return
    LOAD_HINT: tl.constexpr = "evict_first" if STREAM else ""
    STORE_HINT: tl.constexpr = ".cs" if STREAM else ""
    p_h = pool + (slot * HV + i_hv) * K * V + i_v * BV
    b_h = tl.load(p_h + o_h, mask=m_h, other=0.0, eviction_policy=LOAD_HINT)
    # with PDL the tile is loaded while the previous kernel (the layer's in_proj) still runs: it writes neither
    # the SSM pool nor the packing (plugins/pdl.py); x, the gates and the conv history come after the wait
    pdl.enter(PDL)
    DT: tl.constexpr = q.dtype.element_ty
    hist = conv_pool + slot * (W - 1) * D
    p_q = q + i_n * s_qt + i_h * s_qh + o_k
    p_k = k + i_n * s_kt + i_h * s_kh + o_k
    p_v = v + i_n * s_vt + i_hv * s_vh + i_v * BV + o_c
    c_q = i_h * K + o_k
    c_k = H * K + c_q
    c_v = 2 * H * K + i_hv * V + i_v * BV + o_c
    b_q = conv_channels(p_q, hist, weight, c_q, m_k, D, W, BS, ACT, DT)
    b_k = conv_channels(p_k, hist, weight, c_k, m_k, D, W, BS, ACT, DT)
    b_v = conv_channels(p_v, hist, weight, c_v, m_v, D, W, BS, ACT, DT)
    b_g = -tl.exp(tl.load(A_log + i_hv).to(tl.float32)) * softplus(
        tl.load(a + i_n * s_at + i_hv * s_ah).to(tl.float32) + tl.load(dt_bias + i_hv).to(tl.float32))
    b_beta = tl.sigmoid(tl.load(b + i_n * s_bt + i_hv * s_bh).to(tl.float32))
    b_h, b_o = _step(b_h, b_q, b_k, b_v, b_g, b_beta, scale, False, 0)
    tl.store(p_o + o_c, b_o.to(o.dtype.element_ty), mask=m_v)
    tl.store(p_h + o_h, b_h, mask=m_h, cache_modifier=STORE_HINT)
