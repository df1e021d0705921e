"""`GraphSpec`: the I/O contract of one exported graph.

For a (config, layer, mode, limits) it declares the ordered graph inputs and outputs (name, dtype, symbolic dims,
role), which output aliases which input, and the optimization-profile buckets (min/opt/max per symbol). The
exporter names the ONNX graph from it, the builder makes one TensorRT profile per bucket, the compare data loader
makes inputs from it, and the runtime checks engine bindings against it and binds every aliased output to the
address of the input it updates.

Symbols: `T` tokens, `N` sequences (`N+1` for cu_seqlens), `S` pool slots. Input order: activations, packing
(cu_seqlens, slots[, capture_at]), pools, then stashes (verify modes) or captures (prefill modes), then, when the
limits enable per-sequence LoRA (`Limits.lora`), `lora_idx [T] int32` (slot per token, -1 = none) and per target
`lora_<target>_a [L, R, in]` / `lora_<target>_b [L, R, out]` (static: L adapter slots of rank R; read only).
Outputs: activations, then the updated buffers in input order, each named `<input>_out` and aliased to its input.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field

import torch

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.dtypes import ACTIVATION_DTYPES, DTYPES
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import SEQS, TOKENS, LayerMode, Split, Writes

SLOTS = "S"


class Variant(str, enum.Enum):
    """Layer variant: residual style and PLE, which decide the activation I/O."""

    PLAIN = "plain"
    HC = "hc"
    HC_PLE = "hc+ple"

    @staticmethod
    def of(cfg: GdnConfig, layer_idx: int) -> "Variant":
        if not cfg.is_hc:
            return Variant.PLAIN
        return Variant.HC_PLE if cfg.has_ple(layer_idx) else Variant.HC


class Role(str, enum.Enum):
    ACTIVATION = "activation"
    INDEX = "index"  # cu_seqlens, slots, capture_at (int32)
    POOL = "pool"  # [S, ...] per-slot state, updated in place by decode and prefill modes
    STASH = "stash"  # [T, ...] state after each token (verify modes)
    CAPTURE = "capture"  # [N, ...] prefix snapshot (prefill modes)
    ADAPTER = "adapter"  # [L, R, ...] LoRA adapter slots (read only, static shape)


@dataclass(frozen=True)
class Limits:
    """Shape limits of the exported graphs and their engines.

    Args:
        max_seqs: N_max, sequences in one multi-sequence step.
        max_tokens: T_max, tokens (all sequences together) in one prefill step.
        max_draft: K_max, tokens per sequence in one verify / batched-decode step.
        pool_slots: S, rows of every state pool.
        seq_buckets / token_buckets: ascending upper bounds splitting N (multi-sequence modes) or T (PREFILL) into
            optimization profiles; the last one must be the maximum; () = one bucket.
        lora: per-sequence LoRA adapter slots as graph inputs (None = graphs without them).
    """

    max_seqs: int = 8
    max_tokens: int = 256
    max_draft: int = 4
    pool_slots: int = 16
    seq_buckets: tuple[int, ...] = ()
    token_buckets: tuple[int, ...] = ()
    lora: LoraLimits | None = None

    def __post_init__(self) -> None:
        for f in ("max_seqs", "max_tokens", "max_draft", "pool_slots"):
            if getattr(self, f) < 1:
                raise ValueError(f"Limits.{f} must be >= 1, got {getattr(self, f)}")
        if self.pool_slots < self.max_seqs:
            raise ValueError(f"pool_slots ({self.pool_slots}) must hold max_seqs ({self.max_seqs}) sequences")
        for name, edges, top in (("seq_buckets", self.seq_buckets, self.max_seqs),
                                 ("token_buckets", self.token_buckets, self.max_tokens)):
            if edges and (list(edges) != sorted(set(edges)) or edges[0] < 1 or edges[-1] != top):
                raise ValueError(f"Limits.{name} must rise strictly from >= 1 to {top}, got {edges}")

    @staticmethod
    def ranges(edges: tuple[int, ...], top: int) -> list[tuple[int, int]]:
        """[(lo, hi)] of the buckets below `top` split at `edges`."""
        ups = list(edges) or [top]
        return [(lo, hi) for lo, hi in zip([1] + [e + 1 for e in ups[:-1]], ups)]


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output. `dims`: ints (static) or symbols `T`, `N`, `N+1`, `S`."""

    name: str
    dtype: str
    dims: tuple[int | str, ...]
    role: Role
    aliases: str | None = None  # outputs: the input this output updates (same shape, dtype and address)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """Concrete shape for symbol values `sizes` (e.g. {"T": 5, "N": 2, "S": 16})."""
        return tuple(d if isinstance(d, int) else _eval_dim(d, sizes) for d in self.dims)


@dataclass(frozen=True)
class Bucket:
    """One optimization profile: (symbol, (min, opt, max)) for every symbol of the graph."""

    ranges: tuple[tuple[str, tuple[int, int, int]], ...]

    def sizes(self, point: int) -> dict[str, int]:
        """point 0 = min, 1 = opt, 2 = max."""
        return {s: r[point] for s, r in self.ranges}

    def contains(self, sizes: dict[str, int]) -> bool:
        return all(r[0] <= sizes[s] <= r[2] for s, r in self.ranges)


@dataclass(frozen=True)
class GraphSpec:
    """The I/O contract of one graph: see the module docstring."""

    model: str
    config_hash: str
    layer_idx: int
    mode: LayerMode
    variant: Variant
    act_dtype: str
    limits: Limits
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    buckets: tuple[Bucket, ...] = field(default=())

    @property
    def stem(self) -> str:
        """File stem of the graph and its engine: `<mode>[+hc][+ple][+lora]`."""
        return (self.mode.value + ("" if self.variant is Variant.PLAIN else "+" + self.variant.value)
                + ("+lora" if self.limits.lora is not None else ""))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)

    @property
    def aliases(self) -> dict[str, str]:
        """output name -> the input name it updates in place."""
        return {t.name: t.aliases for t in self.outputs if t.aliases}

    def input(self, name: str) -> TensorSpec:
        return _find(self.inputs, name, "input")

    def output(self, name: str) -> TensorSpec:
        return _find(self.outputs, name, "output")

    def profile(self, bucket: int = 0) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
        """input name -> (min shape, opt shape, max shape) of one optimization profile."""
        b = self.buckets[bucket]
        return {t.name: tuple(t.shape(b.sizes(p)) for p in range(3)) for t in self.inputs}

    def profiles(self) -> list[dict]:
        return [self.profile(i) for i in range(len(self.buckets))]

    def bucket_for(self, sizes: dict[str, int]) -> int:
        """Index of the first bucket holding `sizes` (symbol -> value); ValueError naming the ranges if none."""
        for i, b in enumerate(self.buckets):
            if b.contains(sizes):
                return i
        raise ValueError(f"{self.stem}: sizes {sizes} are outside every profile: "
                         f"{[dict(b.ranges) for b in self.buckets]}")

    def check_names(self, inputs: list[str], outputs: list[str]) -> None:
        """Raise ValueError naming the missing and extra tensors when a graph's or engine's I/O differs."""
        problems = []
        for what, want, got in (("inputs", self.input_names, inputs), ("outputs", self.output_names, outputs)):
            missing, extra = [n for n in want if n not in got], [n for n in got if n not in want]
            if missing or extra:
                problems.append(f"{what}: missing {missing}, extra {extra}")
        if problems:
            raise ValueError(f"{self.stem} (layer {self.layer_idx}) does not match its GraphSpec: "
                             + "; ".join(problems))

    def to_json(self) -> dict:
        d = asdict(self)
        d["mode"], d["variant"] = self.mode.value, self.variant.value
        d["aliases"] = self.aliases
        return json.loads(json.dumps(d, default=lambda o: o.value if isinstance(o, enum.Enum) else str(o)))

    @staticmethod
    def from_json(d: dict) -> "GraphSpec":
        ts = lambda xs: tuple(TensorSpec(x["name"], x["dtype"], tuple(x["dims"]), Role(x["role"]),  # noqa: E731
                                         x["aliases"]) for x in xs)
        lim = dict(d["limits"])
        lora = lim.pop("lora", None)  # absent in manifests written before LoRA slots existed
        limits = Limits(**{k: tuple(v) if isinstance(v, list) else v for k, v in lim.items()},
                        lora=None if lora is None else LoraLimits(lora["max_adapters"], lora["max_rank"],
                                                                  tuple(lora["targets"])))
        buckets = tuple(Bucket(tuple((s, tuple(r)) for s, r in b["ranges"])) for b in d["buckets"])
        return GraphSpec(d["model"], d["config_hash"], d["layer_idx"], LayerMode(d["mode"]), Variant(d["variant"]),
                         d["act_dtype"], limits, ts(d["inputs"]), ts(d["outputs"]), buckets)


def _eval_dim(d: str, sizes: dict[str, int]) -> int:
    sym, _, add = d.partition("+")
    return sizes[sym] + int(add or 0)


def _find(ts: tuple[TensorSpec, ...], name: str, what: str) -> TensorSpec:
    for t in ts:
        if t.name == name:
            return t
    raise KeyError(f"no graph {what} named {name!r}; have {[t.name for t in ts]}")


def _buckets(mode: LayerMode, lim: Limits) -> tuple[Bucket, ...]:
    """Profiles per mode, split as its `ModeSpec.split` says. opt = the bucket's top: CUDA-graph buckets pad up to
    it, so it is the shape that runs. A free T is bounded by the mode's `token_limit`: max_draft per sequence, or
    max_tokens for the whole step."""
    m = mode.spec
    S = (SLOTS, (1, lim.pool_slots, lim.pool_slots))

    def tokens(seqs: int) -> tuple:  # T of a bucket of up to `seqs` sequences
        top = seqs * lim.max_draft if m.token_limit == "max_draft" else lim.max_tokens
        return ((TOKENS, (1, top, top)),) if m.tokens == TOKENS else ()

    if m.split is Split.TOKENS:
        return tuple(Bucket(((TOKENS, (lo, hi, hi)), S)) for lo, hi in Limits.ranges(lim.token_buckets,
                                                                                          lim.max_tokens))
    if m.split is Split.SEQS:
        return tuple(Bucket(((SEQS, (lo, hi, hi)), *tokens(hi), S))
                     for lo, hi in Limits.ranges(lim.seq_buckets, lim.max_seqs))
    return (Bucket((*tokens(1), S)),)


def graph_spec(cfg: GdnConfig, layer_idx: int, mode: LayerMode, limits: Limits,
               act_dtype: str | None = None) -> GraphSpec:
    """The GraphSpec of GDN layer `layer_idx` of `cfg` in `mode` (activations in `act_dtype`, default cfg.dtype)."""
    if layer_idx not in cfg.gdn_layer_ids:
        raise ValueError(f"layer {layer_idx} is not a GDN layer of {cfg.name}; GDN layers: {cfg.gdn_layer_ids}")
    act = act_dtype or cfg.dtype
    if act not in ACTIVATION_DTYPES:
        raise ValueError(f"activation dtype must be float32, bfloat16 or float16, got {act}")
    variant = Variant.of(cfg, layer_idx)
    T, N = mode.spec.tokens, mode.spec.seqs
    n1 = 2 if N == 1 else f"{SEQS}+1"
    A, I = Role.ACTIVATION, Role.INDEX
    acts = [TensorSpec("x", act, (T, cfg.hidden_size), A), TensorSpec("residual", act, (T, cfg.hidden_size), A)]
    if variant is not Variant.PLAIN:
        acts = [TensorSpec("streams", act, (T, cfg.stream_dim), A)]
    ins = list(acts)
    if variant is Variant.HC_PLE:
        ins.append(TensorSpec("ple_rows", act, (T, cfg.ple_heads, cfg.ple_head_dim), A))
    ins += [TensorSpec("cu_seqlens", "int32", (n1,), I), TensorSpec("slots", "int32", (N,), I)]
    writes = mode.spec.writes
    if writes is Writes.POOLS_CAPTURE:
        ins.append(TensorSpec("capture_at", "int32", (N,), I))
    state = [("conv", act, cfg.conv_state_shape), ("ssm", "float32", cfg.ssm_state_shape)]
    if variant is Variant.HC_PLE:
        state.append(("ple_conv", act, cfg.ple_conv_state_shape))
    pools = [TensorSpec(f"{s}_pool", dt, (SLOTS, *shape), Role.POOL) for s, dt, shape in state]
    ins += pools
    updated = [] if writes is Writes.STASH else list(pools)
    if writes is Writes.STASH:
        updated = [TensorSpec(f"{s}_stash", dt, (T, *shape), Role.STASH) for s, dt, shape in state]
    elif writes is Writes.POOLS_CAPTURE:
        updated += [TensorSpec(f"{s}_capture", dt, (N, *shape), Role.CAPTURE) for s, dt, shape in state]
    ins += [t for t in updated if t.role is not Role.POOL]
    ins += lora_inputs(cfg, layer_idx, limits.lora, act, T)
    outs = [TensorSpec(t.name + "_out", t.dtype, t.dims, A) for t in acts]
    outs += [TensorSpec(t.name + "_out", t.dtype, t.dims, t.role, aliases=t.name) for t in updated]
    return GraphSpec(cfg.name, cfg.config_hash(), layer_idx, mode, variant, act, limits, tuple(ins), tuple(outs),
                     _buckets(mode, limits))


def lora_inputs(cfg: GdnConfig, layer_idx: int, lora: LoraLimits | None, act: str, tokens: int | str
                ) -> list[TensorSpec]:
    """`lora_idx` and the adapter slots of every LoRA target of the layer (none without `lora`)."""
    if lora is None:
        return []
    L, R = lora.max_adapters, lora.max_rank
    out = [TensorSpec("lora_idx", "int32", (tokens,), Role.INDEX)]
    for s in lora.layer_sites(cfg, layer_idx):
        out += [TensorSpec(f"lora_{s.target.value}_a", act, (L, R, s.in_dim), Role.ADAPTER),
                TensorSpec(f"lora_{s.target.value}_b", act, (L, R, s.out_dim), Role.ADAPTER)]
    return out
