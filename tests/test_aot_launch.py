"""The AOT kernels launched as TensorRT launches them, on the GPU, against the float64 references (no TensorRT).

For every plugin launch of an op's AOT form (`tests/aot_support.py`: the op's plugin or its chain of pass plugins,
intermediates NaN-poisoned, aliased outputs at their inputs' addresses), `aot_kernel` (what the plugin's
`@trtp.aot_impl` returns; `tests/test_trt_plugin_layer.py` checks it is) is compiled on this machine for its GPU with
the PTX ISA capped at its driver, then handed to the CUDA driver API exactly as TensorRT's AOT launcher does:
`cuModuleLoadData` of the PTX text, `cuModuleGetFunction` of the entry name, `cuLaunchKernel` with the grid, block
and dynamic shared memory returned (no opt-in to more than 48 KiB) and the parameters in TensorRT's order (input
pointers, the int32 scalars, output pointers), every further parameter the PTX declares (Triton's two scratch
pointers) padded with null. The driver is called through ctypes on libcuda (its C signatures, no binding layer).
Cases: all six ops, the decode / verify / prefill shapes of each mode (the dimensions a mode's graph fixes are
static to the kernel selection, the others symbolic), T = 1, 3, 65, 300 and a varlen step with an empty and a
padding sequence and captures at 0, inside, at a chunk boundary and at the end, Qwen3-Next's heads and odd ones,
bf16 and fp32; pool rows of no live sequence are checked bit for bit.
"""

from __future__ import annotations

import ctypes
import functools

import pytest
import torch

from gdn_trt.plugins import aot
from gdn_trt.plugins.spec import OpSpec

from .aot_support import (CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, GDN_CHUNKED, GDN_RECURRENT,
                          GDN_RECURRENT_STASH, Case, Conv, Heads, Step, check_conv, check_gdn, conv_attrs)

pytestmark = pytest.mark.gpu

FREE, NO_N = ("T", "N", "S"), ("T", "S")  # multi-sequence modes; prefill / decode_batched (N = 1 fixed)
PREFILL_T = (1, 3, 65, 300)
VARLEN = Step((1, 3, 65, 0, 300, 7), (0, 3, 6, 5, 1, -1), (1, 2, 64, 0, 150, 3))
STEPS = [  # (op family, step, free symbols)
    ("update", Step((1,), (5,)), ("S",)),  # decode: T = N = 1
    ("update", Step((1,) * 5, (3, -1, 0, 6, 2)), FREE),  # decode_multi_seq
    ("stash", Step((3,), (4,)), NO_N),  # decode_batched
    ("stash", Step((3, 0, 2, 1, 4), (1, 2, -1, 5, 0)), FREE),  # verify_multi
    *(("prefill", Step((t,), (3,), (t // 2 if t > 1 else 1,)), NO_N) for t in PREFILL_T),  # prefill
    ("prefill", VARLEN, FREE),  # prefill_varlen
]
DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float32, id="fp32")]
GDN_OPS = {"update": GDN_RECURRENT, "stash": GDN_RECURRENT_STASH, "prefill": GDN_CHUNKED}
CONV_OPS = {"update": CONV_UPDATE, "stash": CONV_UPDATE_STASH, "prefill": CONV_PREFILL}


def _case_id(s) -> str:
    kind, step, free = s
    return f"{kind}-{step}-{''.join(free)}"


class _Driver:
    """The CUDA driver calls TensorRT's AOT launcher makes, on torch's (primary) context and stream."""

    def __init__(self):
        c = ctypes
        self.lib = lib = c.CDLL("libcuda.so.1")
        lib.cuModuleLoadData.argtypes = [c.POINTER(c.c_void_p), c.c_char_p]
        lib.cuModuleGetFunction.argtypes = [c.POINTER(c.c_void_p), c.c_void_p, c.c_char_p]
        lib.cuLaunchKernel.argtypes = [c.c_void_p] + [c.c_uint] * 7 + [c.c_void_p, c.POINTER(c.c_void_p),
                                                                       c.c_void_p]
        lib.cuGetErrorString.argtypes = [c.c_int, c.POINTER(c.c_char_p)]
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # torch's primary context current on this thread
        self.check(lib.cuInit(0), "cuInit")
        dev, ctx = c.c_int(), c.c_void_p()
        self.check(lib.cuDeviceGet(c.byref(dev), torch.cuda.current_device()), "cuDeviceGet")
        self.check(lib.cuDevicePrimaryCtxRetain(c.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"{what} failed: CUresult {rc} ({(msg.value or b'?').decode()})")

    @functools.lru_cache(maxsize=None)
    def function(self, name: str, ptx: str) -> ctypes.c_void_p:
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(mod), ptx.encode() + b"\0"), f"cuModuleLoadData({name})")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"cuModuleGetFunction({name})")
        return fn

    def launch(self, k: aot.AotKernel, args: list) -> None:
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        grid = [aot.value(g) for g in k.grid]
        assert all(g >= 1 for g in grid), f"{k.name}: empty grid {grid}"
        stream = torch.cuda.current_stream().cuda_stream
        self.check(self.lib.cuLaunchKernel(self.function(k.name, k.ptx), *grid, k.block, 1, 1, k.shared, stream,
                                           params, None), f"cuLaunchKernel({k.name}, grid {grid}, block {k.block}, "
                                                          f"shared {k.shared})")


@functools.cache
def _driver() -> _Driver:
    return _Driver()


def cuda_launch(spec: OpSpec, shapes: dict, dtypes: dict, attrs: dict, tensors: dict) -> None:
    """Plugin `spec` as TensorRT's AOT launcher runs it: the kernel `aot_kernel` returns, its parameters in
    TensorRT's order and the ones it was not given null."""
    k = aot.aot_kernel(spec, shapes, dtypes, attrs)
    assert k.shared <= aot.AOT_SMEM_LIMIT
    cap = aot.ptx_cap()
    assert cap is None or aot.ptx_isa(k.ptx) <= cap, "PTX newer than this driver loads"
    declared = aot.ptx_params(k.ptx, k.name)
    n_in, n_out = len(spec.inputs), len(spec.outputs)
    given = ["u64"] * n_in + ["u32"] * len(k.scalars) + ["u64"] * n_out
    assert declared[:len(given)] == given, f"{k.name}: PTX parameters {declared}, TensorRT passes {given}"
    hidden = declared[len(given):]
    assert hidden == ["u64"] * len(hidden) and len(hidden) <= 2, f"{k.name}: hidden parameters {hidden}"
    names = (*spec.inputs, *spec.outputs)
    assert k.params == tuple(["*" + aot.triton_type(dtypes[n]) for n in spec.inputs] + ["i32"] * len(k.scalars)
                             + ["*" + aot.triton_type(dtypes[n]) for n in spec.outputs])
    for n in names:
        t = tensors[n]
        assert t.is_contiguous() and str(t.dtype).removeprefix("torch.") == dtypes[n], n
        assert tuple(t.shape) == tuple(aot.value(d) for d in shapes[n]), (n, tuple(t.shape), shapes[n])
        assert t.data_ptr() % 256 == 0, f"{n}: TensorRT binds I/O at 256-byte aligned addresses"
    args = [ctypes.c_uint64(tensors[n].data_ptr()) for n in spec.inputs]
    args += [ctypes.c_int32(aot.value(s)) for s in k.scalars]
    args += [ctypes.c_uint64(tensors[n].data_ptr()) for n in spec.outputs]
    args += [ctypes.c_uint64(0) for _ in hidden]  # TensorRT pads what it was not given with null
    _driver().launch(k, args)


QWEN3_NEXT, ODD = Heads(16, 2, 128, 128), Heads(3, 2, 32, 48)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [QWEN3_NEXT, ODD], ids=str)
@pytest.mark.parametrize("kind, step, free", STEPS, ids=[_case_id(s) for s in STEPS])
def test_gdn_aot_kernels(kind, step, free, heads, dtype):
    check_gdn(Case(GDN_OPS[kind], step, free), heads, dtype, "cuda", cuda_launch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conv", [Conv(8192), Conv(520, dilation=3), Conv(40, W=3, dilation=2, activation=0)],
                         ids=str)
@pytest.mark.parametrize("kind, step, free", STEPS, ids=[_case_id(s) for s in STEPS])
def test_conv_aot_kernels(kind, step, free, conv, dtype):
    check_conv(Case(CONV_OPS[kind], step, free, conv_attrs(conv)), conv, dtype, "cuda", cuda_launch)
