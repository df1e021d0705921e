"""Probe: the Gluon state pass (plugins gluon_state) against the Triton one on the same buffers, T = 4096, 16384."""
import sys
from dataclasses import replace

import torch
from cases import HV, K, V, gdn_inputs, packing, rel_rms
from common import time_cuda

from gdn_trt.plugins.gated_delta_rule import gluon_state
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.packing import Capture
from gdn_trt.plugins.triton_aot import record

Ts = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4096, 16384]
for T in Ts:
    x, pack = gdn_inputs(T, 2), packing([T])
    pool = torch.randn(1, HV, K, V, device="cuda") * 0.5
    pool0 = pool.clone()
    cap = Capture(torch.full((1,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))
    one = replace(gdn_tri.TUNING, state_pipe=1, state_pipe_many=1, state_gluon=False)
    launches = record(gdn_tri, lambda: gdn_tri.launch_chunked(x, pack, pool, cap, one), run=True)
    st = next(l for l in launches if l.name == "gdn_chunk_state_kernel")
    a = st.args
    h_ref, vn_ref, pool_ref = a["h"].clone(), a["v_new"].clone(), a["pool"].clone()
    seq = (a["cu_seqlens"], a["slots"], a["capture_at"], a["N"])
    h2, vn2, p2 = torch.full_like(a["h"], float("nan")), torch.full_like(a["v_new"], float("nan")), pool0.clone()

    def run(i=0):
        gluon_state.launch(a["k"], a["rk"], a["w"], a["u"], a["gam"], h2, vn2, p2, a["cap"], seq, a["BV"],
                           a["c_lo"], a["c_hi"])

    run()
    torch.cuda.synchronize()
    n_c = T // 64
    print(f"T={T} gluon vs triton: bitwise h {torch.equal(h_ref[:n_c], h2[:n_c])} v_new {torch.equal(vn_ref, vn2)} "
          f"state {torch.equal(pool_ref, p2)}; rel_rms {rel_rms(h_ref[:n_c].float(), h2[:n_c].float()):.1e} "
          f"{rel_rms(vn_ref.float(), vn2.float()):.1e} {rel_rms(pool_ref, p2):.1e}", flush=True)
    tt = time_cuda(lambda i: st(), target_s=10e-3).median_us
    tg = time_cuda(run, target_s=10e-3).median_us
    print(f"T={T} state pass: gluon {tg:8.1f} us, triton {tt:8.1f} us ({tt / tg:.3f}x)", flush=True)
