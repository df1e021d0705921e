"""Triton entry points of the gated delta rule: same names, arguments and semantics as `naive.py`.

`recurrent` / `recurrent_stash` run `triton_recurrent.gdn_recurrent_kernel` (one launch); `chunked` runs the passes
of `triton_intra` (solve, w/u) and `triton_chunked` (state, output). All of them are CUDA-graph safe: they read no
tensor data on the host (only shape and dtype checks), allocate only buffers sized from shapes, and launch on the
current stream (a long prefill's state pass in windows on a side stream that forks from it and joins it again:
`_pipeline`). q, k, v, a, b may be strided views (column slices of one projection): the kernels take their row and
head strides; only a last dimension that is not contiguous is copied first (`_unit_stride`, never the case for
projection slices).

Activations in bf16/fp16 use tensor-core dots on operands of that dtype (FLA's precision choices,
docs/math.md#chunked-form-prefill). The recurrent kernel has no dot (fp32 FMAs throughout). The chunked passes on fp32
activations run the dots of the w/u, state and output passes as 3xTF32 (`Tuning.fp32_dot`: three TF32
tensor-core products per dot, about fp32's accuracy) and those of the solve in IEEE fp32 (`Tuning.fp32_solve_dot`),
the cheaper to compile for each (see Tuning).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import triton
from torch import Tensor
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import pdl
from ..packing import Capture, Packing
from . import gluon_state
from .io import GdnInputs
from .triton_chunked import BC, BT, gdn_chunk_out_kernel, gdn_chunk_state_kernel
from .triton_intra import gdn_chunk_intra_kernel, gdn_chunk_wu_kernel
from .triton_recurrent import gdn_decode_persist_kernel, gdn_recurrent_kernel


@dataclass(frozen=True)
class Tuning:
    """Launch parameters. Defaults: the winners of the sweeps and variant runs of bench/kernels.py on the H200
    (bench/results/2026-12-02-kernels.md, 2026-12-03-kernels-variants.md)."""

    rec_bv: int = 64  # V-tile of the recurrent kernel: NV = V / rec_bv programs per (sequence, head)
    rec_warps: int = 2
    # Few sequences: at N = 1 the tile above gives 2 x 32 programs on 132 SMs and the step is bound by the latency
    # of one program, so a 16-wide tile on one warp (8x the programs) takes over while the tile above gives fewer
    # than `rec_few_below` programs (`_rec_tiling`). Decode at N = 1 / 2 / 4 / 8 / 16: 3.69 / 4.65 / 6.32 / 12.07 /
    # 21.6 us in 16 x 1, against 5.40 / 5.55 (32 x 2) / 7.29 (32 x 2) / 12.03 / 22.5 (32 x 2); at N = 64, 83.3 us
    # against 76.4 in 64 x 2 (H200, 2026-12-03-kernels-variants.md).
    rec_bv_few: int = 16
    rec_warps_few: int = 1
    rec_few_below: int = 2048
    rec_stream: bool = True  # evict-first state loads and streaming stores (swept in bench/kernels.py)
    # Many sequences: > 0 runs a program's rec_bv columns as sub-tiles of this width, and a one-token sequence's
    # sub-tiles in a loop that Triton software-pipelines over `rec_sub_stages` (the next sub-tiles' state loads go
    # to shared memory by cp.async while the current one is reduced, updated and stored). At N = 64 / 256 the
    # 64 x 2 tile reached 82.7 / 88.7 % of the copy rate where the same grid moving only the state reached 93.9 /
    # 96.6 %: the step's compute between a tile's load and its store holds the program's registers with no load in
    # flight (H200, 2026-12-03-kernels-variants.md). 0: one tile. Timed slower: the best sub-tiling (128 x 4 warps,
    # 32-wide, 3 stages) 77.2 / 292.2 us against the tile's 76.8 / 283.7 at N = 64 / 256 (2026-12-03-kernels-round2.md).
    rec_sub: int = 0
    rec_sub_stages: int = 3
    # The state tile loaded and stored by the Hopper tensor-memory accelerator (TMA: one bulk copy per tile through
    # shared memory, from a host-side descriptor of the pool as [S * HV, K, V]; the slot picks the row), in one
    # tile or in the sub-tiles above (their loads pipelined over rec_sub_stages). Many / few sequences; used where
    # the GPU has TMA (sm_90+) and V * 4 is a multiple of 16. Timed slower in every form: N = 64 / 256 in 64 x 2
    # 89.6 / 336.6 us against the plain tile's 76.6 / 284.0, in sub-tiles at best 80.4 / 297.9 (64 x 2 by 16, 128 x
    # 4 by 32); N = 1 in 16 x 1 4.18 against 3.80 us (H200, 2026-12-03-kernels-decode.md). The tile lands in shared
    # memory and is read back into as many registers as the plain load fills (255), so no more programs fit per SM.
    rec_tma: bool = False
    rec_tma_few: bool = False
    # > 0: each program of the many-sequence tile (one tile, no TMA) bulk-prefetches into L2 the state that the
    # program this many places later in launch order will load (`triton_recurrent.prefetch_ahead`), so DRAM reads
    # run ahead of the programs resident on an SM, L2 holding the distance. Timed: 512 ahead 78.5 / 280.3 us at N =
    # 64 / 256 against 76.6 / 284.0; 1024 and 2048 ahead 89.1 / 356.0 and 87.7 / 364.5 (32-64 MB ahead against the
    # 50 MB L2: lines evicted before use; H200, 2026-12-03-kernels-decode.md).
    rec_ahead: int = 0
    # > 0: a register cap per thread for the many-sequence tile (ptxas .maxnreg). The DRAM reads a program keeps in
    # flight are its state tile, and the programs resident on an SM are bound by registers (65536 per SM, in steps
    # of 256 per warp): the 64 x 2 tile at 255 registers fits 4 programs (128 KB of state in flight per SM), capped
    # at 200 it fits 5 (160 KB; 64 B spilled, sm_90 compile). The grid moving only the state fits 5 programs of the
    # 64 x 2 tile (196 registers) and reaches 93.9 / 96.8 % of the copy rate at N = 64 / 256.
    rec_maxnreg: int = 0
    # the output from the updated tile (o = S'^T q, one reduction after the update) instead of from the loaded tile
    # beside S^T k: the q slice of the thread's 32 rows is then not live beside the k slice and the tile (the one-tile
    # path; `triton_recurrent.token_steps`): with rec_maxnreg = 200 the 64 x 2 tile spills 8 B instead of 64, the
    # 32 x 1 tile none (10 programs per SM)
    rec_q_after: bool = False
    # The first token's q, k, v, a, b loaded before the state tile (`gdn_recurrent_kernel`'s QKV_FIRST, the one-tile
    # path without TMA or rec_ahead), instead of the tile first and the operands behind its 32 KB. Under ncu (which
    # flushes the caches between passes) the tile-first kernel at N = 64 had 3628 of its 8011 stall samples on the q, k,
    # a loads' first uses (the layout conversion of q, k and the gate's exp) and none on the tile's
    # (2026-12-04-ncu-decode-source.txt): the step waited on the small operands and then reduced. Operands first, they
    # come back while the tile streams in. The kernel alone, two and three rounds (H200,
    # 2026-12-04-decode-qkv-first.md): N = 1 3.34-3.37 against 3.58-3.64 us, N = 8 10.55-10.90 against 10.24-10.42
    # (slower), N = 64 70.0-70.5 against 72.6-73.2 (3.83 TB/s, the grid moving only the state 67.2), N = 256 269.6-271.1
    # against 276.2-282.1. With PDL the wait comes before the tile's load, which no longer overlaps the previous kernel;
    # the decode step still gained at every N (4 Qwen3-Next layers, union of two runs): 117.8-118.5 against 116.9-119.1
    # us at N = 1, 168.2-168.8 against 169.1-171.0 at N = 8, 428.0-429.7 against 445.4-446.3 at N = 64, 1290.9-1292.1
    # against 1325.3-1326.2 at N = 256. Also timed then, not kept: the tile first with the operands' lines prefetched
    # into L1 before it (`prefetch.global.L1`): 73.3 / 278.5 us at N = 64 / 256, 3.80 at N = 1. Beside qkv-first, N = 64
    # / 256: column chunks of 32 70.1 / 269.6, q after 70.1 / 269.5, 64 x 4 warps 70.2 / 269.0, capped at 200 registers
    # 70.8 / 272.5, 32 x 1 72.1 / 278.6, 128 x 4 72.9 / 274.2; N = 1: 8 x 1 3.55, 16 x 2 3.76, 32 x 1 4.45 us.
    rec_qkv_first: bool = True
    # > 0: the many-sequence tile held as [rec_bv / rec_chunk, K, rec_chunk] (column chunks of this width; the
    # one-tile path without TMA). Triton lays a 2-D [128, 64] tile of 2 warps as 32 rows x 4 columns per thread, so
    # each thread also holds 32 values of k and of q; in 16-wide chunks it holds 8 rows x 4 chunks x 4 columns and 8
    # values of each (a reduced step compiled for sm_90: 168 registers against 203)
    rec_chunk: int = 0
    # > 0: the many-sequence tile without stash on a persistent grid of this many programs per SM, each walking the
    # (V-tile, head, sequence) items in a loop Triton software-pipelines over `rec_persist_stages` (the next items'
    # state tiles go to shared memory by cp.async while this one steps: `triton_recurrent.gdn_decode_persist_kernel`);
    # rec_persist_kh: the tile as two K-halves, two loads; rec_persist_pairs: 2-byte q, k, v, a, b read as 4-byte
    # words (a load of 2 bytes a thread stays synchronous in the pipelined loop). 0: one program per item. Timed
    # slower (H200, 2026-12-03-kernels-persist.md, -persist2.md; N = 64 / 256): best 3/SM, 64 x 2, 3 stages 75.2 /
    # 278.2 and 76.2 / 276.5 us (with word reads 74.7 / 280.6) against the default's 73.5 / 277.7 and 73.6 / 276.5
    # in the same runs; at 3/SM, 64 KB of shared memory and 255 registers a program, one SM's item rate is the
    # default's (2.42 against 2.37 us per 64 KB item at N = 64), and the grid has a tail of its own (10.3 items a
    # program, the longest 11). Fewer programs per SM are latency-bound (1/SM: 126 us at N = 64). With the tile
    # through TMA into the loop's shared-memory ring and the packing read before the loop (commit c221c99,
    # 2026-12-04-kernels-tma-pre.md): best 2/SM, 64 x 4, 3 tiles in flight each, 78.4 / 296.1 against 73.3 / 277.7.
    rec_persist: int = 0
    rec_persist_stages: int = 2
    rec_persist_kh: bool = False
    rec_persist_pairs: bool = False
    solve_warps: int = 1  # the latency-bound triangular solve: few warps keep its reductions inside a warp
    solve_bk: int = 32  # K-slice of the k k^T accumulation in the solve pass (registers of a 1-2 warp program)
    solve_share: bool = True  # one solve program per key head for its G value heads (k k^T computed once)
    # w and u formed in the solve's program from (I + A)^-1 in registers (one launch, T never in memory), BD columns
    # at a time, instead of a second launch that reads T back (`gdn_chunk_wu_kernel`, wu_warps). Off: on the
    # solve's one warp the w/u half runs at a fraction of the bandwidth of its own launch, then on 8 warps (T = 16384:
    # fused 1173 us in all, 582 of them in the fused pass; unfused 971 us, solve 174 + w/u 194; H200, 2026-12-03).
    fuse_wu: bool = False
    fuse_bd: int = 64
    # > 0: the w/u pass loops over 64-wide K and V slices at run time, software-pipelined with this many stages
    # (FLA's recompute_w_u form, whose autotuner picks 4 warps and 3 stages at Qwen3-Next's shapes); 0: K in one
    # tile, V slices unrolled. The pass alone (bench/passes.py, H200, 2026-12-04-passes-wu.md), T = 4096 / 16384:
    # 3 stages on 4 warps 44.0 / 170.5 us, 4 stages 44.5 / 171.2, on 8 warps 50.1 / 187.9, on 2 warps 49.9 / 195.4,
    # 2 stages 48.4-56.6 / 190.9-221.8; the unrolled form on 8 warps 49.9 / 190.9 (FLA's 41.1 / 160.6). The whole
    # prefill 241.2 / 900.7 against 247.8 / 916.0. (Timed before on 8 warps only, where it lost: 2 stages 994
    # against 971.7 us at T = 16384, 2026-12-03-kernels-round2.md.)
    wu_warps: int = 4
    wu_stages: int = 3
    state_bv: int = 32  # V-tile of the sequential state pass (its parallelism for one long sequence)
    state_warps: int = 4
    # 4 stages: the same time in the sweep, but 238 KB of shared memory with fp32 activations at K=128 (227 KB max)
    state_stages: int = 3
    # Many sequences (varlen): the state pass then has programs to spare and is bound by throughput, not by the
    # latency of one sequence's chunk chain. A 64-wide V-tile halves the re-reads of k and w, and 2 stages (96 KB
    # of shared memory in bf16) let two programs share an SM: 16 x 1024 tokens took 1010 us against 1154 us with
    # the single-sequence tiling (bench/kernels.py --sweep varlen, H200, 2026-12-02). Used when the single-sequence
    # tiling has more programs than the GPU has SMs (`_state_tiling`); for one long sequence the 64-wide tile
    # halves the parallelism instead (1197 vs 1055 us at T = 16384).
    state_bv_many: int = 64
    state_stages_many: int = 2
    # the state as two 64-row halves (K <= 128) with each product split the same way, FLA's chunk_delta_h form
    # (its state pass took 311 us at T = 16384 against our 352, H200, 2026-12-03): compiled for sm_90 the loop
    # body then has FLA's shared-memory traffic and 174 registers against 220. Timed: slower for one sequence
    # (991.7 against 971.7 us at T = 16384), faster for many (901.4 against 917.6 us for 16 x 1024; H200,
    # 2026-12-03-kernels-round2.md).
    state_kb: bool = False
    # the same for the many-sequence tiling (`_state_tiling`), where it won: 901.4 against 917.6 us for 16 x 1024
    # (H200, 2026-12-03-kernels-round2.md: `state_kb` there, which for 16 x 1024 takes this tiling, 64 wide in 2
    # stages, so the same launch as this default). Compiled for sm_90 (Triton 3.9) its spill stack is 40 B against
    # 120 B in one block.
    state_kb_many: bool = True
    # w and u never formed: the state pass forms v_new = u - w S = T (diag(beta) v - diag(beta e^gamma / |k|) k S)
    # from T = (I + A)^-1, v and b itself (`triton_chunked.state_chunk_wy`; in the K-halves form with state_kb /
    # state_kb_many), so the w/u launch goes (the tiling taken decides: `state_wy` for the single-sequence one,
    # `state_wy_many` for the many-sequence one). Bytes at T = 16384 (bf16, Qwen3-Next heads): the w/u pass moves
    # 541 MB (T 67, k 67, v 134 read; w, u 134 each written) in 192 us, 2.8 TB/s; the state pass reads w and u
    # (268 MB) where this form reads T and v (201 MB), so the prefill moves 1.56 GB instead of 2.17. The cost: one
    # [BT, BT] x [BT, BV] product more per chunk on the state pass's sequential chain (352 us for one sequence,
    # 1.37 us per chunk). Timed (H200, 2026-12-03-kernels-final.md, one run): for many sequences the longer chain
    # is hidden by the other sequences' programs and the saved pass shows: 16 x 1024 in 738.6 us against 888.5 (with
    # state_bv 16 736.3, with state_kb 737.0; in one block 752.0), so on for the many-sequence tiling. For one
    # sequence the chain is the critical path: T = 16384 1201.6 against 961.0 us (state_bv 16 1164.3, 8 warps
    # 1268.2, K halves 1192.5), so off there.
    state_wy: bool = False
    state_wy_many: bool = True
    # The state pass's chunk-loop bounds broadcast from lane 0 (`triton_chunked.warp_uniform`), so that ptxas keeps
    # the loop's wgmma descriptors in uniform registers (no R2UR before each wgmma; loop body 533 against 591
    # instructions at sm_90, FLA's 481). The state pass alone at T = 4096 / 16384 / 16 x 1024: 90.7 / 347.6 / 291.5
    # us against 92.6 / 354.9 / 314.2 without (H200, 2026-12-04-passes-uni.md; FLA's chunk_delta_h at 4096 and
    # 16384, same config, 82.3 / 308.2). False: the loop as before.
    # Timed and taken out (commit 213e0d9): the full chunks in loops of their own without row masks (loop body
    # 444 instructions): the state pass 91.9 / 346.3 / 303.6 us against 90.3 / 346.2 / 287.8 at T = 4096 / 16384 /
    # 16 x 1024 (2026-12-04-passes-full.md). The loop is not bound by its instruction count: under ncu
    # (2026-12-04-ncu-stalls.txt) each of its 4 warps has a scheduler of its own and issues every 4.45 cycles,
    # waiting on fixed-latency dependencies (1.08 cycles an instruction), the 9 CTA barriers a chunk (0.92), global
    # loads (0.64) and shared memory (0.63); FLA's loop has the same 9 barriers and 16 wgmmas (docs/architecture.md
    # has the tilings timed against it).
    state_uniform: bool = True
    # The state pass as a pipeline of windows of chunks (`_windows`, `_pipeline`). One long sequence's state pass
    # is a chain of 1.37 us per chunk on 128 programs, one per SM (352 of the 971 us at T = 16384, H200,
    # 2026-12-03-kernels-round2.md), while the chunk-parallel passes wait for it or it for them. In windows, the
    # solve and w/u of window i + 1 run beside the state pass of window i (on a second stream, of higher priority
    # with `state_pipe_high`), and the output pass of window i beside the state pass of window i + 1.
    # `state_pipe`: windows at most for the single-sequence tiling, `state_pipe_many` for the many-sequence one (1:
    # one launch of each pass, in turn); a window spans `state_pipe_chunks` chunks at least.
    # Timed (H200, 2026-12-04-prefill-pipe.md, -prefill-out.md): at T = 4096 / 16384 / 65536, one launch each
    # 247.1 / 959.2 / 3898.1 us; 2 windows 274.5 / 916.8 / 3616.3; 4 windows 380.3 / 956.6 / 3568.3; 8 windows
    # 637.4 / 1033.1 / 3662.6; with windows of 128 chunks at least (so 1 / 2 / 4 windows) 247.2 / 917.0 / 3567.4,
    # the default. The state pass's programs share their SMs with the other passes' programs while they overlap,
    # and their chain slows (small windows lose); the stream priority changed nothing (379.1 against 380.3 us at
    # 4096). Many sequences: 16 x 1024 771.6 / 796.8 us in 2 / 4 windows against 756.2 in one (their state pass
    # has programs to spare already). Also timed and taken out: the output pass's products done by the state
    # pass's programs (h and v_new never stored), 1338.7 against 959.2 us at T = 16384: the chain took them on.
    # And the output pass beside the state pass in one window, each chunk handed over by a count per chunk and key
    # head (commits c221c99, 3ac1dc3, 2026-12-04-kernels-state-out-*.md): 348.6-416.8 against 246.7 us at T = 4096,
    # the chain 2.2-2.9x slower: the barrier before each count kept Triton from pipelining the chunk loop's loads
    # (117 -> 28 KB of shared memory at sm_90). Without a barrier (commits 6235b19-8d9f1b3, -state-out-{rel,warp,
    # order,late,group}.md), the output grid chunks-slowest, a count per warp: the pair drew level with the two
    # passes in turn (153.0 against 152.3 us at T = 4096, the output all hidden), but the counts alone slowed the
    # chain (the state pass 141.6-145.3 against 92 with a fence a chunk, 121.9 with one every 8); the best prefill,
    # 4 chunks a count, 240.8 against 246.9 at 4096 and 917.3 against 916.8 at 16384. With the counts behind a
    # branch taken on group boundaries only (commits 13e4217, d409d19, -state-out-branch.md): the state pass alone
    # 107.8 us with 8 chunks a count against 92.7 without, the pair 146.4 against 152.4 in turn, the best prefill
    # 243.9 against 248.0 at 4096 and 925.1 against 916.0 at 16384: a few us, not the 1.2x.
    state_pipe: int = 4
    state_pipe_many: int = 1
    state_pipe_chunks: int = 128
    state_pipe_high: bool = True
    # The state pass in Gluon (`gluon_state`, sm_90, bf16 / fp16, K = 128, the single-sequence tiling in 32-wide
    # V-tiles without K halves or WY): TMA loads two chunks ahead, h and v_new stored by TMA from the shared-memory
    # copies the wgmmas read, each wgmma waited for where its result is used; outputs equal to the Triton pass's bit
    # for bit. A launch outside that scope (and the AOT plugins): `gdn_chunk_state_kernel`. Measured (H200,
    # 2026-12-04, bench/results/2026-12-04-passes-gluon-split.md), the pass alone at T = 4096 / 16384 / 65536
    # 70.9 / 272.4 / 1066.0 us against the Triton pass's 90.3 / 345.6 / 1343.9 (FLA's chunk_delta_h 82.6 / 309.2),
    # the whole prefill 218.7 / 818.2 / 3223.0 against 239.7 / 899.3 / 3501.0 (FLA 271.8 / 1022.6 / 4140.2).
    state_gluon: bool = True
    out_bv: int = 128
    out_warps: int = 4
    # 1 / |q| per row computed in pass 1 (from q loads beside its k loads, off the solve's dependent chain) and
    # stored ([T, H] fp32, 1 MB at T = 16384), so the output pass loads it instead of reducing its q tile (that
    # reduction took the pass from 212 to 251 us, H200, 2026-12-03-kernels-variants.md). Timed: 961.8 against
    # 971.7 us at T = 16384 and 906.0 against 917.6 us for 16 x 1024 (H200, 2026-12-03-kernels-round2.md).
    rq_first: bool = True
    # dot precisions of the chunked passes on fp32 activations. IEEE dots are lowered to unrolled FMA loops: at
    # K = V = 128 the output pass took 72-105 s to compile under Triton 3.9 (G = 2, 3) and 282 s under 3.6 (G = 3),
    # with 20-39 KB of spilled stack per thread, which made the fp32 prefill GPU tests run for minutes. 3xTF32
    # (three TF32 tensor-core products per dot, fp32-level accuracy) compiles it in 8-12 s; the solve's 16 x 16
    # block products are the other way round (ieee 11-20 s, tf32x3 36-43 s). Figures: bench/results/2026-12-02-aot.md.
    fp32_dot: str = "tf32x3"  # w/u, state and output passes
    fp32_solve_dot: str = "ieee"  # the triangular solve

    def single_sequence_tiling(self) -> Tuning:
        """This tuning with the state pass in its single-sequence tiling whatever the sequence count, its windows
        included (for the sweeps that time that tiling and the sm_90 compile check)."""
        return replace(self, state_bv_many=self.state_bv, state_stages_many=self.state_stages,
                       state_kb_many=self.state_kb, state_wy_many=self.state_wy, state_pipe_many=self.state_pipe)


TUNING = Tuning()

_DOT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Every output and scratch buffer comes from here (shapes only; tests swap it to poison them with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _uniform(tuning: Tuning) -> bool:
    """The state kernel's UNI: `Tuning.state_uniform` where kernels may carry inline PTX (not under the
    interpreter), for the JIT launch and the AOT plan alike."""
    return tuning.state_uniform and pdl.ptx_allowed()


def _unit_stride(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _operands(x: GdnInputs) -> tuple[Tensor, ...]:
    return tuple(_unit_stride(t) for t in (x.q, x.k, x.v, x.a, x.b))


def _check_fp32(name: str, t: Tensor) -> None:
    if t.dtype != torch.float32 or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous fp32 tensor for the Triton kernels, got {t.dtype} "
                         f"(contiguous={t.is_contiguous()})")


def _check(x: GdnInputs, pack: Packing, ssm_pool: Tensor) -> None:
    x.check(pack, ssm_pool)
    _check_fp32("ssm_pool", ssm_pool)
    if x.q.dtype not in _DOT_DTYPES:
        raise ValueError(f"the Triton kernels take fp32, bf16 or fp16 activations, got {x.q.dtype}")


def recurrent(x: GdnInputs, pack: Packing, ssm_pool: Tensor) -> Tensor:
    """DECODE / DECODE_MULTI_SEQ: returns o [T, HV, V]; ssm_pool[slot] updated in place."""
    return launch_recurrent(x, pack, ssm_pool, None, TUNING)


def recurrent_stash(x: GdnInputs, pack: Packing, ssm_pool: Tensor, ssm_stash: Tensor) -> Tensor:
    """DECODE_BATCHED / VERIFY_MULTI: pool read only; state after token t written to ssm_stash[t]."""
    if tuple(ssm_stash.shape) != (x.num_tokens, *x.state_shape):
        raise ValueError(f"ssm_stash must be [{x.num_tokens}, {', '.join(map(str, x.state_shape))}], "
                         f"got {tuple(ssm_stash.shape)}")
    _check_fp32("ssm_stash", ssm_stash)
    return launch_recurrent(x, pack, ssm_pool, ssm_stash, TUNING)


def launch_recurrent(x: GdnInputs, pack: Packing, ssm_pool: Tensor, ssm_stash: Tensor | None,
                     tuning: Tuning) -> Tensor:
    _check(x, pack, ssm_pool)
    q, k, v, a, b = _operands(x)
    T, H, K = q.shape
    HV, V = v.shape[1:]
    N = pack.num_seqs
    o = _new((T, HV, V), q.dtype, q.device)
    if N == 0 or T == 0:
        return o
    BV, warps = _rec_tiling(tuning, V, HV * N)
    sub = tuning.rec_sub if 0 < tuning.rec_sub < BV else 0
    BK = triton.next_power_of_2(K)
    pool = ssm_pool
    few = _rec_few(tuning, V, HV * N)
    tma = tuning.rec_tma_few if few else tuning.rec_tma
    NV = triton.cdiv(V, BV)
    ahead = tuning.rec_ahead if not few and not sub and (K * V) % (4 * NV) == 0 and _has_tma(ssm_pool.device) else 0
    strides = (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *a.stride(), *b.stride())
    if tuning.rec_persist > 0 and not few and ssm_stash is None and not sub and not tma and ssm_pool.shape[0] > 0:
        items = NV * HV * N
        gdn_decode_persist_kernel[(min(items, _sm_count(q.device) * tuning.rec_persist),)](
            q, k, v, a, b, x.A_log, x.dt_bias, o, ssm_pool, pack.cu_seqlens, pack.slots, *strides, K ** -0.5, items,
            H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, STREAM=tuning.rec_stream, STAGES=tuning.rec_persist_stages,
            KH=tuning.rec_persist_kh and BK >= 2, PAIRS=tuning.rec_persist_pairs and _word_pairs(q, k, v, a, b, BK),
            num_warps=warps)
        return o
    if tma and _has_tma(ssm_pool.device) and V % 4 == 0 and ssm_pool.data_ptr() % 16 == 0:
        pool = TensorDescriptor(ssm_pool.view(-1, K, V), [ssm_pool.numel() // (K * V), K, V], [K * V, V, 1],
                                [1, BK, sub or BV])
    gdn_recurrent_kernel[(NV, HV, N)](
        q, k, v, a, b, x.A_log, x.dt_bias, o, pool, ssm_pool if ssm_stash is None else ssm_stash,
        pack.cu_seqlens, pack.slots, *strides, K ** -0.5,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, STASH=ssm_stash is not None,
        STREAM=tuning.rec_stream, SUB=sub, SUB_STAGES=tuning.rec_sub_stages, TMA=pool is not ssm_pool,
        AHEAD=0 if pool is not ssm_pool else ahead, Q_AFTER=tuning.rec_q_after,
        # sub-tiles, TMA and the prefetch ahead are forms of the tile-first path: they take it
        QKV_FIRST=tuning.rec_qkv_first and not sub and pool is ssm_pool and not ahead,
        CH=tuning.rec_chunk if not few and not sub and pool is ssm_pool and 0 < tuning.rec_chunk < BV else 0,
        num_warps=warps, **pdl.options(q.device),
        **({"maxnreg": tuning.rec_maxnreg} if tuning.rec_maxnreg and not few else {}),
    )
    return o


def _word_pairs(q: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor, BK: int) -> bool:
    """Whether the persistent decode kernel may read the 2-byte q, k, v, a, b as aligned 4-byte words: every base
    4-byte aligned, every row and head stride even, K, V and HV even, unit head stride for the gates (`PAIRS` of
    triton_recurrent.gdn_decode_persist_kernel)."""
    return (q.element_size() == 2 and all(t.data_ptr() % 4 == 0 for t in (q, k, v, a, b))
            and all(s % 2 == 0 for t in (q, k, v) for s in t.stride()[:2]) and a.stride(1) == b.stride(1) == 1
            and a.stride(0) % 2 == 0 and b.stride(0) % 2 == 0
            and q.shape[2] % 2 == 0 and v.shape[2] % 2 == 0 and v.shape[1] % 2 == 0 and BK >= 4)


def _rec_few(tuning: Tuning, V: int, sequence_heads: int) -> bool:
    """Whether the recurrent kernel takes its few-sequence tiling (see Tuning)."""
    return triton.cdiv(V, min(tuning.rec_bv, triton.next_power_of_2(V))) * sequence_heads < tuning.rec_few_below


def _rec_tiling(tuning: Tuning, V: int, sequence_heads: int) -> tuple[int, int]:
    """(V-tile, warps) of the recurrent kernel, whose grid is V-tiles x value heads x sequences (see Tuning)."""
    if _rec_few(tuning, V, sequence_heads):
        return min(tuning.rec_bv_few, triton.next_power_of_2(V)), tuning.rec_warps_few
    return min(tuning.rec_bv, triton.next_power_of_2(V)), tuning.rec_warps


@functools.cache
def _has_tma(dev: torch.device) -> bool:
    # off CUDA: the interpreter runs descriptors, and the sm_90 compile check records them as the H200 runs them
    return dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] >= 9


H200_SMS = 132


@functools.cache
def _sm_count(dev: torch.device) -> int:
    # Off CUDA the kernels run in the interpreter or are recorded for sm_90 (plugins/triton_aot.py): tile as on the
    # H200. Cached: the launch stays free of driver queries (CUDA-graph capture, host time per step).
    if dev.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(dev).multi_processor_count


def _v_tile(want: int, V: int) -> int:
    """A V-tile of the chunked passes: `want` wide at most, no wider than V's power of two, 16 at least (tl.dot)."""
    return min(want, max(16, triton.next_power_of_2(V)))


class StateTiling(NamedTuple):
    bv: int  # V-tile
    stages: int
    kb: bool  # the state as two 64-row halves (Tuning.state_kb)
    wy: bool  # v_new from T, v and b, no w/u pass (Tuning.state_wy)
    pipe: int = 1  # windows of the pipeline at most (Tuning.state_pipe)


def _state_tiling(tuning: Tuning, V: int, sequence_heads: int, dev: torch.device) -> StateTiling:
    """The state pass's tiling, whose grid is V-tiles x value heads x sequences: the many-sequence one when the
    single-sequence one has more programs than the GPU has SMs (see Tuning)."""
    bv = _v_tile(tuning.state_bv, V)
    if triton.cdiv(V, bv) * sequence_heads > _sm_count(dev):
        return StateTiling(_v_tile(tuning.state_bv_many, V), tuning.state_stages_many, tuning.state_kb_many,
                           tuning.state_wy_many, tuning.state_pipe_many)
    return StateTiling(bv, tuning.state_stages, tuning.state_kb, tuning.state_wy, tuning.state_pipe)


def _windows(pipe: int, min_chunks: int, T: int, n_chunks: int) -> list[tuple[int, int]]:
    """The pipeline's windows of global chunk indices [lo, hi), from shapes only: `pipe` at most, `min_chunks`
    chunks at least, sized by the C = T / BT chunks of the packed tokens, none empty; the last one runs to the bound
    `n_chunks` >= C (chunks of several sequences and capture cuts may number up to T / BT + 2 N)."""
    chunks = triton.cdiv(T, BT)
    size = max(1, triton.cdiv(chunks, max(1, min(pipe, chunks // max(1, min_chunks)))))
    count = max(1, triton.cdiv(chunks, size))  # windows of `size` chunks past C would start after the bound
    bounds = [i * size for i in range(count)] + [n_chunks]
    return list(zip(bounds[:-1], bounds[1:]))


@functools.cache
def _side_stream(dev: torch.device, high: bool) -> torch.cuda.Stream:
    # one per device and priority, created once (a stream created per call would cost a driver call per prefill)
    return torch.cuda.Stream(dev, priority=-1 if high else 0)


def _pipeline(windows: list[tuple[int, int]], first, state, out, dev: torch.device, high: bool) -> None:
    """Run the passes over the windows: `first(lo, hi)` (solve, w/u) and `out(lo, hi)` on the current stream,
    `state(lo, hi)` after its window's first pass and the previous window's state pass, on a side stream where
    there are several windows on a GPU. Every buffer was allocated on the current stream before, and the current
    stream waits for each window's state pass before that window's output pass, so by the return it has waited for
    all of them and nothing the side stream uses is freed or reused early; in a CUDA-graph capture the side stream
    forks from and joins the captured one."""
    if len(windows) == 1 or dev.type != "cuda":
        for lo, hi in windows:
            first(lo, hi)
            state(lo, hi)
        for lo, hi in windows:
            out(lo, hi)
        return
    main, side = torch.cuda.current_stream(dev), _side_stream(dev, high)
    done = []
    for lo, hi in windows:
        first(lo, hi)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            state(lo, hi)
        done.append(torch.cuda.Event())
        done[-1].record(side)
    for (lo, hi), ev in zip(windows, done):
        main.wait_event(ev)
        out(lo, hi)


def chunked(x: GdnInputs, pack: Packing, ssm_pool: Tensor, capture: Capture) -> Tensor:
    """PREFILL / PREFILL_VARLEN: returns o; ssm_pool[slot] <- final state, capture.buf[n] <- state after
    capture.at[n] tokens (rows with capture.at[n] = -1 untouched)."""
    return launch_chunked(x, pack, ssm_pool, capture, TUNING)


def launch_chunked(x: GdnInputs, pack: Packing, ssm_pool: Tensor, capture: Capture, tuning: Tuning) -> Tensor:
    _check(x, pack, ssm_pool)
    capture.check(pack.num_seqs, x.state_shape)
    _check_fp32("ssm_capture", capture.buf)
    q, k, v, a, b = _operands(x)
    T, H, K = q.shape
    HV, V = v.shape[1:]
    N = pack.num_seqs
    dt, dev = q.dtype, q.device
    fp32 = dt == torch.float32
    prec = tuning.fp32_dot if fp32 else "tf32"  # bf16/fp16 operands: the dots ignore it
    solve_prec = tuning.fp32_solve_dot if fp32 else "tf32"  # TF32 for the solve's fp32 block merges
    n_chunks = triton.cdiv(T, BT) + 2 * N  # >= sum over sequences of chunks, the capture cut included
    BK, BN = max(16, triton.next_power_of_2(K)), max(2, triton.next_power_of_2(N))
    o = _new((T, HV, V), dt, dev)
    if N == 0:
        return o
    st = _state_tiling(tuning, V, HV * N, dev)
    fuse = tuning.fuse_wu and not st.wy  # WY reads T back: the solve stores it
    v_new = _new((T, HV, V), dt, dev)
    t_inv = _new((T, HV, BT), dt, dev) if not fuse else None
    if st.wy:  # w and u never formed: T stands in for them in the launches that take them unused
        w = u = t_inv
    else:
        w, u = _new((T, HV, K), dt, dev), _new((T, HV, V), dt, dev)
    t_inv = w if fuse else t_inv
    gam, rk = _new((T, HV), torch.float32, dev), _new((T, H), torch.float32, dev)
    rq = _new((T, H), torch.float32, dev) if tuning.rq_first else rk  # rk stands in when unused
    h = _new((n_chunks, HV, K, V), dt, dev)
    meta = dict(H=H, HV=HV, K=K, BN=BN, BT=BT, PREC=prec)
    seq = (pack.cu_seqlens, pack.slots, capture.at, N)

    def first(lo: int, hi: int) -> None:
        if T == 0:
            return
        gdn_chunk_intra_kernel[(hi - lo, H if tuning.solve_share else HV)](
            q, k, v, a, b, x.A_log, x.dt_bias, rk, rq, gam, w, u, t_inv, *seq, *q.stride()[:2], *k.stride()[:2],
            *v.stride()[:2], *a.stride(), *b.stride(), V=V, BKS=min(tuning.solve_bk, BK),
            BD=_v_tile(tuning.fuse_bd, max(K, V)), BC=BC, SOLVE_PREC=solve_prec, SHARE=tuning.solve_share,
            FUSE=fuse, RQ=tuning.rq_first, c0=lo, num_warps=tuning.solve_warps, **meta)
        if not fuse and not st.wy:
            loop = tuning.wu_stages > 0
            gdn_chunk_wu_kernel[(hi - lo, HV)](
                k, v, b, t_inv, gam, rk, w, u, *seq, *k.stride()[:2], *v.stride()[:2], *b.stride(), V=V,
                BK=_v_tile(64, K) if loop else BK, BV=_v_tile(64, V), LOOP=loop, c0=lo, num_warps=tuning.wu_warps,
                num_stages=max(tuning.wu_stages, 1), **meta)

    gluon = None  # the Gluon state pass, where it takes the launch: its descriptors built once for every window
    if tuning.state_gluon and T > 0 and not st.kb and not st.wy and gluon_state.usable(q, k, K, V, st.bv):
        gluon = gluon_state.launcher(k, rk, w, u, gam, h, v_new, ssm_pool, capture.buf, seq, st.bv)

    def state(lo: int, hi: int) -> None:
        if gluon is not None:
            gluon(lo, hi)
            return
        gdn_chunk_state_kernel[(triton.cdiv(V, st.bv), HV, N)](
            k, rk, w, u, gam, h, v_new, ssm_pool, capture.buf, *seq, *k.stride()[:2], V=V, BK=BK, BV=st.bv,
            KB=st.kb and K <= 128, t_inv=t_inv, v=v, b=b, s_vt=v.stride(0), s_vh=v.stride(1), s_bt=b.stride(0),
            s_bh=b.stride(1), WY=st.wy, c_lo=lo, c_hi=hi, UNI=_uniform(tuning),
            num_warps=tuning.state_warps, num_stages=st.stages, **meta)

    def out(lo: int, hi: int) -> None:
        if T == 0:
            return
        BVo = _v_tile(tuning.out_bv, V)
        gdn_chunk_out_kernel[(triton.cdiv(V, BVo), hi - lo, H)](
            q, k, rk, rq, gam, h, v_new, o, *seq, *q.stride()[:2], *k.stride()[:2], K ** -0.5, V=V, BK=BK, BV=BVo,
            RQ=tuning.rq_first, c0=lo, num_warps=tuning.out_warps, **meta)

    _pipeline(_windows(st.pipe, tuning.state_pipe_chunks, T, n_chunks), first, state, out, dev,
              tuning.state_pipe_high)
    return o
