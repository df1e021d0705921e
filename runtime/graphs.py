"""CUDA-graph cache for decode and verify steps: one entry per (engines, mode, bucket), captured piecewise around
vetoed layers.

An entry reads a fixed activation buffer of its rows (x, one per row count, shared by the entries of that count:
steps run one at a time; the residual before the first layer is zeros) and the step's index data where the
step put it: the slots (-1 past the step's sequences), cu_seqlens and LoRA slots of a decode group padded to its
bucket sit at the start of the session's index buffer (`pack.PackBuffers`), the same addresses every step, and its
PLE rows at the start of each prestage's fixed buffer, padding rows zero, staged when the step opened. A step of N <=
bucket sequences copies its x into rows 0..N-1 (a host that wrote its x there itself, `input_rows`, saves the copy);
the ops skip the padding slots (padding never writes a pool row). A verify entry (`SessionOptions.verify_graphs`)
is the same over the bucket's rows (bucket x max_draft): its packing's offsets sit at the start of the cu region,
the padding sequences share the padding rows (`select.GraphPolicy`), and it writes the stash window from row 0, the
only window a padded verify gets (`steps._pads`). The last captured segment also holds the final
residual add, so a replay is one launch and its output one fixed buffer, copied out unless the caller takes the view
(`run(..., copy=False)`). With `IO` on, a fully captured entry's graph does both itself: it begins and ends with
`graph_io`'s kernels, which read x from and write the output to the addresses `run` sends as the index buffer's io
words, and zero the padding rows (so `run` launches the replay alone). The adapter slot weights are read in
place, so adapters uploaded between replays are what the next replay uses. The stack is cut into segments of
consecutive layers: a segment whose layers have no capture veto is captured once (after a warm-up, with every slot
-1, so neither warm-up nor capture writes state; the step's slots are put back afterwards) and replayed; a vetoed
segment runs eagerly on the same padded buffers.

`host_captures` records the (mode, sequences, rows, stash row) of steps whose layer calls a host captured in its own
CUDA graph (`steps.Step.replayed`).

Acceptance gate: the first step of an entry is run both ways on the same inputs, the replay first, then the pool
rows (verify: the stash rows) it wrote are put back and the stack runs eagerly; the bucket is used only when outputs
and every written state row agree bit for bit. Otherwise the eager result stands, the bucket runs eagerly from then
on, and the log says why (a bucket that silently computes garbage is the failure this prevents).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gdn_trt.model.modes import LayerMode, StepKind
from gdn_trt.plugins import pdl
from gdn_trt.plugins.packing import Packing

from . import graph_io
from .engine import Engine
from .pack import PackBuffers
from .ple.feeds import PleFeeds
from .select import Group, Selector
from .stack import Packed, Stack, StepContext
from .stats import GraphStats

log = logging.getLogger("gdn_trt.runtime")

# `graph_io`'s kernels at the ends of a fully captured decode graph (x in and the output out by address, no torch
# copies on the host). On: `run(x)`'s idle-GPU enqueue 45.9 / 55.8 / 69.3 us without against 37.0 / 37.8 / 39.8 with
# at N = 1 / 8 / 64 (73.1 against 73.6 at N = 256), the wall 0.967-0.997x, the graph's replay 1.003-1.011x (its two
# kernels), H200, bench/results/2026-12-05-switches.md; GDN_TRT_GRAPH_IO=0 turns it off.
IO = os.environ.get("GDN_TRT_GRAPH_IO", "1") == "1"


@dataclass
class _Segment:
    engines: tuple[Engine, ...]
    captured: bool
    inp: Packed  # fixed inputs of the segment
    out: Packed | None = None  # graph: the outputs captured; eager: filled by each run
    graph: torch.cuda.CUDAGraph | None = None
    hidden: Tensor | None = None  # the last segment's graph: its output after the residual add, captured with it


@dataclass
class _Input:
    """The fixed x [B, stream_dim] of a bucket size and how many of its rows hold a step's data."""

    x: Tensor
    dirty: int = 0  # rows of x holding a step's data (rows past a smaller next step are zeroed)
    rows: dict[int, Tensor] = field(default_factory=dict)  # n -> x[:n], made once (`input_rows`)


@dataclass
class _Entry:
    mode: LayerMode
    bucket: int
    inp: _Input
    residual: Tensor | None  # [B, C] zeros (plain)
    pack: Packing  # the step's padded packing: slots [B] (-1 past the step's sequences), cu [B+1]
    lora_idx: Tensor | None = None  # [B] int32 LoRA slot per token, -1 past the step's
    segments: list[_Segment] = field(default_factory=list)
    gated: bool = False
    out_rows: dict[int, Tensor] = field(default_factory=dict)  # n -> rows of the last segment's fixed output
    io: bool = False  # one captured segment with graph_io's kernels at its ends

    @property
    def x(self) -> Tensor:
        return self.inp.x


class GraphCache:
    """Captured decode steps of one session's stack."""

    def __init__(self, stack: Stack, selector: Selector, stats: GraphStats, feeds: PleFeeds | None,
                 pack: PackBuffers):
        self.stack, self.selector, self.stats, self.feeds, self.pack = stack, selector, stats, feeds, pack
        self.io = IO
        self._entries: dict[tuple, _Entry] = {}
        self._by_group: dict[int, tuple[Group, tuple]] = {}
        self._inputs: dict[int, _Input] = {}  # bucket -> its fixed x
        self.host_captures: set[tuple[LayerMode, int, int, int]] = set()

    def input_rows(self, bucket: int, n: int) -> Tensor:
        """Rows 0..n-1 of the fixed x of `bucket`: a host that writes its step's input there and passes them to
        `run` saves the copy (they are overwritten by the next step's input)."""
        fixed = self._input(bucket)
        rows = fixed.rows.get(n)
        if rows is None:  # a view costs about 3 us of the H200's host (1 us here): made once per row count
            rows = fixed.rows[n] = fixed.x if n == fixed.x.shape[0] else fixed.x[:n]
        return rows

    def run(self, g: Group, inp: Packed, ctx: StepContext, copy: bool = True) -> Tensor | None:
        """Run decode group `g` (bucket set, at least one layer captured) on `inp.x [n, stream_dim]` with the step's
        padded packing and LoRA slots (`inp`) and PLE rows (`ctx`); returns the hidden state `[n, ...]` (a fresh
        tensor; `copy=False`: rows of the fixed output buffer, overwritten by the next replay), or None when the
        capture failed (the bucket then runs eagerly from now on: the caller runs the step eagerly)."""
        hit = self._by_group.get(id(g))  # the selector memoizes groups: a steady loop finds its entry by identity
        if hit is not None and hit[0] is g and hit[2] is not None:  # gated: an entry that passed its gate stays
            key, entry = hit[1], hit[2]  # (looking the nested key up hashed it again: 0.2 us on this 2-core CPU)
        elif hit is not None and hit[0] is g:
            key, entry = hit[1], self._entries.get(hit[1])
        else:
            key = (tuple(id(e) for e in g.engines), g.mode, g.bucket, g.vetoes)
            entry = self._entries.get(key)
        if entry is None:
            try:
                entry = self._build(g, inp, ctx)
            except Exception as e:  # a capture that fails must not take the step down: eager, and say why
                reason = f"capture failed: {type(e).__name__}: {e}"
                self.stats.gate_failures.append(f"{g.mode.value} bucket {g.bucket}: {reason}")
                self.selector.fail_bucket(g.mode, g.bucket, reason)
                self.selector.say(f"{g.mode.value} bucket {g.bucket} runs eagerly from now on: {reason}",
                                  logging.WARNING)
                return None
            self._entries[key] = entry
        if hit is None or hit[0] is not g or (hit[2] is None and entry.gated):
            if len(self._by_group) > 4096:
                self._by_group.clear()
            self._by_group[id(g)] = (g, key, entry if entry.gated else None)
        n = inp.x.shape[0]
        if entry.io:
            return self._run_io(key, entry, inp.x, n, ctx, copy)
        self._fill(entry.inp, inp.x, n)
        if entry.gated:
            out = self._replay(entry, ctx)
            if n != entry.x.shape[0]:  # a view costs a call (about 3 us on the H200's host): the fixed output's kept
                fixed = entry.segments[-1].hidden
                out = entry.out_rows.get(n) if out is fixed else out[:n]
                if out is None:
                    out = entry.out_rows[n] = fixed[:n]
            return out.clone() if copy else out
        return self._gate(key, entry, ctx, inp.pack.slots[:n])

    def replayable(self, bucket: int, verify: bool = False) -> list[torch.cuda.CUDAGraph] | None:
        """The graphs of the gated, fully captured decode (`verify`: verify) entry of `bucket` (None if there is
        none), in order: for benchmarks that time the device work of a step without the runtime's host work around
        it. Replaying them runs that step again on the inputs and slots the last step left in the fixed buffers
        (the io words are cleared first: the last step's x and output may be gone)."""
        self.pack.send_io(0, 0, 0)
        for entry in self._entries.values():
            kind = entry.mode.spec.kind is StepKind.VERIFY
            if entry.bucket == bucket and kind == verify and entry.gated and all(s.captured for s in entry.segments):
                return [s.graph for s in entry.segments]
        return None

    # ---- building ----
    def _build(self, g: Group, inp: Packed, ctx: StepContext) -> _Entry:
        R, cfg, dev = g.rows, self.stack.cfg, self.stack.pool.device
        fixed = self._input(R)
        x = fixed.x
        residual = None if cfg.is_hc else torch.zeros((R, cfg.hidden_size), dtype=x.dtype, device=dev)
        entry = _Entry(g.mode, g.bucket, fixed, residual, inp.pack, inp.lora_idx)
        # graph_io's kernels move a row per slot: decode only
        entry.io = self.io and g.mode.spec.one_token_per_sequence and all(v is None for v in g.vetoes)
        seg_in = Packed(x, residual, entry.pack, entry.lora_idx)
        mempool = torch.cuda.graph_pool_handle()
        saved = entry.pack.slots.clone()  # the step's slots: the warm-ups and the capture run with every slot -1
        try:
            k = 0
            while k < len(g.engines):
                captured = g.vetoes[k] is None
                end = k
                while end < len(g.engines) and (g.vetoes[end] is None) == captured:
                    end += 1
                seg = _Segment(g.engines[k:end], captured, seg_in)
                if captured:
                    self._capture(entry, seg, ctx, mempool, last=end == len(g.engines))
                    seg_in = seg.out
                else:
                    seg_in = Packed(torch.zeros_like(x), None if residual is None else torch.zeros_like(residual),
                                    entry.pack, entry.lora_idx)
                entry.segments.append(seg)
                k = end
        finally:
            entry.pack.slots.copy_(saved)
        return entry

    def _input(self, rows: int) -> _Input:
        fixed = self._inputs.get(rows)
        if fixed is None:
            cfg, pool = self.stack.cfg, self.stack.pool
            x = torch.zeros((rows, cfg.stream_dim), dtype=pool.spec.act_dtype, device=pool.device)
            fixed = self._inputs[rows] = _Input(x)
        return fixed

    def _capture(self, entry: _Entry, seg: _Segment, ctx: StepContext, mempool: tuple, last: bool) -> None:
        """Warm up and capture one segment with every slot -1 (nothing is written), reading fixed PLE buffers; the
        stack's last segment with the final residual add."""
        ctx = StepContext(ctx.rows, None, None, ctx.stash_at)
        entry.pack.slots.fill_(-1)
        side = torch.cuda.Stream(self.stack.pool.device)
        side.wait_stream(torch.cuda.current_stream())
        io, slots = self.pack.io, entry.pack.slots
        # the io kernels with PDL, as the stack's layer kernels (graph_io's docstring); warmed as they are captured
        with torch.cuda.stream(side), pdl.scope():
            for _ in range(2):  # first launches compile / autotune / allocate outside the capture
                out = self.stack.run(entry.mode, seg.engines, seg.inp, ctx)
            if entry.io:
                graph_io.warm(io, slots, entry.x, out)
        torch.cuda.current_stream().wait_stream(side)
        seg.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(seg.graph, pool=mempool), pdl.scope():
            if entry.io:
                graph_io.rows_in(io, slots, entry.x)
            seg.out = self.stack.run(entry.mode, seg.engines, seg.inp, ctx)
            if last:
                seg.hidden = graph_io.rows_out(io, slots, seg.out) if entry.io else Stack.hidden(seg.out)

    # ---- running ----
    @staticmethod
    def _fill(fixed: _Input, x: Tensor, n: int) -> None:
        """Copy a step's n rows into the fixed x (unless x is those rows); rows a larger earlier step left are zeroed
        (padding computes on zeros, never on another step's data)."""
        if x is not fixed.x and x is not fixed.rows.get(n) and (x.data_ptr() != fixed.x.data_ptr()
                                                                or x.stride() != fixed.x.stride()):
            fixed.x[:n].copy_(x)
        if fixed.dirty > n:
            fixed.x[n:fixed.dirty].zero_()
        fixed.dirty = n

    def _run_io(self, key: tuple, entry: _Entry, x: Tensor, n: int, ctx: StepContext, copy: bool) -> Tensor:
        """`run` of an entry with graph_io's kernels: the io words name x (zero: in place) and, for a copy, a fresh
        output; x the kernel cannot read is copied in by torch first. The first step passes the gate as `run`'s."""
        fixed = entry.inp
        src = graph_io.addresses(x, fixed.x, n)
        if src is None:
            fixed.x[:n].copy_(x)
            src = (0, 0)
        fixed.dirty = n  # the replay zeroes the rows past n
        hidden = entry.segments[0].hidden
        # the gate's step always copies out, so that rows_out's store to the caller's rows is compared too
        out = hidden.new_empty((n, hidden.shape[1])) if copy or not entry.gated else None
        self.pack.send_io(src[0], src[1], 0 if out is None else out.data_ptr())
        if not entry.gated:
            return self._gate(key, entry, ctx, entry.pack.slots[:n], x if src[0] else None, out)
        entry.segments[0].graph.replay()
        self.stats.replays += 1
        if out is not None:
            return out
        rows = entry.out_rows.get(n)
        if rows is None:
            rows = entry.out_rows[n] = hidden if n == entry.bucket else hidden[:n]
        return rows

    def _replay(self, entry: _Entry, ctx: StepContext) -> Tensor:
        out = None
        for seg in entry.segments:
            if out is not None and out is not seg.inp:
                seg.inp.x.copy_(out.x)
                if seg.inp.residual is not None:
                    seg.inp.residual.copy_(out.residual)
            if seg.captured:
                seg.graph.replay()
                out = seg.out
                self.stats.replays += 1
                if seg.hidden is not None:
                    return seg.hidden
            else:
                out = self.stack.run(entry.mode, seg.engines, seg.inp, ctx)
        return Stack.hidden(out)

    def _eager(self, entry: _Entry, ctx: StepContext) -> Tensor:
        engines = tuple(e for seg in entry.segments for e in seg.engines)
        return Stack.hidden(self.stack.run(entry.mode, engines, Packed(entry.x, entry.residual, entry.pack,
                                                                        entry.lora_idx), ctx))

    def _gate(self, key: tuple, entry: _Entry, ctx: StepContext, slots: Tensor, x: Tensor | None = None,
              out: Tensor | None = None) -> Tensor:
        """First use: replay, put the written rows back, run eagerly on the same inputs, compare bit for bit. An io
        entry's replay read x by address (`x`: None when it was in place) and also wrote `out`: the eager run reads x
        as torch copies it, not as the graph's rows_in did, and `out` must equal its output too, so both io kernels
        are under the gate. `slots`: the decode step's (a row each)."""
        verify = entry.mode.spec.kind is StepKind.VERIFY
        n = entry.inp.dirty  # the step's rows
        state = self._state(verify)
        # verify: the stash window (from row ctx.stash_at, the bucket's rows); decode: the step's pool rows
        idx = (torch.arange(entry.x.shape[0], device=slots.device) + ctx.stash_at) if verify else slots.to(torch.int64)
        before = self._rows(state, idx)
        got = self._replay(entry, ctx)[:n].clone()
        after_graph = self._rows(state, idx)
        self._put(state, idx, before)
        if x is not None:
            self._fill(entry.inp, x, n)
        want = self._eager(entry, ctx)[:n].clone()
        after_eager = self._rows(state, idx)
        name = f"{entry.mode.value} bucket {entry.bucket}"
        output, copied = torch.equal(got, want), out is None or torch.equal(out, want)
        if output and copied and all(torch.equal(a, b) for a, b in zip(after_graph, after_eager)):
            entry.gated = True
            self.stats.captured.append(name)
            self.selector.say(f"captured {name}: replay == eager bit for bit; "
                              f"{sum(s.captured for s in entry.segments)} graph segment(s)"
                              f"{', input and output by address' if entry.io else ''}")
            return got
        diff = (got.double() - want.double()).abs().max().item()
        reason = f"replay differs from eager (max |output diff| {diff:.3e})"
        if output and not copied:
            reason = "the replay's copy of its output to the caller's rows differs from its output"
        self.stats.gate_failures.append(f"{name}: {reason}")
        self.selector.fail_bucket(entry.mode, entry.bucket, reason)
        self.selector.say(f"{name} failed its acceptance gate, runs eagerly from now on: {reason}", logging.WARNING)
        del self._entries[key]
        return want

    def _state(self, verify: bool) -> list[Tensor]:
        """The buffers a step writes: every layer's stash (verify) or pool."""
        if verify:
            return [t for s in self.stack.buffers.stash.values() for t in (s.conv, s.ssm, s.ple_conv) if t is not None]
        return [t for st in self.stack.pool.layers.values() for t in st.tensors()]

    @staticmethod
    def _rows(state: list[Tensor], idx: Tensor) -> list[Tensor]:
        return [t.index_select(0, idx) for t in state]

    @staticmethod
    def _put(state: list[Tensor], idx: Tensor, saved: list[Tensor]) -> None:
        for t, v in zip(state, saved):
            t.index_copy_(0, idx, v)
