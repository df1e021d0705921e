"""Weights of one GDN decoder layer in the internal layout (the loader maps each family's HF names onto it).

Internal layout: one fused input projection with rows [Q | K | V | Z | B | A] in dense head order (Qwen3-Next's
group-interleaved `in_proj_qkvz` / `in_proj_ba` are de-interleaved at load), conv weight [conv_dim, W]
with channels [Q | K | V], SwiGLU gate and up fused as [gate | up].
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from .config import GdnConfig


# Float dtypes the layer can cast to its activation dtype; float8 weights need their block scales (a quantized
# checkpoint) and would be cast without them, silently wrong.
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def dtype_problem(t: Tensor, integer: bool = False) -> str | None:
    """Why `t` cannot be a weight (None when it can): float weights in WEIGHT_DTYPES, or (`integer`) an integer
    hash constant."""
    if integer:
        return None if not t.dtype.is_floating_point and t.dtype != torch.bool else "it must be an integer tensor"
    if t.dtype in WEIGHT_DTYPES:
        return None
    if t.dtype.is_floating_point:
        return "a quantized (float8) weight needs its scales: dequantize the checkpoint to bfloat16 first"
    return "weights must be floating point (bfloat16, float16, float32): dequantize or re-convert the checkpoint"


def _check(name: str, t: Tensor, shape: tuple[int, ...], integer: bool = False) -> None:
    """A dense tensor with data, of `shape`, floating point (or, `integer`, an integer hash constant)."""
    if not isinstance(t, Tensor):
        raise ValueError(f"weight {name} must be a tensor, got {type(t).__name__}")
    if t.is_meta:
        raise ValueError(f"weight {name} is a meta tensor (no data): load the real weights (not under "
                         "init_empty_weights or device_map='meta')")
    if t.layout != torch.strided:
        raise ValueError(f"weight {name} is a sparse tensor ({t.layout}): convert it with .to_dense()")
    why = dtype_problem(t, integer)
    if why is not None:
        raise ValueError(f"weight {name} is {str(t.dtype).replace('torch.', '')}; {why}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"weight {name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")


def _check_part(prefix: str, part, cfg: GdnConfig) -> None:
    """Every tensor of a weights dataclass against its `shapes(cfg)` table (integer: its `INTEGER` names)."""
    integer = getattr(part, "INTEGER", ())
    for name, shape in part.shapes(cfg).items():
        _check(f"{prefix}.{name}", getattr(part, name), shape, integer=name in integer)


@dataclass
class MixerWeights:
    """GDN mixer: in_proj [in_proj_dim, C], conv [conv_dim, W], dt_bias / A_log [HV], norm [V], out_proj [C, HV*V]."""

    in_proj: Tensor
    conv: Tensor
    dt_bias: Tensor
    A_log: Tensor
    norm: Tensor
    out_proj: Tensor

    @staticmethod
    def shapes(cfg: GdnConfig) -> dict[str, tuple[int, ...]]:
        HV = cfg.linear_num_value_heads
        return {"in_proj": (cfg.in_proj_dim, cfg.hidden_size), "conv": (cfg.conv_dim, cfg.linear_conv_kernel_dim),
                "dt_bias": (HV,), "A_log": (HV,), "norm": (cfg.linear_value_head_dim,),
                "out_proj": (cfg.hidden_size, cfg.value_dim)}

    def check(self, cfg: GdnConfig) -> None:
        _check_part("mixer", self, cfg)


@dataclass
class MlpWeights:
    """Dense SwiGLU: gate_up [2I, C] (rows [gate | up]), down [C, I]."""

    gate_up: Tensor
    down: Tensor

    @staticmethod
    def shapes(cfg: GdnConfig) -> dict[str, tuple[int, ...]]:
        return {"gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
                "down": (cfg.hidden_size, cfg.intermediate_size)}

    def check(self, cfg: GdnConfig) -> None:
        _check_part("mlp", self, cfg)


@dataclass
class HcWeights:
    """Qwen4-Exp gated residual: norm [n*C] (1+w, grouped by C), down [R, n*C], up [n*C, R], inject [n, n*C]."""

    norm: Tensor
    down: Tensor
    up: Tensor
    inject: Tensor

    @staticmethod
    def shapes(cfg: GdnConfig) -> dict[str, tuple[int, ...]]:
        nC, R = cfg.stream_dim, cfg.hc_lowrank
        return {"norm": (nC,), "down": (R, nC), "up": (nC, R), "inject": (cfg.hc_count, nC)}

    def check(self, cfg: GdnConfig) -> None:
        _check_part("hc", self, cfg)


@dataclass
class PleWeights:
    """Qwen4-Exp PLE consumer (the n-gram table itself stays on the host, see runtime/ple):
    key_proj [n*C, E], value_proj [C, E], norm_key / norm_query / norm_conv [n*C], conv [n*C, k]; and the hash
    constants read from the checkpoint: multipliers [ngram_size], head_sizes / head_offsets [heads] (int64)."""

    key_proj: Tensor
    value_proj: Tensor
    norm_key: Tensor
    norm_query: Tensor
    norm_conv: Tensor
    conv: Tensor
    multipliers: Tensor
    head_sizes: Tensor
    head_offsets: Tensor

    INTEGER = ("multipliers", "head_sizes", "head_offsets")  # hash constants (int64): the runtime's PLE hashing

    @staticmethod
    def shapes(cfg: GdnConfig) -> dict[str, tuple[int, ...]]:
        nC, E = cfg.stream_dim, cfg.ple_embed_dim
        return {"key_proj": (nC, E), "value_proj": (cfg.hidden_size, E), "norm_key": (nC,), "norm_query": (nC,),
                "norm_conv": (nC,), "conv": (nC, cfg.ple_conv_kernel_size), "multipliers": (cfg.ngram_size,),
                "head_sizes": (cfg.ple_heads,), "head_offsets": (cfg.ple_heads,)}

    def check(self, cfg: GdnConfig) -> None:
        _check_part("ple", self, cfg)


@dataclass
class LayerWeights:
    """One GDN decoder layer. `index` is its zero-indexed position among all decoder layers."""

    index: int
    mixer: MixerWeights
    input_norm: Tensor | None = None  # plain residual: RMSNorm(1+w) [C]
    post_norm: Tensor | None = None  # plain residual with a dense MLP
    mlp: MlpWeights | None = None
    attn_hc: HcWeights | None = None  # hc residual
    mlp_hc: HcWeights | None = None
    ple: PleWeights | None = None

    @staticmethod
    def wanted(cfg: GdnConfig, i: int) -> dict[str, bool]:
        """Part name -> whether GDN layer `i` of `cfg` has it."""
        return {"mixer": True, "input_norm": not cfg.is_hc, "post_norm": not cfg.is_hc and cfg.has_mlp(i),
                "mlp": cfg.has_mlp(i), "attn_hc": cfg.is_hc, "mlp_hc": cfg.is_hc and cfg.has_mlp(i),
                "ple": cfg.has_ple(i)}

    @staticmethod
    def shapes(cfg: GdnConfig, i: int) -> dict[str, tuple[int, ...]]:
        """`named_tensors()` name -> shape of every tensor GDN layer `i` of `cfg` holds (the one shape table)."""
        out: dict[str, tuple[int, ...]] = {}
        for name, needed in LayerWeights.wanted(cfg, i).items():
            if needed and name in _PARTS:
                out.update({f"{name}.{k}": v for k, v in _PARTS[name].shapes(cfg).items()})
            elif needed:
                out[name] = (cfg.hidden_size,)
        return out

    def check(self, cfg: GdnConfig) -> None:
        """Every part the config asks for is present with its shape, and nothing else."""
        i = self.index
        if cfg.layer_types[i] != "linear_attention":
            raise ValueError(f"layer {i} is {cfg.layer_types[i]}, not a GDN layer")
        for name, needed in LayerWeights.wanted(cfg, i).items():
            have = getattr(self, name) is not None
            if have != needed:
                raise ValueError(f"layer {i}: {name} is {'missing' if needed else 'unexpected'} for this config")
        self.mixer.check(cfg)
        for norm in ("input_norm", "post_norm"):
            if getattr(self, norm) is not None:
                _check(norm, getattr(self, norm), (cfg.hidden_size,))
        for part in (self.mlp, self.attn_hc, self.mlp_hc, self.ple):
            if part is not None:
                part.check(cfg)

    def astype(self, dtype: torch.dtype) -> "LayerWeights":
        """A copy with every floating-point tensor in `dtype` (integer hash constants unchanged)."""
        def part(p):
            return None if p is None else cast(p, dtype) if isinstance(p, Tensor) else \
                replace(p, **{f.name: cast(getattr(p, f.name), dtype) for f in fields(p)})

        return replace(self, **{f.name: part(getattr(self, f.name)) for f in fields(self) if f.name != "index"})

    def named_tensors(self) -> dict[str, Tensor]:
        """Flat `part.name -> tensor` view (for comparisons and round-trip tests)."""
        out: dict[str, Tensor] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v
            elif v is not None and f.name != "index":
                out.update({f"{f.name}.{g.name}": getattr(v, g.name) for g in fields(v)})
        return out


_PARTS = {"mixer": MixerWeights, "mlp": MlpWeights, "attn_hc": HcWeights, "mlp_hc": HcWeights, "ple": PleWeights}
INTEGER_WEIGHTS = tuple(f"ple.{n}" for n in PleWeights.INTEGER)  # `named_tensors()` names of the hash constants


def is_float(t: Tensor) -> bool:
    return t.dtype.is_floating_point


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t.to(dtype) if is_float(t) else t
