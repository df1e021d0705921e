"""torch ops of the causal conv with state (`torch.ops.gdn_trt.causal_conv1d_*`) and their Python entry points.

Eager runs call the in-place operators (CPU -> `naive.py`, CUDA -> `triton.py`); ONNX export traces the functional
ones (see `plugins/library.py`).
"""

from __future__ import annotations

from types import ModuleType
from typing import Sequence

import torch
from torch import Tensor

from .. import library
from ..packing import Capture, Packing
from ..spec import CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, OpSpec
from . import naive
from .io import ConvParams, dispatch

_BACKENDS = library.Backends(naive, "gdn_trt.plugins.causal_conv1d.triton")


def _adapter(spec: OpSpec, m: ModuleType, args: Sequence) -> Tensor:
    n_in = len(spec.inputs)
    return dispatch(spec, m, dict(zip(spec.inputs, args[:n_in])), dict(zip(spec.attrs, args[n_in:])))


def _fake(x: Tensor, *rest) -> Tensor:
    return torch.empty_like(x)


for _spec in (CONV_UPDATE, CONV_UPDATE_STASH, CONV_PREFILL):
    library.register(_spec, _BACKENDS, _adapter, _fake)


def _call(spec: OpSpec, args: tuple, conv: ConvParams) -> tuple[Tensor, ...]:
    flat = (*args, conv.dilation, conv.activation)
    if torch.compiler.is_exporting():
        return tuple(library.op(spec, inplace=False)(*flat))
    y = library.op(spec, inplace=True)(*flat)
    return (y, *(args[spec.inputs.index(m)] for m in spec.mutated_inputs))


def update(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> tuple[Tensor, Tensor]:
    """Decode modes. x [T, D] -> (y [T, D], conv_pool after the step)."""
    return _call(CONV_UPDATE, (x, conv.weight, pack.cu_seqlens, pack.slots, conv_pool), conv)


def update_stash(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, conv_stash: Tensor
                 ) -> tuple[Tensor, Tensor]:
    """Verify modes: pool read only. Returns (y, conv_stash [T, D, state_len], the window after each token)."""
    return _call(CONV_UPDATE_STASH, (x, conv.weight, pack.cu_seqlens, pack.slots, conv_pool, conv_stash), conv)


def prefill(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, capture: Capture
            ) -> tuple[Tensor, Tensor, Tensor]:
    """Prefill modes. Returns (y, conv_pool after the step, capture buffer)."""
    args = (x, conv.weight, pack.cu_seqlens, pack.slots, conv_pool, capture.at, capture.buf)
    return _call(CONV_PREFILL, args, conv)
