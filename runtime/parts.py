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

    def stream(self) -> torch.cuda.Stream | None:
        return torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
