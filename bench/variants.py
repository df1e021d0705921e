"""Variant and probe measurements of bench/kernels.py (`--only floor,decode-var,prefill-var,conv-var`).

Each function adds rows to a `kernels.Bench` (section = the group's name): the launch floor and a Triton copy
(the ceilings); the decode kernel's default tilings beside its variants (`Tuning.rec_maxnreg`, `rec_q_after`,
`rec_chunk`, the persistent grid `rec_persist`; `rec_tma`, `rec_sub`, `rec_ahead` timed before) at N = 64 and
256, with the state traffic alone in the default grid as the ceiling (and in the few-sequence grids at N = 1),
and decode with the conv update fused in (a probe: the contract change it needs is described in probes.py)
against the two launches of today; the chunked prefill's `Tuning` variants (`state_wy`) at T = 16384 and varlen
16 x 1024 (`prefill-var`), and its solve launch alone (`solve-probe`) on one sequence and on 16 (with and without
the empty chunk slots of the grid); the conv update's variants. `summary` prints, per case, the default, the
fastest variant and FLA's time, which the defaults are switched from. Every variant run here is checked against
float64 by the GPU tests (tests/test_triton_gdn.py, test_triton_conv.py).
"""

from __future__ import annotations

from dataclasses import replace

import probes
import torch
import triton
from cases import FLA, HV, STATE_BYTES, H, K, V, D_CONV, DT, gdn_inputs, packing, rel_rms
from common import n_sets_for, time_cuda

from gdn_trt.plugins.causal_conv1d import triton as conv_tri
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Capture


def floors(b) -> None:
    """The per-launch floor (an empty kernel, graph replay) and the Triton streaming ceiling (1 GiB fp32 copy)."""
    x = torch.zeros(1, device="cuda")
    b.add("floor", "empty kernel", "launch", time_cuda(lambda i: probes.empty_kernel[(1,)](x)))
    n = 1 << 28
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    t = time_cuda(lambda i: probes.stream_kernel[(triton.cdiv(n, 4096),)](src, dst, n, n, BLOCK=4096, PDL=False,
                                                                          num_warps=8), target_s=20e-3, reps=10)
    b.add("floor", "triton copy 1 GiB", "copy", t, TBps=8 * n / t.median_s / 1e12,
          pct_copy_bw=100 * 8 * n / t.median_s / b.copy_bw)


# the decode kernel's many-sequence variants (tests/test_triton_gdn.py REC_VARIANTS checks each): the state through
# TMA descriptors in one tile or in pipelined sub-tiles (Tuning.rec_tma, rec_sub), and the bulk L2 prefetch of a
# later program's state (Tuning.rec_ahead); compiled for sm_90 (Triton 3.9 on the CPU) the comments give registers
# per thread and programs per SM by registers and shared memory
# (the register counts were compiled in the tile-first form, before Tuning.rec_qkv_first: every variant below now
# loads the first token's operands first unless it says otherwise)
DECODE_VARIANTS = [("tile bv64 w2 (many: Tuning)", dict()),  # 255 regs, 8 B spilled: 4 / SM
                   ("tile first bv64 w2", dict(rec_qkv_first=False)),
                   ("cap200 bv64 w2", dict(rec_maxnreg=200)),  # 200, 64 B spilled: 5 / SM
                   ("qa cap200 bv64 w2", dict(rec_q_after=True, rec_maxnreg=200)),  # 200, 8 B: 5 / SM
                   ("qa ch32 cap200 bv64 w2", dict(rec_q_after=True, rec_chunk=32, rec_maxnreg=200)),  # 0 B: 5 / SM
                   ("qa ch32 cap168 bv64 w2", dict(rec_q_after=True, rec_chunk=32, rec_maxnreg=168)),  # 72 B: 6 / SM
                   ("qa ch16 cap168 bv64 w2", dict(rec_q_after=True, rec_chunk=16, rec_maxnreg=168)),  # 96 B: 6 / SM
                   ("qa cap200 bv32 w1",  # 200, 0 B: 10 / SM
                    dict(rec_bv=32, rec_warps=1, rec_q_after=True, rec_maxnreg=200)),
                   ("qa ch8 cap168 bv32 w1",  # 168, 72 B: 12 / SM
                    dict(rec_bv=32, rec_warps=1, rec_q_after=True, rec_chunk=8, rec_maxnreg=168))]
# timed slower at commit e325b03 (H200, 2026-12-03-kernels-decode.md: N = 64 / 256 against the default's 76.6 /
# 284.0 us): tma bv64 w2 89.6 / 336.6 (255 regs, 32 KB: 4 / SM), tma bv32 w2 91.9 / 347.1 (168, 16 KB: 6 / SM),
# tma bv64 w4 103.8 / 389.9 (158, 32 KB: 3 / SM), tma sub bv128 w4 sub16 s3 84.7 / 314.5 (72, 24 KB: 7 / SM), tma
# sub bv64 w2 sub16 s3 80.4 / 305.6 (96, 24 KB: 9 / SM), tma sub bv128 w4 sub32 s2 81.8 / 297.9 (96, 33 KB: 5 / SM),
# ahead 1024 89.1 / 356.0, ahead 2048 87.7 / 364.5 (ahead 512: 78.5 / 280.3, timed again here)
# the persistent decode grid (Tuning.rec_persist programs per SM, its loop pipelined over rec_persist_stages; the
# 2-byte inputs read as 4-byte words with rec_persist_pairs, so that the pipeliner copies them too): (label,
# Tuning change). Timed at commit 856eae1 without the word reads (H200, 2026-12-03-kernels-persist.md; N = 64 / 256
# against the default's 73.5 / 277.7 us), every form slower: best 3/SM bv64 w2 s3 75.2 / 278.2 us; bv64 w2 s2 4/SM
# 78.0 / 285.4; bv32 w2 s3 4/SM 79.9 / 295.1; bv32 w2 s2 6/SM 79.0 / 300.4; 1/SM 121-205 / 472-817 us; w4 forms
# 90-205 / 354-817; K-halves 98.8-121.0 / 385.3-472.2 (254 registers, no more programs per SM). With the word reads
# (commit acb11a5, 2026-12-03-kernels-persist2.md, default 73.6 / 276.5 us): best 3/SM bv64 w2 s3 74.7 / 280.6
# (the same form without them 76.2 / 276.5), bv64 w4 s2 3/SM 77.1 / 284.9 (90.4 / 354.4 without: its q, k loads were
# 2 bytes a thread)
PERSIST_VARIANTS = [(f"persist {p}/SM bv{bv} w{w} s{st}" + (" words" if pairs else ""),
                     dict(rec_persist=p, rec_bv=bv, rec_warps=w, rec_persist_stages=st, rec_persist_pairs=pairs))
                    for pairs, bv, w, st, p in (
                        (False, 64, 2, 3, 3), (True, 64, 2, 3, 2), (True, 64, 2, 3, 3), (False, 64, 2, 2, 4),
                        (True, 64, 2, 2, 3), (True, 64, 2, 2, 4), (True, 64, 4, 2, 2), (True, 64, 4, 2, 3),
                        (True, 32, 2, 3, 4), (True, 32, 2, 3, 5), (True, 32, 2, 2, 4), (True, 32, 2, 2, 6),
                        (True, 32, 4, 2, 4), (True, 32, 4, 3, 4))]
# the few-sequence tile at N = 1 (the TMA variants, rec_tma_few, timed slower at commit e325b03: 16 x 1 4.2 us, 8 x 1
# 4.4 us against the default's 3.8, H200, 2026-12-03-kernels-decode.md)
DECODE_FEW_VARIANTS = [("tile bv16 w1 (few: Tuning)", dict()), ("tile first bv16 w1", dict(rec_qkv_first=False))]


def decode_variants(b) -> None:
    """At N = 1 the few-sequence tile and its TMA variants, and the few-sequence grids moving only the state; at
    N = 64 and 256 the many-sequence tile, the same default grid moving only the state (the ceiling the step's
    compute is measured against) and the persistent grid's variants, then the other many-sequence variants (one
    token per sequence; last, so that a run cut by its time limit loses those first)."""
    for label, change in DECODE_FEW_VARIANTS:
        b.recurrent(1, 1, False, replace(b.gdn, **change), label, fla=False)["section"] = "decode-var"
    copy_floor_one(b)
    for n in (64, 256):
        label, change = DECODE_VARIANTS[0]
        b.recurrent(n, 1, False, replace(b.gdn, rec_few_below=0, **change), label, fla=False)["section"] = "decode-var"
        sets = n_sets_for(n * STATE_BYTES)
        pools = [torch.randn(n, HV, K, V, device="cuda") for _ in range(sets)]
        slots = torch.arange(n, dtype=torch.int32, device="cuda")
        nbytes = 2 * n * STATE_BYTES
        t = time_cuda(lambda i: probes.rec_copy_kernel[(V // 64, HV, n)](pools[i % sets], slots, HV=HV, K=K, V=V,
                                                                         BV=64, num_warps=2), sets)
        b.add("decode-var", f"decode {n}x1", "state copy only bv64 w2", t, state_TBps=nbytes / t.median_s / 1e12,
              pct_copy_bw=100 * nbytes / t.median_s / b.copy_bw)
        for label, change in PERSIST_VARIANTS:
            seen = _compiled(gdn_tri.gdn_decode_persist_kernel)
            tu = replace(b.gdn, rec_few_below=0, **change)
            b.recurrent(n, 1, False, tu, label, fla=False)["section"] = "decode-var"
            for key, info in _compiled(gdn_tri.gdn_decode_persist_kernel).items():
                if key not in seen:
                    print(f"compiled  {label:34s} {info}", flush=True)
    for n in (64, 256):
        for label, change in DECODE_VARIANTS[1:]:
            tu = replace(b.gdn, rec_few_below=0, **change)
            b.recurrent(n, 1, False, tu, label, fla=False)["section"] = "decode-var"
    fused_decode_probe(b)


def _compiled(fn) -> dict:
    """{cache key: registers, spill bytes, shared memory, cp.async copies in its TTGIR} of each kernel compiled
    from the JIT function `fn` in this process (Triton 3.6: JITFunction.device_caches[device][0])."""
    out = {}
    try:
        for cache in getattr(fn, "device_caches", {}).values():
            for key, k in (cache[0].items() if isinstance(cache, tuple) else ()):
                asm = getattr(k, "asm", {}) or {}
                out[key] = dict(regs=getattr(k, "n_regs", None), spills=getattr(k, "n_spills", None),
                                shared=getattr(k.metadata, "shared", None),
                                async_copies=str(asm.get("ttgir", "")).count("async_copy_global_to_local"))
    except Exception as e:  # noqa: BLE001 - a Triton whose cache looks otherwise: said, and the timings go on
        print(f"compiled  cannot read {fn.__name__}'s JIT cache: {type(e).__name__}: {e}", flush=True)
    return out


def copy_floor_one(b) -> None:
    """Decode at N = 1: the few-sequence grids (16, 8, 4 wide on one warp) moving only the state (probes.py
    rec_copy_kernel), with the slot lookup and without it (the state address known at launch): the floor of any
    kernel that reads and writes the state with that grid, and what the slot -> state load chain costs in it."""
    sets = n_sets_for(STATE_BYTES)
    pools = [torch.randn(1, HV, K, V, device="cuda") for _ in range(sets)]
    slots = torch.zeros(1, dtype=torch.int32, device="cuda")
    for bv in (16, 8, 4):
        for direct in (False, True):
            t = time_cuda(lambda i: probes.rec_copy_kernel[(V // bv, HV, 1)](
                pools[i % sets], slots, HV=HV, K=K, V=V, BV=bv, DIRECT=direct, num_warps=1), sets)
            label = f"state copy only bv{bv} w1" + (", no slot lookup" if direct else "")
            b.add("decode-var", "decode 1x1", label, t, state_TBps=2 * STATE_BYTES / t.median_s / 1e12,
                  pct_copy_bw=100 * 2 * STATE_BYTES / t.median_s / b.copy_bw)


def fused_decode_probe(b) -> None:
    """Decode at N = 1 and 8 as today (conv update, then the recurrent kernel on the conv output's q, k, v slices:
    two launches, production defaults) and as one launch with the conv fused in (probes.py, its conv history a
    ring by token position: the contract a fused op would need), with the probe's output error against the two
    launches. Few sequences only: in the 64 x 2 tile of many sequences the probe spills 776 B (sm_90 compile)."""
    for n in (1, 8):
        pack = packing([1] * n)
        x = torch.randn(n, D_CONV, device="cuda").to(DT)
        w = (torch.randn(D_CONV, 4, device="cuda") * 0.5).to(DT)
        conv = ConvParams(w, 1, 1)
        g = gdn_inputs(n, 5)
        sets = n_sets_for(n * STATE_BYTES)
        pools = [torch.randn(n, HV, K, V, device="cuda") * 0.5 for _ in range(sets)]
        hist = torch.randn(n, 3, D_CONV, device="cuda").to(DT)
        pos = torch.randint(3, 1000, (n,), dtype=torch.int32, device="cuda")
        ring = torch.randn(n, 4, D_CONV, device="cuda").to(DT)
        rows = (pos[:, None].long() + 1 + torch.arange(3, device="cuda")[None, :]) % 4
        ring.scatter_(1, rows[:, :, None].expand(n, 3, D_CONV), hist)

        def two(i, pool=None, h=None):
            y = conv_tri.launch_update(x, conv, pack, hist if h is None else h, None, b.conv)
            q, k = y[:, :H * K].unflatten(1, (H, K)), y[:, H * K:2 * H * K].unflatten(1, (H, K))
            gi = GdnInputs(q, k, y[:, 2 * H * K:].unflatten(1, (HV, V)), g.a, g.b, g.A_log, g.dt_bias)
            return gdn_tri.launch_recurrent(gi, pack, pools[i % sets] if pool is None else pool, None, b.gdn)
        bv, warps = gdn_tri._rec_tiling(b.gdn, V, HV * n)
        o = torch.empty(n, HV, V, dtype=DT, device="cuda")

        def fused(i, pool=None, r=None):
            probes.rec_conv_probe_kernel[(V // bv, HV, n)](
                x, w, ring if r is None else r, pos, g.a, g.b, g.A_log, g.dt_bias, o,
                pools[i % sets] if pool is None else pool, pack.slots, K ** -0.5, H=H, HV=HV, K=K, V=V, BV=bv,
                num_warps=warps)
        o_ref = two(0, pools[0].clone(), hist.clone())
        fused(0, pools[0].clone(), ring.clone())
        err = rel_rms(o_ref.float(), o.float())
        nbytes = 2 * n * STATE_BYTES
        for label, fn, e in (("conv update + recurrent (2 launches)", two, None),
                             ("fused conv + recurrent probe (ring)", fused, err)):
            t = time_cuda(fn, sets)
            b.add("decode-var", f"decode {n}x1", label, t, state_TBps=nbytes / t.median_s / 1e12,
                  pct_copy_bw=100 * nbytes / t.median_s / b.copy_bw, **({} if e is None else dict(rel_rms_o=e)))


# the chunked prefill's Tuning variants (tests/test_triton_gdn.py CHUNK_VARIANTS checks each; the ones timed in
# 2026-12-03-kernels-round2.md, rq_first, wu_stages and state_kb, are left out)
WY = dict(state_wy=True, state_wy_many=True)
PREFILL_VARIANTS = [
    ("Tuning", dict()),
    ("state_kb_many=False", dict(state_kb_many=False)),
    ("state_wy (both tilings)", WY),
    ("state_wy_many, state_kb_many=False", dict(state_wy_many=True, state_kb_many=False)),
    ("state_wy, state_warps=8", dict(WY, state_warps=8)),
    ("state_wy, state_bv=16", dict(WY, state_bv=16)),
    ("state_wy, state_kb", dict(WY, state_kb=True)),
]


# the state pass as a pipeline of windows (Tuning.state_pipe: the single-sequence tiling, state_pipe_many: the
# many-sequence one), timed at every single-sequence length of the prefill section and at 16 x 1024
PIPE_VARIANTS = [
    ("one launch of each pass", dict(state_pipe=1)),
    ("state_pipe=2", dict(state_pipe=2, state_pipe_chunks=8)),
    ("state_pipe=4", dict(state_pipe=4, state_pipe_chunks=8)),
    ("state_pipe=8", dict(state_pipe=8, state_pipe_chunks=8)),
    ("state_pipe=4, windows of 128 chunks at least", dict(state_pipe=4, state_pipe_chunks=128)),
    ("state_pipe=4, side stream of the same priority", dict(state_pipe=4, state_pipe_chunks=8, state_pipe_high=False)),
    # the default windows with the state pass's programs wider or more of them (they share their SMs with the other
    # passes' programs while they overlap), and the other passes narrower
    ("windows of 128, state_warps=8", dict(state_pipe=4, state_pipe_chunks=128, state_warps=8)),
    ("windows of 128, state_bv=16", dict(state_pipe=4, state_pipe_chunks=128, state_bv=16)),
    ("windows of 128, state_bv=16, state_warps=2", dict(state_pipe=4, state_pipe_chunks=128, state_bv=16,
                                                        state_warps=2)),
    ("windows of 128, wu_warps=4", dict(state_pipe=4, state_pipe_chunks=128, wu_warps=4)),
    ("windows of 128, out_warps=8", dict(state_pipe=4, state_pipe_chunks=128, out_warps=8)),
    ("state_pipe=3, windows of 64", dict(state_pipe=3, state_pipe_chunks=64)),
    ("state_bv=16, one launch of each pass", dict(state_pipe=1, state_bv=16)),
    # deeper or shallower prefetch in the state pass's chunk loop: under the other passes' traffic its loads wait
    # longer, which more stages in flight could hide (each stage holds the chunk's w, k and u tiles in shared memory)
    ("windows of 128, state_stages=2", dict(state_pipe=4, state_pipe_chunks=128, state_stages=2)),
    ("windows of 128, state_stages=4", dict(state_pipe=4, state_pipe_chunks=128, state_stages=4)),
    ("windows of 128, state_stages=5", dict(state_pipe=4, state_pipe_chunks=128, state_stages=5)),
    ("one launch of each pass, state_stages=4", dict(state_pipe=1, state_stages=4)),
]
PIPE_MANY_VARIANTS = [("state_pipe_many=2", dict(state_pipe_many=2)), ("state_pipe_many=4", dict(state_pipe_many=4))]


def prefill_variants(b) -> None:
    for lengths in ([16384], [1024] * 16):
        for name, change in PREFILL_VARIANTS:
            b.chunked(lengths, replace(b.gdn, **change), name, fla=False)["section"] = "prefill-var"


def pipe_variants(b, single: list[int], match: str = "") -> None:
    """The pipeline variants at each single-sequence length (with the default beside them where the
    prefill-var section does not time it) and the many-sequence pipeline at 16 x 1024; `match`: only the variants
    whose name holds that text (the default rows stay)."""
    runs = [([T], name, change) for T in single for name, change in [("Tuning", {})] * (T != 16384) + PIPE_VARIANTS]
    runs += [([1024] * 16, name, change) for name, change in PIPE_MANY_VARIANTS]
    for lengths, name, change in runs:
        if name == "Tuning" or match in name:
            b.chunked(lengths, replace(b.gdn, **change), name, fla=False)["section"] = "prefill-var"


def warm_prefill(fla: bool) -> None:
    """One call of each prefill-var launch (and FLA's, which autotunes on its first call) on the bench's cases, so
    that a later run finds them in Triton's caches: the device call runs this beside the GPU tests, which are
    compile-bound, and times afterwards (TRITON_CACHE_AUTOTUNING=1 keeps FLA's autotuning on disk)."""
    from cases import fla_chunk

    for peer in (False, True) if fla else (False,):  # ours first: FLA's autotuning takes longer
        for lengths in ([16384], [1024] * 16):
            T, N = sum(lengths), len(lengths)
            x, pack = gdn_inputs(T, 2), packing(lengths)
            pool = torch.randn(N, HV, K, V, device="cuda") * 0.5
            cap = Capture(torch.full((N,), -1, dtype=torch.int32, device="cuda"),
                          torch.empty(N, HV, K, V, device="cuda"))
            for name, change in [("FLA", None)] if peer else PREFILL_VARIANTS:
                if peer:
                    fla_chunk(x, pack.cu_seqlens.long() if N > 1 else None, pool)
                else:
                    gdn_tri.launch_chunked(x, pack, pool, cap, replace(gdn_tri.TUNING, **change))
                torch.cuda.synchronize()
                print("warm", lengths[0], len(lengths), name, flush=True)


def solve_probe(b) -> None:
    """The first (solve) launch of the chunked op alone, to find why it took 210 us on 16 x 1024 tokens against 174
    on one sequence of 16384 (2026-12-03-kernels-variants.md; compiled for sm_90 the two have the same code, 4048
    and 4072 instructions): on one sequence, on 16, on 16 with a grid of exactly the 256 chunks (launch_chunked
    sizes it T/64 + 2N from shapes: 32 empty chunk slots per head), and one sequence passed as two (the second
    empty: N = 1 is specialised to a constant by Triton, N = 2 is not)."""
    from gdn_trt.plugins import triton_aot  # records the launches of one call without running them

    for label, lengths, exact in (("1 x 16384", [16384], False), ("16 x 1024", [1024] * 16, False),
                                  ("16 x 1024, exact grid", [1024] * 16, True), ("16384 + 0", [16384, 0], False)):
        T, N = sum(lengths), len(lengths)
        x, pack = gdn_inputs(T, 2), packing(lengths)
        pool = torch.randn(N, HV, K, V, device="cuda") * 0.5
        cap = Capture(torch.full((N,), -1, dtype=torch.int32, device="cuda"), torch.empty(N, HV, K, V, device="cuda"))
        recorded = triton_aot.record(gdn_tri, lambda: gdn_tri.launch_chunked(x, pack, pool, cap, b.gdn))
        launch = next(rec for rec in recorded if rec.name == "gdn_chunk_intra_kernel")
        chunks = sum(triton.cdiv(n, 64) for n in lengths) if exact else triton.cdiv(T, 64) + 2 * N
        grid = (chunks, H if b.gdn.solve_share else HV)
        t = time_cuda(lambda i: launch.fn[grid](**launch.args, num_warps=launch.num_warps,
                                                num_stages=launch.num_stages))
        b.add("prefill-var", f"solve {label}", f"intra launch alone, grid {grid[0]} x {grid[1]}", t)


# the one-token conv update's Tuning variants, timed beside the default (tests/test_triton_conv.py checks each)
CONV_UPDATE_VARIANTS = [("weight gathers", dict(update_wtile=False)),
                        ("bd512 w4", dict(update_bd=512, update_warps=4)),
                        ("bd1024 w8", dict(update_bd=1024, update_warps=8)),
                        ("bd128 w2", dict(update_bd=128, update_warps=2))]


def conv_variants(b, n: int = 256) -> None:
    """The one-token conv update in its [S, n, D] pool: the default and each variant, and the probe that measured
    this layout first (bench/probes.py, layout 2, with the cu_seqlens / slots lookups) on the same history."""
    x = torch.randn(n, D_CONV, device="cuda").to(DT)
    weight = torch.randn(D_CONV, 4, device="cuda").to(DT)
    sets = n_sets_for(n * D_CONV * 4 * 2)
    hist = [torch.randn(n, 3, D_CONV, device="cuda").to(DT) for _ in range(sets)]
    pack = packing([1] * n)
    y_ref = conv_tri.launch_update(x, ConvParams(weight, 1, 1), pack, hist[0].clone(), None, b.conv)
    b.conv_update(n, b.conv, "ours (Tuning)", fla=False)["section"] = "conv-var"
    for label, change in CONV_UPDATE_VARIANTS:
        b.conv_update(n, replace(b.conv, **change), f"ours {label}", fla=False)["section"] = "conv-var"
    nbytes = 2 * n * D_CONV * 2 + 2 * n * D_CONV * 3 * 2
    y = torch.empty_like(x)

    def run(i, pool=None):
        probes.conv_update_kernel[(D_CONV // 256, n)](
            x, weight, y, pool if pool is not None else hist[i % sets], pack.cu_seqlens, pack.slots, D=D_CONV, BD=256,
            LAYOUT=2, INDIRECT=True, num_warps=4)
    run(0, hist[0].clone())
    err = rel_rms(y_ref.float(), y.float())
    t = time_cuda(run, sets)
    b.add("conv-var", f"conv update {n}", "probe [S, 3, D] slots bd256 w4", t, TBps=nbytes / t.median_s / 1e12,
          pct_copy_bw=100 * nbytes / t.median_s / b.copy_bw, rel_rms_o=err)


# the kernel targets' cases: (case as the rows name it, the variant section that times alternatives to the default)
SUMMARY_CASES = [("decode 1x1", None), ("decode 64x1", "decode-var"), ("decode 256x1", "decode-var"),
                 ("prefill 16384", "prefill-var"), ("varlen 16x1024", "prefill-var"),
                 ("conv update 256", "conv-var"), ("conv prefill 16384", None)]


def summary(rows: list[dict]) -> list[dict]:
    """Per case: the default's time (headline section, `ours`), the fastest variant timed in the same run, and
    FLA's time; returns one `summary` row per case (impl = the winner) and prints them as a table."""
    out = []
    for case, var in SUMMARY_CASES:
        timed = [r for r in rows if r.get("case") == case and r.get("time_us") and r["section"] != "breakdown"]
        ours = next((r for r in timed if r["impl"] == "ours" and r["section"] != "sweep"), None)
        fla = next((r for r in timed if r["impl"] == FLA), None)
        cands = [r for r in timed if r["section"] == var and not any(
            w in r["impl"] for w in ("probe", "copy only", "launches"))] + ([ours] if ours else [])
        if not cands:
            continue
        best = min(cands, key=lambda r: r["time_us"])
        row = dict(section="summary", case=case, impl=f"best: {best['impl']} ({best['section']})",
                   time_us=best["time_us"], timing=best.get("timing"))
        if fla:
            row["ours_over_fla"] = best["time_us"] / fla["time_us"]
        out.append(row)
        print(f"summary   {case:20s} default {ours['time_us'] if ours else float('nan'):9.2f} us   "
              f"best {best['time_us']:9.2f} us ({best['section']}: {best['impl']})   "
              f"FLA {fla['time_us'] if fla else float('nan'):9.2f} us", flush=True)
    return out


def plot(rows: list[dict], path) -> None:
    """The variant sections: decode share of the copy rate by N and tiling (with the state-only probe), prefill
    time per variant, conv update time per probe."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 5.5))
    dec = [r for r in rows if r["section"] == "decode-var"]
    for impl in dict.fromkeys(r["impl"] for r in dec):
        pts = sorted((int(r["case"].split()[1].split("x")[0]), r["pct_copy_bw"]) for r in dec if r["impl"] == impl)
        style = "o-" if impl.startswith("tile") else ("s--" if impl.startswith("state") else "x:")
        ax1.plot([n for n, _ in pts], [p for _, p in pts], style, label=impl)
    ax1.set_xscale("log", base=2)
    ax1.axhline(90, color="k", lw=0.8)
    ax1.set_xlabel("sequences N (decode, one token each)")
    ax1.set_ylabel("fp32 state traffic, % of the copy rate")
    ax1.legend(fontsize=7)
    for ax, section in ((ax2, "prefill-var"), (ax3, "conv-var")):
        sel = [r for r in rows if r["section"] == section]
        ax.barh([f"{r['case']}: {r['impl']}" for r in sel], [r["time_us"] for r in sel])
        ax.tick_params(axis="y", labelsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("median time per call (us, CUDA-graph replay)")
    fig.suptitle("GDN and conv kernel variants on the H200 (Qwen3-Next shapes, bf16, fp32 state)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
