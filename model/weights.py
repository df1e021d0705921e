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


@dataclass
class MixerWeights:
    """GDN mixer: in_proj [in_proj_dim, C], conv [conv_dim, W], dt_bias / A_log [HV], norm [V], out_proj [C, HV*V]."""

    in_proj: Tensor
    conv: Tensor
    dt_bias: Tensor
    A_log: Tensor
    norm: Tensor
    out_proj: Tensor

    def check(self, cfg: GdnConfig) -> None:
        HV = cfg.linear_num_value_heads
        for name, shape in (("in_proj", (cfg.in_proj_dim, cfg.hidden_size)),
                            ("conv", (cfg.conv_dim, cfg.linear_conv_kernel_dim)), ("dt_bias", (HV,)),
                            ("A_log", (HV,)), ("norm", (cfg.linear_value_head_dim,)),
                            ("out_proj", (cfg.hidden_size, cfg.value_dim))):
            _check(f"mixer.{name}", getattr(self, name), shape)


@dataclass
class MlpWeights:
    """Dense SwiGLU: gate_up [2I, C] (rows [gate | up]), down [C, I]."""

    gate_up: Tensor
    down: Tensor

    def check(self, cfg: GdnConfig) -> None:
        _check("mlp.gate_up", self.gate_up, (2 * cfg.intermediate_size, cfg.hidden_size))
        _check("mlp.down", self.down, (cfg.hidden_size, cfg.intermediate_size))


@dataclass
class HcWeights:
    """Qwen4-Exp gated residual: norm [n*C] (1+w, grouped by C), down [R, n*C], up [n*C, R], inject [n, n*C]."""

    norm: Tensor
    down: Tensor
    up: Tensor
    inject: Tensor

    def check(self, cfg: GdnConfig) -> None:
        nC, R = cfg.stream_dim, cfg.hc_lowrank
        for name, shape in (("norm", (nC,)), ("down", (R, nC)), ("up", (nC, R)), ("inject", (cfg.hc_count, nC))):
            _check(f"hc.{name}", getattr(self, name), shape)


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

    def check(self, cfg: GdnConfig) -> None:
        nC, E = cfg.stream_dim, cfg.ple_embed_dim
        for name, shape in (("key_proj", (nC, E)), ("value_proj", (cfg.hidden_size, E)), ("norm_key", (nC,)),
                            ("norm_query", (nC,)), ("norm_conv", (nC,)), ("conv", (nC, cfg.ple_conv_kernel_size)),
                            ("multipliers", (cfg.ngram_size,)), ("head_sizes", (cfg.ple_heads,)),
                            ("head_offsets", (cfg.ple_heads,))):
            _check(f"ple.{name}", getattr(self, name), shape, integer=name.startswith(("multipliers", "head_")))


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

    def check(self, cfg: GdnConfig) -> None:
        """Every part the config asks for is present with its shape, and nothing else."""
        i = self.index
        if cfg.layer_types[i] != "linear_attention":
            raise ValueError(f"layer {i} is {cfg.layer_types[i]}, not a GDN layer")
        want = {"mixer": True, "input_norm": not cfg.is_hc, "post_norm": not cfg.is_hc and cfg.has_mlp(i),
                "mlp": cfg.has_mlp(i), "attn_hc": cfg.is_hc, "mlp_hc": cfg.is_hc and cfg.has_mlp(i),
                "ple": cfg.has_ple(i)}
        for name, needed in want.items():
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


def is_float(t: Tensor) -> bool:
    return t.dtype.is_floating_point


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t.to(dtype) if is_float(t) else t
