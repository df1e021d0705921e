"""Probe: the whole chunked prefill with the Gluon state pass, the Triton one, and FLA 0.6.0's call, same inputs."""
import sys
from dataclasses import replace

import torch
from cases import HV, K, V, fla_chunk, gdn_inputs, packing
from common import copy_bandwidth, time_cuda

from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.packing import Capture

rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
for T in [int(t) for t in sys.argv[1].split(",")]:
    x, pack = gdn_inputs(T, 2), packing([T])
    pool = torch.randn(1, HV, K, V, device="cuda") * 0.5
    cap = Capture(torch.full((1,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))
    runs = {"gluon": lambda i: gdn_tri.launch_chunked(x, pack, pool, cap, gdn_tri.TUNING),
            "triton": lambda i: gdn_tri.launch_chunked(x, pack, pool, cap, replace(gdn_tri.TUNING, state_gluon=False)),
            "FLA 0.6.0": lambda i: fla_chunk(x, None, pool)}
    got = {}
    for r in range(rounds):
        for name, fn in runs.items():
            got.setdefault(name, []).append(round(time_cuda(fn, target_s=10e-3).median_us, 1))
    fla = min(got["FLA 0.6.0"])
    for name, ts in got.items():
        print(f"T={T} {name:10s} {ts} us  FLA / this (best) {fla / min(ts):.3f}", flush=True)
