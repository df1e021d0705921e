"""Skinny GEMM for the decode-sized projections: y [M, N] = x [M, K] W [N, K]^T with M (tokens) small.

Why: at decode the layer's projections read a weight of tens of megabytes to multiply a handful of rows, so their
time is the weight's bytes over the memory rate. cuBLAS streams them at about 2.8 TB/s at M = 1 on the H200
(Qwen3-Next in_proj [12352, 2048] and out_proj [2048, 4096]: 101 of the 146 us of a 4-layer decode step,
bench/results/2026-12-03-runtime-final.md) against a 4.25 TB/s copy rate. This kernel only streams: each program
owns BN weight rows (an N-tile) and one of `split` contiguous K-slices, and walks its slice in BK-wide tiles,
pipelined over `stages` buffers, multiplying each tile by the BM x BK tile of x it needs (a few kilobytes, served
from L2) and accumulating in fp32:
- `dot`: y^T tile = W tile x^T tile on the tensor cores ("swap AB": the weight rows fill the MMA's M side, so the
  token count only has to reach tl.dot's minimum of 16: BM = max(16, next pow2 of M));
- FMA (M <= 4): a [BN, BM, BK] fp32 product accumulated in registers and summed over K once at the end, for BN
  below the MMA's 16 rows (more programs for the narrow out_proj).
Split-K (`split` > 1) is for projections with few N-tiles (out_proj: 32 tiles of 64 rows for 132 SMs): each program
writes its fp32 partial tile to a workspace, then draws a ticket from its tile's int32 counter (an atomic add,
acq_rel at gpu scope, after a CTA barrier so that every thread's partial is written first); the program that draws
the last ticket sums the partials in slice order 0..split-1, whatever order they arrived in, writes y and sets the
counter back to 0 for the next launch or graph replay. So every output element is a fixed-order sum: two calls, and a
CUDA-graph replay and the eager call, agree bit for bit. (The other deterministic form, split = 2 with fp32 atomic
adds into a zeroed buffer, needs a zeroing and a conversion launch: two graph nodes, ~0.8 us each, against the
~5 us that out_proj can take; not built.)
Workspace and counters are allocated once per (device, tiles, split, tile size) and kept (`_workspace`), never per
call: the first launch of a geometry must be eager, and a first launch under CUDA-graph capture is refused (the
runtime and bench/common.time_cuda warm every op eagerly before they capture). Launches that share a workspace must
be ordered on one stream, as a session's are (it steps on its device's current stream, one thread at a time,
runtime/guard.py, and replays its graphs in order); two streams running the same geometry at once would mix their
tickets.
Weight rows past N are wrapped (`% N`) instead of masked, so every weight load is unmasked and vectorised (only the
store is masked); token rows past M are masked, so they read nothing. With `Config.tma` the tiles come through TMA
descriptors instead (rows and columns past the tensor read as zeros). `TABLE` holds the launch per M bucket and
width class and its time against cuBLAS's, written by `bench/gemm.py --sweep --apply` on the H200; `op.linear` sends
a call here only where that launch beat cuBLAS (`dispatched`), in bf16 and fp16 (fp32 operands take IEEE dots: the
interpreter tests).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import pdl


@dataclass(frozen=True)
class Config:
    """One launch: BM token rows x BN weight rows per program, BK-wide K steps over `stages` pipeline buffers, K cut
    into `split` slices (one program each)."""

    bm: int
    bn: int
    bk: int
    stages: int = 4
    warps: int = 4
    dot: bool = True  # tensor-core tiles (BM, BN >= 16); False: the FMA form (BM <= 4)
    split: int = 1
    # > 0: not N-tiles of BN rows but spread x SMS programs (per M-tile and K-slice), each on its own contiguous range
    # of about N / (spread x SMS) weight rows, the block the power of two that covers the range and at least BN (rows
    # past the range masked): every SM streams the same bytes, where BN-row tiles leave a partial last wave (in_proj
    # at BN = 64: 193 tiles on 132 SMs, so 61 SMs stream two tiles and 71 one)
    spread: int = 0
    # with PDL, the next kernel may launch only once every program is past its K loop, not as soon as each starts
    # (`gemm_kernel`'s LATE). Triggered at the start, in_proj let the conv update launch at once, and the conv's
    # programs waited on the SMs through the whole GEMM. At N = 8 the conv's interval was 21.8 us (15.5 of it beside
    # in_proj) and the GDN decode's 14.9. With the late trigger they were 7.6 and 12.6, and the step took 168.7
    # against 173.9 us (H200, bench/results/2026-12-04-gemm-step-late.md, run 2; run 1, late on both GEMMs: 168.2
    # against 173.6). On out_proj it lost: the next layer's norm, which the early trigger overlaps with the GEMM,
    # waits (N = 64: 449.3 against 445.3 us a step). At N = 1 it changed nothing (117.4 against 117.2, both GEMMs).
    late: bool = False
    # the weight and x tiles through TMA descriptors (`TensorDescriptor`: one bulk copy per tile, rows and columns
    # past the tensor read as zeros) instead of per-thread pointer loads; BK x the element size at most 128 bytes
    # (one swizzle span). Written in a sitting without a device (interpreter tests, sm_90 compile): no row of the
    # table takes it until `bench/gemm.py --sweep` has timed it
    tma: bool = False

    def check(self) -> None:
        if self.dot and (self.bm < 16 or self.bn < 16 or self.bk < 16):
            raise ValueError(f"tl.dot tiles need BM, BN, BK >= 16: {self}")
        if not self.dot and self.bm > 4:
            raise ValueError(f"the FMA form holds a [BN, BM, BK] product in registers: BM <= 4, got {self}")
        if not 1 <= self.split <= 64:
            raise ValueError(f"split must be 1..64 K-slices, got {self}")
        if self.spread < 0 or (self.spread and not self.dot):
            raise ValueError(f"spread must be >= 0 programs per SM, and only for tl.dot tiles, got {self}")
        if self.tma and (not self.dot or self.bk > 64):
            raise ValueError(f"TMA tiles are for tl.dot tiles with BK <= 64 (128 bytes of bf16), got {self}")


@dataclass(frozen=True)
class Row:
    """TABLE entry: `cfg` for M <= max_m and N >= min_n; vs_cublas = its time over cuBLAS's in the sweep (< 1: the
    dispatch sends such calls here)."""

    max_m: int
    min_n: int
    cfg: Config
    vs_cublas: float


# the split of a narrow row is cut so that N-tiles x split <= SMS (the H200's SMs): every winner of the sweep on
# out_proj (32 N-tiles) ran 128 programs, one per SM, and the same launch on other widths ran a second, mostly idle
# wave: Qwen4-Exp's PLE value [2560, 2560] (40 tiles x 4 = 160 programs) took 11.9 against cuBLAS's 7.3 us at M = 64
# and Qwen3.5's MLP down [4096, 12288] (256 programs) 34.7 against 32.0 (bench/results/2026-12-03-gemm-uncut.md)
SMS = 132
WIDE_N = 8192  # in_proj-like widths (>= WIDE_N rows: enough N-tiles to fill the SMs) take their own launches
# the first row whose bounds hold is used; per M bucket a wide row (min_n = WIDE_N, tuned on Qwen3-Next's in_proj
# [12352, 2048]) then a narrow one (min_n = 0, tuned on its out_proj [2048, 4096]): the best launch of the sweep on
# that shape, its time over cuBLAS's and (comment) both times, from the run named on the next line.
# H200, 2026-12-03 (bench/results/2026-12-03-gemm-sweep.md), against cuBLAS on the same shape; the rows dated
# 2026-12-04 from that day's sweep of M = 16, 32, 64 (bench/results/2026-12-04-gemm-sweep.md), which added row
# ranges (`spread`): at M = 64 none beat N-tiles (best 17.2 against 17.0 us), so an even share of the weight per SM
# is not what holds in_proj at 3.1 TB/s there; at M = 16 two ranges per SM won by 1 % (14.4 against 14.6 us).
# TMA tiles (`Config.tma`), 2026-12-05 (bench/results/2026-12-05-gemm-sweep.md, M = 1..64): alone, in_proj at M = 64
# took 15.7 us with (64, 64, 64, 6 stages, TMA) against cuBLAS's 16.9, the only bucket where TMA led; in the N = 64
# decode step (`2026-12-05-gemm-step-tma.md`) it took 20.6 against cuBLAS's 19.7 us and the step 426.4 against
# 429.6 us with the late trigger (0.993x, inside the 2-3 % between two sessions of one launch), 450.8 with the early
# one. The M = 64 wide row stays cuBLAS's; the other rows' winners differ from the table's by about 1 %.
# Warp specialization of the TMA loop (`tl.range(..., warp_specialize=True)`: a producer warp issuing the copies),
# H100, 2026-12-05 (bench/results/2026-12-05-ws-gemm-h100.txt; the script is at 09d9be9): slower at every tile, in_proj
# at M = 64 22.3-26.9 us against 20.6-22.4 without it and cuBLAS's 21.5; at M = 8 23.6-24.6 against 20.2-20.8.
# What does not hold in_proj at M = 64 (H100, 2026-12-05, bench/results/2026-12-05-reg-gemm-h100.txt; the scripts are
# at 4b852c3 and b5604d6): re-reading x from the L2 (the same loop with its x tile loaded once: 20.79 against 20.82 us,
# cuBLAS 20.91); the shared-memory pipeline (the weight through registers one K step ahead, 16-byte loads, 4-8 warps:
# 24.8-34.6 us; at M = 8 21.3-25.6 against 19.6). A kernel that only reads the weight took 17.35 us there (2.92 TB/s).
TABLE: tuple[Row, ...] = (
    Row(1, WIDE_N, Config(16, 64, 128, 4, 4), 0.899),  # 14.4 against 16.0 us, 3.52 TB/s
    Row(1, 0, Config(1, 8, 1024, 1, 4, dot=False), 0.810),  # 7.1 against 8.7 us, 2.37 TB/s
    Row(2, WIDE_N, Config(16, 64, 128, 4, 4), 0.896),  # 14.4 against 16.0 us, 3.53 TB/s
    Row(2, 0, Config(2, 8, 1024, 1, 4, dot=False), 0.776),  # 7.4 against 9.5 us, 2.29 TB/s
    Row(4, WIDE_N, Config(16, 64, 128, 4, 4), 0.911),  # 14.7 against 16.1 us, 3.46 TB/s
    Row(4, 0, Config(16, 64, 128, 4, 4, split=4), 0.853),  # 8.0 against 9.4 us, 2.09 TB/s
    Row(8, WIDE_N, Config(16, 64, 128, 4, 4, late=True), 0.911),  # 14.8 against 16.2 us, 3.44 TB/s
    Row(8, 0, Config(16, 64, 128, 4, 4, split=4), 0.856),  # 8.1 against 9.5 us, 2.08 TB/s
    Row(16, WIDE_N, Config(16, 16, 128, 4, 4, spread=2), 0.932),  # 14.4 against 15.5 us, 3.54 TB/s, 2026-12-04
    Row(16, 0, Config(16, 64, 128, 4, 4, split=4), 0.908),  # 7.9 against 8.7 us, 2.14 TB/s, 2026-12-04
    Row(32, WIDE_N, Config(32, 64, 128, 4, 4), 0.965),  # 15.2 against 15.8 us, 3.38 TB/s, 2026-12-04
    Row(32, 0, Config(32, 64, 128, 4, 4, split=4), 0.886),  # 8.5 against 9.6 us, 2.01 TB/s, 2026-12-04
    Row(64, WIDE_N, Config(64, 64, 64, 4, 4), 1.061),  # 16.9 against 16.0 us, 3.09 TB/s, 2026-12-04
    Row(64, 0, Config(64, 64, 128, 4, 4, split=4), 0.966),  # 9.6 against 9.9 us, 1.84 TB/s, 2026-12-04
)


def row_for(m: int, n: int) -> Row:
    for row in TABLE:
        if m <= row.max_m and n >= row.min_n:
            return row
    raise ValueError(f"no skinny-GEMM config for M = {m}, N = {n} (table up to M = {TABLE[-1].max_m})")


def config_for(m: int, n: int) -> Config:
    """The table's launch for an [m, K] x [n, K]^T call, its split cut to fit one program per SM (`fit`)."""
    return fit(row_for(m, n).cfg, m, n)


def row_tiles(cfg: Config, n: int) -> tuple[int, int]:
    """(programs along N, BN) of an n-row weight under `cfg`: N-tiles of cfg.bn rows, or spread x SMS row ranges."""
    if not cfg.spread:
        return -(-n // cfg.bn), cfg.bn
    programs = min(cfg.spread * SMS, n)
    return programs, max(cfg.bn, triton.next_power_of_2(-(-n // programs)))


def _bm(cfg: Config, m: int) -> int:
    """The token rows of a program: BM, or in the FMA form M itself up to BM."""
    return cfg.bm if cfg.dot else min(cfg.bm, triton.next_power_of_2(m))


def tiles(cfg: Config, m: int, n: int) -> int:
    """Output tiles (programs along N x along M) of an m x n output under `cfg`; the launch has split x as many."""
    return row_tiles(cfg, n)[0] * -(-m // _bm(cfg, m))


def fit(cfg: Config, m: int, n: int) -> Config:
    """`cfg` with its split cut so that the N-tiles x M-tiles x split programs of an m x n output are at most SMS."""
    split = max(1, min(cfg.split, SMS // tiles(cfg, m, n)))
    return cfg if split == cfg.split else replace(cfg, split=split)


def dispatched(m: int, n: int) -> bool:
    """Whether `op.linear` sends an [m, K] x [n, K]^T call here: the table's launch for it beat cuBLAS."""
    return 1 <= m <= TABLE[-1].max_m and row_for(m, n).vs_cublas < 1


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Every output comes from here (shapes only; tests swap it to poison outputs with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


_WORK: dict[tuple, tuple[Tensor, Tensor]] = {}  # (device, tiles, split, BN * BM) -> (fp32 partials, int32 counters)


def _workspace(device: torch.device, tiles: int, split: int, tile: int) -> tuple[Tensor, Tensor]:
    """The partials [tiles * split * tile] fp32 and the zeroed tickets [tiles] int32 of one split-K geometry,
    allocated on its first (eager) launch and kept: a captured graph holds their addresses, and the counters are
    left at zero by every launch."""
    key = (device, tiles, split, tile)
    hit = _WORK.get(key)
    if hit is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the split-K GEMM's workspace for {tiles} tiles x {split} slices is allocated by "
                               "its first launch, which must be eager: run this call once before capturing it")
        hit = _WORK[key] = (torch.empty(tiles * split * tile, dtype=torch.float32, device=device),
                            torch.zeros(tiles, dtype=torch.int32, device=device))
    return hit


@triton.jit
def gemm_kernel(
    x, w, y, ws, cnt,  # x [M, K] with row stride s_x; w [N, K] contiguous; y [M, N] contiguous; ws, cnt: _workspace
    M, N, K, s_x, k_slice,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr, SPLIT: tl.constexpr, SPREAD: tl.constexpr = False, PDL: tl.constexpr = False,
    LATE: tl.constexpr = False,
    cw=None, pool=None, slots=None, CONV_D: tl.constexpr = 0,  # the conv epilogue (`_conv_store`), CONV_D > 0
    w_desc=None, x_desc=None, TMA: tl.constexpr = False,  # TMA: the tiles through these descriptors (Config.tma)
):
    """Program (i_n, i_m, i_s): y[i_m*BM : +BM, i_n*BN : +BN] over K[i_s*k_slice : +k_slice] (k_slice: BK steps);
    SPLIT: the K-slices (the grid's third extent; 1: none); SPREAD: rows [i_n N / P, (i_n + 1) N / P) of the P =
    programs along N instead of i_n*BN : +BN; CONV_D > 0: output columns below CONV_D go through the one-token conv
    update (`_conv_store`) before they are stored."""
    dt = y.dtype.element_ty
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if SPLIT > 1:
        k_lo = i_s * k_slice
        k_hi = tl.minimum(K, k_lo + k_slice)
    else:  # static loop bounds: the unsplit loop compiles as before split-K existed (no stack at 5 stages)
        k_lo = 0
        k_hi = K
    o_m = i_m * BM + tl.arange(0, BM)
    o_k = k_lo + tl.arange(0, BK)
    if SPREAD:  # rows past the range are masked (they read nothing); the mask is constant along K: still vectorised
        n_lo = (i_n * N // tl.num_programs(0)).to(tl.int32)
        o_n = n_lo + tl.arange(0, BN)
        m_n = o_n < ((i_n + 1) * N // tl.num_programs(0)).to(tl.int32)
        r_n = o_n.to(tl.int64)
    else:
        o_n = i_n * BN + tl.arange(0, BN)
        m_n = o_n < N
        r_n = (o_n % N).to(tl.int64)  # wrapped weight rows: unmasked loads, the store drops them
    m_m = o_m < M  # masked token rows: at M = 1 of BM = 16, 15 rows read no memory
    # with PDL, an L2 prefetch of the program's first 256 weight columns before the wait made the decode step slower:
    # 133.7 / 204.1 us at N = 1 / 8 against 118.7 / 176.0 without it (H200, bench/results/2026-12-03-pdl-prefetch.md)
    if LATE:  # the next kernel launches once every program is past its K loop (Config.late)
        pdl.wait(PDL)
    else:
        pdl.enter(PDL)
    if DOT and TMA:  # rows past N (or past a range: masked at the store), tokens past M, K past K: zeros
        if SPREAD:
            n_0 = n_lo
        else:
            n_0 = i_n * BN
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            b_w = w_desc.load([n_0, k0])
            b_x = tl.trans(x_desc.load([i_m * BM, k0]))
            if IEEE:
                acc = tl.dot(b_w, b_x, acc, input_precision="ieee")
            else:
                acc = tl.dot(b_w, b_x, acc)
    elif DOT:
        p_w = w + r_n[:, None] * K + o_k[None, :]  # [BN, BK]
        p_x = x + o_m[None, :].to(tl.int64) * s_x + o_k[:, None]  # [BK, BM]
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            if EVEN_K:
                if SPREAD:
                    b_w = tl.load(p_w, mask=m_n[:, None], other=0.0)
                else:
                    b_w = tl.load(p_w)
                b_x = tl.load(p_x, mask=m_m[None, :], other=0.0)
            else:
                m_k = k0 - k_lo + o_k < K
                if SPREAD:
                    b_w = tl.load(p_w, mask=m_k[None, :] & m_n[:, None], other=0.0)
                else:
                    b_w = tl.load(p_w, mask=m_k[None, :], other=0.0)
                b_x = tl.load(p_x, mask=m_m[None, :] & m_k[:, None], other=0.0)
            if IEEE:
                acc = tl.dot(b_w, b_x, acc, input_precision="ieee")
            else:
                acc = tl.dot(b_w, b_x, acc)
            p_w += BK
            p_x += BK
    else:
        p_w = w + r_n[:, None, None] * K + o_k[None, None, :]  # [BN, 1, BK]
        p_x = x + o_m[None, :, None].to(tl.int64) * s_x + o_k[None, None, :]  # [1, BM, BK]
        prod = tl.zeros([BN, BM, BK], dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            if EVEN_K:
                b_w = tl.load(p_w)
                b_x = tl.load(p_x, mask=m_m[None, :, None], other=0.0)
            else:
                m_k = (k0 - k_lo + o_k < K)[None, None, :]
                b_w = tl.load(p_w, mask=m_k, other=0.0)
                b_x = tl.load(p_x, mask=m_m[None, :, None] & m_k, other=0.0)
            prod += b_w.to(tl.float32) * b_x.to(tl.float32)
            p_w += BK
            p_x += BK
        acc = tl.sum(prod, 2)  # [BN, BM]
    if LATE:
        pdl.release(PDL)
    p_y = y + o_m[None, :].to(tl.int64) * N + o_n[:, None]
    m_y = m_n[:, None] & m_m[None, :]
    if SPLIT > 1:
        tile = i_m * tl.num_programs(0) + i_n
        p_ws = ws + tile * SPLIT * (BN * BM) + tl.arange(0, BN)[:, None] * BM + tl.arange(0, BM)[None, :]
        tl.store(p_ws + i_s * (BN * BM), acc)
        tl.debug_barrier()  # every thread's partial is written before the ticket releases them
        ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            # slice order, not arrival order: the same sum at every launch. Unrolled over the constexpr count, so
            # the partials' loads are issued together: out_proj [2048, 4096] at M = 64 (BN 64, split 4) took 9.15
            # against 9.51 us with the loop over the runtime count, 7.89 against 8.08 at M = 16; without any
            # reduction (each program storing its own partial, not a GEMM) 7.24 and 6.62 (H200, 2026-12-04,
            # bench/results/2026-12-04-gemm-reduce.txt)
            for s in tl.static_range(SPLIT):
                acc += tl.load(p_ws + s * (BN * BM), cache_modifier=".cg")
            if CONV_D > 0:
                _conv_store(acc, p_y, m_y, o_n, o_m, m_n, m_m, cw, pool, slots, CONV_D)
            else:
                tl.store(p_y, acc.to(dt), mask=m_y)
            tl.atomic_xchg(cnt + tile, 0, sem="relaxed", scope="gpu")
    elif CONV_D > 0:
        _conv_store(acc, p_y, m_y, o_n, o_m, m_n, m_m, cw, pool, slots, CONV_D)
    else:
        tl.store(p_y, acc.to(dt), mask=m_y)


@triton.jit
def _conv_store(acc, p_y, m_y, o_n, o_m, m_n, m_m, cw, pool, slots, D: tl.constexpr):
    """Stores the projection tile acc [BN channels, BM tokens] (fp32) as y[o_m, o_n], its channels below D replaced
    by the one-token causal conv update of width 4 (the GDN conv: `causal_conv1d.triton.conv_update_kernel`'s
    one-token branch, the same operations in the same order): token m is sequence m, whose window is pool[slots[m]]
    [3, D] (oldest row first); y = silu(w[:, 3] x + sum_j w[:, j] h_j) with x the projection rounded to the
    activation dtype, as the unfused path stores it before the conv reads it; the window after the token,
    [h_1, h_2, x], is written back. Rows of slot -1 (padding) get y = 0 and touch no pool row. Each (slot, channel)
    belongs to one program (one token per sequence, distinct slots, no split of the epilogue), so no other program
    reads what this one writes. The other channels are stored first, so that acc is dead before the conv: compiled
    for sm_90 (CPU, 2026-12-04), in_proj's M = 64 launch takes 131 registers with it against 64 without (246 when the
    conv's result was merged into acc by a select), no spills."""
    dt = p_y.dtype.element_ty
    b_x = acc.to(dt)
    m_c = m_n & (o_n < D)
    tl.store(p_y, b_x, mask=m_y & (o_n >= D)[:, None])
    slot = tl.load(slots + o_m, mask=m_m, other=-1).to(tl.int64)
    live = m_c[:, None] & (slot >= 0)[None, :]
    row = pool + slot[None, :] * (3 * D) + o_n[:, None]  # history row 0 of each (channel, token)
    w_at = cw + o_n * 4
    h_0 = tl.load(row, mask=live, other=0.0)
    h_1 = tl.load(row + D, mask=live, other=0.0)
    h_2 = tl.load(row + 2 * D, mask=live, other=0.0)
    b_y = tl.load(w_at + 3, mask=m_c, other=0.0).to(tl.float32)[:, None] * b_x.to(tl.float32)
    b_y += tl.load(w_at, mask=m_c, other=0.0).to(tl.float32)[:, None] * h_0.to(tl.float32)
    b_y += tl.load(w_at + 1, mask=m_c, other=0.0).to(tl.float32)[:, None] * h_1.to(tl.float32)
    b_y += tl.load(w_at + 2, mask=m_c, other=0.0).to(tl.float32)[:, None] * h_2.to(tl.float32)
    b_y = b_y * tl.sigmoid(b_y)
    tl.debug_barrier()  # every read of the window precedes its overwrite
    tl.store(row, h_1, mask=live)
    tl.store(row + D, h_2, mask=live)
    tl.store(row + 2 * D, b_x.to(pool.dtype.element_ty), mask=live)
    tl.store(p_y, tl.where((slot >= 0)[None, :], b_y, 0.0).to(dt), mask=m_y & (o_n < D)[:, None])


def launch(x: Tensor, w: Tensor, cfg: Config, conv: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
    """x [M, K] (unit stride along K), w [N, K] contiguous -> y [M, N] in x's dtype, with launch `cfg`.
    conv = (weight [D, 4], pool [S, 3, D], slots int32 [M]), all contiguous, D <= N: the columns below D leave
    through the one-token conv update of `_conv_store` (token m is sequence m), which writes the window after the
    token to pool[slots[m]]; the caller checks them (`op.linear_conv`)."""
    cfg.check()
    M, K = x.shape
    N = w.shape[0]
    y = _new((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        if conv is not None:  # the conv update would be skipped and the pool left behind: no such projection exists
            raise ValueError("a projection with the conv in its epilogue needs K >= 1")
        return y.zero_()
    bm = _bm(cfg, M)
    k_slice = triton.cdiv(triton.cdiv(K, cfg.split), cfg.bk) * cfg.bk  # whole BK steps; only the last may be short
    split = triton.cdiv(K, k_slice)  # non-empty slices
    n_programs, bn = row_tiles(cfg, N)
    grid = (n_programs, triton.cdiv(M, bm), split)
    ws = cnt = y
    if split > 1:
        ws, cnt = _workspace(x.device, grid[0] * grid[1], split, bn * bm)
    if cfg.tma and cfg.bk * x.element_size() > 128:
        raise ValueError(f"TMA tiles of {cfg.bk} {x.dtype} columns exceed 128 bytes: {cfg}")
    tma = {}
    if cfg.tma and _tma_ok(x) and _tma_ok(w):  # else the pointer loads (a misaligned view): the same results
        tma = dict(w_desc=TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, cfg.bk]),
                   x_desc=TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, cfg.bk]), TMA=True)
    gemm_kernel[grid](x, w, y, ws, cnt, M, N, K, x.stride(0), k_slice, BM=bm, BN=bn, BK=cfg.bk,
                      EVEN_K=K % cfg.bk == 0, DOT=cfg.dot, IEEE=x.dtype == torch.float32, SPLIT=split,
                      SPREAD=cfg.spread > 0, LATE=cfg.late, num_warps=cfg.warps, num_stages=cfg.stages,
                      **({} if conv is None else dict(cw=conv[0], pool=conv[1], slots=conv[2],
                                                      CONV_D=conv[0].shape[0])),
                      **tma, **pdl.options(x.device))
    return y


def _tma_ok(t: Tensor) -> bool:
    """A TMA descriptor's rules for a 2D operand: 16-byte aligned base and row stride, unit column stride."""
    e = t.element_size()
    return t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * e) % 16 == 0


def linear(x: Tensor, w: Tensor) -> Tensor:
    """y = x w^T, x [M, K] (M <= the table's largest bound), w [N, K] -> [M, N] (the Triton entry of naive.linear)."""
    return launch(x, w, config_for(x.shape[0], w.shape[0]))
