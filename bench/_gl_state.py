"""Probe (not kept as is): the chunked prefill's state pass written in Gluon, one sequence, T a multiple of 64.

Per program (V-tile of BV columns, value head): per chunk, h (fp32, in the wgmma accumulator layout) goes to
shared memory once as bf16 (the B operand of w h) and to global memory from the same registers while that
product runs; the chunk's w, k, u tiles arrive by cp.async STAGES - 1 chunks ahead, the gates one chunk ahead
in registers; each wgmma is waited for explicitly, and nothing but the chain's own dependencies orders them.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# Triton 3.6 (the H200's) names the cp.async copy async_copy_global_to_shared; 3.9 (the CPU's compile check)
# async_load
cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # 3.6 / 3.9
tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def issue_tma(w_d, k_d, u_d, w_s, k_s, u_s, bars, c, n_c, i_h, i_hv, i_v, K: gl.constexpr, V: gl.constexpr,
              BV: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr):
    s = c % STAGES
    ok = c < n_c
    bar = bars.index(s)
    mbarrier.expect(bar, (2 * BT * K + BT * BV) * 2, pred=ok)
    tma_load(w_d, [c * BT, i_hv * K], bar, w_s.index(s), pred=ok)
    tma_load(k_d, [c * BT, i_h * K], bar, k_s.index(s), pred=ok)
    tma_load(u_d, [c * BT, i_hv * V + i_v * BV], bar, u_s.index(s), pred=ok)


@gluon.jit
def issue(w, k, u, w_s, k_s, u_s, c, n_c, i_h, i_hv, i_v, s_kt, ld_k: gl.constexpr, ld_u: gl.constexpr,
          HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr,
          STAGES: gl.constexpr):
    s = c % STAGES
    ok = c < n_c
    o_t = gl.arange(0, BT, layout=gl.SliceLayout(1, ld_k))
    o_k = gl.arange(0, K, layout=gl.SliceLayout(0, ld_k))
    t = (c * BT + o_t).to(gl.int64)
    m = (o_t < BT)[:, None] & ok
    cp_async(w_s.index(s), w + (t[:, None] * HV + i_hv) * K + o_k[None, :], mask=m)
    cp_async(k_s.index(s), k + t[:, None] * s_kt + i_h * K + o_k[None, :], mask=m)
    o_tu = gl.arange(0, BT, layout=gl.SliceLayout(1, ld_u))
    o_v = gl.arange(0, BV, layout=gl.SliceLayout(0, ld_u))
    tu = (c * BT + o_tu).to(gl.int64)
    cp_async(u_s.index(s), u + (tu[:, None] * HV + i_hv) * V + i_v * BV + o_v[None, :],
                                           mask=(o_tu < BT)[:, None] & ok)


@gluon.jit
def state_gl_kernel(k, rk, w, u, gam, h, v_new, pool, T, s_kt, h_desc, w_d, k_d, u_d,
                    H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                    BT: gl.constexpr, STAGES: gl.constexpr, HSTORE: gl.constexpr, LOADS: gl.constexpr):
    """HSTORE: 0 h not stored (timing only), 1 from registers, 2 by TMA from the wgmma's shared copy. LOADS: 0 w,
    k, u by cp.async, 1 by TMA (an mbarrier per stage)."""
    i_v = gl.program_id(0)
    i_hv = gl.program_id(1)
    i_h = i_hv // (HV // H)
    n_c = T // BT
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BV, 16])
    row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
    col_l: gl.constexpr = gl.SliceLayout(0, acc_l)
    ld_k: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])  # [BT, K] in 16-byte pieces
    ld_u: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [4, 1], [1, 0])  # [BT, BV = 32]
    wk_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, K], gl.bfloat16)
    u_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BT, BV], gl.bfloat16)
    h_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], gl.bfloat16)
    w_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], wk_sl)
    k_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, K], wk_sl)
    u_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BT, BV], u_sl)
    h_s = gl.allocate_shared_memory(gl.bfloat16, [2, K, BV], h_sl)  # HSTORE 2: TMA stores from alternate buffers
    vs_s = gl.allocate_shared_memory(gl.bfloat16, [BT, BV], u_sl)

    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    if LOADS == 1:
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES - 1):
        if LOADS == 1:
            issue_tma(w_d, k_d, u_d, w_s, k_s, u_s, bars, i, n_c, i_h, i_hv, i_v, K, V, BV, BT, STAGES)
        else:
            issue(w, k, u, w_s, k_s, u_s, i, n_c, i_h, i_hv, i_v, s_kt, ld_k, ld_u, HV, K, V, BV, BT, STAGES)
            async_copy.commit_group()

    o_r = gl.arange(0, K, layout=row_l)
    o_c = i_v * BV + gl.arange(0, BV, layout=col_l)
    o_hk = o_r[:, None] * V + o_c[None, :]
    pool += i_hv * K * V
    b_h = gl.load(pool + o_hk)
    o_t = gl.arange(0, BT, layout=row_l)
    p_tv = (o_t[:, None] * HV + i_hv) * V + o_c[None, :]
    b_gam = gl.load(gam + o_t * HV + i_hv)
    b_rk = gl.load(rk + o_t * H + i_h)
    b_last = gl.load(gam + (BT - 1) * HV + i_hv)  # a scalar load, not a reduction across the warps of b_gam
    for c in range(n_c):
        s = c % STAGES
        if LOADS == 1:
            issue_tma(w_d, k_d, u_d, w_s, k_s, u_s, bars, c + STAGES - 1, n_c, i_h, i_hv, i_v, K, V, BV, BT, STAGES)
        else:
            issue(w, k, u, w_s, k_s, u_s, c + STAGES - 1, n_c, i_h, i_hv, i_v, s_kt, ld_k, ld_u, HV, K, V, BV, BT,
                  STAGES)
            async_copy.commit_group()
        # the next chunk's gates, one chunk ahead in registers (the last chunk reads its own again)
        t1 = (gl.minimum(c + 1, n_c - 1) * BT + o_t).to(gl.int64)
        n_gam = gl.load(gam + t1 * HV + i_hv)
        n_rk = gl.load(rk + t1 * H + i_h)
        n_last = gl.load(gam + ((gl.minimum(c + 1, n_c - 1) * BT + BT - 1) * HV + i_hv).to(gl.int64))
        b_hb = b_h.to(gl.bfloat16)
        hb_s = h_s.index(c % 2)
        if HSTORE == 2:
            tma.store_wait(1)  # the TMA store of two chunks ago has read this buffer
            cta_barrier()
        hb_s.store(b_hb)
        if LOADS == 1:
            mbarrier.wait(bars.index(s), (c // STAGES) & 1)
        else:
            async_copy.wait_group(STAGES - 1)
        fence_async_shared()  # each thread's h and cp.async writes visible to the wgmma (async proxy)
        cta_barrier()  # every thread's
        acc = warpgroup_mma(w_s.index(s), hb_s, gl.zeros([BT, BV], gl.float32, acc_l), is_async=True)
        if HSTORE == 1:
            gl.store(h + ((c * HV + i_hv) * K * V).to(gl.int64) + o_hk, b_hb)
        elif HSTORE == 2:  # h_desc: h as [chunks * HV * K, V]
            tma_store(h_desc, [(c * HV + i_hv) * K, i_v * BV], hb_s)
        b_u = u_s.index(s).load(acc_l).to(gl.float32)
        acc = warpgroup_mma_wait(0, deps=[acc])
        b_v = b_u - acc
        t0 = (c * BT).to(gl.int64) * HV * V
        gl.store(v_new + t0 + p_tv, b_v.to(gl.bfloat16))
        b_vs = b_v * (gl.exp(b_last - b_gam) * b_rk)[:, None]
        vs_s.store(b_vs.to(gl.bfloat16))
        fence_async_shared()
        cta_barrier()
        b_h = b_h * gl.exp(b_last)
        acc2 = warpgroup_mma(k_s.index(s).permute((1, 0)), vs_s, b_h, is_async=True)
        b_h = warpgroup_mma_wait(0, deps=[acc2])
        b_gam = n_gam
        b_rk = n_rk
        b_last = n_last
    async_copy.wait_group(0)
    if HSTORE == 2:
        tma.store_wait(0)
    gl.store(pool + o_hk, b_h)


def launch(k, rk, w, u, gam, h, v_new, pool, BV=32, STAGES=3, HSTORE=2, LOADS=0):
    """k: [T, H, K] bf16 view (unit stride along K, head stride K); the rest as launch_chunked forms them, one
    sequence whose state is pool[0] ([HV, K, V] fp32), T a multiple of 64."""
    T, H, K = k.shape
    HV, V = u.shape[1:]
    assert k.stride(1) == K and k.stride(2) == 1 and T % 64 == 0 and K == 128
    # the kernel's h_sl for [128, 32] bf16: 64-byte rows, 64-byte swizzle
    sl128, sl64 = gl.NVMMASharedLayout(128, 16, rank=2), gl.NVMMASharedLayout(64, 16, rank=2)
    h_desc = TensorDescriptor.from_tensor(h.view(-1, V), [K, BV], sl64)
    w_d = TensorDescriptor.from_tensor(w.view(T, HV * K), [64, K], sl128)
    k_d = TensorDescriptor(k, [T, H * K], [k.stride(0), 1], [64, K], sl128)
    u_d = TensorDescriptor.from_tensor(u.view(T, HV * V), [64, BV], sl64)
    state_gl_kernel[(V // BV, HV)](k, rk, w, u, gam, h, v_new, pool, T, k.stride(0), h_desc, w_d, k_d, u_d, H=H, HV=HV,
                                    K=K, V=V, BV=BV, BT=64, STAGES=STAGES, HSTORE=HSTORE, LOADS=LOADS, num_warps=4)
