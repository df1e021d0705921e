"""Ahead-of-time kernels of the TensorRT plugins: what each plugin's `@trtp.aot_impl` hands TensorRT.

TensorRT's AOT launcher (`tensorrt.plugin.aot_impl`, TensorRT >= 10.9) takes one compiled kernel per plugin: the PTX,
its `.entry` name, the launch grid / block / dynamic shared memory (ints or symbolic shape expressions) and extra
int32 scalars, and launches it with the parameters (input pointers in plugin-input order, the scalars, output
pointers in plugin-output order), padding every further parameter the PTX declares with null. So each plugin has a
wrapper `@triton.jit` kernel with exactly that order (`gated_delta_rule/aot.py`, `causal_conv1d/aot.py`) that calls
the kernel the JIT entry points launch, with the tensors' strides as constants (TensorRT hands a plugin dense
tensors) and the attributes as constexprs.

`aot_kernel(spec, shapes, dtypes, attrs)` is the one selection both `aot_impl` (`trt_common.register_aot`) and the
tests call: `shapes[name]` holds each dimension as an int when the engine fixes it, as a TensorRT shape expression
(in `aot_impl`) or a `Sym` (tests, the JIT launch of a pass) when it is dynamic; the kernel is compiled for the
static dimensions only, and grid and scalars come back as expressions of the dynamic ones. Checked at compile time
(torch-tensorrt's `_validate_launch_metadata` and TensorRT's launcher): both Triton scratch sizes 0 (Triton >= 3.5
appends a global and a profile scratch pointer to every kernel; TensorRT passes null for them), one CTA per
program, no cooperative or PDL launch, no tensor memory or TMA descriptors, shared memory <= 48 KiB (TensorRT is
not known to opt a kernel in to more; `AOT_SMEM_LIMIT`), and the PTX ISA version no newer than the driver of the
building machine accepts (`ptx_cap`: else the engine fails at run time with CUDA_ERROR_UNSUPPORTED_PTX_VERSION).
Pointers are compiled as 16-byte aligned: TensorRT's I/O bindings must be 256-byte aligned (`setTensorAddress`)
and its own allocations are.
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable

from .spec import OpSpec

AOT_SMEM_LIMIT = 48 * 1024  # bytes of dynamic shared memory a kernel may take without an opt-in
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


def family(spec: OpSpec) -> Callable:
    """The `plan(spec, shapes, dtypes, attrs)` of the op family of `spec`."""
    if spec.name.startswith("gated_delta_rule"):
        from .gated_delta_rule.aot import plan
    else:
        from .causal_conv1d.aot import plan
    return plan


def aot_kernel(spec: OpSpec, shapes: dict, dtypes: dict[str, str], attrs: dict[str, int], target=None) -> AotKernel:
    """The compiled kernel, launch and scalars of plugin `spec` (one of `spec.AOT_PLUGINS`) for tensors of
    `shapes` / `dtypes` (every input and output by name) and int `attrs`. `target`: a Triton GPUTarget; None =
    the current device (the GPU the engine is built on)."""
    p = family(spec)(spec, shapes, dtypes, attrs)
    target = default_target() if target is None else target
    c = compile_plan(p.fn, p.signature, p.constexprs, p.num_warps, p.num_stages, target, ptx_cap())
    return AotKernel(c.name, c.ptx, p.grid, c.num_warps * 32, c.shared, p.scalars, tuple(t for _, t in p.signature))


def default_target():
    """The GPU of this process (Triton's active driver): the one the engine is built on."""
    from triton.runtime import driver

    return driver.active.get_current_target()


@dataclass(frozen=True)
class Compiled:
    name: str
    ptx: str
    num_warps: int
    shared: int


@functools.lru_cache(maxsize=None)
def compile_plan(fn, signature: tuple, constexprs: tuple, num_warps: int, num_stages: int, target,
                 ptx_version: int | None) -> Compiled:
    """`triton.compile` of a wrapper kernel with exactly `signature` (no value specialisation: every scalar stays
    an i32 parameter) and 16-byte aligned pointers, checked against what TensorRT's AOT launcher supports."""
    import triton
    from triton.compiler import ASTSource

    sig = dict(signature)
    sig.update({k: "constexpr" for k, _ in constexprs})
    if [n for n in fn.arg_names if sig.get(n) != "constexpr"] != [n for n, _ in signature]:
        raise TypeError(f"{fn.__name__}: runtime parameters {fn.arg_names} do not follow {signature}")
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in signature if t.startswith("*")}
    options = dict(num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=True)  # fusion: the JIT's default
    if ptx_version is not None:
        options["ptx_version"] = ptx_version
    k = triton.compile(ASTSource(fn, sig, constexprs=dict(constexprs), attrs=attrs), target=target, options=options)
    check_metadata(k.metadata, fn.__name__)
    ptx = k.asm["ptx"]
    if ptx_version is not None and ptx_isa(ptx) > ptx_version:
        raise RuntimeError(f"{fn.__name__}: PTX ISA {ptx_isa(ptx)} above the cap {ptx_version}")
    return Compiled(k.metadata.name, ptx, k.metadata.num_warps, k.metadata.shared)


def check_metadata(md, name: str) -> None:
    """Refuse a compiled kernel that TensorRT's AOT launcher cannot run as Triton would."""
    fields = ("global_scratch_size", "profile_scratch_size", "num_ctas", "launch_cooperative_grid", "launch_pdl",
              "tmem_size", "tensordesc_meta", "shared")
    missing = [f for f in fields if not hasattr(md, f)]
    if missing:
        raise RuntimeError(f"{name}: Triton's metadata has no {missing} (Triton >= 3.5 needed for AOT kernels)")
    bad = {f: getattr(md, f) for f in ("global_scratch_size", "profile_scratch_size", "tmem_size")
           if getattr(md, f)}
    bad.update({f: True for f in ("launch_cooperative_grid", "launch_pdl") if getattr(md, f)})
    if md.num_ctas != 1:
        bad["num_ctas"] = md.num_ctas
    if md.tensordesc_meta:
        bad["tensordesc_meta"] = len(md.tensordesc_meta)
    if md.shared > AOT_SMEM_LIMIT:
        bad["shared"] = md.shared
    if bad:
        raise RuntimeError(f"{name}: not launchable by TensorRT's AOT plugin launcher: {bad} (scratch sizes must be "
                           f"0, one CTA, no cooperative / PDL launch, shared memory <= {AOT_SMEM_LIMIT} B)")


def ptx_isa(ptx: str) -> int:
    """`.version 8.7` -> 87."""
    m = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.M)
    if m is None:
        raise ValueError("no .version line in the PTX")
    return int(m.group(1)) * 10 + int(m.group(2))


def ptx_params(ptx: str, name: str) -> list[str]:
    """The parameter types (`u64`, `u32`, ...) of entry `name`, in order: the ABI TensorRT sizes its argument
    buffer from."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise ValueError(f"no .entry {name} in the PTX")
    return re.findall(r"\.param\s+\.(\w+)", m.group(1))


@functools.lru_cache(maxsize=1)
def ptx_cap() -> int | None:
    """The newest PTX ISA the CUDA driver of this machine loads (None without a driver: no cap)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    v = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(v)) != 0:
        return None
    from triton.backends.nvidia.compiler import ptx_get_version

    return min(ptx_get_version(f"{v.value // 1000}.{(v.value % 1000) // 10}"), _triton_default_isa())


def _triton_default_isa() -> int:
    from triton.backends.nvidia.compiler import get_ptxas, ptx_get_version
    import inspect

    args = (90,) if inspect.signature(get_ptxas).parameters else ()
    return ptx_get_version(get_ptxas(*args).version)


def spec_shapes(spec: OpSpec, sizes: dict[str, int], dynamic: tuple[str, ...] = ("T", "N", "S")) -> dict:
    """Shapes of every tensor of plugin `spec` (`spec.TENSORS`) at `sizes` (symbol -> value), the `dynamic`
    symbols as `Sym`, the others as ints: what TensorRT's shape expressions are for an engine whose profiles leave
    those symbols free."""
    from .spec import CHUNK_TOKENS, tensor

    def dim(s: str):
        if s.isdigit():
            return int(s)
        if s == "C":
            return add(cdiv(dim("T"), CHUNK_TOKENS), dim("N") * 2)
        if s == "N+1":
            return add(dim("N"), 1)
        return Sym(sizes[s]) if s in dynamic else sizes[s]

    return {n: tuple(dim(s) for s in tensor(n)[0]) for n in (*spec.inputs, *spec.outputs)}


def spec_dtypes(spec: OpSpec, act: str) -> dict[str, str]:
    from .spec import tensor

    return {n: act if tensor(n)[1] == "act" else tensor(n)[1] for n in (*spec.inputs, *spec.outputs)}
