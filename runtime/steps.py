"""One session step: validate every sequence's input, select groups, run them, commit what each kind commits.

Validation covers everything that could fail later (sequence ids and phases, shapes, dtypes, token ids, capture
points, limits, engine coverage) and happens before the first buffer is touched, so a refused step leaves every
pool, stash, id carry and position as it was.

Commit rules: decode and prefill write the pools and advance positions and PLE id carries; verify writes only the
stash and records a pending verify (`accept` commits); a prefill capture is serialized once its step's fence has
completed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.modes import StepKind

from .adapters import AdapterSlots
from .budget import RuntimeLimits
from .graphs import GraphCache
from .ple.feeds import PleFeeds, StepRows
from .ple.hashing import as_ids
from .select import Group, Selector, Work
from .seqs import Pending, Prompt, Seq, SequenceError, Sequences, StepResult
from .stack import Stack, StepContext
from .state import Fence, SlotState, StatePool
from .stats import SessionStats


@dataclass(frozen=True)
class StepParts:
    """What a step reads and writes, given once by the session: its shapes and limits, the live sequences, the layer
    stack over the state pool, the engine selector, the CUDA-graph cache, PLE feeds, adapter slots and stats."""

    cfg: GdnConfig
    limits: RuntimeLimits
    dtype: torch.dtype
    device: torch.device
    seqs: Sequences
    pool: StatePool
    stack: Stack
    selector: Selector
    graphs: GraphCache
    feeds: PleFeeds | None
    adapters: AdapterSlots | None
    stats: SessionStats

    def stream(self) -> torch.cuda.Stream | None:
        return torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None


@dataclass
class _Item:
    """One sequence's validated input."""

    seq: int
    s: Seq
    kind: StepKind
    hidden: Tensor  # [L, stream_dim] on the session's device
    ids: np.ndarray | None  # [L] int64 (PLE models)
    capture_at: int  # -1 = none


def run_step(parts: StepParts, decode: dict, verify: dict, prefill: dict, token_ids: dict) -> StepResult:
    items = _validate(parts, decode, verify, prefill, token_ids)
    work = [Work(it.seq, it.s.slot, it.hidden.shape[0], it.kind) for it in items]
    groups = parts.selector.select(work) if work else []
    by_seq = {it.seq: it for it in items}
    result = StepResult({}, {})
    slot_of = {}
    if parts.adapters is not None and items:  # after every check: uploads are the step's first writes
        slot_of = parts.adapters.assign({it.s.adapter for it in items if it.s.adapter}, parts.stream())
    for g in groups:
        _run_group(parts, g, [by_seq[w.seq] for w in g.work], result, slot_of)
    return result


def _validate(parts: StepParts, decode: dict, verify: dict, prefill: dict, token_ids: dict) -> list[_Item]:
    items, seen = [], set()
    for kind, part in ((StepKind.DECODE, decode), (StepKind.VERIFY, verify), (StepKind.PREFILL, prefill)):
        if not isinstance(part, dict):
            raise TypeError(f"{kind.value} takes a dict {{sequence: input}}, got {type(part).__name__}")
        for seq, val in part.items():
            s = parts.seqs[seq]
            if seq in seen:
                raise ValueError(f"sequence {seq} appears in more than one kind of the same step")
            seen.add(seq)
            if s.pending is not None:
                raise SequenceError(f"sequence {seq} has an unaccepted verify: call accept first "
                                    f"(accept({{{seq}: 0}}) rejects every draft)")
            if kind is StepKind.PREFILL and not isinstance(val, Prompt):
                raise TypeError(f"prefill of sequence {seq} takes a Prompt, got {type(val).__name__}")
            prompt = val if isinstance(val, Prompt) else Prompt(val)
            if prompt.token_ids is not None and seq in token_ids:
                raise ValueError(f"sequence {seq}: token ids given twice (Prompt and token_ids)")
            hidden = _hidden(parts, prompt.hidden, kind, seq)
            L = hidden.shape[0]
            ids = _token_ids(parts, prompt.token_ids if prompt.token_ids is not None else token_ids.get(seq), L, seq)
            items.append(_Item(seq, s, kind, hidden, ids, _capture(prompt.capture_at, L, seq)))
    extra = set(token_ids) - seen
    if extra:
        raise ValueError(f"token ids given for sequences that are not in the step: {sorted(extra)}")
    lim = parts.limits
    n_prefill = sum(it.hidden.shape[0] for it in items if it.kind is StepKind.PREFILL)
    if n_prefill > lim.max_prefill_tokens:
        raise ValueError(f"prefill step of {n_prefill} tokens exceeds max_prefill_tokens={lim.max_prefill_tokens}: "
                         "prefill in chunks (each continues from the state) or raise the limit")
    if parts.adapters is not None:
        parts.adapters.check_step({it.s.adapter for it in items if it.s.adapter})
    return items


def _hidden(parts: StepParts, h: object, kind: StepKind, seq: int) -> Tensor:
    width = parts.cfg.stream_dim
    if not isinstance(h, Tensor):
        raise TypeError(f"{kind.value} input of sequence {seq} must be a tensor, got {type(h).__name__}")
    if h.is_meta or h.layout != torch.strided:
        raise ValueError(f"{kind.value} input of sequence {seq} must be a dense tensor with data, got a "
                         f"{'meta' if h.is_meta else h.layout} tensor")
    if h.dim() != 2 or h.shape[1] != width:
        raise ValueError(f"{kind.value} input of sequence {seq} must be [tokens, {width}], got {tuple(h.shape)}")
    if h.dtype != parts.dtype:
        raise ValueError(f"{kind.value} input of sequence {seq} is {h.dtype}, the session computes in {parts.dtype}")
    L, lim = h.shape[0], parts.limits
    if kind is StepKind.DECODE and L != 1:
        raise ValueError(f"decode takes one token per sequence; sequence {seq} brings {L}")
    if kind is StepKind.VERIFY and L > lim.max_draft:
        raise ValueError(f"verify of sequence {seq} brings {L} draft tokens, more than max_draft={lim.max_draft}")
    if kind is StepKind.PREFILL and L < 1:
        raise ValueError(f"prefill of sequence {seq} brings no tokens")
    return h.to(parts.device)


def _token_ids(parts: StepParts, ids: object, L: int, seq: int) -> np.ndarray | None:
    if parts.feeds is None:
        if ids is not None:
            raise ValueError(f"sequence {seq}: this model has no PLE layer, so it takes no token ids")
        return None
    if ids is None:
        raise ValueError(f"sequence {seq}: PLE layers {sorted(parts.feeds.layers)} need the token ids of every token")
    a = as_ids(ids, f"token ids of sequence {seq}")
    if a.shape != (L,):
        raise ValueError(f"token ids of sequence {seq} must be [{L}], got shape {a.shape}")
    parts.feeds.check_ids(a, f"sequence {seq}")
    return a


def _capture(at: object, L: int, seq: int) -> int:
    if at is None:
        return -1
    if not isinstance(at, (int, np.integer)) or isinstance(at, bool) or not 0 <= at <= L:
        raise ValueError(f"capture_at of sequence {seq} must be an int in 0..{L}, got {at!r}")
    return int(at)


def _run_group(parts: StepParts, g: Group, items: list[_Item], result: StepResult, slot_of: dict[str, int]
               ) -> None:
    dev, stream = parts.device, parts.stream()
    lengths, slots = [it.hidden.shape[0] for it in items], [it.s.slot for it in items]
    x = torch.cat([it.hidden for it in items])
    rows = StepRows(parts.feeds, [(it.s.slot, it.ids) for it in items] if parts.feeds else [],
                    commit=g.kind is not StepKind.VERIFY, stream=stream)
    capture_at = None
    cap_carries = {}
    if g.kind is StepKind.PREFILL:
        capture_at = torch.tensor([it.capture_at for it in items], dtype=torch.int32, device=dev)
        if parts.feeds is not None:  # before the step: staging advances the carries
            cap_carries = {it.seq: parts.feeds.carries_after(it.s.slot, it.ids[:it.capture_at])
                           for it in items if it.capture_at >= 0}
    ctx = StepContext(rows.rows, capture_at, stream)
    adapters = [slot_of[it.s.adapter] if it.s.adapter else -1 for it in items]
    packed = parts.stack.packed(x, lengths, slots, adapters)
    if g.path == "eager":
        hidden = Stack.hidden(parts.stack.run(g.mode, g.engines, packed, ctx))
    else:
        hidden = parts.graphs.run(g, packed, ctx, rows)
    # no rows.rearm(): the uploads, the layers and the replays share one stream, so stream order already keeps
    # the next upload from overwriting rows a step still reads (rearm exists for a consumer on another stream)
    fence = Fence(dev).record(stream)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    for it, a, b in zip(items, offsets, offsets[1:]):
        result.outputs[it.seq] = hidden[a:b]
    if g.kind is StepKind.VERIFY:
        parts.seqs.epoch += 1
        for it, a in zip(items, offsets):
            it.s.pending = _pending(parts.seqs.epoch, a, it)
        parts.stats.drafted += sum(lengths)
    else:
        parts.pool.mark_written(slots, fence)
        for it in items:
            it.s.position += it.hidden.shape[0]
    if g.kind is StepKind.PREFILL:
        _captures(parts, items, cap_carries, fence, result)
    parts.stats.kinds[g.kind].add(g)


def _pending(epoch: int, row: int, it: _Item) -> Pending:
    ids = it.ids if it.ids is not None else np.zeros(0, dtype=np.int64)
    return Pending(epoch, row, it.hidden.shape[0], ids)


def _captures(parts: StepParts, items: list[_Item], carries: dict, fence: Fence, result: StepResult) -> None:
    """Serialize each requested capture point (after the step completed: the commit fence)."""
    caps = [(n, it) for n, it in enumerate(items) if it.capture_at >= 0]
    if not caps:
        return
    fence.wait()
    for n, it in caps:
        tensors = parts.pool.rows_of(parts.stack.buffers.capture, n, carries.get(it.seq, {}))
        pos = it.s.position - it.hidden.shape[0] + it.capture_at
        result.captures[it.seq] = parts.pool.encode(SlotState(tensors, pos))
        parts.stats.captures += 1
