"""Checking a step request as a whole, with numpy over all of its sequences at once, before anything is written.

`check(parts, seqs, kind, lengths, token_ids, capture_at) -> StepSpec` refuses, naming the first bad sequence, every
request that could fail later: unknown, released, repeated, failed or verify-pending sequences; kinds out of the
decode, verify, prefill order; token counts outside each kind's range; a prefill over `max_prefill_tokens`; token ids
missing, of the wrong length or outside the vocabulary (PLE models), or given to a model without PLE; capture points
outside 0..length or on a sequence that does not prefill; more distinct adapters than slots; a group no engine
covers. What it returns holds everything the step then needs, already in arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from gdn_trt.model.modes import StepKind

from .parts import StepParts
from .ple.hashing import as_ids
from .select import KIND_ORDER, Group
from .seqs import as_seq_ids, basic_index

KIND_CODE = {k: c for c, k in enumerate(KIND_ORDER)}  # decode 0, verify 1, prefill 2
_NAMES = np.array([k.value for k in KIND_ORDER])
_KINDS = {**{k: k for k in KIND_ORDER}, **{k.value: k for k in KIND_ORDER}}
_INT64 = np.dtype(np.int64)


@dataclass(frozen=True)
class Part:
    """One group of a step: its kind, its sequences [s0, s1) and its tokens [t0, t1) in the step's order, the
    selection (mode, engines, bucket, vetoes)."""

    kind: StepKind
    s0: int
    s1: int
    t0: int
    t1: int
    group: Group

    @property
    def n(self) -> int:
        return self.s1 - self.s0

    @property
    def tokens(self) -> int:
        return self.t1 - self.t0


@dataclass
class StepSpec:
    """A checked request. seqs, slots, lengths [N] int64 in the step's order; cu [N+1] token offsets; ids [T]
    (PLE models) or None; capture_at [N] (-1 = none) or None; adapters [N] adapter codes (-1 = none); parts: the
    groups in decode, verify, prefill order."""

    seqs: np.ndarray
    slots: np.ndarray
    lengths: np.ndarray
    cu: np.ndarray
    ids: np.ndarray | None
    capture_at: np.ndarray | None
    adapters: np.ndarray
    parts: tuple[Part, ...]

    @cached_property  # read by every step opened from the spec (a steady loop reuses one)
    def tokens(self) -> int:
        return int(self.cu[-1])

    @property
    def kind(self) -> StepKind | None:
        """The step's kind when it has one group (None for a mixed step)."""
        return self.parts[0].kind if len(self.parts) == 1 else None


@dataclass(slots=True)
class Loop:
    """A verify request on its way round the steady verify-accept loop: verify the same sequences with the same
    draft counts, accept each of them (any counts), again. `stage`: "checked" (by `check`, the table at `version`),
    "pending" (its step committed, whose block made `version`) or "ready" (`accept` took exactly its sequences,
    whose unblock made `version`: nothing else changed the table since the check, so its steppable set is again the
    one the request was checked against, and `check` hands back `spec`). `at`: the slots as the cheapest numpy index
    (`basic_index`, never a bare int: counts are arrays). Only a verify of one group without token ids or adapters
    takes the loop. Mutable, unlike the other records here: `dataclasses.replace` of a frozen one took 5.7 us under
    cProfile on this 2-core CPU, three times a loop."""

    stage: str
    spec: StepSpec
    version: int
    generation: int
    seqs: bytes
    lengths: bytes
    at: slice | np.ndarray

    def advance(self, stage: str, version: int) -> None:
        """One stage on, at the table's `version` after the change that took it there. Nothing else changes the
        table between two stages: from the check to the commit the step is open (the session refuses every other
        call meanwhile), and an accept goes on from "pending" only at the version the commit left."""
        self.stage, self.version = stage, version


def kind_codes(kind: object, n: int) -> np.ndarray:
    """[N] kind codes from one kind (a `StepKind` or its name) or one per sequence (names or `StepKind`s)."""
    if isinstance(kind, str):  # StepKind is a str
        try:
            return np.full(n, KIND_CODE[StepKind(kind)], dtype=np.int64)
        except ValueError:
            raise ValueError(f"kind must be one of {[k.value for k in KIND_ORDER]} or one per sequence, got "
                             f"{kind!r}") from None
    a = np.asarray([k.value if isinstance(k, StepKind) else k for k in kind] if isinstance(kind, (list, tuple))
                   else kind)
    if a.shape != (n,) or a.dtype.kind not in "U":
        raise ValueError(f"kind must be one kind or [N={n}] kind names, got {a.dtype} {a.shape}")
    codes = np.full(n, -1, dtype=np.int64)
    for c, name in enumerate(_NAMES):
        codes[a == name] = c
    if (codes < 0).any():
        raise ValueError(f"kind {a[codes < 0][0]!r} is not one of {list(_NAMES)}")
    return codes


def _ints(x: object, n: int, what: str) -> np.ndarray:
    a = as_ids(x, what)
    if a.shape != (n,):
        raise ValueError(f"{what} must be [N={n}], got shape {a.shape}")
    return a


def check(parts: StepParts, seqs: object, kind: object, lengths: object, token_ids: object,
          capture_at: object) -> StepSpec:
    """See the module docstring."""
    lim, table = parts.limits, parts.seqs
    if token_ids is None and capture_at is None and isinstance(kind, str):
        again = (_repeat(parts, seqs) if kind == "decode" and lengths is None
                 else _again(parts, seqs, lengths) if kind == "verify" else None)
        if again is not None:
            return again
    seqs = as_seq_ids(seqs)
    N = seqs.size
    if N == 0:
        raise ValueError("a step needs at least one sequence")
    one = _KINDS.get(kind) if isinstance(kind, str) else None  # one kind for the whole step: the common case
    codes = None if one is not None else kind_codes(kind, N)
    if codes is not None and N > 1 and (np.diff(codes) < 0).any():
        raise ValueError("a mixed step lists its sequences grouped by kind: decode, then verify, then prefill")
    slots = table.steppable(seqs)
    if codes is None and one is StepKind.DECODE and lengths is None:
        L, cu, T = table.ones(N), table.arange(N + 1), N
    else:
        L = _lengths(lengths, codes, one, seqs, lim)
        cu = np.zeros(N + 1, dtype=np.int64)
        np.cumsum(L, out=cu[1:])
        T = int(cu[-1])
    ids = _token_ids(parts, token_ids, T)
    cap = None if capture_at is None else _capture(capture_at, np.full(N, KIND_CODE[one]) if codes is None else codes,
                                                   L, seqs)
    adapters = table.adapter[slots] if table.bound else None
    if adapters is not None and parts.adapters is not None and (adapters >= 0).any():
        parts.adapters.check_step(table.adapter_names_of(adapters))
    if codes is None:
        out = (_part(parts, one, 0, N, 0, T),)
        if one is StepKind.DECODE and ids is None and cap is None and adapters is None:
            spec = StepSpec(seqs.copy(), slots, L, cu, ids, cap, adapters, out)  # the caller may reuse its array
            parts.last["decode"] = (spec, table.version, spec.seqs.tobytes(), parts.selector.generation)
            return spec
        if one is StepKind.VERIFY and ids is None and cap is None and adapters is None:  # the loop may repeat it
            spec = StepSpec(seqs.copy(), slots, L.copy(), cu, ids, cap, adapters, out)
            at = basic_index(slots)
            parts.last["verify"] = Loop("checked", spec, table.version, parts.selector.generation,
                                        spec.seqs.tobytes(), spec.lengths.tobytes(),
                                        slice(at, at + 1) if type(at) is int else at)
            return spec
    else:
        bounds = np.searchsorted(codes, np.arange(len(KIND_ORDER) + 1)).tolist()
        out = []
        for c, kind_ in enumerate(KIND_ORDER):
            s0, s1 = bounds[c], bounds[c + 1]
            if s1 > s0:
                t0, t1 = int(cu[s0]), int(cu[s1])
                out.append(_part(parts, kind_, s0, s1, t0, t1))
        out = tuple(out)
    return StepSpec(seqs, slots, L, cu, ids, cap, adapters, out)


def _part(parts: StepParts, kind: StepKind, s0: int, s1: int, t0: int, t1: int) -> Part:
    """The group [s0, s1) of a step, the same `Part` object for the same layout and selection (the step's device
    views are memoized by it: `steps._bind`)."""
    g = parts.selector.group(kind, s1 - s0, t1 - t0)
    memo = parts.part_memo  # the session's own: a closed session's groups and engines go with it
    key = (id(g), s0, s1, t0, t1)
    p = memo.get(key)
    if p is None or p.group is not g:
        if len(memo) > 4096:  # prefill layouts vary without bound
            memo.clear()
        p = memo[key] = Part(kind, s0, s1, t0, t1, g)
    return p


def _repeat(parts: StepParts, seqs: object) -> StepSpec | None:
    """The last accepted decode-only request again, when `seqs` is a numpy int64 array equal to its sequences and
    neither the table's steppable set (`SeqTable.version`: adds, releases, pending verifies, failures) nor the
    selector's memo (`Selector.generation`: while it stands, the group memoized then is the one a selection gives)
    changed since it was checked; else None (the whole check runs, naming what is wrong). The steady decode loop's
    check: two counters and one byte compare, where the check converts, gathers, scatters and builds (numpy calls
    cost about 1 us each on small arrays here, 2-3x that on the H200's host; the selector's lookup it replaces took
    0.33 us on this 2-core CPU, 2026-12-04)."""
    hit = parts.last.get("decode")
    if hit is None or hit[1] != parts.seqs.version or hit[3] != parts.selector.generation:
        return None
    return hit[0] if _same_ids(seqs, hit[2]) else None


def _again(parts: StepParts, seqs: object, lengths: object) -> StepSpec | None:
    """The verify of the last `Loop` again, when it is "ready", the table and the selector did not change since,
    and `seqs` and `lengths` are numpy int64 arrays equal to its own; else None (the whole check runs). The same
    two counters and byte compares as `_repeat`: the verify check's numpy calls took 43 us a step on this 2-core
    CPU under cProfile (2026-12-05, `bench/host_cpu.py`'s verify loop at N = 64)."""
    loop = parts.last.get("verify")
    if (loop is None or loop.stage != "ready" or loop.version != parts.seqs.version
            or loop.generation != parts.selector.generation):
        return None
    if not (_same_ids(seqs, loop.seqs) and _same_ids(lengths, loop.lengths)):
        return None
    loop.stage = "checked"
    return loop.spec


def _same_ids(a: object, want: bytes) -> bool:
    """Whether `a` is a 1-D numpy int64 array of the bytes `want` (another int64 dtype object than numpy's own, e.g.
    big-endian, takes the whole check)."""
    return type(a) is np.ndarray and a.dtype is _INT64 and a.ndim == 1 and a.tobytes() == want


_RULES = (  # per kind code: the token counts it takes, and how a bad one is refused
    (lambda L, lim: L == 1, "decode takes one token per sequence; sequence {q} brings {n}"),
    (lambda L, lim: (L >= 0) & (L <= lim.max_draft),
     "verify of sequence {q} brings {n} draft tokens, more than max_draft={m}"),
    (lambda L, lim: L >= 1, "prefill of sequence {q} brings no tokens"),
)


def _lengths(lengths: object, codes: np.ndarray | None, one: StepKind | None, seqs: np.ndarray, lim) -> np.ndarray:
    """The token counts [N], checked against each sequence's kind (`codes`, or `one` kind for every sequence: then
    only that kind's rule runs, 4.5 us against 12.5 for the three masks at N = 1 to 256, timeit on this 2-core CPU,
    2026-12-05)."""
    N = seqs.size
    if lengths is None:
        if (one is not None and one is not StepKind.DECODE) or (codes is not None and (codes != 0).any()):
            raise ValueError("verify and prefill steps take lengths: the token count of every sequence")
        return np.ones(N, dtype=np.int64)
    L = _ints(lengths, N, "lengths")
    for c, (ok, say) in enumerate(_RULES):
        if codes is None and c != KIND_CODE[one]:
            continue
        bad = ~ok(L, lim) if codes is None else (codes == c) & ~ok(L, lim)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            if L[k] < 0:
                raise ValueError(f"sequence {int(seqs[k])}: a token count must be >= 0, got {int(L[k])}")
            raise ValueError(say.format(q=int(seqs[k]), n=int(L[k]), m=lim.max_draft))
    n_prefill = (int(L.sum()) if one is StepKind.PREFILL else 0) if codes is None else int(L[codes == 2].sum())
    if n_prefill > lim.max_prefill_tokens:
        raise ValueError(f"prefill step of {n_prefill} tokens exceeds max_prefill_tokens={lim.max_prefill_tokens}: "
                         "prefill in chunks (each continues from the state) or raise the limit")
    return L


def _token_ids(parts: StepParts, token_ids: object, T: int) -> np.ndarray | None:
    if parts.feeds is None:
        if token_ids is not None:
            raise ValueError("this model has no PLE layer, so it takes no token ids")
        return None
    if token_ids is None:
        raise ValueError(f"PLE layers {sorted(parts.feeds.layers)} need the token ids of every token")
    ids = as_ids(token_ids, "token_ids")
    if ids.shape != (T,):
        raise ValueError(f"token_ids must be [{T}] (every token of the step, packed in its order), got shape "
                         f"{ids.shape}")
    parts.feeds.check_ids(ids, "token_ids")
    return ids


def _capture(capture_at: object, codes: np.ndarray, L: np.ndarray, seqs: np.ndarray) -> np.ndarray | None:
    cap = _ints(capture_at, codes.size, "capture_at")
    bad = (cap != -1) & ((codes != 2) | (cap < 0) | (cap > L))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        what = f"0..{int(L[k])}" if codes[k] == 2 else "-1 (it does not prefill)"
        raise ValueError(f"capture_at of sequence {int(seqs[k])} must be -1 or {what}, got {int(cap[k])}")
    return cap if (cap >= 0).any() else None
