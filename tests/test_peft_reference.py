"""The hand-written `adapter_config.json` reader against PEFT's own `LoraConfig` and pattern matching, where PEFT is
installed (it is not a dependency: `pip install peft` to run this; docs/architecture.md says why). Every field the
mapping reads, and the rank and alpha each module gets from rank_pattern / alpha_pattern, must be PEFT's."""

from __future__ import annotations

import pytest

from gdn_trt.model.config import preset
from gdn_trt.model.lora import family_targets, sites
from gdn_trt.model.peft import CONFIG, PeftConfig, SyntheticAdapter, make_synthetic_adapter

peft = pytest.importorskip("peft", reason="PEFT is optional (pip install peft): the reference for this check")

SPECS = [SyntheticAdapter(r=4, alpha=8.0),
         SyntheticAdapter(r=8, alpha=4.0, use_rslora=True, rank_pattern=(("out_proj", 2),),
                          alpha_pattern=((r"layers\.2\.linear_attn\.out_proj", 3.0),)),
         SyntheticAdapter(r=4, alpha=16.0, rank_pattern=(("^model.language_model.layers.0.linear_attn.in_proj_z", 6),
                                                         ("in_proj_z", 2)))]


@pytest.mark.parametrize("spec", SPECS, ids=["plain", "patterns", "anchored"])
def test_reader_agrees_with_peft(spec, tmp_path):
    from peft import LoraConfig
    from peft.utils.other import get_pattern_key

    cfg = preset("tiny-3.5")
    root = make_synthetic_adapter(cfg, tmp_path / "a", spec, seed=0)
    ours, theirs = PeftConfig.read(root / CONFIG), LoraConfig.from_pretrained(str(root))
    assert (ours.r, ours.lora_alpha, ours.use_rslora) == (theirs.r, theirs.lora_alpha, theirs.use_rslora)
    assert set(ours.target_modules) == set(theirs.target_modules)
    assert dict(ours.rank_pattern) == theirs.rank_pattern and dict(ours.alpha_pattern) == theirs.alpha_pattern
    for i in cfg.gdn_layer_ids:
        for t in sites(cfg, i):
            if t not in family_targets(cfg):
                continue
            module = f"model.language_model.layers.{i}.{t.module}"
            want_r = theirs.rank_pattern.get(get_pattern_key(theirs.rank_pattern.keys(), module), theirs.r)
            want_a = theirs.alpha_pattern.get(get_pattern_key(theirs.alpha_pattern.keys(), module), theirs.lora_alpha)
            assert (ours.rank(module), ours.alpha(module)) == (want_r, want_a), module
