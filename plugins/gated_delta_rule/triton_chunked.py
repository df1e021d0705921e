"""Triton kernels of the chunked (WY) gated delta rule for PREFILL / PREFILL_VARLEN (docs/math.md#chunked-form-prefill).

Four launches, FLA's decomposition with the small passes fused (gates, cumsum and the q/k L2 norm need no launch
of their own):

1. `gdn_chunk_solve_kernel`, grid (chunks, H) (or (chunks, HV), `Tuning.solve_share`), chunk-parallel, 1 warp:
   the raw k k^T of the chunk as ten 16x16 blocks (K in slices) and the squared row norms; then per value head
   the gates (g, beta from a, b, A_log, dt_bias), the chunk-local cumsum gamma of g, A = beta k k^T *
   exp(gamma_r - gamma_s) / (|k_r| |k_s|) (strictly lower), and T = (I + A)^-1 by forward substitution on the
   diagonal blocks and block merges. Writes T (activation dtype, [T, HV, 64]) and gamma (fp32). The substitution
   is a chain of dependent reductions: on one warp they stay inside the warp (4 warps: 2053 us for the whole
   prefill at T=16384 against 1353 us, H200), which is why it is not fused with the dot-heavy pass 2.
2. `gdn_chunk_wu_kernel`, grid (chunks, HV), chunk-parallel: q, k normalised (stored once per key head for passes
   3 and 4), w = T diag(beta e^gamma) k, u = T diag(beta) v.
3. `gdn_chunk_state_kernel`, grid (V-tiles, HV, N), sequential over a sequence's chunks: the fp32 state tile
   S [K, BV] from the pool, per chunk h_c = S (stored for pass 4), v_new = u - w S, S = e^gamma_C S +
   k^T (v_new * e^(gamma_C - gamma)); the capture snapshot and the final state go to the capture buffer / pool.
4. `gdn_chunk_out_kernel`, grid (V-tiles, chunks, H), chunk-parallel, one program for the G value heads of a key
   head (q, k and q k^T once): o = e^gamma (q h_c) + tril(q k^T * e^(gamma_r - gamma_s)) v_new.

Varlen chunks are 64-token pieces of each sequence counted from its start; a capture point 0 < c < len splits
the sequence into two segments with their own chunks, so the state at the capture point is a chunk boundary.
No host metadata: every program finds its (sequence, chunk) from cu_seqlens and capture_at by a vector prefix
sum over the N sequences (`locate_chunk`), and the grids are sized from shapes only (chunks <= T/64 + 2N), so
every launch is CUDA-graph safe. Programs beyond the last chunk return at once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_recurrent import l2norm_rows, softplus

BT = 64  # chunk size
BC = 16  # sub-block of the triangular solve


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
def normalize_rows(x, xn, i0, n_t, n_write, scale, s_xt, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr,
                   BC: tl.constexpr):
    """Chunk rows [i0, i0 + BC) of one head of q or k, L2-normalised and scaled, in xn's dtype [BC, BK]; rows
    below n_write are also stored to xn ([T, H, K]). x and xn point at the chunk's first row of the head; rows
    past n_t are zero."""
    o_i = i0 + tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    m_k = (o_k < K)[None, :]
    b_x = tl.load(x + o_i[:, None] * s_xt + o_k[None, :], mask=(o_i < n_t)[:, None] & m_k, other=0.0)
    b_x = (l2norm_rows(b_x.to(tl.float32), 1) * scale).to(xn.dtype.element_ty)
    tl.store(xn + o_i[:, None] * (H * K) + o_k[None, :], b_x, mask=(o_i < n_write)[:, None] & m_k)
    return b_x


@triton.jit
def gate_rows(a, b, b_Aexp, b_dt, i0, n_t, carry, s_at, s_bt, BC: tl.constexpr):
    """Chunk rows [i0, i0 + BC): gamma [BC] (the cumsum of g continued from `carry`), beta [BC], row mask and the
    new carry. Rows past n_t have g = beta = 0."""
    o_i = i0 + tl.arange(0, BC)
    m_t = o_i < n_t
    b_g = b_Aexp * softplus(tl.load(a + o_i * s_at, mask=m_t, other=0.0).to(tl.float32) + b_dt)
    b_g = tl.where(m_t, b_g, 0.0)
    b_beta = tl.where(m_t, tl.sigmoid(tl.load(b + o_i * s_bt, mask=m_t, other=0.0).to(tl.float32)), 0.0)
    return tl.cumsum(b_g, 0) + carry, b_beta, m_t, carry + tl.sum(b_g, 0)


@triton.jit
def gate_block(b_A, b_gi, b_gj, b_si, b_rj, DIAG: tl.constexpr, BC: tl.constexpr):
    """A_ij = beta_i (k_i k_j^T) e^(gamma_i - gamma_j) from the raw dot k_i k_j^T: b_si = beta_i / |k_i|,
    b_rj = 1 / |k_j| apply the L2 norm. Strictly lower on a diagonal block (masked before exp: gamma_i - gamma_j
    > 0 above the diagonal and may overflow)."""
    b_d = b_gi[:, None] - b_gj[None, :]
    if DIAG:
        o_i = tl.arange(0, BC)
        m_low = o_i[:, None] > o_i[None, :]
        b_A = tl.where(m_low, b_A * tl.exp(tl.where(m_low, b_d, 0.0)), 0.0)
    else:
        b_A = b_A * tl.exp(b_d)
    return b_A * b_si[:, None] * b_rj[None, :]


@triton.jit
def inv_diag_block(b_A, BC: tl.constexpr):
    """(I + A)^-1 of a strictly lower triangular [BC, BC] block by forward substitution, row by row (fp32)."""
    o_i = tl.arange(0, BC)
    b_Ai = -b_A
    for i in range(2, BC):
        b_a = tl.sum(tl.where((o_i == i)[:, None], -b_A, 0.0), 0)
        b_a = tl.where(o_i < i, b_a, 0.0)
        b_a = b_a + tl.sum(b_a[:, None] * b_Ai, 0)
        b_Ai = tl.where((o_i == i)[:, None], b_a, b_Ai)
    return b_Ai + (o_i[:, None] == o_i[None, :]).to(tl.float32)


@triton.jit
def store_block(p, b_x, m_r, DT: tl.constexpr):
    """One [BC, BC] block of (I + A)^-1 at p (p carries the rows and columns), rows past the chunk masked."""
    tl.store(p, b_x.to(DT), mask=m_r[:, None])


@triton.jit
def solve_head(i_hv, start, n_t, a, b, A_log, dt_bias, Ai, gam, s_at, s_ah, s_bt, s_bh,
               b_A00, b_A11, b_A22, b_A33, b_A10, b_A20, b_A21, b_A30, b_A31, b_A32, b_r0, b_r1, b_r2, b_r3,
               HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """Value head i_hv of a chunk from the raw k k^T blocks and the 1 / |k| rows: gates, A, (I + A)^-1, stores."""
    # gates; the L2 norm of k enters as 1 / |k| on both sides of the raw dot (same eps as l2norm_rows)
    b_Aexp = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    o_i = tl.arange(0, BC)
    a += start * s_at + i_hv * s_ah
    b += start * s_bt + i_hv * s_bh
    b_g0, b_b0, m_0, c = gate_rows(a, b, b_Aexp, b_dt, 0, n_t, 0.0, s_at, s_bt, BC)
    b_g1, b_b1, m_1, c = gate_rows(a, b, b_Aexp, b_dt, BC, n_t, c, s_at, s_bt, BC)
    b_g2, b_b2, m_2, c = gate_rows(a, b, b_Aexp, b_dt, 2 * BC, n_t, c, s_at, s_bt, BC)
    b_g3, b_b3, m_3, c = gate_rows(a, b, b_Aexp, b_dt, 3 * BC, n_t, c, s_at, s_bt, BC)
    b_A00 = gate_block(b_A00, b_g0, b_g0, b_b0 * b_r0, b_r0, True, BC)
    b_A11 = gate_block(b_A11, b_g1, b_g1, b_b1 * b_r1, b_r1, True, BC)
    b_A22 = gate_block(b_A22, b_g2, b_g2, b_b2 * b_r2, b_r2, True, BC)
    b_A33 = gate_block(b_A33, b_g3, b_g3, b_b3 * b_r3, b_r3, True, BC)
    b_A10 = gate_block(b_A10, b_g1, b_g0, b_b1 * b_r1, b_r0, False, BC)
    b_A20 = gate_block(b_A20, b_g2, b_g0, b_b2 * b_r2, b_r0, False, BC)
    b_A21 = gate_block(b_A21, b_g2, b_g1, b_b2 * b_r2, b_r1, False, BC)
    b_A30 = gate_block(b_A30, b_g3, b_g0, b_b3 * b_r3, b_r0, False, BC)
    b_A31 = gate_block(b_A31, b_g3, b_g1, b_b3 * b_r3, b_r1, False, BC)
    b_A32 = gate_block(b_A32, b_g3, b_g2, b_b3 * b_r3, b_r2, False, BC)

    # T = (I + A)^-1: diagonal blocks by substitution, then T_ij = -T_ii sum_{j<=m<i} A_im T_mj (fp32 operands)
    b_T00 = inv_diag_block(b_A00, BC)
    b_T11 = inv_diag_block(b_A11, BC)
    b_T22 = inv_diag_block(b_A22, BC)
    b_T33 = inv_diag_block(b_A33, BC)
    b_T10 = -tl.dot(b_T11, tl.dot(b_A10, b_T00, input_precision=PREC), input_precision=PREC)
    b_T21 = -tl.dot(b_T22, tl.dot(b_A21, b_T11, input_precision=PREC), input_precision=PREC)
    b_T32 = -tl.dot(b_T33, tl.dot(b_A32, b_T22, input_precision=PREC), input_precision=PREC)
    b_T20 = -tl.dot(b_T22, tl.dot(b_A20, b_T00, input_precision=PREC)
                    + tl.dot(b_A21, b_T10, input_precision=PREC), input_precision=PREC)
    b_T31 = -tl.dot(b_T33, tl.dot(b_A31, b_T11, input_precision=PREC)
                    + tl.dot(b_A32, b_T21, input_precision=PREC), input_precision=PREC)
    b_T30 = -tl.dot(b_T33, tl.dot(b_A30, b_T00, input_precision=PREC)
                    + tl.dot(b_A31, b_T10, input_precision=PREC)
                    + tl.dot(b_A32, b_T20, input_precision=PREC), input_precision=PREC)

    # the 10 blocks on and below the diagonal; the wu pass masks the rest by row >= column
    DT = Ai.dtype.element_ty
    p_A = Ai + (start * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :]
    R = BC * HV * BT
    store_block(p_A, b_T00, m_0, DT)
    store_block(p_A + R, b_T10, m_1, DT)
    store_block(p_A + R + BC, b_T11, m_1, DT)
    store_block(p_A + 2 * R, b_T20, m_2, DT)
    store_block(p_A + 2 * R + BC, b_T21, m_2, DT)
    store_block(p_A + 2 * R + 2 * BC, b_T22, m_2, DT)
    store_block(p_A + 3 * R, b_T30, m_3, DT)
    store_block(p_A + 3 * R + BC, b_T31, m_3, DT)
    store_block(p_A + 3 * R + 2 * BC, b_T32, m_3, DT)
    store_block(p_A + 3 * R + 3 * BC, b_T33, m_3, DT)
    gam += start * HV + i_hv
    tl.store(gam + o_i * HV, b_g0, mask=m_0)
    tl.store(gam + (BC + o_i) * HV, b_g1, mask=m_1)
    tl.store(gam + (2 * BC + o_i) * HV, b_g2, mask=m_2)
    tl.store(gam + (3 * BC + o_i) * HV, b_g3, mask=m_3)


@triton.jit
def gdn_chunk_solve_kernel(
    k, a, b, A_log, dt_bias,  # strided views as in the recurrent kernel
    Ai, gam,  # [T, HV, BT] activation dtype: the chunk's rows of (I + A)^-1; [T, HV] fp32: gamma
    cu_seqlens, slots, capture_at, N,
    s_kt, s_kh, s_at, s_ah, s_bt, s_bh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    BKS: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr,
    SHARE: tl.constexpr,
):
    # SHARE: grid (chunks, H), one program computes the raw k k^T of a key head once and solves for the G value
    # heads of its group; else grid (chunks, HV), one value head per program (more programs, G x the k k^T work)
    i_c, i_x = tl.program_id(0), tl.program_id(1)
    G: tl.constexpr = HV // H
    i_n, start, n_t = locate_chunk(i_c, cu_seqlens, capture_at, N, BN, BT)
    if i_n >= N:
        return
    if tl.load(slots + i_n) < 0:
        return
    i_h = i_x if SHARE else i_x // G
    k += start * s_kt + i_h * s_kh
    o_i = tl.arange(0, BC)

    # raw k k^T as 10 blocks of 16 x 16 and the squared row norms, K in slices of BKS (few registers, so the
    # latency-bound solve below can run on one or two warps)
    b_A00 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A11 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A22 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A33 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A10 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A20 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A21 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A30 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A31 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A32 = tl.zeros([BC, BC], dtype=tl.float32)
    b_s0 = tl.zeros([BC], dtype=tl.float32)
    b_s1 = tl.zeros([BC], dtype=tl.float32)
    b_s2 = tl.zeros([BC], dtype=tl.float32)
    b_s3 = tl.zeros([BC], dtype=tl.float32)
    m_0, m_1, m_2, m_3 = o_i < n_t, BC + o_i < n_t, 2 * BC + o_i < n_t, 3 * BC + o_i < n_t
    for i_k in tl.static_range(0, (K + BKS - 1) // BKS):
        o_k = i_k * BKS + tl.arange(0, BKS)
        m_k = (o_k < K)[None, :]
        p_k = k + o_i[:, None] * s_kt + o_k[None, :]
        b_k0 = tl.load(p_k, mask=m_0[:, None] & m_k, other=0.0)
        b_k1 = tl.load(p_k + BC * s_kt, mask=m_1[:, None] & m_k, other=0.0)
        b_k2 = tl.load(p_k + 2 * BC * s_kt, mask=m_2[:, None] & m_k, other=0.0)
        b_k3 = tl.load(p_k + 3 * BC * s_kt, mask=m_3[:, None] & m_k, other=0.0)
        b_s0 += tl.sum(b_k0.to(tl.float32) * b_k0.to(tl.float32), 1)
        b_s1 += tl.sum(b_k1.to(tl.float32) * b_k1.to(tl.float32), 1)
        b_s2 += tl.sum(b_k2.to(tl.float32) * b_k2.to(tl.float32), 1)
        b_s3 += tl.sum(b_k3.to(tl.float32) * b_k3.to(tl.float32), 1)
        b_A00 = tl.dot(b_k0, tl.trans(b_k0), b_A00, input_precision=PREC)
        b_A11 = tl.dot(b_k1, tl.trans(b_k1), b_A11, input_precision=PREC)
        b_A22 = tl.dot(b_k2, tl.trans(b_k2), b_A22, input_precision=PREC)
        b_A33 = tl.dot(b_k3, tl.trans(b_k3), b_A33, input_precision=PREC)
        b_A10 = tl.dot(b_k1, tl.trans(b_k0), b_A10, input_precision=PREC)
        b_A20 = tl.dot(b_k2, tl.trans(b_k0), b_A20, input_precision=PREC)
        b_A21 = tl.dot(b_k2, tl.trans(b_k1), b_A21, input_precision=PREC)
        b_A30 = tl.dot(b_k3, tl.trans(b_k0), b_A30, input_precision=PREC)
        b_A31 = tl.dot(b_k3, tl.trans(b_k1), b_A31, input_precision=PREC)
        b_A32 = tl.dot(b_k3, tl.trans(b_k2), b_A32, input_precision=PREC)

    b_r0, b_r1 = 1.0 / tl.sqrt(b_s0 + 1e-6), 1.0 / tl.sqrt(b_s1 + 1e-6)
    b_r2, b_r3 = 1.0 / tl.sqrt(b_s2 + 1e-6), 1.0 / tl.sqrt(b_s3 + 1e-6)
    for g in tl.static_range(0, G if SHARE else 1):
        solve_head(i_h * G + g if SHARE else i_x, start, n_t, a, b, A_log, dt_bias, Ai, gam, s_at, s_ah, s_bt, s_bh,
                   b_A00, b_A11, b_A22, b_A33, b_A10, b_A20, b_A21, b_A30, b_A31, b_A32, b_r0, b_r1, b_r2, b_r3,
                   HV, BT, BC, PREC)


@triton.jit
def gdn_chunk_wu_kernel(
    q, k, v, b,  # strided views as in the recurrent kernel
    Ai, gam,  # from the solve pass
    qn, kn,  # [T, H, K] activation dtype: q / sqrt(sum q^2 + eps) * scale and k / sqrt(sum k^2 + eps)
    w, u,  # [T, HV, K], [T, HV, V] activation dtype
    cu_seqlens, slots, capture_at, N,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_bt, s_bh, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
):
    # one program per value head: serving the G heads of a key head from one program measured 413 us against
    # 247 us at T = 16384 on the H200 (fewer programs, each twice as long), so k is normalised G times here
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_n, start, n_t = locate_chunk(i_c, cu_seqlens, capture_at, N, BN, BT)
    if i_n >= N:
        return
    if tl.load(slots + i_n) < 0:
        return
    DT = w.dtype.element_ty
    G: tl.constexpr = HV // H
    i_h = i_hv // G
    # the first value head of each group writes the normalised q and k of its key head
    n_write = tl.where(i_hv % G == 0, n_t, 0)
    if i_hv % G == 0:
        normalize_rows(q + start * s_qt + i_h * s_qh, qn + (start * H + i_h) * K, 0, n_t, n_write, scale, s_qt,
                       H, K, BK, BT)
    b_k = normalize_rows(k + start * s_kt + i_h * s_kh, kn + (start * H + i_h) * K, 0, n_t, n_write, 1.0, s_kt,
                         H, K, BK, BT)
    o_i = tl.arange(0, BT)
    m_t = o_i < n_t
    b_beta = tl.where(m_t, tl.sigmoid(tl.load(b + start * s_bt + i_hv * s_bh + o_i * s_bt, mask=m_t,
                                              other=0.0).to(tl.float32)), 0.0)
    b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
    m_A = (o_i[:, None] >= o_i[None, :]) & m_t[:, None]
    b_A = tl.load(Ai + (start * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_A, other=0.0)

    # w = T diag(beta e^gamma) k
    o_k = tl.arange(0, BK)
    b_x = (b_k.to(tl.float32) * (b_beta * tl.exp(b_gam))[:, None]).to(DT)
    tl.store(w + (start * HV + i_hv) * K + o_i[:, None] * (HV * K) + o_k[None, :],
             tl.dot(b_A, b_x, input_precision=PREC).to(DT), mask=m_t[:, None] & (o_k < K)[None, :])
    # u = T diag(beta) v, by V-tiles
    v += start * s_vt + i_hv * s_vh
    u += (start * HV + i_hv) * V
    for i_v in tl.static_range(0, (V + BV - 1) // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        m_u = m_t[:, None] & (o_v < V)[None, :]
        b_v = tl.load(v + o_i[:, None] * s_vt + o_v[None, :], mask=m_u, other=0.0).to(tl.float32)
        tl.store(u + o_i[:, None] * (HV * V) + o_v[None, :],
                 tl.dot(b_A, (b_v * b_beta[:, None]).to(DT), input_precision=PREC).to(DT), mask=m_u)


@triton.jit
def state_chunk(b_h, j, i_c0, bos, length, cut, kn, w, u, gam, h, v_new, i_h, i_hv, o_i, o_k, o_v, m_k, m_v, o_h, m_h,
                H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr,
                PREC: tl.constexpr):
    """One chunk of the state pass: stores h_c = S and v_new = u - w S, returns e^gamma_C S + k^T (v_new *
    e^(gamma_C - gamma))."""
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
    b_v *= tl.where(m_t, tl.exp(b_last - b_gam), 0.0)[:, None]
    b_kt = tl.load(kn + (start * H + i_h) * K + o_i[None, :] * (H * K) + o_k[:, None],
                   mask=m_k[:, None] & m_t[None, :], other=0.0)
    b_h *= tl.exp(b_last)
    return tl.dot(b_kt, b_v.to(DT), b_h, input_precision=PREC)


@triton.jit
def gdn_chunk_state_kernel(
    kn, w, u, gam,  # from the prep passes
    h, v_new,  # [chunks, HV, K, V], [T, HV, V] activation dtype: per-chunk start states and v_new for pass 3
    pool, cap,  # [S, HV, K, V], [N, HV, K, V] fp32
    cu_seqlens, slots, capture_at, N,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
):
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    slot = tl.load(slots + i_n).to(tl.int64)
    if slot < 0:
        return
    i_h = i_hv // (HV // H)
    o_n, b_bos, b_len, b_cut, b_cnt = seq_chunk_counts(cu_seqlens, capture_at, N, BN, BT)
    m_sel = o_n == i_n
    bos = tl.sum(tl.where(m_sel, b_bos, 0), 0).to(tl.int64)
    length = tl.sum(tl.where(m_sel, b_len, 0), 0)
    cut = tl.sum(tl.where(m_sel, b_cut, 0), 0)
    n_chunks = tl.sum(tl.where(m_sel, b_cnt, 0), 0)
    nc1 = (cut + BT - 1) // BT  # chunks before the capture cut (0 when it does not split the sequence)
    i_c0 = tl.sum(tl.where(o_n < i_n, b_cnt, 0), 0).to(tl.int64)  # global index of the first chunk
    c_at = tl.load(capture_at + i_n)

    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    o_h = o_k[:, None] * V + o_v[None, :]
    pool += (slot * HV + i_hv) * K * V
    cap += (i_n * HV + i_hv).to(tl.int64) * K * V
    b_h = tl.load(pool + o_h, mask=m_h, other=0.0)

    # the capture point is a chunk boundary (chunks restart at the cut), so the loop splits there and its body
    # carries no branch (a branch in the body would keep Triton from pipelining the loads)
    if c_at == 0:
        tl.store(cap + o_h, b_h, mask=m_h)
    for j in range(0, nc1):
        b_h = state_chunk(b_h, j, i_c0, bos, length, cut, kn, w, u, gam, h, v_new, i_h, i_hv, o_i, o_k, o_v, m_k,
                          m_v, o_h, m_h, H, HV, K, V, BT, PREC)
    if nc1 > 0:
        tl.store(cap + o_h, b_h, mask=m_h)
    for j in range(nc1, n_chunks):
        b_h = state_chunk(b_h, j, i_c0, bos, length, cut, kn, w, u, gam, h, v_new, i_h, i_hv, o_i, o_k, o_v, m_k,
                          m_v, o_h, m_h, H, HV, K, V, BT, PREC)
    if (length == c_at) & (length > 0):
        tl.store(cap + o_h, b_h, mask=m_h)
    if length > 0:
        tl.store(pool + o_h, b_h, mask=m_h)


@triton.jit
def gdn_chunk_out_kernel(
    qn, kn, gam, h, v_new, o,
    cu_seqlens, slots, capture_at, N,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
):
    # one program per key head serves the G value heads of its group: q, k and q k^T are loaded and computed once
    i_v, i_c, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
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
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    o_qk = (start * H + i_h) * K
    p_qk = o_i[:, None] * (H * K) + o_k[None, :]
    b_q = tl.load(qn + o_qk + p_qk, mask=m_tk, other=0.0)
    b_k = tl.load(kn + o_qk + p_qk, mask=m_tk, other=0.0)
    m_inc = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_s = tl.where(m_inc, tl.dot(b_q, tl.trans(b_k), input_precision=PREC), 0.0)
    for g in tl.static_range(0, G):
        i_hv = i_h * G + g
        o_o = (start * HV + i_hv) * V
        b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
        # h is indexed by the global chunk index, the numbering the state pass uses
        b_h = tl.load(h + (i_c.to(tl.int64) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :],
                      mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o = tl.dot(b_q, b_h, input_precision=PREC) * tl.exp(b_gam)[:, None]
        b_p = b_s * tl.exp(tl.where(m_inc, b_gam[:, None] - b_gam[None, :], 0.0))
        b_vn = tl.load(v_new + o_o + p_o, mask=m_o, other=0.0)
        b_o = tl.dot(b_p.to(DT), b_vn, b_o, input_precision=PREC)
        tl.store(o + o_o + p_o, b_o.to(o.dtype.element_ty), mask=m_o)
