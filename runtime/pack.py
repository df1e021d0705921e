"""The index data of a step on the device (pool slots, cu_seqlens, capture points, LoRA slots per token), written
by the host into a pinned buffer and sent in one host-to-device copy.

One device int32 buffer with fixed regions, allocated once per session, so that every view a step binds (and every
CUDA graph captured over them, the runtime's own or a host's) has a stable address:

    slots [2S] | cu [S + 2] | capture_at [S] | lora [L] | io [6] | fold [2S]
    (S = max_seqs, L = RuntimeLimits.max_step_tokens)

A step's groups (decode, verify, prefill, in this order) take consecutive parts of each region; a decode group padded to
a CUDA-graph bucket B takes B slots (-1 past its sequences) and B LoRA entries (-1), starting at 0, so the views a
bucket's graph reads are the same every step. Decode groups read `cu_decode`, the constant 0..S, instead of the cu
region. `io` holds three int64 words at an 8-byte aligned offset: the addresses a decode graph copies its input from and
its output to (`graph_io.py`), sent on their own (`send_io`) once the step's x and output are known, after the rest went
when the step opened. `fold` holds an accept's (stash row, slot) pairs (`pairs`), sent on their own: an accept is no
step, and no graph reads them. The host writes a step's entries into a staging array; `send` copies them only where they
differ from what the device buffer already holds (a mirror of the entries sent so far): a steady decode loop of the same
sequences sends nothing, which saves its one host-to-device copy, the event and the wait of a ring buffer (three CUDA
calls, about a third of the host time of a decode step on the H200's host; nothing else writes the buffer for good: a
capture's warm-up puts back the slots it blanks). A copy goes through a ring of pinned buffers: a buffer is rewritten
only after its last copy has been read (its event), so the host can prepare step k+1 while the copy of step k is still
queued behind the GPU. The CPU runs the same path (unpinned buffers, a plain copy), so every device holds what
`budget.py` counts.
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
        at += at % 2  # the io words are int64
        self.regions["io"] = (at, 6)
        at += 6
        self.regions["fold"] = (at, 2 * S)
        at += 2 * S
        self.size = at
        self.offsets = tuple(self.regions[r][0] for r in ("slots", "cu", "cap", "lora"))
        self.dev = torch.zeros(at, dtype=torch.int32, device=self.device)
        self.cu_decode = torch.arange(S + 1, dtype=torch.int32, device=self.device)
        lo = self.regions["io"][0]
        self.io = self.dev[lo:lo + 6].view(torch.int64)  # graph_io's words on the device
        cuda = self.device.type == "cuda"
        self._host = [torch.zeros(at, dtype=torch.int32, pin_memory=cuda) for _ in range(RING)]
        self._views = [h.numpy() for h in self._host]
        self._stage = np.zeros(at, dtype=np.int32)  # the step being written
        self._sent = np.zeros(at, dtype=np.int32)  # what the device buffer holds in [0, _sent_to)
        self._sent_to = 0
        self._io_held = (0, 0, 0)  # the io words the device holds (zeros from the start)
        self._events = [torch.cuda.Event() if cuda else None for _ in range(RING)]
        self._used = [False] * len(self._host)
        self._k = 0
        self.copies = 0
        self.memo: dict[tuple, object] = {}  # a step layout -> its bound views (steps.py), bounded below
        self._slices: dict[tuple[int, int], tuple[list[Tensor], Tensor]] = {}

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
        self._copy(0, extent)
        self._sent[:extent] = self._stage[:extent]
        self._sent_to = max(self._sent_to, extent)

    def send_io(self, src: int, stride: int, dst: int) -> None:
        """The io words (the module docstring) to the device, on the current stream, unless it holds them already."""
        words = (src, stride, dst)
        if words == self._io_held:
            return
        lo = self.regions["io"][0]
        self._stage[lo:lo + 6].view(np.int64)[:] = words
        self._copy(lo, lo + 6)
        self._io_held = words

    def pairs(self, rows: np.ndarray, slots: np.ndarray) -> Tensor:
        """An accept's stash rows and pool slots [2, n] on the device, through the ring like a step's index data:
        torch's `tensor(...).pin_memory().to(...)` made a host tensor, pinned a copy of it and allocated a device
        tensor at every accept."""
        n = rows.size
        lo = self.regions["fold"][0]
        self._stage[lo:lo + n] = rows
        self._stage[lo + n:lo + 2 * n] = slots
        self._copy(lo, lo + 2 * n)
        return self.dev[lo:lo + 2 * n].view(2, n)

    def _copy(self, lo: int, hi: int) -> None:
        """Entries [lo, hi) of the staging array to the device through the next ring buffer (waiting only if the copy
        that last read it has not run yet: the host is RING steps ahead of the GPU)."""
        self._k = (self._k + 1) % len(self._host)
        ev = self._events[self._k]
        if ev is not None and self._used[self._k]:
            ev.synchronize()
        self._views[self._k][lo:hi] = self._stage[lo:hi]
        sl = self._slices.get((lo, hi))
        if sl is None:
            sl = self._slices[(lo, hi)] = ([h[lo:hi] for h in self._host], self.dev[lo:hi])
        sl[1].copy_(sl[0][self._k], non_blocking=ev is not None)
        if ev is not None:
            ev.record()
            self._used[self._k] = True
        self.copies += 1
