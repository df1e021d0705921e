"""One GDN layer's device time per mode with three kinds of glue (the norms, gates and residual arithmetic around
the GEMMs and the GDN / conv kernels):
- torch:    the layer's torch code op by op (what the CPU reference and the ONNX export run);
- fused:    the Triton kernels of plugins/glue (the layer's default on CUDA);
- compiled: the torch code compiled by torch.compile (Inductor, default mode, static shapes), the gdn_trt ops opaque.

    python bench/glue.py [--out DIR] [--deadline S] [--only qwen3-next,qwen4-exp-ple] [--compile-cases a,b]

Layers: Qwen3-Next (plain residual, no dense MLP) and Qwen4-Exp's PLE layer (4 hc streams of 2560, PLE, sigmoid
output gate), both with real shapes, bf16 activations and fp32 state, synthetic weights. Four copies of the layer
with different weights (a 4-layer stack) run in turn so the weights are not served from L2; each figure is per
layer. Per (model, case, glue):
- device_us: CUDA-graph replay time per layer (bench/common.time_cuda), the figure the runtime's graphs see;
- gemm/gdn/conv/glue_us: device time of the kernels of each category (torch.profiler, eager), and n_kernels;
- floor_us (decode modes): the layer's weights plus each sequence's state read and written once (verify: the
  stash written per token), at the copy bandwidth measured in the same run; target: the issue's ratio;
- host_us: the duration of one eager call started on an idle GPU (Python and launch cost), taken in a first pass
  over every row, before any profile (CUPTI, once attached, slows every launch);
- err: relative RMS difference of the layer output from the torch glue's on the same inputs and start state.
Writes `<out>/<date>-glue.{json,md,png}`; a run cut by its deadline writes what it measured and says so.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# bench/common.py: Python puts the script's folder first on sys.path (run as `python bench/<name>.py`)
from common import RESULTS, copy_bandwidth, device_info, kernel_profile, time_cuda, write_results

from gdn_trt.model.checkpoint import random_layer
from gdn_trt.model.config import PRESETS, GdnConfig
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput
from gdn_trt.plugins.packing import Packing

DT = torch.bfloat16
DEV = "cuda"
COPIES = 4
MODELS = {"qwen3-next": ("qwen3-next-80b-a3b", 0), "qwen4-exp-ple": ("qwen4-exp", 1)}
# name -> (mode, tokens per sequence); decode N = 1 and N >= 64 and both prefills carry the targets
CASES = {
    "decode N=1": (LayerMode.DECODE, [1]),
    "decode N=64": (LayerMode.DECODE_MULTI_SEQ, [1] * 64),
    "decode N=256": (LayerMode.DECODE_MULTI_SEQ, [1] * 256),
    "decode_batched K=4": (LayerMode.DECODE_BATCHED, [4]),
    "verify 64x4": (LayerMode.VERIFY_MULTI, [4] * 64),
    "prefill 4096": (LayerMode.PREFILL, [4096]),
    "varlen 16x1024": (LayerMode.PREFILL_VARLEN, [1024] * 16),
}
COMPILE_CASES = ("decode N=1", "prefill 4096", "decode N=64")  # in order of priority under a deadline
SLOTS = 256
GLUES = ("torch", "fused", "compiled")


def category(kernel: str) -> str:
    """GEMM (cuBLAS / CUTLASS), our GDN and conv kernels, and everything else (the glue)."""
    k = kernel.lower()
    if k.startswith("gdn_"):
        return "gdn"
    if k.startswith("conv_"):
        return "conv"
    if any(s in k for s in ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk", "cublas")):
        return "gemm"
    return "glue"


@dataclass
class Stack:
    """COPIES layers of one model (different weights), each with its own pools of SLOTS sequences."""

    cfg: GdnConfig
    layers: list[GdnLayer]
    states: list[LayerState]
    start: LayerState  # layer 0's pools as built: every glue's checked output starts from them

    @staticmethod
    def build(model: str) -> "Stack":
        name, index = MODELS[model]
        cfg = PRESETS[name]
        spec = BufferSpec(DT, DEV)
        layers, states = [], []
        for k in range(COPIES):
            lw = random_layer(cfg, index, torch.Generator().manual_seed(k)).astype(DT)
            layers.append(GdnLayer(cfg, lw, DT).to(DEV))
            st = LayerState.allocate(cfg, index, SLOTS, spec)
            for t in st.tensors():
                t.normal_(0, 0.1)
            states.append(st)
        return Stack(cfg, layers, states, _clone(states[0]))

    def weight_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.layers[0].buffers())

    def state_bytes(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.states[0].tensors())


@dataclass
class Step:
    mode: LayerMode
    step: StepInput
    extras: list


def make_step(stack: Stack, case: str) -> Step:
    mode, lengths = CASES[case]
    cfg, index = stack.cfg, stack.layers[0].index
    T, N = sum(lengths), len(lengths)
    g = torch.Generator(device=DEV).manual_seed(T + N)
    rnd = lambda *s: torch.randn(*s, device=DEV, generator=g).to(DT)  # noqa: E731
    step = StepInput(rnd(T, cfg.stream_dim), Packing.build(lengths, list(range(N)), DEV),
                     None if cfg.is_hc else rnd(T, cfg.stream_dim),
                     rnd(T, cfg.ple_heads, cfg.ple_head_dim) if stack.layers[0].ple is not None else None)
    spec = BufferSpec(DT, DEV)
    if mode.spec.writes is Writes.STASH:
        extras = [StateStash.allocate(cfg, index, T, spec) for _ in range(COPIES)]
    elif mode.spec.writes is Writes.POOLS_CAPTURE:
        extras = [StateCapture.none(cfg, index, N, spec)] * COPIES
    else:
        extras = [None] * COPIES
    return Step(mode, step, extras)


def floor_us(stack: Stack, case: str, bandwidth: float) -> float | None:
    mode, lengths = CASES[case]
    if mode.spec.writes is Writes.POOLS_CAPTURE:
        return None
    T, N = sum(lengths), len(lengths)
    written = T if mode.spec.writes is Writes.STASH else N  # stash rows per token, or the pool row per sequence
    return (stack.weight_bytes() + (N + written) * stack.state_bytes()) / bandwidth * 1e6


@dataclass
class Row:
    model: str
    case: str
    glue: str
    device_us: float
    p10_us: float
    p90_us: float
    gemm_us: float
    gdn_us: float
    conv_us: float
    glue_us: float
    n_kernels: float
    host_us: float
    err: float
    floor_us: float | None = None
    over_floor: float | None = None
    over_kernels: float | None = None  # device / (gemm + gdn + conv)
    compile_s: float | None = None
    timing: str = ""
    kernels: dict = field(default_factory=dict)


class Runner:
    """Calls of one (stack, case, glue): fn(i) runs layer i % COPIES on its own pools."""

    def __init__(self, stack: Stack, step: Step, glue: str):
        self.stack, self.s, self.glue = stack, step, glue
        self.arm()
        self.compile_s = None
        self.body = self._run
        if glue == "compiled":
            t = time.perf_counter()
            # the layer is an argument: one compile serves the four copies (no guard on the module's identity)
            self.body = torch.compile(self._run, dynamic=False)
            self(0)
            _sync()
            self.compile_s = time.perf_counter() - t

    def arm(self, on: bool = True) -> None:
        """Set the stack's layers to this runner's glue (compiled: the torch code, the layer never fuses under
        compile); off: back to the layers' default. The runners of one model share its layers."""
        for layer in self.stack.layers:
            layer.fused_glue = (self.glue == "fused") if on else None

    def _run(self, layer: GdnLayer, state: LayerState, extra):
        return layer.run(self.s.mode, self.s.step, state, extra)[0].x

    def __call__(self, i: int):
        k = i % COPIES
        return self.body(self.stack.layers[k], self.stack.states[k], self.s.extras[k])

    def output(self) -> torch.Tensor:
        """Layer 0's output from a copy of the stack's start state (the same for every glue)."""
        return self.body(self.stack.layers[0], _clone(self.stack.start), self.s.extras[0])


def _clone(st: LayerState) -> LayerState:
    return LayerState(*[t.clone() if t is not None else None for t in (st.conv, st.ssm, st.ple_conv)])


def _sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def host_us(run: Runner) -> float:
    times = []
    for i in range(12):
        _sync()
        t = time.perf_counter()
        run(i)
        times.append(time.perf_counter() - t)
    _sync()
    return statistics.median(times[2:]) * 1e6


def measure(model: str, stack: Stack, case: str, glue: str, ref: torch.Tensor | None, bw: float
            ) -> tuple[Row, torch.Tensor, Runner]:
    """The timing pass's figures of one row (no profiler may have run in the process yet: see `main`)."""
    step = make_step(stack, case)
    run = Runner(stack, step, glue)
    out = run.output()
    err = 0.0 if ref is None else ((out.double() - ref.double()).pow(2).mean().sqrt()
                                   / ref.double().pow(2).mean().sqrt()).item()
    t = time_cuda(run, n_sets=COPIES)
    row = Row(model, case, glue, t.median_us, t.p10_s * 1e6, t.p90_s * 1e6, 0.0, 0.0, 0.0, 0.0, 0.0, host_us(run),
              err, compile_s=run.compile_s, timing=t.method)
    row.floor_us = floor_us(stack, case, bw)
    if row.floor_us:
        row.over_floor = row.device_us / row.floor_us
    run.arm(False)
    return row, out, run


def profile_row(row: Row, run: Runner) -> None:
    """The profiling pass's figures of one row: device time per kernel category, kernels per layer."""
    run.arm()
    times, events = kernel_profile(lambda: [run(i) for i in range(COPIES)])
    kernels = {k: v / COPIES for k, v in times.items()}
    cat = {c: 0.0 for c in ("gemm", "gdn", "conv", "glue")}
    for k, v in kernels.items():
        cat[category(k)] += v
    row.gemm_us, row.gdn_us, row.conv_us, row.glue_us = cat["gemm"], cat["gdn"], cat["conv"], cat["glue"]
    row.kernels = {k: round(v, 2) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])}
    row.n_kernels = events / COPIES
    row.over_kernels = row.device_us / max(1e-9, row.gemm_us + row.gdn_us + row.conv_us)
    run.arm(False)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(8 * len(models), 5.5), squeeze=False)
    colors = {"gemm": "tab:blue", "gdn": "tab:green", "conv": "tab:olive", "glue": "tab:red", "gaps": "lightgray"}
    for ax, model in zip(axes[0], models):
        rs = [r for r in rows if r["model"] == model]
        labels = [f"{r['case']}\n{r['glue']}" for r in rs]
        bottom = [0.0] * len(rs)
        for c in colors:
            vals = [max(0.0, r["device_us"] - r["gemm_us"] - r["gdn_us"] - r["conv_us"] - r["glue_us"])
                    if c == "gaps" else r[f"{c}_us"] for r in rs]
            ax.bar(range(len(rs)), vals, bottom=bottom, color=colors[c], label=c)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, r in enumerate(rs):
            if r.get("floor_us"):
                ax.plot([i - 0.4, i + 0.4], [r["floor_us"]] * 2, color="k", lw=1.5)
        ax.set_yscale("log")
        ax.set_xticks(range(len(rs)), labels, rotation=70, ha="right", fontsize=7)
        ax.set_ylabel("device time per layer (us); black bar: floor")
        ax.set_title(f"{model}: one layer, bf16, H200")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


COLUMNS = ["model", "case", "glue", "device_us", "gemm_us", "gdn_us", "conv_us", "glue_us", "n_kernels", "floor_us",
           "over_floor", "over_kernels", "host_us", "err", "compile_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which remaining rows are skipped")
    ap.add_argument("--only", default=",".join(MODELS))
    ap.add_argument("--compile-cases", default=",".join(COMPILE_CASES))
    args = ap.parse_args()
    t0 = time.perf_counter()
    torch._dynamo.config.cache_size_limit = 64
    meta = device_info()
    bw = copy_bandwidth()
    meta.update({f"copy_{k}": round(v, 3) for k, v in bw.items() if k != "best"}, copies=COPIES,
                activations="bfloat16", state="float32")
    print("device", meta, flush=True)
    rows: list[Row] = []
    skipped = []
    stacks = {m: Stack.build(m) for m in args.only.split(",")}
    compile_cases = [c for c in args.compile_cases.split(",") if c]
    # torch and fused first for every case, then the compiled rows (compiles are the long part)
    plan = [(m, c, g) for m in stacks for c in CASES for g in ("torch", "fused")]
    plan += [(m, c, "compiled") for c in compile_cases for m in stacks]
    refs: dict[tuple[str, str], torch.Tensor] = {}
    # a run cut by `timeout` (SIGTERM) still writes what it measured, and says so in the meta
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    # two passes: every row's replay and host figures first, then every row's kernels. Once torch.profiler has run
    # in a process, CUPTI stays attached and every later launch pays for it (bench/runtime.py measured a step's
    # enqueue more than doubled at N = 1, H200, 2026-12-04), so no row's host_us may be taken after any profile.
    runners: list[Runner] = []  # rows[i]'s, for the profiling pass
    for m, c, g in plan:
        if time.perf_counter() - t0 > args.deadline:
            skipped.append(f"{m} {c} {g}: deadline")
            continue
        try:
            row, out, run = measure(m, stacks[m], c, g, refs.get((m, c)), bw["best"])
        except SystemExit:
            skipped.append(f"{m} {c} {g}: stopped by SIGTERM (time limit) with the rows after it")
            break
        except Exception as e:  # noqa: BLE001 - recorded in the results, never hidden
            skipped.append(f"{m} {c} {g}: {type(e).__name__}: {str(e)[:200]}")
            print("FAILED", skipped[-1], flush=True)
            continue
        if g == "torch":
            refs[(m, c)] = out
        rows.append(row)
        runners.append(run)
        print(f"{m:<14} {c:<20} {g:<9} device {row.device_us:9.1f} us  host {row.host_us:7.1f}  floor "
              f"{row.floor_us or 0:7.1f}  err {row.err:.1e}", flush=True)
    for row, run in zip(rows, runners):
        try:
            profile_row(row, run)
        except SystemExit:
            skipped.append(f"{row.model} {row.case} {row.glue} and the rows after it: no kernel breakdown "
                           "(stopped by SIGTERM)")
            break
        except Exception as e:  # noqa: BLE001
            skipped.append(f"{row.model} {row.case} {row.glue}: no kernel breakdown: {type(e).__name__}: "
                           f"{str(e)[:200]}")
            print("FAILED", skipped[-1], flush=True)
            continue
        print(f"{row.model:<14} {row.case:<20} {row.glue:<9} gemm {row.gemm_us:8.1f} gdn {row.gdn_us:7.1f} "
              f"conv {row.conv_us:6.1f} glue {row.glue_us:7.1f}  kernels {row.n_kernels:5.1f}", flush=True)
    if skipped:
        meta["skipped"] = skipped
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    paths = write_results("glue", [asdict(r) for r in rows], meta, COLUMNS, plot, args.out)
    print("wrote", *paths, flush=True)


if __name__ == "__main__":
    main()
