"""A decode graph's input and output by address (runtime/graph_io.py) and the io words of the index buffer.

CPU: which x the kernel reads where it lies (in place, strided, misaligned, overlapping the fixed input), the io
words sent only when they change and read back as written, the index buffer's bytes as the budget counts them.
Interpreter (rerun of this file with TRITON_INTERPRET=1): both kernels against torch's own copy and add, bit for bit
(a copy and one rounded add have one right answer), rows split over two column programs with a masked tail, padding
rows zeroed, the caller's rows outside the step (poisoned with NaN) untouched, a zero address writing nothing; and
`GraphCache._run_io`'s host path over a stand-in graph that launches what the capture records (outputs, the words
it sends, which buffer it returns, the padding rows zeroed), and its acceptance gate failing a stand-in whose rows_in
or copy-out is wrong.
sm_90: both kernels compile without spills and move rows in 16-byte vectors. GPU (marked gpu): a session with the
kernels against one without, bit for bit over fresh, strided, misaligned and in-place inputs, copied and in-place
outputs, buckets with padding; the other GPU tests of the runtime run with them on too (tests/test_graphs.py,
tests/test_step_context.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_trt.runtime import graph_io
from gdn_trt.runtime.budget import pack_bytes
from gdn_trt.runtime.pack import PackBuffers
from gdn_trt.runtime.stack import Packed

from .kernel_support import INSIDE, rerun_under_interpreter


def _words(pk: PackBuffers) -> list[int]:
    return pk.io.tolist()


def test_io_words_are_sent_only_when_they_change():
    pk = PackBuffers(8, 40, torch.device("cpu"))
    lo, size = pk.regions["io"]
    assert lo % 2 == 0 and size == 6
    spans = sorted(pk.regions.values())  # the regions do not overlap and end with the buffer
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:])) and sum(spans[-1]) == pk.size
    assert max(o + s for r, (o, s) in pk.regions.items() if r not in ("io", "fold")) <= lo  # past a step's data
    assert _words(pk) == [0, 0, 0]
    before = pk.copies
    pk.send_io(0, 0, 0)  # what the device holds from the start
    assert pk.copies == before
    pk.send_io(1 << 40, 4096, (1 << 41) + 16)
    assert pk.copies == before + 1 and _words(pk) == [1 << 40, 4096, (1 << 41) + 16]
    pk.send_io(1 << 40, 4096, (1 << 41) + 16)
    assert pk.copies == before + 1
    pk.send_io(1 << 40, 4096, 0)
    assert pk.copies == before + 2 and _words(pk) == [1 << 40, 4096, 0]


def test_io_words_leave_the_other_regions_as_sent():
    pk = PackBuffers(4, 10, torch.device("cpu"))
    h = pk.host()
    h[:8] = np.arange(8)
    pk.send(8)
    pk.send_io(123456789012, 8, 0)
    assert pk.dev[:8].tolist() == list(range(8)) and _words(pk) == [123456789012, 8, 0]
    before = pk.copies
    pk.send(8)  # unchanged: the io copy did not disturb what `send` knows the device holds
    assert pk.copies == before


@pytest.mark.parametrize("seqs,tokens", [(1, 1), (6, 40), (7, 33)])
def test_budget_counts_the_index_buffer(seqs, tokens):
    pk = PackBuffers(seqs, tokens, torch.device("cpu"))
    dev, host = pack_bytes(seqs, tokens)
    assert dev == pk.dev.nbytes + pk.cu_decode.nbytes and host == sum(h.nbytes for h in pk._host)


def test_addresses_read_what_the_kernel_can():
    fixed = torch.zeros(8, 64, dtype=torch.bfloat16)
    assert graph_io.addresses(fixed[:3], fixed, 3) == (0, 0)  # the step's input rows: in place
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert graph_io.addresses(x, fixed, 3) == (x.data_ptr(), 64)
    wide = torch.randn(3, 96).to(torch.bfloat16)
    assert graph_io.addresses(wide[:, :64], fixed, 3) == (wide.data_ptr(), 96)  # a row stride of whole 16 B units
    assert graph_io.addresses(torch.randn(3, 68).to(torch.bfloat16)[:, :64], fixed, 3) is None  # 136 B rows
    flat = torch.randn(3 * 64 + 1).to(torch.bfloat16)
    assert graph_io.addresses(flat[1:].view(3, 64), fixed, 3) is None  # 2 bytes off
    assert graph_io.addresses(torch.randn(64, 3).to(torch.bfloat16).T, fixed, 3) is None  # columns
    assert graph_io.addresses(fixed[2:5], fixed, 3) is None  # overlaps the fixed rows it would write
    row = torch.randn(1, 64).to(torch.bfloat16)
    assert graph_io.addresses(row.expand(3, 64), fixed, 3) == (row.data_ptr(), 0)  # one row broadcast


if not INSIDE:
    def test_interpreter_cases():
        rerun_under_interpreter(__file__, "-k", "interp")

    def test_kernels_compile_for_sm90_in_16_byte_vectors():
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        from gdn_trt.plugins import triton_aot

        for dt, vec in (("bf16", 8), ("fp16", 8), ("fp32", 4)):
            sig = {"io": "*i64", "slots": "*i32", "x": f"*{dt}", "D": "i32", "VEC": "constexpr", "BLOCK": "constexpr",
                   "PDL": "constexpr"}
            out_sig = {"io": "*i64", "slots": "*i32", "x": f"*{dt}", "res": f"*{dt}", "hidden": f"*{dt}", "D": "i32",
                       "s_x": "i32", "s_r": "i32", "HAS_RES": "constexpr", "BLOCK": "constexpr", "PDL": "constexpr"}
            for fn, s, const in ((graph_io._rows_in_kernel, sig, dict(VEC=vec, BLOCK=graph_io.BLOCK)),
                                 (graph_io._rows_out_kernel, out_sig, dict(HAS_RES=True, BLOCK=graph_io.BLOCK))):
                names = list(s)
                attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in s if s[n].startswith("*")}
                for n in ("D", "s_x", "s_r"):
                    if n in s:
                        attrs[(names.index(n),)] = [["tt.divisibility", 16]]
                for on in (False, True):  # the graph's launch is the PDL one (sm_90 and later)
                    k = triton.compile(ASTSource(fn, s, attrs=attrs, constexprs={**const, "PDL": on}),
                                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
                    _, stack = triton_aot._resource_usage(k.asm["cubin"])
                    ptx = k.asm["ptx"]
                    assert stack == 0, (fn.__name__, dt)
                    # the rows move in 16-byte vectors, the user's too (the address and row stride hints)
                    assert "ld.global.v4" in ptx and "st.global.v4" in ptx, (fn.__name__, dt)
                    # with PDL the wait comes before anything is read, then the trigger (plugins/pdl.py's rule)
                    assert ("griddepcontrol.wait" in ptx) == on and ("griddepcontrol.launch_dependents" in ptx) == on
                    if on:
                        assert ptx.index("griddepcontrol.wait") < ptx.index("ld.global"), fn.__name__

if INSIDE:
    def _case(B: int, n: int, D: int, dtype, stride: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        src = torch.randn(n, stride, generator=g).to(dtype)
        slots = torch.tensor([3 * r + 1 if r < n else -1 for r in range(B)], dtype=torch.int32)
        return src, slots

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("B,n,D,stride", [(4, 3, 1040, 1056), (1, 1, 48, 48), (8, 8, 64, 64), (5, 2, 2048, 2048)])
    def test_interp_rows_in(B, n, D, stride, dtype):
        src, slots = _case(B, n, D, dtype, stride, seed=B * D)
        x = torch.full((B, D), float("nan"), dtype=dtype)
        io = torch.tensor([src.data_ptr(), stride, 0], dtype=torch.int64)
        graph_io.rows_in(io, slots, x)
        assert torch.equal(x[:n], src[:, :D]) and torch.equal(x[n:], torch.zeros(B - n, D, dtype=dtype))
        # in place: the step's rows are the caller's own (poison stands in for them), only padding is written
        x = torch.full((B, D), float("nan"), dtype=dtype)
        graph_io.rows_in(torch.zeros(3, dtype=torch.int64), slots, x)
        assert x[:n].isnan().all() and torch.equal(x[n:], torch.zeros(B - n, D, dtype=dtype))

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
    @pytest.mark.parametrize("residual", [True, False], ids=["plain", "hc"])
    @pytest.mark.parametrize("B,n,D,stride", [(4, 3, 1040, 1040), (1, 1, 48, 48), (6, 6, 64, 64), (5, 4, 48, 80)])
    def test_interp_rows_out(B, n, D, stride, residual, dtype):
        g = torch.Generator().manual_seed(B + D)
        x, res = (torch.randn(B, stride, generator=g).to(dtype)[:, :D] for _ in range(2))  # row stride `stride`
        slots = torch.tensor([r if r < n else -1 for r in range(B)], dtype=torch.int32)
        want = x + res if residual else x  # torch's add: both widened, one rounding to nearest even
        if residual and dtype == torch.bfloat16:
            # the interpreter's fp32 -> bf16 conversion truncates (the GPU's rounds as torch does: the session test
            # below): the same fp32 sum, truncated
            wide = (x.float() + res.float()).view(torch.int32) & ~0xFFFF
            want = wide.view(torch.float32).to(torch.bfloat16)
        dst = torch.full((n + 1, D), float("nan"), dtype=dtype)  # a row past the step's, the caller's
        io = torch.tensor([0, 0, dst.data_ptr()], dtype=torch.int64)
        hidden = graph_io.rows_out(io, slots, Packed(x, res if residual else None, None, None))
        assert torch.equal(hidden, want) and (hidden is x) == (not residual)
        assert torch.equal(dst[:n], want[:n]) and dst[n].isnan().all()
        dst.fill_(float("nan"))
        again = graph_io.rows_out(torch.zeros(3, dtype=torch.int64), slots,
                                  Packed(x, res if residual else None, None, None))
        assert torch.equal(again, want) and dst.isnan().all()  # no destination: nothing written


if INSIDE:
    class _Launches:
        """Stands in for a decode graph captured with graph_io's kernels: its replay launches what the capture
        recorded, in order, on the same buffers (the kernels run under the interpreter; the stack between them is
        a stub layer, out = (2x, residual x + 1)); `hidden` is the capture's fixed output."""

        def __init__(self, io, slots, x):
            self.io, self.slots, self.x, self.hidden = io, slots, x, torch.zeros_like(x)

        def replay(self) -> None:
            graph_io.rows_in(self.io, self.slots, self.x)
            out = Packed(self.x * 2, self.x + 1, None, None)
            self.hidden.copy_(graph_io.rows_out(self.io, self.slots, out))

    def test_interp_run_io_host_path():
        """`GraphCache._run_io` on a gated io entry of bucket 4 on the CPU: fresh, misaligned and in-place x, copied
        and in-place outputs, 3 then 2 step rows. Each output equals the stub layer on x; a copy is a fresh tensor
        and `copy=False` the fixed output's rows; the padding rows of the fixed input are zero after each step; the
        io words name x (zero in place or where torch copied x in) and the output."""
        from gdn_trt.model.modes import LayerMode
        from gdn_trt.plugins.packing import Packing
        from gdn_trt.runtime import graphs
        from gdn_trt.runtime.stats import GraphStats

        B, D = 4, 48
        pk = PackBuffers(8, 16, torch.device("cpu"))
        gc = graphs.GraphCache(None, None, GraphStats(), None, pk)
        fixed = graphs._Input(torch.zeros(B, D))
        slots = pk.view("slots", 0, B)
        graph = _Launches(pk.io, slots, fixed.x)
        seg = graphs._Segment((), True, None, None, graph, graph.hidden)
        entry = graphs._Entry(LayerMode.DECODE_MULTI_SEQ, B, fixed, None, Packing(pk.cu_decode[:B + 1], slots),
                              None, [seg], gated=True, io=True)
        g = torch.Generator().manual_seed(1)
        flat = torch.zeros(3 * D + 1)
        for step, (how, n, copy) in enumerate([("fresh", 3, True), ("misaligned", 3, True), ("in place", 3, False),
                                               ("fresh", 2, False), ("in place", 2, True)]):
            h = pk.host()
            h[:B] = [5, 1, 3, 0][:n] + [-1] * (B - n)
            pk.send(B)
            want = torch.randn(n, D, generator=g)
            if how == "fresh":
                x = want.clone()
            elif how == "misaligned":
                x = flat[1:1 + n * D].view(n, D)
                x.copy_(want)
            else:
                x = fixed.x[:n]
                x.copy_(want)
            fixed.x[n:] = float("nan")  # a larger earlier step's rows: the replay must zero them
            got = gc._run_io(None, entry, x, n, None, copy)
            assert torch.equal(got, want * 2 + (want + 1)), (step, how)
            assert torch.equal(fixed.x[n:], torch.zeros(B - n, D)) and fixed.dirty == n, step
            src, stride, dst = pk.io.tolist()
            assert (src, stride) == ((x.data_ptr(), D) if how == "fresh" else (0, 0)), step
            if copy:
                assert dst == got.data_ptr() and got.data_ptr() != graph.hidden.data_ptr(), step
            else:
                assert dst == 0 and got.data_ptr() == graph.hidden.data_ptr() and got.shape == (n, D), step
        assert gc.stats.replays == 5


    class _WrongIn(_Launches):
        """A rows_in that brings x in wrong (row 0 off by one): the replay and any eager run on what it wrote agree."""

        def replay(self) -> None:
            graph_io.rows_in(self.io, self.slots, self.x)
            self.x[0] += 1
            out = Packed(self.x * 2, self.x + 1, None, None)
            self.hidden.copy_(graph_io.rows_out(self.io, self.slots, out))

    class _WrongOut(_Launches):
        """A rows_out whose copy to the caller's rows differs from the fixed output it also writes."""

        def replay(self) -> None:
            super().replay()
            graph_io.rows_out(self.io, self.slots, Packed(self.x * 3, self.x + 1, None, None))

    class _Selector:
        def __init__(self):
            self.failed = []

        def fail_bucket(self, mode, bucket, reason):
            self.failed.append(reason)

        def say(self, *args) -> None:
            pass

    @pytest.mark.parametrize("graph_cls", [_Launches, _WrongIn, _WrongOut])
    @pytest.mark.parametrize("how", ["fresh", "in place"])
    def test_interp_gate_covers_both_io_kernels(graph_cls, how):
        """The acceptance gate of an io entry (its first step, `_run_io` with the entry not yet gated) over the
        stand-in graph: right kernels pass it and return the stub layer on x; a rows_in that brings x in wrong, or a
        copy-out that differs from the output, fails it (the eager reference reads x as torch copies it, and the
        copy-out is compared), and the failed step returns the eager result. In place, rows_in reads nothing: the
        wrong-in stand-in's fault is then in the caller's rows themselves, which the eager run reads too."""
        from gdn_trt.model.modes import LayerMode
        from gdn_trt.plugins.packing import Packing
        from gdn_trt.runtime import graphs
        from gdn_trt.runtime.stats import GraphStats

        B, D, n = 4, 48, 3
        pk = PackBuffers(8, 16, torch.device("cpu"))
        sel = _Selector()
        gc = graphs.GraphCache(None, sel, GraphStats(), None, pk)
        gc._state = lambda verify: []  # no pool: the stub layer writes no state
        gc._eager = lambda entry, ctx: entry.x * 2 + (entry.x + 1)
        fixed = graphs._Input(torch.zeros(B, D))
        slots = pk.view("slots", 0, B)
        graph = graph_cls(pk.io, slots, fixed.x)
        seg = graphs._Segment((), True, None, None, graph, graph.hidden)
        entry = graphs._Entry(LayerMode.DECODE_MULTI_SEQ, B, fixed, None, Packing(pk.cu_decode[:B + 1], slots),
                              None, [seg], io=True)
        gc._entries["k"] = entry
        pk.host()[:B] = [5, 1, 3, -1]
        pk.send(B)
        want = torch.randn(n, D, generator=torch.Generator().manual_seed(2))
        x = want.clone() if how == "fresh" else fixed.x[:n].copy_(want)
        got = gc._run_io("k", entry, x, n, None, copy=False)
        ok = graph_cls is _Launches or (graph_cls is _WrongIn and how == "in place")
        assert entry.gated == ok and ("k" in gc._entries) == ok and len(sel.failed) == (not ok)
        if graph_cls is _WrongOut:
            assert sel.failed == ["the replay's copy of its output to the caller's rows differs from its output"]
        elif graph_cls is _WrongIn and how == "fresh":
            assert sel.failed[0].startswith("replay differs from eager")
        base = x if graph_cls is not _WrongIn or how == "fresh" else fixed.x[:n]
        assert torch.equal(got, base * 2 + (base + 1))


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", [("tiny-3.5", torch.bfloat16), ("tiny-4exp", torch.float32)])
def test_session_with_graph_io_equals_one_without(name, dtype):
    """Decode steps of 3 and 2 sequences (bucket 4: one and two padding rows) through `run` with x fresh, a strided
    view, 2 bytes off alignment (copied by torch), the step's input rows (in place), and the output copied or taken
    in place: every output and the whole state equal a session without the kernels, bit for bit."""
    from gdn_trt.runtime.budget import RuntimeLimits
    from gdn_trt.runtime.seqs import Prompt
    from gdn_trt.runtime.session import Session, SessionOptions

    limits = RuntimeLimits(max_seqs=4, max_prefill_tokens=32, max_draft=1, ple_cache_rows=64, graph_buckets=(4,))
    sessions = []
    for io in (False, True):
        s = Session.open(name, backend="torch", device="cuda", options=SessionOptions(limits=limits, dtype=dtype))
        s.graphs.io = io
        sessions.append(s)
    ref, got = sessions
    D = ref.cfg.stream_dim
    g = torch.Generator().manual_seed(7)
    h = torch.randn(3, 12, D, generator=g).to("cuda", dtype)
    ids = torch.randint(0, ref.cfg.vocab_size, (3, 12), generator=g).numpy() if ref.feeds else None
    for s in sessions:
        qs = np.array([s.add_sequence() for _ in range(3)])
        s.prefill_batch({int(q): Prompt(h[k, :4], None if ids is None else ids[k, :4]) for k, q in enumerate(qs)})
    wide = torch.zeros(3, D + 64, dtype=dtype, device="cuda")
    flat = torch.zeros(3 * D + 1, dtype=dtype, device="cuda")
    for t, (how, n) in enumerate([("fresh", 3), ("strided", 3), ("misaligned", 3), ("fresh", 2), ("in place", 3),
                                  ("in place", 2), ("view out", 3), ("fresh", 3)]):
        t += 4
        x = h[:n, t].clone()
        outs = []
        for s in sessions:
            tid = None if ids is None else ids[:n, t]
            with s.begin_step(qs[:n], "decode", None, tid) as st:
                if how == "strided":
                    wide[:n, :D] = x
                    arg = wide[:n, :D]
                elif how == "misaligned":
                    arg = flat[1:1 + n * D].view(n, D)
                    arg.copy_(x)
                elif how == "in place":
                    arg = st.input().copy_(x)
                else:
                    arg = x.clone()
                out = st.run(arg, copy=how != "view out")
                outs.append(out.clone())
        assert torch.equal(outs[0], outs[1]), f"step {t} ({how}, {n} rows)"
    for a, b in zip(*[[t for st in s.pool.layers.values() for t in st.tensors()] for s in sessions]):
        assert torch.equal(a, b)
    assert got.stats().graphs.captured == ["decode_multi_seq bucket 4"] and not got.stats().graphs.gate_failures
    assert got.graphs._entries and all(e.io for e in got.graphs._entries.values())
    got.graphs.replayable(4)
    assert got.graphs.pack.io.tolist() == [0, 0, 0]  # a benchmark's replays write nowhere the last step named
