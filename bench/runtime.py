"""The whole runtime step on the H200, per mode and batch, beside Hugging Face's Qwen3-Next GDN layer with FLA.

    python bench/runtime.py [--out DIR] [--deadline 225] [--steps 20] [--only ours,static,dict,ple,hf,veager]
                            [--cases "verify 64x4,..."] [--smoke]

Stacks (4 GDN layers, bf16 activations, fp32 state, synthetic weights; the session's batched API, `begin_step` +
`run`, with CUDA graphs for decode and verify):
- ours:  Qwen3-Next layers (C 2048, H 16, HV 32, K = V 128): decode N in {1, 8, 64, 256}, verify 64 x 4 (with
         `accept` of none), prefill 1 x 4096, varlen 16 x 1024;
- dict:  the same session through the dict API (`decode({seq: h})`), decode only: what the batched API saves;
- static: the same session, decode only, with the step's input and output in place: the host writes x into
         `step.input()` (the graph's fixed input rows; its producer's own write is the host's, not timed here: the
         rows hold the last step's x) and reads `run(..., copy=False)` (the graph's fixed output): two launches less;
- veager: the same layers in a session with `verify_graphs=False`, verify only: the eager verify step against
         the one `ours` replays from its CUDA graph (bucket 64, 256 rows);
- ple:   Qwen4-Exp layers (4 hc streams of 2560) with PLE on the second layer, hoisted (the n-gram table shrunk to
         ~81k rows of the real width, so every step's rows are cache hits after the first), and the same stack
         without PLE (`noPLE`): decode N in {1, 8, 64, 256};
- hf:    the peer a user would pick instead, Hugging Face's `Qwen3NextGatedDeltaNet` with its input RMSNorm and
         residual add (4 layers, its own cache), with FLA's kernels where `fla` imports (fla-core 0.6.0; the conv
         without `causal_conv1d` is HF's torch path): the same shapes and inputs, varlen as a batch of 16 x 1024.

Per (stack, case): `wall_us` per step (back-to-back steps between two synchronisations); `enqueue_us`, the duration
of a step's call started on an idle GPU (the host's own cost: open, layer calls or replay, close), and
`enqueue_cpu_us` the calling thread's CPU time in it (below the duration where the thread waited: descheduled, or
blocked in a call; about equal where the host computed slowly); `device_us`,
the time per step the device has a kernel of the step running, from torch.profiler (the union of the kernels'
intervals: with programmatic dependent launch, `plugins/pdl.py`, a kernel starts inside the one before it, so the
sum of their times, `kernel_sum_us`, counts the overlap twice), and the kernels' time per category (`gemm`, `gdn`,
`conv`, `glue` by `bench/glue.category`; these overlap likewise); for graph steps also `replay_us` (CUDA events
around back-to-back replays of the step's graphs); `floor_us`: the layer weights plus every sequence's fp32 state
read and written once (verify: read once, the stash written per token; prefill: read and written once) at the copy
rate measured in the same run; the ratios
`wall/device`, `device/floor` and `device/kernels` (kernels = GEMM + GDN + conv); for `ple`, `ple_host_us`: the
PLE part of a step's open (hash, cache lookup, staging, upload) timed alone. The notes check the issues' targets
and name, for each miss, the term that dominates it. The meta's `host_ref_us` is this host's speed at the runtime's
own Python (`bench/host_cpu.py`'s in-place decode step at N = 1 with the replay stubbed out, taken first): the same
code's enqueue differed about 2x between two H200 hosts (2026-12-04), so enqueue figures compare across hosts only
beside it. `probe_us` (column): a pure-Python probe (`host_cpu.probe`) timed right after each idle call, beside its
time at rest (the meta's `probe_rest_us`): how fast the host ran in the calls' wake.

The run makes two passes over the rows, each with its own stacks: first every row's host and wall figures, then
every row's device time, because after torch.profiler has run once in a process every CUDA launch pays for CUPTI
(a step's enqueue in place more than doubled at N = 1, H200, 2026-12-04). Each pass is cut by `--deadline` (rows
not started are listed as skipped), the run by SIGTERM (what was measured is written); any failing row is recorded
with its error and the run goes on. Writes `<out>/<date>-runtime.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import math
import signal
import statistics
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

# bench/common.py and bench/glue.py: Python puts the script's folder first on sys.path (run as `python bench/...`)
from common import RESULTS, copy_bandwidth, device_info, write_results
from glue import category
from host_cpu import probe, probe_at_rest, static_reference

from gdn_trt.model.config import PRESETS, GdnConfig
from gdn_trt.plugins.glue import triton as glue_tri
from gdn_trt.runtime import graphs
from gdn_trt.runtime.budget import RuntimeLimits, slot_bytes, weight_bytes
from gdn_trt.runtime.session import Session, SessionOptions

DT = torch.bfloat16
DEV = "cuda"  # --smoke: "cpu", tiny shapes, to check the script's own code without a GPU (figures meaningless)
NS = (1, 8, 64, 256)
STACK = ("linear_attention",) * 4
CASES = {f"decode {n}": ("decode", [1] * n) for n in NS}
CASES.update({"verify 64x4": ("verify", [4] * 64), "prefill 4096": ("prefill", [4096]),
              "varlen 16x1024": ("prefill", [1024] * 16)})


def configs(smoke: bool = False) -> dict[str, GdnConfig]:
    next4 = PRESETS["tiny-next" if smoke else "qwen3-next-80b-a3b"].replace(layer_types=STACK, name="qwen3-next-4L")
    ple = PRESETS["tiny-4exp" if smoke else "qwen4-exp"].replace(layer_types=STACK, ple_layer_ids=(2,),
                                                                  name="qwen4-exp-4L-ple")
    if not smoke:
        ple = ple.replace(ngram_vocab_size_base=5_000)
    return {"ours": next4, "static": next4, "dict": next4, "veager": next4, "ple": ple,
            "noPLE": ple.replace(ple_layer_ids=(), name="qwen4-exp-4L")}


@dataclass
class Row:
    stack: str
    case: str
    wall_us: float = float("nan")
    enqueue_us: float = float("nan")
    enqueue_cpu_us: float = float("nan")
    probe_us: float = float("nan")  # host_cpu.probe right after each idle call (`timed`)
    device_us: float = float("nan")
    kernel_sum_us: float = float("nan")
    replay_us: float | None = None
    floor_us: float | None = None
    wall_over_device: float | None = None
    device_over_floor: float | None = None
    device_over_kernels: float | None = None
    ple_host_us: float | None = None
    weights_floor_us: float | None = None  # the floor's two terms: the weights, and the state (read and written)
    state_floor_us: float | None = None
    gemm_us: float = 0.0
    gdn_us: float = 0.0
    conv_us: float = 0.0
    glue_us: float = 0.0
    path: str = ""
    error: str = ""
    kernels: dict = field(default_factory=dict)

    def take(self, t: Timed) -> None:
        """`timed`'s figures into the row."""
        self.wall_us, self.enqueue_us, self.enqueue_cpu_us, self.probe_us = t.wall, t.enqueue, t.enqueue_cpu, t.probe

    def finish(self, bw: float, floor_bytes: tuple[float, float] | None) -> "Row":
        """floor_bytes: (weight bytes, state bytes) of the step (`_floor`)."""
        if floor_bytes:
            self.weights_floor_us, self.state_floor_us = (b / bw * 1e6 for b in floor_bytes)
            self.floor_us = self.weights_floor_us + self.state_floor_us
            self.device_over_floor = self.device_us / self.floor_us
        self.wall_over_device = self.wall_us / self.device_us if self.device_us else None
        k = self.gemm_us + self.gdn_us + self.conv_us
        self.device_over_kernels = self.device_us / k if k else None
        return self


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def profile(fn, reps: int = 5) -> tuple[float, dict[str, float], float]:
    """(kernel time per call, per kernel, device time per call) in us, from torch.profiler over `reps` calls.
    Device time: the union of the kernels' intervals on the device (their sum where the events carry no times).
    With programmatic dependent launch (plugins/pdl.py) a kernel starts while the one before it runs and waits
    inside, so kernel times overlap and their sum counts the overlap twice; the union counts the time the device has
    a step's kernel running once."""
    from torch.profiler import ProfilerActivity, profile as prof_

    fn()
    sync()
    with prof_(activities=[ProfilerActivity.CUDA if DEV == "cuda" else ProfilerActivity.CPU]) as prof:
        for _ in range(reps):
            fn()
        sync()
    per: dict[str, float] = {}
    for ev in prof.key_averages():
        t = (getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)) if DEV == "cuda" \
            else ev.self_cpu_time_total
        if t > 0 and ev.key and not ev.key.startswith(("cudaLaunch", "cudaStream", "ProfilerStep", "cudaGraph")):
            per[ev.key] = per.get(ev.key, 0.0) + t / reps
    total = sum(per.values())
    try:
        busy = union_ns(device_spans(prof)) / 1e3 / reps
    except AttributeError:  # the profiler's events carry no times
        busy = 0.0
    return total, per, busy or total


def device_spans(prof) -> list[tuple[int, int, str]]:
    """(start ns, end ns, name) of the device events of a profile, in start order."""
    return sorted((e.start_ns(), e.end_ns(), e.name()) for e in prof.profiler.kineto_results.events()
                  if e.device_type() != torch.autograd.DeviceType.CPU and e.end_ns() > e.start_ns())


def union_ns(spans: list[tuple[int, int, str]]) -> int:
    """The length of the union of sorted spans' intervals (ns)."""
    busy, end = 0, None
    for a, b, _ in spans:
        if end is None or a > end:
            busy, end = busy + b - a, b
        elif b > end:
            busy, end = busy + b - end, b
    return busy


IDLE_CALLS = 100  # 10 before 2026-12-03: the medians of two runs then differed by up to 20 us (host jitter)


@dataclass(frozen=True)
class Timed:
    """`timed`'s figures, in us."""

    wall: float  # per step over back-to-back steps
    enqueue: float  # median duration of a call started on an idle GPU
    enqueue_cpu: float  # median CPU time of this thread in those calls
    probe: float  # median time of host_cpu.probe (pure Python) right after each of those calls


def timed(fn, steps: int) -> Timed:
    """Wall per step over back-to-back steps, then IDLE_CALLS calls each started on an idle GPU (after a
    synchronize), each followed by `host_cpu.probe`. The enqueue's CPU time tells a slow host (CPU time about the
    duration) from a thread that waited (CPU time below it); the probe beside its time at rest (`probe_us`) tells
    how fast the host ran in the calls' wake. On one H100 VM (2026-12-05) the same in-place step at N = 256 took
    130-150 us in one process while the probe after it took 35-40 against 16 at rest, and 22 us at N = 1 with the
    probe at 16 (bench/results/2026-12-05-enqueue-warm-h100.txt): the host, not the step's code."""
    for _ in range(3):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    wall = (time.perf_counter() - t0) / steps
    idle, cpu, after = [], [], []
    for _ in range(IDLE_CALLS if DEV == "cuda" else 3):
        sync()
        t, c = time.perf_counter(), time.thread_time()
        fn()
        t2 = time.perf_counter()
        cpu.append(time.thread_time() - c)
        probe()
        after.append(time.perf_counter() - t2)
        idle.append(t2 - t)
    sync()
    med = statistics.median
    return Timed(wall * 1e6, med(idle) * 1e6, med(cpu) * 1e6, med(after) * 1e6)


def categorize(row: Row, kernels: dict[str, float]) -> None:
    for k, v in kernels.items():
        setattr(row, f"{category(k)}_us", getattr(row, f"{category(k)}_us") + v)
    row.kernels = {k: round(v, 2) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]}


# ---- our runtime ----
class Ours:
    """One session and its sequences: one pool slot per sequence of the largest case."""

    def __init__(self, cfg: GdnConfig, verify_graphs: bool | None = None):
        limits = RuntimeLimits(max_seqs=256, max_prefill_tokens=16384, max_draft=4, graph_buckets=NS,
                               ple_cache_rows=1 << 16)
        self.sess = Session.open(cfg, backend="torch", device=DEV, options=SessionOptions(
            limits=limits, dtype=DT if DEV == "cuda" else torch.float32, graphs=True, ple_hoisted=True,
            verify_graphs=verify_graphs))
        self.cfg = cfg
        self.seqs = np.array([self.sess.add_sequence() for _ in range(256)])
        self.gen = np.random.default_rng(0)

    def token_ids(self, T: int) -> np.ndarray | None:
        """Ids of a step's T tokens for a PLE stack (its feeds hash them); None for a stack without PLE."""
        return self.gen.integers(0, self.cfg.vocab_size, T) if self.sess.feeds is not None else None

    def step_fn(self, kind: str, lengths: list[int], api: str = "batched"):
        s, n, T = self.sess, len(lengths), sum(lengths)
        seqs = self.seqs[:n]
        x = torch.randn(T, self.cfg.stream_dim, device=DEV).to(s.dtype)
        ids = self.token_ids(T)
        L = np.array(lengths)
        if api == "dict":
            batch = {int(q): x[k:k + 1] for k, q in enumerate(seqs)}
            tok = None if ids is None else {int(q): ids[k:k + 1] for k, q in enumerate(seqs)}
            return lambda: s.decode(batch, tok)
        if api == "static":
            with s.begin_step(seqs, kind, None, ids) as st:  # the rows the next steps read in place hold x
                st.run(st.input().copy_(x))

            def static():
                with s.begin_step(seqs, kind, None, ids) as st:
                    st.run(st.input(), copy=False)

            return static

        def step():
            with s.begin_step(seqs, kind, None if kind == "decode" else L, ids) as st:
                st.run(x)
            if kind == "verify":
                s.accept_batch(seqs, np.zeros(n, dtype=np.int64))

        return step

    def ple_host_us(self, n: int) -> float | None:
        feeds = self.sess.feeds
        if feeds is None:
            return None
        slots, ids, cu = np.arange(n), self.token_ids(n), np.arange(n + 1)
        pad = (min(b for b in NS if b >= n) - n) if n in NS else 0
        for _ in range(3):
            feeds.stage(slots, ids, cu, 0, pad, None)
        ts = []
        for _ in range(20):
            sync()
            t = time.perf_counter()
            feeds.stage(slots, ids, cu, 0, pad, None)
            ts.append(time.perf_counter() - t)
        sync()
        return statistics.median(ts) * 1e6


def replay_us(graphs: list, reps: int = 20, windows: int = 5) -> float:
    """Device time of a decode step: its captured graphs replayed back to back (median of event-timed windows)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(windows):
        start.record()
        for _ in range(reps):
            for g in graphs:
                g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def _api(stack: str) -> str:
    return stack if stack in ("dict", "static") else "batched"


def _built(stack: str) -> str:
    """The stack whose session a row runs on: dict and static rows reuse ours."""
    return "ours" if stack in ("dict", "static") else stack


def time_ours(o: Ours, stack: str, case: str, steps: int) -> Row:
    """The row's host, wall and replay figures (the timing pass: no profiler has run in this process yet)."""
    kind, lengths = CASES[case]
    row = Row(stack, case)
    fn = o.step_fn(kind, lengths, _api(stack))
    fn()  # the first step of a bucket captures its graphs and runs the acceptance gate
    stats = o.sess.stats().kinds
    before = {k: dict(v.paths) for k, v in stats.items()}
    row.take(timed(fn, steps))
    row.path = ",".join(sorted({p for k, v in stats.items() for p, c in v.paths.items() if c > before[k].get(p, 0)}))
    if kind in ("decode", "verify") and DEV == "cuda":
        graphs = o.sess.graphs.replayable(len(lengths), verify=kind == "verify")
        if graphs:
            row.replay_us = replay_us(graphs)
    if stack in ("ple", "noPLE") and kind == "decode":
        row.ple_host_us = o.ple_host_us(len(lengths))
    return row


def profile_ours(o: Ours, row: Row) -> None:
    """The row's device time and kernel categories (the profiling pass, on a session built afresh)."""
    kind, lengths = CASES[row.case]
    row.kernel_sum_us, kernels, row.device_us = profile(o.step_fn(kind, lengths, _api(row.stack)))
    categorize(row, kernels)
    if row.device_us == 0.0 and row.replay_us:  # the profiler saw no kernel inside the graphs: their replay stands
        row.device_us = row.replay_us


# ---- the peer: Hugging Face's GDN layer (FLA kernels where fla imports) ----
class Hf:
    def __init__(self, cfg: GdnConfig):
        from transformers.models.qwen3_next import modeling_qwen3_next as m
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig

        self.m = m
        self.hfc = Qwen3NextConfig(hidden_size=cfg.hidden_size, num_hidden_layers=4, layer_types=list(STACK),
                                   linear_num_key_heads=cfg.linear_num_key_heads,
                                   linear_num_value_heads=cfg.linear_num_value_heads,
                                   linear_key_head_dim=cfg.linear_key_head_dim,
                                   linear_value_head_dim=cfg.linear_value_head_dim,
                                   linear_conv_kernel_dim=cfg.linear_conv_kernel_dim, rms_norm_eps=cfg.rms_norm_eps)
        torch.manual_seed(0)
        self.dt = DT if DEV == "cuda" else torch.float32
        self.layers = [(m.Qwen3NextRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps).to(DEV, self.dt),
                        m.Qwen3NextGatedDeltaNet(self.hfc, i).to(DEV, self.dt)) for i in range(4)]
        self.cfg = cfg

    def kernels_used(self) -> str:
        import inspect

        impl = inspect.getclosurevars(self.m.torch_chunk_gated_delta_rule).nonlocals.get("implementation")
        return getattr(impl, "__module__", "?")

    def forward(self, x: torch.Tensor, cache) -> torch.Tensor:
        with torch.no_grad():
            for norm, attn in self.layers:
                x = x + attn(norm(x), cache=cache)
        return x

    def step_fn(self, kind: str, lengths: list[int]):
        from transformers import DynamicCache

        n, L = len(lengths), lengths[0]
        C = self.cfg.hidden_size
        x = torch.randn(n, L, C, device=DEV).to(self.dt)
        cache = None
        if kind != "prefill":  # decode and verify continue from a state: one token first fills the cache
            cache = DynamicCache(config=self.hfc)
            self.forward(torch.randn(n, 1, C, device=DEV).to(self.dt), cache)
        return lambda: self.forward(x, cache)


def time_hf(h: Hf, case: str, steps: int) -> Row:
    kind, lengths = CASES[case]
    row = Row("hf", case, path=f"eager ({h.kernels_used()})")
    row.take(timed(h.step_fn(kind, lengths), steps))
    return row


def profile_hf(h: Hf, row: Row) -> None:
    kind, lengths = CASES[row.case]
    row.kernel_sum_us, kernels, row.device_us = profile(h.step_fn(kind, lengths))
    categorize(row, kernels)


def _floor(cfg: GdnConfig, case: str) -> tuple[float, float]:
    """Bytes a step must move at least: (the weights, each sequence's state read and written once; verify: read
    once, a stash row written per token)."""
    kind, lengths = CASES[case]
    W, S = weight_bytes(cfg, "bfloat16"), slot_bytes(cfg, "bfloat16")
    n, T = len(lengths), sum(lengths)
    return W, ((n + T) if kind == "verify" else 2 * n) * S


# ---- the results ----
COLUMNS = ["stack", "case", "wall_us", "enqueue_us", "enqueue_cpu_us", "probe_us", "device_us", "kernel_sum_us",
           "replay_us", "floor_us", "wall_over_device", "device_over_floor", "device_over_kernels", "weights_floor_us",
           "state_floor_us", "gemm_us", "gdn_us", "conv_us", "glue_us", "ple_host_us", "path", "error"]


def _get(rows: list[dict], stack: str, case: str) -> dict | None:
    return next((r for r in rows if r["stack"] == stack and r["case"] == case and not r["error"]), None)


def _over_floor(r: dict, bound: float) -> str:
    """Where a step's device time goes past its floor: the excess (device - floor) beside the room the target leaves
    ((bound - 1) x floor); the GDN kernels against the state's term of the floor, the GEMMs against the weights'
    term, and the conv and glue kernels, which have almost no floor of their own. These are kernel sums: with PDL
    they overlap (kernel_sum - device) and a waiting kernel's interval counts its wait."""
    # the excess over the floor measured the same time on an H100 and an H200 (whose copy rates differ 1.41x: 105.6
    # and 109.7 us at N = 64, bench/results/README.md, nineteenth sitting): time that bandwidth does not buy
    return (f"device - floor {r['device_us'] - r['floor_us']:.0f} us, where the bound leaves "
            f"{(bound - 1) * r['floor_us']:.0f}; "
            f"GDN {r['gdn_us']:.0f} us against the state's {r['state_floor_us']:.0f} us at the copy rate "
            f"({r['gdn_us'] / r['state_floor_us']:.2f}x), GEMMs {r['gemm_us']:.0f} against the weights' "
            f"{r['weights_floor_us']:.0f} us ({r['gemm_us'] / r['weights_floor_us']:.2f}x), conv + glue "
            f"{r['conv_us'] + r['glue_us']:.0f} us; the kernels overlap by "
            f"{max(0.0, r['kernel_sum_us'] - r['device_us']):.0f} us (bench/step_trace.py lists them)")


def reading(rows: list[dict], host_ref: tuple[float, float, float] | None = None) -> str:
    """The issues' targets, met or missed, each miss with the term that dominates it. host_ref: this host's
    `static_reference` (wall, CPU us) and `probe_at_rest`."""
    out = ["## Reading (generated from the rows above)", ""]
    if host_ref:
        out.append(f"- this host runs the runtime's own Python of an in-place decode step (bench/host_cpu.py's "
                   f"`static` stub at N = 1, the replay stubbed out) in {host_ref[0]:.1f} us ({host_ref[1]:.1f} us "
                   f"of CPU), and the pure-Python probe in {host_ref[2]:.1f} us at rest: every host enqueue below "
                   "moves with them between hosts")

    def wake(r: dict) -> str:
        """How fast the host ran in the wake of the row's idle calls: the probe after them against at rest."""
        if not host_ref or math.isnan(r["probe_us"]):  # not measured
            return ""
        ratio = r["probe_us"] / host_ref[2]
        return (f"; the probe right after these calls took {r['probe_us']:.1f} us against {host_ref[2]:.1f} at rest "
                f"({ratio:.1f}x)" + (": the host ran slower in the wake of each wait for the GPU" if ratio >= 1.3
                                     else ""))

    def say(ok: bool, what: str, why: str = "") -> None:
        out.append(f"- {'met' if ok else 'MISSED'}: {what}" + ("" if ok or not why else f" -- {why}"))

    for n in NS:
        r = _get(rows, "ours", f"decode {n}")
        if r is None:
            out.append(f"- not measured: ours decode {n}")
            continue
        host_bound = r["enqueue_us"] > r["device_us"]
        say(r["enqueue_us"] <= 40, f"decode N={n}: host enqueue {r['enqueue_us']:.1f} us "
            f"({r['enqueue_cpu_us']:.1f} of CPU) <= 40 us",
            "the open (request check) + input copy, graph launch, output copy + close (the commit): "
            "bench/host_profile.py splits them; the `static` row leaves out the two copies" + wake(r))
        say((r["wall_over_device"] or 9) <= 1.1, f"decode N={n}: wall {r['wall_us']:.0f} us <= 1.1 x device "
            f"{r['device_us']:.0f} us", "host-bound: the enqueue exceeds the device time" if host_bound else
            "gaps on the device between the step's launches (input copy, graph, output copy)")
        bound = 2.0 if n == 1 else 1.25 if n >= 64 else None
        if bound and r["device_over_floor"]:
            say(r["device_over_floor"] <= bound, f"decode N={n}: device / floor {r['device_over_floor']:.2f} <= "
                f"{bound}", _over_floor(r, bound))
        st = _get(rows, "static", f"decode {n}")
        if st:
            say(st["enqueue_us"] <= 40, f"decode N={n}, input and output in place: host enqueue "
                f"{st['enqueue_us']:.1f} us ({st['enqueue_cpu_us']:.1f} of CPU) <= 40 us; wall / device "
                f"{st['wall_over_device'] or 0:.2f}",
                "the open (request check) + graph launch + close (the commit): host speed varies up to 2x between "
                "hosts (the host reference above; bench/host_profile.py splits the phases)" + wake(st))
        d = _get(rows, "dict", f"decode {n}")
        if d:
            out.append(f"- decode N={n}: dict API enqueue {d['enqueue_us']:.0f} us against the batched API's "
                       f"{r['enqueue_us']:.0f} us")
    for case in ("prefill 4096", "varlen 16x1024"):
        r = _get(rows, "ours", case)
        if r and r["device_over_kernels"]:
            say(r["device_over_kernels"] <= 1.3, f"{case}: device {r['device_us']:.0f} us <= 1.3 x its GEMM, GDN "
                f"and conv kernels ({r['device_over_kernels']:.2f}x)", f"glue {r['glue_us']:.0f} us")
    p, q = _get(rows, "ple", "decode 256"), _get(rows, "noPLE", "decode 256")
    if p and p["ple_host_us"] is not None:
        # the alternative: the host part overlaps the previous step. Back to back, a step's open (PLE part
        # included) runs while the GPU still works on the step before: it adds no wall time when the enqueue stays
        # below the device time and the wall stays within 1.1x of it
        hidden = p["enqueue_us"] < p["device_us"] and p["wall_us"] <= 1.1 * p["device_us"]
        say(p["ple_host_us"] <= 100 or hidden, f"PLE host part of a 256-sequence decode step {p['ple_host_us']:.0f} "
            f"us <= 100 us, or overlapping the previous step (enqueue {p['enqueue_us']:.0f} us below the device's "
            f"{p['device_us']:.0f}, wall / device {p['wall_us'] / p['device_us']:.2f} <= 1.1)",
            "hashing and the row gather into pinned staging on the host (bench/host_cpu.py splits them)")
    if p and q:
        ratio = p["wall_us"] / q["wall_us"]
        say(ratio <= 1.2, f"PLE stack's decode step {p['wall_us']:.0f} us <= 1.2 x the same stack without PLE "
            f"{q['wall_us']:.0f} us ({ratio:.2f}x)", f"device {p['device_us']:.0f} against {q['device_us']:.0f} us, "
            f"enqueue {p['enqueue_us']:.0f} against {q['enqueue_us']:.0f} us")
    for case, (kind, _) in CASES.items():
        v, r = _get(rows, "ours", case), _get(rows, "veager", case)
        if kind == "verify" and r and v:
            out.append(f"- {case} ({v['path']}): wall {v['wall_us']:.0f} us, enqueue {v['enqueue_us']:.0f}, device "
                       f"{v['device_us']:.0f} (wall / device {v['wall_over_device'] or 0:.2f}) against eager "
                       f"(`verify_graphs=False`) {r['wall_us']:.0f} / {r['enqueue_us']:.0f} / {r['device_us']:.0f} us "
                       f"({r['wall_over_device'] or 0:.2f})")
    for case in CASES:
        r, h = _get(rows, "ours", case), _get(rows, "hf", case)
        if r and h:
            out.append(f"- {case}: ours {r['wall_us']:.0f} us wall / {r['device_us']:.0f} us device against "
                       f"Hugging Face, {h['path']}: {h['wall_us']:.0f} / {h['device_us']:.0f} us "
                       f"({h['wall_us'] / r['wall_us']:.1f}x / {h['device_us'] / max(r['device_us'], 1e-9):.1f}x)")
    bad = [f"{r['stack']} {r['case']}: {r['error']}" for r in rows if r["error"]]
    if bad:
        out += ["", "Rows that failed: " + "; ".join(bad)]
    return "\n".join(out) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(17, 4.8))
    for stack, style in (("ours", "o-"), ("static", "d-"), ("dict", "s--"), ("ple", "^-"), ("noPLE", "v:"),
                         ("hf", "x-")):
        rs = [r for r in rows if r["stack"] == stack and r["case"].startswith("decode") and not r["error"]]
        if not rs:
            continue
        n = [int(r["case"].split()[1]) for r in rs]
        a.plot(n, [r["wall_us"] for r in rs], style, label=f"{stack} wall")
        b.plot(n, [r["enqueue_us"] for r in rs], style, label=stack)
        if stack == "ours":
            a.plot(n, [r["device_us"] for r in rs], "o:", label="ours device")
            a.plot(n, [r["floor_us"] for r in rs], "k-", lw=1, label="floor")
    b.axhline(40, color="r", lw=1, label="target 40 us")
    for ax, title in ((a, "decode step (us)"), (b, "host enqueue, idle GPU (us)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequences (N)")
        ax.set_title(f"4 GDN layers: {title}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    bars = [r for r in rows if r["stack"] in ("ours", "hf") and not r["error"]]
    colors = {"gemm": "tab:blue", "gdn": "tab:green", "conv": "tab:olive", "glue": "tab:red"}
    bottom = [0.0] * len(bars)
    for cat, col in colors.items():
        vals = [r[f"{cat}_us"] for r in bars]
        c.bar(range(len(bars)), vals, bottom=bottom, color=col, label=cat)
        bottom = [x + v for x, v in zip(bottom, vals)]
    c.set_xticks(range(len(bars)), [f"{r['stack']} {r['case']}" for r in bars], rotation=70, ha="right", fontsize=7)
    c.set_yscale("log")
    c.set_title("device time by kernel category (us)")
    c.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---- the run ----
def plan(only: set[str]) -> list[tuple[str, str]]:
    """Rows in order of priority under the deadline: our decode, the PLE pair, our other modes, the peer, the dict
    API. Rows of one stack stay together (one stack's buffers at a time; a stack is built once per run of rows)."""
    dec = [c for c in (f"decode {n}" for n in NS) if c in CASES]
    out = [("ours", c) for c in dec] if "ours" in only else []
    if "ple" in only:
        out += [(s, c) for s in ("ple", "noPLE") for c in dec]
    if "ours" in only:
        out += [("ours", c) for c in CASES if c not in dec]
    if "veager" in only:
        out += [("veager", c) for c, (kind, _) in CASES.items() if kind == "verify"]
    if "hf" in only:
        out += [("hf", c) for c in CASES]
    if "static" in only:
        out += [("static", c) for c in dec]
    if "dict" in only:
        out += [("dict", c) for c in dec]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--deadline", type=float, default=225.0, help="seconds after which rows not started are skipped")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", default="ours,static,dict,ple,hf,veager")
    ap.add_argument("--cases", help="comma-separated case names to run (default: every case)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, measures nothing")
    args = ap.parse_args()
    global DEV, NS, CASES
    t0 = time.perf_counter()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    if args.smoke:
        DEV, NS = "cpu", (1, 8)
        CASES = {f"decode {n}": ("decode", [1] * n) for n in NS}
        CASES.update({"verify 4x2": ("verify", [2] * 4), "prefill 64": ("prefill", [64]),
                      "varlen 4x16": ("prefill", [16] * 4)})
        meta = {"date": time.strftime("%Y-%m-%d"), "smoke": "CPU, tiny shapes: no figure here means anything"}
    else:
        meta = device_info()
    if args.cases:
        want = set(args.cases.split(","))
        if want - set(CASES):
            ap.error(f"unknown cases {sorted(want - set(CASES))}; the cases are {list(CASES)}")
        CASES = {c: v for c, v in CASES.items() if c in want}
    cfgs = configs(args.smoke)
    meta.update({"activations": "bfloat16", "state": "float32", "steps": args.steps,
                 "configs": {k: c.name for k, c in cfgs.items()},
                 "conv_in_gemm": glue_tri.TUNING.conv_in_gemm,  # GDN_TRT_CONV_IN_GEMM: the A/B of gpu-all.sh conv
                 "norm_in_decode": glue_tri.TUNING.norm_in_decode,  # GDN_TRT_NORM_IN_DECODE: gpu-all.sh norm
                 "graph_io": graphs.IO})  # GDN_TRT_GRAPH_IO: the A/B of gpu-all.sh io
    # before any stack is built or profiled: the host's own speed, the term that moves every enqueue figure
    host_ref = tuple(round(v, 2) for v in (*static_reference(), probe_at_rest()))
    meta.update(host_ref_us=host_ref[0], host_ref_cpu_us=host_ref[1], probe_rest_us=host_ref[2])
    rows: dict[tuple[str, str], Row] = {}
    skipped: list[str] = []
    bw = {"best": 1e11}  # the copy rate stands in at 100 GB/s on the CPU (--smoke)
    try:
        bw = copy_bandwidth() if DEV == "cuda" else bw
        meta.update({f"copy_{k}": round(v, 3) for k, v in bw.items() if k != "best"})
        # two passes, each under --deadline: every row's host and wall figures first, then every row's device time.
        # Once torch.profiler has run in a process, CUPTI stays attached (torch keeps it for CUDA graphs) and every
        # later launch pays for it: a step's enqueue in place went 16.4 / 28.5 / 25.9 us -> 37.0 / 40.7 / 45.6 us
        # at N = 1 / 8 / 64 after one profile (H200, 2026-12-04), so no row may be timed after any is profiled
        for timing in (True, False):
            made: dict = {}
            t_pass = time.perf_counter()
            for stack, case in plan(set(args.only.split(","))):
                row = rows.get((stack, case))
                if not timing and (row is None or row.error):
                    continue
                if time.perf_counter() - t_pass > args.deadline:
                    skipped.append(f"{stack} {case}: deadline of the {'timing' if timing else 'profiling'} pass")
                    continue
                try:
                    key = _built(stack)
                    if key not in made:  # the session of "ours" is rebuilt after the PLE pair (fresh pools)
                        made.clear()  # one stack's buffers at a time
                        if DEV == "cuda":
                            torch.cuda.empty_cache()
                        made[key] = Hf(cfgs["ours"]) if key == "hf" else \
                            Ours(cfgs[key], False if key == "veager" else None)
                    if timing:
                        rows[(stack, case)] = row = time_hf(made[key], case, args.steps) if stack == "hf" else \
                            time_ours(made[key], stack, case, args.steps)
                    elif stack == "hf":
                        profile_hf(made[key], row)
                        meta["hf_kernels"] = made[key].kernels_used()
                    else:
                        profile_ours(made[key], row)
                except SystemExit:
                    raise
                except Exception as e:  # noqa: BLE001 - recorded in the results, never hidden
                    what = f"{type(e).__name__}: {str(e)[:300]}"
                    if timing:
                        rows[(stack, case)] = row = Row(stack, case, error=what)
                    else:
                        row.error = f"profiling: {what}"
                    print(traceback.format_exc(), flush=True)
                print(f"{'time' if timing else 'profile':<7} {stack:<6} {case:<15} wall {row.wall_us:9.1f}  enqueue "
                      f"{row.enqueue_us:8.1f}  device {row.device_us:9.1f}  gemm {row.gemm_us:7.1f} gdn "
                      f"{row.gdn_us:7.1f} conv {row.conv_us:6.1f} glue {row.glue_us:7.1f}  {row.path} {row.error}",
                      flush=True)
            made.clear()
    except SystemExit:
        skipped.append("stopped by SIGTERM (time limit): the rows after the last one printed were not measured")
    finally:
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        if skipped:
            meta["skipped"] = skipped
        # hf rows: the peer on the shapes of ours
        out = [asdict(r.finish(bw["best"], _floor(cfgs["ours" if r.stack == "hf" else _built(r.stack)], r.case)))
               for r in rows.values()]
        paths = write_results("runtime", out, meta, COLUMNS, plot, args.out, notes=reading(out, host_ref))
        print("wrote", *paths, flush=True)




if __name__ == "__main__":
    main()
