"""Memory budget: the bytes every runtime buffer takes for the requested limits (named `budget`, not `plan`: a
plan is a TensorRT engine file).

Everything a `Session` allocates is sized here from `GdnConfig` and `RuntimeLimits`: state pools, verify stashes,
prefill capture buffers, CUDA-graph buckets (static I/O plus the activations their private pools keep), PLE staging
and the host row cache; the weights once per layer, since the TensorRT plans take them as inputs bound to the copy the
PyTorch engine holds. `tests/test_runtime_budget.py` checks that the rows equal what a session holds. `Session.open`
computes this budget first and refuses to start, naming the limit to lower, when it does not fit the device;
`gdn-trt budget` (`gdn_trt.app.cli`) prints the same table. Under tensor parallelism the budget is one rank's
(`budget(..., tp=N)`, or the config of a rank): its heads' weights and state, the replicated parts whole
(`model/tp.py`); every rank needs the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from gdn_trt.model.config import GdnConfig, Shard
from gdn_trt.model.dtypes import DTYPES
from gdn_trt.model.errors import GdnTrtError
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.tp import shard_config

GiB = 1 << 30
RING = 4  # pinned host buffers of a step's index data (pack.PackBuffers)


def pack_bytes(max_seqs: int, max_tokens: int) -> tuple[int, int]:
    """(device, host) bytes of a session's step index buffer (`pack.PackBuffers`: slots 2S, cu S+2, capture points
    S, LoRA slots per token, the graph io words (6, 8-byte aligned), an accept's fold pairs 2S; the constant 0..S
    for decode; RING host copies)."""
    size = 4 * max_seqs + 2 + max_tokens
    size += size % 2 + 6 + 2 * max_seqs
    return 4 * (size + max_seqs + 1), 4 * RING * size


@dataclass(frozen=True)
class RuntimeLimits:
    """What a session must hold at once.

    Args:
        max_seqs: live sequences (pool slots per layer); also the largest decode batch.
        max_prefill_tokens: tokens of one prefill step, all sequences together.
        max_draft: draft tokens per sequence in one verify step.
        graph_buckets: decode batch sizes captured as CUDA graphs; () = powers of two up to max_seqs, and max_seqs.
        ple_cache_rows: rows of the PLE host cache (hot n-gram rows kept in RAM), per PLE layer.
        lora: per-sequence LoRA adapter slots (None = no per-sequence adapters).
    """

    max_seqs: int = 64
    max_prefill_tokens: int = 4096
    max_draft: int = 4
    graph_buckets: tuple[int, ...] = ()
    ple_cache_rows: int = 4096
    lora: LoraLimits | None = None

    def __post_init__(self) -> None:
        for name in ("max_seqs", "max_prefill_tokens", "max_draft", "ple_cache_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"RuntimeLimits.{name} must be >= 1, got {getattr(self, name)}")
        bad = [b for b in self.graph_buckets if not 1 <= b <= self.max_seqs]
        if bad:
            raise ValueError(f"graph buckets {bad} outside 1..max_seqs={self.max_seqs}")

    @property
    def max_verify_tokens(self) -> int:
        return self.max_seqs * self.max_draft

    @property
    def max_step_tokens(self) -> int:
        """Token rows of the largest step: a mixed step holds a decode group (padded to at most max_seqs rows), a
        verify and a prefill at once, each group at its own rows (sizes PLE staging and the step's index buffer)."""
        return self.max_seqs + self.max_verify_tokens + self.max_prefill_tokens

    def buckets(self) -> tuple[int, ...]:
        if self.graph_buckets:
            return tuple(sorted(set(self.graph_buckets)))
        out, b = [], 1
        while b < self.max_seqs:
            out.append(b)
            b *= 2
        return tuple(out + [self.max_seqs])


@dataclass(frozen=True)
class BudgetRow:
    item: str
    device: int
    host: int
    limits: tuple[str, ...]  # the limits that scale this row (() = fixed by the model)


@dataclass
class Budget:
    """The budget: one row per buffer family, totals, and the check against the memory available."""

    cfg: GdnConfig
    limits: RuntimeLimits
    rows: list[BudgetRow] = field(default_factory=list)

    @property
    def device_total(self) -> int:
        return sum(r.device for r in self.rows)

    @property
    def host_total(self) -> int:
        return sum(r.host for r in self.rows)

    def check(self, available: int, where: str) -> None:
        """Raise `BudgetError` naming the limit to lower when the device part does not fit `available` bytes."""
        if self.device_total <= available:
            return
        by_limit: dict[str, int] = {}
        for r in self.rows:
            for name in r.limits:
                by_limit[name] = by_limit.get(name, 0) + r.device
        knob = max(by_limit, key=by_limit.get) if by_limit else None
        advice = (f"lower {knob} (it scales {_fmt(by_limit[knob])} of it)" if knob
                  else "the weights alone do not fit: use a larger device")
        raise BudgetError(f"the runtime needs {_fmt(self.device_total)} on {where} but {_fmt(available)} is "
                          f"available: {advice}; limits: {self.limits}")

    def table(self) -> str:
        w = max(len(r.item) for r in self.rows)
        rank = f", per rank of tp={self.cfg.tp_size}" if self.cfg.tp_size > 1 else ""
        lines = [f"memory budget for {self.cfg.name} ({len(self.cfg.gdn_layer_ids)} GDN layers{rank}, hash "
                 f"{self.cfg.config_hash()})",
                 f"{'item':<{w}}  {'device':>10}  {'host':>10}  limit"]
        lines += [f"{r.item:<{w}}  {_fmt(r.device):>10}  {_fmt(r.host):>10}  {', '.join(r.limits) or '-'}"
                  for r in self.rows]
        lines.append(f"{'total':<{w}}  {_fmt(self.device_total):>10}  {_fmt(self.host_total):>10}")
        return "\n".join(lines)


class BudgetError(GdnTrtError, RuntimeError):
    """The requested limits do not fit the device; the message names the limit to lower."""


def slot_bytes(cfg: GdnConfig, act_dtype: str) -> int:
    """Bytes of one sequence's state over all GDN layers: conv + fp32 ssm (+ PLE conv carry)."""
    a = DTYPES[act_dtype].itemsize
    total = 0
    for i in cfg.gdn_layer_ids:
        total += _prod(cfg.conv_state_shape) * a + _prod(cfg.ssm_state_shape) * max(4, a)
        if cfg.has_ple(i):
            total += _prod(cfg.ple_conv_state_shape) * a
    return total


def token_activation_bytes(cfg: GdnConfig, act_dtype: str) -> int:
    """Peak activation bytes per token of one layer step (an upper estimate: every intermediate of the mixer,
    MLP and hc/PLE parts alive at once, fp32 where the ops compute in fp32)."""
    a = DTYPES[act_dtype].itemsize
    acts = 4 * cfg.stream_dim + cfg.in_proj_dim + 2 * cfg.conv_dim + 3 * cfg.value_dim + 3 * cfg.intermediate_size
    fp32 = 2 * cfg.key_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads
    if cfg.ple_layer_ids:
        acts += 4 * cfg.stream_dim + 2 * cfg.ple_embed_dim
    return acts * a + fp32 * 4


def weight_bytes(cfg: GdnConfig, act_dtype: str) -> int:
    """Parameter bytes of the GDN layers (gate parameters A_log / dt_bias in fp32)."""
    a, C, HV, nC = DTYPES[act_dtype].itemsize, cfg.hidden_size, cfg.linear_num_value_heads, cfg.stream_dim
    total = 0
    for i in cfg.gdn_layer_ids:
        n = cfg.in_proj_dim * C + cfg.conv_dim * cfg.linear_conv_kernel_dim + cfg.linear_value_head_dim
        n += C * cfg.value_dim
        n += 0 if cfg.is_hc else C * (2 if cfg.has_mlp(i) else 1)
        if cfg.has_mlp(i):
            n += 3 * C * cfg.intermediate_size
        hc = nC + 2 * cfg.hc_lowrank * nC + cfg.hc_count * nC
        n += (hc * (2 if cfg.has_mlp(i) else 1)) if cfg.is_hc else 0
        if cfg.has_ple(i):
            n += (nC + C) * cfg.ple_embed_dim + 3 * nC + nC * cfg.ple_conv_kernel_size
            total += (cfg.ngram_size + 2 * cfg.ple_heads) * 8  # int64 hash constants
        total += n * a + 2 * HV * 4
    return total


def lora_slot_bytes(cfg: GdnConfig, lora: LoraLimits, act_dtype: str) -> int:
    """Device bytes of the adapter slots: per layer and target, L x R x (in + out) values. (The registered
    adapters live on the host, one padded copy each, sized by the adapters, not by the limits.)"""
    per = lora.max_adapters * lora.max_rank * DTYPES[act_dtype].itemsize
    return sum(per * (s.in_dim + s.out_dim) for i in cfg.gdn_layer_ids for s in lora.layer_sites(cfg, i))


def budget(cfg: GdnConfig, limits: RuntimeLimits, act_dtype: str, graphs: bool, trt_context: int = 0,
           tp: int = 1, verify_graphs: bool = False) -> Budget:
    """The memory budget of a session over `cfg`'s GDN layers at `limits`, activations in `act_dtype`;
    `trt_context`: the TensorRT plans' shared context memory (`backends.trt_context_budget`), 0 without them;
    `tp` > 1: one rank's budget of the whole model `cfg` split over tp ranks (a `TpError` names the valid sizes);
    `verify_graphs` (with `graphs`): verify steps captured too, at max_draft token rows a bucket sequence."""
    if tp > 1:
        cfg = shard_config(cfg, Shard(tp, 0))  # every rank holds the same amounts
    a, per_slot = DTYPES[act_dtype].itemsize, slot_bytes(cfg, act_dtype)
    per_tok = token_activation_bytes(cfg, act_dtype)
    b = Budget(cfg, limits)
    b.rows.append(BudgetRow("weights", weight_bytes(cfg, act_dtype), 0, ()))
    b.rows.append(BudgetRow(f"state pools ({limits.max_seqs} slots)", limits.max_seqs * per_slot, 0,
                            ("max_seqs",)))
    b.rows.append(BudgetRow(f"verify stash ({limits.max_verify_tokens} tokens)", limits.max_verify_tokens * per_slot,
                            0, ("max_seqs", "max_draft")))
    b.rows.append(BudgetRow(f"prefill capture ({limits.max_seqs} rows)", limits.max_seqs * per_slot, 0,
                            ("max_seqs",)))
    b.rows.append(BudgetRow(f"prefill activations ({limits.max_prefill_tokens} tokens)",
                            limits.max_prefill_tokens * per_tok, 0, ("max_prefill_tokens",)))
    index, index_host = pack_bytes(limits.max_seqs, limits.max_step_tokens)
    zeros = 0 if cfg.is_hc else limits.max_seqs * cfg.hidden_size * a
    b.rows.append(BudgetRow("step buffers (index data, decode zero residual)", index + zeros, index_host,
                            ("max_seqs", "max_prefill_tokens")))
    if graphs:
        toks = sum(limits.buckets())
        io = toks * (cfg.stream_dim * 3 + cfg.hidden_size) * a + toks * 8
        b.rows.append(BudgetRow(f"decode graphs (buckets {list(limits.buckets())})", io + toks * per_tok, 0,
                                ("graph_buckets",) if limits.graph_buckets else ("max_seqs",)))
        if verify_graphs:
            toks *= limits.max_draft  # fixed x and output rows (a torch copy each way) and the activations
            b.rows.append(BudgetRow(f"verify graphs (buckets x {limits.max_draft} drafts)",
                                    toks * (cfg.stream_dim * 2 + cfg.hidden_size) * a + toks * per_tok, 0,
                                    ("graph_buckets" if limits.graph_buckets else "max_seqs", "max_draft")))
    if limits.lora is not None:
        b.rows.append(BudgetRow(f"LoRA slots ({limits.lora.max_adapters} adapters x rank {limits.lora.max_rank})",
                                lora_slot_bytes(cfg, limits.lora, act_dtype), 0,
                                ("lora.max_adapters", "lora.max_rank")))
    if trt_context:
        b.rows.append(BudgetRow("TensorRT context memory (one scratch, every plan)", trt_context, 0, ()))
    ple = [i for i in cfg.gdn_layer_ids if cfg.has_ple(i)]
    if ple:
        row = cfg.ple_embed_dim * a
        staging = len(ple) * limits.max_step_tokens * row
        # host: two staging buffers per layer (pinned on CUDA: the host prepares a step while the last copy is queued)
        b.rows.append(BudgetRow(f"PLE staging ({len(ple)} layers x {limits.max_step_tokens} tokens)", staging,
                                2 * staging, ("max_prefill_tokens",)))
        b.rows.append(BudgetRow(f"PLE host row cache ({limits.ple_cache_rows} rows/layer)", 0,
                                len(ple) * limits.ple_cache_rows * cfg.ple_head_dim * a, ("ple_cache_rows",)))
    return b


def available_memory(device: torch.device) -> int:
    """Free bytes on `device`: CUDA's free memory, or the host's available RAM for the CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_bytes(text: str) -> int:
    """'80GiB', '512MiB', '1.5e9' -> bytes."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": GiB, "tib": 1 << 40, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9}
    t = text.strip().lower()
    for u, m in units.items():
        if t.endswith(u):
            return int(float(t[: -len(u)]) * m)
    return int(float(t))


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _fmt(n: int) -> str:
    for unit, m in (("GiB", GiB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m:
            return f"{n / m:.2f} {unit}"
    return f"{n} B"
