"""The decode-step switches written without a device, timed against each other in one process: `bench/runtime.py`'s
`ours` stack (4 Qwen3-Next layers, bf16, CUDA graphs) with each switch on alone, all on, and all off.

    python bench/switches.py [--rounds 2] [--steps 100] [--only off,conv,norm,io,all] [--out DIR] [--smoke]

The switches (each off by default until a run like this one has timed it):
- `conv`: the conv update in in_proj's epilogue (`plugins/glue/triton.Tuning.conv_in_gemm`, GDN_TRT_CONV_IN_GEMM);
- `norm`: the gated output norm in the GDN decode's epilogue (`Tuning.norm_in_decode`, GDN_TRT_NORM_IN_DECODE);
- `io`: the decode graph's input and output by address (`runtime/graphs.IO`, GDN_TRT_GRAPH_IO).

Per configuration and round a fresh session; the rounds interleave the configurations, and Triton compiles each
kernel once per process (the separate processes of `gpu-all.sh conv`, `io` and `norm` compile and capture again
for every run). Per N in {1, 8, 64, 256}: the in-place step (`static`: `step.input()`, `run(..., copy=False)`) and
`run(x)` with its copies (`ours`): wall per step and host enqueue on an idle GPU (`runtime.timed`), and for the
bucket's graph its device time by CUDA events around back-to-back replays (`runtime.replay_us`: no torch.profiler
runs in this process, whose CUPTI would tax every later launch). The session's graph gate failures and each step's
path are recorded: a switch whose graph failed its gate runs eagerly, and its figures say nothing of the switch.
Each cell of the table is the smallest of its rounds, beside the floor (`runtime._floor` at the copy rate measured
here) and the ratio to `off` in the same column. Writes `<out>/<date>-switches.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import runtime as rb  # bench/runtime.py (the script's folder is first on sys.path)
from common import RESULTS, copy_bandwidth, device_info, write_results

from gdn_trt.plugins.glue import triton as glue_tri
from gdn_trt.runtime import graphs

CONFIGS = {"off": {}, "conv": {"conv": True}, "norm": {"norm": True}, "io": {"io": True},
           "all": {"conv": True, "norm": True, "io": True}}
APIS = {"static": "static", "ours": "batched"}
COLUMNS = ["config", "case", "api", "wall_us", "enqueue_us", "replay_us", "floor_us", "replay_over_floor",
           "wall_vs_off", "enqueue_vs_off", "replay_vs_off", "rounds", "path", "error"]


def switch(base: glue_tri.Tuning, on: dict) -> None:
    """Set the three switches for the next session (graphs.IO is read when a session's graph cache is made)."""
    glue_tri.TUNING = replace(base, conv_in_gemm=on.get("conv", False), norm_in_decode=on.get("norm", False))
    graphs.IO = on.get("io", False)


def measure(name: str, ns: tuple[int, ...], steps: int) -> tuple[list[dict], list[str]]:
    """One round of one configuration on a fresh session: its rows and its graph gate failures."""
    o = rb.Ours(rb.configs(rb.DEV == "cpu")["ours"])
    rows = []
    for n in ns:
        replay = None
        for api, how in APIS.items():
            row = {"config": name, "case": f"decode {n}", "api": api, "error": ""}
            try:
                fn = o.step_fn("decode", [1] * n, how)
                fn()  # a bucket's first step captures its graph and runs the acceptance gate
                kinds = o.sess.stats().kinds
                before = {k: dict(v.paths) for k, v in kinds.items()}
                t = rb.timed(fn, steps)
                row["wall_us"], row["enqueue_us"] = t.wall, t.enqueue
                row["path"] = ",".join(sorted({p for k, v in kinds.items() for p, c in v.paths.items()
                                               if c > before[k].get(p, 0)}))
                if replay is None and rb.DEV == "cuda":
                    graph = o.sess.graphs.replayable(n)
                    replay = rb.replay_us(graph) if graph else float("nan")
                row["replay_us"] = replay
            except Exception as e:  # noqa: BLE001 - recorded in the results, never hidden
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(traceback.format_exc(), flush=True)
            rows.append(row)
            print(f"{name:<5} {row['case']:<11} {api:<7} wall {row.get('wall_us', float('nan')):8.1f}  enqueue "
                  f"{row.get('enqueue_us', float('nan')):7.1f}  replay {row.get('replay_us') or float('nan'):8.1f}  "
                  f"{row.get('path', '')} {row['error']}", flush=True)
    failures = list(o.sess.stats().graphs.gate_failures)
    del o
    gc.collect()
    if rb.DEV == "cuda":
        torch.cuda.empty_cache()
    return rows, failures


def combine(runs: list[dict], bw: float, ns: tuple[int, ...]) -> list[dict]:
    """Per (config, case, api): the smallest figure of its rounds, the floor, and the ratios to `off`."""
    cfg = rb.configs(rb.DEV == "cpu")["ours"]
    cells: dict[tuple, dict] = {}
    for r in runs:
        key = (r["config"], r["case"], r["api"])
        c = cells.setdefault(key, {"config": key[0], "case": key[1], "api": key[2], "rounds": 0, "path": set(),
                                   "error": ""})
        c["rounds"] += 1
        c["path"].add(r.get("path", ""))
        c["error"] = c["error"] or r["error"]
        for k in ("wall_us", "enqueue_us", "replay_us"):
            v = r.get(k)
            if v is not None and not np.isnan(v):
                c[k] = min(c.get(k, v), v)
    out = []
    for c in cells.values():
        c["path"] = ",".join(sorted(p for p in c["path"] if p))
        c["floor_us"] = sum(rb._floor(cfg, c["case"])) / bw * 1e6
        if c.get("replay_us"):
            c["replay_over_floor"] = c["replay_us"] / c["floor_us"]
        off = cells.get(("off", c["case"], c["api"]), {})
        for k in ("wall", "enqueue", "replay"):
            if c.get(f"{k}_us") and off.get(f"{k}_us"):
                c[f"{k}_vs_off"] = c[f"{k}_us"] / off[f"{k}_us"]
        out.append(c)
    order = {n: i for i, n in enumerate(CONFIGS)}
    return sorted(out, key=lambda c: (int(c["case"].split()[1]), c["api"], order[c["config"]]))


def reading(rows: list[dict], failures: dict[str, list[str]]) -> str:
    lines = ["## Reading (generated from the rows above)", ""]
    for name, f in failures.items():
        if f:
            lines.append(f"- {name}: graph gate failures {f}: its decode ran eagerly; its figures do not time it")
    for r in rows:
        if r["config"] == "off" or r["error"]:
            continue
        parts = [f"{k} {r[f'{k}_vs_off']:.3f}" for k in ("replay", "enqueue", "wall") if r.get(f"{k}_vs_off")]
        lines.append(f"- {r['config']} {r['case']} {r['api']}: against off " + ", ".join(parts))
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    cases = sorted({r["case"] for r in rows}, key=lambda c: int(c.split()[1]))
    width = 0.8 / len(CONFIGS)
    for ax, (api, key, label) in zip(axes, (("static", "replay_us", "device time of the step's graph / floor"),
                                            ("ours", "enqueue_us", "host enqueue of run(x), us"))):
        for k, name in enumerate(CONFIGS):
            ys = []
            for case in cases:
                r = next((r for r in rows if r["config"] == name and r["case"] == case and r["api"] == api), {})
                v = r.get(key)
                ys.append((v / r["floor_us"] if key == "replay_us" else v) if v else 0.0)
            ax.bar(np.arange(len(cases)) + k * width, ys, width, label=name)
        ax.set_xticks(np.arange(len(cases)) + 0.4 - width / 2, cases)
        ax.set_title(label)
        if key == "replay_us":
            ax.axhline(1.25, color="gray", linestyle=":", linewidth=1)
        else:
            ax.axhline(40, color="gray", linestyle=":", linewidth=1)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--only", default=",".join(CONFIGS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, measures nothing")
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n]
    bad = [n for n in names if n not in CONFIGS]
    if bad:
        sys.exit(f"unknown configurations {bad}: choose from {list(CONFIGS)}")
    ns = rb.NS
    if args.smoke:
        rb.DEV, ns = "cpu", (1, 8)
        meta = {"date": time.strftime("%Y-%m-%d"), "smoke": "CPU, tiny shapes: no figure here means anything"}
    else:
        meta = device_info()
    t0 = time.perf_counter()
    base, io0 = glue_tri.TUNING, graphs.IO
    bw = copy_bandwidth()["best"] if rb.DEV == "cuda" else 1e11
    meta.update({"steps": args.steps, "rounds": args.rounds, "configs": {n: CONFIGS[n] for n in names},
                 "copy_TBps": round(bw / 1e12, 3)})
    runs, failures = [], {}
    try:
        for r in range(args.rounds):
            for name in names:
                switch(base, CONFIGS[name])
                rows, f = measure(name, ns, args.steps)
                runs += [dict(row, round=r + 1) for row in rows]
                failures[name] = failures.get(name, []) + f
    finally:
        glue_tri.TUNING, graphs.IO = base, io0
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        meta["gate_failures"] = failures
        out = combine(runs, bw, ns)
        paths = write_results("switches", out, meta, COLUMNS, plot, args.out, notes=reading(out, failures))
        print("wrote", *paths, flush=True)


if __name__ == "__main__":
    main()
