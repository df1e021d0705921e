"""The chunked prefill's state pass (pass 2 of triton_chunked.py) in Gluon, for sm_90 (wgmma and TMA).

Why: the pass is a chain over a sequence's chunks, one program a V-tile and value head, and on one long sequence
it sets the prefill's time (docs/architecture.md). Triton's form (`gdn_chunk_state_kernel`) waits for each wgmma
right after issuing it, converts h's layout through shared memory twice a chunk (once as the second product's
operand, once for its store) and issues its tile loads as per-thread cp.async copies with their address arithmetic
on the chain's warps. Here, per chunk:
- w, k and u arrive by TMA, STAGES - 1 chunks ahead, one mbarrier a stage;
- h goes to shared memory once, as the B operand of w h, and the same buffer goes to global memory by a TMA store
  while that product runs (the output pass reads it); v_new the same way from a buffer of its own;
- the gates (gamma, 1 / |k|, gamma at the chunk's last row) are loaded one chunk ahead into registers;
- each wgmma is waited for only where its result is used.
The arithmetic is the Triton pass's, in the same order and precision: every form that ran gave h, v_new and the final
state equal to the Triton pass's bit for bit (H200, T = 4096 and 16384, and the GPU tests of the first full form).
Timed (H200, 2026-12-04, bench/results/2026-12-04-gluon-state.txt), the pass alone at T = 4096 against the Triton
pass's 90.0-91.1 us: the one-sequence probe 78.3-79.3 (16384: 307.4 against 348.0); the first full form, with the
capture snapshot as a branch in the chunk loop, 110.8-111.3, and 71.5 without that branch. This form splits the loop
at the cut instead: 70.9 / 272.4 / 1066.0 us at T = 4096 / 16384 / 65536 against the Triton pass's 90.3 / 345.6 /
1343.9 (2026-12-04-passes-gluon-split.md), so `Tuning.state_gluon` is on.

Scope (`usable`): bf16 / fp16 activations, K = 128, the single-sequence tiling without K halves or the WY form,
sm_90 exactly (wgmma does not exist past it), TMA-aligned k. Everything else, the AOT plugins included, takes the
Triton pass. The features are the Triton pass's: varlen sequences, empty slots, the capture cut (chunks restart
there and the snapshot is taken before the chunk after it), the pipeline's windows [c_lo, c_hi).

Tail chunks (fewer than 64 rows): the TMA box reads the next rows of the packed tokens (or zeros past T). Their v
rows are zeroed before the state update (`where`, so no value of another sequence enters, NaN included), their k
rows are zeroed in shared memory, and v_new is stored through a row mask instead of the TMA store.
"""

from __future__ import annotations

import functools

import torch

try:  # Gluon is Triton's (experimental): where it is missing, `usable` says no and the Triton pass runs
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError:  # pragma: no cover - every supported Triton has it
    gluon = None

BT = 64
STAGES = 3  # 4 stages: 104.7 against 79.3 us at T = 4096 (H200, bench/results/2026-12-04-gluon-state.txt)

if gluon is not None:
    # names across Triton versions: 3.6 (the H200's) and 3.9 (this project's CPU pin, which compiles for sm_90)
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

    @gluon.jit
    def _bounds(j, bos, length, cut, BT: gl.constexpr):
        """triton_chunked.chunk_bounds: chunk j's first token and row count (chunks restart at the cut)."""
        nc1 = (cut + BT - 1) // BT
        start = gl.where(j < nc1, bos + j * BT, bos + cut + (j - nc1) * BT)
        stop = gl.minimum(start + BT, gl.where(j < nc1, bos + cut, bos + length))
        return start, stop - start

    @gluon.jit
    def _issue(w_d, k_d, u_d, w_s, k_s, u_s, bars, j, jl, jh, bos, length, cut, i_h, i_hv, i_v,
               K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr):
        """The TMA loads of chunk j (none past the window) into stage (j - jl) % STAGES."""
        s = (j - jl) % STAGES
        ok = j < jh
        start, n_t = _bounds(j, bos, length, cut, BT)
        bar = bars.index(s)
        mbarrier.expect(bar, (2 * BT * K + BT * BV) * w_d.dtype.primitive_bitwidth // 8, pred=ok)
        _tma_load(w_d, [start, i_hv * K], bar, w_s.index(s), pred=ok)
        _tma_load(k_d, [start, i_h * K], bar, k_s.index(s), pred=ok)
        _tma_load(u_d, [start, i_hv * V + i_v * BV], bar, u_s.index(s), pred=ok)

    @gluon.jit
    def _gates(gam, rk, j, bos, length, cut, i_h, i_hv, o_t, H: gl.constexpr, HV: gl.constexpr,
               BT: gl.constexpr):
        """Chunk j's gamma and 1 / |k| rows (0 past its rows) and gamma at its last row."""
        start, n_t = _bounds(j, bos, length, cut, BT)
        m_t = o_t < n_t
        t = start.to(gl.int64) + o_t
        b_gam = gl.load(gam + t * HV + i_hv, mask=m_t, other=0.0)
        b_rk = gl.load(rk + t * H + i_h, mask=m_t, other=0.0)
        b_last = gl.load(gam + (start.to(gl.int64) + n_t - 1) * HV + i_hv, mask=n_t > 0, other=0.0)
        return b_gam, b_rk, b_last

    @gluon.jit
    def _chunk(w_d, k_d, u_d, h_d, vn_d, w_s, k_s, u_s, h_s, vb_s, vs_s, bars, rk, gam, v_new, j, jl, jh, bos, length,
               cut, i_c0, i_h, i_hv, i_v, o_t, o_c, b_h, b_gam, b_rk, b_last, acc_l: gl.constexpr, H: gl.constexpr,
               HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, BT: gl.constexpr,
               STAGES: gl.constexpr):
        """Chunk j of the chain: stores h_c (the state b_h as it comes in) and v_new, returns the state after the
        chunk and the gates of chunk j + 1, loaded one chunk ahead (b_gam, b_rk, b_last are chunk j's)."""
        DT: gl.constexpr = w_d.dtype
        it = j - jl
        s = it % STAGES
        _issue(w_d, k_d, u_d, w_s, k_s, u_s, bars, j + STAGES - 1, jl, jh, bos, length, cut, i_h, i_hv, i_v, K, V,
               BV, BT, STAGES)
        n_gam, n_rk, n_last = _gates(gam, rk, gl.minimum(j + 1, jh - 1), bos, length, cut, i_h, i_hv, o_t, H, HV,
                                     BT)
        start, n_t = _bounds(j, bos, length, cut, BT)
        m_t = o_t < n_t
        b_hb = b_h.to(DT)
        hb_s = h_s.index(it % 2)
        tma.store_wait(1)  # the stores of two chunks ago have read this chunk's buffers
        _cta_barrier()
        hb_s.store(b_hb)
        mbarrier.wait(bars.index(s), (it // STAGES) & 1)
        if n_t < BT:  # a tail chunk: its k rows past the chunk come from other tokens (or TMA zeros)
            ld_k: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
            b_k = k_s.index(s).load(ld_k)
            b_k = gl.where((gl.arange(0, BT, layout=gl.SliceLayout(1, ld_k)) < n_t)[:, None], b_k, 0.0)
            k_s.index(s).store(b_k.to(DT))
        fence_async_shared()  # this thread's h (and k) writes, seen by the wgmma and the TMA store
        _cta_barrier()  # every thread's
        acc = warpgroup_mma(w_s.index(s), hb_s, gl.zeros([BT, BV], gl.float32, acc_l), is_async=True)
        _tma_store(h_d, [((i_c0 + j) * HV + i_hv) * K, i_v * BV], hb_s)
        b_u = u_s.index(s).load(acc_l).to(gl.float32)
        acc = warpgroup_mma_wait(0, deps=[acc])
        b_v = b_u - acc
        b_vs = gl.where(m_t[:, None], b_v * (gl.exp(b_last - b_gam) * b_rk)[:, None], 0.0)
        full = n_t == BT
        if full:  # v_new by TMA (6 us less than per-thread stores at T = 4096)
            vb_s.index(it % 2).store(b_v.to(DT))
        else:
            o_tv = (start.to(gl.int64) + o_t) * (HV * V) + i_hv * V
            gl.store(v_new + o_tv[:, None] + o_c[None, :], b_v.to(DT), mask=m_t[:, None])
        vs_s.store(b_vs.to(DT))
        fence_async_shared()
        _cta_barrier()
        b_h = b_h * gl.exp(b_last)
        acc2 = warpgroup_mma(k_s.index(s).permute((1, 0)), vs_s, b_h, is_async=True)
        if full:
            _tma_store(vn_d, [start, i_hv * V + i_v * BV], vb_s.index(it % 2))
        b_h = warpgroup_mma_wait(0, deps=[acc2])
        return b_h, n_gam, n_rk, n_last

    @gluon.jit
    def _chunks(w_d, k_d, u_d, h_d, vn_d, w_s, k_s, u_s, h_s, vb_s, vs_s, bars, rk, gam, v_new, lo, hi, jl, jh, bos,
                length, cut, i_c0, i_h, i_hv, i_v, o_t, o_c, b_h, b_gam, b_rk, b_last, acc_l: gl.constexpr,
                H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                BT: gl.constexpr, STAGES: gl.constexpr):
        """Chunks [lo, hi) of one segment (before or after the capture cut) of the window [jl, jh) (`_chunk`)."""
        for j in range(lo, hi):
            b_h, b_gam, b_rk, b_last = _chunk(w_d, k_d, u_d, h_d, vn_d, w_s, k_s, u_s, h_s, vb_s, vs_s, bars, rk, gam,
                                              v_new, j, jl, jh, bos, length, cut, i_c0, i_h, i_hv, i_v, o_t, o_c, b_h,
                                              b_gam, b_rk, b_last, acc_l, H, HV, K, V, BV, BT, STAGES)
        return b_h, b_gam, b_rk, b_last

    @gluon.jit
    def gdn_chunk_state_gluon_kernel(
        w_d, k_d, u_d, h_d, vn_d,  # TMA: w [T, HV K], k [T, H K], u [T, HV V], h [chunks HV K, V], v_new [T, HV V]
        rk, gam, v_new, pool, cap,  # as gdn_chunk_state_kernel's
        cu_seqlens, slots, capture_at,
        H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
        BT: gl.constexpr, STAGES: gl.constexpr,
        c_lo, c_hi,  # the window of global chunk indices this launch runs
    ):
        i_v, i_hv, i_n = gl.program_id(0), gl.program_id(1), gl.program_id(2)
        slot = gl.load(slots + i_n).to(gl.int64)
        if slot < 0:
            return
        i_h = i_hv // (HV // H)
        # this sequence's bounds, and the global index of its first chunk: the chunks of the sequences before it
        bos = gl.load(cu_seqlens + i_n)
        length = gl.load(cu_seqlens + i_n + 1) - bos
        c_at = gl.load(capture_at + i_n)
        cut = gl.where((c_at > 0) & (c_at < length), c_at, 0)
        nc1 = (cut + BT - 1) // BT
        n_chunks = nc1 + (length - cut + BT - 1) // BT
        i_c0 = i_n * 0
        for m in range(0, i_n):
            b0 = gl.load(cu_seqlens + m)
            l0 = gl.load(cu_seqlens + m + 1) - b0
            a0 = gl.load(capture_at + m)
            k0 = gl.where((a0 > 0) & (a0 < l0), a0, 0)
            i_c0 += (k0 + BT - 1) // BT + (l0 - k0 + BT - 1) // BT
        jl = gl.minimum(gl.maximum(c_lo - i_c0, 0), n_chunks)
        jh = gl.minimum(gl.maximum(c_hi - i_c0, 0), n_chunks)
        first = (jl == 0) & ((jh > 0) | ((n_chunks == 0) & (c_lo == 0)))
        if (jl < jh) | first:
            DT: gl.constexpr = w_d.dtype
            acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BV, 16])
            row_l: gl.constexpr = gl.SliceLayout(1, acc_l)
            col_l: gl.constexpr = gl.SliceLayout(0, acc_l)
            w_s = gl.allocate_shared_memory(DT, [STAGES, BT, K], w_d.layout)
            k_s = gl.allocate_shared_memory(DT, [STAGES, BT, K], k_d.layout)
            u_s = gl.allocate_shared_memory(DT, [STAGES, BT, BV], u_d.layout)
            h_s = gl.allocate_shared_memory(DT, [2, K, BV], h_d.layout)  # alternate buffers: TMA stores in flight
            vb_s = gl.allocate_shared_memory(DT, [2, BT, BV], vn_d.layout)
            vs_s = gl.allocate_shared_memory(DT, [BT, BV], vn_d.layout)
            bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(STAGES):
                mbarrier.init(bars.index(i), count=1)
            for i in gl.static_range(STAGES - 1):
                _issue(w_d, k_d, u_d, w_s, k_s, u_s, bars, jl + i, jl, jh, bos, length, cut, i_h, i_hv, i_v,
                       K, V, BV, BT, STAGES)

            o_r = gl.arange(0, K, layout=row_l)
            o_c = i_v * BV + gl.arange(0, BV, layout=col_l)
            o_hk = o_r[:, None] * V + o_c[None, :]
            pool += (slot * HV + i_hv) * K * V
            cap += (i_n * HV + i_hv).to(gl.int64) * K * V
            b_h = gl.load(pool + o_hk)
            if (c_at == 0) & first:
                gl.store(cap + o_hk, b_h)
            o_t = gl.arange(0, BT, layout=row_l)
            b_gam, b_rk, b_last = _gates(gam, rk, jl, bos, length, cut, i_h, i_hv, o_t, H, HV, BT)
            # the loop splits at the capture cut, the snapshot between the two: with a branch for it in the loop
            # body the pass took 110.8 against 71.5 us at T = 4096 (H200; 228 registers against 160 at sm_90)
            b_h, b_gam, b_rk, b_last = _chunks(
                w_d, k_d, u_d, h_d, vn_d, w_s, k_s, u_s, h_s, vb_s, vs_s, bars, rk, gam, v_new, jl, gl.minimum(jh, nc1),
                jl, jh, bos, length, cut, i_c0, i_h, i_hv, i_v, o_t, o_c, b_h, b_gam, b_rk, b_last, acc_l, H, HV, K, V,
                BV, BT, STAGES)
            if (nc1 > 0) & (jl <= nc1) & (nc1 < jh):  # the window that goes on from the cut
                gl.store(cap + o_hk, b_h)
            b_h, b_gam, b_rk, b_last = _chunks(
                w_d, k_d, u_d, h_d, vn_d, w_s, k_s, u_s, h_s, vb_s, vs_s, bars, rk, gam, v_new, gl.maximum(jl, nc1), jh,
                jl, jh, bos, length, cut, i_c0, i_h, i_hv, i_v, o_t, o_c, b_h, b_gam, b_rk, b_last, acc_l, H, HV, K, V,
                BV, BT, STAGES)
            tma.store_wait(0)
            for i in gl.static_range(STAGES):
                mbarrier.invalidate(bars.index(i))
            if (length == c_at) & (length > 0) & (jh == n_chunks):
                gl.store(cap + o_hk, b_h)
            if jl < jh:
                gl.store(pool + o_hk, b_h)


def usable(q: torch.Tensor, k: torch.Tensor, K: int, V: int, bv: int) -> bool:
    """Whether this pass can run the launch: see the module docstring."""
    if gluon is None or q.device.type != "cuda" or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    # 64-wide V-tiles spill (255 registers, 64 B of stack at sm_90): 32 only, the single-sequence tiling's default
    if K != 128 or V % bv or bv != 32 or torch.cuda.get_device_capability(q.device) != (9, 0):
        return False
    return k.stride(2) == 1 and k.stride(1) == K and (k.stride(0) * k.element_size()) % 16 == 0 and \
        k.data_ptr() % 16 == 0


@functools.cache
def _layout(cols: int):
    """The NVMMA shared layout of a tile of `cols` 2-byte elements a row: the widest swizzle its rows allow. Made once
    per width (layouts are immutable): a 4096-token prefill step built 20 (five per layer's launcher), 7 ms of
    cProfile's time over 30 steps on the H200 (bench/results/2026-12-05-eager-profile.txt, profiler-inflated)."""
    row_bytes = cols * 2
    swizzle = 128 if row_bytes % 128 == 0 else 64 if row_bytes % 64 == 0 else 32
    return gl.NVMMASharedLayout(swizzle, 16, rank=2)


def launcher(k, rk, w, u, gam, h, v_new, pool, cap, seq, bv: int):
    """The state pass over gdn_chunk_state_kernel's buffers (seq: cu_seqlens, slots, capture_at, N; k the raw
    strided [T, H, K] view, `usable`) as a function of its window (c_lo, c_hi) of global chunks: the TMA
    descriptors are built once here, for every window of the prefill's pipeline."""
    cu_seqlens, slots, capture_at, N = seq
    T, H, K = k.shape
    HV, V = u.shape[1:]

    def desc(t: torch.Tensor, shape: list[int], stride: list[int], block: list[int]):
        return TensorDescriptor(t, shape, stride, block, _layout(block[1]))

    descs = (desc(w, [T, HV * K], [HV * K, 1], [BT, K]), desc(k, [T, H * K], [k.stride(0), 1], [BT, K]),
             desc(u, [T, HV * V], [HV * V, 1], [BT, bv]), desc(h, [h.shape[0] * HV * K, V], [V, 1], [K, bv]),
             desc(v_new, [T, HV * V], [HV * V, 1], [BT, bv]))

    def launch(c_lo: int, c_hi: int) -> None:
        gdn_chunk_state_gluon_kernel[(V // bv, HV, N)](
            *descs, rk, gam, v_new, pool, cap, cu_seqlens, slots, capture_at, H=H, HV=HV, K=K, V=V, BV=bv, BT=BT,
            STAGES=STAGES, c_lo=c_lo, c_hi=c_hi, num_warps=4)

    return launch
