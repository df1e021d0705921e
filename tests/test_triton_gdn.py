"""Triton kernels of the gated delta rule against the float64 references (`plugins/gated_delta_rule/naive.py`).

The checks below run on any device: the `gpu` tests here call them at the real Qwen3-Next / Qwen3.5 shapes and at
odd shapes in bf16 and fp32; `test_triton_interpret.py` calls them at small shapes on the CPU under
TRITON_INTERPRET=1. Every check poisons the kernel's outputs and scratch buffers (and the stash / capture
buffers) with NaN, then asserts the output, every state written (pool rows, stash rows, capture rows) against the
reference with the tolerance table, and that nothing else was written: untouched pool rows are bit-identical,
unwritten stash / capture rows still NaN, output rows of padding sequences exactly zero.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from gdn_trt.export.tolerances import tol
from gdn_trt.plugins.gated_delta_rule import naive
from gdn_trt.plugins import samples
from gdn_trt.plugins.packing import Capture, Packing
from gdn_trt.plugins.samples import POOL_ROWS, VARLEN_STEP, Heads, Step, f64_inputs, make_inputs

from .kernel_support import poisoned
from .tolerances import assert_close

QWEN3_NEXT = Heads(16, 2, 128, 128)
QWEN35_27B = Heads(16, 3, 128, 128)


def _tri():
    from gdn_trt.plugins.gated_delta_rule import triton as tri

    return tri


def assert_pool(pool0: Tensor, ref: Tensor, got: Tensor, written: list[int], bound) -> None:
    """Rows in `written` against the reference; every other row bit-identical to before."""
    got = got.cpu()
    for s in range(pool0.shape[0]):
        if s in written:
            assert_close(f"ssm_pool[{s}]", ref[s], got[s], bound)
        else:
            assert torch.equal(got[s], pool0[s].cpu()), f"ssm_pool[{s}] was written but belongs to no live sequence"


def _live(step: Step) -> list[int]:
    return [s for s, n in zip(step.slots, step.lengths) if s >= 0 and n > 0]


def _dead_rows(step: Step) -> list[int]:
    cu = [0]
    for n in step.lengths:
        cu.append(cu[-1] + n)
    return [t for i, s in enumerate(step.slots) if s < 0 for t in range(cu[i], cu[i + 1])]


def check_recurrent(step: Step, heads: Heads, dtype: torch.dtype, device: str, stash: bool,
                    pool_rows: int = POOL_ROWS) -> None:
    x, pack, pool = make_inputs(step, heads, dtype, device, pool_rows)
    T, bound = sum(step.lengths), tol(dtype, "recurrent")
    pool_ref = pool.cpu().double()
    got_pool = pool.clone()
    tri = _tri()
    if stash:
        stash_ref = torch.full((T, *x.state_shape), float("nan"), dtype=torch.float64)
        got_stash = torch.full((T, *x.state_shape), float("nan"), device=device)
        o_ref = naive.recurrent_stash(f64_inputs(x), Packing(pack.cu_seqlens.cpu(), pack.slots.cpu()), pool_ref,
                                      stash_ref)
        with poisoned(tri):
            o = tri.recurrent_stash(x, pack, got_pool, got_stash)
        written = ~torch.isnan(stash_ref[:, 0, 0, 0])
        assert torch.isnan(got_stash.cpu()[~written]).all(), "stash rows of skipped sequences were written"
        assert_close("ssm_stash", stash_ref[written], got_stash.cpu()[written], bound)
        assert torch.equal(got_pool, pool), "recurrent_stash wrote the pool"
    else:
        o_ref = naive.recurrent(f64_inputs(x), Packing(pack.cu_seqlens.cpu(), pack.slots.cpu()), pool_ref)
        with poisoned(tri):
            o = tri.recurrent(x, pack, got_pool)
        assert_pool(pool, pool_ref, got_pool, _live(step), bound)
    assert o.dtype == dtype and o.shape == (T, heads.HV, heads.V)
    dead = _dead_rows(step)
    assert (o[dead] == 0).all(), "output rows of padding sequences must be zero"
    assert_close("o", o_ref, o.cpu(), bound)


def check_chunked(step: Step, heads: Heads, dtype: torch.dtype, device: str, aligned: bool = False) -> None:
    x, pack, pool = make_inputs(step, heads, dtype, device, aligned=aligned)
    N, bound = len(step.lengths), tol(dtype, "chunked")
    at = torch.tensor(step.capture_at, dtype=torch.int32)
    cap_ref = torch.full((N, *x.state_shape), float("nan"), dtype=torch.float64)
    pool_ref = pool.cpu().double()
    o_ref = naive.chunked(f64_inputs(x), Packing(pack.cu_seqlens.cpu(), pack.slots.cpu()), pool_ref,
                          Capture(at, cap_ref))
    got_pool = pool.clone()
    got_cap = torch.full((N, *x.state_shape), float("nan"), device=device)
    tri = _tri()
    with poisoned(tri):
        o = tri.chunked(x, pack, got_pool, Capture(at.to(device), got_cap))
    assert_pool(pool, pool_ref, got_pool, _live(step), bound)
    captured = [n for n in range(N) if step.capture_at[n] >= 0 and step.slots[n] >= 0]
    for n in range(N):
        if n in captured:
            assert_close(f"ssm_capture[{n}]", cap_ref[n], got_cap[n].cpu(), bound)
        else:
            assert torch.isnan(got_cap[n]).all(), f"ssm_capture[{n}] written without a capture request"
    assert (o[_dead_rows(step)] == 0).all(), "output rows of padding sequences must be zero"
    assert_close("o", o_ref, o.cpu(), bound)


def check_pipeline(step: Step, heads: Heads, dtype: torch.dtype, device: str, pipe: int, **change) -> None:
    """The state pass in windows (`Tuning.state_pipe` / `state_pipe_many`, a window per chunk and up) against one
    launch of each pass, on the same inputs: outputs, pool and capture rows bit for bit (the windows hand the fp32
    state on through the pool, so the chain of products is the same). `check_chunked` checks the one launch
    against float64."""
    x, pack, pool = make_inputs(step, heads, dtype, device)
    N, T = len(step.lengths), sum(step.lengths)
    tri = _tri()
    at = torch.tensor(step.capture_at, dtype=torch.int32, device=device)
    got = []
    for p in (1, pipe):
        tuning = replace(tri.TUNING, state_pipe=p, state_pipe_many=p, state_pipe_chunks=1, **change)
        got_pool, got_cap = pool.clone(), torch.full((N, *x.state_shape), float("nan"), device=device)
        with poisoned(tri):
            o = tri.launch_chunked(x, pack, got_pool, Capture(at, got_cap), tuning)
        got.append((o, got_pool, got_cap))
    assert len(tri._windows(pipe, 1, T, T)) > 1, "the step has no second window"
    for name, one, windows in zip(("o", "ssm_pool", "ssm_capture"), *got):
        torch.testing.assert_close(windows, one, rtol=0, atol=0, equal_nan=True, msg=f"{name}: windows != one launch")


def test_windows_are_ordered_non_empty_and_cover_the_chunks():
    """`_windows` for every chunk count up to 40 tokens' worth and every pipe and minimum: contiguous from chunk 0,
    none empty, at most `pipe`, at least `min_chunks` each where there are two or more, the last one to `n_chunks`."""
    tri = _tri()
    for chunks in range(0, 41):
        for pipe in (1, 2, 3, 4, 8):
            for least in (1, 2, 5, 128):
                n_chunks = chunks + 3  # capture cuts and sequence ends add chunks past T / BT
                w = tri._windows(pipe, least, chunks * tri.BT, n_chunks)
                assert w[0][0] == 0 and w[-1][1] == n_chunks and len(w) <= pipe, (chunks, pipe, least, w)
                assert all(lo < hi for lo, hi in w), (chunks, pipe, least, w)
                assert all(a[1] == b[0] for a, b in zip(w, w[1:])), (chunks, pipe, least, w)
                assert len(w) == 1 or all(hi - lo >= least for lo, hi in w[:-1]), (chunks, pipe, least, w)


# ---- GPU: real and odd shapes, bf16 and fp32 ----

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float32, id="fp32")]
ODD = [Heads(4, 3, 64, 128), Heads(2, 1, 128, 64), Heads(3, 2, 32, 48)]  # K != V, G in {1, 2, 3}
# mixed lengths (chunk-aligned and not), an empty sequence, a padding sequence, captures at 0, inside, at a chunk
# boundary, at the end, and none (also bench/fp32_dots.py's step)
def _decode_step(n: int) -> Step:
    slots = [(7 * i + 3) % (4 * n) for i in range(n)]
    slots[n // 2] = -1  # a padding row, as CUDA-graph buckets add
    return Step((1,) * n, tuple(slots))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [QWEN3_NEXT, QWEN35_27B, *ODD], ids=str)
def test_decode(heads, dtype):
    """DECODE_MULTI_SEQ: 33 one-token sequences scattered over a pool of 132 rows, one padding row."""
    check_recurrent(_decode_step(33), heads, dtype, "cuda", stash=False, pool_rows=4 * 33)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [QWEN3_NEXT, QWEN35_27B, *ODD], ids=str)
@pytest.mark.parametrize("stash", [False, True], ids=["pool", "stash"])
def test_verify(heads, dtype, stash):
    """VERIFY_MULTI / DECODE_BATCHED shapes: up to 4 tokens per sequence, one sequence without drafts."""
    check_recurrent(Step((4, 0, 3, 1, 4, 2), (5, 1, -1, 0, 7, 2)), heads, dtype, "cuda", stash)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 63, 65, 1000])
@pytest.mark.parametrize("heads", [QWEN3_NEXT, *ODD], ids=str)
def test_prefill(heads, T, dtype):
    """One sequence with a capture point inside (or at the ends for T=1)."""
    check_chunked(Step((T,), (3,), (T // 2 if T > 1 else 1,)), heads, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [QWEN3_NEXT, QWEN35_27B, *ODD], ids=str)
def test_prefill_varlen(heads, dtype):
    check_chunked(VARLEN_STEP, heads, dtype, "cuda")


# the decode kernel's variants that bench/kernels.py times beside the default tilings (its decode-var section),
# forced into the many-sequence tiling here (the few-sequence ones, rec_*_few, take the few-sequence tiling anyway:
# rec_few_below is lifted only for the others)
REC_VARIANTS = {"bv128-w4-sub32": dict(rec_bv=128, rec_warps=4, rec_sub=32, rec_sub_stages=3),
                "bv64-w2-sub16": dict(rec_bv=64, rec_warps=2, rec_sub=16, rec_sub_stages=3),
                "bv128-w4-sub16-s4": dict(rec_bv=128, rec_warps=4, rec_sub=16, rec_sub_stages=4),
                "tma-bv64-w2": dict(rec_tma=True),
                "tma-bv32-w2": dict(rec_bv=32, rec_warps=2, rec_tma=True),
                "tma-bv64-w4": dict(rec_bv=64, rec_warps=4, rec_tma=True),
                "tma-bv128-w4-sub16": dict(rec_bv=128, rec_warps=4, rec_sub=16, rec_sub_stages=3, rec_tma=True),
                "tma-bv64-w2-sub16": dict(rec_bv=64, rec_warps=2, rec_sub=16, rec_sub_stages=3, rec_tma=True),
                "tma-bv128-w4-sub32-s2": dict(rec_bv=128, rec_warps=4, rec_sub=32, rec_sub_stages=2, rec_tma=True),
                "ahead-512": dict(rec_ahead=512), "ahead-1024": dict(rec_ahead=1024),
                "ahead-2048": dict(rec_ahead=2048), "ahead-3": dict(rec_ahead=3),
                "tma-few-bv16": dict(rec_tma_few=True), "tma-few-bv8": dict(rec_bv_few=8, rec_tma_few=True),
                "cap200": dict(rec_maxnreg=200), "qa-cap200": dict(rec_q_after=True, rec_maxnreg=200),
                "qa-ch32-cap200": dict(rec_q_after=True, rec_chunk=32, rec_maxnreg=200),
                "qa-ch32-cap168": dict(rec_q_after=True, rec_chunk=32, rec_maxnreg=168),
                "qa-ch16-cap168": dict(rec_q_after=True, rec_chunk=16, rec_maxnreg=168),
                "qa-cap200-bv32-w1": dict(rec_bv=32, rec_warps=1, rec_q_after=True, rec_maxnreg=200),
                "qa-ch8-cap168-bv32-w1": dict(rec_bv=32, rec_warps=1, rec_q_after=True, rec_chunk=8, rec_maxnreg=168),
                # tile first: with the operands first it spills 16 B at sm_90 (timed 71.0 against 70.0 us at N = 64)
                "ch16": dict(rec_chunk=16, rec_qkv_first=False),
                "tile-first": dict(rec_qkv_first=False), "tile-first-few": dict(rec_qkv_first=False),
                # the persistent grid (rec_persist): each compiled form the bench times (stages x tile x warps, the
                # K-halves), at several programs per SM (the grid only)
                **{f"persist-{p}-bv{bv}-w{w}-s{st}": dict(rec_persist=p, rec_bv=bv, rec_warps=w, rec_persist_stages=st)
                   for p, bv, w, st in ((1, 64, 2, 2), (3, 64, 2, 3), (2, 64, 4, 2), (4, 64, 4, 3), (4, 32, 2, 2),
                                        (2, 32, 2, 3), (3, 32, 4, 2), (1, 32, 4, 3))},
                "persist-2-kh-s2": dict(rec_persist=2, rec_persist_kh=True),
                "persist-3-kh-s3": dict(rec_persist=3, rec_persist_kh=True, rec_persist_stages=3),
                **{f"persist-{p}-bv{bv}-w{w}-s{st}-pairs": dict(rec_persist=p, rec_bv=bv, rec_warps=w,
                                                                rec_persist_stages=st, rec_persist_pairs=True)
                   for p, bv, w, st in ((3, 64, 2, 3), (4, 64, 2, 2), (4, 32, 2, 3), (3, 64, 4, 2), (4, 32, 4, 2))}}


def aligned_inputs(*args):
    """`make_inputs` with q, k, v, a, b each in an allocation of its own (aligned, even strides), so that the
    persistent decode kernel reads the 2-byte ones as 4-byte words (Tuning.rec_persist_pairs; the samples' slices
    at odd offsets take the plain loads)."""
    x, pack, pool = samples.make_inputs(*args)
    x = replace(x, **{n: getattr(x, n).contiguous().clone() for n in ("q", "k", "v", "a", "b")})
    assert _tri()._word_pairs(x.q, x.k, x.v, x.a, x.b, 4) == (x.q.element_size() == 2), "word reads not taken"
    return x, pack, pool


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(REC_VARIANTS))
def test_recurrent_variants(variant, dtype, monkeypatch):
    tri = _tri()
    if "pairs" in variant:
        monkeypatch.setattr(sys.modules[__name__], "make_inputs", aligned_inputs)
    few = dict() if "few" in variant else dict(rec_few_below=0)  # the few-sequence tiling: its own threshold
    monkeypatch.setattr(tri, "TUNING", replace(tri.TUNING, **few, **REC_VARIANTS[variant]))
    check_recurrent(_decode_step(33), QWEN3_NEXT, dtype, "cuda", stash=False, pool_rows=4 * 33)
    check_recurrent(_decode_step(9), ODD[2], dtype, "cuda", stash=False, pool_rows=36)  # V = 48: masked sub-tiles
    for stash in (False, True):  # several tokens per sequence: the sub-tile loop without pipelining
        check_recurrent(Step((4, 0, 3, 1, 4, 2), (5, 1, -1, 0, 7, 2)), QWEN35_27B, dtype, "cuda", stash)


# Tuning variants that bench/kernels.py times beside the defaults (its prefill-var section), each checked against
# float64 here so the defaults can take whichever wins at the commit that measured it
WY = dict(state_wy=True, state_wy_many=True)
CHUNK_VARIANTS = {"rq-after": dict(rq_first=False), "wu-loop": dict(wu_stages=2), "state-kb": dict(state_kb=True),
                  "all-three": dict(rq_first=True, wu_stages=3, state_kb=True),
                  "kb-many-off": dict(state_kb_many=False), "wy": WY,
                  "wy-many-one-block": dict(state_wy_many=True, state_kb_many=False),
                  "wy-s2": dict(WY, state_stages=2), "wy-w8": dict(WY, state_warps=8),
                  "wy-bv16": dict(WY, state_bv=16), "wy-kb": dict(WY, state_kb=True),
                  "pipe-4": dict(state_pipe=4, state_pipe_many=4, state_pipe_chunks=2),
                  "wu-unrolled": dict(wu_stages=0, wu_warps=8)}
ORDER_ONLY = {"pipe-4"}  # variants that change the order and streams of the launches, no compiled kernel


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(CHUNK_VARIANTS))
def test_chunked_variants(variant, dtype, monkeypatch):
    tri = _tri()
    monkeypatch.setattr(tri, "TUNING", replace(tri.TUNING, **CHUNK_VARIANTS[variant]))
    check_chunked(VARLEN_STEP, QWEN35_27B, dtype, "cuda")  # the many-sequence state tiling, G = 3
    check_chunked(Step((1000,), (3,), (500,)), QWEN3_NEXT, dtype, "cuda")  # one sequence: its state tiling
    check_chunked(Step((65, 130), (0, 2), (64, -1)), ODD[2], dtype, "cuda")  # K = 32, V = 48


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pipe", [2, 4, 8])
def test_chunked_pipeline(pipe, dtype):
    """The pipelined state pass on the GPU (side stream, events) == one launch of each pass, bit for bit: one
    sequence with a capture cut inside (its tiling), the varlen step (the many-sequence tiling), and K = 32, V = 48
    in the state pass's K-halves and WY forms."""
    check_pipeline(Step((1000,), (3,), (500,)), QWEN3_NEXT, dtype, "cuda", pipe)
    check_pipeline(VARLEN_STEP, QWEN35_27B, dtype, "cuda", pipe)
    check_pipeline(Step((65, 130, 0, 70), (0, 2, 1, -1), (64, -1, 0, 3)), ODD[2], dtype, "cuda", pipe,
                   state_kb=True, state_wy_many=False)
    check_pipeline(Step((300, 5), (0, 2), (128, 5)), ODD[2], dtype, "cuda", pipe, state_wy=True)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")])
def test_state_gluon_matches_triton(dtype, monkeypatch):
    """The Gluon state pass (`gluon_state`: TMA, so the aligned inputs a real layer passes) against float64, and
    against the Triton pass bit for bit (the same products in the same order): o, the pool and the capture rows.
    One sequence with a capture cut (Qwen3-Next's heads, the single-sequence tiling), and K = 128, V = 64 with few
    heads, where the single-sequence tiling takes the varlen step (empty and padding sequences, captures at 0,
    inside, at a boundary, at the end), in one launch and in windows."""
    tri = _tri()
    from gdn_trt.plugins.gated_delta_rule import gluon_state

    monkeypatch.setattr(tri, "TUNING", replace(tri.TUNING, state_gluon=True))  # for check_chunked
    cases = [(Step((1000,), (3,), (500,)), QWEN3_NEXT, {}), (Step((65,), (3,), (64,)), QWEN3_NEXT, {}),
             (VARLEN_STEP, ODD[1], {}), (VARLEN_STEP, ODD[1], dict(state_pipe=4, state_pipe_chunks=1))]
    for step, heads, change in cases:
        if not change and dtype == torch.bfloat16:  # (no fp16 bound against float64 is set: fp16 is pinned to
            check_chunked(step, heads, dtype, "cuda", aligned=True)  # the Triton pass, checked in bf16 and fp32)
        x, pack, pool = make_inputs(step, heads, dtype, "cuda", aligned=True)
        N = len(step.lengths)
        assert tri._state_tiling(tri.TUNING, heads.V, heads.HV * N, x.q.device).bv == tri.TUNING.state_bv
        assert gluon_state.usable(x.q, x.k, heads.K, heads.V, tri.TUNING.state_bv), (step, heads)
        at = torch.tensor(step.capture_at, dtype=torch.int32, device="cuda")
        got = []
        for on in (True, False):
            tuning = replace(tri.TUNING, state_gluon=on, **change)
            got_pool, got_cap = pool.clone(), torch.full((N, *x.state_shape), float("nan"), device="cuda")
            with poisoned(tri):
                o = tri.launch_chunked(x, pack, got_pool, Capture(at, got_cap), tuning)
            got.append((o, got_pool, got_cap))
        for name, gl_, tr in zip(("o", "ssm_pool", "ssm_capture"), *got):
            torch.testing.assert_close(gl_, tr, rtol=0, atol=0, equal_nan=True, msg=f"{name}: Gluon != Triton")


@pytest.mark.gpu
def test_chunked_matches_recurrent_bf16():
    """PREFILL of T tokens == T decode steps, on the same bf16 inputs (both against float64 already; this pins
    the two kernels to each other at the bound of the looser one)."""
    heads, step = QWEN3_NEXT, Step((300,), (1,), (-1,))
    x, pack, pool = make_inputs(step, heads, torch.bfloat16, "cuda")
    tri = _tri()
    p_chunk, p_rec = pool.clone(), pool.clone()
    o_chunk = tri.chunked(x, pack, p_chunk, Capture(torch.tensor([-1], dtype=torch.int32, device="cuda"),
                                                    torch.zeros(1, *x.state_shape, device="cuda")))
    o_rec = tri.recurrent(x, pack, p_rec)
    assert_close("o chunked vs recurrent", o_rec.double(), o_chunk.double(), tol(torch.bfloat16, "chunked"))
    assert_close("state chunked vs recurrent", p_rec[1].double(), p_chunk[1].double(), tol(torch.bfloat16, "chunked"))


# ---- CUDA graphs: replay == eager, bit for bit, also after the step's metadata changed ----

def _graph_vs_eager(run, static: list[Tensor], buffers: list[Tensor], new_values: list[list[Tensor]]) -> None:
    """`run()` launches the op on `static` inputs and mutates `buffers`; returns its output. Captures it once,
    then for each set of new input values: eager on copies vs replay, compared bit for bit."""
    start = [b.clone() for b in buffers]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for values in new_values:
        for t, v in zip(static, values):
            t.copy_(v)
        for b, s in zip(buffers, start):
            b.copy_(s)
        graph.replay()
        torch.cuda.synchronize()
        replayed = [out.clone(), *(b.clone() for b in buffers)]
        for b, s in zip(buffers, start):
            b.copy_(s)
        eager = [run(), *buffers]
        torch.cuda.synchronize()
        for i, (r, e) in enumerate(zip(replayed, eager)):
            assert torch.equal(r.nan_to_num(7.0), e.nan_to_num(7.0)), f"output {i}: CUDA-graph replay != eager"


def _steps_same_shape() -> list[Step]:
    return [Step((5, 0, 130, 64, 1), (2, 4, -1, 0, 6), (1, 0, 100, 64, -1)),
            Step((1, 70, 65, 3, 61), (-1, 3, 1, 5, 2), (-1, 64, 0, 3, 30))]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["recurrent", "recurrent_stash", "chunked", "chunked:pipe-4", "recurrent:tma-bv64-w2",
                                "recurrent:tma-bv128-w4-sub16", "recurrent_stash:tma-bv64-w2", "recurrent:ahead-3",
                                "recurrent:persist-3-bv64-w2-s3", "recurrent:persist-3-kh-s3",
                                "recurrent:persist-3-bv64-w2-s3-pairs"])
def test_cuda_graph(op, monkeypatch):
    from gdn_trt.plugins.gated_delta_rule import op as gdn_op

    op, _, variant = op.partition(":")
    if variant in CHUNK_VARIANTS:  # the pipelined state pass: its side stream forked from and joined to the capture
        tri = _tri()
        change = {**CHUNK_VARIANTS[variant], "state_pipe_chunks": 1}  # windows of a chunk: the steps are short
        monkeypatch.setattr(tri, "TUNING", replace(tri.TUNING, **change))
    elif variant:  # a decode variant in the many-sequence tiling: its descriptor or prefetch captured in the graph
        tri = _tri()
        monkeypatch.setattr(tri, "TUNING", replace(tri.TUNING, rec_few_below=0, **REC_VARIANTS[variant]))
        if "pairs" in variant:
            monkeypatch.setattr(sys.modules[__name__], "make_inputs", aligned_inputs)

    steps = _steps_same_shape()
    x, pack, pool = make_inputs(steps[0], QWEN3_NEXT, torch.bfloat16, "cuda")
    T, N = sum(steps[0].lengths), len(steps[0].lengths)
    stash = torch.full((T, *x.state_shape), float("nan"), device="cuda")
    cap = Capture(torch.tensor(steps[0].capture_at, dtype=torch.int32, device="cuda"),
                  torch.full((N, *x.state_shape), float("nan"), device="cuda"))
    run = {"recurrent": lambda: gdn_op.recurrent(x, pack, pool)[0],
           "recurrent_stash": lambda: gdn_op.recurrent_stash(x, pack, pool, stash)[0],
           "chunked": lambda: gdn_op.chunked(x, pack, pool, cap)[0]}[op]
    static = [x.q, x.k, x.v, x.a, x.b, pack.cu_seqlens, pack.slots, cap.at]
    new_values = []
    for step in steps:
        x2, pack2, _ = make_inputs(step, QWEN3_NEXT, torch.bfloat16, "cuda")
        new_values.append([x2.q, x2.k, x2.v, x2.a, x2.b, pack2.cu_seqlens, pack2.slots,
                           torch.tensor(step.capture_at, dtype=torch.int32, device="cuda")])
    _graph_vs_eager(run, static, [pool, stash, cap.buf], new_values)
