"""What a session did (`Session.stats()`): per step kind the modes, engines, graph-or-eager paths and veto reasons;
speculative acceptance, snapshot hits, CUDA-graph captures, LoRA slot traffic and PLE cache counters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gdn_trt.model.modes import StepKind

from .adapters import AdapterCounters
from .ple.prestage import PrestageCounters
from .select import Group


@dataclass
class KindStats:
    """Steps of one kind: how many, how many tokens and sequences, and how they ran (modes, engines, graph-or-eager
    paths, veto reasons: counted per group and summed when read, so a step adds two integers and one dict entry)."""

    steps: int = 0
    tokens: int = 0
    sequences: int = 0
    _groups: dict = field(default_factory=dict)  # id(group) -> [group, steps]

    def add(self, g: Group) -> None:
        self.steps += 1
        self.tokens += g.tokens
        self.sequences += g.seqs
        e = self._groups.get(id(g))
        if e is None or e[0] is not g:
            e = self._groups[id(g)] = [g, 0]
        e[1] += 1

    def _count(self, key) -> Counter:
        c: Counter = Counter()
        for g, n in self._groups.values():
            k = key(g)
            if k is not None:
                c[k] += n
        return c

    @property
    def modes(self) -> Counter:  # LayerMode value -> groups
        return self._count(lambda g: g.mode.value)

    @property
    def engines(self) -> Counter:  # engine names -> groups
        return self._count(lambda g: g.engine_names)

    @property
    def paths(self) -> Counter:  # 'graph' | 'graph+eager' | 'eager' -> groups
        return self._count(lambda g: g.path)

    @property
    def vetoes(self) -> Counter:  # veto reason -> groups
        return self._count(lambda g: g.veto)


@dataclass
class GraphStats:
    captured: list[str] = field(default_factory=list)  # "<mode> bucket <b>" per captured (mode, bucket)
    replays: int = 0
    gate_failures: list[str] = field(default_factory=list)
    host_captures: list[str] = field(default_factory=list)  # "<mode> rows <r>": layer calls a host captured


@dataclass
class SessionStats:
    kinds: dict[StepKind, KindStats] = field(default_factory=lambda: {k: KindStats() for k in StepKind})
    drafted: int = 0  # draft tokens verified
    accepted: int = 0  # draft tokens accepted
    snapshots: int = 0  # snapshot() calls served
    captures: int = 0  # prefill capture points serialized
    restores: int = 0  # snapshot hits: restore() calls that succeeded
    restored_tokens: int = 0  # token positions skipped thanks to restores
    rejected_snapshots: int = 0
    graphs: GraphStats = field(default_factory=GraphStats)
    ple: dict[int, PrestageCounters] = field(default_factory=dict)
    adapters: AdapterCounters | None = None  # LoRA slot traffic (sessions with adapter slots)
    tp: dict | None = None  # a tensor-parallel rank's session: {size, rank, backend, reduce: "runtime" | "host"}

    def table(self) -> str:
        """A human-readable summary (one line per step kind, each CUDA-graph veto reason once with its count per
        kind, then speculation, snapshots, graphs, PLE)."""
        lines = [f"{'kind':<8} {'steps':>5} {'seqs':>5} {'tokens':>6}  modes / engines / paths"]
        if self.tp is not None:
            t = self.tp
            lines.insert(0, f"tensor parallel: rank {t['rank']} of tp={t['size']} over {t['backend']}; step.layer / "
                            f"step.mixer's last all-reduce by the {t['reduce']}")
        vetoes: dict[str, list[str]] = {}
        for kind, k in self.kinds.items():
            if not k.steps:
                continue
            lines.append(f"{kind.value:<8} {k.steps:>5} {k.sequences:>5} {k.tokens:>6}  {dict(k.modes)} / "
                         f"{dict(k.engines)} / {dict(k.paths)}")
            for why, n in k.vetoes.items():
                vetoes.setdefault(why, []).append(f"{kind.value} {n}")
        for why, counts in vetoes.items():
            lines.append(f"eager, not a CUDA graph: {why} ({', '.join(counts)} steps)")
        rate = f"{self.accepted / self.drafted:.0%}" if self.drafted else "-"
        lines.append(f"speculation: {self.accepted}/{self.drafted} draft tokens accepted ({rate})")
        lines.append(f"snapshots: {self.snapshots} taken, {self.captures} prefill captures, {self.restores} restored "
                     f"({self.restored_tokens} tokens reused), {self.rejected_snapshots} rejected")
        g = self.graphs
        lines.append(f"cuda graphs: {len(g.captured)} captured {g.captured}, {g.replays} replays, "
                     f"{len(g.gate_failures)} failed the gate {g.gate_failures}"
                     + (f"; layer calls captured by the host: {g.host_captures}" if g.host_captures else ""))
        if self.adapters is not None:
            a = self.adapters
            lines.append(f"LoRA slots: {a.hits} hits / {a.misses} uploads, {a.evictions} evictions, "
                         f"{a.bytes_uploaded} B uploaded")
        for i, c in self.ple.items():
            lines.append(f"PLE layer {i}: {c.tokens} tokens staged, {c.hits} hits / {c.misses} misses, "
                         f"{c.bytes_read} B read, {c.evictions} evictions, {c.resident} rows resident, "
                         f"{c.uploads} uploads ({c.bytes_uploaded} B)")
        return "\n".join(lines)
