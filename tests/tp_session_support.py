"""Helpers of the tensor-parallel session tests (no tests here): the scenario a session runs, whole (tp = 1) in the
test process and as every rank of tp = 4 and tp = 2 in gloo processes, and the state it leaves.

`scenario(sess, data, reduce)` is the same code at every tp: prefill two sequences together (one with a capture
point), decode, verify drafts and accept some, snapshot and restore (the snapshot and the prefill capture), decode
all four, then a decode step the host drives layer by layer with `step.layer` (the runtime all-reduces). A second
session opened with `host_reduce=True` runs `host_scenario`: a prefill step through `step.mixer` (PLE layers:
`step.layer`) and a decode step through `step.layer`, where the rank returns partial sums that `reduce` (the host's
all-reduce: `torch.distributed.all_reduce` on a rank, nothing at tp = 1) finishes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gdn_trt.model.config import preset
from gdn_trt.model.tp import TpSpec
from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.session import Session, SessionOptions

from .tp_support import WORLD, gloo_world

F64 = torch.float64
PRESETS = ("tiny-next-tp", "tiny-3.5-tp", "tiny-4exp-tp")  # Qwen3-Next (its layer 1 dense), Qwen3.5 dense, Qwen4-Exp
LIMITS = RuntimeLimits(max_seqs=6, max_prefill_tokens=64, max_draft=3, ple_cache_rows=64)
PREFILL = {0: (9, 4), 1: (6, -1)}  # sequence -> (prompt length, capture point; -1 none)


def options(tp: TpSpec | None) -> SessionOptions:
    return SessionOptions(limits=LIMITS, dtype=F64, graphs=False, tp=tp)


def inputs(name: str, seed: int) -> dict:
    """The scenario's hidden inputs and token ids (whole: the hidden stream is replicated on every rank)."""
    cfg = preset(name)
    g = torch.Generator().manual_seed(seed)
    D, C = cfg.stream_dim, cfg.hidden_size
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=F64)  # noqa: E731
    ids = lambda n: torch.randint(0, cfg.vocab_size, (n,), generator=g).numpy()  # noqa: E731
    return {"prefill": {s: (rnd(n, D), ids(n)) for s, (n, _) in PREFILL.items()},
            "decode": [(rnd(1, D), ids(1)) for _ in range(2)],
            "verify": {0: (rnd(3, D), ids(3)), 1: (rnd(2, D), ids(2))},
            "decode4": [(rnd(1, D), ids(1)) for _ in range(4)], "host": (rnd(2, D), ids(2)),
            "mixer": [rnd(5, C) for _ in cfg.gdn_layer_ids], "mixer_ids": ids(5), "host_decode": (rnd(1, D), ids(1))}


def _ids(sess: Session, d: dict) -> dict | None:
    return d if sess.cfg.ple_layer_ids else None


def state_of(sess: Session, seqs: list[int]) -> dict:
    """Each sequence's pool rows, by layer and part (this rank's heads): {layer: {part: [len(seqs), ...]}}."""
    slots = torch.tensor([sess._seqs.slot(q) for q in seqs])
    return {i: {p: getattr(st, p)[slots].clone() for p in ("conv", "ssm", "ple_conv") if getattr(st, p) is not None}
            for i, st in sess.pool.layers.items()}


def scenario(sess: Session, data: dict) -> dict:
    """The multi-step scenario through the dict API and one host-driven step (the runtime reduces)."""
    out = {}
    a, b = sess.add_sequence(), sess.add_sequence()
    pre = data["prefill"]
    res = sess.prefill_batch({q: Prompt(pre[k][0], _ids(sess, pre[k][1]), None if PREFILL[k][1] < 0 else PREFILL[k][1])
                              for k, q in enumerate((a, b))})
    out["prefill"] = [res[a].hidden, res[b].hidden]
    (h0, i0), (h1, i1) = data["decode"]
    d = sess.decode({a: h0, b: h1}, _ids(sess, {a: i0, b: i1}))
    out["decode"] = [d[a], d[b]]
    v = data["verify"]
    got = sess.verify({a: v[0][0], b: v[1][0]}, _ids(sess, {a: v[0][1], b: v[1][1]}))
    out["verify"] = [got[a], got[b]]
    sess.accept({a: 2, b: 0})
    c = sess.restore(sess.snapshot(a))
    e = sess.restore(res[a].capture)
    out["positions"] = [sess.position(q) for q in (a, b, c, e)]  # prefill 9 + decode 1 + 2 accepted; 6 + 1; 4
    hs = list(data["decode4"])
    hs[2] = hs[0]  # the restored snapshot of a gets a's input: its output must be a's
    d = sess.decode({q: hs[k][0] for k, q in enumerate((a, b, c, e))},
                    _ids(sess, {q: hs[k][1] for k, q in enumerate((a, b, c, e))}))
    out["decode4"] = [d[q] for q in (a, b, c, e)]
    x, ids = data["host"]
    with sess.begin_step(np.array([a, b]), "decode", token_ids=ids if sess.cfg.ple_layer_ids else None) as step:
        for i in sess.cfg.gdn_layer_ids:
            x = step.layer(i, x)
    out["host_layers"] = x
    out["state"] = state_of(sess, [a, b, c, e])
    out["stats"] = sess.stats().tp
    out["table"] = sess.stats().table().splitlines()[0]
    return out


def host_scenario(sess: Session, data: dict, reduce) -> dict:
    """A host's model around the layers of a session opened with host_reduce (at tp = 1 the same calls): the
    mixer outputs of a prefill step (as returned: partial sums on a rank), and a decode step whose hidden state the
    host rebuilds from the returned pairs with `reduce`."""
    cfg, out = sess.cfg, {"mixer": {}}
    s = sess.add_sequence()
    ids = data["mixer_ids"] if cfg.ple_layer_ids else None
    with sess.begin_step([s], "prefill", lengths=[5], token_ids=ids) as step:
        for k, i in enumerate(cfg.gdn_layer_ids):
            if cfg.has_ple(i):  # the runtime owns PLE state: the whole layer, on the streams
                streams = data["mixer"][k].repeat(1, cfg.hc_count)
                part, res = _pair(step.layer(i, streams), streams)
                out["mixer"][i] = (part, res)
            else:
                out["mixer"][i] = (step.mixer(i, data["mixer"][k]), None)
    x, ids = data["host_decode"]
    residual = None if cfg.is_hc else torch.zeros_like(x)
    with sess.begin_step([s], "decode", token_ids=ids if cfg.ple_layer_ids else None) as step:
        for i in cfg.gdn_layer_ids:
            if cfg.is_hc:
                part, streams = _pair(step.layer(i, x), x)
                x = streams + reduce(part) if part is not None else streams
            else:
                part, residual = step.layer(i, x, residual)
                x = reduce(part)
    out["hidden"] = x if cfg.is_hc else x + residual
    out["state"] = state_of(sess, [s])
    return out


def _pair(out, streams):
    """An hc layer's result: (partial delta, streams) on a rank whose host reduces, else (None, new streams)."""
    return out if isinstance(out, tuple) else (None, out)


# ---- the ranks' processes (tp = 4 over all four, tp = 2 over the pairs {0, 1} and {2, 3}) ----
def _worker(rank: int, root: str) -> None:
    with gloo_world(rank, root) as pairs:
        job = torch.load(Path(root) / "job.pt", weights_only=False)
        group = pairs[rank // 2]
        out = {4: {n: run_rank(n, job[n], None) for n in PRESETS},
               2: {n: run_rank(n, job[n], group) for n in PRESETS[rank // 2::2]}}
        torch.save(out, Path(root) / f"rank{rank}.pt")


def run_rank(name: str, data: dict, group) -> dict:
    def reduce(t):
        dist.all_reduce(t, group=group)
        return t

    sess = Session.open(name, device="cpu", options=options(TpSpec(group)))
    host = Session.open(name, device="cpu", options=options(TpSpec(group, host_reduce=True)))
    return {"run": scenario(sess, data), "host": host_scenario(host, data, reduce),
            "veto": [e.tp_veto for cands in sess.selector.engines for e in cands],
            "cfg": (sess.cfg.tp_size, sess.cfg.tp_rank, sess.cfg.linear_num_value_heads)}


def run_world(root: Path, job: dict) -> dict:
    """{tp: {preset: [rank results in rank order]}}."""
    torch.save(job, root / "job.pt")
    mp.spawn(_worker, args=(str(root),), nprocs=WORLD, join=True)
    got = [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    out = {4: {n: [got[r][4][n] for r in range(4)] for n in PRESETS}, 2: {}}
    for k, n in enumerate(PRESETS):
        pair = (0, 1) if k % 2 == 0 else (2, 3)
        out[2][n] = [got[r][2][n] for r in pair]
    return out
