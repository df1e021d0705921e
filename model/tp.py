"""Tensor parallelism of the GDN layers: which part of a layer each rank holds, in the layout vLLM and SGLang load.

Each of `tp` ranks holds HV/tp value heads and H/tp key heads (a key head's G value heads stay on its rank), so a
rank's layer is the same layer over fewer heads: `shard_config` gives the rank's `GdnConfig` (head counts and the
dense MLP width divided by tp, the rank in `tp_size` / `tp_rank`), and every shape derived from it (weights, pools,
stashes, captures) is the rank's. The two recurrent ops work per head, so they run unchanged on a rank's heads.

What a rank holds (the engines' loaders: vLLM `GatedDeltaNetAttention`, SGLang `Qwen3GatedDeltaNet`), so that a
host engine's sharded checkpoint and ours hold the same numbers (`tests/test_tp_layout.py` checks it against
their loading rules):
- in-projections, column-parallel. Qwen3-Next's `in_proj_qkvz` / `in_proj_ba` are one output each (vLLM's
  `MergedColumnParallelLinear` with a single output size under `gqa_interleaved_layout`): rank r takes the
  contiguous rows of key-head groups [r·H/tp, (r+1)·H/tp) and de-interleaves them over its own H/tp groups.
  Qwen3.5 / Qwen4-Exp's `in_proj_qkv` is three outputs [Q | K | V] (output sizes [key_dim, key_dim, value_dim]),
  each split by rank; `in_proj_z`, `in_proj_b`, `in_proj_a` are split by rows. Either way the rank's internal rows
  are [Q_r | K_r | V_r | Z_r | B_r | A_r] (`in_proj_rows`).
- the conv weight: each of the [Q | K | V] channel blocks split by rank (vLLM's `mamba_v2_sharded_weight_loader`
  with settings (key_dim, 0, False), (key_dim, 0, False), (value_dim, 0, False)): `conv_channels`.
- `A_log`, `dt_bias`: the rank's value heads. The gated norm's weight is per head dim ([V], all three families:
  `RMSNormGated(head_v_dim)` in both engines), so it is replicated.
- `out_proj`, row-parallel: the columns of the rank's value heads; the ranks' partial sums are all-reduced after
  it (vLLM: `RowParallelLinear(reduce_results=True)`), or left to the host (SGLang: `reduce_results=False`, its
  layer communicator reduces, fused with the next residual add and RMSNorm): `TpSpec.host_reduce`.
- the dense MLP (Qwen3.5 dense layers, Qwen3-Next `mlp_only_layers`): gate and up column-parallel, down
  row-parallel with a second all-reduce after it, as vLLM's `Qwen2MoeMLP` (the post-attention RMSNorm between the
  two sublayers needs the whole mixer output, so the first reduction cannot move past it).
- replicated: the residual RMSNorms, and Qwen4-Exp's hyper-connection gates and PLE. They act on whole hidden
  streams (the grouped norms and the PLE gate reduce over each stream's C channels, the read and write gates mix
  every channel), so sharding them would add collectives around every sublayer to save little: at Qwen4-Exp sizes
  the hc gates are 6.6 M parameters per sublayer and the PLE consumer 32.8 M on its one layer, against 42.1 M per
  mixer, which is sharded. The PLE conv carry [carry, n·C] is therefore whole on every rank, as are the PLE rows.

`shard_layer` cuts in-memory weights; `load_checkpoint(dir, shard)` (`checkpoint.py`) reads only a rank's rows and
columns from the safetensors files. `lora.shard_adapter` cuts a LoRA adapter as PEFT / vLLM's parallel LoRA layers
do: for column-parallel targets A is replicated and B split by output rows; for the row-parallel `out_proj` and
`down_proj` A is split by input columns and B replicated, so the ranks' updates sum to the whole one.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .config import GdnConfig, Shard
from .errors import GdnTrtError
from .weights import LayerWeights, MixerWeights, MlpWeights


class TpError(GdnTrtError, ValueError):
    """A tensor-parallel size or rank that does not fit the model, or a process group that does not match it."""


class Part(str, enum.Enum):
    """The two graphs of a rank's dense-MLP layer, with the host's all-reduce between them (a graph holds no
    collective): MIXER = the layer up to the rank's partial `out_proj` sum (`x_out`) and the residual
    (`residual_out`); MLP = from the reduced mixer output and that residual through the post-attention RMSNorm and
    the rank's gate/up/down to the rank's partial `down_proj` sum and the new residual. The layer's hidden state is
    `all_reduce(mlp.x_out) + mlp.residual_out`."""

    MIXER = "mixer"
    MLP = "mlp"


# ---- sizes ----
def valid_sizes(cfg: GdnConfig) -> tuple[int, ...]:
    """The tp sizes that split every sharded size of `cfg` evenly: the divisors of H (HV = G·H follows) and of the
    dense MLP width."""
    n = math.gcd(cfg.linear_num_key_heads, cfg.intermediate_size)  # gcd(H, 0) = H
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def check_shard(cfg: GdnConfig, shard: Shard) -> None:
    """Raise `TpError` unless `shard` is a rank of a tp size that divides `cfg`'s heads (and MLP width)."""
    if cfg.tp_size > 1:
        raise TpError(f"{cfg.name} is already rank {cfg.tp_rank} of tp={cfg.tp_size}: shard the whole model's config")
    if shard.size in valid_sizes(cfg):
        return
    sizes = {"linear_num_key_heads": cfg.linear_num_key_heads, "linear_num_value_heads": cfg.linear_num_value_heads,
             "intermediate_size": cfg.intermediate_size}
    bad = [f"{k}={v}" for k, v in sizes.items() if v % shard.size]
    raise TpError(f"tp={shard.size} does not divide {', '.join(bad)} of {cfg.name}; its valid tensor-parallel sizes "
                  f"are {', '.join(map(str, valid_sizes(cfg)))}")


def shard_config(cfg: GdnConfig, shard: Shard) -> GdnConfig:
    """The config of rank `shard.rank` of `shard.size` (`cfg` itself for a single rank)."""
    check_shard(cfg, shard)
    if shard.size == 1:
        return cfg
    n = shard.size
    return cfg.replace(linear_num_key_heads=cfg.linear_num_key_heads // n,
                       linear_num_value_heads=cfg.linear_num_value_heads // n,
                       intermediate_size=cfg.intermediate_size // n, tp_size=n, tp_rank=shard.rank)


def full_config(cfg: GdnConfig) -> GdnConfig:
    """The whole model's config of a rank's config (inverse of `shard_config`)."""
    n = cfg.tp_size
    if n == 1:
        return cfg
    return cfg.replace(linear_num_key_heads=cfg.linear_num_key_heads * n,
                       linear_num_value_heads=cfg.linear_num_value_heads * n,
                       intermediate_size=cfg.intermediate_size * n, tp_size=1, tp_rank=0)


# ---- the rank's rows of the whole model's internal layout ----
def _span(start: int, part: tuple[int, int]) -> Tensor:
    return torch.arange(start + part[0], start + part[1])


def qkv_spans(cfg: GdnConfig, shard: Shard) -> list[tuple[int, int]]:
    """The rank's row ranges of the [Q | K | V] blocks (conv channels, `in_proj_qkv` rows) of the whole model."""
    kd, vd = cfg.key_dim, cfg.value_dim
    return [(o + a, o + b) for o, (a, b) in ((0, shard.part(kd)), (kd, shard.part(kd)), (2 * kd, shard.part(vd)))]


def conv_channels(cfg: GdnConfig, shard: Shard) -> Tensor:
    """Indices of the whole model's conv channels [Q | K | V] that rank `shard` holds, in its order [Q_r | K_r | V_r]
    (also the channels of its conv pool, stash and capture rows)."""
    return torch.cat([torch.arange(a, b) for a, b in qkv_spans(cfg, shard)])


def in_proj_rows(cfg: GdnConfig, shard: Shard) -> Tensor:
    """Indices of the whole model's internal `in_proj` rows [Q | K | V | Z | B | A] that rank `shard` holds, in its
    own internal order [Q_r | K_r | V_r | Z_r | B_r | A_r]."""
    HV, vd, cd = cfg.linear_num_value_heads, cfg.value_dim, cfg.conv_dim
    return torch.cat([conv_channels(cfg, shard), _span(cd, shard.part(vd)), _span(cd + vd, shard.part(HV)),
                      _span(cd + vd + HV, shard.part(HV))])


def value_heads(cfg: GdnConfig, shard: Shard) -> slice:
    """The whole model's value heads that rank `shard` holds (its rows of A_log, dt_bias and the state [HV, K, V])."""
    return slice(*shard.part(cfg.linear_num_value_heads))


# ---- weights ----
def shard_layer(cfg: GdnConfig, lw: LayerWeights, shard: Shard) -> LayerWeights:
    """Rank `shard`'s weights of one layer of the whole model `cfg` (copies of its rows and columns; the replicated
    parts are the same tensors). `load_checkpoint(dir, shard)` reads the same numbers from the files."""
    rank_cfg = shard_config(cfg, shard)
    if shard.size == 1:
        return lw
    m, heads = lw.mixer, value_heads(cfg, shard)
    cols = slice(*shard.part(cfg.value_dim))
    mixer = MixerWeights(m.in_proj[in_proj_rows(cfg, shard)], m.conv[conv_channels(cfg, shard)],
                         m.dt_bias[heads].clone(), m.A_log[heads].clone(), m.norm, m.out_proj[:, cols].contiguous())
    mlp = lw.mlp
    if mlp is not None:
        I, (a, b) = cfg.intermediate_size, shard.part(cfg.intermediate_size)
        mlp = MlpWeights(torch.cat([mlp.gate_up[a:b], mlp.gate_up[I + a:I + b]]), mlp.down[:, a:b].contiguous())
    out = replace(lw, mixer=mixer, mlp=mlp)
    out.check(rank_cfg)
    return out


# ---- communication ----
@dataclass(frozen=True)
class TpSpec:
    """How a rank's layer talks to the other ranks.

    Args:
        group: the `torch.distributed` process group of the layer's tp ranks (None = the default group); this
            process must be rank `cfg.tp_rank` of `cfg.tp_size` in it.
        host_reduce: leave the layer's last all-reduce (after `out_proj` on mixer-only layers, after `down_proj` on
            dense-MLP layers) to the host, which fuses it into its own (SGLang's `reduce_results=False`). The layer's
            output `x` is then this rank's partial sum and `residual` the replicated rest: the layer's hidden state
            is `all_reduce(x) + residual` (hc layers too: `residual` holds the streams, `x` the write-gated delta).
    """

    group: Any = None
    host_reduce: bool = False

    def check(self, cfg: GdnConfig) -> None:
        """Raise `TpError` unless this process is rank `cfg.tp_rank` of `cfg.tp_size` in the group (nothing to
        check for a whole model)."""
        if cfg.tp_size == 1:
            return
        if not (dist.is_available() and dist.is_initialized()):
            raise TpError(f"{cfg.name} is rank {cfg.tp_rank} of tp={cfg.tp_size}: initialise torch.distributed "
                          "(init_process_group) before running its layers")
        size, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        if (size, rank) != (cfg.tp_size, cfg.tp_rank):
            raise TpError(f"the layer holds rank {cfg.tp_rank} of tp={cfg.tp_size}, but this process is rank {rank} "
                          f"of a process group of {size}")

    def all_reduce(self, y: Tensor) -> Tensor:
        """Sum `y` over the group, in place."""
        dist.all_reduce(y, group=self.group)
        return y
