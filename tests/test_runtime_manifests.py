"""Plan manifests under engines/: indexed by (layer, mode), and a plan built for another config, dtype or layer
set refused by name before anything loads. (These tests read manifests only; no engine is deserialized or run:
that needs TensorRT, see docs/tensorrt.md.)"""

from __future__ import annotations

import hashlib
import json

import pytest

from gdn_trt.export.spec import Limits, graph_spec
from gdn_trt.model.config import preset
from gdn_trt.model.modes import LayerMode
from gdn_trt.runtime.backends import PlanMismatchError, find_plans


def _write(root, cfg, layer, mode, dtype="float32", **extra):
    spec = graph_spec(cfg, layer, mode, Limits(), dtype)
    d = root / f"layer{layer}"
    d.mkdir(parents=True, exist_ok=True)
    raw = b"placeholder bytes: these tests never deserialize a plan"
    (d / f"{spec.stem}.plan").write_bytes(raw)
    m = {"config_hash": cfg.config_hash(), "graph_spec": spec.to_json(), "tensorrt": "10.x",
         "plan_sha256": hashlib.sha256(raw).hexdigest(), **extra}
    (d / f"{spec.stem}.json").write_text(json.dumps(m))
    return d / f"{spec.stem}.json"


def test_plans_indexed_by_layer_and_mode(tmp_path):
    cfg = preset("tiny-4exp")
    for i in cfg.gdn_layer_ids:
        for mode in (LayerMode.DECODE_MULTI_SEQ, LayerMode.PREFILL_VARLEN):
            _write(tmp_path, cfg, i, mode)
    (tmp_path / "export_manifest.json").write_text(json.dumps({"graphs": []}))  # not a plan manifest: skipped
    plans = find_plans(tmp_path, cfg, "float32")
    assert set(plans) == {(i, m) for i in cfg.gdn_layer_ids
                          for m in (LayerMode.DECODE_MULTI_SEQ, LayerMode.PREFILL_VARLEN)}
    p = plans[(1, LayerMode.DECODE_MULTI_SEQ)]
    assert p.plan.name == "decode_multi_seq+hc+ple.plan" and p.versions["tensorrt"] == "10.x"


def test_plan_of_another_config_refused(tmp_path):
    _write(tmp_path, preset("tiny-next"), 0, LayerMode.DECODE)
    with pytest.raises(PlanMismatchError, match="built for config 'tiny-next'.*rebuild"):
        find_plans(tmp_path, preset("tiny-3.5"), "float32")


def test_plan_of_another_dtype_refused(tmp_path):
    _write(tmp_path, preset("tiny-3.5"), 0, LayerMode.DECODE, dtype="bfloat16")
    with pytest.raises(PlanMismatchError, match="bfloat16 activations"):
        find_plans(tmp_path, preset("tiny-3.5"), "float32")


def test_missing_or_empty_plan_refused(tmp_path):
    cfg = preset("tiny-3.5")
    m = _write(tmp_path, cfg, 0, LayerMode.DECODE)
    m.with_suffix(".plan").write_bytes(b"")
    with pytest.raises(PlanMismatchError, match="missing or empty"):
        find_plans(tmp_path, cfg, "float32")


def test_no_manifests_or_no_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="no plan manifests"):
        find_plans(tmp_path, preset("tiny-3.5"), "float32")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_plans(tmp_path / "nope", preset("tiny-3.5"), "float32")
