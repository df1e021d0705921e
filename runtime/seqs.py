"""Sequence bookkeeping of a session in arrays indexed by pool slot, so that a step of N sequences is validated and
committed with a few numpy operations instead of N Python objects.

A sequence id names a pool slot and the tenancy of that slot: `id = (gen - 1) * S + slot`, where S is the number of
slots (`max_seqs`) and `gen` counts the tenants the slot has had. So `slot = id % S`, an id is live exactly when its
slot is live with that generation, and an id of an earlier generation of the slot (or of the present one, freed) was
released: the table tells released from unknown ids without remembering any id (its memory is bounded by
`max_seqs`, not by the history). The first S sequences of a session get ids 0, 1, 2, ... (slots are handed out from
0 up).

Per slot: the generation, live, the committed token position, the LoRA adapter code (-1 = none; codes name the
registered adapters), the pending (unaccepted) verify (`pend_epoch` >= 0: its epoch, first stash row, draft count
and the drafts' token ids on PLE models), and `failed` (a step that raised after its layers had started writing:
the slot's state may be half-written, so every call but release is refused with the reason; `restore` makes a new
sequence). The verify epoch counts verify steps (the order of the pending verifies).

Each pending verify keeps its own stash rows until it is accepted or released: a verify step writes its tokens'
states to a window of the stash that no pending verify holds (`stash_window`). The stash has max_seqs x max_draft
rows and only sequences without a pending verify can verify, so the pending rows and a new step's rows always fit
together; when the free rows are scattered so that no gap fits the step, the pending rows are first moved to the
start of the stash (a device copy of those rows only, in chunks that do not overlap). So verify A, verify B in a
later step, then accept A works, and no extra memory is held for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from torch import Tensor

from gdn_trt.model.errors import GdnTrtError


class SequenceError(GdnTrtError, KeyError):
    """An unknown or released sequence, or one in the wrong phase (e.g. an unaccepted verify)."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Prompt:
    """One sequence's prefill: hidden `[L, stream_dim]`, token ids `[L]` (PLE models), optional capture point."""

    hidden: Tensor
    token_ids: object = None
    capture_at: int | None = None


@dataclass
class StepResult:
    outputs: dict[int, Tensor]
    captures: dict[int, bytes]


@dataclass(frozen=True)
class Pending:
    """An unaccepted verify: its stash rows start at `row`, `count` draft tokens, their ids (PLE)."""

    epoch: int
    row: int
    count: int
    ids: np.ndarray


@dataclass(frozen=True)
class Seq:
    """A read-only view of one sequence's row of the table."""

    slot: int
    position: int
    pending: Pending | None
    adapter: str | None


def as_seq_ids(seqs: object, what: str = "seqs") -> np.ndarray:
    """Sequence ids as a 1-D int64 numpy array (from a list, numpy or a CPU torch tensor); floats and bools refused."""
    if type(seqs) is np.ndarray and seqs.dtype == np.int64 and seqs.ndim == 1:
        return seqs
    if isinstance(seqs, Tensor):
        if seqs.device.type != "cpu":
            raise ValueError(f"{what} must be on the CPU (the host's bookkeeping), got {seqs.device}")
        seqs = seqs.numpy()
    a = np.asarray(seqs)
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{what} must hold integer sequence ids, got dtype {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D [N], got shape {a.shape}")
    return a.astype(np.int64, copy=False)


_RUN = np.arange(1024, dtype=np.int64)  # consecutive slots compare with a run of it (`basic_index`), grown as needed


def basic_index(slots: np.ndarray) -> int | slice | np.ndarray:
    """`slots` (distinct, int64) as an int (one slot) or a slice (consecutive ascending slots) where it can:
    `a[k] += 1` took 0.15 us, `view += 1` on a view made once 0.6-0.8 us, against 1.0-1.6 us for `a[slots] += 1` with
    the index array, at 1 / 64 / 256 slots on this 2-core CPU (2026-12-04, timeit). Whether they are consecutive is
    one byte compare with a run of `_RUN`: 0.2 us against 3.5 for `np.diff` at 64 slots (2026-12-05, timeit)."""
    global _RUN
    n = slots.size
    if n == 1:
        return int(slots[0])
    first = int(slots[0])
    if int(slots[-1]) - first != n - 1 or slots.dtype != np.int64:
        return slots
    if first + n > _RUN.size:
        _RUN = np.arange(2 * (first + n), dtype=np.int64)
    return slice(first, first + n) if slots.tobytes() == _RUN[first:first + n].tobytes() else slots


class SeqTable:
    """The live sequences of a session, by slot (see the module docstring).

    Args:
        slots: pool slots (max_seqs).
        max_draft: draft tokens per verify (the width of the pending ids).
        ple: whether pending verifies keep their token ids (PLE models advance their id carries on accept).
    """

    def __init__(self, slots: int, max_draft: int, ple: bool):
        S = self.S = int(slots)
        self.gen = np.zeros(S, dtype=np.int64)
        self.live = np.zeros(S, dtype=bool)
        self.position = np.zeros(S, dtype=np.int64)
        self.adapter = np.full(S, -1, dtype=np.int64)
        self.pend_epoch = np.full(S, -1, dtype=np.int64)
        self.pend_row = np.zeros(S, dtype=np.int64)
        self.pend_count = np.zeros(S, dtype=np.int64)
        self.pend_ids = np.zeros((S, max_draft), dtype=np.int64) if ple else None
        self.failed = np.zeros(S, dtype=bool)
        self.fail_reason: dict[int, str] = {}  # slot -> why (only failed slots)
        # derived, for the checks of a step (one gather each): the live id of each slot (-1 = free), and whether the
        # slot's sequence may not step (a pending verify or a failure)
        self.live_id = np.full(S, -1, dtype=np.int64)
        self.blocked = np.zeros(S, dtype=bool)
        self.ready = np.full(S, -1, dtype=np.int64)  # live_id where the sequence may step (not blocked), else -1
        self.version = 0  # counts the changes of `ready` (add, remove, block): a request checked at one version
        #                   still holds while it stands
        self.bound = 0  # live sequences bound to an adapter (0: a step skips the adapter lookup)
        self._mark = np.zeros(S, dtype=np.int64)
        self._at = np.arange(1, S + 1, dtype=np.int64)
        self._ones = np.ones(S, dtype=np.int64)
        self._ones.flags.writeable = False
        self._ar = np.arange(S + 2, dtype=np.int64)
        self._ar.flags.writeable = False
        self.epoch = 0
        self.adapter_names: list[str | None] = []  # code -> registered adapter name (None = a freed code)
        self._codes: dict[str, int] = {}

    # ---- ids ----
    def add(self, slot: int, adapter: str | None) -> int:
        self.gen[slot] += 1
        self.live[slot] = True
        self.position[slot] = 0
        self.adapter[slot] = -1 if adapter is None else self.code(adapter)
        self.pend_epoch[slot] = -1
        self.failed[slot] = False
        self.blocked[slot] = False
        self.fail_reason.pop(slot, None)
        self.live_id[slot] = self.ready[slot] = (self.gen[slot] - 1) * self.S + slot
        self.version += 1
        self.bound += adapter is not None
        return int(self.live_id[slot])

    def remove(self, seq: int) -> int:
        """Release `seq`; returns its slot."""
        slot = self.slot(seq)
        self.bound -= bool(self.adapter[slot] >= 0)
        self.live[slot] = False
        self.live_id[slot] = self.ready[slot] = -1
        self.version += 1
        self.pend_epoch[slot] = -1
        self.failed[slot] = False
        self.blocked[slot] = False
        self.fail_reason.pop(slot, None)
        return slot

    def slot(self, seq: object) -> int:
        """The slot of the live sequence `seq`; `SequenceError` saying whether it was released or never existed."""
        if isinstance(seq, (int, np.integer)) and not isinstance(seq, bool) and seq >= 0:
            slot = int(seq) % self.S
            if self.live[slot] and self.gen[slot] == int(seq) // self.S + 1:
                return slot
        raise SequenceError(f"sequence {seq!r} {self._why(seq)}")

    def intact(self, seq: int) -> int:
        """The slot of `seq`, refused (naming the reason) when a step failed on it: its state may be half-written."""
        slot = self.slot(seq)
        if self.failed[slot]:
            raise SequenceError(f"sequence {seq} failed in an earlier step ({self.fail_reason[slot]}): its state may "
                                "be half-written, so only release is open to it")
        return slot

    def slots(self, seqs: np.ndarray) -> np.ndarray:
        """Slots of the ids `seqs [N] int64`, all live and distinct (vectorized); else `SequenceError` or
        `ValueError` naming the first bad sequence."""
        slot = seqs % self.S
        ok = self.live_id[slot] == seqs  # a negative id never matches: live ids are >= 0
        if not ok.all():
            bad = int(seqs[np.flatnonzero(~ok)[0]])
            raise SequenceError(f"sequence {bad} {self._why(bad)}")
        return self._distinct(seqs, slot)

    def _distinct(self, seqs: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """`slot`, after checking that no sequence of `seqs` appears twice (one scatter and gather over the slots)."""
        n = seqs.size
        if n > 1:
            if n > self.S:
                raise ValueError(f"a step of {n} sequences names some twice: the session holds {self.S}")
            at = self._at[:n]
            self._mark[slot] = at
            dup = self._mark[slot] != at
            if dup.any():
                raise ValueError(f"sequence {int(seqs[np.flatnonzero(dup)[0]])} appears twice in one step")
        return slot

    def ones(self, n: int) -> np.ndarray:
        """Token counts of n decode sequences (a shared read-only array: no allocation per step)."""
        return self._ones[:n]

    def block(self, slots: np.ndarray) -> None:
        """Recompute `blocked` (and `ready`) for `slots` after their pending verify or failure changed."""
        self.blocked[slots] = b = (self.pend_epoch[slots] >= 0) | self.failed[slots]
        self.ready[slots] = np.where(b, -1, self.live_id[slots])
        self.version += 1

    def hold(self, slots: np.ndarray | slice, held: bool) -> None:
        """`block` where the outcome is known: a verify's sequences (none failed: they stepped) are held, an
        accept's (none failed: it refuses them first) are free again. Two stores where `block` computes seven
        arrays (16 us of cProfile time for a verify and its accept at N = 64 on this 2-core CPU)."""
        self.blocked[slots] = held
        self.ready[slots] = -1 if held else self.live_id[slots]
        self.version += 1

    def steppable(self, seqs: np.ndarray) -> np.ndarray:
        """Slots of `seqs [N]`, each live, distinct and free to step (no pending verify, not failed): one gather and
        compare in the common case; the first failure is named."""
        slot = seqs % self.S
        if not (self.ready[slot] == seqs).all():
            slot = self.slots(seqs)  # names an unknown, released or repeated sequence
            k = int(np.flatnonzero(self.blocked[slot])[0])
            q, s = int(seqs[k]), int(slot[k])
            if self.failed[s]:
                raise SequenceError(f"sequence {q} failed in an earlier step ({self.fail_reason[s]}): its state may "
                                    "be half-written, so only release is open to it")
            raise SequenceError(f"sequence {q} has an unaccepted verify: call accept first (accept({{{q}: 0}}) "
                                "rejects every draft)")
        return self._distinct(seqs, slot)

    def stash_held(self) -> bool:
        """Whether some pending verify holds stash rows."""
        return bool(((self.pend_epoch >= 0) & (self.pend_count > 0)).any())

    def stash_window(self, tokens: int, capacity: int, move: Callable[[int, int, int], None]) -> int:
        """The first stash row of a verify of `tokens` rows: the lowest gap between the pending verifies' rows that
        fits, after packing the pending rows to the start (`move(src, dst, n)`: rows [src, src+n) to dst < src, on
        the device) when none does. `capacity`: the stash rows (max_seqs x max_draft)."""
        held = np.flatnonzero((self.pend_epoch >= 0) & (self.pend_count > 0))
        if not held.size:
            return 0
        held = held[np.argsort(self.pend_row[held])]
        at = 0
        for s in held.tolist():
            r = int(self.pend_row[s])
            if r - at >= tokens:
                return at
            at = r + int(self.pend_count[s])
        if capacity - at >= tokens:
            return at
        at = 0
        for s in held.tolist():
            r, n = int(self.pend_row[s]), int(self.pend_count[s])
            if r != at:
                move(r, at, n)
                self.pend_row[s] = at
            at += n
        if capacity - at < tokens:  # cannot happen: pending and stepping sequences are distinct, each <= max_draft
            raise RuntimeError(f"stash of {capacity} rows: {at} pending and {tokens} new rows do not fit")
        return at

    def arange(self, n: int) -> np.ndarray:
        """0..n-1 (a shared read-only array)."""
        return self._ar[:n]

    def _why(self, seq: object) -> str:
        if not isinstance(seq, (int, np.integer)) or isinstance(seq, bool) or seq < 0:
            return "is unknown"
        slot, gen = int(seq) % self.S, int(seq) // self.S + 1
        released = gen < self.gen[slot] or (gen == self.gen[slot] and not self.live[slot])
        return "was released" if released else "is unknown"

    # ---- views ----
    def __getitem__(self, seq: int) -> Seq:
        slot = self.slot(seq)
        return self.view(slot)

    def view(self, slot: int) -> Seq:
        pending = None
        if self.pend_epoch[slot] >= 0:
            n = int(self.pend_count[slot])
            ids = self.pend_ids[slot, :n].copy() if self.pend_ids is not None else np.zeros(0, dtype=np.int64)
            pending = Pending(int(self.pend_epoch[slot]), int(self.pend_row[slot]), n, ids)
        code = int(self.adapter[slot])
        return Seq(slot, int(self.position[slot]), pending, None if code < 0 else self.adapter_names[code])

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.live)

    def ids_of(self, slots: np.ndarray) -> np.ndarray:
        return (self.gen[slots] - 1) * self.S + slots

    def ids(self) -> list[int]:
        """Live sequence ids, in slot order."""
        return self.ids_of(self.live_slots()).tolist()

    def items(self) -> list[tuple[int, Seq]]:
        live = self.live_slots()
        return [(int(q), self.view(int(s))) for q, s in zip(self.ids_of(live), live)]

    # ---- adapters ----
    def code(self, name: str) -> int:
        """The code of adapter `name` (given on first use; a freed code is reused)."""
        c = self._codes.get(name)
        if c is None:
            c = next((k for k, n in enumerate(self.adapter_names) if n is None), len(self.adapter_names))
            if c == len(self.adapter_names):
                self.adapter_names.append(name)
            else:
                self.adapter_names[c] = name
            self._codes[name] = c
        return c

    def forget(self, name: str) -> None:
        """Free the code of an adapter that no live sequence binds (after unregistering)."""
        c = self._codes.pop(name, None)
        if c is not None:
            self.adapter_names[c] = None

    def adapters(self) -> set[str]:
        """The adapters bound to live sequences."""
        codes = np.unique(self.adapter[self.live & (self.adapter >= 0)])
        return {self.adapter_names[c] for c in codes.tolist()}

    def adapter_names_of(self, codes: np.ndarray) -> set[str]:
        return {self.adapter_names[c] for c in np.unique(codes[codes >= 0]).tolist()}
