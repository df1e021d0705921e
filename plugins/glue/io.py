"""Parameters and shape checks of the fused glue, shared by the reference, the Triton kernels and the entry points."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class PleNorms:
    """The three per-stream RMSNorm(1 + w) weights of the PLE gate, each [n*C], and their epsilon."""

    key: Tensor
    query: Tensor
    conv: Tensor
    eps: float


def check_rows(name: str, t: Tensor, rows: int, cols: int | None = None) -> None:
    """t is [rows, cols] (cols unchecked when None) with unit stride along its last dim (row strides are free)."""
    if t.dim() != 2 or t.shape[0] != rows or (cols is not None and t.shape[1] != cols):
        raise ValueError(f"{name} must be [{rows}, {cols if cols is not None else 'D'}], got {tuple(t.shape)}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along its last dim, got strides {t.stride()}")


def check_vector(name: str, t: Tensor, n: int) -> None:
    if tuple(t.shape) != (n,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous [{n}] vector, got {tuple(t.shape)}")


def check_same(x: Tensor, *others: Tensor) -> None:
    """One dtype and one device for a kernel's activation operands."""
    for t in others:
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"operands must share dtype and device: {x.dtype} {x.device} vs {t.dtype} {t.device}")
