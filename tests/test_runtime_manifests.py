"""Plan manifests under engines/: indexed by (layers, mode), and a plan built for another config, dtype or layer
set refused by name before anything loads. (These tests read manifests only; no engine is deserialized or run:
that needs TensorRT, see docs/tensorrt.md.)"""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch

from gdn_trt.export.spec import Limits, graph_spec
from gdn_trt.model.config import preset
from gdn_trt.model.modes import LayerMode
from gdn_trt.runtime.backends import trt_context_budget
from gdn_trt.runtime.plans import PlanMismatchError, find_plans, in_place_outputs, planned_context_memory


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
    assert set(plans) == {((i,), m) for i in cfg.gdn_layer_ids
                          for m in (LayerMode.DECODE_MULTI_SEQ, LayerMode.PREFILL_VARLEN)}
    p = plans[((1,), LayerMode.DECODE_MULTI_SEQ)]
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


def test_context_memory_planned_from_the_manifests(tmp_path, caplog):
    """The shared TensorRT context scratch is the largest per-profile size any manifest records; a manifest from
    before the field counts 0 and is named in the log."""
    cfg = preset("tiny-3.5")
    _write(tmp_path, cfg, 0, LayerMode.DECODE, context_memory=[4096, 1 << 20])
    _write(tmp_path, cfg, 0, LayerMode.PREFILL, context_memory=[3 << 20])
    assert planned_context_memory(find_plans(tmp_path, cfg, "float32")) == 3 << 20
    old = _write(tmp_path, cfg, 2, LayerMode.DECODE)
    with caplog.at_level(logging.WARNING, logger="gdn_trt.runtime"):
        assert planned_context_memory(find_plans(tmp_path, cfg, "float32")) == 3 << 20
    assert str(old) in caplog.text and "rebuild" in caplog.text
    assert trt_context_budget("torch", str(tmp_path), torch.device("cuda"), cfg, "float32") == 0
    assert trt_context_budget("auto", str(tmp_path), torch.device("cpu"), cfg, "float32") == 0


class _Engine:
    """An engine's answer to `get_aliased_input_tensor`, as TensorRT >= 10.15 gives it (input name or None)."""

    def __init__(self, answers: dict):
        self.answers = answers

    def get_aliased_input_tensor(self, name):
        return self.answers.get(name)


def test_in_place_only_where_the_engine_confirms_the_alias():
    spec = graph_spec(preset("tiny-3.5"), 0, LayerMode.PREFILL, Limits(), "float32")
    aliases = spec.aliases
    assert len(aliases) >= 2
    first, *rest = sorted(aliases)
    assert in_place_outputs(_Engine(aliases), spec) == frozenset(aliases)
    assert in_place_outputs(_Engine({first: aliases[first]}), spec) == frozenset({first})
    assert in_place_outputs(_Engine({n: "x" for n in aliases}), spec) == frozenset(), "another input: refused"
    assert in_place_outputs(object(), spec) == frozenset(), "TensorRT < 10.15 cannot confirm: nothing in place"
