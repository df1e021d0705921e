"""Bad LoRA adapters are rejected with a message that names the problem: unknown targets, targets of another family,
modules that are not targets, shapes that do not fit, a missing half of a pair, a rank that contradicts the config or
exceeds the slots, unsupported PEFT features; and a failed merge leaves the checkpoint as it was."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from gdn_trt.model.config import preset
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.peft import CONFIG, WEIGHTS, AdapterError, SyntheticAdapter, load_adapter, make_synthetic_adapter
from gdn_trt.model.peft import merge_checkpoint

from .lora_support import checkpoint_with_adapters

L0 = "base_model.model.model.language_model.layers.0."


def _edit_config(**changes):
    def edit(root):
        p = root / CONFIG
        d = json.loads(p.read_text())
        d.update(changes)
        p.write_text(json.dumps(d))
    return edit


def _edit_tensors(fn):
    def edit(root):
        t = load_file(root / WEIGHTS)
        fn(t)
        save_file(t, root / WEIGHTS)
    return edit


def _rename(old: str, new: str):
    return _edit_tensors(lambda t: t.update({k.replace(old, new): t.pop(k) for k in [k for k in t if old in k]}))


CASES = {
    "unknown target": (_edit_config(target_modules=["in_proj_qkv", "foo_proj"]), "unknown target module 'foo_proj'"),
    "target of another family": (_edit_config(target_modules=["in_proj_qkvz"]),
                                 "'in_proj_qkvz' is not a projection of qwen3_5"),
    "tensor of another family": (lambda r: (_edit_config(target_modules=".*")(r),
                                            _rename("in_proj_qkv.", "in_proj_qkvz.")(r)), "has no in_proj_qkvz"),
    "not a target": (_rename("layers.0.linear_attn.in_proj_z.", "layers.0.linear_attn.conv1d."),
                     "not a LoRA target gdn-trt supports"),
    "shape": (_edit_tensors(lambda t: t.update({L0 + "linear_attn.out_proj.lora_A.weight": torch.zeros(4, 7)})),
              r"do not fit .*expected \[r, 72\]"),
    "missing lora_B": (_edit_tensors(lambda t: t.pop(L0 + "mlp.down_proj.lora_B.weight")), "lora_B.weight is missing"),
    "rank vs config": (_edit_config(r=8), "rank 4 in the tensors, 8 in adapter_config.json"),
    "rank_pattern vs tensors": (_edit_config(rank_pattern={"in_proj_a": 2}), "rank 4 in the tensors, 2"),
    "DoRA": (_edit_config(use_dora=True), "DoRA"),
    "bias config": (_edit_config(bias="lora_only"), "bias terms are not supported"),
    "bias tensor": (_edit_tensors(lambda t: t.update({L0 + "linear_attn.out_proj.lora_B.bias": torch.zeros(40)})),
                    "not a lora_A/lora_B weight"),
    "not LoRA": (_edit_config(peft_type="IA3"), "only LORA"),
    "missing r": (lambda r: (r / CONFIG).write_text(json.dumps({"peft_type": "LORA"})),
                  r"missing \['r', 'lora_alpha'\]"),
    "layer out of range": (_rename("layers.0.", "layers.9."), "layer 9 does not exist"),
    "no GDN tensors": (_edit_tensors(lambda t: [t.pop(k) for k in list(t) if "self_attn" not in k]),
                       "no LoRA tensor targets a GDN layer"),
    "no files": (lambda r: (r / WEIGHTS).unlink(), "no adapter_model.safetensors"),
}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapter")
    return make_synthetic_adapter("tiny-3.5", root / "good", SyntheticAdapter(attention=True))


@pytest.mark.parametrize("case", list(CASES))
def test_bad_adapter_rejected(good, tmp_path, case):
    edit, msg = CASES[case]
    root = tmp_path / "bad"
    shutil.copytree(good, root)
    edit(root)
    with pytest.raises(AdapterError, match=msg):
        load_adapter(root, preset("tiny-3.5"))


def test_good_adapter_loads(good):
    ad = load_adapter(good, preset("tiny-3.5"))
    assert len(ad.skipped) == 4 and ad.max_rank == 4 and len(ad.layers) == 3


def test_target_modules_as_suffixes_and_foreign_names(good, tmp_path):
    root = tmp_path / "suffixes"
    shutil.copytree(good, root)
    names = ["linear_attn.in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "mlp.gate_proj", "up_proj",
             "down_proj", "q_proj", "o_proj", "lm_head"]
    _edit_config(target_modules=names)(root)
    assert load_adapter(root, preset("tiny-3.5")).digest() == load_adapter(good, preset("tiny-3.5")).digest()


def test_dense_mlp_tensor_on_a_moe_layer_rejected(tmp_path):
    ad = make_synthetic_adapter("tiny-next-mlp", tmp_path / "a", SyntheticAdapter())
    cfg = preset("tiny-next")  # same shapes, but no dense MLP anywhere: mlp.gate_proj cannot be a MoE tensor
    with pytest.raises(AdapterError, match="layer 1 of tiny-next has no dense MLP"):
        load_adapter(ad, cfg)


def test_rank_over_the_maximum_and_uncovered_targets(good):
    cfg = preset("tiny-3.5")
    ad = load_adapter(good, cfg)
    ad.check_fits(cfg, LoraLimits(max_rank=4))
    with pytest.raises(ValueError, match="rank 4, over the configured maximum max_rank=2"):
        ad.check_fits(cfg, LoraLimits(max_rank=2))
    with pytest.raises(ValueError, match="the adapter slots do not cover"):
        ad.check_fits(cfg, LoraLimits(targets=("in_proj_qkv", "out_proj")))
    with pytest.raises(ValueError, match="mapped onto config"):
        ad.check_fits(preset("tiny-next"), LoraLimits())
    with pytest.raises(ValueError, match="not projections of tiny-3.5"):
        LoraLimits(targets=("in_proj_ba",)).resolve(cfg)
    with pytest.raises(ValueError, match="unknown targets"):
        LoraLimits(targets=("qkv",))


def test_failed_merge_changes_nothing(tmp_path):
    ck, (ad,) = checkpoint_with_adapters("tiny-3.5", tmp_path, [SyntheticAdapter()])
    foreign = load_adapter(make_synthetic_adapter("tiny-4exp", tmp_path / "other"), preset("tiny-4exp"))
    before = [{k: v.clone() for k, v in lw.named_tensors().items()} for lw in ck.layers]
    with pytest.raises(AdapterError, match="mapped onto config"):
        merge_checkpoint(ck, foreign)
    merged = merge_checkpoint(ck, ad)
    with pytest.raises(AdapterError, match="already merged"):
        merge_checkpoint(merged, ad)
    for lw, b in zip(ck.layers, before):
        assert all(torch.equal(v, b[k]) for k, v in lw.named_tensors().items())
