"""`StepParts`: the collaborators of a session's steps, given once by the session (one object, so that the step
modules take one parameter for them)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gdn_trt.model.config import GdnConfig

from .adapters import AdapterSlots
from .budget import RuntimeLimits
from .graphs import GraphCache
from .guard import Guard
from .pack import PackBuffers
from .ple.feeds import PleFeeds
from .select import Selector
from .seqs import SeqTable
from .stack import Stack
from .state import StatePool
from .stats import SessionStats


@dataclass(frozen=True)
class StepParts:
    """What a step reads and writes, given once by the session: its shapes and limits, the sequence table, the layer
    stack over the state pool, the engine selector, the CUDA-graph cache, PLE feeds, adapter slots, stats, the
    step's index buffer and the thread guard."""

    cfg: GdnConfig
    limits: RuntimeLimits
    dtype: torch.dtype
    device: torch.device
    seqs: SeqTable
    pool: StatePool
    stack: Stack
    selector: Selector
    graphs: GraphCache
    feeds: PleFeeds | None
    adapters: AdapterSlots | None
    stats: SessionStats
    pack: PackBuffers
    guard: Guard = field(default_factory=Guard)  # one thread at a time in the session and its steps (guard.py)
    # the one group of a single-kind step, by (id(group), N, T): a steady loop of steps makes one `request.Part`
    part_memo: dict = field(default_factory=dict)
    # the spec of the last decode-only step accepted, which the same request may reuse (`request.check`), and the
    # spec whose index data the device's index buffer holds (`steps.open_step`)
    last: dict = field(default_factory=dict)
    _streams: dict = field(default_factory=dict)  # raw handle -> torch stream object

    def stream(self) -> torch.cuda.Stream | None:
        """The current stream of the session's device. A steady loop looks up the raw handle only: building the
        stream object (`torch.cuda.current_stream`) took about 10 us per call on the H200's host, a call per step."""
        if self.device.type != "cuda":
            return None
        raw = _RAW_STREAM(self.device.index) if _RAW_STREAM is not None else None
        hit = self._streams.get(raw) if raw is not None else None
        if hit is None:
            hit = torch.cuda.current_stream(self.device)
            if raw is not None:
                if len(self._streams) > 64:
                    self._streams.clear()
                self._streams[raw] = hit
        return hit


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU builds of torch
