"""Triton kernels of the chunked (WY) gated delta rule for PREFILL / PREFILL_VARLEN (docs/math.md#chunked-form-prefill).

Three launches, FLA's decomposition with its small passes fused (gates, cumsum, the q/k L2 norm and the
triangular solve need no launch of their own):

1. `triton_intra.gdn_chunk_intra_kernel`, grid (chunks, HV), chunk-parallel, one warp: gates, gamma, r_k = 1 / |k|,
   T = (I + A)^-1, w = T diag(beta e^gamma r_k) k and u = T diag(beta) v (see that module).
2. `gdn_chunk_state_kernel`, grid (V-tiles, HV, N), sequential over a sequence's chunks: the fp32 state tile
   S [K, BV] from the pool, per chunk h_c = S (stored for pass 3), v_new = u - w S, S = e^gamma_C S +
   k_n^T (v_new * e^(gamma_C - gamma)); the capture snapshot and the final state go to the capture buffer / pool.
3. `gdn_chunk_out_kernel`, grid (V-tiles, chunks, H), chunk-parallel, one program for the G value heads of a key
   head (q, k and q k^T once): o = e^gamma (q_n h_c) + tril(q_n k_n^T * e^(gamma_r - gamma_s)) v_new.

With `Tuning.state_wy` (`state_wy_many` for the many-sequence tiling) pass 2 forms v_new = u - w S as
T (diag(beta) v - diag(beta e^gamma / |k|) k S) from T, v and b itself (`state_chunk_wy`), so w and u are never
formed and the w/u launch of pass 1 is skipped.

Passes 2 and 3 read the raw q and k (strided views of the projection): the norms enter as row scales, r_k from
pass 1 and r_q = K^-1/2 / |q| computed from the q tile pass 3 loads anyway, so no normalised copy is written.

Varlen chunks are 64-token pieces of each sequence counted from its start; a capture point 0 < c < len splits
the sequence into two segments with their own chunks, so the state at the capture point is a chunk boundary.
No host metadata: every program finds its (sequence, chunk) from cu_seqlens and capture_at by a vector prefix
sum over the N sequences (`locate_chunk`), and the grids are sized from shapes only (chunks <= T/64 + 2N), so
every launch is CUDA-graph safe. Programs beyond the last chunk return at once.
"""

from __future__ import annotations

import triton
import triton.language as tl


BT = 64  # chunk size
BC = 16  # sub-block of the triangular solve (triton_intra.py)


# Addressing: per-program base pointers are moved with int64 scalars (token start, head); offsets inside a tile
# stay int32 (at most one chunk of rows), which keeps 64-bit address tiles out of the registers.


@triton.jit
def seq_chunk_counts(cu_seqlens, capture_at, N, BN: tl.constexpr, BT: tl.constexpr):
    """Vectors over sequences: start, length, first-segment length `cut` (0 when the capture point does not split
    the sequence) and number of chunks."""
    o_n = tl.arange(0, BN)
    m_n = o_n < N
    b_bos = tl.load(cu_seqlens + o_n, mask=m_n, other=0)
    b_len = tl.load(cu_seqlens + o_n + 1, mask=m_n, other=0) - b_bos
    b_cap = tl.load(capture_at + o_n, mask=m_n, other=-1)
    b_cut = tl.where((b_cap > 0) & (b_cap < b_len), b_cap, 0)
    b_cnt = (b_cut + BT - 1) // BT + (b_len - b_cut + BT - 1) // BT
    return o_n, b_bos, b_len, b_cut, b_cnt


@triton.jit
def warp_uniform(x, ON: tl.constexpr):
    """ON: the int32 scalar x through `shfl.sync.idx` from lane 0, which ptxas takes as the same in every lane of a
    warp. Values read from memory or reduced across lanes are not, to ptxas: a loop bounded by them may diverge,
    so the loop's shared-memory descriptors live in per-thread registers and every wgmma waits on four R2UR moves
    (the state pass's loop body at sm_90: 591 instructions, 60 R2UR, against 481 and none in FLA's
    chunk_delta_h, whose loop runs to a kernel parameter). Off: x (the interpreter runs no inline PTX)."""
    if ON:
        return tl.inline_asm_elementwise("shfl.sync.idx.b32 $0, $1, 0, 0x1f, -1;", "=r,r", [x.to(tl.int32)],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        return x.to(tl.int32)


@triton.jit
def chunk_bounds(j, bos, length, cut, BT: tl.constexpr):
    """Chunk j of a sequence (chunks restart at the cut): first token (int64) and number of tokens (<= BT)."""
    nc1 = (cut + BT - 1) // BT
    start = tl.where(j < nc1, bos + j * BT, bos + cut + (j - nc1) * BT)
    stop = tl.minimum(start + BT, tl.where(j < nc1, bos + cut, bos + length))
    return start.to(tl.int64), (stop - start).to(tl.int32)


@triton.jit
def locate_chunk(i_c, cu_seqlens, capture_at, N, BN: tl.constexpr, BT: tl.constexpr):
    """Global chunk index -> (sequence i_n (N when past the last chunk), first token, number of tokens)."""
    o_n, b_bos, b_len, b_cut, b_cnt = seq_chunk_counts(cu_seqlens, capture_at, N, BN, BT)
    b_end = tl.cumsum(b_cnt, 0)
    i_n = tl.sum((b_end <= i_c).to(tl.int32), 0)
    m_sel = o_n == i_n
    j = i_c - tl.sum(tl.where(m_sel, b_end - b_cnt, 0), 0)
    start, n_t = chunk_bounds(j, tl.sum(tl.where(m_sel, b_bos, 0), 0), tl.sum(tl.where(m_sel, b_len, 0), 0),
                              tl.sum(tl.where(m_sel, b_cut, 0), 0), BT)
    return i_n, start, n_t


@triton.jit
def state_chunk(b_h, j, i_c0, bos, length, cut, k, s_kt, rk, w, u, gam, h, v_new, i_h, i_hv, o_i, o_k, o_v, m_k,
                m_v, o_h, m_h, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BT: tl.constexpr, PREC: tl.constexpr):
    """One chunk of the state pass: stores h_c = S and v_new = u - w S, returns e^gamma_C S + k_n^T (v_new *
    e^(gamma_C - gamma)), the normalised k_n = diag(1 / |k|) k applied to v_new's rows (k is the raw view, already
    at the key head)."""
    DT = w.dtype.element_ty
    start, n_t = chunk_bounds(j, bos, length, cut, BT)
    tl.store(h + ((i_c0 + j) * HV + i_hv) * K * V + o_h, b_h.to(DT), mask=m_h)
    m_t = o_i < n_t
    b_w = tl.load(w + (start * HV + i_hv) * K + o_i[:, None] * (HV * K) + o_k[None, :],
                  mask=m_t[:, None] & m_k[None, :], other=0.0)
    o_u = (start * HV + i_hv) * V
    m_u = m_t[:, None] & m_v[None, :]
    p_u = o_i[:, None] * (HV * V) + o_v[None, :]
    b_v = tl.load(u + o_u + p_u, mask=m_u, other=0.0).to(tl.float32)
    b_v -= tl.dot(b_w, b_h.to(DT), input_precision=PREC)
    tl.store(v_new + o_u + p_u, b_v.to(DT), mask=m_u)

    b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
    b_last = tl.load(gam + (start + n_t - 1) * HV + i_hv)
    b_rk = tl.load(rk + start * H + i_h + o_i * H, mask=m_t, other=0.0)
    b_v *= tl.where(m_t, tl.exp(b_last - b_gam) * b_rk, 0.0)[:, None]
    b_kt = tl.load(k + start * s_kt + o_i[None, :] * s_kt + o_k[:, None], mask=m_k[:, None] & m_t[None, :],
                   other=0.0)
    b_h *= tl.exp(b_last)
    return tl.dot(b_kt, b_v.to(DT), b_h, input_precision=PREC)


@triton.jit
def state_chunk_wy(b_h, j, i_c0, bos, length, cut, k, s_kt, rk, t_inv, v, s_vt, b, s_bt, gam, h, v_new, i_h, i_hv,
                   o_i, o_k, o_v, m_k, m_v, o_h, m_h, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
    """`state_chunk` with w and u never formed: v_new = u - w S = T (diag(beta) v - diag(beta e^gamma / |k|) k S),
    T = (I + A)^-1 from the intra pass ([T, HV, BT], lower triangle), v and b the raw views at the value head. The
    k tile serves both products (k S here, k_n^T v_new below) and T replaces w's K columns by BT."""
    DT = v_new.dtype.element_ty
    start, n_t = chunk_bounds(j, bos, length, cut, BT)
    tl.store(h + ((i_c0 + j) * HV + i_hv) * K * V + o_h, b_h.to(DT), mask=m_h)
    m_t = o_i < n_t
    b_k = tl.load(k + start * s_kt + o_i[:, None] * s_kt + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.0)
    b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
    b_last = tl.load(gam + (start + n_t - 1) * HV + i_hv)
    b_rk = tl.load(rk + start * H + i_h + o_i * H, mask=m_t, other=0.0)
    b_beta = tl.where(m_t, tl.sigmoid(tl.load(b + (start + o_i) * s_bt, mask=m_t, other=0.0).to(tl.float32)), 0.0)
    m_u = m_t[:, None] & m_v[None, :]
    b_x = tl.load(v + start * s_vt + o_i[:, None] * s_vt + o_v[None, :], mask=m_u, other=0.0).to(tl.float32)
    b_x = b_x * b_beta[:, None] - tl.dot(b_k, b_h.to(DT), input_precision=PREC) * (
        b_beta * tl.exp(b_gam) * b_rk)[:, None]
    # whole rows of T, the part above the diagonal (never written by the solve) zeroed after (as the w/u pass)
    b_T = tl.load(t_inv + (start * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None],
                  other=0.0)
    b_T = tl.where(o_i[:, None] >= o_i[None, :], b_T, 0.0)
    b_v = tl.dot(b_T, b_x.to(DT), input_precision=PREC)
    p_u = (start * HV + i_hv) * V + o_i[:, None] * (HV * V) + o_v[None, :]
    tl.store(v_new + p_u, b_v.to(DT), mask=m_u)
    b_v *= tl.where(m_t, tl.exp(b_last - b_gam) * b_rk, 0.0)[:, None]
    b_kt = tl.load(k + start * s_kt + o_i[None, :] * s_kt + o_k[:, None], mask=m_k[:, None] & m_t[None, :],
                   other=0.0)
    b_h *= tl.exp(b_last)
    return tl.dot(b_kt, b_v.to(DT), b_h, input_precision=PREC)


@triton.jit
def state_chunk_kb(b_h1, b_h2, j, i_c0, bos, length, cut, k, s_kt, rk, w, u, gam, h, v_new, i_h, i_hv, o_i, o_v,
                   m_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                   PREC: tl.constexpr):
    """`state_chunk` with the state as two 64-row halves (K <= 128), each product split the same way: FLA's
    chunk_delta_h form. Compiled for sm_90 its loop body has FLA's shared-memory traffic (14 16-byte stores, no
    16-byte loads, against 22 and 8 in one [K, BV] block) and 174 registers against 220."""
    DT = w.dtype.element_ty
    start, n_t = chunk_bounds(j, bos, length, cut, BT)
    o_k1 = tl.arange(0, 64)
    o_k2 = 64 + o_k1
    p_h = h + ((i_c0 + j) * HV + i_hv) * K * V + o_v[None, :]
    tl.store(p_h + o_k1[:, None] * V, b_h1.to(DT), mask=(o_k1 < K)[:, None] & m_v[None, :])
    tl.store(p_h + o_k2[:, None] * V, b_h2.to(DT), mask=(o_k2 < K)[:, None] & m_v[None, :])
    m_t = o_i < n_t
    p_w = w + (start * HV + i_hv) * K + o_i[:, None] * (HV * K)
    b_w = tl.load(p_w + o_k1[None, :], mask=m_t[:, None] & (o_k1 < K)[None, :], other=0.0)
    b_d = tl.dot(b_w, b_h1.to(DT), input_precision=PREC)
    b_w = tl.load(p_w + o_k2[None, :], mask=m_t[:, None] & (o_k2 < K)[None, :], other=0.0)
    b_d = tl.dot(b_w, b_h2.to(DT), b_d, input_precision=PREC)
    p_u = (start * HV + i_hv) * V + o_i[:, None] * (HV * V) + o_v[None, :]
    m_u = m_t[:, None] & m_v[None, :]
    b_v = tl.load(u + p_u, mask=m_u, other=0.0) - b_d
    tl.store(v_new + p_u, b_v.to(DT), mask=m_u)
    b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
    b_last = tl.load(gam + (start + n_t - 1) * HV + i_hv)
    b_rk = tl.load(rk + start * H + i_h + o_i * H, mask=m_t, other=0.0)
    b_v = (b_v * tl.where(m_t, tl.exp(b_last - b_gam) * b_rk, 0.0)[:, None]).to(DT)
    b_e = tl.exp(b_last)
    p_k = k + start * s_kt + o_i[None, :] * s_kt
    b_kt = tl.load(p_k + o_k1[:, None], mask=(o_k1 < K)[:, None] & m_t[None, :], other=0.0)
    b_h1 = tl.dot(b_kt, b_v, b_h1 * b_e, input_precision=PREC)
    b_kt = tl.load(p_k + o_k2[:, None], mask=(o_k2 < K)[:, None] & m_t[None, :], other=0.0)
    b_h2 = tl.dot(b_kt, b_v, b_h2 * b_e, input_precision=PREC)
    return b_h1, b_h2


@triton.jit
def state_chunk_wy_kb(b_h1, b_h2, j, i_c0, bos, length, cut, k, s_kt, rk, t_inv, v, s_vt, b, s_bt, gam, h, v_new,
                      i_h, i_hv, o_i, o_v, m_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                      V: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr):
    """`state_chunk_wy` with the state as two 64-row halves (K <= 128), each product split the same way (as
    `state_chunk_kb`)."""
    DT = v_new.dtype.element_ty
    start, n_t = chunk_bounds(j, bos, length, cut, BT)
    o_k1 = tl.arange(0, 64)
    o_k2 = 64 + o_k1
    p_h = h + ((i_c0 + j) * HV + i_hv) * K * V + o_v[None, :]
    tl.store(p_h + o_k1[:, None] * V, b_h1.to(DT), mask=(o_k1 < K)[:, None] & m_v[None, :])
    tl.store(p_h + o_k2[:, None] * V, b_h2.to(DT), mask=(o_k2 < K)[:, None] & m_v[None, :])
    m_t = o_i < n_t
    p_k = k + start * s_kt + o_i[:, None] * s_kt
    b_k = tl.load(p_k + o_k1[None, :], mask=m_t[:, None] & (o_k1 < K)[None, :], other=0.0)
    b_d = tl.dot(b_k, b_h1.to(DT), input_precision=PREC)
    b_k = tl.load(p_k + o_k2[None, :], mask=m_t[:, None] & (o_k2 < K)[None, :], other=0.0)
    b_d = tl.dot(b_k, b_h2.to(DT), b_d, input_precision=PREC)
    b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
    b_last = tl.load(gam + (start + n_t - 1) * HV + i_hv)
    b_rk = tl.load(rk + start * H + i_h + o_i * H, mask=m_t, other=0.0)
    b_beta = tl.where(m_t, tl.sigmoid(tl.load(b + (start + o_i) * s_bt, mask=m_t, other=0.0).to(tl.float32)), 0.0)
    m_u = m_t[:, None] & m_v[None, :]
    b_x = tl.load(v + start * s_vt + o_i[:, None] * s_vt + o_v[None, :], mask=m_u, other=0.0).to(tl.float32)
    b_x = b_x * b_beta[:, None] - b_d * (b_beta * tl.exp(b_gam) * b_rk)[:, None]
    b_T = tl.load(t_inv + (start * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None],
                  other=0.0)
    b_T = tl.where(o_i[:, None] >= o_i[None, :], b_T, 0.0)
    b_v = tl.dot(b_T, b_x.to(DT), input_precision=PREC)
    tl.store(v_new + (start * HV + i_hv) * V + o_i[:, None] * (HV * V) + o_v[None, :], b_v.to(DT), mask=m_u)
    b_v = (b_v * tl.where(m_t, tl.exp(b_last - b_gam) * b_rk, 0.0)[:, None]).to(DT)
    b_e = tl.exp(b_last)
    p_kt = k + start * s_kt + o_i[None, :] * s_kt
    b_kt = tl.load(p_kt + o_k1[:, None], mask=(o_k1 < K)[:, None] & m_t[None, :], other=0.0)
    b_h1 = tl.dot(b_kt, b_v, b_h1 * b_e, input_precision=PREC)
    b_kt = tl.load(p_kt + o_k2[:, None], mask=(o_k2 < K)[:, None] & m_t[None, :], other=0.0)
    b_h2 = tl.dot(b_kt, b_v, b_h2 * b_e, input_precision=PREC)
    return b_h1, b_h2


@triton.jit
def store_halves(p, b_h1, b_h2, o_v, m_v, K: tl.constexpr, V: tl.constexpr):
    """A state tile kept as two 64-row halves, to p ([K, V] rows, the tile's columns o_v)."""
    o_k1 = tl.arange(0, 64)
    o_k2 = 64 + o_k1
    tl.store(p + o_k1[:, None] * V + o_v[None, :], b_h1, mask=(o_k1 < K)[:, None] & m_v[None, :])
    tl.store(p + o_k2[:, None] * V + o_v[None, :], b_h2, mask=(o_k2 < K)[:, None] & m_v[None, :])


@triton.jit
def state_chunks(b_h, lo, hi, i_c0, bos, length, cut, k, s_kt, rk, w, u, t_inv, v, s_vt, b, s_bt, gam, h, v_new, i_h,
                 i_hv, o_i, o_k, o_v, m_k, m_v, o_h, m_h, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                 V: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, WY: tl.constexpr):
    """Chunks [lo, hi) of one segment of a sequence (before or after the capture cut) through the state tile b_h:
    `state_chunk`, or `state_chunk_wy` with WY."""
    for j in range(lo, hi):
        if WY:
            b_h = state_chunk_wy(b_h, j, i_c0, bos, length, cut, k, s_kt, rk, t_inv, v, s_vt, b, s_bt, gam, h, v_new,
                                 i_h, i_hv, o_i, o_k, o_v, m_k, m_v, o_h, m_h, H, HV, K, V, BT, PREC)
        else:
            b_h = state_chunk(b_h, j, i_c0, bos, length, cut, k, s_kt, rk, w, u, gam, h, v_new, i_h, i_hv, o_i, o_k,
                              o_v, m_k, m_v, o_h, m_h, H, HV, K, V, BT, PREC)
    return b_h


@triton.jit
def state_chunks_kb(b_h1, b_h2, lo, hi, i_c0, bos, length, cut, k, s_kt, rk, w, u, t_inv, v, s_vt, b, s_bt, gam, h,
                    v_new, i_h, i_hv, o_i, o_v, m_v, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                    V: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, WY: tl.constexpr):
    """`state_chunks` with the state as two 64-row halves (`state_chunk_kb`, `state_chunk_wy_kb`)."""
    for j in range(lo, hi):
        if WY:
            b_h1, b_h2 = state_chunk_wy_kb(b_h1, b_h2, j, i_c0, bos, length, cut, k, s_kt, rk, t_inv, v, s_vt, b, s_bt,
                                           gam, h, v_new, i_h, i_hv, o_i, o_v, m_v, H, HV, K, V, BT, PREC)
        else:
            b_h1, b_h2 = state_chunk_kb(b_h1, b_h2, j, i_c0, bos, length, cut, k, s_kt, rk, w, u, gam, h, v_new, i_h,
                                        i_hv, o_i, o_v, m_v, H, HV, K, V, BT, PREC)
    return b_h1, b_h2


@triton.jit
def gdn_chunk_state_kernel(
    k, rk, w, u, gam,  # k: the raw strided view [T, H, K]; rk, w, u, gam from the intra pass
    h, v_new,  # [chunks, HV, K, V], [T, HV, V] activation dtype: per-chunk start states and v_new for pass 3
    pool, cap,  # [S, HV, K, V], [N, HV, K, V] fp32
    cu_seqlens, slots, capture_at, N, s_kt, s_kh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, KB: tl.constexpr,
    t_inv=None, v=None, b=None, s_vt=0, s_vh=0, s_bt=0, s_bh=0,  # WY: T [T, HV, BT] from the intra pass, raw v, b
    WY: tl.constexpr = False,
    c_lo=0, c_hi=1 << 30,  # the window of global chunk indices this launch runs (`launch_chunked`'s pipeline)
    UNI: tl.constexpr = False,  # `warp_uniform` on
):
    """KB: the state as two 64-row halves (`state_chunk_kb`, K <= 128), else one [BK, BV] block. WY: v_new from
    T, v and b (`state_chunk_wy`, `state_chunk_wy_kb`), w and u unused and never formed.

    A window [c_lo, c_hi) runs the chunks of each sequence that fall in it: the state comes from the pool and goes
    back to it (a later window of the same sequence continues from there, fp32 both ways, so the chain is the one
    launch's bit for bit); the capture snapshots are taken by the window that reaches their chunk boundary."""
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + i_n).to(tl.int64)
    if slot < 0:
        return
    i_h = i_hv // (HV // H)
    k += i_h * s_kh
    o_n, b_bos, b_len, b_cut, b_cnt = seq_chunk_counts(cu_seqlens, capture_at, N, BN, BT)
    m_sel = o_n == i_n
    # the chunk loops' bounds and addresses as warp-uniform values (`warp_uniform`)
    bos = warp_uniform(tl.sum(tl.where(m_sel, b_bos, 0), 0), UNI).to(tl.int64)
    length = warp_uniform(tl.sum(tl.where(m_sel, b_len, 0), 0), UNI)
    cut = warp_uniform(tl.sum(tl.where(m_sel, b_cut, 0), 0), UNI)
    n_chunks = warp_uniform(tl.sum(tl.where(m_sel, b_cnt, 0), 0), UNI)
    nc1 = (cut + BT - 1) // BT  # chunks before the capture cut (0 when it does not split the sequence)
    i_c0 = warp_uniform(tl.sum(tl.where(o_n < i_n, b_cnt, 0), 0), UNI)  # global index of the first chunk
    c_at = tl.load(capture_at + i_n)
    # the sequence's chunks [jl, jh) in the window; `first`: the window holding its start (a sequence of no tokens:
    # the first window), which takes the snapshot at 0
    jl = tl.minimum(tl.maximum(c_lo - i_c0, 0), n_chunks)
    jh = tl.minimum(tl.maximum(c_hi - i_c0, 0), n_chunks)
    first = (jl == 0) & ((jh > 0) | ((n_chunks == 0) & (c_lo == 0)))
    if not ((jl < jh) | first):
        return
    i_c0 = i_c0.to(tl.int64)

    o_i = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    pool += (slot * HV + i_hv) * K * V
    cap += (i_n * HV + i_hv).to(tl.int64) * K * V
    # the capture point is a chunk boundary (chunks restart at the cut), so the loop splits there and its body
    # carries no branch (a branch in the body would keep Triton from pipelining the loads)
    if WY:
        v += i_hv * s_vh
        b += i_hv * s_bh
    if KB:
        o_k1 = tl.arange(0, 64)
        o_k2 = 64 + o_k1
        b_h1 = tl.load(pool + o_k1[:, None] * V + o_v[None, :], mask=(o_k1 < K)[:, None] & m_v[None, :], other=0.0)
        b_h2 = tl.load(pool + o_k2[:, None] * V + o_v[None, :], mask=(o_k2 < K)[:, None] & m_v[None, :], other=0.0)
        if (c_at == 0) & first:
            store_halves(cap, b_h1, b_h2, o_v, m_v, K, V)
        b_h1, b_h2 = state_chunks_kb(b_h1, b_h2, jl, tl.minimum(jh, nc1), i_c0, bos, length, cut, k, s_kt, rk, w, u,
                                     t_inv, v, s_vt, b, s_bt, gam, h, v_new, i_h, i_hv, o_i, o_v, m_v, H, HV, K, V, BT,
                                     PREC, WY)
        if (nc1 > 0) & (jl <= nc1) & (nc1 < jh):  # the window that goes on from the cut (nc1 < n_chunks)
            store_halves(cap, b_h1, b_h2, o_v, m_v, K, V)
        b_h1, b_h2 = state_chunks_kb(b_h1, b_h2, tl.maximum(jl, nc1), jh, i_c0, bos, length, cut, k, s_kt, rk, w, u,
                                     t_inv, v, s_vt, b, s_bt, gam, h, v_new, i_h, i_hv, o_i, o_v, m_v, H, HV, K, V, BT,
                                     PREC, WY)
        if (length == c_at) & (length > 0) & (jh == n_chunks):
            store_halves(cap, b_h1, b_h2, o_v, m_v, K, V)
        if jl < jh:
            store_halves(pool, b_h1, b_h2, o_v, m_v, K, V)
    else:
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        m_h = m_k[:, None] & m_v[None, :]
        o_h = o_k[:, None] * V + o_v[None, :]
        b_h = tl.load(pool + o_h, mask=m_h, other=0.0)
        if (c_at == 0) & first:
            tl.store(cap + o_h, b_h, mask=m_h)
        b_h = state_chunks(b_h, jl, tl.minimum(jh, nc1), i_c0, bos, length, cut, k, s_kt, rk, w, u, t_inv, v, s_vt, b,
                           s_bt, gam, h, v_new, i_h, i_hv, o_i, o_k, o_v, m_k, m_v, o_h, m_h, H, HV, K, V, BT, PREC, WY)
        if (nc1 > 0) & (jl <= nc1) & (nc1 < jh):
            tl.store(cap + o_h, b_h, mask=m_h)
        b_h = state_chunks(b_h, tl.maximum(jl, nc1), jh, i_c0, bos, length, cut, k, s_kt, rk, w, u, t_inv, v, s_vt, b,
                           s_bt, gam, h, v_new, i_h, i_hv, o_i, o_k, o_v, m_k, m_v, o_h, m_h, H, HV, K, V, BT, PREC, WY)
        if (length == c_at) & (length > 0) & (jh == n_chunks):
            tl.store(cap + o_h, b_h, mask=m_h)
        if jl < jh:
            tl.store(pool + o_h, b_h, mask=m_h)


@triton.jit
def gdn_chunk_out_kernel(
    q, k, rk, rq, gam, h, v_new, o,  # q, k: the raw strided views; rq [T, H] fp32 from pass 1 (RQ)
    cu_seqlens, slots, capture_at, N, s_qt, s_qh, s_kt, s_kh, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, RQ: tl.constexpr,
    KS: tl.constexpr = 0,
    c0=0,  # global index of the grid's first chunk (`launch_chunked`'s pipeline windows)
):
    # one program per key head serves the G value heads of its group: q, k and q k^T are loaded and computed once.
    # KS > 0: the products over K in runtime slices of KS columns (`qk_slices`, `qh_slices`): shared memory for
    # [BT, KS] tiles instead of [BT, BK] (the AOT kernel on fp32 activations: 64 KB in one tile, over TensorRT's
    # 48 KiB); KS = 0 (the JIT launches): q and k as one tile each
    i_v, i_c, i_h = tl.program_id(0), c0 + tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = HV // H
    i_n, start, n_t = locate_chunk(i_c, cu_seqlens, capture_at, N, BN, BT)
    if i_n >= N:
        return
    DT = v_new.dtype.element_ty
    o_i = tl.arange(0, BT)
    m_t = o_i < n_t
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_o = m_t[:, None] & m_v[None, :]
    p_o = o_i[:, None] * (HV * V) + o_v[None, :]
    if tl.load(slots + i_n) < 0:
        for g in tl.static_range(0, G):
            tl.store(o + (start * HV + i_h * G + g) * V + p_o, tl.zeros([BT, BV], dtype=o.dtype.element_ty),
                     mask=m_o)
        return
    if KS == 0:
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        m_tk = m_t[:, None] & m_k[None, :]
        b_q = tl.load(q + start * s_qt + i_h * s_qh + o_i[:, None] * s_qt + o_k[None, :], mask=m_tk, other=0.0)
        b_k = tl.load(k + start * s_kt + i_h * s_kh + o_i[:, None] * s_kt + o_k[None, :], mask=m_tk, other=0.0)
        # the q and k norms enter as row and column scales of the raw products (scale / |q|, 1 / |k|). RQ: 1 / |q|
        # from pass 1; else from the q tile here (a row reduction across the tile: 23 barriers against 17 in the
        # sm_90 code, and the pass took 251 us at T = 16384 against 212 with a normalised q read; H200, 2026-12-03)
        if RQ:
            b_rq = scale * tl.load(rq + start * H + i_h + o_i * H, mask=m_t, other=0.0)
        else:
            b_rq = scale / tl.sqrt(tl.sum(b_q.to(tl.float32) * b_q.to(tl.float32), 1) + 1e-6)
        b_rk = tl.load(rk + start * H + i_h + o_i * H, mask=m_t, other=0.0)
        m_inc = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
        b_s = tl.where(m_inc, tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * b_rq[:, None] * b_rk[None, :], 0.0)
    else:
        b_qk, b_qq = qk_slices(q + start * s_qt + i_h * s_qh, k + start * s_kt + i_h * s_kh, s_qt, s_kt, o_i, m_t,
                               K, KS, BT, PREC)
        if RQ:
            b_rq = scale * tl.load(rq + start * H + i_h + o_i * H, mask=m_t, other=0.0)
        else:
            b_rq = scale / tl.sqrt(b_qq + 1e-6)
        b_rk = tl.load(rk + start * H + i_h + o_i * H, mask=m_t, other=0.0)
        m_inc = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
        b_s = tl.where(m_inc, b_qk * b_rq[:, None] * b_rk[None, :], 0.0)
    for g in tl.static_range(0, G):
        i_hv = i_h * G + g
        o_o = (start * HV + i_hv) * V
        b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
        # h is indexed by the global chunk index, the numbering the state pass uses
        if KS == 0:
            b_h = tl.load(h + (i_c.to(tl.int64) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :],
                          mask=m_k[:, None] & m_v[None, :], other=0.0)
            b_o = tl.dot(b_q, b_h, input_precision=PREC) * (b_rq * tl.exp(b_gam))[:, None]
        else:
            b_o = qh_slices(q + start * s_qt + i_h * s_qh, s_qt, h + (i_c.to(tl.int64) * HV + i_hv) * K * V, o_i,
                            m_t, o_v, m_v, K, V, KS, BT, BV, PREC) * (b_rq * tl.exp(b_gam))[:, None]
        b_p = b_s * tl.exp(tl.where(m_inc, b_gam[:, None] - b_gam[None, :], 0.0))
        b_vn = tl.load(v_new + o_o + p_o, mask=m_o, other=0.0)
        b_o = tl.dot(b_p.to(DT), b_vn, b_o, input_precision=PREC)
        tl.store(o + o_o + p_o, b_o.to(o.dtype.element_ty), mask=m_o)


@triton.jit
def qk_slices(p_q, p_k, s_qt, s_kt, o_i, m_t, K: tl.constexpr, KS: tl.constexpr, BT: tl.constexpr,
              PREC: tl.constexpr):
    """The chunk's raw q k^T [BT, BT] and the rows' sums of q^2, over K in runtime slices of KS columns (p_q, p_k
    at the chunk's first row of the key head)."""
    b_qk = tl.zeros([BT, BT], dtype=tl.float32)
    b_qq = tl.zeros([BT], dtype=tl.float32)
    for i_k in range(0, (K + KS - 1) // KS):
        o_ks = i_k * KS + tl.arange(0, KS)
        m = m_t[:, None] & (o_ks < K)[None, :]
        b_q = tl.load(p_q + o_i[:, None] * s_qt + o_ks[None, :], mask=m, other=0.0)
        b_k = tl.load(p_k + o_i[:, None] * s_kt + o_ks[None, :], mask=m, other=0.0)
        b_qq += tl.sum(b_q.to(tl.float32) * b_q.to(tl.float32), 1)
        b_qk = tl.dot(b_q, tl.trans(b_k), b_qk, input_precision=PREC)
    return b_qk, b_qq


@triton.jit
def qh_slices(p_q, s_qt, p_h, o_i, m_t, o_v, m_v, K: tl.constexpr, V: tl.constexpr, KS: tl.constexpr,
              BT: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """The chunk's raw q h [BT, BV] (h: one [K, V] state, the columns o_v) over K in runtime slices of KS."""
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, (K + KS - 1) // KS):
        o_ks = i_k * KS + tl.arange(0, KS)
        b_q = tl.load(p_q + o_i[:, None] * s_qt + o_ks[None, :], mask=m_t[:, None] & (o_ks < K)[None, :], other=0.0)
        b_h = tl.load(p_h + o_ks[:, None] * V + o_v[None, :], mask=(o_ks < K)[:, None] & m_v[None, :], other=0.0)
        b_o = tl.dot(b_q, b_h, b_o, input_precision=PREC)
    return b_o
