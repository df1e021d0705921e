"""`GraphSpec`: the I/O contract of one exported graph.

For a (config, layer, mode, limits) it declares the ordered graph inputs and outputs (name, dtype, symbolic dims,
role), which output aliases which input, and the optimization-profile buckets (min/opt/max per symbol). The
exporter names the ONNX graph from it, the builder makes one TensorRT profile per bucket, the compare data loader
makes inputs from it, and the runtime checks engine bindings against it and binds every aliased output to the
address of the input it updates.

Symbols: `T` tokens, `N` sequences (`N+1` for cu_seqlens), `S` pool slots. Input order: activations, packing
(cu_seqlens, slots[, capture_at]), pools, then stashes (verify modes) or captures (prefill modes), then, when the
limits enable per-sequence LoRA (`Limits.lora`), `lora_idx [T] int32` (slot per token, -1 = none) and per target
`lora_<target>_a [L, R, in]` / `lora_<target>_b [L, R, out]` (static: L adapter slots of rank R; read only), then
the layer's weights (role weight, static shapes, named as `GdnLayer.weights()` names them, e.g. `mixer.in_proj`;
absent from graphs exported with the weights inside, `--embed-weights`).
Outputs: activations, then the updated buffers in input order, each named `<input>_out` and aliased to its input.

A stack graph runs a run of consecutive GDN layers (`gdn_runs`) in one graph: `layer_ids` lists them, every tensor
of one layer (PLE rows, pools, stashes, captures, adapter slots, weights) is named `l<i>.<name>` and records its
`layer`, and the activations, the packing and `lora_idx` are shared; each group keeps its place in the order above,
layer by layer. A one-layer graph is the stack of its layer with the prefix left out.

A tensor-parallel rank's dense-MLP layer is two graphs per mode (`part`, `model.tp.Part`), the host's all-reduce
between them: the MIXER graph has the layer's I/O with only the weights it reads (all but `mlp.*` and
`norms.post_norm`); the MLP graph takes `x` (the all-reduced mixer output) and `residual` [T, C] and the MLP's
weights, and outputs `x_out` (the rank's partial `down_proj` sum) and `residual_out`. Their stems end in `+mixer` /
`+mlp` (`prefill_varlen+mixer`; not a dot: Polygraphy imports the loader script `<stem>_data.py` as a module, and a
dot in a module name means a package); a graph of a whole layer has no `part` (absent from its JSON).
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field

import torch

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.dtypes import ACTIVATION_DTYPES, DTYPES
from gdn_trt.model.layer import weight_shapes
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import SEQS, TOKENS, LayerMode, Split, Writes
from gdn_trt.model.tp import Part, TpError
from gdn_trt.plugins.spec import AOT_CHAINS, CHUNK_TOKENS, CONV_PREFILL, GDN_CHUNKED, tensor

SLOTS = "S"
CHUNKS = "C"


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
    WEIGHT = "weight"  # a layer's weights (read only, static shape), bound from the runtime's one copy
    SCRATCH = "scratch"  # AOT form: an intermediate between two pass plugins (not graph I/O; TensorRT's activations)


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
    layer: int | None = None  # the GDN layer whose state, rows, slots or weights it is (None: shared)

    @property
    def local(self) -> str:
        """The name within its layer (a stack graph's `l<i>.` prefix removed)."""
        pre = f"l{self.layer}."
        return self.name[len(pre):] if self.layer is not None and self.name.startswith(pre) else self.name

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
    layer_ids: tuple[int, ...] = ()  # the layers the graph runs, in order; () = (layer_idx,)
    aot: bool = False  # the AOT form: multi-kernel ops as chains of pass plugins (`spec.AOT_CHAINS`)
    scratch: tuple[TensorSpec, ...] = ()  # AOT form: the intermediates between the passes (role scratch)
    part: Part | None = None  # one of the two graphs of a rank's dense-MLP layer; None = the whole layer

    def __post_init__(self) -> None:
        if not self.layer_ids:
            object.__setattr__(self, "layer_ids", (self.layer_idx,))
        if self.layer_ids[0] != self.layer_idx:
            raise ValueError(f"GraphSpec: layer_idx {self.layer_idx} must be the first of layer_ids {self.layer_ids}")

    @property
    def is_stack(self) -> bool:
        return len(self.layer_ids) > 1

    @property
    def where(self) -> str:
        """'layer 3' or 'layers 3-5' (logs and summaries)."""
        return f"layers {self.layer_ids[0]}-{self.layer_ids[-1]}" if self.is_stack else f"layer {self.layer_idx}"

    @property
    def folder(self) -> str:
        """The folder of the graph's files in an export or engines folder: `layer<i>` or `stack<first>-<last>`."""
        return f"stack{self.layer_ids[0]}-{self.layer_ids[-1]}" if self.is_stack else f"layer{self.layer_idx}"

    @property
    def weights_inside(self) -> bool:
        """True when the weights are initializers of the graph (exported with --embed-weights), not inputs."""
        return not any(t.role is Role.WEIGHT for t in self.inputs)

    @property
    def stem(self) -> str:
        """File stem of the graph and its engine: `<mode>[+hc][+ple][+lora][+mixer|+mlp]`."""
        return (self.mode.value + ("" if self.variant is Variant.PLAIN else "+" + self.variant.value)
                + ("+lora" if self.limits.lora is not None else "") + ("" if self.part is None else
                                                                       "+" + self.part.value))

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
            raise ValueError(f"{self.stem} ({self.where}) does not match its GraphSpec: "
                             + "; ".join(problems))

    def to_json(self) -> dict:
        d = asdict(self)
        d["mode"], d["variant"] = self.mode.value, self.variant.value
        if not self.aot:  # the JIT form's JSON as before the AOT form existed
            del d["aot"], d["scratch"]
        if self.part is None:  # a whole layer's JSON as before part graphs existed
            del d["part"]
        d["aliases"] = self.aliases
        return json.loads(json.dumps(d, default=lambda o: o.value if isinstance(o, enum.Enum) else str(o)))

    @staticmethod
    def from_json(d: dict) -> "GraphSpec":
        ts = lambda xs: tuple(TensorSpec(x["name"], x["dtype"], tuple(x["dims"]), Role(x["role"]),  # noqa: E731
                                         x["aliases"], x.get("layer")) for x in xs)
        lim = dict(d["limits"])
        lora = lim.pop("lora", None)  # absent in manifests written before LoRA slots existed
        limits = Limits(**{k: tuple(v) if isinstance(v, list) else v for k, v in lim.items()},
                        lora=None if lora is None else LoraLimits(lora["max_adapters"], lora["max_rank"],
                                                                  tuple(lora["targets"])))
        buckets = tuple(Bucket(tuple((s, tuple(r)) for s, r in b["ranges"])) for b in d["buckets"])
        return GraphSpec(d["model"], d["config_hash"], d["layer_idx"], LayerMode(d["mode"]), Variant(d["variant"]),
                         d["act_dtype"], limits, ts(d["inputs"]), ts(d["outputs"]), buckets,
                         tuple(d.get("layer_ids") or (d["layer_idx"],)),  # absent before stack graphs existed
                         bool(d.get("aot", False)), ts(d.get("scratch", ())),
                         Part(d["part"]) if d.get("part") else None)


def _eval_dim(d: str, sizes: dict[str, int]) -> int:
    if d == CHUNKS:  # chunk slots of the AOT passes: ceil(T / 64) + 2 N (N = 1 where the mode fixes it)
        return -(-sizes[TOKENS] // CHUNK_TOKENS) + 2 * sizes.get(SEQS, 1)
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


def gdn_runs(cfg: GdnConfig, ids: tuple[int, ...] | None = None) -> list[tuple[int, ...]]:
    """The maximal runs of consecutive GDN layers among `ids` (default: all of `cfg`) that nothing of the host's
    separates, in order: one stack graph (one enqueue per step) can run each. A run ends where the next GDN layer
    is not the next decoder layer (an attention layer, or a layer left out of `ids`, lies between) and after a GDN
    layer without a dense MLP: that decoder layer's FFN (Qwen3-Next's and Qwen4-Exp's MoE) runs in the host
    between the two mixers, so fusing across it would skip it."""
    ids = tuple(cfg.gdn_layer_ids if ids is None else ids)
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1 and cfg.has_mlp(runs[-1][-1]):
            runs[-1].append(i)
        else:
            runs.append([i])
    return [tuple(r) for r in runs]


def _check_layers(cfg: GdnConfig, ids: tuple[int, ...], limits: Limits, part: Part | None) -> None:
    bad = [i for i in ids if i not in cfg.gdn_layer_ids]
    if bad or not ids:
        raise ValueError(f"layer {bad[0] if bad else ids} is not a GDN layer of {cfg.name}; GDN layers: "
                         f"{cfg.gdn_layer_ids}")
    if cfg.tp_size > 1:
        check_rank_graph(cfg, ids, limits.lora)
    if part not in rank_parts(cfg, ids[0]):
        raise TpError(f"layer {ids[0]} of {cfg.name}" + (f" (rank {cfg.tp_rank} of tp={cfg.tp_size})" if
                      cfg.tp_size > 1 else "") + f" has the graphs {[p and p.value for p in rank_parts(cfg, ids[0])]}"
                      f" per mode (None = the whole layer), not {part and part.value}")
    if len(ids) > 1 and gdn_runs(cfg, ids) != [ids]:
        raise ValueError(f"layers {list(ids)} of {cfg.name} are not one run of consecutive GDN layers with nothing "
                         f"of the host's between them (runs of this config: {gdn_runs(cfg)})")


def check_rank_graph(cfg: GdnConfig, ids: tuple[int, ...], lora: LoraLimits | None = None) -> None:
    """A tensor-parallel rank's graph holds no collective: one layer whose last all-reduce is left to the host (the
    graph outputs the rank's partial sum), a dense-MLP layer as two part graphs (`rank_parts`) with the host's
    all-reduce between them. `TpError` for a stack (an all-reduce between its layers), and for a dense-MLP layer
    of an hc model (no family has one) or with LoRA slots (`lora`; the part graphs take no adapter slots yet)."""
    if len(ids) > 1:
        raise TpError(f"rank {cfg.tp_rank} of tp={cfg.tp_size}: a stack graph of layers {list(ids)} would need an "
                      "all-reduce between its layers; export per-layer graphs (no --stack) at tp > 1")
    if cfg.has_mlp(ids[0]) and cfg.is_hc:
        raise TpError(f"layer {ids[0]} of {cfg.name}: an hc layer with a dense MLP has no part graphs at tp > 1")
    if cfg.has_mlp(ids[0]) and lora is not None:
        raise TpError(f"layer {ids[0]} of {cfg.name} has a dense MLP: at tp={cfg.tp_size} it is exported as two part "
                      "graphs (mixer, mlp), which take no per-sequence LoRA slots yet; export without --lora-slots "
                      "(a merged --adapter works)")


def rank_parts(cfg: GdnConfig, layer_idx: int) -> tuple[Part | None, ...]:
    """The graphs of one layer and mode: (None,) = the whole layer; a tensor-parallel rank's dense-MLP layer:
    (MIXER, MLP), the host's all-reduce between them (its first reduction feeds the post-attention RMSNorm)."""
    return (Part.MIXER, Part.MLP) if cfg.tp_size > 1 and cfg.has_mlp(layer_idx) else (None,)


def _is_mlp_weight(name: str) -> bool:
    """A weight of the MLP part graph (the post-attention RMSNorm and the MLP); the rest are the MIXER graph's."""
    return name.startswith("mlp.") or name == "norms.post_norm"


@dataclass(frozen=True)
class _LayerIo:
    """One layer's tensors of a graph, by group (each group keeps its place in the input order)."""

    ple: list[TensorSpec]
    pools: list[TensorSpec]
    buffers: list[TensorSpec]  # stashes (verify) or captures (prefill)
    updated: list[TensorSpec]  # the inputs this mode writes, in input order
    lora: list[TensorSpec]
    weights: list[TensorSpec]


def _layer_io(cfg: GdnConfig, i: int, mode: LayerMode, limits: Limits, act: str, names: "_Names") -> _LayerIo:
    T, N = mode.spec.tokens, mode.spec.seqs
    pre, ple = names.prefix(i), cfg.has_ple(i)
    state = [("conv", act, cfg.conv_state_shape), ("ssm", "float32", cfg.ssm_state_shape)]
    if ple:
        state.append(("ple_conv", act, cfg.ple_conv_state_shape))
    pools = [TensorSpec(f"{pre}{s}_pool", dt, (SLOTS, *shape), Role.POOL, layer=i) for s, dt, shape in state]
    writes = mode.spec.writes
    buffers = []
    if writes is Writes.STASH:
        buffers = [TensorSpec(f"{pre}{s}_stash", dt, (T, *shape), Role.STASH, layer=i) for s, dt, shape in state]
    elif writes is Writes.POOLS_CAPTURE:
        buffers = [TensorSpec(f"{pre}{s}_capture", dt, (N, *shape), Role.CAPTURE, layer=i) for s, dt, shape in state]
    updated = buffers if writes is Writes.STASH else pools + buffers
    weights = []
    if names.weights:
        weights = [TensorSpec(pre + n, "float32" if gate else act, shape, Role.WEIGHT, layer=i)
                   for n, (shape, gate) in weight_shapes(cfg, i).items()]
    return _LayerIo([TensorSpec(f"{pre}ple_rows", act, (T, cfg.ple_heads, cfg.ple_head_dim), Role.ACTIVATION,
                                layer=i)] if ple else [],
                    pools, buffers, updated, lora_slots(cfg, i, limits.lora, act, pre), weights)


@dataclass(frozen=True)
class _Names:
    stack: bool
    weights: bool

    def prefix(self, i: int) -> str:
        return f"l{i}." if self.stack else ""


def graph_spec(cfg: GdnConfig, layers: int | tuple[int, ...], mode: LayerMode, limits: Limits,
               act_dtype: str | None = None, weights: bool = True, aot: bool = False, part: Part | None = None
               ) -> GraphSpec:
    """The GraphSpec of GDN layer `layers` of `cfg` in `mode` (activations in `act_dtype`, default cfg.dtype), or,
    for a tuple of two or more layers (one run of `gdn_runs`), of their stack graph: the layers in order, each
    one's tensors named `l<i>.<name>`, the activations, packing and `lora_idx` shared. `weights`: the layers'
    weights as graph inputs (role weight, static shapes, last), bound by the runtime from its one copy of each
    layer; False = inside the graph as initializers (`gdn-trt export --embed-weights`). `aot`: the AOT form, whose
    multi-kernel ops are chains of pass plugins; `scratch` then lists their intermediates (`scratch_tensors`).
    `part`: one of a rank's dense-MLP layer's two graphs (`rank_parts`; the module docstring)."""
    ids = (layers,) if isinstance(layers, int) else tuple(layers)
    _check_layers(cfg, ids, limits, part)
    act = act_dtype or cfg.dtype
    if act not in ACTIVATION_DTYPES:
        raise ValueError(f"activation dtype must be float32, bfloat16 or float16, got {act}")
    names = _Names(len(ids) > 1, weights)
    variant = max((Variant.of(cfg, i) for i in ids), key=list(Variant).index)
    T, N = mode.spec.tokens, mode.spec.seqs
    n1 = 2 if N == 1 else f"{SEQS}+1"
    A, I = Role.ACTIVATION, Role.INDEX
    acts = [TensorSpec("x", act, (T, cfg.hidden_size), A), TensorSpec("residual", act, (T, cfg.hidden_size), A)]
    if variant is not Variant.PLAIN:
        acts = [TensorSpec("streams", act, (T, cfg.stream_dim), A)]
    per = [_layer_io(cfg, i, mode, limits, act, names) for i in ids]
    if part is not None:
        return _part_spec(cfg, ids[0], mode, limits, act, part, acts, per[0], aot)
    ins = acts + [t for p in per for t in p.ple]
    ins += [TensorSpec("cu_seqlens", "int32", (n1,), I), TensorSpec("slots", "int32", (N,), I)]
    if mode.spec.writes is Writes.POOLS_CAPTURE:
        ins.append(TensorSpec("capture_at", "int32", (N,), I))
    ins += [t for p in per for t in p.pools] + [t for p in per for t in p.buffers]
    if limits.lora is not None:
        ins.append(TensorSpec("lora_idx", "int32", (T,), I))
    ins += [t for p in per for t in p.lora] + [t for p in per for t in p.weights]
    outs = [TensorSpec(t.name + "_out", t.dtype, t.dims, A) for t in acts]
    if cfg.tp_size > 1:  # the rank's partial sum and the replicated rest: hidden = all_reduce(x_out) + residual_out
        outs = [TensorSpec(n, act, (T, cfg.stream_dim), A) for n in ("x_out", "residual_out")]
    outs += [TensorSpec(t.name + "_out", t.dtype, t.dims, t.role, aliases=t.name, layer=t.layer)
             for p in per for t in p.updated]
    scratch = tuple(t for p in per for t in scratch_tensors(cfg, p.pools, act)) if aot and \
        mode.spec.writes is Writes.POOLS_CAPTURE else ()
    return GraphSpec(cfg.name, cfg.config_hash(), ids[0], mode, variant, act, limits, tuple(ins), tuple(outs),
                     _buckets(mode, limits), ids, aot, scratch)


def _part_spec(cfg: GdnConfig, i: int, mode: LayerMode, limits: Limits, act: str, part: Part,
               acts: list[TensorSpec], io: _LayerIo, aot: bool = False) -> GraphSpec:
    """The GraphSpec of one part graph (`part`) of rank layer `i` in `mode`: see the module docstring. The MLP graph
    keeps the mode's profiles (its T is the mode's), though it takes no packing or state."""
    T, N = mode.spec.tokens, mode.spec.seqs
    outs = [TensorSpec(n, act, (T, cfg.hidden_size), Role.ACTIVATION) for n in ("x_out", "residual_out")]
    weights = [t for t in io.weights if _is_mlp_weight(t.name) == (part is Part.MLP)]
    if part is Part.MLP:
        ins = acts + weights
    else:
        ins = [*acts, TensorSpec("cu_seqlens", "int32", (2 if N == 1 else f"{SEQS}+1",), Role.INDEX),
               TensorSpec("slots", "int32", (N,), Role.INDEX)]
        if mode.spec.writes is Writes.POOLS_CAPTURE:
            ins.append(TensorSpec("capture_at", "int32", (N,), Role.INDEX))
        ins += io.pools + io.buffers + weights
        outs += [TensorSpec(t.name + "_out", t.dtype, t.dims, t.role, aliases=t.name, layer=t.layer)
                 for t in io.updated]
    scratch = tuple(scratch_tensors(cfg, io.pools, act)) if aot and part is Part.MIXER and \
        mode.spec.writes is Writes.POOLS_CAPTURE else ()
    return GraphSpec(cfg.name, cfg.config_hash(), i, mode, Variant.PLAIN, act, limits, tuple(ins), tuple(outs),
                     _buckets(mode, limits), (i,), aot, scratch, part)


def scratch_tensors(cfg: GdnConfig, pools: list[TensorSpec], act: str) -> list[TensorSpec]:
    """The intermediates of a prefill mode's pass chains in one layer (AOT form): per pool, those of the op that
    updates it (the ssm pool's chunked GDN op, each conv pool's conv prefill), named `<pool stem>.<name>`
    (`ssm.rk`, `l1.ple_conv.y_part`): the passes' outputs that are not the op's, shaped by `spec.TENSORS`."""
    HV, K, V = cfg.ssm_state_shape
    out = []
    for pool in pools:
        stem = pool.name.removesuffix("_pool")
        op = GDN_CHUNKED if pool.local == "ssm_pool" else CONV_PREFILL
        sizes = {"H": cfg.linear_num_key_heads, "HV": HV, "K": K, "V": V, "D": pool.dims[-1]}
        names = [o for p in AOT_CHAINS[op] for o in p.outputs if o not in op.outputs]
        for n in names:
            dims, dt = tensor(n)
            shape = tuple(int(d) if d.isdigit() else sizes.get(d, d) for d in dims)
            out.append(TensorSpec(f"{stem}.{n}", act if dt == "act" else dt, shape, Role.SCRATCH, layer=pool.layer))
    return out


def lora_slots(cfg: GdnConfig, layer_idx: int, lora: LoraLimits | None, act: str, prefix: str = ""
               ) -> list[TensorSpec]:
    """The adapter slots of every LoRA target of the layer: `<prefix>lora_<target>_a [L, R, in]` and `_b [L, R,
    out]` (none without `lora`); `lora_idx`, shared by the layers of a stack, is not among them."""
    if lora is None:
        return []
    L, R = lora.max_adapters, lora.max_rank
    out = []
    for s in lora.layer_sites(cfg, layer_idx):
        out += [TensorSpec(f"{prefix}lora_{s.target.value}_a", act, (L, R, s.in_dim), Role.ADAPTER, layer=layer_idx),
                TensorSpec(f"{prefix}lora_{s.target.value}_b", act, (L, R, s.out_dim), Role.ADAPTER, layer=layer_idx)]
    return out
