"""EXPERIMENT: where the state pass stores h (Tuning.state_h_late 0 / 1 / 2): the state launch alone and the whole
prefill at T = 4096 and 16384, three interleaved rounds; outputs and final state bit for bit against 0."""
import statistics
from dataclasses import replace

import torch
from cases import HV, K, V, gdn_inputs, packing
from common import time_cuda

from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.packing import Capture
from gdn_trt.plugins.triton_aot import record

for T in (4096, 16384):
    x, pack = gdn_inputs(T, 2), packing((T,))
    pool0 = torch.randn(1, HV, K, V, device="cuda") * 0.5
    cap = Capture(torch.full((1,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool0))
    ref = None
    for hl in (0, 1, 2):
        tu = replace(gdn_tri.TUNING, state_h_late=hl)
        p = pool0.clone()
        o = gdn_tri.launch_chunked(x, pack, p, cap, tu)
        if ref is None:
            ref = (o, p)
        print(f"T={T} h_late={hl}: bit-equal {torch.equal(o, ref[0]) and torch.equal(p, ref[1])}", flush=True)
    res = {}
    for rnd in range(3):
        for hl in (0, 1, 2):
            tu = replace(gdn_tri.TUNING, state_h_late=hl, state_pipe=1, state_pipe_many=1)
            st = [l for l in record(gdn_tri, lambda: gdn_tri.launch_chunked(x, pack, pool0.clone(), cap, tu), run=False)
                  if l.name == "gdn_chunk_state_kernel"][0]
            ts = time_cuda(lambda i: st(), target_s=10e-3).median_us
            tu = replace(gdn_tri.TUNING, state_h_late=hl)
            pools = [pool0.clone() for _ in range(2)]
            tw = time_cuda(lambda i: gdn_tri.launch_chunked(x, pack, pools[i % 2], cap, tu), 2).median_us
            res.setdefault(hl, []).append((round(ts, 1), round(tw, 1)))
    for hl, v in res.items():
        print(f"STATE T={T} h_late={hl}: state {[a for a, _ in v]} whole {[b for _, b in v]}", flush=True)
