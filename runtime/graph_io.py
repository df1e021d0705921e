"""A decode graph's input and output by address: two kernels captured at the ends of a decode step's CUDA graph that
copy the step's x in from, and its hidden state out to, addresses the host writes each step (`pack.PackBuffers.io`),
so that `run(x)` launches nothing besides the replay.

Why: the graph reads a fixed input and writes a fixed output. Filling the one and copying the other out by torch
(`copy_`, `clone`) cost 27 us of host time per step on the H200's host (bench/results/2026-12-04-host-profile-
eleventh.txt: `run` 39.1 us with the copies against 11.9 us in place at N = 1), three quarters of the 40 us the
whole step may take. Here they cost the host an output allocation and three words in the step's index upload,
which is sent only when they change (a host that passes the same x and frees each output before the next step
sends nothing: the allocator hands the same block back).

The words, int64 at the io region of the index buffer: [source address, source row stride in elements,
destination address]. A zero address means "in place": the input rows already hold x (`Step.input()`), or the
caller takes the graph's fixed output (`run(..., copy=False)`).

- `rows_in(io, slots, x)`: row r of the fixed x [B, D] from the source row r where slots[r] >= 0 (a step's
  sequence), zeros where slots[r] < 0 (the bucket's padding: padding computes on zeros, never on another step's
  rows); with a zero source only the padding rows are written.
- `rows_out(io, slots, out)`: the step's hidden state (plain: x + residual, rounded as torch's add rounds: both
  widened to fp32, one rounding; hc: the streams) into `hidden` [B, D] (plain; hc's is out.x itself) and, where
  the destination is not zero, into its row r for slots[r] >= 0: n = the step's rows, contiguous.

Both kernels keep `plugins/pdl.py`'s rule (they wait for the previous kernel before their first load or store) and
take its launch keywords: inside `pdl.scope()`, which `graphs._capture` opens around them, the first layer's norm
is launched while `rows_in` runs and `rows_out` while the last out_proj runs, as the layers' kernels are. On the H100
(2026-12-05, bench/results/2026-12-05-io-pdl-h100.md) the static step's wall went from 147.9 / 214.4 / 564.2 / 1735
us without to 146.0 / 212.9 / 561.6 / 1734 with at N = 1 / 8 / 64 / 256 (first of two interleaved rounds; the
second alike): 1-2 us, in every pair.

What the host must keep (`addresses`): the source rows 16-byte aligned with a row stride of whole 16-byte units and
unit stride along a row, not overlapping the fixed x (else it copies by torch, as without these kernels); the
destination a fresh contiguous [n, D] tensor. Both are read or written when the replay runs, in stream order, as
`copy_` and `clone` would have read and written them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from gdn_trt.plugins import pdl

from .stack import Packed

BLOCK = 1024  # row elements per program: 8 per thread at 4 warps, a 16-byte vector of bf16


@triton.jit
def _rows_in_kernel(io, slots, x, D, VEC: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < D
    at = x + r.to(tl.int64) * D + cols
    src = tl.load(io)
    if tl.load(slots + r) < 0:
        tl.store(at, tl.zeros([BLOCK], x.dtype.element_ty), mask=m)
    elif src != 0:
        stride = tl.multiple_of(tl.load(io + 1), VEC)
        rows = tl.multiple_of(src.to(tl.pointer_type(x.dtype.element_ty)), 16)
        tl.store(at, tl.load(rows + r * stride + cols, mask=m), mask=m)


@triton.jit
def _rows_out_kernel(io, slots, x, res, hidden, D, s_x, s_r, HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
                     PDL: tl.constexpr = False):
    pdl.enter(PDL)
    r = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < D
    off = r.to(tl.int64) * D + cols  # hidden and the destination: contiguous rows
    v = tl.load(x + r.to(tl.int64) * s_x + cols, mask=m)
    if HAS_RES:
        v = (v.to(tl.float32) + tl.load(res + r.to(tl.int64) * s_r + cols, mask=m).to(tl.float32)).to(
            x.dtype.element_ty)
        tl.store(hidden + off, v, mask=m)
    dst = tl.load(io + 2)
    if dst != 0:
        if tl.load(slots + r) >= 0:
            out = tl.multiple_of(dst.to(tl.pointer_type(x.dtype.element_ty)), 16)
            tl.store(out + off, v, mask=m)


def _grid(t: Tensor) -> tuple[int, int]:
    return t.shape[0], triton.cdiv(t.shape[1], BLOCK)


def rows_in(io: Tensor, slots: Tensor, x: Tensor) -> None:
    """See the module docstring. io [3] int64, slots [B] int32, x [B, D] contiguous (the graph's fixed input)."""
    _rows_in_kernel[_grid(x)](io, slots, x, x.shape[1], VEC=16 // x.element_size(), BLOCK=BLOCK, num_warps=4,
                              **pdl.options(x.device))


def rows_out(io: Tensor, slots: Tensor, out: Packed) -> Tensor:
    """See the module docstring: the step's hidden state [B, D] (a new contiguous tensor for plain models, out.x for
    hc). x and the residual may have any row stride (a layer's output can be a view); along a row, unit stride."""
    x, res = (t if t is None or t.stride(1) == 1 else t.contiguous() for t in (out.x, out.residual))
    hidden, r = (x, x) if res is None else (x.new_empty(x.shape), res)
    _rows_out_kernel[_grid(x)](io, slots, x, r, hidden, x.shape[1], x.stride(0), r.stride(0),
                               HAS_RES=res is not None, BLOCK=BLOCK, num_warps=4, **pdl.options(x.device))
    return hidden


def warm(io: Tensor, slots: Tensor, x: Tensor, out: Packed) -> None:
    """Compile both kernels outside a capture, on scratch tensors like the graph's (`slots` all -1: nothing of the
    caller's is read or written; the destination word is read, never stored to)."""
    rows_in(io, slots, torch.empty_like(x))
    rows_out(io, slots, Packed(_like(out.x), _like(out.residual), out.pack, out.lora_idx))


def _like(t: Tensor | None) -> Tensor | None:
    """Scratch with t's shape and strides (the kernels compile per stride divisibility)."""
    return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)


def addresses(x: Tensor, fixed: Tensor, n: int) -> tuple[int, int] | None:
    """(source address, row stride) of a step's x [n, D] for `rows_in`: (0, 0) where x is the fixed input's rows
    (in place), None where the kernel cannot read it (the caller copies by torch): unit stride along a row, the
    address and the row stride in whole 16-byte units, no overlap with the fixed input."""
    at, fat = x.data_ptr(), fixed.data_ptr()
    s0, s1 = x.stride()
    if at == fat and s0 == fixed.stride(0):
        return 0, 0
    size = x.element_size()
    if s1 != 1 or at % 16 or (s0 * size) % 16:
        return None
    end = at + ((n - 1) * s0 + x.shape[1]) * size
    if at < fat + fixed.numel() * size and fat < end:
        return None
    return at, s0
