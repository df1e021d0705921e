"""Shared helpers of the GPU benchmarks (kernels here, the runtime benchmark later).

- `time_cuda(fn)`: steady-state time of one call. `fn(i)` launches call i (i picks one of several input sets, so
  repeated calls do not find their data in L2); `inner` calls are captured in one CUDA graph and the graph is
  replayed `reps` times, each replay timed with CUDA events; the per-call time is replay time / inner, and the
  median, 10th and 90th percentiles over replays are reported. When capture fails (a peer that synchronises
  with the host), the same loop runs eagerly and the timing says so.
- `copy_bandwidth()`: device-to-device copy, bytes read + written per second, measured in the same run: the
  ceiling that memory-bound kernels are compared with.
- `write_results()`: `<out>/<date>-<name>.json` (meta + rows), `.md` (a markdown table) and `.png` (a plot).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import inspect
import json
import math
import platform
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

import torch

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    method: str  # "graph" (CUDA-graph replay) or "eager: <why capture failed>"
    inner: int  # calls per timed replay

    @property
    def median_us(self) -> float:
        return self.median_s * 1e6


def _percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _events_loop(run: Callable[[], None], reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    return times


def time_cuda(fn: Callable[[int], object], n_sets: int = 1, target_s: float = 2e-3, reps: int = 25,
              max_inner: int = 512) -> Timing:
    """Per-call steady-state time of `fn(i)` (see the module docstring). `n_sets`: how many input sets fn rotates
    through; `inner` is a multiple of it, chosen so one replay lasts about `target_s`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(max(2, n_sets)):  # compile, autotune, allocate
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    one = statistics.median(_events_loop(lambda: fn(0), 5))
    inner = max(n_sets, min(max_inner, math.ceil(target_s / max(one, 1e-7))))
    inner = math.ceil(inner / n_sets) * n_sets
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(inner):
                fn(i)
        graph.replay()
        torch.cuda.synchronize()
        times, method = _events_loop(graph.replay, reps), "graph"
    except Exception as e:  # noqa: BLE001 - reported in the result, never hidden
        torch.cuda.synchronize()
        method = f"eager: capture failed ({type(e).__name__}: {str(e)[:80]})"
        times = _events_loop(lambda: [fn(i) for i in range(inner)], reps)
    per = [t / inner for t in times]
    return Timing(statistics.median(per), _percentile(per, 0.1), _percentile(per, 0.9), method, inner)


def copy_bandwidth(nbytes: int = 2 << 30) -> dict:
    """Bytes (read + written) per second of a large device-to-device copy (`dst.copy_(src)`, 2 GiB each way),
    after a warm-up that brings the clocks up: timed eagerly (events around 10 copies) and by graph replay.
    Returns both and `best`, the ceiling the memory-bound kernels are compared with."""
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(30):
        dst.copy_(src)
    torch.cuda.synchronize()
    eager = statistics.median(_events_loop(lambda: [dst.copy_(src) for _ in range(10)], 7)) / 10
    graph = time_cuda(lambda i: dst.copy_(src), target_s=20e-3, reps=15).median_s
    out = {"eager_TBps": 2 * nbytes / eager / 1e12, "graph_TBps": 2 * nbytes / graph / 1e12}
    out["best"] = max(out.values()) * 1e12
    return out


def kernel_profile(fn: Callable[[], object], iters: int = 5) -> tuple[dict[str, float], float]:
    """From one torch.profiler run (CUDA activity, eager): the mean device time per call (us) of each kernel `fn`
    launches, and the number of device events (kernels, copies) per call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    events = 0
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0.0)
        if t > 0 and ev.key and not ev.key.startswith(("cudaLaunch", "cudaStream", "ProfilerStep")):
            out[ev.key] = out.get(ev.key, 0.0) + t / iters
            events += ev.count
    return out, events / iters


def kernel_breakdown(fn: Callable[[], object], iters: int = 5) -> dict[str, float]:
    """Mean device time per call (us) of each kernel `fn` launches (`kernel_profile`)."""
    return kernel_profile(fn, iters)[0]


def device_info() -> dict:
    p = torch.cuda.get_device_properties(0)
    info = {"gpu": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
            "memory_gib": round(p.total_memory / 2**30, 1), "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "date": _dt.date.today().isoformat()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def n_sets_for(bytes_per_set: int, cover: int = 256 << 20, cap: int = 64) -> int:
    """Input sets to rotate through so one pass over them is several times the L2 (60 MB on the H200)."""
    return max(1, min(cap, math.ceil(cover / max(1, bytes_per_set))))


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_results(name: str, rows: list[dict], meta: dict, columns: list[str],
                  plot: Callable[[list[dict], Path], None] | None = None, out_dir: Path = RESULTS,
                  notes: str = "") -> list[Path]:
    """Write `<date>-<name>.json`, `.md` and (with `plot`) `.png` into out_dir; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"{meta.get('date') or _dt.date.today().isoformat()}-{name}"
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    paths[0].write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=_jsonable) + "\n")
    head = f"# {name} ({meta.get('gpu', '?')}, {meta.get('date', '')})\n\n"
    head += "".join(f"- {k}: {v}\n" for k, v in meta.items() if k not in ("gpu", "date")) + "\n"
    paths[1].write_text(head + markdown_table(rows, columns) + ("\n" + notes if notes else ""))
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        paths.append(stem.with_suffix(".png"))
        plot(rows, paths[-1])
    return paths


def _jsonable(v):
    if isinstance(v, Timing):
        return asdict(v)
    if isinstance(v, torch.dtype):
        return str(v)
    return str(v)


@contextlib.contextmanager
def pdl_off(module: ModuleType | None):
    """`with pdl_off(module):` the kernels launched by `module`'s functions that pass `pdl.options` to a launch go
    without programmatic dependent launch (their PDL constexpr False, no launch attribute), whatever `pdl.scope` says;
    None changes nothing. Each such function is wrapped so that `pdl.options` answers {} during its calls: the switch
    is on the host side, so a JIT kernel keeps reading the real `pdl` module (a stand-in swapped into a module's `pdl`
    global failed for the skinny GEMM's kernel under Triton 3.6, a NameError)."""
    from gdn_trt.plugins import pdl

    def without(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args, **kwargs):
            options = pdl.options
            pdl.options = lambda device: {}
            try:
                return fn(*args, **kwargs)
            finally:
                pdl.options = options

        return call

    real = {} if module is None else {
        name: f for name, f in vars(module).items()
        if inspect.isfunction(f) and f.__module__ == module.__name__ and "pdl.options(" in inspect.getsource(f)}
    for name, f in real.items():
        setattr(module, name, without(f))
    try:
        yield
    finally:
        for name, f in real.items():
            setattr(module, name, f)


def bar_figure(path, rows: list[dict], names: list[str], value, ylabel: str, ylim: tuple[float, float],
                 title: str, lines: tuple[tuple[float, str, str | None], ...] = ()) -> None:
    """A figure of one group of bars per N of `rows` (labelled "N = n"), one bar per variant of `names` in each:
    `value(row)` of that variant's row at that N (0 where it has none), a legend label per variant; a horizontal
    line at 1.0 and at each (y, colour, label) of `lines`; saved to `path`."""
    import matplotlib.pyplot as plt

    ns = sorted({r["n"] for r in rows})
    w = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, name in enumerate(names):
        ys = [next((value(r) for r in rows if r["variant"] == name and r["n"] == n), 0) for n in ns]
        ax.bar([k + i * w for k in range(len(ns))], ys, w, label=name)
    ax.set_xticks([k + 0.4 - w / 2 for k in range(len(ns))], [f"N = {n}" for n in ns])
    for y, colour, label in lines:
        ax.axhline(y, color=colour, lw=0.8, ls="--", label=label)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_ylabel(ylabel)
    ax.set_ylim(*ylim)
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
