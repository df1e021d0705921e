"""Running one step group through the stack of GDN layers, and the step buffers the runtime owns.

The hidden state goes through the layers in checkpoint order. Plain layers hand `(x, residual)` from layer to
layer (the runtime owns the residual: zeros before the first layer, and the step's result is `x + residual`, the
HF hidden state after the last layer); hc layers hand the streams `[T, n*C]`. Verify modes write each layer's
stash, prefill modes each layer's capture rows; both are sized once from `RuntimeLimits`.

PLE (`PleFeeds`, `StepRows`): one `runtime.ple.Prestage` per PLE layer, keyed by pool slot, and per-step rows.

The prestage owns the id carries, the row cache and the fixed device buffer `ple_rows`; this module decides *when*
a step stages (lazily when its PLE layer is reached, or hoisted before a CUDA-graph replay), and when carries
commit: a prefill or decode commits them with the step; a verify does not (its drafts may be rejected), so the
carries are put back after staging and `accept(j)` advances them by the j accepted ids, like the pools.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ..model.checkpoint import PleTable
from ..model.config import GdnConfig
from ..model.modes import LayerMode
from ..model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput, StepOutput
from ..plugins.packing import Packing
from .adapters import AdapterSlots
from .engine import Engine, LayerCall
from .budget import RuntimeLimits
from .ple.prestage import Prestage, PrestageCounters
from .state import StatePool

RowsFn = Callable[[int], Tensor]  # layer index -> PLE rows [T, heads, d_h] of the step, staged on first call


@dataclass
class StepBuffers:
    """Per layer: the verify stash `[max_verify_tokens, ...]` and the prefill capture rows `[max_seqs, ...]`."""

    stash: dict[int, StateStash]
    capture: dict[int, LayerState]

    @staticmethod
    def allocate(cfg: GdnConfig, limits: RuntimeLimits, spec: BufferSpec) -> "StepBuffers":
        ids = cfg.gdn_layer_ids
        return StepBuffers({i: StateStash.allocate(cfg, i, limits.max_verify_tokens, spec) for i in ids},
                           {i: LayerState.allocate(cfg, i, limits.max_seqs, spec) for i in ids})

    def stash_view(self, layer_idx: int, tokens: int) -> StateStash:
        s = self.stash[layer_idx]
        return StateStash(s.conv[:tokens], s.ssm[:tokens], None if s.ple_conv is None else s.ple_conv[:tokens])

    def capture_view(self, layer_idx: int, at: Tensor) -> StateCapture:
        c, n = self.capture[layer_idx], at.shape[0]
        return StateCapture(at, c.conv[:n], c.ssm[:n], None if c.ple_conv is None else c.ple_conv[:n])

    def fold(self, pool: StatePool, rows: list[int], slots: list[int]) -> None:
        """Write on accept: stash row rows[k] of every layer becomes pool slot slots[k], on the device."""
        if not rows:
            return
        r, s = (_upload(torch.tensor(v, dtype=torch.int64), pool.device) for v in (rows, slots))
        for i, st in pool.layers.items():
            stash = self.stash[i]
            for part in ("conv", "ssm", "ple_conv"):
                dst = getattr(st, part)
                if dst is not None:
                    dst.index_copy_(0, s, getattr(stash, part).index_select(0, r))


@dataclass
class Packed:
    """A group's packed activations: x `[T, stream_dim]`, residual `[T, C]` (plain) or None (hc), the packing, and
    the LoRA slot of every token `lora_idx [T] int32` (-1 = none) when the session has adapter slots."""

    x: Tensor
    residual: Tensor | None
    pack: Packing
    lora_idx: Tensor | None = None


class Stack:
    """The layers of a session in order, over its pool and step buffers."""

    def __init__(self, cfg: GdnConfig, pool: StatePool, buffers: StepBuffers):
        self.cfg, self.pool, self.buffers = cfg, pool, buffers
        self.layer_ids = cfg.gdn_layer_ids
        self.lora: AdapterSlots | None = None  # set by the session when it has adapter slots

    def packed(self, x: Tensor, lengths: list[int], slots: list[int], adapters: list[int] | None = None) -> Packed:
        """`adapters`: the LoRA slot of each sequence (-1 = none; None = none for all), repeated over its tokens;
        used only when the session has adapter slots."""
        residual = None if self.cfg.is_hc else torch.zeros_like(x)
        idx = None
        if self.lora is not None:
            adapters = [-1] * len(lengths) if adapters is None else adapters
            host = torch.tensor([a for a, n in zip(adapters, lengths) for _ in range(n)], dtype=torch.int32)
            idx = _upload(host, x.device)
        return Packed(x, residual, upload_packing(lengths, slots, x.device), idx)

    def extra(self, mode: LayerMode, layer_idx: int, tokens: int, capture_at: Tensor | None
              ) -> StateStash | StateCapture | None:
        if mode.uses_stash:
            return self.buffers.stash_view(layer_idx, tokens)
        if mode.chunked:
            return self.buffers.capture_view(layer_idx, capture_at)
        return None

    def run(self, mode: LayerMode, engines: tuple[Engine, ...], inp: Packed, ctx: "StepContext") -> Packed:
        """Run `inp` through the layers of `engines` (a contiguous run of the stack) and return the result."""
        x, residual = inp.x, inp.residual
        for eng in engines:
            i = eng.layer_idx
            rows = ctx.rows(i) if self.cfg.has_ple(i) else None
            extra = self.extra(mode, i, x.shape[0], ctx.capture_at)
            lora = None if inp.lora_idx is None else self.lora.layer_input(i, inp.lora_idx)
            out = eng.run(LayerCall(mode, StepInput(x, inp.pack, residual, rows, lora), self.pool.layers[i], extra),
                          ctx.stream)
            x, residual = out.x, out.residual
        return Packed(x, residual, inp.pack, inp.lora_idx)

    @staticmethod
    def hidden(p: Packed) -> Tensor:
        return StepOutput(p.x, p.residual).hidden()


def upload_packing(lengths: list[int], slots: list[int], device: torch.device) -> Packing:
    """`Packing` of a step, checked on the host and uploaded without a host sync: a plain H2D copy from pageable
    memory would wait for the stream, and the host could no longer run ahead of the GPU by a step."""
    host = Packing.build(lengths, slots)
    return Packing(_upload(host.cu_seqlens, device), _upload(host.slots, device))


def _upload(t: Tensor, device: torch.device) -> Tensor:
    return t if device.type != "cuda" else t.pin_memory().to(device, non_blocking=True)


@dataclass
class StepContext:
    """What a group's layers need besides activations: PLE rows by layer, capture points, the stream."""

    rows: RowsFn
    capture_at: Tensor | None
    stream: torch.cuda.Stream | None


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
