"""EXPERIMENT: with PDL, the decode kernel's first programs prefetch their state share into L2 before the wait
(Tuning.rec_l2_first: 0 off, 528 = 4 programs x 132 SMs, all): the static decode step of bench/runtime.py, two
interleaved rounds, a fresh session each (wall over 200 steps, union of three traces, the GDN decode's interval)."""
import statistics
from dataclasses import replace

import runtime as rb
import step_trace
import torch

from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

BASE = gdn_tri.TUNING


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
    for l2 in (0, 528, 1 << 30):
        gdn_tri.TUNING = replace(BASE, rec_l2_first=l2)
        o = rb.Ours(rb.configs()["ours"])
        for n in (1, 8, 64, 256):
            fn = o.step_fn("decode", [1] * n, "static")
            wall = time_loop(fn)
            unions, gdn = [], []
            for _ in range(3):
                evs = step_trace.trace(fn)
                unions.append(rb.union_ns(evs) / 1e3)
                gdn += [(b - a) / 1e3 for a, b, nm in evs if "recurrent" in nm]
            res.setdefault((n, l2), []).append((round(wall, 1), round(statistics.median(unions), 1),
                                                 round(statistics.mean(gdn), 2)))
        del o
gdn_tri.TUNING = BASE
for (n, l2), v in sorted(res.items()):
    print(f"L2FIRST N={n:3d} l2={l2:11d} wall/union/gdn {v}", flush=True)
