"""The torch operators: functional and in-place forms agree, fake implementations trace, schemas follow spec.py."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from gdn_trt.plugins import library
from gdn_trt.plugins.spec import OPS, GDN_CHUNKED, CONV_PREFILL

from .test_references import gdn_inputs

F64 = torch.float64


def _gdn_args(spec):
    x = gdn_inputs(9, 2, 3, 4, 5)
    args = [x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, torch.tensor([0, 4, 9], dtype=torch.int32),
            torch.tensor([2, 0], dtype=torch.int32), torch.randn(3, 6, 4, 5, dtype=F64)]
    if spec.name.endswith("stash"):
        args.append(torch.zeros(9, 6, 4, 5, dtype=F64))
    if spec is GDN_CHUNKED:
        args += [torch.tensor([2, -1], dtype=torch.int32), torch.zeros(2, 6, 4, 5, dtype=F64)]
    return args


def _conv_args(spec):
    args = [torch.randn(9, 7, dtype=F64), torch.randn(7, 4, dtype=F64), torch.tensor([0, 4, 9], dtype=torch.int32),
            torch.tensor([2, 0], dtype=torch.int32), torch.randn(3, 6, 7, dtype=F64)]  # pool [S, (W-1)*dil, D]
    if spec.name.endswith("stash"):
        args.append(torch.zeros(9, 6, 7, dtype=F64))
    if spec is CONV_PREFILL:
        args += [torch.tensor([2, -1], dtype=torch.int32), torch.zeros(2, 6, 7, dtype=F64)]
    return args + [2, 1]  # dilation 2, silu


def _args(spec):
    return _gdn_args(spec) if spec.name.startswith("gated") else _conv_args(spec)


@pytest.mark.parametrize("spec", OPS, ids=[o.name for o in OPS])
def test_functional_equals_inplace_and_leaves_inputs(spec):
    args = _args(spec)
    frozen = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    outs = library.op(spec, inplace=False)(*args)
    assert all(torch.equal(a, b) for a, b in zip(args, frozen) if isinstance(a, torch.Tensor)), \
        "the functional form must not write its inputs"
    act = library.op(spec, inplace=True)(*args)
    assert torch.equal(outs[0], act)
    for out_name, in_name in spec.aliases:
        got = outs[spec.outputs.index(out_name)]
        assert torch.equal(got, args[spec.inputs.index(in_name)]), f"{out_name} == in-place {in_name}"


@pytest.mark.parametrize("spec", OPS, ids=[o.name for o in OPS])
def test_fake_shapes_trace(spec):
    real = _args(spec)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in real]
        outs = library.op(spec, inplace=False)(*fake)
        act = library.op(spec, inplace=True)(*fake)
    want = real[2] if spec.name.startswith("gated") else real[0]
    assert tuple(outs[0].shape) == tuple(want.shape) and tuple(act.shape) == tuple(want.shape)
    for out_name, in_name in spec.aliases:
        o = outs[spec.outputs.index(out_name)]
        i = real[spec.inputs.index(in_name)]
        assert tuple(o.shape) == tuple(i.shape) and o.dtype == i.dtype


def test_schemas_follow_the_spec():
    for spec in OPS:
        schema = library.op(spec, inplace=False)._schema
        assert [a.name for a in schema.arguments] == list(spec.inputs) + list(spec.attrs)
        assert len(schema.returns) == len(spec.outputs)
        mutated = [a.name for a in library.op(spec, inplace=True)._schema.arguments
                   if a.alias_info is not None and a.alias_info.is_write]
        assert mutated == list(spec.mutated_inputs)


@pytest.mark.parametrize("folder,names", [("gated_delta_rule", ("recurrent", "recurrent_stash", "chunked")),
                                          ("causal_conv1d", ("update", "update_stash", "prefill"))])
def test_fast_path_has_the_reference_signature(folder, names):
    """triton.py and naive.py expose the same entry points with the same parameters (names, order, annotations)."""
    import importlib
    import inspect

    pytest.importorskip("triton", reason="the Triton kernels need the triton package (in the test extra)")
    naive = importlib.import_module(f"gdn_trt.plugins.{folder}.naive")
    fast = importlib.import_module(f"gdn_trt.plugins.{folder}.triton")
    for name in names:
        assert inspect.signature(getattr(fast, name)) == inspect.signature(getattr(naive, name)), name
