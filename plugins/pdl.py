"""Programmatic dependent launch (PDL, sm_90+) for the kernels of a decode step.

Why: a decode step at few sequences is a chain of small kernels (per layer: norm, in_proj, conv, GDN, gated norm,
out_proj), each of which waits for the previous one to finish, drain its writes and hand over the SMs before its
own programs start and issue their first loads. In the step's CUDA graph at N = 1 on the H200 the kernels' own
times add up to 131 us and the replay to 141 us: about 0.4 us of idle device between each pair of nodes, besides
each kernel's ramp (its first DRAM round trip, about 1 us, with nothing else in flight).
With PDL a kernel is launched while the previous one still runs, as soon as all of that one's programs have
called `launch_dependents`, and its programs wait at `griddepcontrol.wait` until the previous kernel has completed
and its writes are visible.

The rule every kernel here keeps (`enter`, or `wait` then `release` where a kernel triggers later than at its
start: the skinny GEMM with `gemm.Config.late`, the GDN decode with the gated norm in its epilogue,
`glue/decode_norm.py`): the wait comes first, then `launch_dependents`, so at most one kernel
runs ahead of the one that is working (a trigger placed before the wait would let a chain of kernels start and hold
SM slots while they all wait); every store comes after the wait (a kernel that overlaps the previous one must not
overwrite a buffer that one may still read). Before the wait a kernel may only read what the kernel launched just
before it does not write: every kernel before that one has completed by then (that kernel triggers only after its
own wait; one launched without PDL starts only after its predecessor completed). Two kernels read before the wait:
the conv update reads its packing (cu_seqlens, slots), and the GDN decode its packing (and, with
`Tuning.rec_qkv_first` off, its state tile at the slot the packing names). The kernel before the conv in a layer
is a projection (GEMM, LoRA), the one before the GDN decode the conv (or the in-projection with the conv in its
epilogue, `glue.linear_conv`, which writes the conv pool): none writes the packing or the SSM pool. A
caller that writes a packing by a kernel right before one of these ops could not give that guarantee, so PDL is on
only inside `scope()`, which the runtime's stack opens around its layer calls (its packing comes from the host by a
copy, `runtime/pack.py`).

Measured (H200, bench/results/2026-12-03-pdl.md, the step's graph replay of 4 Qwen3-Next layers): 137.9 -> 118.8 us
at N = 1 and 182.1 -> 175.8 at N = 8; at N = 64 and 256 the step is the GDN kernel and cuBLAS (no PDL), unchanged.

`options(device)` gives the launch keywords: the `PDL` constexpr of the kernels and Triton's `launch_pdl` (the
launch attribute; a CUDA graph captures it as a programmatic edge). {} outside `scope()`, under the interpreter, on
CPUs, before sm_90, and where GDN_TRT_PDL=0 (the A/B switch of the benches). The AOT kernels of the TensorRT plugins
keep the default PDL = False: TensorRT launches them without the attribute.
"""

from __future__ import annotations

import functools
import os
import threading

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def wait(PDL: tl.constexpr):
    """Wait until the previous kernel of the stream has completed and its writes are visible (see the module
    docstring for what may come before this call)."""
    if PDL:
        gdc_wait()


@triton.jit
def release(PDL: tl.constexpr):
    """Let the next kernel launch, after `wait` (where a kernel triggers later than at its start)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def enter(PDL: tl.constexpr):
    """`wait`, then `release`: what every kernel here calls first, before its first store."""
    wait(PDL)
    release(PDL)


_LOCAL = threading.local()


class scope:
    """`with scope():` PDL for the kernels this thread launches inside (the caller keeps the rule of the module
    docstring). A class, not a generator context manager: the runtime enters one per layer call (about a third of
    the host time of `contextlib.contextmanager`'s)."""

    def __enter__(self) -> "scope":
        self._before = getattr(_LOCAL, "on", False)
        _LOCAL.on = True
        return self

    def __exit__(self, *exc) -> bool:
        _LOCAL.on = self._before
        return False


def ptx_allowed() -> bool:
    """Whether kernels may carry inline PTX (this module's waits, `triton_chunked.warp_uniform`): not under Triton's
    interpreter, which runs none."""
    return os.environ.get("TRITON_INTERPRET") != "1"


def enabled(device: torch.device) -> bool:
    """Whether kernels launched on `device` now use PDL."""
    if not getattr(_LOCAL, "on", False) or device.type != "cuda":
        return False
    if not ptx_allowed() or os.environ.get("GDN_TRT_PDL") == "0":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def options(device: torch.device) -> dict:
    """Launch keywords of a PDL kernel on `device`: {} where PDL is off (the kernel's PDL constexpr stays False)."""
    return {"PDL": True, "launch_pdl": True} if enabled(device) else {}

