"""The step context: a step of a set of sequences, opened once, its GDN layers called where the host's model needs
them, closed once.

`open_step(parts, spec)` (after `request.check` accepted the request, so nothing below can fail on the request)
binds adapters to slots, writes the step's index data (slots, cu_seqlens, capture points, LoRA slots per token)
into a pinned buffer sent in one copy (`pack.PackBuffers`) and stages every PLE layer's rows (`ple.feeds`), so that
a layer call only reads device buffers at fixed addresses: it does no host synchronisation and no host-to-device
copy, and a host can capture its whole model step in a CUDA graph. `Step.close()` commits once: positions, the
new PLE id carries and the written-slot fences (decode, prefill), the pending verifies (verify), the prefill
captures.

Per group the layer call runs one engine per layer: the whole decoder layer of the checkpoint (`layer`), or the
token mixer alone (`mixer`, Hugging Face's `linear_attn`: normed hidden in, mixer output out). A decode group with a
CUDA-graph bucket B takes either its n rows or B rows (the host's graph pads to the bucket): rows n..B are padding
(slot -1: no state is read or written for them, their outputs are zero or garbage the host ignores). A verify group
with a bucket (`SessionOptions.verify_graphs`) takes its T rows or the bucket's B x max_draft: B - n padding
sequences follow its n, sharing the padding rows T.. (`select.GraphPolicy`). It is padded only in a step of
verify sequences alone while no other sequence's verify holds stash rows (the steady verify-accept loop), so its
stash window starts at row 0 and holds the padded rows; otherwise that step runs unpadded.

Failure: a call that is refused (out of order, a layer twice, bad shape) raises and changes nothing. A step left
with a layer error (an engine fault, an out-of-memory, an enqueue failure) or abandoned once a layer call was made
cannot be undone here: `abort` marks its sequences failed, with the reason (every call on them but release is
refused, a snapshot too: their state may be half-written); sequences outside the step, and the stash rows of other
pending verifies, are untouched. One abandoned before any layer call changes nothing. (Keeping each step's state
from before it would copy the step's slots every step: at qwen3-next-80b-a3b a slot is 73.7 MiB over 36 layers, so
a 64-sequence decode step, which reads and writes 4.6 GiB of state, would move 9.2 GiB more and hold 4.6 GiB more:
twice the state traffic of the memory-bound decode, for a rare fault. Not done.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.errors import GdnTrtError
from gdn_trt.model.modes import StepKind
from gdn_trt.plugins.packing import Packing

from .guard import guarded
from .pack import PackBuffers
from .parts import StepParts
from .request import Part, StepSpec
from .seqs import StepResult, basic_index
from .stack import Packed, Stack, StepContext
from .state import Fence, SlotState
from .stats import KindStats

# The kinds as module constants: an enum member read off its class (`StepKind.DECODE`) took 94 ns against 12 ns for
# a module global on this 2-core CPU (2026-12-04, timeit), and the steady step read several.
_DECODE, _VERIFY, _PREFILL = StepKind.DECODE, StepKind.VERIFY, StepKind.PREFILL
_NO_CARRIES: dict[int, np.ndarray] = {}  # a group without PLE carries to commit (never written)
_STRIDED = torch.strided


class StepError(GdnTrtError, RuntimeError):
    """A step used out of turn: a layer out of order or twice, a step closed before every layer ran, a second step
    opened while one is open, a call on a closed step."""


@dataclass
class _Bound:
    """One group's device inputs: unpadded (n sequences, their tokens) and padded to the bucket (`padded`: decode
    and verify groups with one, see the module docstring; otherwise the same views)."""

    part: Part
    rows: int  # padded rows (decode: the bucket; verify: the bucket x max_draft) or tokens
    pack: Packing
    pack_pad: Packing
    lora: Tensor | None
    lora_pad: Tensor | None
    ple: dict[int, Tensor]  # layer -> rows [rows, heads, d_h] (padded)
    capture_at: Tensor | None
    stash_at: int = 0  # a verify group's first stash row (its window: SeqTable.stash_window)
    padded: bool = False

    def __post_init__(self) -> None:
        n, g = self.part.tokens, self.part.group
        ple_n = {i: r[:n] for i, r in self.ple.items()}
        self.ctx = StepContext(ple_n.__getitem__, self.capture_at, None, self.stash_at)
        self.ctx_pad = StepContext(self.ple.__getitem__, self.capture_at, None, self.stash_at)
        self.graph = g.bucket if self.padded and g.path != "eager" else None  # the bucket whose graph runs it

    def inputs(self, x: Tensor, residual: Tensor | None) -> tuple[Packed, StepContext]:
        """Packed inputs and context for x of its padded rows (which are the tokens without padding) or of this
        group's tokens."""
        if x.shape[0] == self.rows:
            return Packed(x, residual, self.pack_pad, self.lora_pad), self.ctx_pad
        return Packed(x, residual, self.pack, self.lora), self.ctx


@dataclass(frozen=True)
class _Steady:
    """A decode-only step without PLE or adapters, or the verify of a `request.Loop`, bound once: while
    `request.check` hands back the same spec and the device's index buffer holds its index data, the next step
    opens from this (nothing to pack, bind or stage) and commits through `at`, the step's slots as the cheapest numpy
    index of the same rows."""

    spec: StepSpec
    binds: tuple[_Bound]
    at: int | slice | np.ndarray
    positions: np.ndarray | None  # the step's rows of `SeqTable.position` where `at` is a slice (a view), else None
    kind: KindStats
    rows: np.ndarray | None = None  # a verify's: the first stash row of each sequence's drafts

    @staticmethod
    def of(parts: StepParts, spec: StepSpec, b: _Bound) -> "_Steady":
        at = basic_index(spec.slots)
        view = parts.seqs.position[at] if type(at) is slice else None
        return _Steady(spec, (b,), at, view, parts.stats.kinds[_DECODE])


def _capturing(x: Tensor) -> bool:
    """Whether the host is capturing the current stream into its own CUDA graph (layer calls are then recorded)."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def _host_key(b: _Bound) -> tuple:
    """What a host's captured step fixes, so that `replayed()` serves the same only: the mode, the sequences and
    rows of the layer calls (padded where the step is), and the stash window a captured verify writes."""
    return b.part.group.mode, b.pack_pad.num_seqs, b.rows, b.stash_at


def _check_capturable(eng, mode) -> None:
    why = eng.capture_veto(mode)
    if why is not None:
        raise StepError(f"layer {eng.layer_idx} cannot be captured in a CUDA graph: {why}")


def open_step(parts: StepParts, spec: StepSpec) -> "Step":
    """Bind, pack and stage a checked step (see the module docstring)."""
    last = parts.last
    steady = last.get("steady")
    if steady is not None and steady.spec is spec and last.get("held") is spec:  # the same steady step again
        return Step(parts, spec, steady.binds, (_NO_CARRIES,), steady)
    stream = parts.stream() if parts.adapters is not None or parts.feeds is not None else None  # those need it
    lora_tok = None
    if parts.adapters is not None:
        lora_tok = _lora_per_token(parts, spec, stream)
    pk = parts.pack
    h = pk.host()
    p = spec.parts[0]
    if len(spec.parts) == 1 and p.kind is _DECODE and lora_tok is None:  # the steady loop: slots only
        pads = _pads(p, True, False)
        pad = pads[0]
        if last.get("held") is not spec:  # else the device holds this very request's index data
            h[:p.n] = spec.slots  # the slots region is first
            h[p.n:p.n + pad] = -1
            pk.send(p.n + pad)
            last["held"] = spec
        b, c = _bind(parts, spec, False, 0, p, pads, 0, 0, 0, 0, stream)
        if parts.feeds is None:  # no rows to stage: the next step of this spec opens from what is bound now
            steady = last["steady"] = _Steady.of(parts, spec, b)
            return Step(parts, spec, steady.binds, (_NO_CARRIES,), steady)
        return Step(parts, spec, (b,), (c,))
    o_slots, o_cu, o_cap, o_lora = pk.offsets
    # whether another verify holds stash rows: a verify then pads in no step, and its window may start past row 0
    held = any(q.kind is _VERIFY for q in spec.parts) and parts.seqs.stash_held()
    seq_at = tok_at = cu_at = cap_at = 0
    extent = 0
    layout = []
    for p in spec.parts:
        g, n, T = p.group, p.n, p.tokens
        pads = _pads(p, len(spec.parts) == 1, held)
        spad, tpad = pads[0], pads[1]
        h[o_slots + seq_at:o_slots + seq_at + n] = spec.slots[p.s0:p.s1]
        h[o_slots + seq_at + n:o_slots + seq_at + n + spad] = -1
        extent = max(extent, o_slots + seq_at + n + spad)
        if p.kind is not _DECODE:
            c = o_cu + cu_at + n + 1
            h[o_cu + cu_at:c] = spec.cu[p.s0:p.s1 + 1] - spec.cu[p.s0]
            # the padding sequences share the padding rows as evenly as they divide: a padding sequence's programs
            # write its rows' zero outputs one row after another, so no one of them gets them all
            h[c:c + spad] = T + (parts.seqs.arange(spad + 1)[1:] * tpad) // max(spad, 1)
            extent = max(extent, c + spad)
        if p.kind is _PREFILL:
            h[o_cap + cap_at:o_cap + cap_at + n] = -1 if spec.capture_at is None else spec.capture_at[p.s0:p.s1]
            extent = max(extent, o_cap + cap_at + n)
        if lora_tok is not None:
            h[o_lora + tok_at:o_lora + tok_at + T] = lora_tok[p.t0:p.t1]
            h[o_lora + tok_at + T:o_lora + tok_at + T + tpad] = -1
            extent = max(extent, o_lora + tok_at + T + tpad)
        layout.append((p, pads, seq_at, tok_at, cu_at, cap_at))
        seq_at, tok_at = seq_at + n + spad, tok_at + T + tpad
        if p.kind is not _DECODE:
            cu_at += n + spad + 1
        if p.kind is _PREFILL:
            cap_at += n
    pk.send(extent)
    parts.last["held"] = spec
    window = _stash_window(parts, spec) if held else 0
    binds, carries = [], []
    for lay in layout:
        b, c = _bind(parts, spec, lora_tok is not None, window, *lay, stream)
        binds.append(b)
        carries.append(c)
    loop = last.get("verify")
    if loop is not None and loop.spec is spec and not held and lora_tok is None and parts.feeds is None:
        # the verify-accept loop: its next verify opens from these binds (no other verify holds stash rows, and
        # none can start before it repeats: that would change the table's version, which ends the loop)
        last["steady"] = _Steady(spec, (binds[0],), loop.at, None, parts.stats.kinds[_VERIFY], spec.cu[:-1])
    return Step(parts, spec, tuple(binds), tuple(carries))


def _pads(p: Part, alone: bool, held: bool) -> tuple[int, int, bool]:
    """(padding sequences, padding rows, padded) of a group: a decode group with a bucket pads to it; a verify
    group with one pads to the bucket and its rows when it is the step's only group (`alone`: the index buffer's
    regions hold a decode bucket beside the other groups' sequences, not a verify bucket too) and no other verify
    holds stash rows (`held`; module docstring). The selector gives a verify group with missing drafts a bucket
    above its sequences, so there is a padding sequence for the padding rows."""
    g = p.group
    if g.bucket is None or (p.kind is _VERIFY and (not alone or held)):
        return 0, 0, False
    return g.bucket - p.n, g.rows - p.tokens, True


def _stash_window(parts: StepParts, spec: StepSpec) -> int:
    """The first stash row of the step's verify tokens, while another verify holds stash rows: rows it does not
    hold."""
    tokens = sum(p.tokens for p in spec.parts if p.kind is _VERIFY)
    if not tokens:
        return 0
    buffers = parts.stack.buffers
    return parts.seqs.stash_window(tokens, parts.limits.max_verify_tokens, buffers.move)


def _lora_per_token(parts: StepParts, spec: StepSpec, stream) -> np.ndarray:
    """The device adapter slot of every token (-1 = none), after binding the step's adapters to slots."""
    codes = spec.adapters
    if codes is None or not (codes >= 0).any():
        return np.full(spec.tokens, -1, dtype=np.int64)
    table = parts.seqs
    names = table.adapter_names_of(codes)
    slot_of = parts.adapters.assign(names, stream)
    lut = np.full(len(table.adapter_names) + 1, -1, dtype=np.int64)  # code -1 reads the last entry: -1
    for name, slot in slot_of.items():
        lut[table.code(name)] = slot
    return np.repeat(lut[codes], spec.lengths)


def _bind(parts: StepParts, spec: StepSpec, lora: bool, window: int, p: Part, pads: tuple[int, int, bool],
          seq_at: int, tok_at: int, cu_at: int, cap_at: int, stream) -> tuple[_Bound, dict[int, np.ndarray]]:
    """A group's device views (memoized by layout: the same views every step of the same shape) and its staged PLE
    rows; returns the bound group and the PLE carries after the step (none for a verify). `pads`: `_pads`."""
    pk, n, T = parts.pack, p.n, p.tokens
    spad, tpad, padded = pads
    ple, new = {}, {}
    if parts.feeds is not None:
        local_cu = spec.cu[p.s0:p.s1 + 1] - spec.cu[p.s0]
        ple, new = parts.feeds.stage(spec.slots[p.s0:p.s1], spec.ids[p.t0:p.t1], local_cu, tok_at, tpad, stream)
        if p.kind is _VERIFY:
            new = {}
    at = 0
    if p.kind is _VERIFY:  # the verify groups' tokens lie side by side in the window, in the step's order
        at = window + p.t0 - next(q.t0 for q in spec.parts if q.kind is _VERIFY)
    key = (id(p), pads, seq_at, tok_at, cu_at, cap_at, lora, at)  # the memo keeps p alive: its id stays its own
    b = pk.memo.get(key)
    if b is None or b.part is not p:
        pack, pack_pad, lora_n, lora_pad, cap = _views(pk, p.kind, n, T, spad, tpad, seq_at, tok_at, cu_at, cap_at,
                                                       lora)
        b = pk.remember(key, _Bound(p, T + tpad, pack, pack_pad, lora_n, lora_pad, ple, cap, at, padded))
    return b, new


def _views(pk: PackBuffers, kind: StepKind, n: int, T: int, spad: int, tpad: int, seq_at: int, tok_at: int,
           cu_at: int, cap_at: int, lora: bool) -> tuple:
    """A group's device views of the index buffer (the same for every step of the same layout: memoized)."""
    slots = pk.view("slots", seq_at, n + spad)
    if kind is _DECODE:
        pack_pad = Packing(pk.cu_decode[:n + spad + 1], slots)
        pack = Packing(pk.cu_decode[:n + 1], slots[:n])
    else:
        cu = pk.view("cu", cu_at, n + spad + 1)
        pack_pad = Packing(cu, slots)
        pack = Packing(cu[:n + 1], slots[:n]) if spad else pack_pad
    lora_pad = pk.view("lora", tok_at, T + tpad) if lora else None
    cap = pk.view("cap", cap_at, n) if kind is _PREFILL else None
    return pack, pack_pad, None if lora_pad is None else lora_pad[:T], lora_pad, cap


class Step:
    """An open step (`Session.begin_step`); use it as a context manager or close it.

    Attributes: `seqs`, `lengths` [N] (the step's order), `tokens` (rows of the per-layer inputs), `bucket` (the
    padded rows of a step of decode sequences only, or of verify sequences only with `verify_graphs`: its layer
    calls also take `bucket` rows, padding after the `tokens` real ones, which a host's own graph of the step pads
    to; None for other steps and without CUDA graphs), `captures` (after close: prefill snapshots by sequence).
    """

    def __init__(self, parts: StepParts, spec: StepSpec, binds: tuple[_Bound, ...], carries: tuple[dict, ...],
                 steady: _Steady | None = None):
        self._p, self._spec, self._binds, self._carries, self._steady = parts, spec, binds, carries, steady
        self.seqs, self.lengths, self.tokens = spec.seqs, spec.lengths, spec.tokens
        self.bucket = binds[0].rows if len(binds) == 1 and binds[0].padded else None
        self._layers = parts.stack.layer_ids
        self._next = 0  # position in _layers of the next layer to call
        self._ran = False  # some layer ran: the pools may have been written
        self._captured = False  # layer calls recorded by a CUDA-graph capture
        self.closed = False
        self.captures: dict[int, bytes] = {}
        self._guard = parts.guard
        self._guard.enter("begin_step")  # an open step holds the session for its thread until it closes or aborts

    # ---- the layers ----
    @guarded
    def mixer(self, layer_idx: int, h: Tensor) -> Tensor:
        """GDN layer `layer_idx`'s token mixer (Hugging Face's `linear_attn`): h = the normed hidden [rows, C] of
        the step's tokens in the step's order -> the mixer output [rows, C]. rows = `tokens` (or `bucket`)."""
        return self._call(layer_idx, h, None, "mixer")

    @guarded
    def layer(self, layer_idx: int, x: Tensor, residual: Tensor | None = None):
        """GDN layer `layer_idx` as the checkpoint's decoder layer (its input norm, mixer, and where the layer has
        them its dense MLP, hyper-connections and PLE). Plain models: x = the hidden state [rows, C] -> the hidden
        state after the layer; or, given the running `residual`, x = the previous sublayer's output and the result
        is the pair (output, residual) (the add is fused into the norm). hc models: the streams [rows, n*C] in and
        out. A tensor-parallel rank whose host reduces returns the pair (partial, residual) (`runtime/tp.py`)."""
        out = self._call(layer_idx, x, residual, "layer")
        if out.residual is None:
            return out.x
        return (out.x, out.residual) if residual is not None or self._p.stack.partial else out.x + out.residual

    @guarded
    def input(self) -> Tensor:
        """A tensor [tokens, stream_dim] to write this step's input into before `run`: for a decode step with a
        CUDA-graph bucket, rows of the graph's fixed input, so that `run` reads them in place and copies nothing in
        (a later step overwrites them); otherwise a new tensor."""
        self._open()
        p, b = self._p, self._binds[0]
        if b.graph is not None and len(self._binds) == 1:
            return p.graphs.input_rows(b.rows, self.tokens)
        return torch.empty((self.tokens, p.cfg.stream_dim), dtype=p.dtype, device=p.device)

    @guarded
    def run(self, x: Tensor, copy: bool = True) -> Tensor:
        """Every GDN layer in turn on x [tokens, stream_dim] (a stack of GDN layers only: nothing of the host's
        runs between them) -> the hidden state after the last layer (plain: its residual added; hc: the streams).
        A decode group replays its CUDA graph where it has one; `copy=False` then returns rows of the graph's fixed
        output instead of a copy (valid until the session's next step runs: one launch less per step). Under the
        host's own CUDA-graph capture the layers are recorded as `layer` records them (a layer with a capture veto
        is refused, and `replayed()` serves the later steps), never through the runtime's graph: neither a replay
        nor the io words it reads by address belong inside another graph."""
        self._turn(self._layers[0] if self._layers else -1)
        self._check_x(x, self._p.cfg.stream_dim, allow_pad=False)
        capturing = _capturing(x)
        if capturing:
            for b in self._binds:
                for eng in b.part.group.engines:
                    _check_capturable(eng, b.part.group.mode)
        self._ran = True
        self._captured = self._captured or capturing
        if len(self._binds) == 1:
            out = self._run_group(self._binds[0], x, copy, capturing)
            self._next = len(self._layers)
            return out
        outs = []
        for b in self._binds:
            outs.append(self._run_group(b, x[b.part.t0:b.part.t1], copy, capturing))
        self._next = len(self._layers)
        return torch.cat(outs)

    @guarded
    def replayed(self) -> None:
        """Declare that the host replayed a CUDA graph that captured this kind of step's layer calls (an earlier step
        of the same decode bucket, whose calls ran under stream capture): every layer counts as called."""
        self._turn(self._layers[0] if self._layers else -1)
        b = self._binds[0]
        if len(self._binds) != 1 or _host_key(b) not in self._p.graphs.host_captures:
            raise StepError(f"replayed(): no step of {b.part.group.mode.value} with {b.rows} rows had its layer calls "
                            "captured in a CUDA graph; capture one first (call the layers under torch.cuda.graph)")
        self._ran = True
        self._next = len(self._layers)

    # ---- closing ----
    @guarded
    def close(self) -> StepResult:
        """Commit the step (see the module docstring); refused, changing nothing, while a layer was not called."""
        self._open()
        if self._next != len(self._layers):
            missing = list(self._layers[self._next:])
            raise StepError(f"step closed before GDN layers {missing} were called (call them, or abort())")
        if self._captured and len(self._binds) == 1:  # `replayed()` serves single-group steps only
            b = self._binds[0]
            key = _host_key(b)
            if key not in self._p.graphs.host_captures:
                self._p.graphs.host_captures.add(key)
                at = f" stash row {b.stash_at}" if b.stash_at else ""
                self._p.stats.graphs.host_captures.append(f"{key[0].value} rows {b.rows}{at}")
        self._commit()
        self.closed = True
        self._guard.exit()
        return StepResult({}, self.captures)

    @guarded
    def abort(self, reason: str = "aborted by the host") -> None:
        """Give the step up. Before any layer ran nothing changes; after, its sequences are marked failed."""
        if self.closed:
            return
        self.closed = True
        try:
            if self._ran:
                table = self._p.seqs
                table.failed[self._spec.slots] = True
                table.block(self._spec.slots)
                for s in self._spec.slots.tolist():
                    table.fail_reason[s] = f"a step was abandoned after its layers had started: {reason}"
        finally:  # last: a call of the holding thread inside its open step does not count itself (guard.py)
            self._guard.exit()

    def __enter__(self) -> "Step":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.closed:
            return
        if exc_type is not None:
            self.abort(f"{exc_type.__name__}: {exc}")
            return
        try:
            self.close()
        except StepError as e:
            self.abort(str(e))
            raise

    # ---- internals ----
    def _open(self) -> None:
        if self.closed:
            raise StepError("this step is closed")

    def _turn(self, layer_idx: int) -> int:
        self._open()
        k = self._next
        if k >= len(self._layers):
            raise StepError(f"every GDN layer of this step was called already (layer {layer_idx} again)")
        if layer_idx != self._layers[k]:
            done = list(self._layers[:k])
            raise StepError(f"GDN layer {self._layers[k]} is next (called so far: {done}), got layer {layer_idx!r}: "
                            "call each GDN layer once, in checkpoint order")
        return k

    def _check_x(self, x: object, width: int, allow_pad: bool) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"a layer input must be a tensor, got {type(x).__name__}")
        if x.layout != _STRIDED or x.is_meta:
            raise ValueError(f"a layer input must be a dense tensor with data, got a "
                             f"{'meta' if x.is_meta else x.layout} tensor")
        shape = x.shape
        if len(shape) != 2 or shape[1] != width or (shape[0] != self.tokens
                                                     and (not allow_pad or not self.bucket or shape[0] != self.bucket)):
            rows = (self.tokens, self.bucket) if allow_pad and self.bucket else (self.tokens,)
            raise ValueError(f"a layer input of this step must be [{' or '.join(map(str, rows))}, {width}], got "
                             f"{tuple(shape)}")
        if x.dtype != self._p.dtype or x.device != self._p.device:
            raise ValueError(f"a layer input must be {self._p.dtype} on {self._p.device}, got {x.dtype} on "
                             f"{x.device}")

    def _call(self, layer_idx: int, x: Tensor, residual: Tensor | None, part: str):
        k = self._turn(layer_idx)
        cfg = self._p.cfg
        self._check_x(x, cfg.hidden_size if part == "mixer" else cfg.stream_dim, allow_pad=True)
        if part == "mixer" and cfg.has_ple(layer_idx):
            raise ValueError(f"layer {layer_idx} has PLE, whose state the runtime owns: call step.layer({layer_idx}, "
                             "streams), not its mixer alone")
        if residual is not None:
            if cfg.is_hc:
                raise ValueError("hc layers take the streams and no residual")
            if not isinstance(residual, Tensor) or residual.shape != x.shape or residual.dtype != x.dtype:
                raise ValueError(f"residual must be a tensor like x {tuple(x.shape)}, got "
                                 f"{getattr(residual, 'shape', type(residual).__name__)}")
        elif part == "layer" and not cfg.is_hc:
            residual = self._zero_rows(x.shape[0])
        capturing = _capturing(x)
        if capturing and len(self._binds) == 1 and self._binds[0].padded and x.shape[0] != self.bucket:
            raise StepError(f"under a CUDA-graph capture the layers of this step take its {self.bucket} padded rows "
                            f"(step.bucket), got {x.shape[0]}: a graph of the unpadded rows would serve only steps "
                            "of these very sequence counts")
        engines = [self._engine(b, k, part, capturing) for b in self._binds]
        self._ran = True
        self._captured = self._captured or capturing
        if len(self._binds) == 1:
            inp, ctx = self._binds[0].inputs(x, residual)
            out = self._p.stack.call(self._binds[0].part.group.mode, engines[0], inp, ctx, part)
        else:
            outs = []
            for b, eng in zip(self._binds, engines):
                r = None if residual is None else residual[b.part.t0:b.part.t1]
                inp, ctx = b.inputs(x[b.part.t0:b.part.t1], r)
                outs.append(self._p.stack.call(b.part.group.mode, eng, inp, ctx, part))
            out = type(outs[0])(torch.cat([o.x for o in outs]),
                                None if outs[0].residual is None else torch.cat([o.residual for o in outs]))
        self._next = k + 1
        return out.x if part == "mixer" else out

    def _engine(self, b: _Bound, k: int, part: str, capturing: bool):
        g = b.part.group
        eng = self._p.selector.part_engine(g, k, part)
        if capturing:
            _check_capturable(eng, g.mode)
        return eng

    def _zero_rows(self, rows: int) -> Tensor:
        """A zero residual for the first add of a plain layer called with the hidden state (never written)."""
        return self._p.stack.zeros(rows)

    def _run_group(self, b: _Bound, x: Tensor, copy: bool, capturing: bool) -> Tensor:
        p, g = self._p, b.part.group
        n = x.shape[0]
        if b.graph is not None and not capturing:
            out = p.graphs.run(g, Packed(x, None, b.pack_pad, b.lora_pad), b.ctx_pad, copy)
            if out is not None:
                return out
        if capturing and n != b.rows:  # a host's capture covers the bucket, as its padded layer calls do
            x = torch.cat([x, x.new_zeros((b.rows - n, x.shape[1]))])
        inp, ctx = b.inputs(x, None if p.cfg.is_hc else self._zero_rows(x.shape[0]))
        out = Stack.hidden(p.stack.run(g.mode, g.engines, inp, ctx))
        return out if out.shape[0] == n else out[:n]

    def _commit(self) -> None:
        p, spec = self._p, self._spec
        fence = p.pool.fence(p.stream())
        table = p.seqs
        steady = self._steady
        if steady is not None and steady.rows is not None:  # the verify-accept loop
            self._pending(steady.binds[0], steady.at, spec.lengths, steady.rows)
            steady.kind.add(steady.binds[0].part.group)
            return
        if steady is not None:  # the steady loop: one group of decode, no PLE carries
            view = steady.positions
            if view is not None:
                view += 1
            else:
                table.position[steady.at] += 1
            steady.kind.add(steady.binds[0].part.group)
            p.pool.mark_written(steady.at, fence)
            return
        written = []
        for b, carries in zip(self._binds, self._carries):
            part = b.part
            slots, L = spec.slots[part.s0:part.s1], spec.lengths[part.s0:part.s1]
            if part.kind is _VERIFY:
                self._pending(b, slots, L, b.stash_at + spec.cu[part.s0:part.s1] - spec.cu[part.s0])
            else:
                written.append(slots)
                if part.kind is _PREFILL and spec.capture_at is not None:
                    self._captures(b, slots, L, fence)
                table.position[slots] += L
                if carries:
                    p.feeds.commit(slots, carries)
            p.stats.kinds[part.kind].add(part.group)
        if written:
            p.pool.mark_written(np.concatenate(written) if len(written) > 1 else written[0], fence)

    def _pending(self, b: _Bound, slots: np.ndarray | slice, L: np.ndarray, rows: np.ndarray) -> None:
        """The verify group's sequences hold its drafts from stash rows `rows` on until accepted; a `request.Loop`
        of this spec goes on to "pending"."""
        p, spec, part = self._p, self._spec, b.part
        table = p.seqs
        table.epoch += 1
        table.pend_epoch[slots] = table.epoch
        table.hold(slots, True)
        loop = p.last.get("verify")
        if loop is not None and loop.spec is spec and loop.stage == "checked":
            loop.advance("pending", table.version)
        table.pend_row[slots] = rows
        table.pend_count[slots] = L
        if table.pend_ids is not None and part.tokens:
            at = np.repeat(slots, L)
            cols = np.arange(part.tokens) - np.repeat(rows - b.stash_at, L)
            table.pend_ids[at, cols] = spec.ids[part.t0:part.t1]
        p.stats.drafted += part.tokens

    def _captures(self, b: _Bound, slots: np.ndarray, L: np.ndarray, fence: Fence) -> None:
        """Serialize each requested capture point (after the step completed: the commit fence)."""
        p, spec = self._p, self._spec
        part = b.part
        at = spec.capture_at[part.s0:part.s1]
        want = np.flatnonzero(at >= 0)
        if not want.size:
            return
        fence.wait()
        carries = {}
        if p.feeds is not None:
            cu = np.zeros(want.size + 1, dtype=np.int64)
            np.cumsum(at[want], out=cu[1:])
            starts = spec.cu[part.s0 + want]
            ids = np.concatenate([spec.ids[s:s + n] for s, n in zip(starts.tolist(), at[want].tolist())])
            carries = p.feeds.carries_after(slots[want], ids, cu)
        for j, n in enumerate(want.tolist()):
            tensors = p.pool.rows_of(p.stack.buffers.capture, n, {i: c[j].tolist() for i, c in carries.items()})
            pos = int(p.seqs.position[slots[n]]) + int(at[n])
            self.captures[int(spec.seqs[part.s0 + n])] = p.pool.encode(SlotState(tensors, pos))
            p.stats.captures += 1
