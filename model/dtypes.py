"""Dtype names, the one table: configs, checkpoints, GraphSpecs, manifests and snapshots store a dtype by its torch
name without the `torch.` prefix (`"bfloat16"`); this maps the names to torch dtypes and back."""

from __future__ import annotations

import torch


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16"."""
    return str(dtype).replace("torch.", "")


DTYPES: dict[str, torch.dtype] = {dtype_name(d): d for d in (torch.float32, torch.bfloat16, torch.float16,
                                                              torch.float64, torch.int32, torch.int64)}
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")  # what layers compute in and PLE tables hold
