"""Helpers shared by the Triton kernel tests."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch


@contextmanager
def poisoned(module):
    """Make every buffer a Triton module allocates (`module._new`) start as NaN, so unwritten rows fail loudly."""
    orig = module._new
    module._new = lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    try:
        yield
    finally:
        module._new = orig


@dataclass(frozen=True)
class Step:
    """One packed step of a kernel test: token count and pool slot per sequence, optional capture points."""

    lengths: tuple[int, ...]
    slots: tuple[int, ...]
    capture_at: tuple[int, ...] = ()

    def __str__(self) -> str:
        return "L" + "-".join(map(str, self.lengths))
