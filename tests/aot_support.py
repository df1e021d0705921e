"""The six ops run in their ahead-of-time form, one plugin launch at a time, against the float64 references.

An op's AOT form is its plugin, or its chain of pass plugins (`spec.AOT_CHAINS`), each launched as TensorRT does:
dense tensors, an aliased output at its input's address, intermediates as buffers of the shapes `spec.TENSORS`
declares (NaN-poisoned, as every output), the dimensions a mode's graph leaves free given as `Sym` (so the kernel
selection sees what TensorRT's shape expressions would tell it). `Launch` is how one plugin runs: `interpret_launch`
(Triton's interpreter on the CPU: the wrapper kernels' logic) or, in `tests/test_aot_launch.py`, the CUDA driver
with exactly the PTX, entry, grid, block, shared memory and parameters `aot_kernel` returns. Every output, pool,
stash and capture row is then checked as the JIT kernel tests check them: written rows against the reference,
untouched pool rows bit for bit, unrequested stash / capture rows still NaN, rows of padding sequences zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from gdn_trt.export.tolerances import tol
from gdn_trt.plugins import aot
from gdn_trt.plugins.causal_conv1d import naive as conv_naive
from gdn_trt.plugins.gated_delta_rule import naive as gdn_naive
from gdn_trt.plugins.packing import Capture, Packing
from gdn_trt.plugins.samples import Heads, Step, f64_inputs, make_inputs
from gdn_trt.plugins.spec import (AOT_CHAINS, CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, GDN_CHUNKED,
                                  GDN_RECURRENT, GDN_RECURRENT_STASH, OpSpec, tensor)

from .test_triton_conv import Conv
from .test_triton_conv import assert_pool as assert_conv_pool
from .test_triton_conv import make_inputs as conv_inputs
from .test_triton_gdn import _dead_rows, _live, assert_pool
from .tolerances import assert_close

# one plugin: (spec, shapes, dtypes, attrs, tensors by name) -> None, the outputs written in place
Launch = Callable[[OpSpec, dict, dict, dict, dict], None]
MAX_SEQS = 8  # the graphs' max_seqs attribute


@dataclass(frozen=True)
class Case:
    """One op on one step; `dynamic`: the symbols the mode's graph leaves free (decode fixes T = N = 1, prefill
    N = 1, ...)."""

    op: OpSpec
    step: Step
    dynamic: tuple[str, ...] = ("T", "N", "S")
    attrs: dict = field(default_factory=dict)

    def __str__(self) -> str:
        free = "".join(self.dynamic)
        return f"{self.op.name.split('_', 2)[-1]}-{self.step}-{free}"


def interpret_launch(spec: OpSpec, shapes: dict, dtypes: dict, attrs: dict, tensors: dict) -> None:
    """The plugin's wrapper kernel with the plan `aot_kernel` compiles, run by Triton (the interpreter on CPU)."""
    aot.family(spec)(spec, shapes, dtypes, attrs).launch_jit(tensors)


def bound_io(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each tensor copied into an allocation of its own, as TensorRT binds I/O (256-byte aligned addresses; the AOT
    kernels are compiled for 16-byte aligned pointers). The samples' q, k, v, a, b are contiguous views at odd
    offsets of one buffer: launched as they are, the vectorized loads fault with a misaligned address (H200,
    2026-12-03)."""
    return {n: t.clone(memory_format=torch.contiguous_format) for n, t in tensors.items()}


def run_plugins(op: OpSpec, tensors: dict[str, Tensor], sizes: dict, case: Case, act: torch.dtype,
                launch: Launch) -> None:
    """`op` as its AOT plugins, in order, on `tensors` (inputs by name; outputs and intermediates added)."""
    act_name = str(act).removeprefix("torch.")
    attrs = {**case.attrs, "max_seqs": MAX_SEQS}
    for spec in AOT_CHAINS.get(op, (op,)):
        aliases = dict(spec.aliases)
        for o in spec.outputs:
            if o in aliases:
                tensors[o] = tensors[aliases[o]]
            elif o not in tensors:
                dt = tensor(o)[1]
                shape = tuple(aot.value(d) for d in aot.spec_shapes(spec, sizes, ())[o])
                tensors[o] = torch.full(shape, float("nan"), dtype=act if dt == "act" else getattr(torch, dt),
                                        device=tensors["slots"].device)
        launch(spec, aot.spec_shapes(spec, sizes, case.dynamic), aot.spec_dtypes(spec, act_name),
               {a: attrs[a] for a in spec.attrs}, {n: tensors[n] for n in (*spec.inputs, *spec.outputs)})
    if tensors["slots"].is_cuda:
        torch.cuda.synchronize()


def check_gdn(case: Case, heads: Heads, dtype: torch.dtype, device: str, launch: Launch, pool_rows: int = 8) -> None:
    step = case.step
    x, pack, pool = make_inputs(step, heads, dtype, device, pool_rows)
    T, N = sum(step.lengths), len(step.lengths)
    t = bound_io({n: getattr(x, n) for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")}
                 | dict(cu_seqlens=pack.cu_seqlens, slots=pack.slots, ssm_pool=pool))
    sizes = dict(T=T, N=N, S=pool_rows, H=heads.H, HV=heads.HV, K=heads.K, V=heads.V)
    ref_x, ref_pack, pool_ref = f64_inputs(x), Packing(pack.cu_seqlens.cpu(), pack.slots.cpu()), pool.cpu().double()
    nan = float("nan")
    if case.op is GDN_RECURRENT_STASH:
        t["ssm_stash"] = torch.full((T, *x.state_shape), nan, device=device)
        stash_ref = torch.full((T, *x.state_shape), nan, dtype=torch.float64)
        o_ref = gdn_naive.recurrent_stash(ref_x, ref_pack, pool_ref, stash_ref)
    elif case.op is GDN_CHUNKED:
        at = torch.tensor(step.capture_at, dtype=torch.int32)
        t.update(capture_at=at.to(device), ssm_capture=torch.full((N, *x.state_shape), nan, device=device))
        cap_ref = torch.full((N, *x.state_shape), nan, dtype=torch.float64)
        o_ref = gdn_naive.chunked(ref_x, ref_pack, pool_ref, Capture(at, cap_ref))
    else:
        o_ref = gdn_naive.recurrent(ref_x, ref_pack, pool_ref)
    run_plugins(case.op, t, sizes, case, dtype, launch)
    bound = tol(dtype, "chunked" if case.op is GDN_CHUNKED else "recurrent")
    if case.op is GDN_RECURRENT_STASH:
        written = ~torch.isnan(stash_ref[:, 0, 0, 0])
        got = t["ssm_stash"].cpu()
        assert torch.isnan(got[~written]).all(), "stash rows of skipped sequences were written"
        assert_close("ssm_stash", stash_ref[written], got[written], bound)
        assert torch.equal(t["ssm_pool"], pool), "recurrent_stash wrote the pool"
    else:
        assert_pool(pool, pool_ref, t["ssm_pool"], _live(step), bound)
    if case.op is GDN_CHUNKED:
        for n in range(N):
            if step.capture_at[n] >= 0 and step.slots[n] >= 0:
                assert_close(f"ssm_capture[{n}]", cap_ref[n], t["ssm_capture"][n].cpu(), bound)
            else:
                assert torch.isnan(t["ssm_capture"][n]).all(), f"ssm_capture[{n}] written without a request"
    o = t["o"]
    assert o.dtype == dtype and o.shape == (T, heads.HV, heads.V)
    assert (o[_dead_rows(step)] == 0).all(), "output rows of padding sequences must be zero"
    assert_close("o", o_ref, o.cpu(), bound)


def check_conv(case: Case, conv: Conv, dtype: torch.dtype, device: str, launch: Launch) -> None:
    step = case.step
    x, params, pack, pool = conv_inputs(step, conv, dtype, device)
    T, N, L = sum(step.lengths), len(step.lengths), params.state_len
    t = bound_io(dict(x=x, weight=params.weight, cu_seqlens=pack.cu_seqlens, slots=pack.slots, conv_pool=pool))
    sizes = dict(T=T, N=N, S=pool.shape[0], D=conv.D, W=conv.W, L=L)
    ref_params = type(params)(params.weight.cpu().double(), params.dilation, params.activation)
    ref_pack, pool_ref = Packing(pack.cu_seqlens.cpu(), pack.slots.cpu()), pool.cpu().double()
    nan = float("nan")
    if case.op is CONV_UPDATE_STASH:
        t["conv_stash"] = torch.full((T, L, conv.D), nan, device=device).to(dtype)
        stash_ref = torch.full((T, L, conv.D), nan, dtype=torch.float64)
        y_ref = conv_naive.update_stash(x.cpu().double(), ref_params, ref_pack, pool_ref, stash_ref)
    elif case.op is CONV_PREFILL:
        at = torch.tensor(step.capture_at, dtype=torch.int32)
        t.update(capture_at=at.to(device), conv_capture=torch.full((N, L, conv.D), nan, device=device).to(dtype))
        cap_ref = torch.full((N, L, conv.D), nan, dtype=torch.float64)
        y_ref = conv_naive.prefill(x.cpu().double(), ref_params, ref_pack, pool_ref, Capture(at, cap_ref))
    else:
        y_ref = conv_naive.update(x.cpu().double(), ref_params, ref_pack, pool_ref)
    run_plugins(case.op, t, sizes, case, dtype, launch)
    if case.op is CONV_UPDATE_STASH:
        assert torch.equal(t["conv_pool"], pool), "update_stash wrote the pool"
        assert torch.equal(t["conv_stash"].cpu().double().nan_to_num(7.0), stash_ref.nan_to_num(7.0)), \
            "conv_stash differs from the reference windows (or rows of skipped sequences were written)"
    else:
        assert_conv_pool(pool, pool_ref, t["conv_pool"], step, None)
    if case.op is CONV_PREFILL:
        assert torch.equal(t["conv_capture"].cpu().double().nan_to_num(7.0), cap_ref.nan_to_num(7.0)), \
            "conv_capture differs from the reference windows (or unrequested rows were written)"
    y = t["y"]
    assert y.dtype == dtype and y.shape == (T, conv.D)
    assert (y[_dead_rows(step)] == 0).all(), "output rows of padding sequences must be zero"
    assert_close("y", y_ref, y.cpu(), tol(dtype, "conv"))


def conv_attrs(conv: Conv) -> dict:
    return {"dilation": conv.dilation, "activation": conv.activation}



def run_body(spec: OpSpec, tensors: dict[str, Tensor], attrs: dict, like: dict[str, Tensor]) -> dict[str, Tensor]:
    """The pass plugin `spec`'s ONNX function body, alone in a graph, run by ONNX Runtime on `tensors` (fp32 / int32
    CPU tensors by name; outputs typed like `like`): its outputs by name."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from gdn_trt.plugins.causal_conv1d import onnx as conv_onnx
    from gdn_trt.plugins.gated_delta_rule import onnx_passes
    from gdn_trt.plugins.spec import NAMESPACE, PLUGIN_VERSION

    types = {torch.float32: TensorProto.FLOAT, torch.int32: TensorProto.INT32}
    node = helper.make_node(spec.name, list(spec.inputs), list(spec.outputs), domain=NAMESPACE,
                            plugin_namespace=NAMESPACE, plugin_version=PLUGIN_VERSION, **attrs)
    ins = [helper.make_tensor_value_info(n, types[tensors[n].dtype], list(tensors[n].shape)) for n in spec.inputs]
    outs = [helper.make_tensor_value_info(n, types[like[n].dtype], [f"{n}{i}" for i in range(like[n].dim())])
            for n in spec.outputs]
    fn = {f.name: f for f in (*onnx_passes.functions(), *conv_onnx.pass_functions())}[spec.name]
    model = helper.make_model(helper.make_graph([node], spec.name, ins, outs), functions=[fn],
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(NAMESPACE, 1)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {n: tensors[n].numpy() for n in spec.inputs})
    return {n: torch.from_numpy(g) for n, g in zip(spec.outputs, got)}


def recording(launch: Launch, log: list) -> Launch:
    """`launch` that also appends (spec, attrs, inputs before, outputs after) of each plugin to `log` (CPU clones)."""

    def run(spec: OpSpec, shapes: dict, dtypes: dict, attrs: dict, tensors: dict) -> None:
        before = {n: tensors[n].detach().cpu().clone() for n in spec.inputs}
        launch(spec, shapes, dtypes, attrs, tensors)
        log.append((spec, attrs, before, {n: tensors[n].detach().cpu().clone() for n in spec.outputs}))

    return run


def check_bodies_against_kernels(log: list) -> int:
    """Each recorded pass's ONNX body on the inputs its kernel had, against the kernel's outputs at every element
    the kernel wrote (finite: outputs and intermediates start NaN). Returns the number of elements compared."""
    compared = 0
    for spec, attrs, before, after in log:
        body = run_body(spec, before, attrs, after)
        for o in spec.outputs:
            written = torch.isfinite(after[o])
            assert written.any(), f"{spec.name}: the kernel wrote no element of {o}"
            assert_close(f"{spec.name}.{o}", after[o][written].double(), body[o][written],
                         tol(torch.float32, "chunked"))
            compared += int(written.sum())
    return compared
