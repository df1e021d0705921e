"""EXPERIMENT: the skinny GEMM for in_proj at M = 64 with the late PDL trigger (gemm.Config.late) in the decode step,
against cuBLAS (the table's choice): two interleaved rounds, a fresh session each, wall and union per step."""
import statistics
from dataclasses import replace

import runtime as rb
import step_trace
import torch

from gdn_trt.plugins.glue import gemm

BASE = gemm.TABLE


def setup(name):
    gemm.TABLE = BASE
    if name != "cublas":
        late = name == "ours-late"
        gemm.TABLE = tuple(replace(r, vs_cublas=0.99, cfg=replace(r.cfg, late=late))
                           if (r.max_m == 64 and r.min_n == gemm.WIDE_N) else r for r in BASE)


def time_loop(fn, reps=200):
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


res = {}
for rnd in range(2):
    for name in ("cublas", "ours-late", "ours"):
        setup(name)
        o = rb.Ours(rb.configs()["ours"])
        fn = o.step_fn("decode", [1] * 64, "static")
        wall = time_loop(fn)
        evs = [step_trace.trace(fn) for _ in range(3)]
        union = statistics.median(rb.union_ns(e) / 1e3 for e in evs)
        inp = [(b - a) / 1e3 for e in evs for a, b, nm in e if "nvjet" in nm or "gemm" in nm]
        res.setdefault(name, []).append((round(wall, 1), round(union, 1)))
        print(f"round {rnd} {name:9s} N=64: wall {wall:7.1f} union {union:7.1f} gemms {statistics.mean(inp):5.2f}",
              flush=True)
        del o
setup("cublas")
for k, v in res.items():
    print("AB", k, v)
