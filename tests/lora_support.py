"""Helpers shared by the LoRA tests (no tests here): float64 copies of layer weights, synthetic checkpoints with
adapters, the hand-built HF -> internal row permutation of every target, and per-token slot indices."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from gdn_trt.model.checkpoint import Checkpoint, load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import GdnConfig
from gdn_trt.model.lora import Adapter, LoraTarget, sites
from gdn_trt.model.peft import SyntheticAdapter, load_adapter, make_synthetic_adapter
from gdn_trt.model.weights import LayerWeights


def to_f64(lw: LayerWeights) -> LayerWeights:
    """The layer's weights in float64 (merging then rounds nothing, so merged == unmerged to float64 rounding)."""
    return lw.astype(torch.float64)


def checkpoint_with_adapters(preset: str, root: Path, specs: list[SyntheticAdapter]) -> tuple[Checkpoint,
                                                                                             list[Adapter]]:
    ck = load_checkpoint(make_synthetic_checkpoint(preset, root / "ckpt", seed=3))
    ads = [load_adapter(make_synthetic_adapter(preset, root / f"adapter{k}", s, seed=10 + k), ck.config, f"ad{k}")
           for k, s in enumerate(specs)]
    return ck, ads


def hf_tensor(path: Path, suffix: str) -> torch.Tensor:
    """The tensor of a safetensors file whose name ends with `suffix` (prefix-agnostic)."""
    with safe_open(path, "pt") as f:
        (name,) = [k for k in f.keys() if k.endswith(suffix)]
        return f.get_tensor(name)


def internal_index(cfg: GdnConfig, target: LoraTarget) -> torch.Tensor:
    """perm[r] = the internal row (within the target's site) of the target's HF output row r, built from the
    Qwen3-Next group layout by hand (per key head: [q K | k K | v G*V | z G*V] and [b G | a G])."""
    H, K, V, G = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.gva_ratio
    kd, gv = cfg.key_dim, G * V
    if target is LoraTarget.IN_PROJ_QKVZ:
        gs, out = 2 * K + 2 * gv, []
        for r in range(H * gs):
            h, j = divmod(r, gs)
            if j < K:
                out.append(h * K + j)
            elif j < 2 * K:
                out.append(kd + h * K + j - K)
            elif j < 2 * K + gv:
                out.append(2 * kd + h * gv + j - 2 * K)
            else:
                out.append(cfg.conv_dim + h * gv + j - 2 * K - gv)
        return torch.tensor(out)
    if target is LoraTarget.IN_PROJ_BA:
        return torch.tensor([h * G + j if j < G else H * G + h * G + j - G
                             for h in range(H) for j in range(2 * G)])
    return torch.arange(sites(cfg, next(i for i in cfg.gdn_layer_ids if target in sites(cfg, i)))[target].out_dim)


def token_slots(lengths: list[int], per_seq: list[int]) -> torch.Tensor:
    """lora_idx [T] int32: each sequence's slot repeated over its tokens."""
    return torch.tensor([s for n, s in zip(lengths, per_seq) for _ in range(n)], dtype=torch.int32)
