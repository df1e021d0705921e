"""Output that reads right: `compare` writes one JSON and one plot per run beside the export unless told otherwise, and
says which output came closest to its bound in words; the `make run` report calls a TensorRT build that could not
run "skipped", not "ok"; a session's stats table prints each CUDA-graph veto reason once."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gdn_trt.app import main as app_main
from gdn_trt.export import cli
from gdn_trt.export.compare import share_words
from gdn_trt.export.spec import Variant
from gdn_trt.model.checkpoint import make_synthetic_checkpoint
from gdn_trt.runtime import Session

from .conftest import has_tensorrt
from .test_export import exported  # noqa: F401 (exported: the shared session fixture)


def test_compare_writes_beside_the_export_and_names_the_closest_output(exported, capsys):
    m = exported[Variant.PLAIN]
    assert cli.main(["compare", "--onnx", str(m.root), "--modes", "decode,prefill", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (m.root / "compare").iterdir()) == ["compare.json", "compare.png"]
    lines = [ln for ln in out.splitlines() if ln.startswith("layer 0 ")]
    assert len(lines) == 2
    for ln in lines:
        assert re.search(r"PASS torch-cpu vs onnxrt, 2 iterations; closest to its bound: \w+ at "
                         r"(\d+% of its bound|under 1% of its bound|exact \(no difference\)) "
                         r"\(relative RMS error", ln), ln
    doc = json.loads((m.root / "compare" / "compare.json").read_text())
    assert re.match(r"closest to its bound: layer 0 (decode|prefill) \w+ at ", out.splitlines()[-2])
    assert doc["closest"]["graph"] in ("layer 0 decode", "layer 0 prefill")
    assert "relative RMS against torch" in out


def test_share_words():
    assert share_words(0.0, 1e-5) == "exact (no difference)"
    assert share_words(3e-7, 1e-5) == "3% of its bound"
    assert share_words(1e-9, 1e-5) == "under 1% of its bound"
    assert share_words(2.4e-5, 1e-5) == "240% of its bound"
    assert share_words(3e-3, 1e-5) == "300x its bound"


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed: the build stage runs")
def test_a_build_without_tensorrt_is_reported_as_skipped(tmp_path, capsys):
    ck = make_synthetic_checkpoint("tiny-3.5", tmp_path / "ck" / "tiny-3.5", seed=0)
    stage, engines = app_main.build_plans(ck, tmp_path)
    assert engines is None and stage.skipped and stage.ok and stage.result == "skipped"
    assert "TensorRT is not installed" in stage.detail
    app_main._summary([stage], 0.0)
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "build TensorRT engines" in ln)
    assert " skipped " in row and " ok " not in row
    assert not (tmp_path / "engines").exists()


def test_each_veto_reason_is_printed_once():
    sess = Session.open("tiny-3.5", device="cpu", max_seqs=4)
    c = sess.cfg.hidden_size
    a, b = sess.add_sequence(), sess.add_sequence()
    sess.prefill(a, torch.randn(9, c))
    sess.prefill(b, torch.randn(5, c))
    sess.decode({a: torch.randn(1, c), b: torch.randn(1, c)})
    sess.verify({a: torch.randn(3, c)})
    table = sess.stats().table()
    vetoes = [ln for ln in table.splitlines() if ln.startswith("eager, not a CUDA graph:")]
    assert len(vetoes) == 1, table
    assert "CUDA graphs need a CUDA device" in vetoes[0] and "prefill 2, decode 1, verify 1 steps" in vetoes[0]
    assert table.count("CUDA graphs need a CUDA device") == 1
