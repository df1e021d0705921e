"""Sequence bookkeeping shared by the session and its steps: the live sequences, what a step takes and returns.

A sequence is a pool slot, a committed token position, the registered LoRA adapter its steps apply, and at most one
pending (unaccepted) verify. `Sequences` owns them by id together with the verify epoch: every verify step
overwrites the stash, so a pending verify of an older epoch can no longer be accepted.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

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


@dataclass
class Pending:
    """An unaccepted verify: its stash rows start at `row`, `count` draft tokens, their ids (PLE)."""

    epoch: int
    row: int
    count: int
    ids: np.ndarray


@dataclass
class Seq:
    slot: int
    position: int = 0
    pending: Pending | None = None
    adapter: str | None = None  # the registered LoRA adapter its steps apply


class Sequences:
    """The live sequences of a session by id, the ids released, and the verify epoch."""

    def __init__(self):
        self._live: dict[int, Seq] = {}
        self._released: set[int] = set()
        self._ids = itertools.count()
        self.epoch = 0

    def add(self, slot: int, adapter: str | None) -> int:
        seq = next(self._ids)
        self._live[seq] = Seq(slot, adapter=adapter)
        return seq

    def remove(self, seq: int) -> Seq:
        s = self[seq]
        del self._live[seq]
        self._released.add(seq)
        return s

    def __getitem__(self, seq: int) -> Seq:
        """The live sequence `seq`; `SequenceError` saying whether it was released or never existed."""
        s = self._live.get(seq) if isinstance(seq, (int, np.integer)) and not isinstance(seq, bool) else None
        if s is None:
            state = "was released" if seq in self._released else "is unknown"
            raise SequenceError(f"sequence {seq!r} {state}")
        return s

    def ids(self) -> list[int]:
        return list(self._live)

    def items(self) -> list[tuple[int, Seq]]:
        return list(self._live.items())

    def adapters(self) -> set[str]:
        """The adapters bound to live sequences."""
        return {s.adapter for s in self._live.values() if s.adapter}
