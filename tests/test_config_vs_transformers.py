"""The hand-written `config.json` reader (`GdnConfig.from_hf`) against transformers' own config classes, the
authority on what an HF config means: from a config that gives only the sizes, every field gdn-trt reads must take
the value transformers gives it (the defaults of a key a checkpoint leaves out included)."""

from __future__ import annotations

import pytest

from gdn_trt.model.config import GdnConfig

transformers = pytest.importorskip("transformers", reason="the test extra installs transformers")

SIZES = {"hidden_size": 64, "num_hidden_layers": 8, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
         "linear_key_head_dim": 16, "linear_value_head_dim": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16}
TYPES = {"qwen3_next": {"mlp_only_layers": [1]}, "qwen3_5_text": {}, "qwen3_5_moe_text": {},
         "qwen4_exp_text": {"ple_layer_ids": [2, 5], "eos_token_id": 7}}
# GdnConfig field -> the transformers attribute holding it
FIELDS = {"hidden_size": "hidden_size", "layer_types": "layer_types", "linear_num_key_heads": "linear_num_key_heads",
          "linear_num_value_heads": "linear_num_value_heads", "linear_key_head_dim": "linear_key_head_dim",
          "linear_value_head_dim": "linear_value_head_dim", "linear_conv_kernel_dim": "linear_conv_kernel_dim",
          "rms_norm_eps": "rms_norm_eps", "hidden_act": "hidden_act", "vocab_size": "vocab_size"}
QWEN4 = ("hc_count", "hc_lowrank", "ple_conv_kernel_size", "ngram_size", "heads_per_ngram", "ngram_vocab_size_base",
         "make_ngram_vocab_size_divisible_by", "seed")


@pytest.mark.parametrize("model_type", list(TYPES))
def test_from_hf_reads_what_transformers_reads(model_type):
    d = {"model_type": model_type, **SIZES, **TYPES[model_type]}
    try:
        theirs = transformers.AutoConfig.for_model(model_type, **SIZES, **TYPES[model_type])
    except ValueError as e:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}: {e}")
    ours = GdnConfig.from_hf(d)
    fields = dict(FIELDS, **({f: f for f in QWEN4} if model_type.startswith("qwen4") else {}))
    got = {f: getattr(ours, f) for f in fields}
    want = {f: getattr(theirs, a) for f, a in fields.items()}
    # gdn-trt reads which layers are GDN layers; transformers names Qwen4-Exp's others "indexed_attention"
    got["layer_types"], want["layer_types"] = ([t == "linear_attention" for t in x[f]] for x, f in
                                               ((got, "layer_types"), (want, "layer_types")))
    assert got == want
    if ours.dense_mlp_layers:  # dense MLP layers have transformers' intermediate_size
        assert ours.intermediate_size == theirs.intermediate_size
