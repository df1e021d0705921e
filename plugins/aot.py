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
import time
from dataclasses import dataclass
from typing import Callable

from .aot_plan import (AotKernel, KernelPlan, Sym, add, cdiv, pointer_signature, static, triton_type,  # noqa: F401
                       value)
from .spec import OpSpec

AOT_SMEM_LIMIT = 48 * 1024  # bytes of dynamic shared memory a kernel may take without an opt-in


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
    cubin: bytes  # what ptxas made of the PTX here (registers and spills: `triton_aot --aot`)
    seconds: float  # wall time of triton.compile on this machine


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
    t0 = time.perf_counter()
    k = triton.compile(ASTSource(fn, sig, constexprs=dict(constexprs), attrs=attrs), target=target, options=options)
    seconds = time.perf_counter() - t0
    check_metadata(k.metadata, fn.__name__)
    ptx = k.asm["ptx"]
    if ptx_version is not None and ptx_isa(ptx) > ptx_version:
        raise RuntimeError(f"{fn.__name__}: PTX ISA {ptx_isa(ptx)} above the cap {ptx_version}")
    return Compiled(k.metadata.name, ptx, k.metadata.num_warps, k.metadata.shared, k.asm["cubin"], seconds)


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
