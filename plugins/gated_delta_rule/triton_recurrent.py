"""Triton kernel of the token-by-token gated delta rule (DECODE, DECODE_MULTI_SEQ, DECODE_BATCHED, VERIFY_MULTI).

One program owns one (sequence, value head, V-tile): it loads the fp32 state tile S[:, tile] [K, BV] once from
`ssm_pool[slot]`, runs the sequence's tokens through it in registers and writes it back (or, with STASH, writes
the tile after every token to `ssm_stash[t]` and leaves the pool alone). Gates, the q/k L2 norm and the scale are
computed in fp32 inside the loop, so the op reads only raw projections. The state is the only large traffic
(K*V*4 bytes read + written per sequence and value head), so the kernel is built to stream it: nothing else touches
device memory in bulk, and only the first token's few hundred bytes of operands are loaded before the tile
(`Tuning.rec_qkv_first`: they are then back while the tile streams in).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import pdl


@triton.jit
def softplus(x):
    """log(1 + e^x) with the threshold 20 of torch and the serving kernels (x above it is returned as is)."""
    return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))


@triton.jit
def prefetch_l2(ptr, nbytes):
    """One bulk L2 prefetch (`cp.async.bulk.prefetch.L2`, sm_90) of nbytes (a multiple of 16) at ptr (16-byte
    aligned), issued by the program's first thread: the data lands in L2 with no register or shared memory held."""
    tl.inline_asm_elementwise(
        "{ .reg .pred %pf; .reg .u32 %tf; mov.u32 %tf, %tid.x; setp.eq.u32 %pf, %tf, 0; "
        "@%pf cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_ahead(pool, slots, i_v, i_hv, i_n, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   AHEAD: tl.constexpr):
    """Bulk-prefetch into L2 the state of the program AHEAD places later in launch order (V-tiles fastest, then
    value heads, then sequences), as the contiguous 1/NV of its head's state [K, V] that its V-tile index picks
    (the NV programs of a head cover the head's state between them): those programs then load from L2, and the
    reads in flight no longer wait on the registers of resident programs. pool: the pool's base pointer."""
    NV = tl.num_programs(0)
    j = (i_n * HV + i_hv) * NV + i_v + AHEAD
    if j < NV * HV * tl.num_programs(2):
        j_v = j % NV
        j_hv = (j // NV) % HV
        j_slot = tl.load(slots + j // (NV * HV)).to(tl.int64)
        if j_slot >= 0:
            chunk = (K * V) // NV
            prefetch_l2(pool + (j_slot * HV + j_hv) * K * V + j_v * chunk, (chunk * 4).to(tl.int32))


@triton.jit
def one_token_subtiles(p_q, p_k, p_v, p_a, p_b, p_o, pool, row, p_s, p_A, p_dt, scale, i_v, o_k, m_k,
                       K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SUB: tl.constexpr,
                       STAGES: tl.constexpr, STASH: tl.constexpr, TMA: tl.constexpr, LOAD_HINT: tl.constexpr,
                       STORE_HINT: tl.constexpr):
    """A one-token sequence's step over the program's BV columns as BV / SUB sub-tiles [K, SUB] in a runtime loop
    that Triton software-pipelines (`STAGES`: the state loads of the next sub-tiles go to shared memory by
    cp.async while this one is reduced, updated and stored), so the program keeps state loads in flight through
    its compute and stores. The token's scalars (gates, norms, k.q) are computed once, not per sub-tile.
    Scalar pointers at the token's row and head: p_v, p_o at the program's first column, pool / p_s at the
    (sequence, head) state / stash row; with TMA, pool is the pool's descriptor and row the state's row in it."""
    b_q = tl.load(p_q + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(p_k + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_A = -tl.exp(tl.load(p_A).to(tl.float32))
    b_e = tl.exp(b_A * softplus(tl.load(p_a).to(tl.float32) + tl.load(p_dt).to(tl.float32)))
    b_beta = tl.sigmoid(tl.load(p_b).to(tl.float32))
    b_rk = 1.0 / tl.sqrt(tl.sum(b_k * b_k, 0) + 1e-6)
    b_rq = scale / tl.sqrt(tl.sum(b_q * b_q, 0) + 1e-6)
    b_kq = tl.sum(b_k * b_q, 0) * b_rk * b_rq
    b_kn = b_k * b_rk
    b_ek = b_e * b_rk  # v_new = beta (v - e r_k S^T k)
    b_eq = b_e * b_rq  # o = e r_q S^T q + (k.q) r_k r_q v_new
    for i_s in tl.range(0, BV // SUB, num_stages=STAGES):
        o_s = i_s * SUB + tl.arange(0, SUB)
        m_s = i_v * BV + o_s < V
        o_hs = o_k[:, None] * V + o_s[None, :]
        m_hs = m_k[:, None] & m_s[None, :]
        if TMA:
            b_h = pool.load([row, 0, i_v * BV + i_s * SUB]).reshape(BK, SUB)
        else:
            b_h = tl.load(pool + o_hs, mask=m_hs, other=0.0, eviction_policy=LOAD_HINT)
        b_hk = tl.sum(b_h * b_k[:, None], 0)
        b_hq = tl.sum(b_h * b_q[:, None], 0)
        b_v = b_beta * (tl.load(p_v + o_s, mask=m_s, other=0.0).to(tl.float32) - b_ek * b_hk)
        tl.store(p_o + o_s, (b_eq * b_hq + b_kq * b_v).to(p_o.dtype.element_ty), mask=m_s)
        b_h = b_e * b_h + b_kn[:, None] * b_v[None, :]
        if STASH:
            tl.store(p_s + o_hs, b_h, mask=m_hs, cache_modifier=STORE_HINT)
        elif TMA:
            pool.store([row, 0, i_v * BV + i_s * SUB], b_h.reshape(1, BK, SUB))
        else:
            tl.store(pool + o_hs, b_h, mask=m_hs, cache_modifier=STORE_HINT)


@triton.jit
def _rows(x, CH: tl.constexpr):
    """A [BK] vector against the tile: [BK, 1] for a [BK, columns] tile, [1, BK, 1] for a [columns / CH, BK, CH] one."""
    if CH > 0:
        return x[None, :, None]
    else:
        return x[:, None]


@triton.jit
def _cols(x, CH: tl.constexpr):
    """The tile's columns ([columns] or [columns / CH, CH]) against the tile (see _rows)."""
    if CH > 0:
        return x[:, None, :]
    else:
        return x[None, :]


@triton.jit
def _sum_rows(x, CH: tl.constexpr):
    if CH > 0:
        return tl.sum(x, 1)
    else:
        return tl.sum(x, 0)


@triton.jit
def token_in(p_q, p_k, p_v, p_a, p_b, o_k, m_k, o_c, m_c):
    """One token's raw operands: q, k (the key head's K), v (the program's columns), a, b (its value head)."""
    b_q = tl.load(p_q + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(p_k + o_k, mask=m_k, other=0.0).to(tl.float32)
    b_v = tl.load(p_v + o_c, mask=m_c, other=0.0).to(tl.float32)
    return b_q, b_k, b_v, tl.load(p_a).to(tl.float32), tl.load(p_b).to(tl.float32)


@triton.jit
def token_step(b_h, b_q, b_k, b_v, b_a, b_b, b_A, b_dt, scale, Q_AFTER: tl.constexpr, CH: tl.constexpr):
    """One token through the state tile b_h (see token_steps): returns (the tile after it, the output columns)."""
    b_g = b_A * softplus(b_a + b_dt)
    b_beta = tl.sigmoid(b_b)
    # every reduction over K reads the raw q, k and the state as loaded, so the five run side by side and the
    # norms enter afterwards as scalars (the chain from the state load to the stores is one reduction deep):
    # with e = exp(g), S' = e S + k_n v_new^T, v_new = beta (v - e S^T k_n), o = S'^T q_n
    #   = e (S^T q) r_q + (k . q) r_k r_q v_new, r_k = 1 / |k|, r_q = scale / |q| (eps inside the sqrt)
    b_hk = _sum_rows(b_h * _rows(b_k, CH), CH)
    b_rk = 1.0 / tl.sqrt(tl.sum(b_k * b_k, 0) + 1e-6)
    b_rq = scale / tl.sqrt(tl.sum(b_q * b_q, 0) + 1e-6)
    b_e = tl.exp(b_g)
    if Q_AFTER:
        b_v = b_beta * (b_v - b_e * b_rk * b_hk)
        b_h = b_e * b_h + _rows(b_k, CH) * _cols(b_rk * b_v, CH)
        b_o = b_rq * _sum_rows(b_h * _rows(b_q, CH), CH)
    else:
        b_hq = _sum_rows(b_h * _rows(b_q, CH), CH)
        b_kq = tl.sum(b_k * b_q, 0) * b_rk * b_rq
        b_v = b_beta * (b_v - b_e * b_rk * b_hk)
        b_h = b_e * b_h + _rows(b_k, CH) * _cols(b_rk * b_v, CH)
        b_o = b_e * b_rq * b_hq + b_kq * b_v
    return b_h, b_o


@triton.jit
def token_out(b_h, b_o, p_o, p_s, o_c, m_c, o_h, m_h, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
              STASH: tl.constexpr, STORE_HINT: tl.constexpr):
    """A token's stores: the tile to the stash (STASH; returns p_s at the next token's row), the output columns."""
    if STASH:
        tl.store(p_s + o_h, b_h, mask=m_h, cache_modifier=STORE_HINT)
        p_s += HV * K * V
    tl.store(p_o + o_c, b_o.to(p_o.dtype.element_ty), mask=m_c)
    return p_s


@triton.jit
def token_next(p_q, p_k, p_v, p_a, p_b, p_o, s_qt, s_kt, s_vt, s_at, s_bt, s_ot):
    """The token's pointers moved on to the next token."""
    return p_q + s_qt, p_k + s_kt, p_v + s_vt, p_a + s_at, p_b + s_bt, p_o + s_ot


@triton.jit
def token_steps(b_h, p_q, p_k, p_v, p_a, p_b, p_o, p_s, p_A, p_dt, scale, n_t, o_k, m_k, o_c, m_c, o_h, m_h,
                s_qt, s_kt, s_vt, s_at, s_bt, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                STASH: tl.constexpr, STORE_HINT: tl.constexpr, Q_AFTER: tl.constexpr = False,
                CH: tl.constexpr = 0):
    """The sequence's n_t tokens through the state tile b_h [BK, columns]: o_c are the tile's columns relative to
    p_v / p_o (scalar pointers at the first token's row, head and first column of the program), o_h its offsets
    in a [K, V] state; the tile after each token goes to the stash (STASH). Returns the tile after the last.
    Q_AFTER: the output as S'^T q from the updated tile (one reduction after the update) instead of from the tile
    as loaded beside S^T k, so the q slice is not live beside the k slice and the tile (registers: see Tuning).
    CH > 0: the tile is [columns / CH, BK, CH] and o_c [columns / CH, CH] (see `_rows`)."""
    b_A = -tl.exp(tl.load(p_A).to(tl.float32))
    b_dt = tl.load(p_dt).to(tl.float32)
    for _ in range(0, n_t):
        b_q, b_k, b_v, b_a, b_b = token_in(p_q, p_k, p_v, p_a, p_b, o_k, m_k, o_c, m_c)
        b_h, b_o = token_step(b_h, b_q, b_k, b_v, b_a, b_b, b_A, b_dt, scale, Q_AFTER, CH)
        p_s = token_out(b_h, b_o, p_o, p_s, o_c, m_c, o_h, m_h, HV, K, V, STASH, STORE_HINT)
        p_q, p_k, p_v, p_a, p_b, p_o = token_next(p_q, p_k, p_v, p_a, p_b, p_o, s_qt, s_kt, s_vt, s_at, s_bt, HV * V)
    return b_h


@triton.jit
def token_ptrs(q, k, v, a, b, o, bos, i_h, i_hv, i_v, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
               HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """A program's scalar pointers at its sequence's first token (row bos): q, k at key head i_h; v, o at value head
    i_hv and the first column of V-tile i_v; a, b at the value head."""
    return (q + bos * s_qt + i_h * s_qh, k + bos * s_kt + i_h * s_kh, v + bos * s_vt + i_hv * s_vh + i_v * BV,
            a + bos * s_at + i_hv * s_ah, b + bos * s_bt + i_hv * s_bh, o + (bos * HV + i_hv) * V + i_v * BV)


@triton.jit
def tile_offsets(o_k, m_k, m_v, m_h, i_v, BV: tl.constexpr, V: tl.constexpr, CH: tl.constexpr):
    """The one-tile path's (columns o_c, their mask, offsets in a [K, V] state, their mask): [BV] columns, whose
    masks the caller has (m_v, m_h), or with CH > 0 [BV / CH, CH] (see `_rows`)."""
    if CH > 0:
        # the tile as [BV / CH, BK, CH]: Triton then lays a thread's elements over fewer rows (8 instead of 32
        # in the 64 x 2 tile), so the k and q slices each thread holds beside the tile shrink alike
        o_c = tl.arange(0, BV // CH)[:, None] * CH + tl.arange(0, CH)[None, :]
        m_c = i_v * BV + o_c < V
        return o_c, m_c, _rows(o_k, CH) * V + _cols(o_c, CH), _rows(m_k, CH) & _cols(m_c, CH)
    else:
        o_c = tl.arange(0, BV)
        return o_c, m_v, o_k[:, None] * V + o_c[None, :], m_h


@triton.jit
def operands_first(p_q, p_k, p_v, p_a, p_b, p_o, p_s, pool, p_A, p_dt, scale, o_k, m_k, o_c, m_v, o_h, m_h,
                   s_qt, s_kt, s_vt, s_at, s_bt, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   STASH: tl.constexpr, LOAD_HINT: tl.constexpr, STORE_HINT: tl.constexpr, Q_AFTER: tl.constexpr,
                   CH: tl.constexpr):
    """The first token with its operands loaded before the state tile (`Tuning.rec_qkv_first`): returns the tile
    after it and the pointers moved on to the next token."""
    b_q, b_k, b_v, b_a, b_b = token_in(p_q, p_k, p_v, p_a, p_b, o_k, m_k, o_c, m_v)
    b_A = -tl.exp(tl.load(p_A).to(tl.float32))
    b_dt = tl.load(p_dt).to(tl.float32)
    b_h = tl.load(pool + o_h, mask=m_h, other=0.0, eviction_policy=LOAD_HINT)
    b_h, b_o = token_step(b_h, b_q, b_k, b_v, b_a, b_b, b_A, b_dt, scale, Q_AFTER, CH)
    p_s = token_out(b_h, b_o, p_o, p_s, o_c, m_v, o_h, m_h, HV, K, V, STASH, STORE_HINT)
    p_q, p_k, p_v, p_a, p_b, p_o = token_next(p_q, p_k, p_v, p_a, p_b, p_o, s_qt, s_kt, s_vt, s_at, s_bt, HV * V)
    return b_h, p_q, p_k, p_v, p_a, p_b, p_o, p_s


@triton.jit
def gdn_recurrent_kernel(
    q, k, v, a, b, A_log, dt_bias,  # q, k [T, H, K]; v [T, HV, V]; a, b [T, HV]: strided views
    o,  # [T, HV, V] contiguous, activation dtype
    pool,  # [S, HV, K, V] fp32, contiguous; TMA: a tensor descriptor of it as [S * HV, K, V], block [1, BK, BV or SUB]
    stash,  # [T, HV, K, V] fp32 (STASH) or the pool again (unused)
    cu_seqlens, slots,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
    scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, STASH: tl.constexpr, STREAM: tl.constexpr,
    SUB: tl.constexpr = 0, SUB_STAGES: tl.constexpr = 3, TMA: tl.constexpr = False, AHEAD: tl.constexpr = 0,
    Q_AFTER: tl.constexpr = False, CH: tl.constexpr = 0, PDL: tl.constexpr = False,
    QKV_FIRST: tl.constexpr = False,
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
        pdl.enter(PDL)
        for _ in range(bos, eos):
            tl.store(p_o, tl.zeros([BV], dtype=o.dtype.element_ty), mask=m_v)
            p_o += HV * V
        return
    if eos == bos:
        return  # no tokens (a verify row without drafts): the state stays as it is

    row = (slot * HV + i_hv).to(tl.int32)  # the state's row in the TMA descriptor
    # the program's offsets (sequence, head, V-tile) go into the scalar base pointers and the tile's offsets stay
    # compile-time constants per thread: with the V-tile offset inside the int32 offset tensor, every 16-byte vector
    # kept its own 64-bit address for the store (sm_90: 254 registers and 72 B spilled in the 64 x 2 tile)
    if not TMA:
        pool += (slot * HV + i_hv) * K * V + i_v * BV
    # STREAM: the state tile (and each stash row) is touched once per launch: evict-first loads and streaming
    # stores keep it from evicting the small operands from L2 (+6 pp of copy bandwidth at N=256, bench sweep)
    LOAD_HINT: tl.constexpr = "evict_first" if STREAM else ""
    STORE_HINT: tl.constexpr = ".cs" if STREAM else ""
    p_q, p_k, p_v, p_a, p_b, p_o = token_ptrs(q, k, v, a, b, o, bos, i_h, i_hv, i_v, s_qt, s_qh, s_kt, s_kh, s_vt,
                                              s_vh, s_at, s_ah, s_bt, s_bh, HV, V, BV)
    p_s = stash + (bos * HV + i_hv) * K * V + i_v * BV
    if SUB > 0:
        # the program's BV columns as BV / SUB sub-tiles (registers for one [K, SUB] tile only)
        pdl.enter(PDL)
        if eos - bos == 1:
            one_token_subtiles(p_q, p_k, p_v, p_a, p_b, p_o, pool, row, p_s, A_log + i_hv, dt_bias + i_hv, scale,
                               i_v, o_k, m_k, K, V, BK, BV, SUB, SUB_STAGES, STASH, TMA, LOAD_HINT, STORE_HINT)
        else:
            for i_s in range(0, BV // SUB):
                o_s = i_s * SUB + tl.arange(0, SUB)
                m_s = i_v * BV + o_s < V
                o_hs = o_k[:, None] * V + o_s[None, :]
                m_hs = m_k[:, None] & m_s[None, :]
                if TMA:
                    b_h = pool.load([row, 0, i_v * BV + i_s * SUB]).reshape(BK, SUB)
                else:
                    b_h = tl.load(pool + o_hs, mask=m_hs, other=0.0, eviction_policy=LOAD_HINT)
                b_h = token_steps(b_h, p_q, p_k, p_v, p_a, p_b, p_o, p_s, A_log + i_hv, dt_bias + i_hv, scale,
                                  eos - bos, o_k, m_k, o_s, m_s, o_hs, m_hs, s_qt, s_kt, s_vt, s_at, s_bt,
                                  HV, K, V, STASH, STORE_HINT)
                if not STASH:
                    if TMA:
                        pool.store([row, 0, i_v * BV + i_s * SUB], b_h.reshape(1, BK, SUB))
                    else:
                        tl.store(pool + o_hs, b_h, mask=m_hs, cache_modifier=STORE_HINT)
    else:
        o_c, m_v, o_h, m_h = tile_offsets(o_k, m_k, m_v, m_h, i_v, BV, V, CH)
        n_t = eos - bos
        if QKV_FIRST:
            # the first token's operands (a few hundred bytes) go out before the tile's 32 KB, so they are back
            # while the tile streams in and the step waits on the tile alone (Tuning.rec_qkv_first); with PDL that
            # moves the wait before the tile's load, which then no longer overlaps the previous kernel
            pdl.enter(PDL)
            b_h, p_q, p_k, p_v, p_a, p_b, p_o, p_s = operands_first(
                p_q, p_k, p_v, p_a, p_b, p_o, p_s, pool, A_log + i_hv, dt_bias + i_hv, scale, o_k, m_k, o_c, m_v, o_h,
                m_h, s_qt, s_kt, s_vt, s_at, s_bt, HV, K, V, STASH, LOAD_HINT, STORE_HINT, Q_AFTER, CH)
            n_t -= 1
        elif TMA:
            b_h = pool.load([row, 0, i_v * BV]).reshape(BK, BV)
        else:
            b_h = tl.load(pool + o_h, mask=m_h, other=0.0, eviction_policy=LOAD_HINT)
            if AHEAD > 0:
                prefetch_ahead(pool - (slot * HV + i_hv) * K * V - i_v * BV, slots, i_v, i_hv, i_n, HV, K, V, AHEAD)
        # tile first: with PDL the tile is loaded while the previous kernel (the layer's conv) still runs, which
        # wrote neither the pool nor the packing (plugins/pdl.py); q, k, v, a, b are its output: after the wait
        if not QKV_FIRST:
            pdl.enter(PDL)
        b_h = token_steps(b_h, p_q, p_k, p_v, p_a, p_b, p_o, p_s, A_log + i_hv, dt_bias + i_hv, scale, n_t,
                          o_k, m_k, o_c, m_v, o_h, m_h, s_qt, s_kt, s_vt, s_at, s_bt, HV, K, V, STASH, STORE_HINT,
                          Q_AFTER, CH)
        if not STASH:
            if TMA:
                pool.store([row, 0, i_v * BV], b_h.reshape(1, BK, BV))
            else:
                tl.store(pool + o_h, b_h, mask=m_h, cache_modifier=STORE_HINT)


@triton.jit
def _hk_hq(b_h, b_k, b_q):
    """(S^T k, S^T q) [columns] of a tile b_h [rows, columns] against the raw k, q over its rows."""
    return tl.sum(b_h * b_k[:, None], 0), tl.sum(b_h * b_q[:, None], 0)


@triton.jit
def _tile_load(p, o_r, o_c, i_v, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr, FULL: tl.constexpr,
               HINT: tl.constexpr):
    """The state rows o_r, columns o_c of the tile at p (masked to [K, V] unless FULL)."""
    if FULL:
        return tl.load(p + o_r[:, None] * V + o_c[None, :], eviction_policy=HINT)
    else:
        return tl.load(p + o_r[:, None] * V + o_c[None, :], mask=(o_r < K)[:, None] & (i_v * BV + o_c < V)[None, :],
                       other=0.0, eviction_policy=HINT)


@triton.jit
def _vec_f32(p, n: tl.constexpr, lim, PAIRS: tl.constexpr):
    """The n values at p (those from lim on read as 0) in fp32. PAIRS: 2-byte values read as n / 2 aligned 4-byte
    words (p 4-byte aligned, lim even): cp.async moves 4, 8 or 16 bytes a thread, so Triton's pipeliner leaves a
    load of 2 bytes a thread (a [64] bf16 vector on 64 threads) synchronous, its latency exposed once per item."""
    if PAIRS:
        o = tl.arange(0, n // 2)
        w = tl.load(p.to(tl.pointer_type(tl.int32)) + o, mask=2 * o < lim, other=0)
        lo = (w & 0xFFFF).to(tl.uint16).to(p.dtype.element_ty, bitcast=True).to(tl.float32)
        hi = ((w >> 16) & 0xFFFF).to(tl.uint16).to(p.dtype.element_ty, bitcast=True).to(tl.float32)
        return tl.reshape(tl.join(lo, hi), [n])
    else:
        o = tl.arange(0, n)
        return tl.load(p + o, mask=o < lim, other=0.0).to(tl.float32)


@triton.jit
def _head_f32(p, i, PAIRS: tl.constexpr):
    """p[i] in fp32 (p: a token's row of a [T, HV] gate input, unit stride). PAIRS: read from the aligned 4-byte
    word that holds elements i - i % 2 and i - i % 2 + 1 (HV even, p 4-byte aligned: both inside the row)."""
    if PAIRS:
        w = tl.load(p.to(tl.pointer_type(tl.int32)) + i // 2)
        h = (w >> (16 * (i % 2))) & 0xFFFF
        return h.to(tl.uint16).to(p.dtype.element_ty, bitcast=True).to(tl.float32)
    else:
        return tl.load(p + i).to(tl.float32)


@triton.jit
def gdn_decode_persist_kernel(
    q, k, v, a, b, A_log, dt_bias,  # as gdn_recurrent_kernel (q, k [T, H, K]; v [T, HV, V]; a, b [T, HV])
    o,  # [T, HV, V]
    pool,  # [S, HV, K, V] fp32
    cu_seqlens, slots,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
    scale, n_items,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, STREAM: tl.constexpr, STAGES: tl.constexpr, KH: tl.constexpr,
    PAIRS: tl.constexpr = False,
):
    """The recurrent kernel on a persistent grid (Tuning.rec_persist), pool mode only: program p walks the work items
    p, p + P, p + 2P, ... (P programs; item = (sequence, value head, V-tile), V-tiles fastest) in a loop that
    Triton software-pipelines over STAGES: the state tile of a later item (and its q, k, v, gates) is loaded by
    cp.async into shared memory while this item's step runs, so the state reads stay in flight through the
    compute and no program launches or drains in a tail wave. One-token sequences (every sequence of DECODE /
    DECODE_MULTI_SEQ) take that loop; its loads are masked off for padding sequences (slot -1: zero output row)
    and for sequences of another length, which a second, unpipelined loop runs afterwards with token_steps (only
    in programs that met one). KH: the tile as two K-halves [BK / 2, BV], two loads, each reduced apart. PAIRS:
    2-byte q, k, v, a, b read as 4-byte words (`_vec_f32`, `_head_f32`), so that the pipeliner copies them too."""
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    NV: tl.constexpr = (V + BV - 1) // BV
    LOAD_HINT: tl.constexpr = "evict_first" if STREAM else ""
    STORE_HINT: tl.constexpr = ".cs" if STREAM else ""
    RK: tl.constexpr = BK // 2 if KH else BK  # rows of one load
    FULL: tl.constexpr = (K == BK) and (V % BV == 0)  # every tile whole: its loads need no mask
    o_r = tl.arange(0, RK)
    o_c = tl.arange(0, BV)
    o_hr = o_r[:, None] * V + o_c[None, :]
    other = 0
    for it in tl.range(pid, n_items, nprog, num_stages=STAGES):
        i_v = it % NV
        i_hv = (it // NV) % HV
        i_n = it // (NV * HV)
        i_h = i_hv // (HV // H)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        n_t = tl.load(cu_seqlens + i_n + 1) - bos
        slot = tl.load(slots + i_n).to(tl.int64)
        one = n_t == 1
        live = one & (slot >= 0)
        # the tile is read from max(slot, 0) (row 0 of the pool for a padding sequence, its value unused) with no
        # mask where the tile is whole (FULL) and stored at the slot under a mask built from scalars only: a mask or
        # address shared by the load and the store would be a tile-shaped value carried from the stage that loads to
        # the stage that stores (one per stage in flight: 128 x 64 pointers and predicates, 255 registers and 288 B
        # spilled in 3 stages, sm_90 compile)
        p_l = pool + (tl.maximum(slot, 0) * HV + i_hv) * K * V + i_v * BV
        b_h0 = _tile_load(p_l, o_r, o_c, i_v, K, V, BV, FULL, LOAD_HINT)
        row = tl.where(live, bos, 0)  # the token's row; row 0 (T >= 1) stands in where no token is read
        p_q = q + row * s_qt + i_h * s_qh
        p_k = k + row * s_kt + i_h * s_kh
        b_q0 = _vec_f32(p_q, RK, K, PAIRS)
        b_k0 = _vec_f32(p_k, RK, K, PAIRS)
        if KH:
            b_h1 = _tile_load(p_l, RK + o_r, o_c, i_v, K, V, BV, FULL, LOAD_HINT)
            b_q1 = _vec_f32(p_q + RK, RK, K - RK, PAIRS)
            b_k1 = _vec_f32(p_k + RK, RK, K - RK, PAIRS)
        b_v = _vec_f32(v + row * s_vt + i_hv * s_vh + i_v * BV, BV, V - i_v * BV, PAIRS)
        b_g = -tl.exp(tl.load(A_log + i_hv).to(tl.float32)) * softplus(
            _head_f32(a + row * s_at, i_hv * s_ah, PAIRS) + tl.load(dt_bias + i_hv).to(tl.float32))
        b_beta = tl.sigmoid(_head_f32(b + row * s_bt, i_hv * s_bh, PAIRS))
        # the token step of token_steps (reductions over K from the raw q, k and the tile as loaded; norms after)
        b_hk, b_hq = _hk_hq(b_h0, b_k0, b_q0)
        b_kk = tl.sum(b_k0 * b_k0, 0)
        b_qq = tl.sum(b_q0 * b_q0, 0)
        b_kq = tl.sum(b_k0 * b_q0, 0)
        if KH:
            b_hk1, b_hq1 = _hk_hq(b_h1, b_k1, b_q1)
            b_hk += b_hk1
            b_hq += b_hq1
            b_kk += tl.sum(b_k1 * b_k1, 0)
            b_qq += tl.sum(b_q1 * b_q1, 0)
            b_kq += tl.sum(b_k1 * b_q1, 0)
        b_rk = 1.0 / tl.sqrt(b_kk + 1e-6)
        b_rq = scale / tl.sqrt(b_qq + 1e-6)
        b_e = tl.exp(b_g)
        b_kq = b_kq * b_rk * b_rq
        b_v = b_beta * (b_v - b_e * b_rk * b_hk)
        b_o = tl.where(live, b_e * b_rq * b_hq + b_kq * b_v, 0.0)
        tl.store(o + (bos * HV + i_hv) * V + i_v * BV + o_c, b_o.to(o.dtype.element_ty),
                 mask=i_v * BV + o_c < tl.where(one, V, 0))  # zeros for a padding sequence
        b_u = b_rk * b_v
        p_s = pool + (slot * HV + i_hv) * K * V + i_v * BV
        cols = i_v * BV + o_c < tl.where(live, V, 0)
        tl.store(p_s + o_hr, b_e * b_h0 + b_k0[:, None] * b_u[None, :], mask=(o_r < K)[:, None] & cols[None, :],
                 cache_modifier=STORE_HINT)
        if KH:
            tl.store(p_s + RK * V + o_hr, b_e * b_h1 + b_k1[:, None] * b_u[None, :],
                     mask=(RK + o_r < K)[:, None] & cols[None, :], cache_modifier=STORE_HINT)
        other += (n_t > 1).to(tl.int32)
    if other > 0:
        # sequences of more than one token (legal in the op's contract, never in a DECODE step): the general step
        o_k = tl.arange(0, BK)
        m_k = o_k < K
        for it in range(pid, n_items, nprog):
            i_v = it % NV
            i_hv = (it // NV) % HV
            i_n = it // (NV * HV)
            bos = tl.load(cu_seqlens + i_n).to(tl.int64)
            eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
            slot = tl.load(slots + i_n).to(tl.int64)
            if eos - bos > 1:
                m_v = i_v * BV + o_c < V
                p_o = o + (bos * HV + i_hv) * V + i_v * BV
                if slot < 0:
                    for _ in range(bos, eos):
                        tl.store(p_o + o_c, tl.zeros([BV], dtype=o.dtype.element_ty), mask=m_v)
                        p_o += HV * V
                else:
                    i_h = i_hv // (HV // H)
                    o_h = o_k[:, None] * V + o_c[None, :]
                    m_h = m_k[:, None] & m_v[None, :]
                    p_h = pool + (slot * HV + i_hv) * K * V + i_v * BV
                    b_h = tl.load(p_h + o_h, mask=m_h, other=0.0, eviction_policy=LOAD_HINT)
                    b_h = token_steps(b_h, q + bos * s_qt + i_h * s_qh, k + bos * s_kt + i_h * s_kh,
                                      v + bos * s_vt + i_hv * s_vh + i_v * BV, a + bos * s_at + i_hv * s_ah,
                                      b + bos * s_bt + i_hv * s_bh, p_o, p_h, A_log + i_hv, dt_bias + i_hv, scale,
                                      eos - bos, o_k, m_k, o_c, m_v, o_h, m_h, s_qt, s_kt, s_vt, s_at, s_bt,
                                      HV, K, V, False, STORE_HINT)
                    tl.store(p_h + o_h, b_h, mask=m_h, cache_modifier=STORE_HINT)
