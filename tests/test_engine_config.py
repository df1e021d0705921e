"""The engine config (`config.json` beside the plans): computed at export into the manifest, written by the build
(`write_engine_config`, which `gdn-trt build` calls after each plan), read and cross-checked by the runtime before any
plan loads. The values are checked against the tiny presets' numbers written out here, not computed by the code
under test; a config that describes another model, dtype, format or weight placement is refused naming the field."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging

import pytest

from gdn_trt.export.engine_config import CONFIG_NAME, engine_config, write_engine_config
from gdn_trt.export.spec import Limits, graph_spec
from gdn_trt.model.config import preset
from gdn_trt.model.modes import LayerMode
from gdn_trt.runtime.plans import PlanMismatchError, find_plans


def _engines(root, cfg, act="float32", **changes) -> dict:
    """Placeholder plans (never deserialized) of every GDN layer in decode, and the config the build writes."""
    specs = [graph_spec(cfg, i, LayerMode.DECODE, Limits(), act) for i in cfg.gdn_layer_ids]
    for spec in specs:
        d = root / cfg.name / spec.folder
        d.mkdir(parents=True, exist_ok=True)
        raw = f"placeholder {spec.folder}".encode()
        (d / f"{spec.stem}.plan").write_bytes(raw)
        (d / f"{spec.stem}.json").write_text(json.dumps({"config_hash": cfg.config_hash(),
                                                         "graph_spec": spec.to_json(),
                                                         "plan_sha256": hashlib.sha256(raw).hexdigest()}))
    config = {**engine_config(cfg, act, Limits(), specs, True), **changes}
    write_engine_config(config, root / cfg.name, {"tensorrt": "10.x (placeholder)"})
    return json.loads((root / cfg.name / CONFIG_NAME).read_text())


def test_fields_a_loader_needs():
    d = engine_config(preset("tiny-4exp"), "bfloat16", Limits(pool_slots=12),
                      [graph_spec(preset("tiny-4exp"), 1, m, Limits(pool_slots=12), "bfloat16")
                       for m in (LayerMode.DECODE, LayerMode.PREFILL)], True)
    # tiny-4exp: H = 2 key heads of K = 12, HV = 6 value heads of V = 8, conv over [Q | K | V] = 2*24 + 48 = 96
    # channels with a width-4 kernel; hc 4 streams of 32; PLE on layer 1 (one-indexed 2), kernel 4, 4 heads
    assert d["num_linear_attn_layers"] == 3 and d["linear_attn_layer_ids"] == [0, 1, 2]
    assert (d["recurrent_state_num_heads"], d["recurrent_state_key_heads"], d["recurrent_state_key_dim"],
            d["recurrent_state_value_dim"]) == (6, 2, 12, 8)
    assert d["recurrent_state_shape"] == [6, 12, 8] and d["recurrent_state_dtype"] == "float32"
    assert (d["conv_dim"], d["conv_kernel"], d["conv_state_shape"], d["conv_state_dtype"]) == (96, 4, [3, 96],
                                                                                              "bfloat16")
    assert d["ple_layer_ids"] == [1] and d["ple_conv_dim"] == 128 and d["ple_conv_kernel"] == 4
    assert d["stream_dim"] == 128 and d["hc_count"] == 4 and d["activation_dtype"] == "bfloat16"
    assert d["recurrent_spec_verify_mode"] == "stash" and d["weights"] == "inputs" and d["pool_slots"] == 12
    assert d["package"] == "gdn-trt" and d["package_version"] == importlib.metadata.version("gdn-trt")
    assert d["stack_runs"] == [[0], [1], [2]]  # an MoE after every mixer: nothing to stack
    assert d["graphs"] == [{"layers": [1], "modes": ["decode", "prefill"]}]
    json.dumps(d)


def test_written_read_and_cross_checked(tmp_path):
    cfg = preset("tiny-3.5")
    d = _engines(tmp_path, cfg)
    assert d["tensorrt"] == "10.x (placeholder)" and d["model"] == "tiny-3.5"
    assert len(find_plans(tmp_path, cfg, "float32")) == 3
    assert len(find_plans(tmp_path / cfg.name, cfg, "float32")) == 3


@pytest.mark.parametrize("field,value,match", [
    ("conv_kernel", 3, "conv_kernel: config.json has 3, the session's model has 4"),
    ("recurrent_state_num_heads", 5, "recurrent_state_num_heads: config.json has 5, the session's model has 6"),
    ("recurrent_state_dtype", "bfloat16", "recurrent_state_dtype: config.json has 'bfloat16'"),
    ("recurrent_spec_verify_mode", "snapshot", "recurrent_spec_verify_mode: config.json has 'snapshot'"),
    ("linear_attn_layer_ids", [0, 1], r"linear_attn_layer_ids: config.json has \[0, 1\]"),
    ("format_version", 2, "format_version 2; this gdn-trt .* reads version 1"),
    ("weights", "inside", "hold their weights inside"),
])
def test_a_config_that_disagrees_is_refused_by_field(tmp_path, field, value, match):
    cfg = preset("tiny-3.5")
    _engines(tmp_path, cfg, **{field: value})
    with pytest.raises(PlanMismatchError, match=match):
        find_plans(tmp_path, cfg, "float32")


def test_missing_field_and_another_dtype_are_named(tmp_path):
    cfg = preset("tiny-3.5")
    d = _engines(tmp_path, cfg)
    del d["conv_dim"]
    (tmp_path / cfg.name / CONFIG_NAME).write_text(json.dumps(d))
    with pytest.raises(PlanMismatchError, match="conv_dim: config.json has '<missing>', the session's model has 104"):
        find_plans(tmp_path, cfg, "float32")
    _engines(tmp_path / "bf16", cfg, act="bfloat16")
    with pytest.raises(PlanMismatchError, match="activation_dtype: config.json has 'bfloat16'"):
        find_plans(tmp_path / "bf16", cfg, "float32")


def test_another_models_config_or_an_unreadable_one_is_refused(tmp_path):
    _engines(tmp_path, preset("tiny-next"))
    with pytest.raises(PlanMismatchError, match="engine config of model 'tiny-next'"):
        find_plans(tmp_path, preset("tiny-3.5"), "float32")
    _engines(tmp_path / "bad", preset("tiny-3.5"))
    (tmp_path / "bad" / "tiny-3.5" / CONFIG_NAME).write_bytes(b"\xff{not json")
    with pytest.raises(PlanMismatchError, match="unreadable engine config"):
        find_plans(tmp_path / "bad", preset("tiny-3.5"), "float32")


def test_plans_without_a_config_load_with_a_warning(tmp_path, caplog):
    cfg = preset("tiny-3.5")
    _engines(tmp_path, cfg)
    (tmp_path / cfg.name / CONFIG_NAME).unlink()
    with caplog.at_level(logging.WARNING, logger="gdn_trt.runtime"):
        assert len(find_plans(tmp_path, cfg, "float32")) == 3
    assert "no config.json beside the plans" in caplog.text and "skipped as plan manifests" not in caplog.text
