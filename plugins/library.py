"""Registers the ops of `spec.py` with torch.library, from the specs themselves.

For each `OpSpec` two operators are defined in namespace `gdn_trt`:
- `<name>_inplace(...)`: writes the aliased buffers (pool / stash / capture) in place and returns the activations.
  CPU runs the reference (`naive.py`), CUDA the Triton kernels (`triton.py`). Eager runs and the runtime use it.
- `<name>(...)`: functional; returns the activations and the updated buffers as new tensors (clone, then the
  in-place kernel). `torch.onnx.export` sees this form; the TensorRT plugin declares the buffer outputs aliased.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Callable, Sequence

import torch
from torch import Tensor

from .spec import NAMESPACE, OpSpec

_LIB = torch.library.Library(NAMESPACE, "DEF")

# (spec, backend module, flat args) -> activations; one per op family, given by its op.py
Adapter = Callable[[OpSpec, ModuleType, Sequence], Tensor]


def _schema(spec: OpSpec, inplace: bool) -> str:
    args = [f"Tensor{'(a' + str(i) + '!)' if inplace and n in spec.mutated_inputs else ''} {n}"
            for i, n in enumerate(spec.inputs)]
    args += [f"int {a}" for a in spec.attrs]
    outs = spec.activations if inplace else spec.outputs
    ret = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    return f"{spec.name}{'_inplace' if inplace else ''}({', '.join(args)}) -> {ret}"


class Backends:
    """CPU -> the reference module; CUDA -> the Triton module, imported on first use with a clear error."""

    def __init__(self, naive: ModuleType, triton_module: str):
        self.naive = naive
        self.triton_module = triton_module
        self._triton: ModuleType | None = None

    def for_device(self, device: torch.device) -> ModuleType:
        if device.type == "cpu":
            return self.naive
        if device.type != "cuda":
            raise RuntimeError(f"gdn_trt ops run on cpu or cuda, not {device.type}")
        if self._triton is None:
            try:
                self._triton = importlib.import_module(self.triton_module)
            except ImportError as e:
                raise RuntimeError(f"CUDA tensors need the Triton kernels ({self.triton_module}): {e}. "
                                   "Install the 'gpu' extra (pip install 'gdn-trt[gpu]').") from e
        return self._triton


def register(spec: OpSpec, backends: Backends, adapter: Adapter, fake: Callable[..., Tensor]) -> None:
    """Define `spec` in both forms. `adapter` maps flat args onto the backend function; `fake(*args)` gives the
    activation output (shape and dtype) for tracing."""
    mutated = [spec.inputs.index(m) for m in spec.mutated_inputs]
    q_inplace, q_func = f"{NAMESPACE}::{spec.name}_inplace", spec.qualified
    _LIB.define(_schema(spec, inplace=True))
    _LIB.define(_schema(spec, inplace=False))

    def inplace(*args):
        return adapter(spec, backends.for_device(args[0].device), args)

    def functional(*args):
        args = list(args)
        for i in mutated:
            args[i] = args[i].clone()
        act = inplace(*args)
        return (act, *(args[i] for i in mutated))

    for key in ("CPU", "CUDA"):
        torch.library.impl(q_inplace, key, lib=_LIB)(inplace)
        torch.library.impl(q_func, key, lib=_LIB)(functional)

    def fake_inplace(*args):
        return fake(*args)

    def fake_functional(*args):
        return (fake(*args), *(torch.empty_like(args[i]) for i in mutated))

    torch.library.register_fake(q_inplace, lib=_LIB)(fake_inplace)
    torch.library.register_fake(q_func, lib=_LIB)(fake_functional)


def op(spec: OpSpec, inplace: bool):
    """The torch operator of a spec (`torch.ops.gdn_trt.<name>[_inplace].default`)."""
    return getattr(torch.ops.gdn_trt, spec.name + ("_inplace" if inplace else "")).default
