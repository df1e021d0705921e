"""Engine selection: a step (sequences with token counts and kinds) -> groups of (mode, engines, bucket, path).

A mixed step is split into one group per kind (decode, verify, prefill); each sequence belongs to exactly one.
Per group the candidate modes are tried in order (the single-sequence mode first when the group has one
sequence), and per layer the engines in backend preference order; the first mode every layer covers wins. Decode
groups are padded to the smallest CUDA-graph bucket that holds them, and each layer's capture veto decides which
layers replay from graphs and which run eagerly. Every choice and every refusal is logged once, with its reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

from gdn_trt.model.errors import GdnTrtError
from gdn_trt.model.modes import LayerMode, StepKind, candidates

from .engine import Engine

log = logging.getLogger("gdn_trt.runtime")
KIND_ORDER = (StepKind.DECODE, StepKind.VERIFY, StepKind.PREFILL)  # the groups of a mixed step, in this order


class NoEngineError(GdnTrtError, ValueError):
    """No engine of some layer covers a step; the message lists every refusal."""


@dataclass(frozen=True)
class Work:
    """One sequence's share of a step: its id, pool slot, token count and kind."""

    seq: int
    slot: int
    tokens: int
    kind: StepKind


@dataclass(frozen=True)
class Group:
    """Sequences of one kind run together: how many and their tokens, the mode, one engine per layer (stack order),
    the CUDA-graph bucket (sequences; None = eager, unpadded), the token rows of the padded step (`rows`: the bucket
    for decode, the bucket x max_draft for verify; None without a bucket) and, per layer, the capture veto (None =
    that layer replays from a graph). `work`: the sequences, when the group was selected from `Work` items
    (`Selector.select`)."""

    kind: StepKind
    mode: LayerMode
    seqs: int
    tokens: int
    engines: tuple[Engine, ...]
    bucket: int | None
    rows: int | None
    vetoes: tuple[str | None, ...]
    work: tuple[Work, ...] = ()

    @cached_property  # a group is memoized by the selector: its derived names are computed once
    def path(self) -> str:
        """'graph' (every layer replays), 'eager', or 'graph+eager' (vetoed layers run eagerly in between)."""
        if self.bucket is None or all(v is not None for v in self.vetoes):
            return "eager"
        return "graph" if all(v is None for v in self.vetoes) else "graph+eager"

    @cached_property
    def engine_names(self) -> str:
        return "/".join(sorted({e.name for e in self.engines}))

    @cached_property
    def veto(self) -> str | None:
        """The first veto reason of the step (stats and logs)."""
        return next((f"layer {e.layer_idx}: {v}" for e, v in zip(self.engines, self.vetoes) if v is not None), None)


@dataclass(frozen=True)
class GraphPolicy:
    """What may be captured: `enabled` (False = every step eager), the `buckets` (sequences), whether the PLE
    prestage is hoisted before replay (`ple_hoisted`; otherwise PLE layers veto capture, though the step stages
    their rows when it opens either way), and `draft`: the max_draft that verify steps are padded to (0 = verify
    steps run eagerly, unpadded).

    A verify group of n sequences with T draft tokens is padded to a bucket B of sequences and B x draft token rows:
    the padding sequences (slot -1) take no state and share the padding tokens, so the packing's offsets still rise
    to the step's rows. That needs a padding sequence whenever T < n x draft, so such a group takes the smallest
    bucket above n; a group whose every sequence drafts `draft` tokens the smallest bucket >= n. A lone sequence
    with missing drafts takes the multi-sequence mode for that (`decode_batched` has no padding sequence)."""

    enabled: bool
    buckets: tuple[int, ...]
    ple_hoisted: bool
    draft: int = 0


class Selector:
    """Maps steps to groups over `engines[k]` = the candidate engines of the k-th layer, best first."""

    def __init__(self, engines: list[list[Engine]], policy: GraphPolicy, ple_layers: frozenset[int]):
        self.engines, self.policy, self.ple_layers = engines, policy, ple_layers
        self._said: set[str] = set()
        self.failed_buckets: dict[tuple[LayerMode, int], str] = {}
        # (kind, sequences, tokens) -> (mode, engines, bucket, vetoes): a steady decode loop selects once
        self._memo: dict[tuple[StepKind, int, int], Group] = {}
        self.generation = 0  # counts the clears of the memo: a group memoized at one generation is while it stands
        self._parts: dict[tuple, Engine] = {}

    def fail_bucket(self, mode: LayerMode, bucket: int, reason: str) -> None:
        """A graph bucket that failed its capture or acceptance gate runs eagerly from now on."""
        self.failed_buckets[(mode, bucket)] = reason
        self._memo.clear()
        self.generation += 1

    def say(self, msg: str, level: int = logging.INFO) -> None:
        """Log `msg` the first time it is said."""
        if msg not in self._said:
            self._said.add(msg)
            log.log(level, msg)

    def select(self, work: list[Work]) -> list[Group]:
        """Split a step into groups (decode, verify, prefill order) and choose each one's mode, engines, bucket."""
        groups = []
        for kind in KIND_ORDER:
            part = tuple(w for w in work if w.kind is kind)
            if part:
                g = self.group(kind, len(part), sum(w.tokens for w in part))
                groups.append(Group(g.kind, g.mode, g.seqs, g.tokens, g.engines, g.bucket, g.rows, g.vetoes, part))
        return groups

    def group(self, kind: StepKind, n: int, tokens: int) -> Group:
        """The group of `n` sequences of `kind` with `tokens` tokens together (memoized: a steady decode loop
        selects once); `NoEngineError` listing every refusal when no mode is covered by every layer."""
        key = (kind, n, tokens)
        g = self._memo.get(key)
        if g is None:
            g = self._choose(kind, n, tokens)
            if len(self._memo) > 4096:  # prefill token counts vary without bound
                self._memo.clear()
                self.generation += 1
            self._memo[key] = g
        return g

    def part_engine(self, g: Group, k: int, part: str) -> Engine:
        """The engine that runs `part` ("layer" or "mixer") of the k-th layer of group `g`: the group's own engine
        when it can, else the first candidate of that layer that runs the part in the group's mode (logged once)."""
        eng = g.engines[k]
        single = len(getattr(eng, "layer_ids", (eng.layer_idx,))) == 1  # a stack engine runs its layers together
        if single and part in eng.parts():
            return eng
        key = (g.mode, k, part, g.bucket, g.rows or g.tokens)
        hit = self._parts.get(key)
        if hit is None:
            rows = g.bucket or g.seqs
            tokens = g.rows or g.tokens
            for c in self.engines[k]:
                alone = len(getattr(c, "layer_ids", (c.layer_idx,))) == 1
                if alone and part in c.parts() and g.mode in c.modes() and c.refuse(g.mode, rows, tokens) is None:
                    hit = self._parts[key] = c
                    self.say(f"layer {c.layer_idx}: {part} calls run on {c.name} ({eng.name} cannot run it alone)")
                    break
            else:
                raise NoEngineError(f"no engine of layer {eng.layer_idx} runs its {part} alone in {g.mode.value}: "
                                    f"candidates {[c.name for c in self.engines[k]]}")
        return hit

    def _choose(self, kind: StepKind, n: int, tokens: int) -> Group:
        refusals = []
        modes = candidates(kind, n == 1)
        if kind is StepKind.VERIFY and n == 1 and self.policy.enabled and self.policy.draft and \
                tokens != self.policy.draft:
            modes = modes[::-1]  # missing drafts: verify_multi pads them (a padding sequence), decode_batched cannot
        for mode in modes:
            bucket, unfit = self._bucket(mode, n, tokens)
            # a verify group whose padded shape some engine refuses runs unpadded instead (a decode group's mode is
            # refused, as before: its bucket is its shape)
            tries = (bucket, None) if bucket is not None and kind is StepKind.VERIFY else (bucket,)
            for b in tries:
                if b is None and bucket is not None:
                    unfit = f"an engine refuses the padded verify (bucket {bucket}): {refusals[-1]}"
                rows = None if b is None else b * (self.policy.draft if kind is StepKind.VERIFY else 1)
                chosen = []
                for cands in self.engines:
                    eng = self._engine(cands, mode, b or n, rows or tokens, refusals)
                    if eng is None:
                        break
                    chosen.append(eng)
                else:
                    vetoes = tuple(self._veto(e, mode, b, unfit) for e in chosen)
                    g = Group(kind, mode, n, tokens, tuple(chosen), b, rows, vetoes)
                    where = f" (bucket {b}{f', {rows} rows' if rows != b else ''})" if b else ""
                    self.say(f"{kind.value} x{n}: {mode.value} on {g.engine_names}, {g.path}{where}"
                             f"{f'; {g.veto}' if g.veto else ''}")
                    return g
        raise NoEngineError(f"no engine covers a {kind.value} step of {n} sequences and {tokens} tokens: "
                            + "; ".join(refusals))

    def _engine(self, cands: list[Engine], mode: LayerMode, seqs: int, tokens: int, refusals: list[str]
                ) -> Engine | None:
        for e in cands:
            why = e.refuse(mode, seqs, tokens) if mode in e.modes() else f"has no {mode.value} engine"
            if why is None:
                return e
            msg = f"layer {e.layer_idx} {e.name} refuses {mode.value} ({seqs} seqs, {tokens} tokens): {why}"
            refusals.append(msg)
            self.say(msg)
        return None

    def _bucket(self, mode: LayerMode, n: int, tokens: int) -> tuple[int | None, str | None]:
        """The graph bucket of a decode or verify group of n sequences and `tokens` tokens, or None and why it runs
        eagerly (`GraphPolicy`; logged once)."""
        m = mode.spec
        verify = m.kind is StepKind.VERIFY
        if not (m.one_token_per_sequence or verify):
            return None, None
        if not self.policy.enabled:
            self.say("CUDA graphs off: every step runs eagerly")
            return None, None
        if verify and not self.policy.draft:
            return None, "verify steps run eagerly (SessionOptions.verify_graphs is off)"
        full = not verify or tokens == n * self.policy.draft  # no padding tokens: no padding sequence to own them
        if m.single_sequence:
            return (1, None) if full else (None, f"{mode.value} pads no tokens: {tokens} of {self.policy.draft} "
                                                 "drafts")
        least = n if full else n + 1
        fits = [b for b in self.policy.buckets if b >= least]
        if not fits:
            why = (f"{m.kind.value} of {n} sequences{'' if full else ' and a padding sequence'} exceeds the largest "
                   f"graph bucket {max(self.policy.buckets)}")
            self.say(f"{why}: eager", logging.WARNING)
            return None, why
        return min(fits), None

    def _veto(self, engine: Engine, mode: LayerMode, bucket: int | None, unfit: str | None) -> str | None:
        why = engine.capture_veto(mode)
        if why is None and not self.policy.enabled:
            why = "CUDA graphs are off for this session"
        if why is None and bucket is None:
            why = unfit or "no graph bucket fits the step"
        if why is None and (mode, bucket) in self.failed_buckets:
            why = f"bucket {bucket} failed its acceptance gate: {self.failed_buckets[(mode, bucket)]}"
        if why is None and set(engine.layer_ids) & self.ple_layers and not self.policy.ple_hoisted:
            why = "PLE prestage kept out of capture by the session's options (ple_hoisted=False)"
        return why
