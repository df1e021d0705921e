"""Compile the Triton launches of an entry point ahead of time for a GPU target, on a machine without a GPU.

`record(module, call)` runs `call()` (an entry point of `module`, on CPU tensors of the real shapes) with every Triton
kernel of `module` (or of several modules) swapped for a recorder, so nothing launches (with `run=True` each launch
runs as it is recorded and can be replayed: `bench/passes.py` times the prefill's passes one by one that way);
`compile_launch(launch)` then compiles one recorded launch with `triton.compile` for `TARGET` (sm_90), specialising
its arguments exactly as Triton's JIT does at a launch (`native_specialize_impl`: dtypes, 16-divisible integers and
pointers, integers equal to 1). What comes back is what the device would compile: registers, spill stack, shared
memory, and the compile time.

Why: shared memory over the limit ("out of resource") and compile blow-ups (IEEE fp32 dots lowered to unrolled
FMA loops) showed up only on the H200 so far, where device time is scarce; both are properties of the compiled
kernel, visible here. The CPU test `tests/test_triton_aot.py` checks the shared-memory limit for the default
tuning; `python -m gdn_trt.plugins.triton_aot` prints the table (measurements in
`bench/results/2026-12-02-aot.md`).
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import triton
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import ASTSource
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

TARGET = GPUTarget("cuda", 90, 32)  # H200 / H100
SMEM_LIMIT = 232448  # bytes of shared memory one block may use on sm_90 (227 KB)


@dataclass(frozen=True)
class Launch:
    fn: JITFunction  # an InterpretedFunction where recorded under the interpreter
    args: dict[str, Any]  # every parameter by name, constexprs included
    num_warps: int
    num_stages: int
    maxnreg: int | None = None  # a launch's register cap per thread (ptxas .maxnreg), where it sets one
    grid: Any = None  # as the launch gave it

    def __call__(self) -> None:
        """Launch it again, as recorded (`record(..., run=True)`: on the device tensors it was recorded with)."""
        self.fn[self.grid](**self.args, num_warps=self.num_warps, num_stages=self.num_stages,
                           **({"maxnreg": self.maxnreg} if self.maxnreg else {}))

    @property
    def name(self) -> str:
        return self.fn.__name__


@dataclass(frozen=True)
class Compiled:
    name: str
    seconds: float  # wall time of triton.compile (ptxas included) on this machine
    registers: int
    spill_stack: int  # bytes of stack per thread: register spills in Triton kernels
    shared: int  # bytes of shared memory per block

    def row(self) -> str:
        return (f"{self.name:26s} compile {self.seconds:6.1f} s  regs {self.registers:3d}  "
                f"stack {self.spill_stack:6d} B  shared {self.shared / 1024:6.1f} KB")


class _Recorder:
    def __init__(self, fn: JITFunction | InterpretedFunction, log: list[Launch], run: bool):
        self.fn, self.log, self.run = fn, log, run

    def __getitem__(self, grid):
        def launch(*args, num_warps: int = 4, num_stages: int = 3, maxnreg: int | None = None, **kwargs):
            defaults = {n: p.default for n, p in inspect.signature(self.fn.fn).parameters.items()
                        if p.default is not inspect.Parameter.empty}
            bound = {**defaults, **dict(zip(self.fn.arg_names, args)), **kwargs}
            missing = [n for n in self.fn.arg_names if n not in bound]
            if missing:
                raise TypeError(f"{self.fn.__name__}: launch without {missing}")
            self.log.append(Launch(self.fn, bound, num_warps, num_stages, maxnreg, grid))
            if self.run:
                self.log[-1]()

        return launch


def record(modules: ModuleType | tuple[ModuleType, ...], call: Callable[[], object], run: bool = False
           ) -> list[Launch]:
    """The launches `call()` makes through the kernels bound in `modules` (their `*_kernel` names: the helpers the
    kernels call stay in place, so a kernel that compiles while recording finds them); none of them run, or (`run`)
    each runs as it is recorded (on the device, or under the interpreter), so later launches see their inputs and a
    recorded launch can be replayed. Gluon kernels (Triton's `JITFunction` too) are recorded alike."""
    log: list[Launch] = []
    saved = [(m, k, v) for m in (modules if isinstance(modules, tuple) else (modules,)) for k, v in vars(m).items()
             if k.endswith("_kernel") and isinstance(v, (JITFunction, InterpretedFunction))]
    try:
        for m, k, v in saved:
            setattr(m, k, _Recorder(v, log, run))
        call()
    finally:
        for m, k, v in saved:
            setattr(m, k, v)
    return log


def _specialize(launch: Launch) -> tuple[dict, dict, dict]:
    from triton.runtime.jit import native_specialize_impl  # Triton's own launch-time specialisation

    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(launch.fn.params):
        v = launch.args[p.name]
        if p.is_constexpr:
            signature[p.name], constexprs[p.name] = "constexpr", v
            continue
        ty, key = native_specialize_impl(BaseBackend, v, False, not p.do_not_specialize, True)
        signature[p.name] = ty
        if ty == "constexpr":  # an integer equal to 1
            constexprs[p.name] = key
        elif key == "D":
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def _cubin_tool(tool: str, cubin: bytes, *args: str) -> str:
    """The output of one of the CUDA binary tools Triton ships (cuobjdump, nvdisasm) run on `cubin`."""
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([path, *args, f.name], capture_output=True, text=True, check=True).stdout


def _resource_usage(cubin: bytes) -> tuple[int, int]:
    out = _cubin_tool("cuobjdump", cubin, "--dump-resource-usage")
    m = re.search(r"REG:(\d+)\s+STACK:(\d+)", out)
    if m is None:
        raise RuntimeError(f"cannot read the resource usage from cuobjdump: {out[-400:]}")
    return int(m.group(1)), int(m.group(2))


def compile_kernel(launch: Launch):
    """The launch compiled for sm_90 (a Triton CompiledKernel: `.asm["ptx"]`, `.asm["cubin"]`, `.metadata`)."""
    signature, constexprs, attrs = _specialize(launch)
    src = ASTSource(launch.fn, signature, constexprs=constexprs, attrs=attrs)
    # fp fusion on: the JIT's default up to Triton 3.9 (the H200 machine runs 3.6); saying so also silences 3.9's
    # warning about the default changing
    options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages, enable_fp_fusion=True)
    if launch.maxnreg:
        options["maxnreg"] = launch.maxnreg
    return triton.compile(src, target=TARGET, options=options)


def sass(launch: Launch) -> str:
    """The launch's sm_90 machine code as nvdisasm prints it."""
    return _cubin_tool("nvdisasm", compile_kernel(launch).asm["cubin"], "-c")


def compile_launch(launch: Launch) -> Compiled:
    t0 = time.perf_counter()
    k = compile_kernel(launch)
    seconds = time.perf_counter() - t0
    regs, stack = _resource_usage(k.asm["cubin"])
    return Compiled(launch.name, seconds, regs, stack, k.metadata.shared)


# ---- the entry points at Qwen3-Next shapes, on CPU tensors (nothing runs: the launches are recorded) ----

def gdn_launches(dtype, heads: tuple[int, int, int, int] = (16, 2, 128, 128), lengths=(1000, 65), **tuning):
    """The chunked (prefill) launches of the gated delta rule for one varlen step, its state pass in both tilings
    (many sequences, single sequence), and the recurrent (decode) launch in both of its tilings."""
    from dataclasses import replace

    import torch

    from .gated_delta_rule import triton as gdn
    from .gated_delta_rule.io import GdnInputs
    from .packing import Capture, Packing

    H, G, K, V = heads
    HV, T, N = H * G, sum(lengths), len(lengths)
    x = GdnInputs(torch.zeros(T, H, K, dtype=dtype), torch.zeros(T, H, K, dtype=dtype),
                  torch.zeros(T, HV, V, dtype=dtype), torch.zeros(T, HV, dtype=dtype),
                  torch.zeros(T, HV, dtype=dtype), torch.zeros(HV), torch.zeros(HV))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    pack = Packing(cu, torch.arange(N, dtype=torch.int32))
    pool = torch.zeros(N, HV, K, V)
    tu = replace(gdn.TUNING, **tuning)
    cap = Capture(torch.full((N,), -1, dtype=torch.int32), torch.zeros(N, HV, K, V))
    launches = record(gdn, lambda: gdn.launch_chunked(x, pack, pool, cap, tu))
    # the state pass in the other tiling too (the number of sequences x value heads picks one: gdn._state_tiling),
    # and the w/u pass where only one tiling runs it (the many-sequence one forms v_new itself: Tuning.state_wy_many)
    single = tu.single_sequence_tiling()
    names = {launch.name for launch in launches}
    launches += [launch for launch in record(gdn, lambda: gdn.launch_chunked(x, pack, pool, cap, single))
                 if (launch.name == "gdn_chunk_state_kernel" and _tiling(launch) not in map(_tiling, launches))
                 or launch.name not in names]
    ones = Packing(torch.arange(N + 1, dtype=torch.int32), pack.slots)
    x1 = GdnInputs(*(t[:N] for t in (x.q, x.k, x.v, x.a, x.b)), x.A_log, x.dt_bias)
    # the recurrent kernel in both tilings: few sequences (these N) and many (`Tuning.rec_few_below` lifted)
    launches += record(gdn, lambda: gdn.launch_recurrent(x1, ones, pool, None, tu))
    launches += record(gdn, lambda: gdn.launch_recurrent(x1, ones, pool, None, replace(tu, rec_few_below=0)))
    return launches


def conv_launches(dtype, dim: int = 8192, width: int = 4, seqs: int = 256, **tuning):
    """The causal conv's decode (`launch_update`, one token per sequence) and prefill (`launch_prefill`, a varlen
    step of 1000 + 65 tokens) launches at Qwen3-Next's conv width (`tuning`: fields of causal_conv1d's Tuning)."""
    from dataclasses import replace

    import torch

    from .causal_conv1d import triton as conv
    from .causal_conv1d.io import ConvParams
    from .packing import Capture, Packing

    params = ConvParams(torch.zeros(dim, width, dtype=dtype), 1, 1)
    pool = torch.zeros(seqs, *params.state_shape(), dtype=dtype)
    ones = Packing(torch.arange(seqs + 1, dtype=torch.int32), torch.arange(seqs, dtype=torch.int32))
    tu = replace(conv.TUNING, **tuning)
    launches = record(conv, lambda: conv.launch_update(torch.zeros(seqs, dim, dtype=dtype), params, ones, pool, None,
                                                       tu))
    pack = Packing(torch.tensor([0, 1000, 1065], dtype=torch.int32), torch.arange(2, dtype=torch.int32))
    cap = Capture(torch.full((2,), -1, dtype=torch.int32), torch.zeros(2, *params.state_shape(), dtype=dtype))
    x = torch.zeros(1065, dim, dtype=dtype)
    return launches + record(conv, lambda: conv.launch_prefill(x, params, pack, pool, cap, tu))


def aot_table(heads: tuple[int, int, int, int], dtypes: list[str]) -> None:
    """Every AOT plugin's kernel as `aot_impl` compiles it for sm_90 (N free, and fixed at 1 where that changes
    the kernel), with the GDN conv (D 8192, W 4, SiLU): registers, spill stack, shared memory, compile time."""
    from . import aot
    from .spec import AOT_PLUGINS

    H, G, K, V = heads
    print(f"Triton {triton.__version__}, target sm_{TARGET.arch}, AOT kernels, heads (H, G, K, V) = {heads}")
    for act in dtypes:
        for free in (("T", "N", "S"), ("T", "S")):
            sizes = dict(T=1065, N=2 if "N" in free else 1, S=8, H=H, HV=H * G, K=K, V=V, D=8192, W=4, L=3)
            for spec in AOT_PLUGINS:
                attrs = {"dilation": 1, "activation": 1, "max_seqs": 64}
                k = aot.family(spec)(spec, aot.spec_shapes(spec, sizes, free), aot.spec_dtypes(spec, act),
                                     {a: attrs[a] for a in spec.attrs})
                c = aot.compile_plan(k.fn, k.signature, k.constexprs, k.num_warps, k.num_stages, TARGET, None)
                regs, stack = _resource_usage(c.cubin)
                n = "N free" if "N" in free else "N = 1"
                print(f"{act:8s} {n:6s} {c.name:24s} warps {c.num_warps}  compile {c.seconds:5.1f} s  regs {regs:3d}"
                      f"  stack {stack:5d} B  shared {c.shared / 1024:5.1f} KB", flush=True)


def _tiling(launch: Launch) -> tuple[str, int, int]:
    return launch.name, launch.args.get("BV", 0), launch.num_stages


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", default="16,2,128,128", help="H,G,K,V")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a field of gated_delta_rule.triton.Tuning (repeatable)")
    ap.add_argument("--aot", action="store_true", help="the AOT plugins' kernels (plugins/aot.py) instead")
    args = ap.parse_args()
    if args.aot:
        return aot_table(tuple(int(v) for v in args.heads.split(",")), args.dtypes.split(","))
    tuning = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        tuning[k] = int(v) if v.isdigit() else {"True": True, "False": False}.get(v, v)
    heads = tuple(int(v) for v in args.heads.split(","))
    print(f"Triton {triton.__version__}, target sm_{TARGET.arch}, heads (H, G, K, V) = {heads}, tuning {tuning}")
    for name in args.dtypes.split(","):
        for launch in gdn_launches(getattr(torch, name), heads, **tuning) + conv_launches(getattr(torch, name)):
            print(f"{name:8s} " + compile_launch(launch).row(), flush=True)


if __name__ == "__main__":
    main()
