"""The continuous-batching scenario of `make run`, checked against the plain sequential computation.

Five sequences over one session: three prefilled together (one with a prefix capture point), decode steps while
sequences join (prefilled in the same step as the others decode) and leave, a speculative verify with partial,
full and zero acceptance (and a sequence bringing no drafts), a prefix restore with tail replay that then forks,
and a snapshot restored mid-decode. With adapters (a session with LoRA slots), A and B run under two adapters, C
and D under none, and E, joining after B left, under a third one: it is rotated into B's adapter slot; A's
restored prefix is bound to A's adapter again. Every output a sequence committed is compared at the end with a
float64 CPU reference: each layer's `forward_sequence` from a fresh state, chained over the stack (weights with the
sequence's adapter merged), on the sequence's committed tokens (accepted drafts included, rejected ones never), PLE
rows hashed from a fresh EOS carry and read straight from the checkpoint's table file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.checkpoint import Checkpoint, load_table
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import Adapter, merge_layer
from gdn_trt.runtime.ple.hashing import NgramHasher
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.session import Session

# relative RMS error bound of the runtime's outputs against the float64 reference, by activation dtype: fp32 sees
# only reordered fp32 sums (chunked prefill vs token recurrence, ~1e-6); bf16 rounds every activation (2^-8)
BOUNDS = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 1e-2}


@dataclass
class Check:
    name: str
    rel_rms: float
    max_abs: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.rel_rms <= self.bound


@dataclass
class _Track:
    """One sequence's committed stream: inputs, token ids, and the outputs the session returned for them
    (`skip` leading positions came from a restored prefix, so they have no outputs here)."""

    seq: int
    hidden: list[Tensor] = field(default_factory=list)
    ids: list[np.ndarray] = field(default_factory=list)
    outs: list[Tensor] = field(default_factory=list)
    skip: int = 0
    adapter: str | None = None


class Scenario:
    """Drives `sess` with deterministic random inputs and records what each sequence committed."""

    def __init__(self, sess: Session, ckpt: Checkpoint, seed: int):
        self.sess, self.ckpt = sess, ckpt
        self.gen = torch.Generator().manual_seed(seed)
        self.tracks: dict[str, _Track] = {}
        self.checks: list[Check] = []
        self.adapters: dict[str, Adapter] = {}

    def register(self, adapters: dict[str, Adapter]) -> None:
        for name, ad in adapters.items():
            self.sess.register_adapter(name, ad)
        self.adapters.update(adapters)

    # ---- inputs ----
    def _new(self, n: int) -> tuple[Tensor, np.ndarray | None]:
        cfg = self.sess.cfg
        h = torch.randn(n, cfg.stream_dim, generator=self.gen).to(self.sess.dtype)
        if self.sess.feeds is None:
            return h, None
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=self.gen).numpy()
        if n > 3:
            ids[n // 3] = cfg.eos_token_id  # an EOS inside prompts: the segment rule is exercised
        return h, ids

    def add(self, name: str, adapter: str | None = None) -> _Track:
        self.tracks[name] = t = _Track(self.sess.add_sequence(adapter), adapter=adapter)
        return t

    def _commit(self, t: _Track, h: Tensor, ids: np.ndarray | None, out: Tensor) -> None:
        t.hidden.append(h.cpu())
        t.ids.append(ids if ids is not None else np.zeros(0, dtype=np.int64))
        t.outs.append(out.float().cpu())

    # ---- steps ----
    def prefill(self, prompts: dict[str, tuple[int, int | None]]) -> dict[str, bytes | None]:
        """{name: (tokens, capture_at)} prefilled together; returns the capture blobs."""
        data = {n: self._new(L) for n, (L, _) in prompts.items()}
        res = self.sess.prefill_batch({self.tracks[n].seq: Prompt(h, ids, prompts[n][1])
                                       for n, (h, ids) in data.items()})
        for n, (h, ids) in data.items():
            self._commit(self.tracks[n], h, ids, res[self.tracks[n].seq].hidden)
        return {n: res[self.tracks[n].seq].capture for n in prompts}

    def step(self, decode: list[str], prefill: dict[str, int] | None = None) -> None:
        """One mixed step: one token for each of `decode`, and whole prompts for `prefill`."""
        prefill = prefill or {}
        dec = {n: self._new(1) for n in decode}
        pre = {n: self._new(L) for n, L in prefill.items()}
        ids = {self.tracks[n].seq: i for n, (_, i) in dec.items() if i is not None}
        out = self.sess.step(decode={self.tracks[n].seq: h for n, (h, _) in dec.items()},
                             prefill={self.tracks[n].seq: Prompt(h, i) for n, (h, i) in pre.items()},
                             token_ids=ids).outputs
        for n, (h, i) in {**dec, **pre}.items():
            self._commit(self.tracks[n], h, i, out[self.tracks[n].seq])

    def speculate(self, drafts: dict[str, int], accept: dict[str, int]) -> None:
        """Verify `drafts[n]` tokens per sequence, accept `accept[n]` of them; rejected drafts never commit."""
        data = {n: self._new(k) for n, k in drafts.items()}
        ids = {self.tracks[n].seq: i for n, (_, i) in data.items() if i is not None}
        out = self.sess.verify({self.tracks[n].seq: h for n, (h, _) in data.items()}, ids or None)
        self.sess.accept({self.tracks[n].seq: j for n, j in accept.items()})
        for n, j in accept.items():
            h, i = data[n]
            if j:
                self._commit(self.tracks[n], h[:j], None if i is None else i[:j], out[self.tracks[n].seq][:j])

    def restore_prefix(self, name: str, source: str, blob: bytes, at: int) -> None:
        """A new sequence from `source`'s capture at `at`, then the tail of `source`'s prompt prefilled again."""
        src = self.tracks[source]
        h, ids = torch.cat(src.hidden), np.concatenate(src.ids)
        prompt = src.hidden[0].shape[0]
        t = self.tracks[name] = _Track(self.sess.restore(blob, src.adapter), [h[:at]], [ids[:at]], [], skip=at,
                                       adapter=src.adapter)
        tail_ids = ids[at:prompt] if self.sess.feeds is not None else None
        out = self.sess.prefill(t.seq, h[at:prompt].to(self.sess.dtype), token_ids=tail_ids).hidden
        self._commit(t, h[at:prompt], tail_ids, out)

    def snapshot_fork(self, source: str) -> float:
        """Snapshot `source`, restore it, decode the same next token on both: max |difference| (0 expected)."""
        src = self.tracks[source]
        twin = self.sess.restore(self.sess.snapshot(src.seq), src.adapter)
        h, ids = self._new(1)
        a = self.sess.decode({src.seq: h}, None if ids is None else {src.seq: ids})[src.seq]
        b = self.sess.decode({twin: h}, None if ids is None else {twin: ids})[twin]
        self._commit(src, h, ids, a)
        self.sess.release(twin)
        return (a.float() - b.float()).abs().max().item()

    def release(self, name: str) -> None:
        self.sess.release(self.tracks[name].seq)

    # ---- the oracle ----
    def verify_all(self) -> list[Check]:
        """Compare every sequence's committed outputs with the float64 sequential reference."""
        cfg = self.ckpt.config
        layers = {None: [GdnLayer(cfg, lw, torch.float64) for lw in self.ckpt.layers]}
        # merged in float64: the reference rounds nothing the runtime (which applies the adapter unmerged) does not
        layers.update({n: [GdnLayer(cfg, merge_layer(cfg, lw.astype(torch.float64), ad), torch.float64)
                           for lw in self.ckpt.layers] for n, ad in self.adapters.items()})
        tables = {i: load_table(t) for i, t in self.ckpt.ple_tables.items()}
        bound = BOUNDS[self.sess.dtype]
        for name, t in self.tracks.items():
            h = torch.cat(t.hidden).double()
            ids = np.concatenate(t.ids) if self.sess.feeds is not None else None
            ref = _reference(layers[t.adapter], tables, h, ids)[t.skip:]
            got = torch.cat(t.outs).double()
            diff = got - ref
            rel = (diff.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
            what = f" (adapter {t.adapter})" if t.adapter else ""
            self.checks.append(Check(f"{name}{what}: {got.shape[0]} tokens vs sequential reference", rel,
                                     diff.abs().max().item(), bound))
        return self.checks


def _reference(layers: list[GdnLayer], tables: dict[int, Tensor], h: Tensor, ids: np.ndarray | None) -> Tensor:
    x = h
    for layer in layers:
        rows = None
        if layer.ple is not None:
            r, _ = NgramHasher.for_layer(layer.cfg, layer.index).hash_sequence(ids)
            rows = tables[layer.index][torch.from_numpy(r)].double()
        x = layer.forward_sequence(x, rows)
    return x


def run_scenario(sess: Session, ckpt: Checkpoint, seed: int = 0, adapters: dict[str, Adapter] | None = None
                 ) -> tuple[Scenario, list[Check]]:
    """The scenario of the module docstring on `sess`; returns it with its checks (failures included).
    `adapters`: three LoRA adapters for a session with (at least two) adapter slots; None = base weights only."""
    sc = Scenario(sess, ckpt, seed)
    names = [None] * 3
    if adapters:
        sc.register(adapters)
        names = list(adapters)[:3]
    for n, ad in (("A", names[0]), ("B", names[1]), ("C", None)):
        sc.add(n, ad)
    caps = sc.prefill({"A": (37, 16), "B": (20, None), "C": (69, None)})
    sc.step(["A", "B", "C"])
    sc.add("D")
    sc.step(["A", "B", "C"], prefill={"D": 12})  # D joins: prefilled in the same step as the others decode
    sc.step(["A", "B", "C", "D"])
    sc.release("B")  # B leaves; E takes its slot (and, with adapters, a third adapter takes B's adapter slot)
    sc.add("E", names[2])
    sc.step(["A", "C", "D"], prefill={"E": 9})
    sc.speculate({"A": 4, "C": 3, "D": 0, "E": 2}, accept={"A": 2, "C": 0, "D": 0, "E": 2})
    sc.step(["A", "C", "D", "E"])
    sc.step(["A", "C", "D", "E"])
    sc.restore_prefix("A'", "A", caps["A"], 16)  # prefix hit at 16 tokens, tail replayed
    sc.step(["A'", "A"])  # the fork decodes its own next token
    fork = sc.snapshot_fork("C")
    checks = sc.verify_all()
    checks.append(Check("snapshot -> restore -> same decode (bit for bit)", 0.0 if fork == 0 else float("inf"),
                        fork, 0.0))
    return sc, checks
