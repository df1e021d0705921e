"""The chunk-parallel first pass of the chunked gated delta rule: gates, k k^T, (I + A)^-1, and w and u.

`gdn_chunk_intra_kernel`, grid (chunks, H) (or (chunks, HV) without `SHARE`), one warp by default: per chunk of 64
tokens and key head it accumulates the raw k k^T as ten 16 x 16 blocks (K in slices) with the squared row norms,
and stores r_k = 1 / |k| per row ([T, H] fp32: the later passes read the raw k and scale by it, so no normalised
copy of q or k is ever written). Then per value head of the group: the gates (g, beta from a, b, A_log, dt_bias),
the chunk-local cumsum gamma of g (stored, fp32), A = beta k_n k_n^T * exp(gamma_r - gamma_s) strictly lower, and
T = (I + A)^-1: the four diagonal blocks by one forward substitution over a [16, 16, 4] stack (14 dependent steps,
not 4 x 14), the rest by block merges. With `FUSE` it goes on to w = T diag(beta e^gamma r_k) k and
u = T diag(beta) v from the blocks in registers (T never goes to memory); without, it stores T ([T, HV, 64],
activation dtype) for `gdn_chunk_wu_kernel`, which forms w and u in a second launch.

The substitution is a chain of dependent reductions; on one warp they stay inside the warp (4 warps: 2053 us for
the whole prefill at T = 16384 against 1353 us, H200, 2026-12-02). The stack took the pass from 246 to 174 us at
T = 16384; `FUSE` lost (1173 us for the prefill against 971: the w/u half took about 408 us on the solve's one
warp, 582 - 174, against 194 us in its own 8-warp launch; H200, bench/results/2026-12-03-kernels-variants.md).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_chunked import locate_chunk
from .triton_recurrent import softplus


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
def inv_diag_blocks(b_A0, b_A1, b_A2, b_A3, BC: tl.constexpr):
    """(I + A)^-1 of four strictly lower triangular [BC, BC] blocks (fp32) by forward substitution, row by row,
    all four at once: stacked along a last dimension of 4 (held inside each thread), so each of the BC - 2 steps
    serves the four blocks."""
    b_Ai = -tl.reshape(tl.join(tl.join(b_A0, b_A1), tl.join(b_A2, b_A3)), [BC, BC, 4])
    o_i = tl.arange(0, BC)
    for i in range(2, BC):
        # row i of b_Ai is still row i of -A here (only the rows above it are solved): no copy of A is kept
        m_row = (o_i == i)[:, None, None]
        b_a = tl.sum(tl.where(m_row, b_Ai, 0.0), 0)  # [BC (column), 4]
        b_a = tl.where((o_i < i)[:, None], b_a, 0.0)
        b_a = b_a + tl.sum(b_a[:, None, :] * b_Ai, 0)
        b_Ai = tl.where(m_row, b_a[None, :, :], b_Ai)
    b_Ai += (o_i[:, None] == o_i[None, :]).to(tl.float32)[:, :, None]
    b_T01, b_T23 = tl.split(tl.reshape(b_Ai, [BC, BC, 2, 2]))
    b_T0, b_T1 = tl.split(b_T01)
    b_T2, b_T3 = tl.split(b_T23)
    return b_T0, b_T1, b_T2, b_T3


@triton.jit
def scaled_rows(x, s_xt, i0, n_t, b_s, o_d, m_d, BC: tl.constexpr):
    """Rows [i0, i0 + BC) of x (columns o_d) times b_s per row, in x's dtype; rows past n_t are zero."""
    o_i = i0 + tl.arange(0, BC)
    b_x = tl.load(x + o_i[:, None] * s_xt + o_d[None, :], mask=(o_i < n_t)[:, None] & m_d[None, :], other=0.0)
    return (b_x.to(tl.float32) * b_s[:, None]).to(x.dtype.element_ty)


@triton.jit
def wy_block_row(x, s_xt, out, s_ot, n_t, b_T0, b_T1, b_T2, b_T3, b_s0, b_s1, b_s2, b_s3,
                 R: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """Row block R of T diag(s) x: out rows [R BC, R BC + BC) = sum_{c <= R} T_Rc (s_c * x_c), BD columns at a
    time. The T_Rc come in x's dtype; x_c are the rows [c BC, c BC + BC) of x ([n_t, D], row stride s_xt)."""
    o_i = R * BC + tl.arange(0, BC)
    for i_d in range(0, (D + BD - 1) // BD):
        o_d = i_d * BD + tl.arange(0, BD)
        m_d = o_d < D
        b_o = tl.dot(b_T0, scaled_rows(x, s_xt, 0, n_t, b_s0, o_d, m_d, BC), input_precision=PREC)
        if R > 0:
            b_o = tl.dot(b_T1, scaled_rows(x, s_xt, BC, n_t, b_s1, o_d, m_d, BC), b_o, input_precision=PREC)
        if R > 1:
            b_o = tl.dot(b_T2, scaled_rows(x, s_xt, 2 * BC, n_t, b_s2, o_d, m_d, BC), b_o, input_precision=PREC)
        if R > 2:
            b_o = tl.dot(b_T3, scaled_rows(x, s_xt, 3 * BC, n_t, b_s3, o_d, m_d, BC), b_o, input_precision=PREC)
        tl.store(out + o_i[:, None] * s_ot + o_d[None, :], b_o.to(out.dtype.element_ty),
                 mask=(o_i < n_t)[:, None] & m_d[None, :])


@triton.jit
def store_block(p, b_x, m_r, DT: tl.constexpr):
    """One [BC, BC] block of (I + A)^-1 at p (p carries the rows and columns), rows past the chunk masked."""
    tl.store(p, b_x.to(DT), mask=m_r[:, None])


@triton.jit
def solve_head(i_hv, start, n_t, k, v, a, b, A_log, dt_bias, Ai, gam, w, u,
               s_kt, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
               b_A00, b_A11, b_A22, b_A33, b_A10, b_A20, b_A21, b_A30, b_A31, b_A32, b_r0, b_r1, b_r2, b_r3,
               HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
               BD: tl.constexpr, PREC: tl.constexpr, SOLVE_PREC: tl.constexpr, FUSE: tl.constexpr):
    """Value head i_hv of a chunk from the raw k k^T blocks and the 1 / |k| rows: gates, A, (I + A)^-1, then w
    and u (FUSE) or the stored blocks of (I + A)^-1. k points at the chunk's first row of the key head."""
    b_Aexp = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    o_i = tl.arange(0, BC)
    a += start * s_at + i_hv * s_ah
    b += start * s_bt + i_hv * s_bh
    b_g0, b_b0, m_0, c = gate_rows(a, b, b_Aexp, b_dt, 0, n_t, 0.0, s_at, s_bt, BC)
    b_g1, b_b1, m_1, c = gate_rows(a, b, b_Aexp, b_dt, BC, n_t, c, s_at, s_bt, BC)
    b_g2, b_b2, m_2, c = gate_rows(a, b, b_Aexp, b_dt, 2 * BC, n_t, c, s_at, s_bt, BC)
    b_g3, b_b3, m_3, c = gate_rows(a, b, b_Aexp, b_dt, 3 * BC, n_t, c, s_at, s_bt, BC)
    p_g = gam + start * HV + i_hv + o_i * HV
    tl.store(p_g, b_g0, mask=m_0)
    tl.store(p_g + BC * HV, b_g1, mask=m_1)
    tl.store(p_g + 2 * BC * HV, b_g2, mask=m_2)
    tl.store(p_g + 3 * BC * HV, b_g3, mask=m_3)
    b_T00, b_T11, b_T22, b_T33 = inv_diag_blocks(gate_block(b_A00, b_g0, b_g0, b_b0 * b_r0, b_r0, True, BC),
                                                 gate_block(b_A11, b_g1, b_g1, b_b1 * b_r1, b_r1, True, BC),
                                                 gate_block(b_A22, b_g2, b_g2, b_b2 * b_r2, b_r2, True, BC),
                                                 gate_block(b_A33, b_g3, b_g3, b_b3 * b_r3, b_r3, True, BC), BC)
    b_A10 = gate_block(b_A10, b_g1, b_g0, b_b1 * b_r1, b_r0, False, BC)
    b_A20 = gate_block(b_A20, b_g2, b_g0, b_b2 * b_r2, b_r0, False, BC)
    b_A21 = gate_block(b_A21, b_g2, b_g1, b_b2 * b_r2, b_r1, False, BC)
    b_A30 = gate_block(b_A30, b_g3, b_g0, b_b3 * b_r3, b_r0, False, BC)
    b_A31 = gate_block(b_A31, b_g3, b_g1, b_b3 * b_r3, b_r1, False, BC)
    b_A32 = gate_block(b_A32, b_g3, b_g2, b_b3 * b_r3, b_r2, False, BC)

    # the off-diagonal blocks: T_ij = -T_ii sum_{j<=m<i} A_im T_mj (fp32 operands)
    P: tl.constexpr = SOLVE_PREC
    b_T10 = -tl.dot(b_T11, tl.dot(b_A10, b_T00, input_precision=P), input_precision=P)
    b_T21 = -tl.dot(b_T22, tl.dot(b_A21, b_T11, input_precision=P), input_precision=P)
    b_T32 = -tl.dot(b_T33, tl.dot(b_A32, b_T22, input_precision=P), input_precision=P)
    b_T20 = -tl.dot(b_T22, tl.dot(b_A20, b_T00, input_precision=P) + tl.dot(b_A21, b_T10, input_precision=P),
                    input_precision=P)
    b_T31 = -tl.dot(b_T33, tl.dot(b_A31, b_T11, input_precision=P) + tl.dot(b_A32, b_T21, input_precision=P),
                    input_precision=P)
    b_T30 = -tl.dot(b_T33, tl.dot(b_A30, b_T00, input_precision=P) + tl.dot(b_A31, b_T10, input_precision=P)
                    + tl.dot(b_A32, b_T20, input_precision=P), input_precision=P)

    DT = w.dtype.element_ty  # the activation dtype (w and Ai stand in for each other when unused)
    if FUSE:
        # w = T diag(beta e^gamma / |k|) k and u = T diag(beta) v, from T rounded once to the activation dtype
        # (the precision the separate w/u pass reads it back in)
        b_T00, b_T10, b_T11 = b_T00.to(DT), b_T10.to(DT), b_T11.to(DT)
        b_T20, b_T21, b_T22 = b_T20.to(DT), b_T21.to(DT), b_T22.to(DT)
        b_T30, b_T31, b_T32, b_T33 = b_T30.to(DT), b_T31.to(DT), b_T32.to(DT), b_T33.to(DT)
        b_w0, b_w1 = b_b0 * tl.exp(b_g0) * b_r0, b_b1 * tl.exp(b_g1) * b_r1
        b_w2, b_w3 = b_b2 * tl.exp(b_g2) * b_r2, b_b3 * tl.exp(b_g3) * b_r3
        p_w = w + (start * HV + i_hv) * K
        wy_block_row(k, s_kt, p_w, HV * K, n_t, b_T00, b_T00, b_T00, b_T00, b_w0, b_w1, b_w2, b_w3, 0, K, BD, BC, PREC)
        wy_block_row(k, s_kt, p_w, HV * K, n_t, b_T10, b_T11, b_T11, b_T11, b_w0, b_w1, b_w2, b_w3, 1, K, BD, BC, PREC)
        wy_block_row(k, s_kt, p_w, HV * K, n_t, b_T20, b_T21, b_T22, b_T22, b_w0, b_w1, b_w2, b_w3, 2, K, BD, BC, PREC)
        wy_block_row(k, s_kt, p_w, HV * K, n_t, b_T30, b_T31, b_T32, b_T33, b_w0, b_w1, b_w2, b_w3, 3, K, BD, BC, PREC)
        v += start * s_vt + i_hv * s_vh
        p_u = u + (start * HV + i_hv) * V
        wy_block_row(v, s_vt, p_u, HV * V, n_t, b_T00, b_T00, b_T00, b_T00, b_b0, b_b1, b_b2, b_b3, 0, V, BD, BC, PREC)
        wy_block_row(v, s_vt, p_u, HV * V, n_t, b_T10, b_T11, b_T11, b_T11, b_b0, b_b1, b_b2, b_b3, 1, V, BD, BC, PREC)
        wy_block_row(v, s_vt, p_u, HV * V, n_t, b_T20, b_T21, b_T22, b_T22, b_b0, b_b1, b_b2, b_b3, 2, V, BD, BC, PREC)
        wy_block_row(v, s_vt, p_u, HV * V, n_t, b_T30, b_T31, b_T32, b_T33, b_b0, b_b1, b_b2, b_b3, 3, V, BD, BC, PREC)
    else:
        # the 10 blocks on and below the diagonal; the w/u pass masks the rest by row >= column
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


@triton.jit
def row_sq_sums(x, i0, s_xt, o_i, m_0, m_1, m_2, m_3, o_k, m_k, b_s0, b_s1, b_s2, b_s3, BC: tl.constexpr):
    """The four 16-row blocks of the chunk's rows of x (columns o_k, x at row i0 of the chunk): each row's sum of
    squares added to b_s0..b_s3 (fp32)."""
    p_x = x + (i0 + o_i)[:, None] * s_xt + o_k[None, :]
    b_x0 = tl.load(p_x, mask=m_0[:, None] & m_k, other=0.0).to(tl.float32)
    b_x1 = tl.load(p_x + BC * s_xt, mask=m_1[:, None] & m_k, other=0.0).to(tl.float32)
    b_x2 = tl.load(p_x + 2 * BC * s_xt, mask=m_2[:, None] & m_k, other=0.0).to(tl.float32)
    b_x3 = tl.load(p_x + 3 * BC * s_xt, mask=m_3[:, None] & m_k, other=0.0).to(tl.float32)
    return (b_s0 + tl.sum(b_x0 * b_x0, 1), b_s1 + tl.sum(b_x1 * b_x1, 1), b_s2 + tl.sum(b_x2 * b_x2, 1),
            b_s3 + tl.sum(b_x3 * b_x3, 1))


@triton.jit
def store_rows(p, s_t, b_0, b_1, b_2, b_3, m_0, m_1, m_2, m_3, BC: tl.constexpr):
    """The four 16-row blocks of a per-row value of the chunk (p at its first row, row stride s_t)."""
    o_i = tl.arange(0, BC)
    tl.store(p + o_i * s_t, b_0, mask=m_0)
    tl.store(p + (BC + o_i) * s_t, b_1, mask=m_1)
    tl.store(p + (2 * BC + o_i) * s_t, b_2, mask=m_2)
    tl.store(p + (3 * BC + o_i) * s_t, b_3, mask=m_3)


@triton.jit
def gdn_chunk_intra_kernel(
    q, k, v, a, b, A_log, dt_bias,  # strided views as in the recurrent kernel
    rk, rq, gam,  # [T, H] fp32: 1 / sqrt(sum k^2 + eps), the same of q (RQ); [T, HV] fp32: gamma
    w, u,  # FUSE: [T, HV, K], [T, HV, V] activation dtype
    Ai,  # not FUSE: [T, HV, BT] activation dtype, the chunk's rows of (I + A)^-1
    cu_seqlens, slots, capture_at, N,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BKS: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    PREC: tl.constexpr, SOLVE_PREC: tl.constexpr, SHARE: tl.constexpr, FUSE: tl.constexpr, RQ: tl.constexpr,
    c0=0,  # global index of the grid's first chunk (`launch_chunked`'s pipeline windows)
):
    # SHARE: grid (chunks, H), one program computes the raw k k^T of a key head once and serves the G value heads
    # of its group; else grid (chunks, HV), one value head per program (more programs, G x the k k^T work)
    i_c, i_x = c0 + tl.program_id(0), tl.program_id(1)
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
    # latency-bound solve below can run on one warp)
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
        b_A00 = tl.dot(b_k0, tl.trans(b_k0), b_A00, input_precision=SOLVE_PREC)
        b_A11 = tl.dot(b_k1, tl.trans(b_k1), b_A11, input_precision=SOLVE_PREC)
        b_A22 = tl.dot(b_k2, tl.trans(b_k2), b_A22, input_precision=SOLVE_PREC)
        b_A33 = tl.dot(b_k3, tl.trans(b_k3), b_A33, input_precision=SOLVE_PREC)
        b_A10 = tl.dot(b_k1, tl.trans(b_k0), b_A10, input_precision=SOLVE_PREC)
        b_A20 = tl.dot(b_k2, tl.trans(b_k0), b_A20, input_precision=SOLVE_PREC)
        b_A21 = tl.dot(b_k2, tl.trans(b_k1), b_A21, input_precision=SOLVE_PREC)
        b_A30 = tl.dot(b_k3, tl.trans(b_k0), b_A30, input_precision=SOLVE_PREC)
        b_A31 = tl.dot(b_k3, tl.trans(b_k1), b_A31, input_precision=SOLVE_PREC)
        b_A32 = tl.dot(b_k3, tl.trans(b_k2), b_A32, input_precision=SOLVE_PREC)

    b_r0, b_r1 = 1.0 / tl.sqrt(b_s0 + 1e-6), 1.0 / tl.sqrt(b_s1 + 1e-6)
    b_r2, b_r3 = 1.0 / tl.sqrt(b_s2 + 1e-6), 1.0 / tl.sqrt(b_s3 + 1e-6)
    if SHARE or i_x % G == 0:
        store_rows(rk + start * H + i_h, H, b_r0, b_r1, b_r2, b_r3, m_0, m_1, m_2, m_3, BC)
    for g in range(0, G if SHARE else 1):
        solve_head(i_h * G + g if SHARE else i_x, start, n_t, k, v, a, b, A_log, dt_bias, Ai, gam, w, u,
                   s_kt, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
                   b_A00, b_A11, b_A22, b_A33, b_A10, b_A20, b_A21, b_A30, b_A31, b_A32, b_r0, b_r1, b_r2, b_r3,
                   HV, K, V, BT, BC, BD, PREC, SOLVE_PREC, FUSE)
    if RQ:
        # 1 / |q| per row for the output pass (per value head, without SHARE, the key head's first one), after
        # the solve: issued earlier, the q tiles were live beside the ten k k^T blocks (192 B of spill stack on
        # sm_90 against 48 B)
        if SHARE or i_x % G == 0:
            q += start * s_qt + i_h * s_qh
            b_q0 = tl.zeros([BC], dtype=tl.float32)
            b_q1 = tl.zeros([BC], dtype=tl.float32)
            b_q2 = tl.zeros([BC], dtype=tl.float32)
            b_q3 = tl.zeros([BC], dtype=tl.float32)
            for i_k in tl.static_range(0, (K + BKS - 1) // BKS):
                o_k = i_k * BKS + tl.arange(0, BKS)
                b_q0, b_q1, b_q2, b_q3 = row_sq_sums(q, 0, s_qt, o_i, m_0, m_1, m_2, m_3, o_k, (o_k < K)[None, :],
                                                     b_q0, b_q1, b_q2, b_q3, BC)
            store_rows(rq + start * H + i_h, H, 1.0 / tl.sqrt(b_q0 + 1e-6), 1.0 / tl.sqrt(b_q1 + 1e-6),
                       1.0 / tl.sqrt(b_q2 + 1e-6), 1.0 / tl.sqrt(b_q3 + 1e-6), m_0, m_1, m_2, m_3, BC)


@triton.jit
def wu_slice(b_A, x, s_xt, out, s_ot, o_i, m_t, b_s, o_d, D: tl.constexpr, PREC: tl.constexpr):
    """Columns o_d of T diag(b_s) x -> out (rows o_i of the chunk, m_t live): one [BT, BD] slice of w or u."""
    DT = out.dtype.element_ty
    m = m_t[:, None] & (o_d < D)[None, :]
    b_x = tl.load(x + o_i[:, None] * s_xt + o_d[None, :], mask=m, other=0.0)
    b_x = (b_x.to(tl.float32) * b_s[:, None]).to(DT)
    tl.store(out + o_i[:, None] * s_ot + o_d[None, :], tl.dot(b_A, b_x, input_precision=PREC).to(DT), mask=m)


@triton.jit
def gdn_chunk_wu_kernel(
    k, v, b,  # strided views as in the recurrent kernel
    Ai, gam, rk,  # from the intra pass without FUSE
    w, u,  # [T, HV, K], [T, HV, V] activation dtype
    cu_seqlens, slots, capture_at, N,
    s_kt, s_kh, s_vt, s_vh, s_bt, s_bh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
    LOOP: tl.constexpr,
    c0=0,  # global index of the grid's first chunk
):
    """w = T diag(beta e^gamma / |k|) k, u = T diag(beta) v with T read back from the intra pass (grid chunks x
    HV): the unfused second half of the first pass. K in one BK tile and V in BV slices, unrolled; LOOP: both in
    BK / BV slices of a runtime loop, which Triton software-pipelines with the launch's num_stages (FLA's form:
    its recompute_w_u took 161 us at T = 16384 against our 194, H200, 2026-12-03)."""
    i_c, i_hv = c0 + tl.program_id(0), tl.program_id(1)
    i_n, start, n_t = locate_chunk(i_c, cu_seqlens, capture_at, N, BN, BT)
    if i_n >= N:
        return
    if tl.load(slots + i_n) < 0:
        return
    i_h = i_hv // (HV // H)
    o_i = tl.arange(0, BT)
    m_t = o_i < n_t
    b_beta = tl.where(m_t, tl.sigmoid(tl.load(b + start * s_bt + i_hv * s_bh + o_i * s_bt, mask=m_t,
                                              other=0.0).to(tl.float32)), 0.0)
    b_gam = tl.load(gam + start * HV + i_hv + o_i * HV, mask=m_t, other=0.0)
    b_rk = tl.load(rk + start * H + i_h + o_i * H, mask=m_t, other=0.0)
    # whole rows of T (16-byte loads; with the triangular mask in the load the sm_90 code had 16 two-byte loads per
    # thread), the part above the diagonal, which the solve never writes, zeroed after
    b_A = tl.load(Ai + (start * HV + i_hv) * BT + o_i[:, None] * (HV * BT) + o_i[None, :], mask=m_t[:, None],
                  other=0.0)
    b_A = tl.where(o_i[:, None] >= o_i[None, :], b_A, 0.0)
    b_sk = b_beta * tl.exp(b_gam) * b_rk
    k += start * s_kt + i_h * s_kh
    w += (start * HV + i_hv) * K
    v += start * s_vt + i_hv * s_vh
    u += (start * HV + i_hv) * V
    if LOOP:
        for i_k in tl.range(0, (K + BK - 1) // BK):
            wu_slice(b_A, k, s_kt, w, HV * K, o_i, m_t, b_sk, i_k * BK + tl.arange(0, BK), K, PREC)
        for i_v in tl.range(0, (V + BV - 1) // BV):
            wu_slice(b_A, v, s_vt, u, HV * V, o_i, m_t, b_beta, i_v * BV + tl.arange(0, BV), V, PREC)
    else:
        wu_slice(b_A, k, s_kt, w, HV * K, o_i, m_t, b_sk, tl.arange(0, BK), K, PREC)
        for i_v in tl.static_range(0, (V + BV - 1) // BV):
            wu_slice(b_A, v, s_vt, u, HV * V, o_i, m_t, b_beta, i_v * BV + tl.arange(0, BV), V, PREC)
