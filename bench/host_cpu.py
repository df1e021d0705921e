"""The runtime's own host cost per decode step, measured on the CPU (no GPU needed): what a step costs in Python
besides the layers' device work.

    python bench/host_cpu.py [--steps 200] [--out DIR]

- `stub`: a 4-GDN-layer Qwen3-Next stack (tiny shapes) whose engines return their input at once, so the time of a
  step is the runtime's bookkeeping alone (validation, selection, packing, the stack's loop, commit): the part of the
  host enqueue that the CUDA-graph replay does not replace. Per N in {1, 8, 64, 256}, the dict API
  (`Session.decode({seq: h})`) and, where the runtime has it, the batched API (`begin_step` + `run` + close).
  `static`: the steady decode step of a GPU host in place (`step.input()`, `run(..., copy=False)`, close) on a
  second session whose decode buckets hold a gated graph entry with the replay stubbed out: the Python a GPU host
  runs around its one graph launch (the stack's loop above is what the replay replaces). `verify`: the same for the
  verify-accept loop of a session with verify graphs (every sequence drafting max_draft tokens, in place, then
  `accept_batch` of none). `churn` and `vchurn`: the same two steps with one sequence leaving and another joining at
  every step (two sets of N sequences in turn), so that every request is checked in full and its index data sent,
  as in a continuous batch whose members change every step.
- `ple`: the PLE host part of a decode step at Qwen4-Exp shapes (16 n-gram heads x 160, bf16 table rows, the table
  shrunk to ~85k rows): hashing, the row cache lookup and the staging of N = 1..256 sequences' rows, every step the
  same ids (after the first step every row is a cache hit), as the session's PLE feeds do it.
The median of `--steps` timed steps after 20 warm-up steps; `time.perf_counter_ns` and the thread's CPU time
around each call. Writes `<out>/<date>-<name>.json` and `.md`.

    python bench/host_cpu.py --combine OUT_STEM before=a.json,b.json after=c.json,d.json

combines runs of two versions (e.g. interleaved rounds of the old and the new runtime, the old one run with
PYTHONPATH pointing at a copy of its sources) into one table and plot: per cell the smallest median of its rounds.
(The fallbacks below for a runtime without `begin_step` or array carries are what measures the old version.)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gdn_trt.model.checkpoint import PleTable
from gdn_trt.model.config import PRESETS
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.ngram import NgramTable
from gdn_trt.model.state import StepOutput
from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.engine import Engine
from gdn_trt.runtime.ple.feeds import PleFeeds
from gdn_trt.runtime.select import GraphPolicy
from gdn_trt.runtime.session import Session, SessionOptions

NS = (1, 8, 64, 256)
RESULTS = Path(__file__).resolve().parent / "results"


class StubEngine(Engine):
    """An engine that does no work: the step's time is the runtime's own."""

    def __init__(self, layer_idx: int):
        self.layer_idx, self.device, self.name = layer_idx, torch.device("cpu"), "stub"

    def modes(self) -> tuple[LayerMode, ...]:
        return tuple(LayerMode)

    def refuse(self, mode, seqs, tokens):
        return None

    def run(self, call, stream):
        return StepOutput(call.step.x, call.step.residual)

    def parts(self) -> tuple[str, ...]:
        return ("layer", "mixer")


class _Capturable(StubEngine):
    def capture_veto(self, mode):
        return None


class _NoReplay:
    """A captured graph whose replay does nothing."""

    def replay(self) -> None:
        pass


def _static_step(cfg, limits: RuntimeLimits, n: int, verify: bool = False, churn: bool = False):
    """A session whose decode (`verify`: verify, each sequence drafting max_draft tokens) bucket of n sequences
    replays a stubbed graph, and its steady step in place (a verify accepts none of its drafts). `churn`: the step
    alternates between two sets of n sequences (the first n of n + 1 and the last n: one leaves, one joins), so every
    step is a new request, checked in full, its index data sent."""
    from gdn_trt.model.modes import StepKind
    from gdn_trt.runtime import graphs
    from gdn_trt.runtime.stack import Packed

    K = limits.max_draft
    sess = Session.open(cfg, backend="torch", device="cpu", options=SessionOptions(limits=limits))
    sess.selector.engines = [[_Capturable(i)] for i in cfg.gdn_layer_ids]
    sess.selector.policy = GraphPolicy(True, limits.buckets(), True, K)
    ids = np.asarray([sess.add_sequence() for _ in range(n + churn)], dtype=np.int64)
    sets, turn = (ids[:n], ids[churn:]), [0]
    kind, lengths, none = ("verify", np.full(n, K), np.zeros(n, dtype=np.int64)) if verify else ("decode", None, None)
    g = sess.selector.group(StepKind.VERIFY if verify else StepKind.DECODE, n, n * K if verify else n)
    gc = sess.graphs

    def static():
        seqs = sets[turn[0]]
        turn[0] ^= churn
        with sess.begin_step(seqs, kind, lengths) as st:
            if not gc._entries:  # the first step: its bound padded views make the stubbed entry
                fixed, b = gc._input(g.rows), st._binds[0]
                inp = Packed(fixed.x, None, b.pack_pad, None)
                seg = graphs._Segment(g.engines, True, inp, inp, _NoReplay(), torch.zeros(g.rows, cfg.stream_dim))
                gc._entries[(tuple(id(e) for e in g.engines), g.mode, g.bucket, g.vetoes)] = graphs._Entry(
                    g.mode, g.bucket, fixed, None, inp.pack, None, [seg], True)
            st.run(st.input(), copy=False)
        if verify:
            sess.accept_batch(seqs, none)

    static()
    assert sess.stats().graphs.replays == 1, "the stubbed graph did not run"
    static.sess = sess
    return static


def _median_us(fn, steps: int) -> tuple[float, float]:
    """(wall, CPU time of this thread) per call in us, medians. The CPU time leaves out the time the thread waited
    for a core: on a shared machine it is the steadier figure of the two."""
    for _ in range(20):
        fn()
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        cpu.append(time.thread_time_ns() - c)
        wall.append(time.perf_counter_ns() - t)
    return statistics.median(wall) / 1e3, statistics.median(cpu) / 1e3


def _stub_stack() -> tuple:
    """The stub rows' stack: (config, limits)."""
    cfg = PRESETS["tiny-next"].replace(layer_types=("linear_attention",) * 4, name="tiny-next-4L")
    buckets = tuple(sorted({*NS, *(2 ** k for k in range(9))}))  # a slot more than N = 256: the churn's joiner
    return cfg, RuntimeLimits(max_seqs=max(NS) + 1, max_prefill_tokens=64, max_draft=2, graph_buckets=buckets)


def probe() -> int:
    """About 16 us of pure Python on a 2-core CI CPU that touches none of the runtime: timed right after a host call
    (bench/runtime.py's `timed`), it tells how fast the host ran just then."""
    return sum(i * i for i in range(400))


def probe_at_rest(calls: int = 200) -> float:
    """The probe's median time (us) with nothing before it: the host at rest."""
    return _median_us(probe, calls)[0]


def static_reference(steps: int = 200) -> tuple[float, float]:
    """(wall, thread CPU) us of the `static` stub step at N = 1: the runtime's own Python around one graph launch,
    a measure of how fast this host runs it (bench/runtime.py reports it beside the host enqueue)."""
    cfg, limits = _stub_stack()
    return _median_us(_static_step(cfg, limits, 1), steps)


def stub_rows(steps: int) -> list[dict]:
    cfg, limits = _stub_stack()
    sess = Session.open(cfg, backend="torch", device="cpu", options=SessionOptions(limits=limits))
    sess.selector.engines = [[StubEngine(i)] for i in cfg.gdn_layer_ids]
    seqs = [sess.add_sequence() for _ in range(max(NS))]
    rows = []
    for n in NS:
        h = torch.randn(n, cfg.stream_dim)
        batch = {q: h[k:k + 1] for k, q in enumerate(seqs[:n])}
        row = {"case": "stub 4-layer stack", "n": n}
        row["dict_us"], row["dict_cpu_us"] = _median_us(lambda: sess.decode(batch), steps)
        if hasattr(sess, "begin_step"):
            ids = np.asarray(seqs[:n], dtype=np.int64)

            def batched():
                with sess.begin_step(ids, "decode") as st:
                    st.run(h)

            row["batched_us"], row["batched_cpu_us"] = _median_us(batched, steps)
            row["static_us"], row["static_cpu_us"] = _median_us(_static_step(cfg, limits, n), steps)
            row["verify_us"], row["verify_cpu_us"] = _median_us(_static_step(cfg, limits, n, verify=True), steps)
            row["churn_us"], row["churn_cpu_us"] = _median_us(_static_step(cfg, limits, n, churn=True), steps)
            row["vchurn_us"], row["vchurn_cpu_us"] = _median_us(_static_step(cfg, limits, n, verify=True, churn=True),
                                                                steps)
        rows.append(row)
        print(row, flush=True)
    return rows


def ple_rows(steps: int) -> list[dict]:
    cfg = PRESETS["qwen4-exp"].replace(layer_types=("linear_attention",) * 4, ple_layer_ids=(2,),
                                       ngram_vocab_size_base=5_000, name="qwen4-exp-4L-ple")
    tmp = tempfile.TemporaryDirectory(prefix="host-cpu-ple-")
    t = NgramTable.for_layer(cfg, 1)
    path = Path(tmp.name) / "table.bin"
    torch.randn(t.rows, t.dim).to(torch.bfloat16).view(torch.uint8).numpy().tofile(path)
    limits = RuntimeLimits(max_seqs=max(NS), max_prefill_tokens=64, max_draft=1, ple_cache_rows=1 << 16)
    feeds = PleFeeds(cfg, {1: PleTable(path, t.rows, t.dim, "bfloat16")}, limits, torch.device("cpu"))
    gen = np.random.default_rng(0)
    rows = []
    for n in NS:
        ids = gen.integers(0, cfg.vocab_size, n)
        slots = np.arange(n)
        stage = _stager(feeds, slots, ids)
        wall, cpu = _median_us(stage, steps)
        rows.append({"case": "PLE host part (Qwen4-Exp, 1 PLE layer)", "n": n, "stage_us": wall, "stage_cpu_us": cpu})
        print(rows[-1], flush=True)
    return rows


def _stager(feeds, slots: np.ndarray, ids: np.ndarray):
    """One decode step's PLE staging for `slots` with one id each, through whichever API the runtime has."""
    if hasattr(feeds, "carry"):  # carries in arrays: the session stages at the step's open and commits at its close
        cu = np.arange(slots.size + 1, dtype=np.int64)

        def stage():
            _, new = feeds.stage(slots, ids, cu, 0, 0, None)
            feeds.commit(slots, new)

        return stage
    from gdn_trt.runtime.ple.feeds import StepRows

    for s in slots.tolist():
        if s not in feeds.stages[1]:
            feeds.stages[1].add_carry(s)
    seqs = [(s, ids[k:k + 1]) for k, s in enumerate(slots.tolist())]
    return lambda: StepRows(feeds, seqs, commit=True, stream=None).hoist()


def combine(stem: Path, groups: list[str]) -> None:
    """One table and plot from several runs per version (see the module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells: dict[tuple, dict[str, list[float]]] = {}
    meta = {}
    for g in groups:
        tag, files = g.split("=", 1)
        for f in files.split(","):
            d = json.loads(Path(f).read_text())
            meta = d["meta"]
            for r in d["rows"]:
                for k, v in r.items():
                    if k.endswith("_us") and not k.endswith("cpu_us"):
                        cells.setdefault((r["case"], r["n"]), {}).setdefault(f"{k[:-3]} {tag}", []).append(v)
    cols = sorted({c for d in cells.values() for c in d})
    rows = [{"case": case, "n": n, **{c: min(v) for c, v in d.items()}} for (case, n), d in sorted(cells.items())]
    lines = [f"# host-cpu ({meta.get('date')}): the runtime's own host cost per decode step", "",
             f"- python {meta.get('python')}, torch {meta.get('torch')}, 1 torch thread, runs per version: "
             + ", ".join(f"{g.split('=')[0]} {len(g.split('=', 1)[1].split(','))}" for g in groups),
             "- each figure: the smallest median (us per step, wall clock) over the runs of its version", "",
             "| case | N | " + " | ".join(cols) + " |", "|---|---:|" + "---:|" * len(cols)]
    lines += [f"| {r['case']} | {r['n']} | " + " | ".join(f"{r[c]:.0f}" if c in r else "" for c in cols) + " |"
              for r in rows]
    stem.with_suffix(".json").write_text(json.dumps({"meta": {**meta, "runs": groups}, "rows": rows}, indent=1) + "\n")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, case in zip(axes, sorted({r["case"] for r in rows})):
        rs = [r for r in rows if r["case"] == case]
        for c in cols:
            if any(c in r for r in rs):
                ax.plot([r["n"] for r in rs if c in r], [r[c] for r in rs if c in r], marker="o", label=c)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequences per step (N)")
        ax.set_ylabel("us per step (CPU)")
        ax.set_title(case, fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    print("wrote", stem.with_suffix(".md"))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--combine":
        combine(Path(sys.argv[2]), sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="host-cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    meta = {"date": dt.date.today().isoformat(), "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__, "steps": args.steps,
            "torch_threads": 1}
    rows = stub_rows(args.steps) + ple_rows(args.steps)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{meta['date']}-{args.name}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    cols = ["case", "n", "dict_us", "dict_cpu_us", "batched_us", "batched_cpu_us", "static_us", "static_cpu_us",
            "churn_us", "churn_cpu_us", "verify_us", "verify_cpu_us", "vchurn_us", "vchurn_cpu_us", "stage_us",
            "stage_cpu_us"]
    lines = [f"# {args.name} ({meta['date']})", "", *(f"- {k}: {v}" for k, v in meta.items()), "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f"{r[c]:.1f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols)
              + " |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("wrote", stem.with_suffix(".md"))


if __name__ == "__main__":
    main()
