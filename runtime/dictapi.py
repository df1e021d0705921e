"""The dict API over the step context: `Session.step({seq: hidden}, ...)` and `accept({seq: j})`.

`dict_step` checks what only the dicts carry (each sequence's tensor, its token ids, its prompt type, a sequence in
two kinds, ids for a sequence not in the step), naming the sequence; then it lays the sequences out in kind order,
concatenates their inputs and runs one `begin_step` + `run` (which checks everything else, as a whole, before
anything is written); the output rows go back into a dict of views. `accept` checks a verify's acceptance as a whole
and folds the accepted stash rows into the pools with one gather per buffer.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.modes import StepKind

from .parts import StepParts
from .ple.hashing import as_ids
from .request import KIND_CODE
from .select import KIND_ORDER
from .seqs import Prompt, SequenceError, StepResult
from .state import Fence
from .steps import Step


def dict_step(parts: StepParts, begin: Callable[..., Step], decode: object, verify: object, prefill: object,
              token_ids: object) -> StepResult:
    """`begin`: the session's `begin_step`."""
    for name, d in (("decode", decode), ("verify", verify), ("prefill", prefill), ("token_ids", token_ids)):
        if d is not None and not isinstance(d, dict):
            raise TypeError(f"{name} takes a dict {{seq: input}}, got {type(d).__name__}")
    token_ids = token_ids or {}
    seqs, kinds, hs, ids, caps = [], [], [], [], []
    seen: set = set()
    for kind, part in zip(KIND_ORDER, (decode or {}, verify or {}, prefill or {})):
        for seq, val in part.items():
            if seq in seen:
                raise ValueError(f"sequence {seq} appears in more than one kind of the same step")
            seen.add(seq)
            parts.seqs.slot(seq)  # unknown or released: named before its input is looked at
            if kind is StepKind.PREFILL and not isinstance(val, Prompt):
                raise TypeError(f"prefill of sequence {seq} takes a Prompt, got {type(val).__name__}")
            prompt = val if isinstance(val, Prompt) else Prompt(val)
            if prompt.token_ids is not None and seq in token_ids:
                raise ValueError(f"sequence {seq}: token ids given twice (Prompt and token_ids)")
            h = _hidden(parts, prompt.hidden, kind, seq)
            tid = _token_ids(parts, prompt.token_ids if prompt.token_ids is not None else token_ids.get(seq),
                             h.shape[0], seq)
            seqs.append(seq)
            kinds.append(KIND_CODE[kind])
            hs.append(h)
            ids.append(tid)
            caps.append(_capture(prompt.capture_at, h.shape[0], seq))
    extra = set(token_ids) - seen
    if extra:
        raise ValueError(f"token ids given for sequences that are not in the step: {sorted(extra)}")
    if not seqs:
        return StepResult({}, {})
    lengths = [h.shape[0] for h in hs]
    kind_names = np.array([KIND_ORDER[k].value for k in kinds])
    packed = None if parts.feeds is None else np.concatenate(ids)
    cap = np.array(caps, dtype=np.int64) if any(c >= 0 for c in caps) else None
    x = torch.cat(hs) if len(hs) > 1 else hs[0]
    with begin(np.array(seqs, dtype=np.int64), kind_names, np.array(lengths, dtype=np.int64), packed,
                         cap) as st:
        out = st.run(x)
    return StepResult(dict(zip(seqs, torch.split(out, lengths))), st.captures)


def accept(parts: StepParts, seqs: np.ndarray, counts: object, stream) -> None:
    """See the module docstring; `Session.accept_batch`."""
    table = parts.seqs
    counts = as_ids(counts, "accepted counts")
    if counts.shape != seqs.shape:
        raise ValueError(f"accepted counts must be [N={seqs.size}], got shape {counts.shape}")
    slots = table.slots(seqs)
    epoch = table.pend_epoch[slots]
    bad = epoch < 0
    if bad.any():
        raise SequenceError(f"sequence {int(seqs[np.flatnonzero(bad)[0]])} has no verify to accept")
    bad = epoch != table.epoch
    if bad.any():
        raise SequenceError(f"sequence {int(seqs[np.flatnonzero(bad)[0]])}: a later verify step overwrote its "
                            "stash; verify again")
    n = table.pend_count[slots]
    bad = (counts < 0) | (counts > n)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"sequence {int(seqs[k])}: accepted count must be an int in 0..{int(n[k])}, got "
                         f"{int(counts[k])}")
    take = counts > 0
    parts.stack.buffers.fold(parts.pool, (table.pend_row[slots] + counts - 1)[take].tolist(), slots[take].tolist())
    fence = Fence(parts.device).record(stream)
    if parts.feeds is not None and take.any():
        width = table.pend_ids.shape[1]
        ids = table.pend_ids[slots][np.arange(width)[None, :] < counts[:, None]]
        cu = np.zeros(seqs.size + 1, dtype=np.int64)
        np.cumsum(counts, out=cu[1:])
        parts.feeds.commit(slots, parts.feeds.carries_after(slots, ids, cu))
    table.position[slots] += counts
    table.pend_epoch[slots] = -1
    parts.stats.accepted += int(counts.sum())
    parts.pool.mark_written(slots[take], fence)


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
