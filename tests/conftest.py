"""Shared test setup: fixed seeds and the `gpu` marker (skipped, with its reason, where CUDA is absent)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: run on the GPU machine (tests marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def has_tensorrt() -> bool:
    """Whether the full TensorRT Python package imports here (never on the CPU machines: see docs/tensorrt.md)."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return False
    return True
