"""The model-local ONNX functions of the six custom ops, run by ONNX Runtime, against the float64 references.

Each op becomes a one-node model (the `gdn_trt` node + its function), as in an exported graph; the two multi-kernel
ops also as their AOT pass chains (`spec.AOT_CHAINS`: the pass nodes and their functions in one graph, the
intermediates as graph values). Inputs mix a padding sequence (slot -1), a sequence of zero tokens, odd head sizes
with K != V and G = 3, and capture points at 0, inside and at the end; every output, the untouched buffer rows
included, is compared with the reference.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from gdn_trt.export.tolerances import tol
from gdn_trt.plugins.causal_conv1d import naive as conv_naive
from gdn_trt.plugins.causal_conv1d import onnx as conv_onnx
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule import naive as gdn_naive
from gdn_trt.plugins.gated_delta_rule import onnx as gdn_onnx
from gdn_trt.plugins.gated_delta_rule import onnx_passes as gdn_passes
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Capture, Packing
from gdn_trt.plugins.spec import (AOT_CHAINS, CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, GDN_CHUNKED,
                                  GDN_RECURRENT, GDN_RECURRENT_STASH, NAMESPACE, PLUGIN_VERSION, OpSpec)
from .tolerances import assert_close

_ONNX_TYPES = {torch.float32: TensorProto.FLOAT, torch.int32: TensorProto.INT32}


def run_op(spec: OpSpec, fn: onnx.FunctionProto, feeds: dict[str, torch.Tensor], attrs: dict) -> list[np.ndarray]:
    node = helper.make_node(spec.name, list(spec.inputs), list(spec.outputs), domain=NAMESPACE,
                            plugin_namespace=NAMESPACE, plugin_version=PLUGIN_VERSION, **attrs)
    ins = [helper.make_tensor_value_info(n, _ONNX_TYPES[feeds[n].dtype], list(feeds[n].shape)) for n in spec.inputs]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n}_{i}" for i in range(rank)])
            for n, rank in zip(spec.outputs, _ranks(spec, feeds))]
    model = helper.make_model(helper.make_graph([node], spec.name, ins, outs), functions=[fn],
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(NAMESPACE, 1)])
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: feeds[n].numpy() for n in spec.inputs})


def _ranks(spec: OpSpec, feeds: dict) -> list[int]:
    first = feeds["v"].dim() if "v" in feeds else 2
    return [first] + [feeds[i].dim() for _, i in spec.aliases]


CASES = [  # (lengths, slots, capture_at)
    pytest.param([3, 0, 5], [4, -1, 1], [2, -1, 5], id="N3-pad-T8"),
    pytest.param([1], [2], [0], id="N1-T1"),
    pytest.param([0, 7, 1, 2], [0, 3, -1, 5], [0, 7, 1, -1], id="N4-empty-T10"),
]


def _gdn_inputs(T: int) -> GdnInputs:
    H, K, HV, V = 2, 5, 6, 3
    return GdnInputs(torch.randn(T, H, K), torch.randn(T, H, K), torch.randn(T, HV, V), torch.randn(T, HV),
                     torch.randn(T, HV), torch.rand(HV) * 2, torch.randn(HV))


@pytest.mark.parametrize("lengths,slots,capture_at", CASES)
@pytest.mark.parametrize("spec", [GDN_RECURRENT, GDN_RECURRENT_STASH, GDN_CHUNKED], ids=lambda s: s.name)
def test_gdn_function_matches_reference(spec, lengths, slots, capture_at):
    T, S = sum(lengths), 6
    x, pack = _gdn_inputs(T), Packing.build(lengths, slots)
    pool = torch.randn(S, *x.state_shape)
    feeds = {**{k: getattr(x, k) for k in ("q", "k", "v", "a", "b", "A_log", "dt_bias")},
             "cu_seqlens": pack.cu_seqlens, "slots": pack.slots, "ssm_pool": pool}
    fn = gdn_onnx.functions()[gdn_onnx.SPECS.index(spec)]
    x64 = GdnInputs(*(t.double() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)))
    ref_pool = pool.double()
    if spec is GDN_RECURRENT:
        got = run_op(spec, fn, feeds, {})
        refs = [gdn_naive.recurrent(x64, pack, ref_pool), ref_pool]
    elif spec is GDN_RECURRENT_STASH:
        stash = torch.randn(T, *x.state_shape)
        got = run_op(spec, fn, {**feeds, "ssm_stash": stash}, {})
        ref_stash = stash.double()
        refs = [gdn_naive.recurrent_stash(x64, pack, ref_pool, ref_stash), ref_stash]
    else:
        at, cap = torch.tensor(capture_at, dtype=torch.int32), torch.randn(len(lengths), *x.state_shape)
        got = run_op(spec, fn, {**feeds, "capture_at": at, "ssm_capture": cap}, {})
        ref_cap = cap.double()
        refs = [gdn_naive.chunked(x64, pack, ref_pool, Capture(at, ref_cap)), ref_pool, ref_cap]
    for name, ref, g in zip(spec.outputs, refs, got):
        assert_close(f"{spec.name}.{name}", ref, torch.from_numpy(g), tol(torch.float32))


@pytest.mark.parametrize("lengths,slots,capture_at", CASES)
@pytest.mark.parametrize("dilation,activation", [(1, 1), (3, 1), (2, 0)], ids=["d1-silu", "d3-silu", "d2-none"])
@pytest.mark.parametrize("spec", [CONV_UPDATE, CONV_UPDATE_STASH, CONV_PREFILL], ids=lambda s: s.name)
def test_conv_function_matches_reference(spec, dilation, activation, lengths, slots, capture_at):
    T, S, D, W = sum(lengths), 6, 7, 4
    conv = ConvParams(torch.randn(D, W), dilation, activation)
    x, pack = torch.randn(T, D), Packing.build(lengths, slots)
    pool = torch.randn(S, *conv.state_shape())
    feeds = {"x": x, "weight": conv.weight, "cu_seqlens": pack.cu_seqlens, "slots": pack.slots, "conv_pool": pool}
    fn = conv_onnx.functions()[conv_onnx.SPECS.index(spec)]
    attrs = {"dilation": dilation, "activation": activation}
    c64, ref_pool = ConvParams(conv.weight.double(), dilation, activation), pool.double()
    if spec is CONV_UPDATE:
        got = run_op(spec, fn, feeds, attrs)
        refs = [conv_naive.update(x.double(), c64, pack, ref_pool), ref_pool]
    elif spec is CONV_UPDATE_STASH:
        stash = torch.randn(T, *conv.state_shape())
        got = run_op(spec, fn, {**feeds, "conv_stash": stash}, attrs)
        ref_stash = stash.double()
        refs = [conv_naive.update_stash(x.double(), c64, pack, ref_pool, ref_stash), ref_stash]
    else:
        at, cap = torch.tensor(capture_at, dtype=torch.int32), torch.randn(len(lengths), *conv.state_shape())
        got = run_op(spec, fn, {**feeds, "capture_at": at, "conv_capture": cap}, attrs)
        ref_cap = cap.double()
        refs = [conv_naive.prefill(x.double(), c64, pack, ref_pool, Capture(at, ref_cap)), ref_pool, ref_cap]
    for name, ref, g in zip(spec.outputs, refs, got):
        assert_close(f"{spec.name}.{name}", ref, torch.from_numpy(g), tol(torch.float32))


def run_chain(op: OpSpec, feeds: dict[str, torch.Tensor], attrs: dict) -> list[np.ndarray]:
    """The AOT form of `op` (its pass plugins, `spec.AOT_CHAINS`) as one ONNX graph with the passes' function
    bodies, intermediates as graph values; outputs: the op's own (activation, pool, capture)."""
    chain = AOT_CHAINS[op]
    nodes = [helper.make_node(p.name, list(p.inputs), list(p.outputs), domain=NAMESPACE, plugin_namespace=NAMESPACE,
                              plugin_version=PLUGIN_VERSION, **{a: attrs[a] for a in p.attrs}) for p in chain]
    ins = [helper.make_tensor_value_info(n, _ONNX_TYPES[feeds[n].dtype], list(feeds[n].shape)) for n in op.inputs]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n}_{i}" for i in range(feeds[r].dim())])
            for n, r in zip(op.outputs, ("x" if "x" in feeds else "v", *(i for _, i in op.aliases)))]
    fns = {f.name: f for f in (*gdn_passes.functions(), *conv_onnx.pass_functions())}
    model = helper.make_model(helper.make_graph(nodes, op.name, ins, outs), functions=[fns[p.name] for p in chain],
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(NAMESPACE, 1)])
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: feeds[n].numpy() for n in op.inputs})


CHAIN_CASES = CASES + [  # more than one chunk, a capture cut at and off a chunk boundary, T = 300
    pytest.param([70, 3, 0, 130], [1, 0, 2, -1], [64, 2, 0, 7], id="N4-chunks-T203"),
    pytest.param([300], [5], [150], id="N1-T300"),
]


@pytest.mark.parametrize("lengths,slots,capture_at", CHAIN_CASES)
def test_gdn_pass_chain_matches_reference(lengths, slots, capture_at):
    """The chunked op's four pass bodies chained (solve -> w/u -> state -> output) = the op (float64 reference)."""
    T, S = sum(lengths), 6
    x, pack = _gdn_inputs(T), Packing.build(lengths, slots)
    pool, cap = torch.randn(S, *x.state_shape), torch.randn(len(lengths), *x.state_shape)
    at = torch.tensor(capture_at, dtype=torch.int32)
    feeds = {**{k: getattr(x, k) for k in ("q", "k", "v", "a", "b", "A_log", "dt_bias")},
             "cu_seqlens": pack.cu_seqlens, "slots": pack.slots, "ssm_pool": pool, "capture_at": at, "ssm_capture": cap}
    got = run_chain(GDN_CHUNKED, feeds, {"max_seqs": 8})
    x64 = GdnInputs(*(t.double() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)))
    ref_pool, ref_cap = pool.double(), cap.double()
    refs = [gdn_naive.chunked(x64, pack, ref_pool, Capture(at, ref_cap)), ref_pool, ref_cap]
    for name, ref, g in zip(GDN_CHUNKED.outputs, refs, got):
        assert_close(f"chain.{name}", ref, torch.from_numpy(g), tol(torch.float32, "chunked"))
    touched = {s for s, n in zip(slots, lengths) if s >= 0 and n > 0}
    for s in set(range(S)) - touched:
        assert np.array_equal(got[1][s], pool[s].numpy()), f"pool row {s} of no live sequence changed"


@pytest.mark.parametrize("lengths,slots,capture_at", CHAIN_CASES)
@pytest.mark.parametrize("dilation,activation", [(1, 1), (3, 0)], ids=["d1-silu", "d3-none"])
def test_conv_pass_chain_matches_reference(dilation, activation, lengths, slots, capture_at):
    """The conv prefill's two pass bodies chained (chunk -> state, y aliased) = the op."""
    T, S, D, W = sum(lengths), 6, 7, 4
    conv = ConvParams(torch.randn(D, W), dilation, activation)
    x, pack = torch.randn(T, D), Packing.build(lengths, slots)
    pool, cap = torch.randn(S, *conv.state_shape()), torch.randn(len(lengths), *conv.state_shape())
    at = torch.tensor(capture_at, dtype=torch.int32)
    feeds = {"x": x, "weight": conv.weight, "cu_seqlens": pack.cu_seqlens, "slots": pack.slots, "conv_pool": pool,
             "capture_at": at, "conv_capture": cap}
    got = run_chain(CONV_PREFILL, feeds, {"dilation": dilation, "activation": activation, "max_seqs": 8})
    c64, ref_pool, ref_cap = ConvParams(conv.weight.double(), dilation, activation), pool.double(), cap.double()
    refs = [conv_naive.prefill(x.double(), c64, pack, ref_pool, Capture(at, ref_cap)), ref_pool, ref_cap]
    for name, ref, g in zip(CONV_PREFILL.outputs, refs, got):
        assert_close(f"chain.{name}", ref, torch.from_numpy(g), tol(torch.float32))
