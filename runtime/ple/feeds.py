"""PLE feeds of a session: one `Prestage` per PLE layer, keyed by pool slot, and the rows of each step.

The prestage owns the id carries, the row cache and the fixed device buffer `ple_rows`; this module decides *when*
a step stages (lazily when its PLE layer is reached, or hoisted before a CUDA-graph replay), and when carries
commit: a prefill or decode commits them with the step; a verify does not (its drafts may be rejected), so the
carries are put back after staging and `accept(j)` advances them by the j accepted ids, like the pools.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.checkpoint import PleTable
from gdn_trt.model.config import GdnConfig

from ..budget import RuntimeLimits
from .prestage import Prestage, PrestageCounters


class SlotCarries:
    """The `state.IdCarries` view of one prestage: carries keyed by pool slot (reset = fresh EOS carry)."""

    def __init__(self, prestage: Prestage):
        self.prestage = prestage

    def read(self, slot: int) -> list[int]:
        return self.prestage.get_carry(slot).tolist()

    def write(self, slot: int, ids: list[int]) -> None:
        self.prestage.set_carry(slot, ids)

    def reset(self, slot: int) -> None:
        if slot in self.prestage:
            self.prestage.drop_carry(slot)
        self.prestage.add_carry(slot)


class PleFeeds:
    """Prestages of every PLE layer of `cfg`, sized from `limits`, uploading to `device`."""

    def __init__(self, cfg: GdnConfig, tables: dict[int, PleTable], limits: RuntimeLimits, device: torch.device):
        missing = [i for i in cfg.gdn_layer_ids if cfg.has_ple(i) and i not in tables]
        if missing:
            raise ValueError(f"PLE layers {missing} have no n-gram row table in the checkpoint")
        self.cfg = cfg
        self.stages: dict[int, Prestage] = {
            i: Prestage(cfg, i, tables[i], limits.max_step_tokens, device, limits.ple_cache_rows)
            for i in cfg.gdn_layer_ids if cfg.has_ple(i)}

    @property
    def layers(self) -> frozenset[int]:
        return frozenset(self.stages)

    def carries(self) -> dict[int, SlotCarries]:
        return {i: SlotCarries(p) for i, p in self.stages.items()}

    def check_ids(self, ids: np.ndarray, what: str) -> None:
        """Refuse ids the hash cannot take, before any state changes."""
        V = self.cfg.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"{what}: token ids outside the vocabulary [0, {V})")

    def carries_after(self, slot: int, ids: np.ndarray) -> dict[int, list[int]]:
        """Per PLE layer, the id carry of `slot` after `ids` more tokens (nothing stored): capture points."""
        return {i: p.hasher.hash_sequence(ids, p.get_carry(slot))[1].tolist() for i, p in self.stages.items()}

    def commit(self, slot: int, ids: np.ndarray) -> None:
        """Advance the id carries of `slot` by `ids` (accepted draft tokens)."""
        for i, c in self.carries_after(slot, ids).items():
            self.stages[i].set_carry(slot, c)

    def counters(self) -> dict[int, PrestageCounters]:
        return {i: p.counters() for i, p in self.stages.items()}


class StepRows:
    """PLE rows of one step group: `rows(layer)` stages that layer's rows on first call (hoisting = calling it for
    every PLE layer before a replay); `commit=False` (verify) puts the id carries back after staging."""

    def __init__(self, feeds: PleFeeds | None, seqs: list[tuple[int, np.ndarray]], commit: bool,
                 stream: torch.cuda.Stream | None):
        self.feeds, self.seqs, self.commit, self.stream = feeds, seqs, commit, stream
        self._rows: dict[int, Tensor] = {}

    def rows(self, layer_idx: int) -> Tensor:
        if layer_idx not in self._rows:
            p = self.feeds.stages[layer_idx]
            before = {s: p.get_carry(s) for s, _ in self.seqs} if not self.commit else {}
            self._rows[layer_idx] = p.stage(self.seqs, self.stream)
            for s, c in before.items():
                p.set_carry(s, c)
        return self._rows[layer_idx]

    def hoist(self) -> None:
        if self.feeds is not None:
            for i in self.feeds.stages:
                self.rows(i)

    def rearm(self, consumed: torch.cuda.Event | None) -> None:
        """After the step read the rows: the next upload may reuse the buffers (see `Prestage.rearm`)."""
        for i in self._rows:
            self.feeds.stages[i].rearm(consumed)
