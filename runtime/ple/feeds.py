"""PLE feeds of a session: one `Prestage` per PLE layer, and every sequence's id carry in an array by pool slot.

A step stages every PLE layer's rows when it opens (hoisted: before any layer runs, so that the layer calls only
read the fixed device buffers and a CUDA graph, the runtime's or the host's, can be replayed over them): the ids of
all its sequences are hashed at once with their carries (`carries[layer][slots]`, one numpy gather), gathered into
pinned staging and sent with one copy per layer (`Prestage.put`). The new carries are returned, not stored: the
step commits them when it closes (decode, prefill), a verify never does (its drafts may be rejected: `accept`
moves the carries by the accepted ids, `carries_after` + `commit`, like the pools), and a step that is abandoned
before its layers ran leaves them as they were.
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
    """The `state.IdCarries` view of one PLE layer's carries, by pool slot (reset = the fresh EOS carry)."""

    def __init__(self, feeds: "PleFeeds", layer_idx: int):
        self.feeds, self.layer_idx = feeds, layer_idx

    def read(self, slot: int) -> list[int]:
        return self.feeds.carry[self.layer_idx][slot].tolist()

    def write(self, slot: int, ids: list[int]) -> None:
        self.feeds.carry[self.layer_idx][slot] = ids

    def reset(self, slot: int) -> None:
        self.feeds.carry[self.layer_idx][slot] = self.feeds.cfg.eos_token_id


class PleFeeds:
    """Prestages of every PLE layer of `cfg`, sized from `limits`, uploading to `device`; carries by slot."""

    def __init__(self, cfg: GdnConfig, tables: dict[int, PleTable], limits: RuntimeLimits, device: torch.device):
        missing = [i for i in cfg.gdn_layer_ids if cfg.has_ple(i) and i not in tables]
        if missing:
            raise ValueError(f"PLE layers {missing} have no n-gram row table in the checkpoint")
        self.cfg = cfg
        self.stages: dict[int, Prestage] = {
            i: Prestage(cfg, i, tables[i], limits.max_step_tokens, device, limits.ple_cache_rows)
            for i in cfg.gdn_layer_ids if cfg.has_ple(i)}
        ctx = cfg.ngram_size - 1
        self.carry: dict[int, np.ndarray] = {i: np.full((limits.max_seqs, ctx), cfg.eos_token_id, dtype=np.int64)
                                             for i in self.stages}

    @property
    def layers(self) -> frozenset[int]:
        return frozenset(self.stages)

    def carries(self) -> dict[int, SlotCarries]:
        return {i: SlotCarries(self, i) for i in self.stages}

    def check_ids(self, ids: np.ndarray, what: str) -> None:
        """Refuse ids the hash cannot take, before any state changes."""
        V = self.cfg.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"{what}: token ids outside the vocabulary [0, {V})")

    def stage(self, slots: np.ndarray, ids: np.ndarray, cu: np.ndarray, at: int, pad: int,
              stream: torch.cuda.Stream | None) -> tuple[dict[int, Tensor], dict[int, np.ndarray]]:
        """Every PLE layer's rows of sequences `slots [N]` with ids `ids [T]` packed by `cu [N+1]`, into
        `ple_rows[at:at + T]` and `pad` zero rows after them. Returns (layer -> rows view [T + pad, heads, d_h],
        layer -> the sequences' carries after these ids [N, ngram_size - 1]); stores no carry."""
        rows, new = {}, {}
        one_each = ids.size == slots.size and int(cu[-1]) == ids.size and bool((cu[1:] - cu[:-1] == 1).all())
        for i, p in self.stages.items():  # ids were checked with the step's request, carries are the session's
            r, new[i] = p.hasher.hash_checked(ids, cu, self.carry[i][slots], one_each)
            rows[i] = p.put(r, at, pad, stream)
        return rows, new

    def carries_after(self, slots: np.ndarray, ids: np.ndarray, cu: np.ndarray) -> dict[int, np.ndarray]:
        """Per PLE layer, the carries of `slots` after `ids` packed by `cu` (nothing stored)."""
        return {i: _advance(c[slots], ids, cu, self.cfg.ngram_size - 1) for i, c in self.carry.items()}

    def commit(self, slots: np.ndarray, new: dict[int, np.ndarray]) -> None:
        for i, c in new.items():
            self.carry[i][slots] = c

    def counters(self) -> dict[int, PrestageCounters]:
        return {i: p.counters() for i, p in self.stages.items()}


def _advance(carries: np.ndarray, ids: np.ndarray, cu: np.ndarray, ctx: int) -> np.ndarray:
    """The last `ctx` ids of each sequence's carry ++ its ids: carries [N, ctx], ids packed by cu [N+1]."""
    n = carries.shape[0]
    lens = np.diff(cu)
    hist = np.empty(ids.size + n * ctx, dtype=np.int64)
    starts = cu[:-1] + ctx * np.arange(n)
    hist[(starts[:, None] + np.arange(ctx)[None, :]).reshape(-1)] = carries.reshape(-1)
    seq = np.repeat(np.arange(n), lens)
    hist[np.arange(ids.size) + ctx * (seq + 1)] = ids
    ends = cu[1:] + ctx * np.arange(1, n + 1)
    return hist[ends[:, None] - ctx + np.arange(ctx)[None, :]]
