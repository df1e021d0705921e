"""`Session`: the public runtime API over the GDN layers of a model, owning all of their state.

    sess = Session.open("path/to/checkpoint", device="cuda", max_seqs=64)
    a, b = sess.add_sequence(), sess.add_sequence()           # a slot in every GDN layer, zeroed
    with sess.begin_step([a, b], "prefill", lengths=[5, 3]) as step:    # one step of a set of sequences
        ... y = step.mixer(i, normed_hidden) ...              # each GDN layer where the host's forward reaches it
    with sess.begin_step(np.array([a, b]), "decode") as step:
        y = step.run(x)                                       # a GDN-only stack: every layer (CUDA graph per bucket)
    sess.accept({a: j})                                       # after a verify step: keep j draft tokens
    blob = sess.snapshot(a); c = sess.restore(blob); sess.release(a)
    outs = sess.decode({a: h1})                               # the dict API: the same step, inputs by sequence

Per-sequence LoRA adapters (`RuntimeLimits.lora` sets the device adapter slots):
    sess.register_adapter("math", "adapters/math")            # a PEFT directory or a loaded `Adapter`, kept on the host
    seq = sess.add_sequence(adapter="math")                   # every step of seq applies it (uploaded on first use)
A merged adapter instead: `Session.open(merge_checkpoint(load_checkpoint(dir), load_adapter(lora, cfg)))`.

Every call validates all of its input before touching any state: a bad call raises and changes nothing.

What `Session.open` accepts as a model: an HF checkpoint directory, a loaded `Checkpoint`, a preset name or a
`GdnConfig` (the last two get deterministic synthetic weights made in memory, and PLE row tables written to a
temporary directory, since the prestage memory-maps its table from a file).
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.checkpoint import (PLE_META, Checkpoint, PleTable, load_checkpoint, random_layer,
                                     weights_digest)
from gdn_trt.model.config import PRESETS, GdnConfig, Shard
from gdn_trt.model.devices import DeviceError, resolve_device  # noqa: F401 (DeviceError: what open raises)
from gdn_trt.model.dtypes import DTYPES, dtype_name
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import Adapter
from gdn_trt.model.ngram import NgramTable
from gdn_trt.model.peft import load_adapter
from gdn_trt.model.state import BufferSpec
from gdn_trt.model.tp import TpSpec, full_config

from .adapters import AdapterError, AdapterSlots
from .backends import build_engines, trt_context_budget
from .budget import RuntimeLimits, available_memory, budget
from .engine import Engine
from .graphs import GraphCache
from .guard import Guard, guarded
from .plans import PlanMatch
from .ple.feeds import PleFeeds
from .select import GraphPolicy, Selector
from . import request
from .dictapi import accept, dict_step
from .pack import PackBuffers
from .seqs import Prompt, SeqTable, StepResult, as_seq_ids
from .stack import Stack, StepBuffers
from .state import SlotState, SnapshotError, StatePool
from .stats import SessionStats
from .parts import StepParts
from .steps import Step, StepError, open_step
from .tp import RankTp, load_rank, shard_of

log = logging.getLogger("gdn_trt.runtime")


Source = str | Path | Checkpoint | GdnConfig


def act_dtype(cfg: GdnConfig, device: torch.device) -> torch.dtype:
    """The activation dtype a session computes in: fp32 on the CPU (the reference ops), the config's on CUDA."""
    return torch.float32 if device.type == "cpu" else DTYPES[cfg.dtype]


def load_source(src: Source, seed: int = 0, shard: Shard | None = None
                ) -> tuple[Checkpoint, tempfile.TemporaryDirectory | None]:
    """The checkpoint of `src` and, for synthetic models with PLE, the temporary directory holding their tables
    (keep it alive as long as the checkpoint is used). `shard`: a checkpoint directory is read for that
    tensor-parallel rank only (the other sources come whole: `runtime/tp.py` cuts them)."""
    if isinstance(src, Checkpoint):
        return src, None
    if isinstance(src, str) and src in PRESETS:
        src = PRESETS[src]
    if isinstance(src, GdnConfig):
        return synthetic(src, seed)
    path = Path(src)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{src!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a checkpoint "
                                "directory with a config.json")
    return load_checkpoint(path, shard), None


def synthetic(cfg: GdnConfig, seed: int) -> tuple[Checkpoint, tempfile.TemporaryDirectory | None]:
    """Deterministic random weights of `cfg` in memory (the same generator as `make_synthetic_checkpoint`)."""
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[cfg.dtype]
    layers, tables, tmp = [], {}, None
    for i in cfg.gdn_layer_ids:
        lw = random_layer(cfg, i, gen)
        for part in lw.named_tensors().values():
            if part.dtype.is_floating_point:
                part.data = part.data.to(dtype)
        layers.append(lw)
        if cfg.has_ple(i):
            tmp = tmp or tempfile.TemporaryDirectory(prefix="gdn-trt-ple-")
            t = NgramTable.for_layer(cfg, i)
            path = Path(tmp.name) / f"ple_table.layer{i}.bin"
            torch.randn(t.rows, t.dim, generator=gen).to(dtype).view(torch.uint8).numpy().tofile(path)
            tables[i] = PleTable(path, t.rows, t.dim, cfg.dtype)
    if tmp is not None:
        meta = {str(i): {"file": t.path.name, "rows": t.rows, "dim": t.dim, "dtype": t.dtype}
                for i, t in tables.items()}
        (Path(tmp.name) / PLE_META).write_text(json.dumps(meta))
    return Checkpoint(cfg, layers, tables, None), tmp


@dataclass(frozen=True)
class SessionOptions:
    """Args:
        limits: buffer sizes (max_seqs, max_prefill_tokens, max_draft, graph buckets, PLE cache rows).
        dtype: activation dtype; None = fp32 on the CPU, the config's dtype on CUDA.
        graphs: capture decode steps as CUDA graphs where no layer vetoes (CUDA only).
        verify_graphs: capture verify steps too, each padded to a bucket of sequences with max_draft token rows a
            sequence (`select.GraphPolicy`): a graph per bucket, whose activations the budget counts. None (the
            default) follows `graphs`; True needs `graphs`.
        ple_hoisted: PLE rows are staged when a step opens either way; False makes PLE layers veto the runtime's
            decode capture (graph segments around them: the layout before the step context, kept to compare).
        memory_budget: bytes the memory budget must fit; None = the device's free memory.
        seed: seed of the synthetic weights when the model is a preset or a config.
        tp: open this process's tensor-parallel rank of the model (`runtime/tp.py`): size and rank are those of
            the spec's process group; `host_reduce` leaves the all-reduce of `step.layer` / `step.mixer` to the host.
    """

    limits: RuntimeLimits = field(default_factory=RuntimeLimits)
    dtype: torch.dtype | None = None
    graphs: bool = True
    verify_graphs: bool | None = None
    ple_hoisted: bool = True
    memory_budget: int | None = None
    seed: int = 0
    tp: TpSpec | None = None

    def __post_init__(self) -> None:
        if self.verify_graphs and not self.graphs:
            raise ValueError("verify_graphs=True needs graphs=True: verify steps are captured beside decode steps")
        if self.verify_graphs is None:  # frozen: set through object.__setattr__, as dataclasses' own init does
            object.__setattr__(self, "verify_graphs", self.graphs)


@dataclass
class PrefillResult:
    """hidden `[L, C]` (plain: after the last layer's residual add) or streams `[L, n*C]` (hc); `capture`: the
    snapshot of the state after `capture_at` tokens (restore it, prefill the tail, and the run is reproduced)."""

    hidden: Tensor
    capture: bytes | None = None


@dataclass
class _Parts:
    cfg: GdnConfig
    layers: list[GdnLayer]
    engines: list[list[Engine]]
    feeds: PleFeeds | None
    device: torch.device
    dtype: torch.dtype
    weights: str | None = None  # weights_digest of the checkpoint: snapshots record it
    tp: RankTp | None = None  # a tensor-parallel rank's session


class Session:
    """A stack of GDN layers over continuous batches. Build it with `Session.open`."""

    @classmethod
    def open(cls, checkpoint_or_preset: Source, engines_dir: str | None = None, backend: str = "auto",
             device: str | torch.device | None = None, max_seqs: int | None = None,
             options: SessionOptions | None = None) -> "Session":
        """Load the model, budget memory (fails early naming the limit to lower), build the engines and buffers.
        A device this machine does not have is a `DeviceError`, raised before anything is loaded or allocated."""
        options = options or SessionOptions()
        if max_seqs is not None:
            options = replace(options, limits=replace(options.limits, max_seqs=max_seqs))
        dev = resolve_device(device)
        if device is None:
            log.info("device not given: %s", dev)
        shard = shard_of(options.tp)
        ckpt, tmp = load_rank(load_source, checkpoint_or_preset, options.seed, shard)
        cfg = ckpt.config
        tp = RankTp.of(full_config(cfg), shard, options.tp)
        dtype = options.dtype or act_dtype(cfg, dev)
        act, match = dtype_name(dtype), PlanMatch(options.limits.lora, ckpt.merged_adapter)
        need = budget(cfg, options.limits, act, options.graphs and dev.type == "cuda",
                      trt_context_budget(backend, engines_dir, dev, cfg, act, match),
                      verify_graphs=options.verify_graphs)
        need.check(options.memory_budget if options.memory_budget is not None else available_memory(dev), str(dev))
        # the session's device current while it is built: engines (TensorRT contexts) and events follow it
        with torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext():
            layers = [GdnLayer(cfg, lw, dtype, tp and tp.layer_spec()).to(dev) for lw in ckpt.layers]
            engines = build_engines(backend, layers, engines_dir, dev, options.limits.max_seqs, match)
            if tp is not None:
                tp.mark(engines)
            feeds = PleFeeds(cfg, ckpt.ple_tables, options.limits, dev) if cfg.ple_layer_ids else None
            sess = cls(_Parts(cfg, layers, engines, feeds, dev, dtype, weights_digest(ckpt), tp), options)
        sess._tmp = tmp
        return sess

    def __init__(self, parts: _Parts, options: SessionOptions):
        dev = parts.device  # "cuda" names the current device: compare tensors' devices with its index
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.cfg, self.device, self.dtype, self.options = parts.cfg, dev, parts.dtype, options
        self.limits = options.limits
        spec = BufferSpec(self.dtype, self.device)
        self.pool = StatePool(self.cfg, self.limits.max_seqs, spec, parts.weights)
        self.feeds = parts.feeds
        if self.feeds is not None:
            for i, c in self.feeds.carries().items():
                self.pool.attach_id_carries(i, c)
        self.stack = Stack(self.cfg, self.pool, StepBuffers.allocate(self.cfg, self.limits, spec))
        lora = self.limits.lora
        self.adapters = AdapterSlots(self.cfg, lora, spec) if lora is not None else None
        self.stack.lora = self.adapters
        self.tp = self.stack.tp = parts.tp
        graphs = options.graphs and self.device.type == "cuda"
        policy = GraphPolicy(graphs, self.limits.buckets(), options.ple_hoisted,
                             self.limits.max_draft if options.verify_graphs else 0)
        ple = self.feeds.layers if self.feeds else frozenset()
        self.selector = Selector(parts.engines, policy, ple)
        self._stats = SessionStats(tp=None if parts.tp is None else parts.tp.describe())
        pack = PackBuffers(self.limits.max_seqs, self.limits.max_step_tokens, self.device)
        self.graphs = GraphCache(self.stack, self.selector, self._stats.graphs, self.feeds, pack)
        self._seqs = SeqTable(self.limits.max_seqs, self.limits.max_draft, self.feeds is not None)
        self._steps = StepParts(self.cfg, self.limits, self.dtype, self.device, self._seqs, self.pool, self.stack,
                                self.selector, self.graphs, self.feeds, self.adapters, self._stats, pack,
                                Guard(self.device.index if self.device.type == "cuda" else None))
        self._guard = self._steps.guard
        self._step: Step | None = None
        self._tmp: tempfile.TemporaryDirectory | None = None
        log.info("session: %s%s, %d GDN layers, %s on %s, limits %s, graphs %s, PLE %s", self.cfg.name,
                 "" if parts.tp is None else f" rank {parts.tp.shard.rank} of tp={parts.tp.shard.size}",
                 len(self.cfg.gdn_layer_ids), dtype_name(self.dtype), self.device, self.limits,
                 "on" if graphs else "off", ("hoisted" if options.ple_hoisted else "vetoes decode capture")
                 if ple else "none")

    # ---- adapters ----
    @guarded
    def register_adapter(self, name: str, adapter: Adapter | str | Path) -> None:
        """Keep a LoRA adapter (a PEFT directory or a loaded `Adapter`) on the host under `name`, ready to bind.
        Raises `AdapterError` (nothing registered) when it does not fit this model or the adapter slots."""
        slots = self._slots()
        if not isinstance(adapter, Adapter):
            adapter = load_adapter(adapter, self.cfg if self.tp is None else self.tp.whole, name)
        slots.register(name, adapter if self.tp is None else self.tp.adapter(adapter))

    @guarded
    def unregister_adapter(self, name: str) -> None:
        """Forget an adapter; refused while a live sequence is bound to it."""
        self._idle()
        self._slots().unregister(name, self._seqs.adapters())
        self._seqs.forget(name)

    @guarded(host_only=True)
    def adapter_of(self, seq: int) -> str | None:
        return self._seqs[seq].adapter

    def _slots(self) -> AdapterSlots:
        if self.adapters is None:
            raise AdapterError("this session has no adapter slots: open it with RuntimeLimits(lora=LoraLimits(...))")
        return self.adapters

    def _check_adapter(self, adapter: str | None) -> None:
        if adapter is not None:
            self._slots().check_step({adapter})

    # ---- sequences ----
    @guarded
    def add_sequence(self, adapter: str | None = None) -> int:
        """A new sequence at position 0, with a zeroed slot in every layer (and fresh PLE id carries); `adapter`:
        a registered LoRA adapter every step of the sequence applies (None = the base weights)."""
        self._idle()
        self._check_adapter(adapter)
        return self._seqs.add(self.pool.allocate(), adapter)

    @guarded
    def release(self, seq: int) -> None:
        self._idle()
        self.pool.free(self._seqs.remove(seq))

    @guarded(host_only=True)
    def position(self, seq: int) -> int:
        """Tokens committed to the sequence's state."""
        return int(self._seqs.position[self._seqs.slot(seq)])

    @property
    @guarded(host_only=True)
    def sequences(self) -> list[int]:
        return self._seqs.ids()

    # ---- steps ----
    @guarded
    def begin_step(self, seqs: object, kind: object = "decode", lengths: object = None, token_ids: object = None,
                   capture_at: object = None) -> Step:
        """Open a step of the sequences `seqs [N]` (ids; numpy, a list or a CPU tensor) in the step's order.

        kind: "decode", "verify" or "prefill", or one per sequence (a mixed step lists its sequences grouped:
        decode, then verify, then prefill). lengths [N]: tokens per sequence (verify 0..max_draft drafts, prefill
        >= 1; decode: None, one each). token_ids [T]: every token's id, packed in the step's order (PLE models
        only). capture_at [N]: per prefill sequence, the token count after which its state is snapshotted (-1 =
        none). The whole request is checked first (a bad one raises, naming the sequence, and changes nothing);
        then the step binds adapters, packs the index data and stages the PLE rows. Inside, call `step.mixer`,
        `step.layer` (each GDN layer once, in checkpoint order, with that layer's input [T, ...] in the step's order)
        or `step.run` (the whole stack); leaving the `with` block closes it and commits. See `steps.Step`."""
        self._idle()
        spec = request.check(self._steps, seqs, kind, lengths, token_ids, capture_at)
        self._step = open_step(self._steps, spec)
        return self._step

    @guarded
    def prefill(self, seq: int, hidden: Tensor, token_ids: object = None, capture_at: int | None = None
                ) -> PrefillResult:
        out = self.step(prefill={seq: Prompt(hidden, token_ids, capture_at)})
        return PrefillResult(out.outputs[seq], out.captures.get(seq))

    @guarded
    def prefill_batch(self, prompts: dict[int, Prompt]) -> dict[int, PrefillResult]:
        """Several sequences prefilled together (one PREFILL_VARLEN step)."""
        out = self.step(prefill=prompts)
        return {s: PrefillResult(out.outputs[s], out.captures.get(s)) for s in prompts}

    @guarded
    def decode(self, hidden: dict[int, Tensor], token_ids: dict[int, object] | None = None) -> dict[int, Tensor]:
        """One token for each sequence: hidden `{seq: [1, stream_dim]}` -> `{seq: [1, C or n*C]}`."""
        return self.step(decode=hidden, token_ids=token_ids).outputs

    @guarded
    def verify(self, hidden: dict[int, Tensor], token_ids: dict[int, object] | None = None) -> dict[int, Tensor]:
        """0..max_draft draft tokens per sequence; the state after each goes to the stash, nothing is committed."""
        return self.step(verify=hidden, token_ids=token_ids).outputs

    @guarded
    def step(self, decode: dict[int, Tensor] | None = None, verify: dict[int, Tensor] | None = None,
             prefill: dict[int, Prompt] | None = None, token_ids: dict[int, object] | None = None) -> StepResult:
        """A mixed step of a GDN-only stack, inputs and outputs by sequence (each sequence in one kind): one
        `begin_step` + `run` (`dictapi.py` turns the dicts into the step's arrays and back)."""
        self._idle()
        return dict_step(self._steps, self.begin_step, decode, verify, prefill, token_ids)

    @guarded
    def accept(self, counts: dict[int, int]) -> None:
        """Commit `j` of each verified sequence's draft tokens: the state after draft token j-1 is folded from the
        stash into the pools on the device (j = 0 keeps the state). Clears the pending verify."""
        if not isinstance(counts, dict):
            raise TypeError(f"accept takes a dict {{seq: accepted count}}, got {type(counts).__name__}")
        seqs, js = list(counts), list(counts.values())
        for seq, j in zip(seqs, js):
            if not isinstance(j, (int, np.integer)) or isinstance(j, bool):
                s = self._seqs[seq]
                n = s.pending.count if s.pending is not None else 0
                raise ValueError(f"sequence {seq}: accepted count must be an int in 0..{n}, got {j!r}")
        for seq in seqs:
            self._seqs.slot(seq)  # named errors for ids that are not sequences at all
        self.accept_batch(np.asarray(seqs, dtype=np.int64), np.asarray(js, dtype=np.int64))

    @guarded
    def accept_batch(self, seqs: object, counts: object) -> None:
        """`accept` for arrays: seqs [N] ids, counts [N] accepted draft tokens (checked as a whole first)."""
        self._idle()
        accept(self._steps, as_seq_ids(seqs), counts, self._stream())

    # ---- snapshots ----
    @guarded
    def snapshot(self, seq: int) -> bytes:
        """All of the sequence's committed state at its current token position (after its last step completed);
        refused for a sequence a step failed on (`SequenceError` with the reason)."""
        self._idle()
        slot = self._seqs.intact(seq)  # a failed sequence's state may be half-written: no snapshot of it
        blob = self.pool.encode(self.pool.read_slot(slot, int(self._seqs.position[slot])))
        self._stats.snapshots += 1
        return blob

    @guarded
    def restore(self, blob: bytes, adapter: str | None = None) -> int:
        """A new sequence holding a snapshot's state and position; a corrupt, forged or foreign blob (another
        config, other weights, a header or values the pool's schema refuses) raises `SnapshotError` before a slot
        is taken, and changes nothing. Snapshots hold recurrent state only, not adapter bindings: `adapter`
        binds one to the new sequence (the state was computed under whatever adapter the original had)."""
        self._idle()
        self._check_adapter(adapter)
        try:
            state: SlotState = self.pool.decode(blob)
        except SnapshotError:
            self._stats.rejected_snapshots += 1
            raise
        seq = self.add_sequence(adapter)
        slot = self._seqs.slot(seq)
        self.pool.write_slot(slot, state)
        self.pool.mark_written([slot], self.pool.fence(self._stream()))
        self._seqs.position[slot] = state.position
        self._stats.restores += 1
        self._stats.restored_tokens += state.position
        return seq

    @guarded(host_only=True)
    def stats(self) -> SessionStats:
        if self.feeds is not None:
            self._stats.ple = self.feeds.counters()
        if self.adapters is not None:
            self._stats.adapters = self.adapters.counters
        return self._stats

    # ---- internals ----
    def _stream(self) -> torch.cuda.Stream | None:
        return self._steps.stream()

    def _idle(self) -> None:
        """Refuse a call that changes or reads state while a step is open (its layers may be half way)."""
        if self._step is not None and not self._step.closed:
            raise StepError("a step is open: close it (or leave its with block) first")
