"""`gdn-trt compare` on bf16 and fp16 exports (every real checkpoint is bf16): the graphs run in the dtype they were
exported in, torch runs the layer in that dtype, and each output is held to the `compare:*` bound of that dtype.
ONNX Runtime's CPU provider cannot run a bf16 graph, so ONNX's reference evaluator (`onnxref`) does; it is checked
against ONNX Runtime on the float32 graphs first."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import onnx
import pytest

from gdn_trt.export import cli
from gdn_trt.export.artifacts import Manifest
from gdn_trt.export.compare import CompareOptions, backends_for, compare_graph
from gdn_trt.export.tolerances import TOL
from gdn_trt.model.checkpoint import make_synthetic_checkpoint
from gdn_trt.model.config import preset
from gdn_trt.model.modes import LayerMode

from .test_export import GRAPHS, exported, record  # noqa: F401 (exported: the shared session fixture)

LIMITS = ["--max-seqs", "4", "--max-tokens", "80", "--max-draft", "3", "--pool-slots", "6"]
# (preset, layer, modes): the plain layer and the hc+PLE layer (the one with the largest bf16 differences)
EXPORTS = {"tiny-3.5": (0, "decode_multi_seq,verify_multi,prefill_varlen"),
           "tiny-4exp": (1, "decode_batched,prefill")}


def _export(root, name: str, dtype: str, layer: int, modes: str) -> Manifest:
    cfg = dataclasses.replace(preset(name), dtype=dtype, name=f"{name}-{dtype}")
    ck = make_synthetic_checkpoint(cfg, root / "ck" / cfg.name, seed=0)
    out = root / "onnx" / cfg.name
    assert cli.main(["export", "--checkpoint", str(ck), "--layers", str(layer), "--modes", modes, "--out", str(out),
                     *LIMITS]) == 0
    return Manifest.load(out)


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    return {name: _export(root, name, "bfloat16", *spec) for name, spec in EXPORTS.items()}


def test_bf16_exports_compare_in_bf16(bf16, tmp_path, capsys):
    for name, m in bf16.items():
        out = tmp_path / name
        rc = cli.main(["compare", "--onnx", str(m.root), "--device", "cpu", "--out", str(out)])
        text = capsys.readouterr().out
        assert rc == 0, text
        assert "ONNX's reference evaluator (onnxref) runs the graphs" in text
        doc = json.loads((out / "compare.json").read_text())
        assert doc["passed"] and len(doc["graphs"]) == len(m.graphs)
        for g in doc["graphs"]:
            assert g["dtype"] == "bfloat16" and g["runners"] == ["torch-cpu", "onnxref"]
            bounds = {(r["output"], r["bound_rel_rms"]) for r in g["records"]}
            assert {b for _, b in bounds} <= {TOL[("bfloat16", k)].rel_rms for k in
                                              ("compare:activation", "compare:state", "compare:conv")}
            # the two bf16 evaluations differ (they round at different points) but not by more than the bound
            assert any(r["rel_rms"] > 0 for r in g["records"]) and all(r["passed"] for r in g["records"])


def test_a_bf16_stack_export_compares_in_bf16(tmp_path, capsys):
    """A stack graph (tiny-3.5's run of three GDN layers) in bf16: torch's three layers against the reference
    evaluator, the layers' bf16 weights fed to the `l<i>.` weight inputs, one report for the run."""
    cfg = dataclasses.replace(preset("tiny-3.5"), dtype="bfloat16", name="tiny-3.5-bfloat16")
    ck = make_synthetic_checkpoint(cfg, tmp_path / "ck" / cfg.name, seed=0)
    out = tmp_path / "onnx"
    assert cli.main(["export", "--checkpoint", str(ck), "--stack", "--modes", "decode_multi_seq,prefill_varlen",
                     "--out", str(out), *LIMITS]) == 0
    rc = cli.main(["compare", "--onnx", str(out), "--device", "cpu"])
    text = capsys.readouterr().out
    assert rc == 0 and "layers 0-2 decode_multi_seq: PASS torch-cpu vs onnxref" in text, text
    doc = json.loads((out / "compare" / "compare.json").read_text())
    assert [g["layers"] for g in doc["graphs"]] == [[0, 1, 2]] * 2 and all(g["dtype"] == "bfloat16"
                                                                           for g in doc["graphs"])
    assert doc["passed"] and (out / "compare" / "compare.png").is_file()


def test_a_checkpoint_elsewhere_is_recorded_relative_to_the_manifest(bf16):
    for m in bf16.values():
        rel = m.data["checkpoint"]
        assert rel.startswith("../") and (m.root / rel).resolve() == m.root.parent.parent / "ck" / m.data["model"]


def test_onnxrt_on_a_bf16_export_is_refused_in_one_line(bf16, capsys):
    rc = cli.main(["compare", "--onnx", str(bf16["tiny-3.5"].root), "--backends", "torch,onnxrt", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "--backends torch,onnxref" in err
    assert not (bf16["tiny-3.5"].root / "compare").exists()


def scale_input(path, name: str, factor: float) -> None:
    """Every node reading graph input `name` reads `name * factor` instead (a Mul in the input's dtype): the graph of
    a wrong weight scale, with the weights as graph inputs."""
    model = onnx.load(str(path))
    (inp,) = [v for v in model.graph.input if v.name == name]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
    scaled, n = f"{name}_scaled", 0
    for node in model.graph.node:
        for k, x in enumerate(node.input):
            if x == name:
                node.input[k], n = scaled, n + 1
    assert n >= 1, f"{name} feeds no node"
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(factor, np.float32).astype(dtype),
                                                                f"{name}_factor"))
    model.graph.node.insert(0, onnx.helper.make_node("Mul", [name, f"{name}_factor"], [scaled]))
    onnx.save_model(model, str(path))


def test_a_wrong_bf16_graph_fails(bf16, tmp_path, capsys):
    """out_proj scaled by 1.1 (a 10 % weight error) inside the graph: bf16 rounding must not hide it."""
    import shutil

    src = bf16["tiny-3.5"].root
    dst = tmp_path / "onnx"
    shutil.copytree(src, dst)
    (ck_rel,) = [json.loads((src / "manifest.json").read_text())["checkpoint"]]
    m = json.loads((dst / "manifest.json").read_text())
    m["checkpoint"] = str((src / ck_rel).resolve())  # the copy reads the same checkpoint
    (dst / "manifest.json").write_text(json.dumps(m))
    path = dst / record({"x": Manifest.load(dst)}, "x", LayerMode.DECODE_MULTI_SEQ).path
    scale_input(path, "mixer.out_proj", 1.1)
    rc = cli.main(["compare", "--onnx", str(dst), "--modes", "decode_multi_seq", "--device", "cpu",
                   "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL" in out and "0/1 graphs within tolerance" in out, out


def test_fp16_exports_compare_through_onnx_runtime(tmp_path, capsys):
    m = _export(tmp_path, "tiny-3.5", "float16", 0, "decode,prefill")
    assert backends_for("auto", "float16", False) == ("torch", "onnxrt")
    rc = cli.main(["compare", "--onnx", str(m.root), "--device", "cpu", "--out", str(tmp_path / "cmp")])
    assert rc == 0, capsys.readouterr().out
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert {r["bound_rel_rms"] for g in doc["graphs"] for r in g["records"]} <= {
        TOL[("float16", k)].rel_rms for k in ("compare:activation", "compare:state", "compare:conv")}


@pytest.mark.parametrize("variant,mode", GRAPHS)
def test_the_reference_evaluator_agrees_with_onnx_runtime(exported, variant, mode):
    """onnxref is trusted for bf16 because on the float32 graphs it matches ONNX Runtime within the float32 bound."""
    m, rec = exported[variant], record(exported, variant, mode)
    res = compare_graph(m, rec, None, CompareOptions(("onnxrt", "onnxref")))
    assert res.runners == ["onnxrt", "onnxref"] and res.passed, res.summary()


def test_backends_auto_follow_the_dtype():
    assert backends_for("auto", "float32", False) == ("torch", "onnxrt")
    assert backends_for("auto", "bfloat16", True) == ("torch", "onnxref", "trt")
    with pytest.raises(ValueError, match="unknown backends"):
        backends_for("torch,ort", "float32", False)
