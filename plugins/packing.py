"""Packed variable-length layout shared by every op.

T tokens of N sequences are packed back to back; `cu_seqlens [N+1] int32` holds the offsets and `slots [N] int32`
names each sequence's row in the state pools (-1 = a padding sequence that every kernel skips: no output rows are
computed for it (they are zero) and no buffer is written).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Packing:
    """`cu_seqlens [N+1] int32`, `slots [N] int32`."""

    cu_seqlens: Tensor
    slots: Tensor

    @staticmethod
    def build(lengths: list[int], slots: list[int], device: torch.device | str = "cpu") -> "Packing":
        """Packing of sequences with the given token counts and pool slots, checked on the host."""
        if len(lengths) != len(slots):
            raise ValueError(f"{len(lengths)} lengths but {len(slots)} slots")
        cu = [0]
        for n in lengths:
            if n < 0:
                raise ValueError(f"negative sequence length {n}")
            cu.append(cu[-1] + n)
        p = Packing(torch.tensor(cu, dtype=torch.int32, device=device),
                    torch.tensor(slots, dtype=torch.int32, device=device))
        check_slots(slots)
        return p

    @property
    def num_seqs(self) -> int:
        return self.slots.shape[0]

    def check_shapes(self, num_tokens: int) -> None:
        """Dtype and shape checks (no data access, so no host sync on a GPU)."""
        for name, t in (("cu_seqlens", self.cu_seqlens), ("slots", self.slots)):
            if t.dtype != torch.int32 or t.dim() != 1:
                raise ValueError(f"{name} must be a 1-D int32 tensor, got {t.dtype} {tuple(t.shape)}")
        if self.cu_seqlens.shape[0] != self.slots.shape[0] + 1:
            raise ValueError(f"cu_seqlens has {self.cu_seqlens.shape[0]} entries, slots {self.slots.shape[0]}: "
                             "need N+1 and N")

    def check_values(self, num_tokens: int, pool_rows: int) -> None:
        """Value checks for host tensors: offsets monotone from 0 to T, slots in range and distinct."""
        cu = self.cu_seqlens.tolist()
        if cu[0] != 0 or cu[-1] != num_tokens or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must rise from 0 to T={num_tokens}, got {cu}")
        check_slots(self.slots.tolist(), pool_rows)

    def lengths(self) -> list[int]:
        cu = self.cu_seqlens.tolist()
        return [b - a for a, b in zip(cu, cu[1:])]


def check_slots(slots: list[int], pool_rows: int | None = None) -> None:
    live = [s for s in slots if s != -1]
    bad = [s for s in slots if s < -1 or (pool_rows is not None and s >= pool_rows)]
    if bad:
        raise ValueError(f"slots out of range (-1 or 0..{'S-1' if pool_rows is None else pool_rows - 1}): {bad}")
    if len(set(live)) != len(live):
        raise ValueError(f"slots must be distinct (padding uses -1): {slots}")


@dataclass(frozen=True)
class Capture:
    """Prefix snapshot request: `at [N] int32` (tokens consumed before the snapshot; -1 = none) and the buffer
    `buf [N, ...]` that receives, per sequence, the state as it stood after `at[n]` tokens."""

    at: Tensor
    buf: Tensor

    def check(self, num_seqs: int, slot_shape: tuple[int, ...]) -> None:
        if self.at.dtype != torch.int32 or tuple(self.at.shape) != (num_seqs,):
            raise ValueError(f"capture_at must be int32 [{num_seqs}], got {self.at.dtype} {tuple(self.at.shape)}")
        if tuple(self.buf.shape) != (num_seqs, *slot_shape):
            raise ValueError(f"capture buffer must be [{num_seqs}, {', '.join(map(str, slot_shape))}], "
                             f"got {tuple(self.buf.shape)}")

    def check_values(self, lengths: list[int]) -> None:
        at = self.at.tolist()
        bad = [(n, c, L) for n, (c, L) in enumerate(zip(at, lengths)) if c < -1 or c > L]
        if bad:
            raise ValueError(f"capture_at must be -1 or 0..len per sequence; (seq, capture_at, len): {bad}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Arithmetic precision of the references: fp32, or fp64 when the inputs are fp64."""
    return torch.promote_types(dtype, torch.float32)


def check_buffer(name: str, t: Tensor, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
