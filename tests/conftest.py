"""Shared test setup: fixed seeds and the `gpu` marker (skipped, with its reason, where CUDA is absent)."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_configure(config):
    # Under xdist every worker's torch would start one CPU thread per core (14 workers x 16 threads on the GPU
    # machine's 16 cores), oversubscribing the cores that the float64 references and Triton's compiles share.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


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
