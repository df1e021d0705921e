"""`gdn-trt compare` on CPU: every exported graph run by ONNX Runtime (function bodies) against the torch layer,
through Polygraphy's Comparator; the command's results, plot and exit codes; the GraphSpec-aware inputs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
import torch

from gdn_trt.export import cli
from gdn_trt.export.compare import CompareOptions, compare_graph, layers_of, weight_feed
from gdn_trt.export.data import GraphData
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.export.spec import Limits, Role, Variant, graph_spec
from gdn_trt.model.checkpoint import random_layer
from gdn_trt.model.config import preset
from gdn_trt.model.layer import GdnLayer

from .conftest import has_tensorrt
from .test_export import GRAPHS, exported, record  # noqa: F401 (exported: the shared session fixture)


@pytest.fixture(scope="session")
def layers(exported):
    return {v: layers_of(m, "float32") for v, m in exported.items()}


@pytest.mark.parametrize("variant,mode", GRAPHS)
def test_onnxrt_matches_torch(exported, layers, variant, mode):
    m, rec = exported[variant], record(exported, variant, mode)
    res = compare_graph(m, rec, layers[variant], CompareOptions(("torch", "onnxrt")))
    assert res.runners == ["torch-cpu", "onnxrt"]
    assert {(r["iteration"], r["output"]) for r in res.records} == {
        (i, o) for i in range(2) for o in rec.spec.output_names}
    assert res.passed, res.summary() + "\n" + "\n".join(
        f"{r['output']} it{r['iteration']}: {r['rel_rms']:.2e} (bound {r['bound_rel_rms']:.0e})"
        for r in res.records if not r["passed"])


def test_compare_command_writes_json_and_plot(exported, tmp_path, capsys):
    m = exported[Variant.HC_PLE]
    rc = cli.main(["compare", "--onnx", str(m.root), "--modes", "decode,prefill", "--backends",
                   "torch,onnxrt", "--device", "cpu", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "2/2 graphs within tolerance" in out
    summary = json.loads((tmp_path / "compare.json").read_text())
    assert summary["passed"] and [g["mode"] for g in summary["graphs"]] == ["decode", "prefill"]
    detail = summary["graphs"][1]
    assert detail["graph"] == "prefill+hc+ple" and detail["runners"] == ["torch-cpu", "onnxrt"] and detail["records"]
    assert all(r["passed"] for r in detail["records"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.json", "compare.png"]  # one plot per run
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def swap_inputs(path, a: str, b: str) -> None:
    """Rewire every node reading graph input `a` to read `b` and the other way round: a graph that binds two weights
    of one shape to each other's place (the wrong graph of a name mix-up)."""
    model = onnx.load(str(path))
    swap = {a: b, b: a}
    n = 0
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if name in swap:
                node.input[k], n = swap[name], n + 1
    assert n >= 2, f"{a} / {b} feed no node"
    onnx.save_model(model, str(path))


def test_compare_fails_on_a_wrong_graph(exported, tmp_path, capsys):
    """A graph that reads A_log where it should read dt_bias (and back; both [HV]) must fail the comparison and the
    command must exit 1: weights are bound by name, so a mix-up of names is a wrong graph."""
    src = exported[Variant.PLAIN].root
    dst = tmp_path / "onnx"
    shutil.copytree(src, dst)  # the export folder holds its synthetic checkpoint: both move
    swap_inputs(dst / record(exported, Variant.PLAIN, LayerMode.DECODE).path, "mixer.A_log", "mixer.dt_bias")
    rc = cli.main(["compare", "--onnx", str(dst), "--modes", "decode", "--backends", "torch,onnxrt",
                   "--device", "cpu", "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "FAIL" in out and "0/1 graphs within tolerance" in out
    assert not json.loads((tmp_path / "cmp" / "compare.json").read_text())["passed"]


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed: the TensorRT runner is exercised instead")
def test_trt_backend_without_tensorrt_is_an_error(exported, tmp_path, capsys):
    rc = cli.main(["compare", "--onnx", str(exported[Variant.PLAIN].root), "--modes", "decode", "--backends",
                   "torch,trt", "--device", "cpu", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "TensorRT >= 10.8" in err and "docs/tensorrt.md" in err


@pytest.mark.parametrize("mode", list(LayerMode), ids=lambda m: m.value)
@pytest.mark.parametrize("limits", [Limits(), Limits(max_seqs=2, max_tokens=40, max_draft=1, pool_slots=2)],
                         ids=["default", "small"])
def test_inputs_are_valid_packings(mode, limits):
    cfg = preset("tiny-4exp")
    spec = graph_spec(cfg, 1, mode, limits)
    layer = GdnLayer(cfg, random_layer(cfg, 1, torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="no value for weight inputs"):
        GraphData(spec)
    data = GraphData(spec, iterations=3, weights=weight_feed(spec, [layer]))
    seen_padding = seen_empty = False
    for case, feed in zip(data.cases, data):
        cu, slots = feed["cu_seqlens"], feed["slots"]
        assert cu[0] == 0 and np.all(np.diff(cu) >= 0) and cu[-1] == feed["streams"].shape[0] >= 1
        live = slots[slots >= 0]
        assert len(set(live.tolist())) == len(live) and np.all(slots < limits.pool_slots) and np.all(slots >= -1)
        for t in spec.inputs:
            assert feed[t.name].shape == t.shape({**case.sizes(), "S": limits.pool_slots}), t.name
            if t.role is Role.WEIGHT:
                assert np.array_equal(feed[t.name], layer.weights()[t.name].numpy()), t.name
        if mode.spec.writes is Writes.POOLS_CAPTURE:
            assert np.all((feed["capture_at"] >= -1) & (feed["capture_at"] <= np.diff(cu)))
        seen_padding |= bool(np.any(slots == -1))
        seen_empty |= bool(np.any(np.diff(cu) == 0))
    if not mode.spec.single_sequence and limits.max_seqs > 2:
        assert seen_padding, "multi-sequence modes must include a padding sequence (slot -1)"
    if mode in (LayerMode.VERIFY_MULTI, LayerMode.PREFILL_VARLEN) and limits.max_seqs > 2:
        assert seen_empty, "verify / varlen prefill must include a sequence with zero tokens"
    if mode is LayerMode.PREFILL and limits.max_tokens > 64:
        assert {int(c.capture_at[0]) for c in data.cases} == {64, -1, 0}
