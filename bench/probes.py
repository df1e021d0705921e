"""Probe kernels for bench/kernels.py: variants of our decode kernels that leave one stage out or lay the data out
differently, timed beside the real kernels to find where their time goes (no hardware counters on the H200 here).

- `empty_kernel`: one program that returns at once: the per-launch floor of a CUDA-graph replay.
- `stream_kernel`: a flat fp32 read and write of given counts in Triton (contiguous blocks), after the step's PDL
  entry: n values each way, the streaming ceiling of a Triton kernel (bench/variants.py's floor); per kernel of the
  decode step, that kernel's bytes (bench/chain_floor.py's stand-in for it).
- `rec_copy_kernel`: the decode kernel's state traffic alone: same grid (V-tiles x value heads x sequences), same
  [K, BV] tile, slot lookup and cache hints, the tile stored back unchanged (DIRECT: without the slot lookup).
- `conv_update_kernel`: the conv's one-token update in three pool layouts ([S, D, 3] ours in round 1, [S, D, 4]
  FLA's aligned row, [S, 3, D] one contiguous row per history column), and ours moved as one flat run per channel tile
  with the taps gathered in registers, each with or without the cu_seqlens / slots lookups. Layout 2 is the
  conv pool's layout since round 2; bench/variants.py runs that one beside the production kernel.
- `rec_conv_probe_kernel`: the decode step with the conv update fused in, the conv history as a ring indexed by
  token position (the contract change a fused decode op would need), timed against the two launches of today.

The persistent prefetching decode probe of 2026-12-03-kernels-variants.md is at commit 95c6842.
"""

from __future__ import annotations

import triton
import triton.language as tl

from gdn_trt.plugins import pdl
from gdn_trt.plugins.gated_delta_rule.triton_recurrent import softplus



@triton.jit
def empty_kernel(x):
    pass


@triton.jit
def rec_copy_kernel(pool, slots, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                    DIRECT: tl.constexpr = False):
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if DIRECT:  # sequence n in pool row n: no load before the state's address is known
        slot = i_n.to(tl.int64)
    else:
        slot = tl.load(slots + i_n).to(tl.int64)
    o_h = tl.arange(0, K)[:, None] * V + i_v * BV + tl.arange(0, BV)[None, :]
    pool += (slot * HV + i_hv) * K * V
    tl.store(pool + o_h, tl.load(pool + o_h, eviction_policy="evict_first"), cache_modifier=".cs")


@triton.jit
def conv_update_kernel(x, weight, y, pool, cu_seqlens, slots, D: tl.constexpr, BD: tl.constexpr,
                       LAYOUT: tl.constexpr, INDIRECT: tl.constexpr):
    """One token per sequence, W = 4, dilation 1, SiLU; x, y [N, D], weight [D, 4]. LAYOUT 0: pool [S, D, 3]
    (ours in round 1), 1: [S, D, 4] (FLA's cache row), 2: [S, 3, D] (ours since round 2), 3: [S, D, 3] moved as
    one flat run per channel tile.
    INDIRECT: row and token from slots / cu_seqlens."""
    i_d, i_n = tl.program_id(0), tl.program_id(1)
    if INDIRECT:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        row = tl.load(slots + i_n).to(tl.int64)
    else:
        bos = i_n.to(tl.int64)
        row = i_n.to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    o_s = tl.arange(0, 4)
    b_x = tl.load(x + bos * D + o_d).to(tl.float32)
    b_w = tl.load(weight + o_d[:, None] * 4 + o_s[None, :]).to(tl.float32)
    if LAYOUT == 0:
        p = pool + row * D * 3 + o_d[:, None] * 3 + o_s[None, :]
        b_hist = tl.load(p, mask=(o_s < 3)[None, :], other=0.0).to(tl.float32)
        b_y = tl.sum(b_hist * b_w, 1) + tl.sum(tl.where((o_s == 3)[None, :], b_w, 0.0), 1) * b_x
        b_win = tl.load(p + 1, mask=(o_s < 2)[None, :], other=0.0).to(tl.float32)
        b_win = tl.where((o_s == 2)[None, :], b_x[:, None], b_win)
        tl.debug_barrier()
        tl.store(p, b_win.to(pool.dtype.element_ty), mask=(o_s < 3)[None, :])
    elif LAYOUT == 1:
        p = pool + row * D * 4 + o_d[:, None] * 4 + o_s[None, :]
        b_win = tl.load(p + 1, mask=(o_s < 3)[None, :], other=0.0).to(tl.float32)
        b_win = tl.where((o_s == 3)[None, :], b_x[:, None], b_win)
        b_y = tl.sum(b_win * b_w, 1)
        tl.store(p, b_win.to(pool.dtype.element_ty))
    elif LAYOUT == 3:
        # [S, D, 3] read and written as one contiguous run of 3 BD values (16-byte accesses); taps and the shifted
        # window gathered in registers
        o_f = tl.arange(0, 4 * BD)
        p = pool + row * D * 3 + i_d * BD * 3 + o_f
        b_f = tl.load(p, mask=o_f < 3 * BD, other=0.0)
        o_c = tl.arange(0, BD) * 3
        b_y = tl.sum(tl.where((o_s == 3)[None, :], b_w, 0.0), 1) * b_x
        for j in tl.static_range(3):
            b_y += tl.sum(tl.where((o_s == j)[None, :], b_w, 0.0), 1) * tl.gather(b_f, o_c + j, 0).to(tl.float32)
        b_next = tl.gather(b_f, tl.minimum(o_f + 1, 4 * BD - 1), 0)
        b_xf = tl.gather(b_x.to(pool.dtype.element_ty), tl.minimum(o_f // 3, BD - 1), 0)
        tl.store(p, tl.where(o_f % 3 == 2, b_xf, b_next), mask=o_f < 3 * BD)
    else:
        p = pool + row * 3 * D + o_d
        b_c0 = tl.load(p).to(tl.float32)
        b_c1 = tl.load(p + D)
        b_c2 = tl.load(p + 2 * D)
        w0 = tl.sum(tl.where((o_s == 0)[None, :], b_w, 0.0), 1)
        w1 = tl.sum(tl.where((o_s == 1)[None, :], b_w, 0.0), 1)
        w2 = tl.sum(tl.where((o_s == 2)[None, :], b_w, 0.0), 1)
        w3 = tl.sum(tl.where((o_s == 3)[None, :], b_w, 0.0), 1)
        b_y = w0 * b_c0 + w1 * b_c1.to(tl.float32) + w2 * b_c2.to(tl.float32) + w3 * b_x
        tl.store(p, b_c1)
        tl.store(p + D, b_c2)
        tl.store(p + 2 * D, b_x.to(pool.dtype.element_ty))
    b_y = b_y * tl.sigmoid(b_y)
    tl.store(y + bos * D + o_d, b_y.to(y.dtype.element_ty))


@triton.jit
def rec_conv_probe_kernel(x, weight, ring, positions, a, b, A_log, dt_bias, o, pool, slots, scale,
                          H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """The decode step with the GDN conv update fused in (one token per sequence, W = 4, SiLU, no padding rows):
    what one launch instead of two would cost. x [N, D] pre-conv [Q | K | V]; weight [D, 4]; the conv history as a
    ring [S, 4, D] indexed by token position (row p % 4 holds the input of position p): a step reads the rows of
    positions p-3 .. p-1 and writes x into row p % 4, which no program of the step reads, so the programs that
    share a key head's q, k channels need no ordering. Each program convolves its key head's q, k (recomputed by
    the G * V / BV programs of the head) and its own v columns; q, k rows are written by the head's first
    program. Not an op: the ring (4 rows and a positions input) would be a contract change of the conv ops."""
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = HV // H
    D: tl.constexpr = 2 * H * K + HV * V
    i_h = i_hv // G
    slot = tl.load(slots + i_n).to(tl.int64)
    pos = tl.load(positions + i_n)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    o_h = o_k[:, None] * V + o_v[None, :]
    pool += (slot * HV + i_hv) * K * V
    b_h = tl.load(pool + o_h)
    p_r = ring + slot * 4 * D
    x += i_n.to(tl.int64) * D
    c_q = i_h * K + o_k
    c_k = H * K + i_h * K + o_k
    c_v = 2 * H * K + i_hv * V + o_v
    b_q = _conv4(x, weight, p_r, c_q, pos, D)
    b_k = _conv4(x, weight, p_r, c_k, pos, D)
    b_v = _conv4(x, weight, p_r, c_v, pos, D)
    row = p_r + (pos % 4) * D
    tl.store(row + c_v, tl.load(x + c_v))
    if (i_v == 0) & (i_hv % G == 0):
        tl.store(row + c_q, tl.load(x + c_q))
        tl.store(row + c_k, tl.load(x + c_k))
    b_g = -tl.exp(tl.load(A_log + i_hv)) * softplus(tl.load(a + i_n * HV + i_hv).to(tl.float32)
                                                     + tl.load(dt_bias + i_hv))
    b_beta = tl.sigmoid(tl.load(b + i_n * HV + i_hv).to(tl.float32))
    b_hk = tl.sum(b_h * b_k[:, None], 0)
    b_hq = tl.sum(b_h * b_q[:, None], 0)
    b_rk = 1.0 / tl.sqrt(tl.sum(b_k * b_k, 0) + 1e-6)
    b_rq = scale / tl.sqrt(tl.sum(b_q * b_q, 0) + 1e-6)
    b_kq = tl.sum(b_k * b_q, 0) * b_rk * b_rq
    b_e = tl.exp(b_g)
    b_v = b_beta * (b_v - b_e * b_rk * b_hk)
    b_h = b_e * b_h + (b_k * b_rk)[:, None] * b_v[None, :]
    tl.store(o + (i_n * HV + i_hv) * V + o_v, (b_e * b_rq * b_hq + b_kq * b_v).to(o.dtype.element_ty))
    tl.store(pool + o_h, b_h, cache_modifier=".cs")


@triton.jit
def _conv4(x, weight, p_r, c, pos, D: tl.constexpr):
    """SiLU(sum_j w[c, j] input(pos - 3 + j)) for channels c (fp32): taps 0..2 from the ring, tap 3 from x."""
    o_w = tl.arange(0, 4)
    b_w = tl.load(weight + c[:, None] * 4 + o_w[None, :]).to(tl.float32)
    b_y = tl.sum(tl.where((o_w == 3)[None, :], b_w, 0.0), 1) * tl.load(x + c).to(tl.float32)
    for j in tl.static_range(3):
        b_in = tl.load(p_r + ((pos + 1 + j) % 4) * D + c).to(tl.float32)
        b_y += tl.sum(tl.where((o_w == j)[None, :], b_w, 0.0), 1) * b_in
    return b_y * tl.sigmoid(b_y)


@triton.jit
def stream_kernel(src, dst, n_rd, n_wr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Reads the first n_rd and writes the first n_wr fp32 values of its BLOCK-wide block (zeros past n_rd), after
    the PDL wait and trigger every kernel of the decode step takes (`pdl.enter`): one launch of
    bench/chain_floor.py's chains, moving exactly the bytes of the step's kernels it stands for."""
    pdl.enter(PDL)
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + o, mask=o < n_rd, other=0.0, eviction_policy="evict_first")
    tl.store(dst + o, v, mask=o < n_wr, cache_modifier=".cs")


@triton.jit
def grid_sync(bar):
    """Every program of the grid (all resident) has arrived and its stores are visible: a sense-reversing
    barrier on bar[0] (arrivals, left at 0) and bar[1] (generation). The last to arrive resets the count, then bumps
    the generation (release); the others spin on it (acquire)."""
    tl.debug_barrier()  # every thread's stores precede the arrival
    gen = tl.atomic_add(bar + 1, 0, sem="acquire", scope="gpu")
    if tl.atomic_add(bar, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.atomic_xchg(bar, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(bar + 1, 1, sem="release", scope="gpu")
    else:
        while tl.atomic_add(bar + 1, 0, sem="acquire", scope="gpu") == gen:
            pass
    tl.debug_barrier()


@triton.jit
def phased_stream_kernel(src, dst, sizes, bar, PHASES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """One launch of PHASES streaming phases with a grid barrier between each two: phase i reads
    sizes[i, 2] fp32 values from src + sizes[i, 0] and writes sizes[i, 3] at dst + sizes[i, 1] (zeros past what it
    read), block b of it by program b % P of the P programs. They must all be resident (grid = SMs x programs an SM
    holds), or the barrier never opens. bench/chain_floor.py's persistent layer: the step's six kernels as phases of one
    launch a layer."""
    pdl.enter(PDL)
    pid, P = tl.program_id(0), tl.num_programs(0)
    for ph in tl.static_range(PHASES):
        s0 = tl.multiple_of(tl.load(sizes + 4 * ph), BLOCK)  # offsets padded to whole blocks: 16-byte vectors
        d0 = tl.multiple_of(tl.load(sizes + 4 * ph + 1), BLOCK)
        n_rd = tl.multiple_of(tl.load(sizes + 4 * ph + 2), 16)  # counts in whole 16-value runs: unsplit vectors
        n_wr = tl.multiple_of(tl.load(sizes + 4 * ph + 3), 16)
        for b in range(pid, tl.cdiv(tl.maximum(n_rd, n_wr), BLOCK), P):
            o = b * BLOCK + tl.arange(0, BLOCK)  # < 2^31 values a phase (N = 256: 134 M)
            v = tl.load(src + s0 + o, mask=o < n_rd, other=0.0, eviction_policy="evict_first")
            tl.store(dst + d0 + o, v, mask=o < n_wr, cache_modifier=".cs")
        if ph < PHASES - 1:
            grid_sync(bar)
