"""Running one step group through the stack of GDN layers, and the step buffers the runtime owns.

The hidden state goes through the layers in checkpoint order. Plain layers hand `(x, residual)` from layer to
layer (the runtime owns the residual: zeros before the first layer, and the step's result is `x + residual`, the
HF hidden state after the last layer); hc layers hand the streams `[T, n*C]`. Verify modes write each layer's
stash, prefill modes each layer's capture rows; both are sized once from `RuntimeLimits`. PLE layers read their
rows through `StepContext.rows` (`runtime.ple.feeds` stages them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput, StepOutput
from gdn_trt.plugins import pdl
from gdn_trt.plugins.packing import Packing

from . import fold as fold_kernel
from .adapters import AdapterSlots
from .budget import RuntimeLimits
from .engine import Engine, LayerCall
from .state import StatePool
from .tp import RankTp

RowsFn = Callable[[int], Tensor]  # layer index -> PLE rows [T, heads, d_h] of the step, staged on first call
# accept's fold on a GPU as one launch of `fold.py`'s kernel (each accepted row read and written once) instead of a
# gather and a scatter per layer and state part. On: accepting 2 drafts of each of 64 verified sequences (4 Qwen3-Next
# layers, H200, 2026-12-05, bench/host_profile.py --eager) took 231 us of host time and a 483 us span of events
# around it against torch's 438 and 977; alone the kernel took 385 us against torch's 891 (H100,
# bench/fold_rate.py). GDN_TRT_FOLD_KERNEL=0 turns it off.
FOLD_KERNEL = os.environ.get("GDN_TRT_FOLD_KERNEL", "1") == "1"
_PARTS = ("conv", "ssm", "ple_conv")


@dataclass
class StepBuffers:
    """Per layer: the verify stash `[max_verify_tokens, ...]` and the prefill capture rows `[max_seqs, ...]`."""

    stash: dict[int, StateStash]
    capture: dict[int, LayerState]
    _fold: tuple[StatePool, fold_kernel.Table] | None = field(default=None, repr=False)  # (the pool, its table)

    @staticmethod
    def allocate(cfg: GdnConfig, limits: RuntimeLimits, spec: BufferSpec) -> "StepBuffers":
        ids = cfg.gdn_layer_ids
        return StepBuffers({i: StateStash.allocate(cfg, i, limits.max_verify_tokens, spec) for i in ids},
                           {i: LayerState.allocate(cfg, i, limits.max_seqs, spec) for i in ids})

    def stash_view(self, layer_idx: int, tokens: int, at: int = 0) -> StateStash:
        """Stash rows [at, at + tokens) of a layer (a verify step's window: `SeqTable.stash_window`)."""
        s, e = self.stash[layer_idx], at + tokens
        return StateStash(s.conv[at:e], s.ssm[at:e], None if s.ple_conv is None else s.ple_conv[at:e])

    def move(self, src: int, dst: int, n: int) -> None:
        """Stash rows [src, src + n) to [dst, dst + n), dst < src, in every layer (chunks of src - dst rows: no
        chunk overlaps the rows it reads)."""
        step = src - dst
        for s in self.stash.values():
            for t in (s.conv, s.ssm, s.ple_conv):
                for k in range(0, n, step) if t is not None else ():
                    m = min(step, n - k)
                    t[dst + k:dst + k + m].copy_(t[src + k:src + k + m])

    def capture_view(self, layer_idx: int, at: Tensor) -> StateCapture:
        c, n = self.capture[layer_idx], at.shape[0]
        return StateCapture(at, c.conv[:n], c.ssm[:n], None if c.ple_conv is None else c.ple_conv[:n])

    def fold(self, pool: StatePool, pairs: Tensor) -> None:
        """Write on accept: stash row pairs[0, k] of every layer becomes pool slot pairs[1, k] (`pairs` [2, n] int32
        on the device, n >= 1: `PackBuffers.pairs`), on the device."""
        if _fold_by_kernel(pool.device):
            if self._fold is None or self._fold[0] is not pool:
                self._fold = pool, fold_kernel.Table.of([
                    (getattr(self.stash[i], part), getattr(st, part)) for i, st in pool.layers.items()
                    for part in _PARTS if getattr(st, part) is not None])
            fold_kernel.fold(self._fold[1], pairs)
            return
        r, s = pairs.long()
        for i, st in pool.layers.items():
            stash = self.stash[i]
            for part in _PARTS:
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
        self.tp: RankTp | None = None  # set by a tensor-parallel rank's session: it finishes each layer's reduction
        # the residual before the first layer of a decode step (<= pool slots rows; `budget.py` counts it): nothing
        # writes it, so a host's captured graph can read it in place
        self._zeros = None if cfg.is_hc else torch.zeros((pool.slots, cfg.hidden_size), dtype=pool.spec.act_dtype,
                                                         device=pool.device)

    def zeros(self, rows: int) -> Tensor:
        """Zeros [rows, C] in the activation dtype (a plain layer's residual before the first layer): a view of the
        fixed buffer for a decode step, a fresh tensor for a larger (eager) step."""
        if rows <= self._zeros.shape[0]:
            return self._zeros[:rows]
        return torch.zeros((rows, self.cfg.hidden_size), dtype=self._zeros.dtype, device=self._zeros.device)

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

    def extra(self, mode: LayerMode, layer_idx: int, tokens: int, capture_at: Tensor | None, stash_at: int = 0
              ) -> StateStash | StateCapture | None:
        writes = mode.spec.writes
        if writes is Writes.STASH:
            return self.buffers.stash_view(layer_idx, tokens, stash_at)
        if writes is Writes.POOLS_CAPTURE:
            return self.buffers.capture_view(layer_idx, capture_at)
        return None

    def run(self, mode: LayerMode, engines: tuple[Engine, ...], inp: Packed, ctx: "StepContext") -> Packed:
        """Run `inp` through the layers of `engines` (one per layer of a contiguous run of the stack) and return the
        result. A stack engine (several `layer_ids`) stands at each of its layers and runs them in one call.
        The layers' kernels use programmatic dependent launch where the GPU has it (`plugins/pdl.py`: the step's
        packing reaches the device by a copy from the host, never by the kernel just before a conv or GDN op)."""
        with pdl.scope():
            return self._run(mode, engines, inp, ctx)

    def _run(self, mode: LayerMode, engines: tuple[Engine, ...], inp: Packed, ctx: "StepContext") -> Packed:
        k = 0
        while k < len(engines):
            eng = engines[k]
            ids = eng.layer_ids
            if tuple(engines[k:k + len(ids)]) != (eng,) * len(ids):
                n = next((j for j, e in enumerate(engines[k:k + len(ids)]) if e is not eng), len(engines) - k)
                raise ValueError(f"{eng.name} runs layers {list(ids)} in one call but was chosen for {n} "
                                 "consecutive layers of the step")
            if len(ids) == 1:
                out = eng.run(self._call(mode, eng.layer_idx, inp, ctx), ctx.stream)
                if self.tp is not None:  # no host between the layers: the runtime does the last all-reduce
                    out = self.tp.finish(out, self.cfg.is_hc)
            elif self.tp is not None:
                raise ValueError(f"{eng.name} runs layers {list(ids)} in one call: a tensor-parallel rank needs an "
                                 "all-reduce after each layer, so it runs per-layer engines only")
            else:
                out = eng.run_layers(tuple(self._call(mode, i, inp, ctx) for i in ids), ctx.stream)
            inp = Packed(out.x, out.residual, inp.pack, inp.lora_idx)
            k += len(ids)
        return inp

    def call(self, mode: LayerMode, eng: Engine, inp: Packed, ctx: "StepContext", part: str = "layer"
             ) -> StepOutput:
        """One engine's layer (or its mixer alone, `part="mixer"`: `inp.x` = the normed hidden [T, C]) on `inp`:
        its pools, the stash or capture rows the mode writes, its PLE rows and LoRA slots. A host's call: on a
        tensor-parallel rank the output is all-reduced unless the host reduces (`partial`, `runtime/tp.py`)."""
        with pdl.scope():
            out = eng.run(self._call(mode, eng.layer_idx, inp, ctx, part), ctx.stream)
        if self.tp is not None and not self.partial:
            out = self.tp.finish(out, self.cfg.is_hc)
        return out

    @property
    def partial(self) -> bool:
        """A host's layer calls return this rank's partial sums (a rank session opened with host_reduce=True)."""
        return self.tp is not None and self.tp.spec.host_reduce

    def _call(self, mode: LayerMode, i: int, inp: Packed, ctx: "StepContext", part: str = "layer") -> LayerCall:
        rows = ctx.rows(i) if part == "layer" and self.cfg.has_ple(i) else None
        extra = self.extra(mode, i, inp.x.shape[0], ctx.capture_at, ctx.stash_at)
        lora = None if inp.lora_idx is None else self.lora.layer_input(i, inp.lora_idx)
        step = StepInput(inp.x, inp.pack, inp.residual, rows, lora)
        return LayerCall(mode, step, self.pool.layers[i], extra, part)

    @staticmethod
    def hidden(p: Packed) -> Tensor:
        return StepOutput(p.x, p.residual).hidden()


def upload_packing(lengths: list[int], slots: list[int], device: torch.device) -> Packing:
    """`Packing` of a step, checked on the host and uploaded without a host sync: a plain H2D copy from pageable
    memory would wait for the stream, and the host could no longer run ahead of the GPU by a step."""
    host = Packing.build(lengths, slots)
    return Packing(_upload(host.cu_seqlens, device), _upload(host.slots, device))


def _fold_by_kernel(device: torch.device) -> bool:
    return FOLD_KERNEL and device.type == "cuda"


def _upload(t: Tensor, device: torch.device) -> Tensor:
    return t if device.type != "cuda" else t.pin_memory().to(device, non_blocking=True)


@dataclass
class StepContext:
    """What a group's layers need besides activations: PLE rows by layer, capture points, the stream, the first
    stash row of a verify group."""

    rows: RowsFn
    capture_at: Tensor | None
    stream: torch.cuda.Stream | None
    stash_at: int = 0
