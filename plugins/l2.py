"""L2 warm-up of the next projection's weight while a decode step's state-streaming kernel runs.

Why: at N = 64 sequences the GDN decode kernel streams 268 MB of fp32 state at about 87 % of the copy rate, and the
layer's out_proj that follows reads its 16.8 MB weight from DRAM at 1.8 TB/s (a narrow, latency-bound GEMM: 9.6 us
against a 4.0 us floor). The kernel's last programs can issue bulk L2 prefetches of that weight
(`cp.async.bulk.prefetch.L2`, sm_90: no registers or shared memory held, nothing waits on them) in the bandwidth
its own tail leaves idle; the state it streams is loaded evict-first and stored streaming, so the weight's lines
(normal priority) are the ones L2 keeps, and the GEMM then reads them from L2.

`warm(weight)` names the tensor for the kernels launched inside the `with` block on this thread (the layer opens it
around its GDN call); `target(device)` is what such a kernel asks. Results never depend on it: a prefetch only moves
data into L2. Off under the interpreter, on CPUs, before sm_90 and where GDN_TRT_L2=0 (the A/B switch of the
benches). The AOT kernels of the TensorRT plugins do not take it.
"""

from __future__ import annotations

import os
import threading

import torch

from . import pdl

_LOCAL = threading.local()


class warm:
    """`with warm(w):` kernels launched inside on this thread that support it prefetch `w` (contiguous) into L2."""

    def __init__(self, weight: torch.Tensor):
        self._weight = weight

    def __enter__(self) -> "warm":
        self._before = getattr(_LOCAL, "weight", None)
        _LOCAL.weight = self._weight
        return self

    def __exit__(self, *exc) -> bool:
        _LOCAL.weight = self._before
        return False


def target(device: torch.device) -> torch.Tensor | None:
    """The tensor to prefetch on `device` now, or None (no `warm` block, another device, a tensor whose start or
    size the bulk prefetch cannot take (16-byte units), or warm-up off: see the module docstring)."""
    w = getattr(_LOCAL, "weight", None)
    if w is None or device.type != "cuda" or w.device != device or not w.is_contiguous():
        return None
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("GDN_TRT_L2") == "0":
        return None
    nbytes = w.numel() * w.element_size()
    if w.data_ptr() % 16 or nbytes % 16 or nbytes == 0:
        return None
    return w if pdl._capable(device.index if device.index is not None else torch.cuda.current_device()) else None
