"""LoRA adapters on the GDN layer's projections: the targets, where each lands in the internal layout, the merged
install (W' = W + scale * B A) and the per-sequence slot update.

A target is a projection by its Hugging Face name (PEFT's `target_modules`). The layer fuses several of them into
one internal projection (`weights.py`: `in_proj` rows [Q | K | V | Z | B | A], `mlp.gate_up` rows [gate | up]), so
each target is a `Site`: an internal projection and the contiguous range of its output rows the target owns.
Qwen3-Next's `in_proj_qkvz` / `in_proj_ba` interleave their rows per key head; their sites are the de-interleaved
ranges [Q | K | V | Z] and [B | A], and an adapter's B (rows = outputs) is de-interleaved with the checkpoint's own
helpers while A (columns = inputs) is untouched.

Per-sequence adapters (`LoraInput`): per target, `max_adapters` device slots of A `[L, R, in]` and B transposed
`[L, R, out]` (scale folded in, ranks zero-padded to R), and a slot index per token `lora_idx [T] int32` (-1 = no
adapter). The update is two plain GEMMs over all slots, in which a token meets no number of another slot:
    u = x @ A_all^T              A_all = a.reshape(L*R, in)     -> [T, L*R]
    u[t, s, :] = 0 unless s == lora_idx[t]     (a select, so a NaN or Inf of another slot's A is dropped)
    y += u @ B_fin               B_fin = b with its non-finite values zeroed, reshaped (L*R, out)
and the tokens of a slot whose B holds a non-finite value get NaN rows of u (the slot's own sequences see that
their adapter is broken; nobody else does). A token's update is then its own slot's product plus exact zeros
(0 x finite), bit-equal to the update with every other slot zeroed. Masking u alone is not enough: 0 x NaN = NaN,
so one NaN in one adapter's B reached every token of the step. The runtime also refuses non-finite adapters at
registration and zeroes a slot when its adapter is unregistered (`runtime/adapters.py`); this guard is what holds
for exported graphs, whose slot inputs anyone may feed.
Why not a per-token gather of each token's A and B (BGMV as standard ops): it materialises [T, R, out] per target
(at decode N=256, R=16 on Qwen3-Next's in_proj that is twice the bytes of the base weight, and gigabytes at prefill
sizes), whereas the masked GEMMs read every slot once (L*R*(in+out) values) and cost L times the minimal FLOPs of
the low-rank product; nor a loop over slots selecting each slot's [T, out] product, which writes L outputs of
[T, out]. Measured on one CPU thread (fp32, in=2048, out=12288, L=4, R=16; 2026-12-03, AMD EPYC): T=256: masked
8.2 ms, masked with the finite guard 10.2 ms, per-slot select 20.3 ms, gather 206 ms (the base x W^T: 202 ms);
T=2048: 107 / 93 / 566 / 1268 ms (base 1218 ms). B is stored transposed per slot so that both GEMMs read the slot
buffers in place.
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import Family, GdnConfig, Shard
from .tp import TpError, in_proj_rows, shard_config
from .weights import LayerWeights


class LoraTarget(str, enum.Enum):
    """The projections of a GDN decoder layer that can carry LoRA, by their Hugging Face module names."""

    IN_PROJ_QKVZ = "in_proj_qkvz"  # Qwen3-Next, rows interleaved per key head
    IN_PROJ_BA = "in_proj_ba"  # Qwen3-Next, rows interleaved per key head
    IN_PROJ_QKV = "in_proj_qkv"
    IN_PROJ_Z = "in_proj_z"
    IN_PROJ_B = "in_proj_b"
    IN_PROJ_A = "in_proj_a"
    OUT_PROJ = "out_proj"
    GATE_PROJ = "gate_proj"
    UP_PROJ = "up_proj"
    DOWN_PROJ = "down_proj"

    @property
    def module(self) -> str:
        """The HF module path of the target inside a decoder layer."""
        return ("mlp." if self in MLP_TARGETS else "linear_attn.") + self.value


MLP_TARGETS = (LoraTarget.GATE_PROJ, LoraTarget.UP_PROJ, LoraTarget.DOWN_PROJ)
_MIXER_TARGETS = {
    Family.QWEN3_NEXT: (LoraTarget.IN_PROJ_QKVZ, LoraTarget.IN_PROJ_BA, LoraTarget.OUT_PROJ),
    Family.QWEN3_5: (LoraTarget.IN_PROJ_QKV, LoraTarget.IN_PROJ_Z, LoraTarget.IN_PROJ_B, LoraTarget.IN_PROJ_A,
                     LoraTarget.OUT_PROJ),
}
_MIXER_TARGETS[Family.QWEN4_EXP] = _MIXER_TARGETS[Family.QWEN3_5]


class Proj(str, enum.Enum):
    """The internal projection weights (`weights.py`) a target lands in."""

    IN_PROJ = "in_proj"  # mixer.in_proj
    OUT_PROJ = "out_proj"  # mixer.out_proj
    GATE_UP = "gate_up"  # mlp.gate_up
    DOWN = "down"  # mlp.down


@dataclass(frozen=True)
class Site:
    """Output rows [lo, hi) of internal projection `proj` (input width `in_dim`) belong to `target`."""

    target: LoraTarget
    proj: Proj
    lo: int
    hi: int
    in_dim: int

    @property
    def out_dim(self) -> int:
        return self.hi - self.lo


def family_targets(cfg: GdnConfig) -> tuple[LoraTarget, ...]:
    """Every target the GDN layers of `cfg` have (the MLP ones only when some GDN layer has a dense MLP)."""
    mlp = any(cfg.has_mlp(i) for i in cfg.gdn_layer_ids)
    return _MIXER_TARGETS[cfg.family] + (MLP_TARGETS if mlp else ())


def sites(cfg: GdnConfig, layer_idx: int) -> dict[LoraTarget, Site]:
    """The targets of GDN layer `layer_idx` and their place in the internal layout."""
    C, HV, I = cfg.hidden_size, cfg.linear_num_value_heads, cfg.intermediate_size
    qkv, z = cfg.conv_dim, cfg.conv_dim + cfg.value_dim
    out: list[Site] = []
    if cfg.family is Family.QWEN3_NEXT:
        out += [Site(LoraTarget.IN_PROJ_QKVZ, Proj.IN_PROJ, 0, z, C),
                Site(LoraTarget.IN_PROJ_BA, Proj.IN_PROJ, z, z + 2 * HV, C)]
    else:
        out += [Site(LoraTarget.IN_PROJ_QKV, Proj.IN_PROJ, 0, qkv, C),
                Site(LoraTarget.IN_PROJ_Z, Proj.IN_PROJ, qkv, z, C),
                Site(LoraTarget.IN_PROJ_B, Proj.IN_PROJ, z, z + HV, C),
                Site(LoraTarget.IN_PROJ_A, Proj.IN_PROJ, z + HV, z + 2 * HV, C)]
    out.append(Site(LoraTarget.OUT_PROJ, Proj.OUT_PROJ, 0, C, cfg.value_dim))
    if cfg.has_mlp(layer_idx):
        out += [Site(LoraTarget.GATE_PROJ, Proj.GATE_UP, 0, I, C), Site(LoraTarget.UP_PROJ, Proj.GATE_UP, I, 2 * I, C),
                Site(LoraTarget.DOWN_PROJ, Proj.DOWN, 0, C, I)]
    return {s.target: s for s in out}


def internal_rows(cfg: GdnConfig, target: LoraTarget, b: Tensor) -> Tensor:
    """An adapter's B `[out, r]` in the HF row order of `target` -> the internal row order of its site."""
    from .checkpoint import deinterleave_ba, deinterleave_qkvz  # checkpoint imports weights; no cycle at call time

    if target is LoraTarget.IN_PROJ_QKVZ:
        return torch.cat(deinterleave_qkvz(b, cfg))
    if target is LoraTarget.IN_PROJ_BA:
        return torch.cat(deinterleave_ba(b, cfg))
    return b


@dataclass(frozen=True)
class LoraWeights:
    """One target of one layer: A `[r, in]`, B `[out, r]` in internal row order, and the scale (alpha/r, or
    alpha/sqrt(r) with rsLoRA)."""

    a: Tensor
    b: Tensor
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]

    def delta(self) -> Tensor:
        """scale * B A in float64 `[out, in]`."""
        return self.scale * (self.b.double() @ self.a.double())


@dataclass(frozen=True, eq=False)  # identity is `digest()`: tensors have no useful ==
class Adapter:
    """One LoRA adapter mapped onto a model's GDN layers: `layers[layer_idx][target]`. `skipped` lists the adapter's
    tensors for modules that run outside gdn-trt (full-attention layers, MoE experts, the LM head)."""

    name: str
    config_hash: str
    layers: Mapping[int, Mapping[LoraTarget, LoraWeights]]
    skipped: tuple[str, ...] = ()
    source: str | None = field(default=None, compare=False)

    @property
    def max_rank(self) -> int:
        return max((w.rank for ts in self.layers.values() for w in ts.values()), default=0)

    @property
    def targets(self) -> frozenset[LoraTarget]:
        return frozenset(t for ts in self.layers.values() for t in ts)

    def check_fits(self, cfg: GdnConfig, limits: "LoraLimits") -> None:
        """Raise ValueError unless the adapter was mapped onto `cfg` and fits the slots of `limits`."""
        if self.config_hash != cfg.config_hash():
            raise ValueError(f"adapter {self.name} was mapped onto config {self.config_hash}; this model is "
                             f"{cfg.name} ({cfg.config_hash()})")
        if self.max_rank > limits.max_rank:
            raise ValueError(f"adapter {self.name} has rank {self.max_rank}, over the configured maximum "
                             f"max_rank={limits.max_rank}")
        extra = sorted(t.value for t in self.targets - set(limits.resolve(cfg)))
        if extra:
            raise ValueError(f"adapter {self.name} targets {extra}, which the adapter slots do not cover "
                             f"(LoraLimits.targets = {[t.value for t in limits.resolve(cfg)]})")

    def digest(self) -> str:
        """Content hash of the mapped weights and scales (identifies the adapter in manifests)."""
        h = hashlib.sha256(self.config_hash.encode())
        for i in sorted(self.layers):
            for t in sorted(self.layers[i], key=lambda t: t.value):
                w = self.layers[i][t]
                h.update(f"{i}.{t.value}.{w.scale!r}.{w.a.dtype}".encode())
                for x in (w.a, w.b):
                    h.update(x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]


# ---- merged install ----
def merge_layer(cfg: GdnConfig, lw: LayerWeights, adapter: Adapter) -> LayerWeights:
    """New weights of one layer with W' = W + scale * B A on every target of `adapter` (computed in float64, stored
    in W's dtype); `lw` is not modified."""
    if adapter.config_hash != cfg.config_hash():
        raise ValueError(f"adapter {adapter.name} was mapped onto config {adapter.config_hash}, not {cfg.name}")
    targets = adapter.layers.get(lw.index, {})
    if not targets:
        return lw
    where = sites(cfg, lw.index)
    deltas: dict[Proj, Tensor] = {}
    for t, w in targets.items():
        s = where[t]
        base = _proj(lw, s.proj)
        d = deltas.setdefault(s.proj, torch.zeros(base.shape, dtype=torch.float64, device=base.device))
        d[s.lo:s.hi] += w.delta().to(base.device)
    new = {p: (_proj(lw, p).double() + d).to(_proj(lw, p).dtype) for p, d in deltas.items()}
    mixer = replace(lw.mixer, **{p.value: new[p] for p in (Proj.IN_PROJ, Proj.OUT_PROJ) if p in new})
    mlp = lw.mlp
    if Proj.GATE_UP in new or Proj.DOWN in new:
        mlp = replace(lw.mlp, gate_up=new.get(Proj.GATE_UP, lw.mlp.gate_up), down=new.get(Proj.DOWN, lw.mlp.down))
    return replace(lw, mixer=mixer, mlp=mlp)


def _proj(lw: LayerWeights, p: Proj) -> Tensor:
    return {Proj.IN_PROJ: lambda: lw.mixer.in_proj, Proj.OUT_PROJ: lambda: lw.mixer.out_proj,
            Proj.GATE_UP: lambda: lw.mlp.gate_up, Proj.DOWN: lambda: lw.mlp.down}[p]()


# ---- tensor parallelism (model/tp.py) ----
def shard_adapter(adapter: Adapter, cfg: GdnConfig, shard: Shard) -> Adapter:
    """Rank `shard`'s part of an adapter mapped onto the whole model `cfg`, as PEFT / vLLM's parallel LoRA layers
    split it: column-parallel targets keep A and take the rank's rows of B (its heads' rows in the rank's internal
    order), the row-parallel `out_proj` and `down_proj` take the rank's input columns of A and keep B. The result
    fits the rank's config (`Adapter.check_fits`, `build_slots`, `merge_layer`)."""
    if adapter.config_hash != cfg.config_hash():
        raise TpError(f"adapter {adapter.name} was mapped onto config {adapter.config_hash}, not {cfg.name} "
                      f"({cfg.config_hash()}): load it for the whole model, then shard it")
    rank_cfg = shard_config(cfg, shard)
    if shard.size == 1:
        return adapter
    layers = {i: {t: _shard_lora(cfg, shard, sites(cfg, i)[t], w) for t, w in ts.items()}
              for i, ts in adapter.layers.items()}
    return Adapter(adapter.name, rank_cfg.config_hash(), layers, adapter.skipped, adapter.source)


def _shard_lora(cfg: GdnConfig, shard: Shard, site: Site, w: LoraWeights) -> LoraWeights:
    if site.proj in (Proj.OUT_PROJ, Proj.DOWN):  # row-parallel
        a, b = shard.part(site.in_dim)
        return LoraWeights(w.a[:, a:b].contiguous(), w.b, w.scale)
    if site.proj is Proj.GATE_UP:
        a, b = shard.part(site.out_dim)
        return LoraWeights(w.a, w.b[a:b].clone(), w.scale)
    rows = in_proj_rows(cfg, shard)
    keep = rows[(rows >= site.lo) & (rows < site.hi)] - site.lo
    return LoraWeights(w.a, w.b[keep], w.scale)


# ---- per-sequence slots ----
@dataclass(frozen=True)
class LoraLimits:
    """Per-sequence adapters of exported graphs and sessions.

    Args:
        max_adapters: device adapter slots (distinct adapters in one step).
        max_rank: R, the rank every slot is padded to; adapters of higher rank are refused.
        targets: HF target names the slots cover; () = every target of the model's family.
    """

    max_adapters: int = 4
    max_rank: int = 16
    targets: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in ("max_adapters", "max_rank"):
            if getattr(self, f) < 1:
                raise ValueError(f"LoraLimits.{f} must be >= 1, got {getattr(self, f)}")
        known = {t.value for t in LoraTarget}
        bad = [t for t in self.targets if t not in known]
        if bad:
            raise ValueError(f"LoraLimits.targets: unknown targets {bad}; known: {sorted(known)}")
        object.__setattr__(self, "targets", tuple(str(t) for t in self.targets))

    def resolve(self, cfg: GdnConfig) -> tuple[LoraTarget, ...]:
        """The targets of `cfg` these limits cover; a target `cfg`'s family does not have is an error."""
        have = family_targets(cfg)
        if not self.targets:
            return have
        want = tuple(LoraTarget(t) for t in self.targets)
        bad = [t.value for t in want if t not in have]
        if bad:
            raise ValueError(f"LoRA targets {bad} are not projections of {cfg.name} ({cfg.family.value}); its GDN "
                             f"layers have {[t.value for t in have]}")
        return want

    def layer_sites(self, cfg: GdnConfig, layer_idx: int) -> tuple[Site, ...]:
        """The slot sites of one layer, in internal order (MLP targets only on dense-MLP layers)."""
        where = sites(cfg, layer_idx)
        return tuple(where[t] for t in self.resolve(cfg) if t in where)


@dataclass(frozen=True)
class SlotWeights:
    """Device slots of one target: a `[L, R, in]`, b `[L, R, out]` (B transposed, scale folded, zero-padded)."""

    a: Tensor
    b: Tensor


@dataclass(frozen=True)
class LoraInput:
    """Per-sequence adapters of one step: `idx [T] int32` (slot per token, -1 = none) and the slots per target."""

    idx: Tensor
    slots: Mapping[LoraTarget, SlotWeights]

    @property
    def num_slots(self) -> int:
        return next(iter(self.slots.values())).a.shape[0]


def slot_rows(w: LoraWeights, rank: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """One adapter target as slot rows: a `[R, in]`, b `[R, out]` = (scale * B)^T, ranks r..R zero."""
    if w.rank > rank:
        raise ValueError(f"adapter rank {w.rank} exceeds the slot rank {rank}")
    a = torch.zeros(rank, w.a.shape[1], dtype=torch.float64)
    b = torch.zeros(rank, w.b.shape[0], dtype=torch.float64)
    a[:w.rank] = w.a.double()
    b[:w.rank] = w.scale * w.b.double().T
    return a.to(dtype), b.to(dtype)


def build_slots(cfg: GdnConfig, layer_idx: int, limits: LoraLimits, adapters: Sequence[Adapter | None],
                dtype: torch.dtype) -> dict[LoraTarget, SlotWeights]:
    """Slot weights of one layer with `adapters[s]` in slot s (None = an empty slot); the other slots are zero."""
    if len(adapters) > limits.max_adapters:
        raise ValueError(f"{len(adapters)} adapters for {limits.max_adapters} slots")
    L, R = limits.max_adapters, limits.max_rank
    out = {s.target: SlotWeights(torch.zeros(L, R, s.in_dim, dtype=dtype), torch.zeros(L, R, s.out_dim, dtype=dtype))
           for s in limits.layer_sites(cfg, layer_idx)}
    for k, ad in enumerate(adapters):
        if ad is None:
            continue
        ad.check_fits(cfg, limits)
        for t, w in ad.layers.get(layer_idx, {}).items():
            out[t].a[k], out[t].b[k] = slot_rows(w, R, dtype)
    return out


def slot_delta(x: Tensor, onehot: Tensor, w: SlotWeights) -> Tensor:
    """x `[T, in]`, onehot `[T, L]` (token t uses slot s) -> the low-rank update `[T, out]`; no value of a slot
    reaches a token of another slot (module docstring)."""
    L, R = w.a.shape[0], w.a.shape[1]
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    u = F.linear(x, w.a.reshape(L * R, -1)).reshape(-1, L, R)
    finite = torch.isfinite(w.b)
    b = torch.where(finite, w.b, zero)
    broken = torch.logical_not(finite.reshape(L, -1).all(dim=1))  # [L]
    u = torch.where(onehot[:, :, None], u, zero)
    u = torch.where((onehot & broken)[:, :, None], torch.full((), float("nan"), dtype=x.dtype, device=x.device), u)
    return u.reshape(-1, L * R) @ b.reshape(L * R, -1)


def one_hot(lora: LoraInput) -> Tensor:
    """`[T, L]` bool: token t uses slot s (no column for -1)."""
    slots = torch.arange(lora.num_slots, dtype=lora.idx.dtype, device=lora.idx.device)
    return lora.idx[:, None] == slots[None, :]


def apply_sites(y: Tensor, x: Tensor, onehot: Tensor, lora: LoraInput, where: Sequence[Site]) -> Tensor:
    """y `[T, rows]` = x W^T of one internal projection, plus each site's slot update on its rows."""
    mine = sorted((s for s in where if s.target in lora.slots), key=lambda s: s.lo)
    if not mine:
        return y
    parts, at = [], 0
    for s in mine:
        if s.lo > at:
            parts.append(y[:, at:s.lo])
        parts.append(y[:, s.lo:s.hi] + slot_delta(x, onehot, lora.slots[s.target]))
        at = s.hi
    if at < y.shape[1]:
        parts.append(y[:, at:])
    return torch.cat(parts, dim=-1)


def check_input(lora: LoraInput, where: Mapping[LoraTarget, Site], tokens: int, dtype: torch.dtype) -> None:
    """Shapes and dtypes of a step's LoRA input against the layer's sites (no data access)."""
    if lora.idx.dtype != torch.int32 or lora.idx.dim() != 1:
        raise ValueError(f"lora_idx must be a 1-D int32 tensor, got {lora.idx.dtype} {tuple(lora.idx.shape)}")
    if not lora.slots:
        raise ValueError("a LoRA input needs the slots of at least one target")
    bad = [t.value for t in lora.slots if t not in where]
    if bad:
        raise ValueError(f"LoRA slots for {bad}: this layer's targets are {[t.value for t in where]}")
    L, R = next(iter(lora.slots.values())).a.shape[:2]
    for t, w in lora.slots.items():
        s = where[t]
        for name, x, shape in (("a", w.a, (L, R, s.in_dim)), ("b", w.b, (L, R, s.out_dim))):
            if tuple(x.shape) != shape or x.dtype != dtype:
                raise ValueError(f"LoRA slots {t.value}.{name} must be {dtype} {shape}, got {x.dtype} "
                                 f"{tuple(x.shape)}")
    if not torch.compiler.is_exporting() and lora.idx.shape[0] != tokens:
        raise ValueError(f"lora_idx has {lora.idx.shape[0]} entries for {tokens} tokens")


def check_idx_values(lora: LoraInput) -> None:
    """Slot indices in -1..L-1 (host tensors only: reading a device tensor would sync)."""
    bad = [v for v in lora.idx.tolist() if not -1 <= v < lora.num_slots]
    if bad:
        raise ValueError(f"lora_idx values must be -1 (no adapter) or a slot 0..{lora.num_slots - 1}, got {bad[:8]}")


def non_finite(t: Tensor) -> str | None:
    """None when every value of `t` is finite, else how many are NaN and how many infinite."""
    if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()):
        return f"{int(torch.isnan(t).sum())} NaN and {int(torch.isinf(t).sum())} infinite values"
    return None


def rank_scale(alpha: float, rank: int, rslora: bool) -> float:
    """PEFT's scaling: alpha / r, or alpha / sqrt(r) with use_rslora."""
    return alpha / math.sqrt(rank) if rslora else alpha / rank
