"""Probe (not kept): the decode step with and without the few-sequence conv tiling, interleaved rounds."""
import gc
import os
import sys
from dataclasses import replace

import runtime as rb

from gdn_trt.plugins.causal_conv1d import triton as conv_tri

BASE = conv_tri.TUNING
VARIANTS = {"many1024": replace(BASE, update_few_below=0), "few256 (default)": BASE}
ns = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 8, 64, 256]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
os.environ["GDN_TRT_PDL"] = "1"
res = {}
for r in range(rounds):
    for name, tuning in VARIANTS.items():
        conv_tri.TUNING = tuning
        o = rb.Ours(rb.configs(False)["ours"])
        for n in ns:
            fn = o.step_fn("decode", [1] * n, "static")
            fn()
            wall, _ = rb.timed(fn, 200)
            replay = rb.replay_us(o.sess.graphs.replayable(n))
            res.setdefault((name, n), []).append((round(replay, 1), round(wall, 1)))
            print(f"round {r} {name:18s} N={n:4d} replay {replay:8.1f} wall {wall:8.1f}", flush=True)
        del o
        gc.collect()
        rb.torch.cuda.empty_cache()
for (name, n), v in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"SUMMARY N={n:4d} {name:18s} replay {[a for a, _ in v]} wall {[b for _, b in v]}")
