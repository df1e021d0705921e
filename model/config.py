"""Frozen configuration of the GDN decoder layers of Qwen3-Next, Qwen3.5 and Qwen4-Exp, and the preset table.

One class, `GdnConfig`, holds the Hugging Face fields the GDN layers need (HF names where HF has one) and derives
every shape from them: the state shapes below are the only place they are computed. Constructors: `from_hf`
(a `config.json` dict or path, text config nested or not) and `preset(name)`.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class Family(str, enum.Enum):
    """Model family: decides checkpoint names and the residual style."""

    QWEN3_NEXT = "qwen3_next"
    QWEN3_5 = "qwen3_5"
    QWEN4_EXP = "qwen4_exp"


# model_type values found in HF configs (outer multimodal wrapper or text config) -> family
_MODEL_TYPES = {
    "qwen3_next": Family.QWEN3_NEXT,
    "qwen3_5": Family.QWEN3_5,
    "qwen3_5_text": Family.QWEN3_5,
    "qwen3_5_moe": Family.QWEN3_5,
    "qwen3_5_moe_text": Family.QWEN3_5,
    "qwen4_exp": Family.QWEN4_EXP,
    "qwen4_exp_text": Family.QWEN4_EXP,
}

LINEAR = "linear_attention"
_GATE_ACTS = ("silu", "sigmoid")


@dataclass(frozen=True)
class Shard:
    """Tensor-parallel rank `rank` of `size` (`model/tp.py` cuts configs, weights and adapters by it)."""

    size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if type(self.size) is not int or type(self.rank) is not int or self.size < 1 \
                or not 0 <= self.rank < self.size:
            raise ValueError(f"Shard needs an integer size >= 1 and a rank in 0..size-1, got rank {self.rank!r} of "
                             f"{self.size!r}")

    def part(self, n: int) -> tuple[int, int]:
        """[start, stop) of this rank's equal share of n rows (n a multiple of size)."""
        if n % self.size:
            raise ValueError(f"{n} rows do not split into {self.size} equal shares")
        k = n // self.size
        return self.rank * k, (self.rank + 1) * k


@dataclass(frozen=True)
class GdnConfig:
    """The fields of one model's GDN layers; every shape the project uses is derived here.

    `layer_types` lists all decoder layers (HF convention); only `linear_attention` layers are GDN layers.
    `dense_mlp_layers` are the zero-indexed layers that carry a dense SwiGLU MLP; every other GDN layer is
    exported mixer-only (its MoE runs elsewhere). `hc_count == 1` means the plain residual (Qwen3-Next,
    Qwen3.5); `hc_count > 1` is Qwen4-Exp's gated residual over `hc_count` streams. `ple_layer_ids` is one-indexed,
    as in HF.

    `tp_size > 1` makes the config one tensor-parallel rank's view of the model (`model/tp.py`: `shard_config`):
    the head counts and `intermediate_size` are then that rank's (the model's divided by `tp_size`), so every shape
    derived here (projections, conv channels, pools, stashes, captures) is the rank's. The rank enters the hash, so
    anything keyed on it (plans, adapters, snapshots) tells the ranks apart; a whole model (tp_size 1) hashes as
    it did before tensor parallelism existed.
    """

    family: Family
    hidden_size: int
    layer_types: tuple[str, ...]
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    output_gate_type: str = "silu"
    intermediate_size: int = 0
    dense_mlp_layers: tuple[int, ...] = ()
    hc_count: int = 1
    hc_lowrank: int = 0
    ple_layer_ids: tuple[int, ...] = ()
    ple_embed_dim: int = 0
    ple_conv_kernel_size: int = 4
    ngram_size: int = 3
    heads_per_ngram: int = 8
    ngram_vocab_size_base: int = 20_000_000
    make_ngram_vocab_size_divisible_by: int = 128
    seed: int = 1234
    vocab_size: int = 151_936
    eos_token_id: int = 151_645
    dtype: str = "bfloat16"
    tp_size: int = 1
    tp_rank: int = 0
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"GdnConfig({self.name}): {msg}")

        need(isinstance(self.family, Family), f"family must be a Family, got {self.family!r}")
        need(isinstance(self.rms_norm_eps, (int, float)) and not isinstance(self.rms_norm_eps, bool)
             and math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0,
             f"rms_norm_eps must be a finite number > 0, got {self.rms_norm_eps!r}")
        for f in ("hidden_size", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_conv_kernel_dim", "hc_count"):
            need(int(getattr(self, f)) >= 1, f"{f} must be >= 1, got {getattr(self, f)}")
        need(self.linear_num_value_heads % self.linear_num_key_heads == 0,
             f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of linear_num_key_heads "
             f"({self.linear_num_key_heads})")
        need(LINEAR in self.layer_types, "layer_types has no linear_attention layer")
        need(self.output_gate_type in _GATE_ACTS, f"output_gate_type must be one of {_GATE_ACTS}")
        need(self.hidden_act == "silu", f"hidden_act must be silu (the conv activation), got {self.hidden_act}")
        n = len(self.layer_types)
        need(all(0 <= i < n for i in self.dense_mlp_layers), f"dense_mlp_layers out of range 0..{n - 1}")
        need(bool(self.dense_mlp_layers) == (self.intermediate_size > 0),
             "intermediate_size is the dense MLP width: > 0 exactly when dense_mlp_layers is not empty")
        if self.hc_count > 1:
            need(self.hc_lowrank >= 1, "hc_count > 1 needs hc_lowrank >= 1")
        need(all(1 <= i <= n for i in self.ple_layer_ids), f"ple_layer_ids are one-indexed, 1..{n}")
        if self.ple_layer_ids:
            need(self.hc_count > 1, "PLE needs the hyper-connection streams (hc_count > 1)")
            need(all(self.layer_types[i - 1] == LINEAR for i in self.ple_layer_ids),
                 "PLE is supported on GDN (linear_attention) layers only")
            need(self.ngram_size >= 2 and self.heads_per_ngram >= 1, "ngram_size >= 2 and heads_per_ngram >= 1")
            need(self.ple_embed_dim % self.ple_heads == 0,
                 f"ple_embed_dim ({self.ple_embed_dim}) must be a multiple of the {self.ple_heads} n-gram heads")
        need(self.dtype in ("bfloat16", "float16", "float32"), f"unsupported dtype {self.dtype}")
        need(type(self.tp_size) is int and type(self.tp_rank) is int and 0 <= self.tp_rank < self.tp_size,
             f"tp_rank must be in 0..tp_size-1 (integers), got rank {self.tp_rank!r} of {self.tp_size!r}")

    # ---- derived sizes (the one shape authority) ----
    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def gdn_layer_ids(self) -> tuple[int, ...]:
        """Zero-indexed decoder layers that are GDN layers, in checkpoint order."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def gva_ratio(self) -> int:
        return self.linear_num_value_heads // self.linear_num_key_heads

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN conv, ordered [Q | K | V]."""
        return 2 * self.key_dim + self.value_dim

    @property
    def in_proj_dim(self) -> int:
        """Rows of the fused internal input projection, ordered [Q | K | V | Z | B | A]."""
        return self.conv_dim + self.value_dim + 2 * self.linear_num_value_heads

    @property
    def ssm_state_shape(self) -> tuple[int, int, int]:
        """One slot of the recurrent state: [HV, K, V] (key-dim rows, as HF and FLA)."""
        return (self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim)

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """One slot of the GDN conv state: [W-1, conv_dim], the last W-1 pre-conv inputs, oldest first (token-major:
        a row per token, so the kernels move whole rows along the channels)."""
        return (self.linear_conv_kernel_dim - 1, self.conv_dim)

    @property
    def is_hc(self) -> bool:
        return self.hc_count > 1

    @property
    def stream_dim(self) -> int:
        """Width of the activation entering a layer: C (plain) or n*C (hc streams)."""
        return self.hc_count * self.hidden_size

    @property
    def ple_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def ple_head_dim(self) -> int:
        return self.ple_embed_dim // self.ple_heads

    @property
    def ple_dilation(self) -> int:
        return self.ngram_size

    @property
    def ple_carry(self) -> int:
        """Rows of PLE conv history: (k-1)*dilation, not k-1."""
        return (self.ple_conv_kernel_size - 1) * self.ple_dilation

    @property
    def ple_conv_state_shape(self) -> tuple[int, int]:
        """One slot of the PLE conv state: [(k-1)*dilation, n*C], oldest first (token-major, as the GDN conv)."""
        return (self.ple_carry, self.stream_dim)

    def has_ple(self, layer_idx: int) -> bool:
        return (layer_idx + 1) in self.ple_layer_ids

    def ple_index(self, layer_idx: int) -> int:
        """Position of a PLE layer among the PLE layers (HF `ple_layer_index`: selects primes and multipliers)."""
        return sorted(self.ple_layer_ids).index(layer_idx + 1)

    def has_mlp(self, layer_idx: int) -> bool:
        return layer_idx in self.dense_mlp_layers

    @property
    def shard(self) -> "Shard":
        """Which tensor-parallel rank this config is the view of (`Shard()` for a whole model)."""
        return Shard(self.tp_size, self.tp_rank)

    def config_hash(self) -> str:
        """Stable hash of every field that changes weights, shapes or numerics (not the display name)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.compare}
        d["family"] = self.family.value
        if self.tp_size == 1:  # a whole model keeps the hash it had before tensor parallelism
            del d["tp_size"], d["tp_rank"]
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=list).encode()).hexdigest()[:16]

    def replace(self, **changes: Any) -> "GdnConfig":
        return dataclasses.replace(self, **changes)

    # ---- HF config.json ----
    @classmethod
    def from_hf(cls, cfg: dict | str | Path, name: str = "hf") -> "GdnConfig":
        """Build from an HF `config.json` (path or dict) of the three families; nested text configs are read.
        Every problem (not JSON, not an object, a missing key, a size that is not an integer, an unsupported
        model_type, a value the config refuses) is a ValueError of one line naming the file and the key."""
        where = "config" if isinstance(cfg, dict) else str(cfg)
        if not isinstance(cfg, dict):
            cfg = _read_json(Path(cfg))
        if not isinstance(cfg, dict):
            raise ValueError(f"{where}: a JSON {type(cfg).__name__}, expected an object (a model's config.json)")
        outer_type = cfg.get("model_type")
        if "text_config" in cfg and not isinstance(cfg["text_config"], (dict, type(None))):
            raise ValueError(f"{where}: text_config must be a JSON object, got {type(cfg['text_config']).__name__}")
        text = cfg.get("text_config") or cfg
        model_type = text.get("model_type", outer_type)
        family = _MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
        if family is None:
            raise ValueError(f"{where}: unsupported model_type {model_type!r}; gdn-trt reads {sorted(_MODEL_TYPES)}")
        r = _Reader(text, where + (" (text_config)" if text is not cfg else ""))
        try:
            return cls(**_fields(r, family, model_type, cfg, name))
        except ValueError as e:
            if str(e).startswith(where):
                raise
            raise ValueError(f"{where}: {e}") from None

    def to_hf(self) -> dict:
        """An HF `config.json` of this family (text config; Qwen3.5 and Qwen4-Exp wrapped like the hub's)."""
        if self.tp_size > 1:
            raise ValueError(f"GdnConfig({self.name}) is rank {self.tp_rank} of tp={self.tp_size}, whose head counts "
                             "are the rank's: write the whole model's config (model.tp.full_config) instead")
        text: dict[str, Any] = {
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "layer_types": list(self.layer_types),
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": self.hidden_act,
            "vocab_size": self.vocab_size,
            "eos_token_id": self.eos_token_id,
            "dtype": self.dtype,
        }
        if self.intermediate_size:
            text["intermediate_size"] = self.intermediate_size
        if self.family is Family.QWEN3_NEXT:
            # dense MLP layers are HF's mlp_only_layers; the rest are MoE
            text.update(model_type="qwen3_next", mlp_only_layers=list(self.dense_mlp_layers),
                        num_experts=0 if len(self.dense_mlp_layers) == self.num_layers else 512,
                        decoder_sparse_step=1)
            return text
        if self.family is Family.QWEN3_5:
            dense = len(self.dense_mlp_layers) == self.num_layers
            text["model_type"] = "qwen3_5_text" if dense else "qwen3_5_moe_text"
            return {"model_type": "qwen3_5" if dense else "qwen3_5_moe", "text_config": text}
        text.update(
            model_type="qwen4_exp_text", output_gate_type=self.output_gate_type, hc_count=self.hc_count,
            hc_lowrank=self.hc_lowrank, ple_layer_ids=list(self.ple_layer_ids), ple_embed_dim=self.ple_embed_dim,
            ple_conv_kernel_size=self.ple_conv_kernel_size, ngram_size=self.ngram_size,
            heads_per_ngram=self.heads_per_ngram, ngram_vocab_size_base=self.ngram_vocab_size_base,
            make_ngram_vocab_size_divisible_by=self.make_ngram_vocab_size_divisible_by, seed=self.seed,
        )
        return {"model_type": "qwen4_exp", "text_config": text}


_NEED = object()
# Released models have under 128 decoder layers; the bound keeps a forged config.json from making the loader build
# a list of 2**62 layer types (it hung before).
MAX_LAYERS = 4096


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); fix or re-download it") from None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{path}: not valid JSON ({e}); fix or re-download it") from None


class _Reader:
    """Typed access to the keys of an HF config dict; each problem raises one line naming `where` and the key."""

    def __init__(self, d: dict, where: str):
        self.d, self.where = d, where

    def _get(self, key: str, default: object) -> object:
        if key in self.d:
            return self.d[key]
        if default is _NEED:
            raise ValueError(f"{self.where}: missing {key!r}; an HF config of this family has it")
        return default

    def int(self, key: str, default: object = _NEED, nullable: bool = False, lo: int | None = None,
            hi: int | None = None) -> int:
        """An integer (an integral float such as 40.0 counts) in lo..hi; None -> `default` when `nullable`."""
        v = self._get(key, default)
        if v is None and nullable:
            v = default
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if type(v) is not int:
            raise ValueError(f"{self.where}: {key} must be an integer, got {v!r}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"{self.where}: {key} must be in {lo}..{'' if hi is None else hi}, got {v}")
        return v

    def float(self, key: str, default: float) -> float:
        v = self._get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{self.where}: {key} must be a number, got {v!r}")
        return float(v)

    def ints(self, key: str) -> list[int]:
        v = self._get(key, None) or []
        if not isinstance(v, list) or any(type(x) is not int for x in v):
            raise ValueError(f"{self.where}: {key} must be a list of integers, got {v!r}")
        return v

    def str(self, key: str, default: str) -> str:
        v = self._get(key, default)
        if not isinstance(v, str):
            raise ValueError(f"{self.where}: {key} must be a string, got {v!r}")
        return v


# what transformers' config classes give a key that config.json leaves out (tests/test_config_vs_transformers.py)
_HF_DEFAULTS = {Family.QWEN3_NEXT: {"vocab_size": 151_936, "intermediate_size": 5632},
                Family.QWEN3_5: {"vocab_size": 248_320, "intermediate_size": 12_288},
                Family.QWEN4_EXP: {"vocab_size": 248_320, "intermediate_size": 0}}


def _fields(r: _Reader, family: Family, model_type: str, outer: dict, name: str) -> dict[str, Any]:
    """GdnConfig keyword arguments from an HF config's text part (`r`) and its outer dict."""
    text = r.d
    n = r.int("num_hidden_layers", lo=1, hi=MAX_LAYERS)
    layer_types = text.get("layer_types")
    if layer_types is None:
        interval = r.int("full_attention_interval", 4, lo=1)
        layer_types = [LINEAR if (i + 1) % interval else "full_attention" for i in range(n)]
    if not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
        raise ValueError(f"{r.where}: layer_types must be a list of strings, got {str(layer_types)[:80]!r}")
    if len(layer_types) != n:
        raise ValueError(f"{r.where}: layer_types lists {len(layer_types)} layers, num_hidden_layers says {n}")
    eos = text.get("eos_token_id", outer.get("eos_token_id"))
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if eos is not None and type(eos) is not int:
        raise ValueError(f"{r.where}: eos_token_id must be an integer or a list of them, got {eos!r}")
    hidden = r.int("hidden_size")
    dense = _dense_mlp_layers(family, model_type, r, n)
    dtype = text.get("dtype") or text.get("torch_dtype") or outer.get("torch_dtype") or "bfloat16"
    kw: dict[str, Any] = dict(
        family=family,
        name=name,
        hidden_size=hidden,
        layer_types=tuple(layer_types),
        linear_num_key_heads=r.int("linear_num_key_heads"),
        linear_num_value_heads=r.int("linear_num_value_heads"),
        linear_key_head_dim=r.int("linear_key_head_dim"),
        linear_value_head_dim=r.int("linear_value_head_dim"),
        linear_conv_kernel_dim=r.int("linear_conv_kernel_dim", 4),
        rms_norm_eps=r.float("rms_norm_eps", 1e-6),
        hidden_act=r.str("hidden_act", "silu"),
        output_gate_type=text.get("output_gate_type") or r.str("hidden_act", "silu"),
        # only dense MLP layers use it; 0 otherwise keeps the config hash independent of unused fields
        intermediate_size=r.int("intermediate_size", _HF_DEFAULTS[family]["intermediate_size"], nullable=True)
        if dense else 0,
        dense_mlp_layers=dense,
        vocab_size=r.int("vocab_size", _HF_DEFAULTS[family]["vocab_size"]),
        eos_token_id=eos if eos is not None else 151_645,
        dtype=str(dtype),
    )
    if family is Family.QWEN4_EXP:
        kw.update(
            hc_count=r.int("hc_count", 4),
            hc_lowrank=r.int("hc_lowrank", 320),
            ple_layer_ids=tuple(sorted(set(r.ints("ple_layer_ids")))),
            ple_embed_dim=r.int("ple_embed_dim", hidden, nullable=True) or hidden,
            ple_conv_kernel_size=r.int("ple_conv_kernel_size", 4),
            ngram_size=r.int("ngram_size", 3),
            heads_per_ngram=r.int("heads_per_ngram", 8),
            ngram_vocab_size_base=r.int("ngram_vocab_size_base", 20_000_000),
            make_ngram_vocab_size_divisible_by=r.int("make_ngram_vocab_size_divisible_by", 128),
            seed=r.int("seed", 1234),
        )
    return kw


def _dense_mlp_layers(family: Family, model_type: str, r: _Reader, n: int) -> tuple[int, ...]:
    if family is Family.QWEN4_EXP:
        return ()
    if family is Family.QWEN3_5:
        # qwen3_5_text is the dense family; qwen3_5_moe(_text) is MoE everywhere
        return tuple(range(n)) if model_type in ("qwen3_5", "qwen3_5_text") else ()
    # Qwen3-Next: HF Qwen3NextDecoderLayer picks the dense MLP for mlp_only_layers, or when MoE is off
    only = set(r.ints("mlp_only_layers"))
    experts = r.int("num_experts", 512, lo=0)
    step = r.int("decoder_sparse_step", 1, lo=1)
    return tuple(i for i in range(n) if i in only or not (experts > 0 and (i + 1) % step == 0))


def _hybrid(n: int, interval: int = 4) -> tuple[str, ...]:
    return tuple(LINEAR if (i + 1) % interval else "full_attention" for i in range(n))


PRESETS: dict[str, GdnConfig] = {
    # real layer shapes (the released models' HF configs; docs/math.md#projections-of-the-three-families)
    "qwen3-next-80b-a3b": GdnConfig(
        family=Family.QWEN3_NEXT, name="qwen3-next-80b-a3b", hidden_size=2048, layer_types=_hybrid(48),
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        eos_token_id=151_645),
    "qwen3.5-27b": GdnConfig(
        family=Family.QWEN3_5, name="qwen3.5-27b", hidden_size=5120, layer_types=_hybrid(64),
        linear_num_key_heads=16, linear_num_value_heads=48, linear_key_head_dim=128, linear_value_head_dim=128,
        intermediate_size=17408, dense_mlp_layers=tuple(range(64)), vocab_size=248_320, eos_token_id=248_044),
    "qwen3.5": GdnConfig(  # HF Qwen3_5TextConfig defaults
        family=Family.QWEN3_5, name="qwen3.5", hidden_size=4096, layer_types=_hybrid(32),
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        intermediate_size=12288, dense_mlp_layers=tuple(range(32)), vocab_size=248_320, eos_token_id=248_044),
    "qwen4-exp": GdnConfig(  # Qwen3.8-Flash-Next (model_type qwen4_exp); PLE on layer 2 (one-indexed)
        family=Family.QWEN4_EXP, name="qwen4-exp", hidden_size=2560, layer_types=_hybrid(48),
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        output_gate_type="sigmoid", hc_count=4, hc_lowrank=320, ple_layer_ids=(2,), ple_embed_dim=2560,
        vocab_size=248_320, eos_token_id=248_044),
    # small test presets: K != V and G in {2, 3} so layout bugs cannot hide
    "tiny-next": GdnConfig(
        family=Family.QWEN3_NEXT, name="tiny-next", hidden_size=48, layer_types=_hybrid(4),
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=12,
        vocab_size=1000, eos_token_id=999, dtype="float32"),
    "tiny-next-mlp": GdnConfig(
        family=Family.QWEN3_NEXT, name="tiny-next-mlp", hidden_size=48, layer_types=_hybrid(4),
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=12,
        intermediate_size=64, dense_mlp_layers=(1,), vocab_size=1000, eos_token_id=999, dtype="float32"),
    "tiny-3.5": GdnConfig(
        family=Family.QWEN3_5, name="tiny-3.5", hidden_size=40, layer_types=_hybrid(4),
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=8, linear_value_head_dim=12,
        intermediate_size=56, dense_mlp_layers=tuple(range(4)), vocab_size=1000, eos_token_id=999,
        dtype="float32"),
    "tiny-4exp": GdnConfig(
        family=Family.QWEN4_EXP, name="tiny-4exp", hidden_size=32, layer_types=_hybrid(4),
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=12, linear_value_head_dim=8,
        output_gate_type="sigmoid", hc_count=4, hc_lowrank=8, ple_layer_ids=(2,), ple_embed_dim=32,
        heads_per_ngram=2, ngram_vocab_size_base=97, make_ngram_vocab_size_divisible_by=8, vocab_size=1000,
        eos_token_id=999, dtype="float32"),
    # small tensor-parallel test presets: H = 4 key heads, so tp = 2 and 4 both divide every sharded size
    "tiny-next-tp": GdnConfig(
        family=Family.QWEN3_NEXT, name="tiny-next-tp", hidden_size=48, layer_types=_hybrid(4),
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=12,
        intermediate_size=64, dense_mlp_layers=(1,), vocab_size=1000, eos_token_id=999, dtype="float32"),
    "tiny-3.5-tp": GdnConfig(
        family=Family.QWEN3_5, name="tiny-3.5-tp", hidden_size=40, layer_types=_hybrid(4),
        linear_num_key_heads=4, linear_num_value_heads=12, linear_key_head_dim=8, linear_value_head_dim=12,
        intermediate_size=56, dense_mlp_layers=tuple(range(4)), vocab_size=1000, eos_token_id=999,
        dtype="float32"),
    "tiny-4exp-tp": GdnConfig(
        family=Family.QWEN4_EXP, name="tiny-4exp-tp", hidden_size=32, layer_types=_hybrid(4),
        linear_num_key_heads=4, linear_num_value_heads=12, linear_key_head_dim=12, linear_value_head_dim=8,
        output_gate_type="sigmoid", hc_count=4, hc_lowrank=8, ple_layer_ids=(2,), ple_embed_dim=32,
        heads_per_ngram=2, ngram_vocab_size_base=97, make_ngram_vocab_size_divisible_by=8, vocab_size=1000,
        eos_token_id=999, dtype="float32"),
}

DEFAULT_PRESET = "tiny-3.5"
DEFAULT_HC_PRESET = "tiny-4exp"


def preset(name: str) -> GdnConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
