"""Helpers shared by the Triton kernel tests (the random inputs and `Step` are in `gdn_trt.plugins.samples`)."""

from __future__ import annotations

from contextlib import contextmanager

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
