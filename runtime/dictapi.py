"""The dict API over the step context: `Session.step({seq: hidden}, ...)` and `accept({seq: j})`.

`dict_step` checks what only the dicts carry (each sequence's tensor, its token ids, its prompt type, a sequence in
two kinds, ids for a sequence not in the step), naming the sequence; then it lays the sequences out in kind order,
concatenates their inputs and runs one `begin_step` + `run` (which checks everything else, as a whole, before
anything is written); the output rows go back into a dict of views. `accept` checks a verify's acceptance as a whole
(the accept of a steady loop's verify: its counts only, `request.Loop`) and folds the accepted stash rows into the
pools (`StepBuffers.fold`).
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
from .steps import Step


def dict_step(parts: StepParts, begin: Callable[..., Step], decode: object, verify: object, prefill: object,
              token_ids: object) -> StepResult:
    """`begin`: the session's `begin_step`."""
    for name, d in (("decode", decode), ("verify", verify), ("prefill", prefill), ("token_ids", token_ids)):
        if d is not None and not isinstance(d, dict):
            raise TypeError(f"{name} takes a dict {{seq: input}}, got {type(d).__name__}")
    token_ids = token_ids or {}
    every = [q for d in (decode, verify, prefill) if d for q in d]
    if len(set(every)) != len(every):
        seen: set = set()
        dup = next(q for q in every if q in seen or seen.add(q))
        raise ValueError(f"sequence {dup} appears in more than one kind of the same step")
    seqs, kinds, hs, ids, caps = [], [], [], [], None
    for kind, part in zip(KIND_ORDER, (decode or {}, verify or {}, prefill or {})):
        if not part:
            continue
        if kind is StepKind.PREFILL:
            caps = [-1] * len(seqs)
            _prompts(parts, part, token_ids, seqs, hs, ids, caps)
        else:
            _tensors(parts, kind, part, token_ids, seqs, hs, ids)
        kinds += [KIND_CODE[kind]] * len(part)
    extra = [q for q in token_ids if not any(q in d for d in (decode, verify, prefill) if d)]
    if extra:
        raise ValueError(f"token ids given for sequences that are not in the step: {sorted(extra)}")
    if not seqs:
        return StepResult({}, {})
    one = kinds[0] if kinds.count(kinds[0]) == len(kinds) else None
    kind_names = KIND_ORDER[one].value if one is not None else np.array([KIND_ORDER[k].value for k in kinds])
    decode = one == KIND_CODE[StepKind.DECODE]  # one token each: no lengths to pass or split by
    lengths = None if decode else [h.shape[0] for h in hs]
    packed = None if parts.feeds is None else np.concatenate(ids)
    cap = np.array(caps, dtype=np.int64) if caps is not None and max(caps) >= 0 else None
    x = torch.cat(hs) if len(hs) > 1 else hs[0]
    with begin(np.array(seqs, dtype=np.int64), kind_names, None if decode else np.array(lengths, dtype=np.int64),
               packed, cap) as st:
        out = st.run(x)
    if len(seqs) == 1:
        return StepResult({seqs[0]: out}, st.captures)
    rows = out.view(len(seqs), 1, -1).unbind(0) if decode else torch.split(out, lengths)
    return StepResult(dict(zip(seqs, rows)), st.captures)


def _tensors(parts: StepParts, kind: StepKind, part: dict, token_ids: dict, seqs: list, hs: list, ids: list
             ) -> None:
    """Decode or verify inputs: one pass of cheap checks over all of them; the first one that fails is checked in
    full, which names the sequence and the problem."""
    keys, vals = list(part), list(part.values())
    width, dt, top = parts.cfg.stream_dim, parts.dtype, parts.limits.max_draft
    dev = parts.device.index if parts.device.type == "cuda" else -1  # Tensor.get_device(): -1 on the CPU
    row = torch.Size([1, width])
    strided = torch.strided
    for k, (q, h) in enumerate(zip(keys, vals)):
        if type(h) is not Tensor or h.dtype != dt or h.layout != strided or h.is_meta or h.get_device() != dev or \
                (h.shape != row if kind is StepKind.DECODE else h.dim() != 2 or h.shape[1] != width or
                 h.shape[0] > top):
            parts.seqs.slot(q)  # an unknown sequence is named before its input
            vals[k] = _hidden(parts, h, kind, q)
    seqs += keys
    hs += vals
    if parts.feeds is not None or token_ids:
        ids += [_token_ids(parts, token_ids.get(q), h.shape[0], q) for q, h in zip(keys, vals)]


def _prompts(parts: StepParts, part: dict, token_ids: dict, seqs: list, hs: list, ids: list, caps: list) -> None:
    for seq, val in part.items():
        parts.seqs.slot(seq)  # unknown or released: named before its input is looked at
        if not isinstance(val, Prompt):
            raise TypeError(f"prefill of sequence {seq} takes a Prompt, got {type(val).__name__}")
        if val.token_ids is not None and seq in token_ids:
            raise ValueError(f"sequence {seq}: token ids given twice (Prompt and token_ids)")
        h = _hidden(parts, val.hidden, StepKind.PREFILL, seq)
        ids.append(_token_ids(parts, val.token_ids if val.token_ids is not None else token_ids.get(seq),
                              h.shape[0], seq))
        seqs.append(seq)
        hs.append(h)
        caps.append(_capture(val.capture_at, h.shape[0], seq))


def accept(parts: StepParts, seqs: np.ndarray, counts: object, stream) -> None:
    """See the module docstring; `Session.accept_batch`. Accepting exactly the sequences of a `request.Loop`'s
    pending verify, in its order, skips the checks that loop already holds (they are live, distinct, not failed and
    pending with these draft counts: nothing changed the table since its verify); the counts are checked alike."""
    table = parts.seqs
    counts = as_ids(counts, "accepted counts")
    if counts.shape != seqs.shape:
        raise ValueError(f"accepted counts must be [N={seqs.size}], got shape {counts.shape}")
    loop = parts.last.get("verify")
    if (loop is not None and loop.stage == "pending" and loop.version == table.version
            and seqs.tobytes() == loop.seqs):
        slots, at, n = loop.spec.slots, loop.at, loop.spec.lengths
    else:
        loop = None
        slots = at = table.slots(seqs)
        bad = table.failed[slots]
        if bad.any():
            table.intact(int(seqs[np.flatnonzero(bad)[0]]))  # names the failure
        bad = table.pend_epoch[slots] < 0
        if bad.any():
            raise SequenceError(f"sequence {int(seqs[np.flatnonzero(bad)[0]])} has no verify to accept")
        n = table.pend_count[slots]
    bad = (counts < 0) | (counts > n)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ValueError(f"sequence {int(seqs[k])}: accepted count must be an int in 0..{int(n[k])}, got "
                         f"{int(counts[k])}")
    take = counts > 0
    some = bool(take.any())
    if some:
        parts.stack.buffers.fold(parts.pool, parts.pack.pairs((table.pend_row[at] + counts - 1)[take], slots[take]))
    fence = parts.pool.fence(stream)
    if parts.feeds is not None and some:
        width = table.pend_ids.shape[1]
        ids = table.pend_ids[slots][np.arange(width)[None, :] < counts[:, None]]
        cu = np.zeros(seqs.size + 1, dtype=np.int64)
        np.cumsum(counts, out=cu[1:])
        parts.feeds.commit(slots, parts.feeds.carries_after(slots, ids, cu))
    table.position[at] += counts
    table.pend_epoch[at] = -1
    table.hold(at, False)
    if loop is not None:
        loop.advance("ready", table.version)
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
