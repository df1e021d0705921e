"""The launch of a wrapper kernel as data (`KernelPlan`) and the dimension expressions it is written in: the part
of `plugins/aot.py` the op families' `aot.py` modules build on (kept apart so those modules do not import the one
that dispatches to them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_TRITON_TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int32": "i32", "int64": "i64"}


@dataclass(frozen=True)
class Sym:
    """A dynamic dimension with its value: what a TensorRT shape expression is to the kernel selection, with a
    number behind it (tests and the JIT launch of a pass evaluate grids and scalars with it)."""

    value: int

    def __add__(self, other) -> "Sym":
        return Sym(self.value + int(other))

    def __mul__(self, other) -> "Sym":
        return Sym(self.value * int(other))

    def __floordiv__(self, other) -> "Sym":
        return Sym(self.value // int(other))

    def __int__(self) -> int:
        return self.value


def static(d) -> int | None:
    """The value of a dimension the engine fixes, None for a dynamic one."""
    if isinstance(d, int):
        return d
    if isinstance(d, Sym):
        return None
    return d.constant_value() if d.is_constant else None  # a TensorRT ShapeExpr


def cdiv(a, b: int):
    """ceil(a / b) of a dimension expression and a positive int."""
    if isinstance(a, int):
        return -(-a // b)
    if isinstance(a, Sym):
        return Sym(-(-a.value // b))
    import tensorrt.plugin as trtp

    return trtp.cdiv(a, b)


def add(a, b):
    """a + b with the expression on the left (TensorRT's ShapeExpr has no __radd__)."""
    return b + a if isinstance(a, int) and not isinstance(b, int) else a + b


def value(e) -> int:
    """An int or `Sym` expression evaluated."""
    return int(e)


@dataclass(frozen=True)
class KernelPlan:
    """One launch of a wrapper kernel: its runtime parameters' Triton types in order (pointers of the plugin's
    inputs, int32 scalars, pointers of its outputs), constexprs, launch options, grid (3 expressions) and the
    scalars (expressions)."""

    fn: Any  # triton JITFunction
    signature: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    num_stages: int
    grid: tuple
    scalars: tuple = ()

    def launch_jit(self, tensors: dict) -> None:
        """Launch through Triton's JIT on the current stream (a pass plugin's JIT impl); `tensors` by parameter
        name, every dimension of the plan an int."""
        args = [tensors[n] if t.startswith("*") else None for n, t in self.signature]
        scalars = iter(self.scalars)
        args = [a if a is not None else value(next(scalars)) for a in args]
        self.fn[tuple(value(g) for g in self.grid)](*args, **dict(self.constexprs), num_warps=self.num_warps,
                                                    num_stages=self.num_stages)


@dataclass(frozen=True)
class AotKernel:
    """What an `aot_impl` returns: entry name, PTX, launch (grid expressions, threads per block, dynamic shared
    memory) and the int32 scalars (expressions), plus the parameter types in order for the tests."""

    name: str
    ptx: str
    grid: tuple
    block: int
    shared: int
    scalars: tuple
    params: tuple[str, ...]


def triton_type(dtype: str) -> str:
    if dtype not in _TRITON_TYPES:
        raise TypeError(f"gdn_trt AOT kernels take {sorted(_TRITON_TYPES)} tensors, got {dtype}")
    return _TRITON_TYPES[dtype]


def pointer_signature(names: tuple[str, ...], dtypes: dict[str, str]) -> list[tuple[str, str]]:
    return [(n, "*" + triton_type(dtypes[n])) for n in names]
