"""Accept's fold in one launch: stash row rows[k] of every layer's conv, ssm and PLE conv state becomes pool slot
slots[k] (`StepBuffers.fold`).

Why: torch's `pool.index_copy_(0, slots, stash.index_select(0, rows))` per layer and state part is two launches and
two passes over the accepted states (the gather writes a temporary that the scatter reads back). At Qwen3-Next
shapes a sequence's fp32 state is 2 MiB a layer, so accepting drafts of 64 sequences in a 4-layer stack moves
512 MiB: about 0.25 ms at the H200's copy rate once, 0.5 ms twice, next to the 0.96 ms of the verify step itself
(bench/results/2026-12-04-runtime-twelfth.md), and the 16 launches and two uploads cost the host a CUDA call each.
Here one kernel reads each accepted row once and writes it once, after one upload of the row pairs. Alone, accepting
one of 4 stash rows of each of 64 sequences (524 MiB read, as much written) took 385 us, 1.06x the copy rate's time,
against 891 us for torch's gather and scatter (H100, 2026-12-05, bench/results/2026-12-05-fold-rate-h100.md). A
grid over the live blocks only (about half of this grid's programs return at once: a conv row needs 3 of the 128
column blocks sized by the widest row) took the same, 387 us (the code is at 09d9be9).

`Table`: per (stash tensor, pool tensor) pair of every layer, the two base addresses and the row length in words,
built once per session on the device (the stash and the pools never move). The copy is by words of the largest
size in 4, 2, 1 bytes that divides every row and base address (the row's dtype does not matter to a copy): fp32
states and bf16 conv windows of an even width copy by 4-byte words, 16-byte vectors where the rows allow them.
The interpreter tests it against torch's gather and scatter bit for bit; the GPU tests compare a session's accepts
through it with the same session's through torch (passed on the H200, 2026-12-05, where it became the default:
`stack.FOLD_KERNEL`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK = 4096  # words per program: 32 per thread at 4 warps


@triton.jit(do_not_specialize=["n"])  # one compile for every count of accepted sequences
def _fold_kernel(table, pairs, n, WORD: tl.constexpr, VEC: tl.constexpr, BLOCK: tl.constexpr):
    k = tl.program_id(0)  # the accepted sequence
    t = tl.program_id(1)  # the (stash, pool) tensor pair
    c = tl.program_id(2)  # the column block
    # VEC words make 16 bytes where every row and base is whole 16-byte vectors (else 1): with the row length known
    # to be a multiple of it, the masks hold per vector and the copies are 16-byte loads and stores
    words = tl.multiple_of(tl.load(table + 3 * t + 2), VEC)
    if c * BLOCK < words:
        cols = c * BLOCK + tl.arange(0, BLOCK)
        m = cols < words
        r = tl.load(pairs + k)
        s = tl.load(pairs + n + k)
        src = tl.load(table + 3 * t).to(tl.pointer_type(WORD))
        dst = tl.load(table + 3 * t + 1).to(tl.pointer_type(WORD))
        at_src = tl.multiple_of(src + r * words, 16 if VEC > 1 else 1)  # a pointer's hint: bytes
        at_dst = tl.multiple_of(dst + s * words, 16 if VEC > 1 else 1)
        tl.store(at_dst + cols, tl.load(at_src + cols, mask=m), mask=m)


_WORDS = {4: tl.int32, 2: tl.int16, 1: tl.int8}


@dataclass(frozen=True)
class Table:
    """The device table [pairs, 3] int64 (stash base, pool base, words per row), the word size in bytes, the
    widest row in words and whether every row and base is a whole number of 16-byte vectors."""

    words: Tensor
    word: int
    widest: int
    vec: bool

    @staticmethod
    def of(pairs: list[tuple[Tensor, Tensor]]) -> "Table":
        """`pairs`: (stash, pool) tensors of the same row shape and dtype, contiguous, on one CUDA device."""
        for src, dst in pairs:
            if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype or not (src.is_contiguous()
                                                                               and dst.is_contiguous()):
                raise ValueError(f"fold pairs must be contiguous and alike past the row: {tuple(src.shape)} "
                                 f"{src.dtype} against {tuple(dst.shape)} {dst.dtype}")
        sizes = [src[0].numel() * src.element_size() for src, _ in pairs]
        bases = [t.data_ptr() for pair in pairs for t in pair]
        word = next(w for w in (4, 2, 1) if all(b % w == 0 for b in sizes + bases))
        vec = all(b % 16 == 0 for b in sizes + bases)
        rows = [[src.data_ptr(), dst.data_ptr(), b // word] for (src, dst), b in zip(pairs, sizes)]
        dev, host = pairs[0][0].device, torch.tensor(rows, dtype=torch.int64)
        words = host.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else host  # no stream sync
        return Table(words, word, max(b // word for b in sizes), vec)


def fold(table: Table, pairs: Tensor) -> None:
    """pairs [2, n] int32 or int64 on the device, contiguous: stash rows, then pool slots (distinct), n >= 1. Every
    table pair's stash row pairs[0, k] is copied to its pool's row pairs[1, k], on the current stream."""
    n = pairs.shape[1]
    grid = (n, table.words.shape[0], triton.cdiv(table.widest, BLOCK))
    _fold_kernel[grid](table.words, pairs, n, WORD=_WORDS[table.word], VEC=16 // table.word if table.vec else 1,
                       BLOCK=BLOCK, num_warps=4)
