"""Triton kernels of the chunked (WY) gated delta rule for PREFILL / PREFILL_VARLEN (reference/gdn.md §2.1).

Three launches, FLA's decomposition with the small passes fused:

1. `gdn_chunk_prep_kernel`, grid (chunks, HV), chunk-parallel: gates (g, beta from a, b, A_log, dt_bias), the
   chunk-local cumsum gamma of g, the k L2 norm, A = beta k k^T * exp(gamma_r - gamma_s) (strictly lower), its
   inverse T = (I + A)^-1 by forward substitution on 16x16 diagonal blocks and block merges, and the WY factors
   w = T diag(beta e^gamma) k, u = T diag(beta) v. Writes w, u (activation dtype) and gamma (fp32).
2. `gdn_chunk_state_kernel`, grid (V-tiles, HV, N), sequential over a sequence's chunks: the fp32 state tile
   S [K, BV] from the pool, per chunk h_c = S (stored for pass 3), v_new = u - w S, S = e^gamma_C S +
   k^T (v_new * e^(gamma_C - gamma)); the capture snapshot and the final state go to the capture buffer / pool.
3. `gdn_chunk_out_kernel`, grid (V-tiles, chunks, HV), chunk-parallel:
   o = e^gamma (q h_c) + tril(q k^T * e^(gamma_r - gamma_s)) v_new, with q normalised and scaled.

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
def prep_rows(k, kn, a, b, b_Aexp, b_dt, i0, n_t, n_write, carry, s_kt, s_at, s_bt,
              H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr):
    """Chunk rows [i0, i0 + BC): normalised k [BC, BK] (dot dtype; stored to kn below n_write), gamma [BC] (the
    cumsum of g continued from `carry`), beta [BC], row mask and the new carry. Rows past n_t have g = beta = 0."""
    o_i = i0 + tl.arange(0, BC)
    m_t = o_i < n_t
    b_k = normalize_rows(k, kn, i0, n_t, n_write, 1.0, s_kt, H, K, BK, BC)
    b_g = b_Aexp * softplus(tl.load(a + o_i * s_at, mask=m_t, other=0.0).to(tl.float32) + b_dt)
    b_g = tl.where(m_t, b_g, 0.0)
    b_beta = tl.where(m_t, tl.sigmoid(tl.load(b + o_i * s_bt, mask=m_t, other=0.0).to(tl.float32)), 0.0)
    b_gam = tl.cumsum(b_g, 0) + carry
    return b_k, b_gam, b_beta, m_t, carry + tl.sum(b_g, 0)


@triton.jit
def kkt_block(b_ki, b_kj, b_gi, b_gj, b_bi, DIAG: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """A_ij = beta_i (k_i k_j^T) e^(gamma_i - gamma_j), strictly lower on a diagonal block (masked before exp:
    gamma_i - gamma_j > 0 above the diagonal and may overflow)."""
    b_A = tl.dot(b_ki, tl.trans(b_kj), input_precision=PREC)
    b_d = b_gi[:, None] - b_gj[None, :]
    if DIAG:
        o_i = tl.arange(0, BC)
        m_low = o_i[:, None] > o_i[None, :]
        b_A = tl.where(m_low, b_A * tl.exp(tl.where(m_low, b_d, 0.0)), 0.0)
    else:
        b_A = b_A * tl.exp(b_d)
    return b_A * b_bi[:, None]


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
def wu_rows(b_T0, b_T1, b_T2, b_T3, b_x0, b_x1, b_x2, b_x3, N_TERMS: tl.constexpr, DT: tl.constexpr,
            PREC: tl.constexpr):
    """sum_{j < N_TERMS} T_j x_j: one 16-row block of w or u (T_j = block (i, j) of (I + A)^-1)."""
    b_y = tl.dot(b_T0.to(DT), b_x0.to(DT), input_precision=PREC)
    if N_TERMS > 1:
        b_y = tl.dot(b_T1.to(DT), b_x1.to(DT), b_y, input_precision=PREC)
    if N_TERMS > 2:
        b_y = tl.dot(b_T2.to(DT), b_x2.to(DT), b_y, input_precision=PREC)
    if N_TERMS > 3:
        b_y = tl.dot(b_T3.to(DT), b_x3.to(DT), b_y, input_precision=PREC)
    return b_y


@triton.jit
def gdn_chunk_prep_kernel(
    q, k, v, a, b, A_log, dt_bias,  # strided views as in the recurrent kernel
    qn, kn,  # [T, H, K] activation dtype: q / sqrt(sum q^2 + eps) * scale and k / sqrt(sum k^2 + eps)
    w, u, gam,  # [T, HV, K], [T, HV, V] activation dtype; [T, HV] fp32
    cu_seqlens, slots, capture_at, N,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh, scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    PREC: tl.constexpr,
):
    i_c, i_hv = tl.program_id(0), tl.program_id(1)
    i_n, start, n_t = locate_chunk(i_c, cu_seqlens, capture_at, N, BN, BT)
    if i_n >= N:
        return
    if tl.load(slots + i_n) < 0:
        return
    DT = w.dtype.element_ty
    G: tl.constexpr = HV // H
    i_h = i_hv // G
    b_Aexp = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    k += start * s_kt + i_h * s_kh
    a += start * s_at + i_hv * s_ah
    b += start * s_bt + i_hv * s_bh
    kn += (start * H + i_h) * K
    # the first value head of each group writes the normalised q and k of its key head
    n_write = tl.where(i_hv % G == 0, n_t, 0)
    if i_hv % G == 0:
        for i in tl.static_range(0, BT // BC):
            normalize_rows(q + start * s_qt + i_h * s_qh, qn + (start * H + i_h) * K, i * BC, n_t, n_write, scale,
                           s_qt, H, K, BK, BC)
    b_k0, b_g0, b_b0, m_0, c = prep_rows(k, kn, a, b, b_Aexp, b_dt, 0, n_t, n_write, 0.0, s_kt, s_at, s_bt,
                                         H, K, BK, BC)
    b_k1, b_g1, b_b1, m_1, c = prep_rows(k, kn, a, b, b_Aexp, b_dt, BC, n_t, n_write, c, s_kt, s_at, s_bt,
                                         H, K, BK, BC)
    b_k2, b_g2, b_b2, m_2, c = prep_rows(k, kn, a, b, b_Aexp, b_dt, 2 * BC, n_t, n_write, c, s_kt, s_at, s_bt,
                                         H, K, BK, BC)
    b_k3, b_g3, b_b3, m_3, c = prep_rows(k, kn, a, b, b_Aexp, b_dt, 3 * BC, n_t, n_write, c, s_kt, s_at, s_bt,
                                         H, K, BK, BC)

    # A = beta k k^T e^(gamma_r - gamma_s), strictly lower, as 10 blocks of 16 x 16
    b_A00 = kkt_block(b_k0, b_k0, b_g0, b_g0, b_b0, True, BC, PREC)
    b_A11 = kkt_block(b_k1, b_k1, b_g1, b_g1, b_b1, True, BC, PREC)
    b_A22 = kkt_block(b_k2, b_k2, b_g2, b_g2, b_b2, True, BC, PREC)
    b_A33 = kkt_block(b_k3, b_k3, b_g3, b_g3, b_b3, True, BC, PREC)
    b_A10 = kkt_block(b_k1, b_k0, b_g1, b_g0, b_b1, False, BC, PREC)
    b_A20 = kkt_block(b_k2, b_k0, b_g2, b_g0, b_b2, False, BC, PREC)
    b_A21 = kkt_block(b_k2, b_k1, b_g2, b_g1, b_b2, False, BC, PREC)
    b_A30 = kkt_block(b_k3, b_k0, b_g3, b_g0, b_b3, False, BC, PREC)
    b_A31 = kkt_block(b_k3, b_k1, b_g3, b_g1, b_b3, False, BC, PREC)
    b_A32 = kkt_block(b_k3, b_k2, b_g3, b_g2, b_b3, False, BC, PREC)

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

    # gamma and w = T diag(beta e^gamma) k
    o_i = tl.arange(0, BC)
    o_k = tl.arange(0, BK)
    m_k = (o_k < K)[None, :]
    gam += start * HV + i_hv
    tl.store(gam + o_i * HV, b_g0, mask=m_0)
    tl.store(gam + (BC + o_i) * HV, b_g1, mask=m_1)
    tl.store(gam + (2 * BC + o_i) * HV, b_g2, mask=m_2)
    tl.store(gam + (3 * BC + o_i) * HV, b_g3, mask=m_3)
    b_x0 = b_k0.to(tl.float32) * (b_b0 * tl.exp(b_g0))[:, None]
    b_x1 = b_k1.to(tl.float32) * (b_b1 * tl.exp(b_g1))[:, None]
    b_x2 = b_k2.to(tl.float32) * (b_b2 * tl.exp(b_g2))[:, None]
    b_x3 = b_k3.to(tl.float32) * (b_b3 * tl.exp(b_g3))[:, None]
    p_w = w + (start * HV + i_hv) * K + o_i[:, None] * (HV * K) + o_k[None, :]
    tl.store(p_w, wu_rows(b_T00, b_T00, b_T00, b_T00, b_x0, b_x0, b_x0, b_x0, 1, DT, PREC).to(DT),
             mask=m_0[:, None] & m_k)
    tl.store(p_w + BC * HV * K, wu_rows(b_T10, b_T11, b_T11, b_T11, b_x0, b_x1, b_x1, b_x1, 2, DT, PREC).to(DT),
             mask=m_1[:, None] & m_k)
    tl.store(p_w + 2 * BC * HV * K, wu_rows(b_T20, b_T21, b_T22, b_T22, b_x0, b_x1, b_x2, b_x2, 3, DT, PREC
                                            ).to(DT), mask=m_2[:, None] & m_k)
    tl.store(p_w + 3 * BC * HV * K, wu_rows(b_T30, b_T31, b_T32, b_T33, b_x0, b_x1, b_x2, b_x3, 4, DT, PREC
                                            ).to(DT), mask=m_3[:, None] & m_k)

    # u = T diag(beta) v, by V-tiles
    v += start * s_vt + i_hv * s_vh
    u += (start * HV + i_hv) * V
    for i_v in tl.static_range(0, (V + BV - 1) // BV):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = (o_v < V)[None, :]
        p_v = v + o_i[:, None] * s_vt + o_v[None, :]
        b_v0 = tl.load(p_v, mask=m_0[:, None] & m_v, other=0.0).to(tl.float32) * b_b0[:, None]
        b_v1 = tl.load(p_v + BC * s_vt, mask=m_1[:, None] & m_v, other=0.0).to(tl.float32) * b_b1[:, None]
        b_v2 = tl.load(p_v + 2 * BC * s_vt, mask=m_2[:, None] & m_v, other=0.0).to(tl.float32) * b_b2[:, None]
        b_v3 = tl.load(p_v + 3 * BC * s_vt, mask=m_3[:, None] & m_v, other=0.0).to(tl.float32) * b_b3[:, None]
        p_u = u + o_i[:, None] * (HV * V) + o_v[None, :]
        tl.store(p_u, wu_rows(b_T00, b_T00, b_T00, b_T00, b_v0, b_v0, b_v0, b_v0, 1, DT, PREC).to(DT),
                 mask=m_0[:, None] & m_v)
        tl.store(p_u + BC * HV * V, wu_rows(b_T10, b_T11, b_T11, b_T11, b_v0, b_v1, b_v1, b_v1, 2, DT, PREC
                                            ).to(DT), mask=m_1[:, None] & m_v)
        tl.store(p_u + 2 * BC * HV * V, wu_rows(b_T20, b_T21, b_T22, b_T22, b_v0, b_v1, b_v2, b_v2, 3, DT, PREC
                                                ).to(DT), mask=m_2[:, None] & m_v)
        tl.store(p_u + 3 * BC * HV * V, wu_rows(b_T30, b_T31, b_T32, b_T33, b_v0, b_v1, b_v2, b_v3, 4, DT, PREC
                                                ).to(DT), mask=m_3[:, None] & m_v)


@triton.jit
def gdn_chunk_state_kernel(
    kn, w, u, gam,  # from the prep pass
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
    DT = w.dtype.element_ty
    i_h = i_hv // (HV // H)
    o_n, b_bos, b_len, b_cut, b_cnt = seq_chunk_counts(cu_seqlens, capture_at, N, BN, BT)
    m_sel = o_n == i_n
    bos = tl.sum(tl.where(m_sel, b_bos, 0), 0).to(tl.int64)
    length = tl.sum(tl.where(m_sel, b_len, 0), 0)
    cut = tl.sum(tl.where(m_sel, b_cut, 0), 0)
    n_chunks = tl.sum(tl.where(m_sel, b_cnt, 0), 0)
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

    for j in range(0, n_chunks):
        start, n_t = chunk_bounds(j, bos, length, cut, BT)
        if start == bos + c_at:
            tl.store(cap + o_h, b_h, mask=m_h)
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
        b_h = tl.dot(b_kt, b_v.to(DT), b_h, input_precision=PREC)

    if length == c_at:
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
    i_v, i_c, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n, start, n_t = locate_chunk(i_c, cu_seqlens, capture_at, N, BN, BT)
    if i_n >= N:
        return
    DT = v_new.dtype.element_ty
    o_i = tl.arange(0, BT)
    m_t = o_i < n_t
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_o = m_t[:, None] & m_v[None, :]
    o_o = (start * HV + i_hv) * V
    p_o = o_i[:, None] * (HV * V) + o_v[None, :]
    if tl.load(slots + i_n) < 0:
        tl.store(o + o_o + p_o, tl.zeros([BT, BV], dtype=o.dtype.element_ty), mask=m_o)
        return
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    o_qk = (start * H + i_h) * K
    p_qk = o_i[:, None] * (H * K) + o_k[None, :]
    b_q = tl.load(qn + o_qk + p_qk, mask=m_tk, other=0.0)
    b_k = tl.load(kn + o_qk + p_qk, mask=m_tk, other=0.0)
    b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)

    # h is indexed by the global chunk index, the numbering the state pass uses
    b_h = tl.load(h + (i_c.to(tl.int64) * HV + i_hv) * K * V + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0.0)
    b_o = tl.dot(b_q, b_h, input_precision=PREC) * tl.exp(b_gam)[:, None]

    m_inc = (o_i[:, None] >= o_i[None, :]) & m_t[:, None] & m_t[None, :]
    b_s = tl.dot(b_q, tl.trans(b_k), input_precision=PREC)
    b_s = tl.where(m_inc, b_s * tl.exp(tl.where(m_inc, b_gam[:, None] - b_gam[None, :], 0.0)), 0.0)
    b_vn = tl.load(v_new + o_o + p_o, mask=m_o, other=0.0)
    b_o = tl.dot(b_s.to(DT), b_vn, b_o, input_precision=PREC)
    tl.store(o + o_o + p_o, b_o.to(o.dtype.element_ty), mask=m_o)
