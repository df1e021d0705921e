"""EXPERIMENT (not committed): decode step A/B: conv update tiling, our GEMM at M = 64."""
import statistics
from dataclasses import replace

import runtime as rb
import step_trace
import torch


def time_loop(fn, reps=100):
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps

from gdn_trt.plugins.causal_conv1d import triton as conv_tri
from gdn_trt.plugins.glue import gemm

BASE_CONV, BASE_TABLE = conv_tri.TUNING, gemm.TABLE


def setup(name):
    conv_tri.TUNING, gemm.TABLE = BASE_CONV, BASE_TABLE
    if "conv" in name:
        conv_tri.TUNING = replace(BASE_CONV, update_bd=256, update_warps=4)
    if "gemm" in name:
        gemm.TABLE = tuple(replace(r, vs_cublas=0.99) if r.max_m == 64 else r for r in BASE_TABLE)


res = {}
for rnd in range(2):
    for name in ("base", "conv", "conv+gemm"):
        setup(name)
        o = rb.Ours(rb.configs()["ours"])
        for n in (1, 8, 64, 256):
            fn = o.step_fn("decode", [1] * n, "static")
            wall = time_loop(fn)
            unions = []
            for _ in range(3):
                evs = step_trace.trace(fn)
                unions.append(rb.union_ns(evs) / 1e3)
            conv = statistics.mean((b - a) / 1e3 for a, b, nm in evs if "conv" in nm)
            res.setdefault((name, n), []).append((wall, statistics.median(unions), conv))
            print(f"round {rnd} {name:10s} N={n:3d}: wall {wall:7.1f} union {statistics.median(unions):7.1f} "
                  f"conv {conv:5.2f}", flush=True)
        del o
setup("base")
for (name, n), v in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"SUMMARY {name:10s} N={n:3d} wall {[round(x[0], 1) for x in v]} union {[round(x[1], 1) for x in v]}")
