"""What a tensor-parallel rank holds, in one process: its weights read from the checkpoint files equal what vLLM's
loaders put on that rank (their rules written out here from vLLM's `GatedDeltaNetAttention`,
`MergedColumnParallelLinear`, `RowParallelLinear`, `mamba_v2_sharded_weight_loader` and `sharded_weight_loader`,
applied to the raw HF tensors), the sharded tensors are read as slices, never whole, its adapters are cut as the
parallel LoRA layers cut them and merge like the whole model's, and every size or rank that does not fit is refused
with the valid sizes named, before anything is read or run."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import Family, GdnConfig, Shard, preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import LoraLimits, LoraTarget, merge_layer, shard_adapter
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.peft import SyntheticAdapter, load_adapter, make_synthetic_adapter
from gdn_trt.model.state import BufferSpec, LayerState, StepInput
from gdn_trt.model.tp import TpError, full_config, shard_config, shard_layer, valid_sizes
from gdn_trt.plugins.packing import Packing

from .lora_support import hf_tensor

F64 = torch.float64
TP_PRESETS = ["tiny-next-tp", "tiny-3.5-tp", "tiny-4exp-tp"]
RANKS = [pytest.param(p, n, r, id=f"{p}-tp{n}-rank{r}") for p in TP_PRESETS for n in (2, 4) for r in range(n)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-layout")
    out = {}
    for p in TP_PRESETS:
        make_synthetic_checkpoint(p, root / p / "ckpt", seed=7, shards=2)
        make_synthetic_adapter(p, root / p / "adapter", SyntheticAdapter(r=3, alpha=6.0), seed=8)
        out[p] = root / p
    return out


def _hf(folder) -> dict[str, torch.Tensor]:
    ts = {}
    for f in sorted((folder / "ckpt").glob("*.safetensors")):
        ts.update({k.removeprefix("model.language_model.").removeprefix("model."): v for k, v in load_file(f).items()})
    return ts


# ---- vLLM's loading rules, written out ----
def _column(w: torch.Tensor, n: int, r: int) -> torch.Tensor:
    """ColumnParallelLinear / one output of MergedColumnParallelLinear: narrow(0, r * rows/n, rows/n)."""
    k = w.shape[0] // n
    return w[r * k:(r + 1) * k]


def _row(w: torch.Tensor, n: int, r: int) -> torch.Tensor:
    """RowParallelLinear: narrow(1, r * cols/n, cols/n)."""
    k = w.shape[1] // n
    return w[:, r * k:(r + 1) * k]


def _mamba_v2(w: torch.Tensor, spec: list[int], n: int, r: int) -> torch.Tensor:
    """mamba_v2_sharded_weight_loader with (full_dim, extra 0, duplicate_groups False) per block."""
    out, loaded = [], 0
    for full in spec:
        k = full // n
        out.append(w[loaded + r * k:loaded + (r + 1) * k])
        loaded += full
    return torch.cat(out)


def _vllm_qkvzba(cfg: GdnConfig, hf: dict, la: str, n: int, r: int) -> list[torch.Tensor]:
    """The rank's q, k, v, z, b, a rows after vLLM's load and (Qwen3-Next) its fix_query_key_value_ordering."""
    H, K, V, G = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.gva_ratio
    if cfg.family is Family.QWEN3_NEXT:  # one output each: the rank's rows of the interleaved tensors
        qkvz = _column(hf[la + "in_proj_qkvz.weight"], n, r)
        ba = _column(hf[la + "in_proj_ba.weight"], n, r)
        q, k, v, z = qkvz.reshape(H // n, 2 * K + 2 * G * V, -1).split([K, K, G * V, G * V], dim=1)
        b, a = ba.reshape(H // n, 2 * G, -1).split([G, G], dim=1)
        return [t.reshape(-1, qkvz.shape[-1]) for t in (q, k, v, z, b, a)]
    q, k, v = hf[la + "in_proj_qkv.weight"].split([cfg.key_dim, cfg.key_dim, cfg.value_dim])  # shard ids 0, 1, 2
    return [_column(t, n, r) for t in (q, k, v, hf[la + "in_proj_z.weight"], hf[la + "in_proj_b.weight"],
                                       hf[la + "in_proj_a.weight"])]


@pytest.mark.parametrize("name,size,rank", RANKS)
def test_rank_weights_equal_vllm_loading(folders, name, size, rank):
    hf, cfg = _hf(folders[name]), preset(name)
    ck = load_checkpoint(folders[name] / "ckpt", Shard(size, rank))
    assert ck.config == shard_config(cfg, Shard(size, rank)) and ck.config.tp_size == size
    for lw in ck.layers:
        p = f"layers.{lw.index}."
        la = p + "linear_attn."
        m = lw.mixer
        assert torch.equal(m.in_proj, torch.cat(_vllm_qkvzba(cfg, hf, la, size, rank)))
        conv = _mamba_v2(hf[la + "conv1d.weight"], [cfg.key_dim, cfg.key_dim, cfg.value_dim], size, rank)
        assert torch.equal(m.conv, conv.squeeze(1))
        for part in ("A_log", "dt_bias"):
            assert torch.equal(getattr(m, part), _column(hf[la + part], size, rank))  # sharded_weight_loader(0)
        assert torch.equal(m.norm, hf[la + "norm.weight"])  # RMSNormGated(head_v_dim): replicated
        assert torch.equal(m.out_proj, _row(hf[la + "out_proj.weight"], size, rank))
        if lw.mlp is not None:  # gate_up_proj: MergedColumnParallelLinear([I, I]); down_proj: row-parallel
            gate_up = torch.cat([_column(hf[p + "mlp.gate_proj.weight"], size, rank),
                                 _column(hf[p + "mlp.up_proj.weight"], size, rank)])
            assert torch.equal(lw.mlp.gate_up, gate_up)
            assert torch.equal(lw.mlp.down, _row(hf[p + "mlp.down_proj.weight"], size, rank))
        whole = next(w for w in load_checkpoint(folders[name] / "ckpt").layers if w.index == lw.index)
        replicated = {k: v for k, v in whole.named_tensors().items() if not k.startswith(("mixer.", "mlp."))}
        assert replicated and all(torch.equal(lw.named_tensors()[k], v) for k, v in replicated.items())
        shard = shard_layer(cfg, whole, Shard(size, rank)).named_tensors()  # the in-memory cut reads the same
        assert all(torch.equal(v, shard[k]) for k, v in lw.named_tensors().items())


@pytest.mark.parametrize("name,size,rank", RANKS)
def test_rank_adapter_is_cut_as_the_parallel_lora_layers_cut_it(folders, name, size, rank):
    cfg = preset(name)
    ad = load_adapter(folders[name] / "adapter", cfg)
    mine = shard_adapter(ad, cfg, Shard(size, rank))
    rank_cfg = shard_config(cfg, Shard(size, rank))
    mine.check_fits(rank_cfg, LoraLimits(2, 4))
    with pytest.raises(ValueError, match="mapped onto config"):
        mine.check_fits(cfg, LoraLimits(2, 4))
    f = folders[name] / "adapter" / "adapter_model.safetensors"
    for i, targets in mine.layers.items():
        for t, w in targets.items():
            stem = f"layers.{i}.{t.module}"
            A, B = hf_tensor(f, stem + ".lora_A.weight"), hf_tensor(f, stem + ".lora_B.weight")
            if t in (LoraTarget.OUT_PROJ, LoraTarget.DOWN_PROJ):  # row-parallel: A by input columns, B whole
                assert torch.equal(w.a, _row(A, size, rank)) and torch.equal(w.b, B)
                continue
            assert torch.equal(w.a, A)  # column-parallel: A whole, B the rank's output rows
            if t is LoraTarget.IN_PROJ_QKVZ:  # the rank's interleaved rows, de-interleaved as the weight's
                H, K, V, G = (cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                              cfg.gva_ratio)
                parts = _column(B, size, rank).reshape(H // size, 2 * K + 2 * G * V, -1).split([K, K, G * V, G * V], 1)
                want = torch.cat([x.reshape(-1, B.shape[1]) for x in parts])
            elif t is LoraTarget.IN_PROJ_BA:
                G = cfg.gva_ratio
                parts = _column(B, size, rank).reshape(-1, 2 * G, B.shape[1]).split([G, G], 1)
                want = torch.cat([x.reshape(-1, B.shape[1]) for x in parts])
            elif t is LoraTarget.IN_PROJ_QKV:
                want = torch.cat([_column(x, size, rank) for x in B.split([cfg.key_dim, cfg.key_dim, cfg.value_dim])])
            else:
                want = _column(B, size, rank)
            assert torch.equal(w.b, want), f"layer {i} {t.value}"


@pytest.mark.parametrize("name,size,rank", RANKS[::3])
def test_merging_a_rank_adapter_equals_the_rank_of_the_merged_layer(folders, name, size, rank):
    cfg, shard = preset(name), Shard(size, rank)
    ad = load_adapter(folders[name] / "adapter", cfg)
    for lw in load_checkpoint(folders[name] / "ckpt").layers:
        lw64 = lw.astype(F64)
        whole = shard_layer(cfg, merge_layer(cfg, lw64, ad), shard).named_tensors()
        ranked = merge_layer(shard_config(cfg, shard), shard_layer(cfg, lw64, shard), shard_adapter(ad, cfg, shard))
        assert all(torch.equal(v, whole[k]) for k, v in ranked.named_tensors().items())


def test_sizes_that_do_not_divide_are_refused_naming_the_valid_ones(folders):
    cfg = preset("tiny-next-tp")
    assert valid_sizes(cfg) == (1, 2, 4) and valid_sizes(preset("qwen3-next-80b-a3b")) == (1, 2, 4, 8, 16)
    with pytest.raises(TpError, match=r"tp=3 does not divide linear_num_key_heads=4, linear_num_value_heads=8, "
                                      r"intermediate_size=64 .*valid tensor-parallel sizes are 1, 2, 4"):
        shard_config(cfg, Shard(3, 0))
    with pytest.raises(TpError, match=r"tp=8 does not divide linear_num_key_heads=4 of"):
        load_checkpoint(folders["tiny-next-tp"] / "ckpt", Shard(8, 5))
    narrow_mlp = preset("tiny-3.5-tp").replace(intermediate_size=6)
    with pytest.raises(TpError, match=r"tp=4 does not divide intermediate_size=6 .*sizes are 1, 2$"):
        shard_config(narrow_mlp, Shard(4, 0))
    rank = shard_config(cfg, Shard(2, 1))
    with pytest.raises(TpError, match="already rank 1 of tp=2"):
        shard_config(rank, Shard(2, 0))
    with pytest.raises(TpError, match="mapped onto config"):
        shard_adapter(shard_adapter(load_adapter(folders["tiny-next-tp"] / "adapter", cfg), cfg, Shard(2, 0)), cfg,
                      Shard(2, 0))
    for size, r in ((2, 2), (0, 0), (2, -1), (True, 0), (2, 1.0)):
        with pytest.raises(ValueError, match="Shard needs"):
            Shard(size, r)
    with pytest.raises(ValueError, match="tp_rank must be in"):
        cfg.replace(tp_size=2, tp_rank=2)
    with pytest.raises(ValueError, match="write the whole model's config"):
        rank.to_hf()


def test_rank_configs_hash_apart_and_whole_models_hash_as_before():
    for name in ("qwen3-next-80b-a3b", "tiny-4exp-tp"):
        cfg = preset(name)
        # the hash a whole model had before tensor parallelism: every field but the two tp ones
        d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
             if f.compare and f.name not in ("tp_size", "tp_rank")}
        d["family"] = cfg.family.value
        before = hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:16]
        assert cfg.config_hash() == before
        ranks = [shard_config(cfg, Shard(n, r)) for n in (2, 4) for r in range(n)]
        assert len({c.config_hash() for c in ranks} | {cfg.config_hash()}) == len(ranks) + 1
        assert all(full_config(c) == cfg for c in ranks)
        assert shard_config(cfg, Shard(4, 3)).ssm_state_shape == (cfg.linear_num_value_heads // 4,
                                                                   *cfg.ssm_state_shape[1:])


def test_rank_layer_without_its_process_group_is_refused_before_anything_runs(folders):
    ck = load_checkpoint(folders["tiny-3.5-tp"] / "ckpt", Shard(2, 1))
    layer = GdnLayer(ck.config, ck.layers[0], F64)
    state = LayerState.allocate(ck.config, 0, 2, BufferSpec(F64))
    for t in state.tensors():
        t.normal_()
    before = [t.clone() for t in state.tensors()]
    x = torch.randn(1, ck.config.stream_dim, dtype=F64)
    step = StepInput(x, Packing.build([1], [1]), torch.zeros_like(x))
    with pytest.raises(TpError, match="rank 1 of tp=2: initialise torch.distributed"):
        layer.run(LayerMode.DECODE, step, state)
    assert all(torch.equal(a, b) for a, b in zip(before, state.tensors()))


def test_exporting_a_rank_layer_is_refused(folders, monkeypatch):
    ck = load_checkpoint(folders["tiny-next-tp"] / "ckpt", Shard(4, 2))
    layer = GdnLayer(ck.config, ck.layers[0], F64)
    state = LayerState.allocate(ck.config, ck.layers[0].index, 1, BufferSpec(F64))
    x = torch.randn(1, ck.config.stream_dim, dtype=F64)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    with pytest.raises(TpError, match="its graph would hold an all-reduce; export a rank.s layer with"):
        layer.run(LayerMode.DECODE, StepInput(x, Packing.build([1], [0]), torch.zeros_like(x)), state)


@pytest.mark.parametrize("name", TP_PRESETS)
def test_a_rank_reads_no_sharded_tensor_whole(folders, name, monkeypatch):
    """The sharded tensors are read through safetensors slices (`_Tensors.part`), never whole (`_Tensors.get`)."""
    from gdn_trt.model import checkpoint as C

    whole, get = [], C._Tensors.get
    monkeypatch.setattr(C._Tensors, "get", lambda self, n, integer=False: whole.append(n) or get(self, n, integer))
    load_checkpoint(folders[name] / "ckpt", Shard(4, 3))
    sharded = ("in_proj", "conv1d", "A_log", "dt_bias", "out_proj", "mlp.")
    assert any(n.endswith("norm.weight") for n in whole)  # the replicated parts are read whole
    assert not [n for n in whole if any(s in n for s in sharded) and "ple." not in n]
