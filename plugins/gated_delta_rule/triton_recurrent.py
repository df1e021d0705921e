"""Triton kernel of the token-by-token gated delta rule (DECODE, DECODE_MULTI_SEQ, DECODE_BATCHED, VERIFY_MULTI).

One program owns one (sequence, value head, V-tile): it loads the fp32 state tile S[:, tile] [K, BV] once from
`ssm_pool[slot]`, runs the sequence's tokens through it in registers and writes it back (or, with STASH, writes
the tile after every token to `ssm_stash[t]` and leaves the pool alone). Gates, the q/k L2 norm and the scale are
computed in fp32 inside the loop, so the op reads only raw projections. The state is the only large traffic
(K*V*4 bytes read + written per sequence and value head), so the kernel is built to stream it: the tile load is
issued before anything else and nothing else touches device memory in bulk.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softplus(x):
    """log(1 + e^x) with the threshold 20 of torch and the serving kernels (x above it is returned as is)."""
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def gdn_recurrent_kernel(
    q, k, v, a, b, A_log, dt_bias,  # q, k [T, H, K]; v [T, HV, V]; a, b [T, HV]: strided views
    o,  # [T, HV, V] contiguous, activation dtype
    pool,  # [S, HV, K, V] fp32, contiguous
    stash,  # [T, HV, K, V] fp32 (STASH) or the pool again (unused)
    cu_seqlens, slots,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
    scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, STASH: tl.constexpr, STREAM: tl.constexpr,
):
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    slot = tl.load(slots + i_n).to(tl.int64)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    p_o = o + (bos * HV + i_hv) * V + o_v

    if slot < 0:
        # padding sequence: zero output rows, no state touched
        for _ in range(bos, eos):
            tl.store(p_o, tl.zeros([BV], dtype=o.dtype.element_ty), mask=m_v)
            p_o += HV * V
        return
    if eos == bos:
        return  # no tokens (a verify row without drafts): the state stays as it is

    o_h = o_k[:, None] * V + o_v[None, :]
    pool += (slot * HV + i_hv) * K * V
    # STREAM: the state tile (and each stash row) is touched once per launch: evict-first loads and streaming
    # stores keep it from evicting the small operands from L2 (+6 pp of copy bandwidth at N=256, bench sweep)
    LOAD_HINT: tl.constexpr = "evict_first" if STREAM else ""
    STORE_HINT: tl.constexpr = ".cs" if STREAM else ""
    b_h = tl.load(pool + o_h, mask=m_h, other=0.0, eviction_policy=LOAD_HINT)

    b_A = -tl.exp(tl.load(A_log + i_hv).to(tl.float32))
    b_dt = tl.load(dt_bias + i_hv).to(tl.float32)
    p_q = q + bos * s_qt + i_h * s_qh + o_k
    p_k = k + bos * s_kt + i_h * s_kh + o_k
    p_v = v + bos * s_vt + i_hv * s_vh + o_v
    p_a = a + bos * s_at + i_hv * s_ah
    p_b = b + bos * s_bt + i_hv * s_bh
    p_s = stash + (bos * HV + i_hv) * K * V
    for _ in range(bos, eos):
        b_q = tl.load(p_q, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(p_k, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(p_v, mask=m_v, other=0.0).to(tl.float32)
        b_g = b_A * softplus(tl.load(p_a).to(tl.float32) + b_dt)
        b_beta = tl.sigmoid(tl.load(p_b).to(tl.float32))
        # every reduction over K reads the raw q, k and the state as loaded, so the five run side by side and the
        # norms enter afterwards as scalars (the chain from the state load to the stores is one reduction deep):
        # with e = exp(g), S' = e S + k_n v_new^T, v_new = beta (v - e S^T k_n), o = S'^T q_n
        #   = e (S^T q) r_q + (k . q) r_k r_q v_new, r_k = 1 / |k|, r_q = scale / |q| (eps inside the sqrt)
        b_hk = tl.sum(b_h * b_k[:, None], 0)
        b_hq = tl.sum(b_h * b_q[:, None], 0)
        b_rk = 1.0 / tl.sqrt(tl.sum(b_k * b_k, 0) + 1e-6)
        b_rq = scale / tl.sqrt(tl.sum(b_q * b_q, 0) + 1e-6)
        b_kq = tl.sum(b_k * b_q, 0) * b_rk * b_rq
        b_e = tl.exp(b_g)
        b_v = b_beta * (b_v - b_e * b_rk * b_hk)
        b_h = b_e * b_h + (b_k * b_rk)[:, None] * b_v[None, :]
        b_o = b_e * b_rq * b_hq + b_kq * b_v
        tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)
        if STASH:
            tl.store(p_s + o_h, b_h, mask=m_h, cache_modifier=STORE_HINT)
            p_s += HV * K * V

        p_q += s_qt
        p_k += s_kt
        p_v += s_vt
        p_a += s_at
        p_b += s_bt
        p_o += HV * V
    if not STASH:
        tl.store(pool + o_h, b_h, mask=m_h, cache_modifier=STORE_HINT)
