"""The index data of a step on the device (pool slots, cu_seqlens, capture points, LoRA slots per token), written
by the host into a pinned buffer and sent in one host-to-device copy.

One device int32 buffer with fixed regions, allocated once per session, so that every view a step binds (and every
CUDA graph captured over them, the runtime's own or a host's) has a stable address:

    slots [2S] | cu [S + 2] | capture_at [S] | lora [L]        (S = max_seqs, L = RuntimeLimits.max_step_tokens)

A step's groups (decode, verify, prefill, in this order) take consecutive parts of each region; a decode group
padded to a CUDA-graph bucket B takes B slots (-1 past its sequences) and B LoRA entries (-1), starting at 0, so the
views a bucket's graph reads are the same every step. Decode groups read `cu_decode`, the constant 0..S, instead of
the cu region. The host writes a step's entries into a staging array; `send` copies them only where they differ from
what the device buffer already holds (a mirror of the entries sent so far): a steady decode loop of the same
sequences sends nothing, which saves its one host-to-device copy, the event and the wait of a ring buffer (three
CUDA calls, about a third of the host time of a decode step on the H200's host; nothing else writes the buffer for
good: a capture's warm-up puts back the slots it blanks). A copy goes through a ring of pinned buffers: a buffer is
rewritten only after its last copy has been read (its event), so the host can prepare step k+1 while the copy of
step k is still queued behind the GPU. The CPU runs the same path (unpinned buffers, a plain copy), so every device
holds what `budget.py` counts.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .budget import RING  # pinned host buffers: the host may run this many steps ahead of the copies before it waits


class PackBuffers:
    """See the module docstring. `regions`: name -> (offset, size) in int32 elements."""

    def __init__(self, max_seqs: int, max_tokens: int, device: torch.device):
        S, self.device = int(max_seqs), torch.device(device)
        self.regions: dict[str, tuple[int, int]] = {}
        at = 0
        for name, size in (("slots", 2 * S), ("cu", S + 2), ("cap", S), ("lora", int(max_tokens))):
            self.regions[name] = (at, size)
            at += size
        self.size = at
        self.offsets = tuple(self.regions[r][0] for r in ("slots", "cu", "cap", "lora"))
        self.dev = torch.zeros(at, dtype=torch.int32, device=self.device)
        self.cu_decode = torch.arange(S + 1, dtype=torch.int32, device=self.device)
        cuda = self.device.type == "cuda"
        self._host = [torch.zeros(at, dtype=torch.int32, pin_memory=cuda) for _ in range(RING)]
        self._views = [h.numpy() for h in self._host]
        self._stage = np.zeros(at, dtype=np.int32)  # the step being written
        self._sent = np.zeros(at, dtype=np.int32)  # what the device buffer holds in [0, _sent_to)
        self._sent_to = 0
        self._events = [torch.cuda.Event() if cuda else None for _ in range(RING)]
        self._used = [False] * len(self._host)
        self._k = 0
        self.copies = 0
        self.memo: dict[tuple, object] = {}  # a step layout -> its bound views (steps.py), bounded below
        self._slices: dict[int, tuple[list[Tensor], Tensor]] = {}

    def remember(self, key: tuple, bound: object) -> object:
        if len(self.memo) > 4096:  # prefill layouts vary without bound
            self.memo.clear()
        self.memo[key] = bound
        return bound

    def view(self, region: str, at: int, n: int) -> Tensor:
        """Device view of `n` entries of `region` from entry `at`."""
        off, size = self.regions[region]
        if at + n > size:
            raise ValueError(f"step packing: {region} needs {at + n} entries, the buffer holds {size}")
        return self.dev[off + at:off + at + n]

    def host(self) -> np.ndarray:
        """The staging array (all regions) to fill for one step, then `send`."""
        return self._stage

    def offset(self, region: str) -> int:
        return self.regions[region][0]

    def send(self, extent: int) -> None:
        """Bring entries [0, extent) of the staging array to the device, on the current stream (the one the session
        steps on): nothing when the device holds them already; otherwise the next ring buffer (waiting only if the
        copy that last read it has not run yet: the host is RING steps ahead of the GPU) and one copy."""
        if extent == 0 or (extent <= self._sent_to and np.array_equal(self._stage[:extent], self._sent[:extent])):
            return
        self._k = (self._k + 1) % len(self._host)
        ev = self._events[self._k]
        if ev is not None and self._used[self._k]:
            ev.synchronize()
        self._views[self._k][:extent] = self._stage[:extent]
        sl = self._slices.get(extent)
        if sl is None:
            sl = self._slices[extent] = ([h[:extent] for h in self._host], self.dev[:extent])
        sl[1].copy_(sl[0][self._k], non_blocking=ev is not None)
        if ev is not None:
            ev.record()
            self._used[self._k] = True
        self._sent[:extent] = self._stage[:extent]
        self._sent_to = max(self._sent_to, extent)
        self.copies += 1
