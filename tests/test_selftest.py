"""The TensorRT selftest (`python -m gdn_trt.app.selftest`) without TensorRT: it exits 2 naming what is missing
and writes nothing; its one-node graphs are valid ONNX that ONNX Runtime runs (the function body) to the float64
reference; its copy arithmetic and nsys table reader. The selftest itself runs on a TensorRT machine only."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
import torch

from gdn_trt.plugins.gated_delta_rule import naive
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Packing
from gdn_trt.plugins.spec import CONV_UPDATE, GDN_RECURRENT, NAMESPACE
from gdn_trt.app import cli, selftest
from gdn_trt.app import selftest_flow as flow
from gdn_trt.export.artifacts import ExportPlan, Manifest, export_checkpoint
from gdn_trt.export.spec import gdn_runs
from gdn_trt.model.config import preset
from gdn_trt.model.modes import LayerMode
from gdn_trt.runtime.session import synthetic
from gdn_trt.export.tolerances import tol

from .conftest import has_tensorrt
from .tolerances import assert_close


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed: the selftest runs instead")
def test_without_tensorrt_it_exits_2_and_says_what_is_missing(tmp_path, capsys):
    assert selftest.main(["--out", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err
    assert "cannot run" in err and "import tensorrt" in err and "pip install" in err
    if not torch.cuda.is_available():
        assert "no CUDA device" in err, "every missing piece is named, not only the first"
    assert not (tmp_path / "st").exists(), "nothing may look measured"
    assert cli.main(["selftest", "--out", str(tmp_path / "st"), "--no-cost"]) == 2


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed: the flow builds for real")
def test_flow_build_stage_without_tensorrt_fails_and_builds_nothing(tmp_path):
    """The flow's build stage on a real export: every graph is tried, TensorRT's absence is a FAIL naming it, and no
    plan or config.json appears (the selftest never reports a build it did not do)."""
    ck = synthetic(preset("tiny-3.5"), 0)[0]
    plan = ExportPlan(modes=(LayerMode.DECODE,), layers="0", limits=flow.EXPORT)
    m = Manifest.load(export_checkpoint(ck, tmp_path / "onnx", plan))
    rep = selftest.Report()
    assert flow._stage(rep, "tiny-3.5: build", lambda: flow._build(m, tmp_path / "engines")) is None
    row = rep.checks["tiny-3.5: build"]
    assert row["ok"] is False and row["plans"] == "0/1" and "import tensorrt" in row["failed"][0]
    assert not (tmp_path / "engines").exists() or not any((tmp_path / "engines").rglob("*.plan"))
    assert not any((tmp_path / "engines").rglob("config.json")) if (tmp_path / "engines").exists() else True


def test_flow_models_exercise_stacks_and_the_table_lists_every_check():
    stacked = [fm for fm in flow.MODELS if fm.stack]
    assert stacked and all(max(len(r) for r in gdn_runs(fm.cfg)) == 3 for fm in stacked)
    assert {fm.cfg.is_hc for fm in stacked} == {False, True}, "a plain and an hc stack"
    assert any(fm.cfg.ple_layer_ids for fm in stacked)
    assert [fm.label for fm in flow.MODELS if fm.aot] == ["tiny-3.5 aot"], "one model in the AOT form"
    rep = selftest.Report()
    rep.add("a: build", True, plans="6/6")
    assert flow._stage(rep, "b: compare", lambda: 1 / 0) is None
    rep.add("c: cost", None, ratio=1.02)
    lines = flow.table(rep.checks).splitlines()
    assert lines[0].split() == ["check", "result", "facts"] and len(lines) == 5
    assert lines[2].split()[:3] == ["a:", "build", "PASS"] and "plans=6/6" in lines[2]
    assert "FAIL" in lines[3] and lines[3].split("FAIL", 1)[1].strip().startswith("error=ZeroDivisionError")
    assert "INFO" in lines[4] and "ratio=1.02" in lines[4]


def test_gdn_one_node_graph_runs_its_function_body_to_the_reference():
    H, K, HV, V, S = 2, 8, 4, 8, 6
    g = torch.Generator().manual_seed(0)
    feeds = {"q": torch.randn(3, H, K, generator=g), "k": torch.randn(3, H, K, generator=g),
             "v": torch.randn(3, HV, V, generator=g), "a": torch.randn(3, HV, generator=g),
             "b": torch.randn(3, HV, generator=g), "A_log": torch.rand(HV, generator=g),
             "dt_bias": torch.randn(HV, generator=g), "cu_seqlens": torch.arange(4, dtype=torch.int32),
             "slots": torch.tensor([4, 0, 2], dtype=torch.int32), "ssm_pool": torch.randn(S, HV, K, V, generator=g)}
    model = selftest.one_op_model(GDN_RECURRENT, feeds, {})
    onnx.checker.check_model(model, full_check=True)
    (node,) = model.graph.node
    assert (node.op_type, node.domain) == (GDN_RECURRENT.name, NAMESPACE)
    assert [list(d.dim_value for d in o.type.tensor_type.shape.dim) for o in model.graph.output] == [
        [3, HV, V], [S, HV, K, V]]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    o, pool = sess.run(None, {n: t.numpy() for n, t in feeds.items()})
    ref_pool = feeds["ssm_pool"].double().clone()
    x = GdnInputs(*(feeds[n].double() for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")))
    ref_o = naive.recurrent(x, Packing(feeds["cu_seqlens"], feeds["slots"]), ref_pool)
    assert_close("o", ref_o, torch.from_numpy(o), tol(torch.float32))
    assert_close("ssm_pool_out", ref_pool, torch.from_numpy(pool), tol(torch.float32))
    untouched = [1, 3, 5]
    assert torch.equal(torch.from_numpy(pool)[untouched], feeds["ssm_pool"][untouched]), "rows of no slot changed"


def test_conv_one_node_graph_carries_int_attributes():
    feeds = {"x": torch.randn(2, 6).bfloat16(), "weight": torch.randn(6, 4).bfloat16(),
             "cu_seqlens": torch.arange(3, dtype=torch.int32), "slots": torch.tensor([1, 0], dtype=torch.int32),
             "conv_pool": torch.randn(3, 6, 6).bfloat16()}
    model = selftest.one_op_model(CONV_UPDATE, feeds, {"dilation": 2, "activation": 1})
    onnx.checker.check_model(model)
    attrs = {a.name: a for a in model.graph.node[0].attribute}
    assert (attrs["dilation"].type, attrs["dilation"].i, attrs["activation"].i) == (onnx.AttributeProto.INT, 2, 1)
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [onnx.TensorProto.BFLOAT16] * 2


def test_copies_per_step_in_pool_copies():
    assert selftest.copies_per_step(in_place_us=180.0, kernel_us=100.0, copy_us=80.0) == 1.0
    assert selftest.copies_per_step(in_place_us=104.0, kernel_us=100.0, copy_us=80.0) == 0.05
    assert selftest.copies_per_step(in_place_us=95.0, kernel_us=100.0, copy_us=80.0) == 0.0


def test_nsys_csv_rows_after_the_preamble():
    text = ("Processing [/tmp/x.sqlite] with [cuda_gpu_mem_size_sum.py]...\n"
            "Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation\n"
            "6815.744,50,136.315,136.315,136.315,136.315,0.000,[CUDA memcpy Device-to-Device]\n")
    assert selftest._csv_rows(text) == [{"Total (MB)": "6815.744", "Count": "50", "Avg (MB)": "136.315",
                                         "Med (MB)": "136.315", "Min (MB)": "136.315", "Max (MB)": "136.315",
                                         "StdDev (MB)": "0.000", "Operation": "[CUDA memcpy Device-to-Device]"}]
    assert selftest._csv_rows("no table\n") == []


def test_the_no_python_child_imports_only_tensorrt_numpy_torch():
    """The AOT check's child process (selftest_aot.CHILD) must not import gdn_trt, or the check proves nothing."""
    import ast

    from gdn_trt.app import selftest_aot

    tree = ast.parse(selftest_aot.CHILD)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"json", "sys", "numpy", "tensorrt", "torch"}
    assert "gdn_trt_modules" in selftest_aot.CHILD and "gdn_trt_creators" in selftest_aot.CHILD
