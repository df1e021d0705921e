"""Configs and checkpoints: HF config round trips, synthetic -> loaded round trips for the three families, the
Qwen3-Next de-interleave against an interleave built here by hand, sharding and prefixes, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from gdn_trt.model.checkpoint import (deinterleave_ba, deinterleave_qkvz, load_checkpoint, load_table,
                                      make_synthetic_checkpoint, random_layer)
from gdn_trt.model.config import PRESETS, Family, GdnConfig, preset
from gdn_trt.model.ngram import NgramTable


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_round_trips_through_hf_json(name):
    cfg = PRESETS[name]
    again = GdnConfig.from_hf(json.loads(json.dumps(cfg.to_hf())), name=name)
    assert again == cfg and again.config_hash() == cfg.config_hash()


def test_from_hf_reads_the_release_configs():
    """Field values of the released configs (their HF config.json) give the presets' shapes."""
    next80 = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "full_attention_interval": 4,
              "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
              "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6, "hidden_act": "silu",
              "num_experts": 512, "decoder_sparse_step": 1, "mlp_only_layers": [], "intermediate_size": 5120,
              "eos_token_id": 151645, "torch_dtype": "bfloat16"}
    cfg = GdnConfig.from_hf(next80)
    assert cfg.gdn_layer_ids == tuple(i for i in range(48) if (i + 1) % 4)
    assert len(cfg.gdn_layer_ids) == 36 and cfg.dense_mlp_layers == ()
    assert cfg.ssm_state_shape == (32, 128, 128) and cfg.conv_state_shape == (3, 8192)
    assert cfg.config_hash() == preset("qwen3-next-80b-a3b").config_hash()
    q35 = {"model_type": "qwen3_5", "text_config": {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64, "linear_num_key_heads": 16,
        "linear_num_value_heads": 48, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "intermediate_size": 17408, "eos_token_id": 248044, "vocab_size": 248320, "dtype": "bfloat16"}}
    c35 = GdnConfig.from_hf(q35)
    assert c35.family is Family.QWEN3_5 and c35.gva_ratio == 3 and c35.has_mlp(0)
    assert c35.config_hash() == preset("qwen3.5-27b").config_hash()
    q4 = {"model_type": "qwen4_exp", "text_config": {
        "model_type": "qwen4_exp_text", "hidden_size": 2560, "num_hidden_layers": 48, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128, "hc_count": 4,
        "hc_lowrank": 320, "ple_layer_ids": [2], "output_gate_type": "sigmoid", "eos_token_id": [248044],
        "vocab_size": 248320}}
    c4 = GdnConfig.from_hf(q4)
    assert c4.ple_head_dim == 160 and c4.ple_carry == 9 and c4.has_ple(1) and c4.ple_conv_state_shape == (9, 10240)
    assert c4.config_hash() == preset("qwen4-exp").config_hash()


BAD_CONFIGS = [
    pytest.param(dict(linear_num_value_heads=5), "multiple of linear_num_key_heads", id="gva"),
    pytest.param(dict(output_gate_type="relu"), "output_gate_type", id="gate-act"),
    pytest.param(dict(dense_mlp_layers=(7,)), "out of range", id="mlp-layer"),
    pytest.param(dict(ple_layer_ids=(4,)), "GDN", id="ple-on-attention"),
    pytest.param(dict(ple_layer_ids=(0,)), "one-indexed", id="ple-zero-indexed"),
    pytest.param(dict(hc_lowrank=0), "hc_lowrank", id="hc-rank"),
    pytest.param(dict(dtype="int8"), "dtype", id="dtype"),
]


@pytest.mark.parametrize("change,match", BAD_CONFIGS)
def test_bad_configs_are_rejected(change, match):
    with pytest.raises(ValueError, match=match):
        preset("tiny-4exp").replace(**change)


def test_unknown_model_type_and_preset():
    with pytest.raises(ValueError, match="unsupported model_type"):
        GdnConfig.from_hf({"model_type": "llama", "num_hidden_layers": 2})
    with pytest.raises(KeyError, match="known"):
        preset("qwen9")


@pytest.mark.parametrize("name", ["tiny-next", "tiny-next-mlp", "tiny-3.5", "tiny-4exp"])
def test_synthetic_checkpoint_round_trip(tmp_path, name):
    cfg = preset(name)
    make_synthetic_checkpoint(name, tmp_path / "one", seed=7)
    make_synthetic_checkpoint(name, tmp_path / "sharded", seed=7, shards=3)
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    one, sharded = load_checkpoint(tmp_path / "one"), load_checkpoint(tmp_path / "sharded")
    assert one.config == cfg and [lw.index for lw in one.layers] == list(cfg.gdn_layer_ids)
    # the generator is consumed in the writer's order: regenerate the layers and compare tensor by tensor
    gen = torch.Generator().manual_seed(7)
    for lw, lw2 in zip(one.layers, sharded.layers):
        want = random_layer(cfg, lw.index, gen)
        if cfg.has_ple(lw.index):
            t = NgramTable.for_layer(cfg, lw.index)
            torch.randn(t.rows, t.dim, generator=gen)  # the table is drawn after the layer
        for key, w in want.named_tensors().items():
            assert torch.equal(lw.named_tensors()[key], w), f"{name} layer {lw.index} {key}"
            assert torch.equal(lw2.named_tensors()[key], w), f"{name} sharded layer {lw.index} {key}"
    for i, table in one.ple_tables.items():
        assert load_table(table).shape == (NgramTable.for_layer(cfg, i).rows, cfg.ple_head_dim)


def test_qwen3_next_deinterleave_matches_a_hand_built_interleave():
    cfg = preset("tiny-next")  # H=2, HV=4 (G=2), K=16, V=12
    H, G, K, V, C = 2, 2, 16, 12, 5
    # label every row with (part, head, row-in-head) encoded as a number, then interleave by hand
    def block(part: int, head: int, n: int) -> torch.Tensor:
        return torch.tensor([[part * 10000 + head * 100 + r] * C for r in range(n)], dtype=torch.float64)
    rows = []
    for g in range(H):
        rows += [block(0, g, K), block(1, g, K)]
        rows += [block(2, g * G + j, V) for j in range(G)]
        rows += [block(3, g * G + j, V) for j in range(G)]
    qkvz = torch.cat(rows)
    q, k, v, z = deinterleave_qkvz(qkvz, cfg)
    assert torch.equal(q, torch.cat([block(0, h, K) for h in range(H)]))
    assert torch.equal(k, torch.cat([block(1, h, K) for h in range(H)]))
    assert torch.equal(v, torch.cat([block(2, h, V) for h in range(H * G)]))
    assert torch.equal(z, torch.cat([block(3, h, V) for h in range(H * G)]))
    ba = torch.cat([torch.cat([block(4, g * G + j, 1) for j in range(G)] + [block(5, g * G + j, 1) for j in range(G)])
                    for g in range(H)])
    b, a = deinterleave_ba(ba, cfg)
    assert torch.equal(b, torch.cat([block(4, h, 1) for h in range(H * G)]))
    assert torch.equal(a, torch.cat([block(5, h, 1) for h in range(H * G)]))


def test_text_only_prefix_loads(tmp_path):
    """Qwen3.5 text checkpoints without the multimodal wrapper use the plain `model.` prefix."""
    src = make_synthetic_checkpoint("tiny-3.5", tmp_path / "mm", seed=1)
    sd = load_file(src / "model.safetensors")
    dst = tmp_path / "text"
    dst.mkdir()
    save_file({k.replace("model.language_model.", "model."): v for k, v in sd.items()}, dst / "model.safetensors")
    (dst / "config.json").write_text((src / "config.json").read_text())
    a, b = load_checkpoint(src), load_checkpoint(dst)
    for la, lb in zip(a.layers, b.layers):
        assert all(torch.equal(t, lb.named_tensors()[k]) for k, t in la.named_tensors().items())


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(tmp_path)
    root = make_synthetic_checkpoint("tiny-4exp", tmp_path / "c", seed=1)
    sd = load_file(root / "model.safetensors")
    name = "model.language_model.layers.0.linear_attn.out_proj.weight"
    bad = dict(sd)
    bad[name] = bad[name][:, :-1].contiguous()
    save_file(bad, root / "model.safetensors")
    with pytest.raises(ValueError, match="mixer.out_proj"):
        load_checkpoint(root)
    del bad[name]
    save_file(bad, root / "model.safetensors")
    with pytest.raises(KeyError, match="out_proj"):
        load_checkpoint(root)
    bad = dict(sd)
    bad["model.language_model.layers.1.ple.ple_embedding.layer_multipliers"] = torch.tensor([1, 3, 5])
    save_file(bad, root / "model.safetensors")
    with pytest.raises(ValueError, match="layer_multipliers"):
        load_checkpoint(root)
    save_file(sd, root / "model.safetensors")
    table = root / "ple_table.layer1.bin"
    table.write_bytes(table.read_bytes()[:-4])
    with pytest.raises(ValueError, match="bytes"):
        load_checkpoint(root)


def test_ple_table_is_read_in_place_from_hf_shards(tmp_path):
    """Real Qwen4-Exp checkpoints keep the table inside the safetensors as `ngram_embedding.shard_<k>.weight`
    (HF concatenates them on dim 0): it is mapped in place, in numeric shard order, never copied."""
    from gdn_trt.runtime.ple.store import RowStore

    root = make_synthetic_checkpoint("tiny-4exp", tmp_path, seed=1)
    table = load_table(load_checkpoint(root).ple_tables[1]).clone()
    sd = load_file(root / "model.safetensors")
    stem = "model.language_model.layers.1.ple.ple_embedding.ngram_embedding."
    shards = {f"{stem}shard_{k}.weight": p.contiguous() for k, p in enumerate(table.chunk(12))}  # 408 = 12 x 34
    save_file({**sd, **shards}, root / "model.safetensors")
    (root / "ple_tables.json").unlink()
    (root / "ple_table.layer1.bin").unlink()
    t = load_checkpoint(root).ple_tables[1]
    assert len(t.segments) == 12 and (t.rows, t.dim) == tuple(table.shape)
    assert torch.equal(load_table(t), table)
    rows = torch.randint(0, t.rows, (6, 4))
    out = torch.empty(6, 4, t.dim, dtype=table.dtype)
    with RowStore(t, cache_rows=5) as store:
        store.gather(rows.numpy(), out)
        store.gather(rows.numpy(), out)
    assert torch.equal(out, table[rows])
