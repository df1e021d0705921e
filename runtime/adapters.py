"""Per-sequence LoRA adapters of a session: host-resident adapters rotated through a fixed set of device slots.

`AdapterSlots` owns, per GDN layer and LoRA target, the device slot buffers the layers read (`model.lora`: A
`[L, R, in]`, B transposed and scaled `[L, R, out]`, ranks zero-padded), the registry of adapters kept on the host
(already padded, scaled and cast: pinned on CUDA, so an upload is one async copy per tensor), and which adapter
each slot holds, in least-recently-used order.

Per step (`assign`): every adapter bound to a sequence of the step gets a slot; a resident one is a hit (it becomes
most recently used), a missing one is uploaded into a free slot or into the slot of the least recently used adapter
that no sequence of this step needs. A step that needs more distinct adapters than there are slots is refused by
`check_step` before anything changes. Uploads are enqueued on the step's stream, so a slot is never rewritten while
an earlier step that reads it is still running (stream order), and the host copies never change after registration.
CUDA graphs read the slot buffers at fixed addresses: a replay sees whatever the slots hold when it runs.

One adapter's numbers reach only its own sequences: registration refuses an adapter with a NaN or Inf weight or
scale, or whose scaled slot rows overflow the activation dtype; unregistering zeroes the adapter's slot; and the
slot update itself (`model.lora.slot_delta`) never multiplies a token by another slot's values.

Adapter bindings are not recurrent state: snapshots do not record them (the runtime binds adapters to sequences,
`Session.restore(blob, adapter=...)` binds one to the restored sequence).
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.lora import (Adapter, LoraInput, LoraLimits, LoraTarget, LoraWeights, SlotWeights, non_finite,
                                slot_rows)
from gdn_trt.model.peft import AdapterError
from gdn_trt.model.state import BufferSpec

__all__ = ["AdapterCounters", "AdapterError", "AdapterSlots"]


@dataclass
class AdapterCounters:
    """Slot traffic: steps that found their adapters resident (per adapter), uploads, evictions, bytes uploaded."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_uploaded: int = 0


@dataclass(frozen=True)
class _Host:
    """One registered adapter as slot rows, per layer and target: (a [R, in], b [R, out])."""

    adapter: Adapter
    rows: dict[int, dict[LoraTarget, tuple[Tensor, Tensor]]]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for ts in self.rows.values() for a, b in ts.values())


class AdapterSlots:
    """Device adapter slots of a session (see the module docstring).

    Args:
        cfg: the model config.
        limits: slots (`max_adapters`), slot rank (`max_rank`) and the targets the slots cover.
        spec: activation dtype and device of the slot buffers.
    """

    def __init__(self, cfg: GdnConfig, limits: LoraLimits, spec: BufferSpec):
        self.cfg, self.limits, self.spec = cfg, limits, spec
        self.device = torch.device(spec.device)
        L, R, dt = limits.max_adapters, limits.max_rank, spec.act_dtype
        self.weights: dict[int, dict[LoraTarget, SlotWeights]] = {
            i: {s.target: SlotWeights(torch.zeros(L, R, s.in_dim, dtype=dt, device=self.device),
                                      torch.zeros(L, R, s.out_dim, dtype=dt, device=self.device))
                for s in limits.layer_sites(cfg, i)}
            for i in cfg.gdn_layer_ids}
        self._host: dict[str, _Host] = {}
        self._resident: OrderedDict[str, int] = OrderedDict()  # adapter -> slot, least recently used first
        self._free = list(range(L - 1, -1, -1))
        self.counters = AdapterCounters()

    # ---- registry ----
    def register(self, name: str, adapter: Adapter) -> None:
        """Keep `adapter` on the host under `name`; it is uploaded into a slot when a step first needs it. Raises
        `AdapterError` (nothing registered) when it does not fit or holds a non-finite value."""
        if not isinstance(name, str) or not name:
            raise AdapterError(f"an adapter name must be a non-empty string, got {name!r}")
        if name in self._host:
            raise AdapterError(f"adapter {name!r} is already registered (unregister it first to replace it)")
        try:
            adapter.check_fits(self.cfg, self.limits)
        except ValueError as e:
            raise AdapterError(str(e)) from None
        R, dt = self.limits.max_rank, self.spec.act_dtype
        rows = {i: {t: slot_rows(w, R, dt) for t, w in ts.items()} for i, ts in adapter.layers.items()}
        for i, ts in adapter.layers.items():
            for t, w in ts.items():
                _check_finite(name, i, t, w, rows[i][t], dt)
        self._host[name] = _Host(adapter, {i: {t: tuple(self._pin(x) for x in r) for t, r in ts.items()}
                                           for i, ts in rows.items()})

    def unregister(self, name: str, bound: set[str]) -> None:
        """Forget an adapter (its slot becomes free); refused while a live sequence is bound to it."""
        self._known(name)
        if name in bound:
            raise AdapterError(f"adapter {name!r} is bound to a live sequence: release the sequence first")
        del self._host[name]
        slot = self._resident.pop(name, None)
        if slot is not None:
            self._zero(slot)
            self._free.append(slot)

    @property
    def registered(self) -> list[str]:
        return list(self._host)

    @property
    def resident(self) -> dict[str, int]:
        """adapter -> slot, least recently used first."""
        return dict(self._resident)

    def host_bytes(self) -> int:
        return sum(h.nbytes for h in self._host.values())

    def _known(self, name: str) -> None:
        if name not in self._host:
            raise AdapterError(f"adapter {name!r} is not registered; registered: {sorted(self._host)}")

    def _pin(self, t: Tensor) -> Tensor:
        return t.pin_memory() if self.device.type == "cuda" else t

    # ---- steps ----
    def check_step(self, names: set[str]) -> None:
        """Refuse a step that binds unknown adapters or more distinct adapters than slots (nothing changes)."""
        for n in names:
            self._known(n)
        if len(names) > self.limits.max_adapters:
            raise AdapterError(f"the step needs {len(names)} distinct adapters ({sorted(names)}) but the session has "
                               f"{self.limits.max_adapters} adapter slots (LoraLimits.max_adapters): split the step "
                               "or raise the limit")

    def assign(self, names: set[str], stream: torch.cuda.Stream | None) -> dict[str, int]:
        """A slot for every adapter of the step, uploading the missing ones. Trusts `names`: the step ran
        `check_step` on them at its boundary, before anything changed."""
        out = {}
        for n in sorted(names, key=lambda n: (n not in self._resident, n)):  # hits first: they must not be evicted
            if n in self._resident:
                self._resident.move_to_end(n)
                self.counters.hits += 1
            else:
                slot = self._free.pop() if self._free else self._evict(names)
                self._upload(n, slot, stream)
                self._resident[n] = slot
                self.counters.misses += 1
            out[n] = self._resident[n]
        return out

    def _evict(self, keep: set[str]) -> int:
        victim = next(n for n in self._resident if n not in keep)  # exists: len(keep) <= slots (check_step)
        self.counters.evictions += 1
        return self._resident.pop(victim)

    def _upload(self, name: str, slot: int, stream: torch.cuda.Stream | None) -> None:
        """Write every layer's and target's rows of adapter `name` into `slot`; targets it lacks become zero."""
        h = self._host[name]
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for i, ts in self.weights.items():
                for t, w in ts.items():
                    rows = h.rows.get(i, {}).get(t)
                    if rows is None:
                        w.a[slot].zero_()
                        w.b[slot].zero_()
                        continue
                    w.a[slot].copy_(rows[0], non_blocking=True)
                    w.b[slot].copy_(rows[1], non_blocking=True)
                    self.counters.bytes_uploaded += rows[0].nbytes + rows[1].nbytes

    def _zero(self, slot: int) -> None:
        """A freed slot holds zeros, not the numbers of the adapter that left it (enqueued on the current stream,
        after every step that may still read the slot)."""
        for ts in self.weights.values():
            for w in ts.values():
                w.a[slot].zero_()
                w.b[slot].zero_()

    def layer_input(self, layer_idx: int, idx: Tensor) -> LoraInput:
        """The LoRA input of one layer for a step whose tokens use slots `idx [T] int32` (-1 = none)."""
        return LoraInput(idx, self.weights[layer_idx])

    def device_bytes(self) -> int:
        return sum(w.a.nbytes + w.b.nbytes for ts in self.weights.values() for w in ts.values())


def _check_finite(name: str, layer: int, target: LoraTarget, w: LoraWeights, rows: tuple[Tensor, Tensor],
                  dtype: torch.dtype) -> None:
    """Raise `AdapterError` when a target's weights, scale or slot rows (scaled, cast to the activation dtype)
    hold a non-finite value: such an adapter would turn its sequences' outputs into NaN."""
    where = f"adapter {name!r} is not finite: layer {layer} {target.value}"
    if not math.isfinite(w.scale):
        raise AdapterError(f"{where} has scale {w.scale}; fix the adapter's lora_alpha / r")
    for part, x in (("A", w.a), ("B", w.b)):
        bad = non_finite(x)
        if bad is not None:
            raise AdapterError(f"{where} {part} holds {bad}; fix the adapter")
    for part, x in zip(("A", "B"), rows):
        bad = non_finite(x)
        if bad is not None:
            raise AdapterError(f"{where} {part} overflows {str(dtype).replace('torch.', '')} after scaling by "
                               f"{w.scale} ({bad}); the adapter's weights are too large for the activation dtype")
