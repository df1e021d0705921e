"""EXPERIMENT (not committed): state/out passes at BT=128 timed alone; conv tilings in the N=64 decode step."""
import sys
from dataclasses import replace

import torch
from cases import HV, K, V, gdn_inputs, packing
from common import time_cuda

from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.packing import Capture
from gdn_trt.plugins.triton_aot import record


def passes(T, bt, **kw):
    gdn_tri.BT = bt
    x, pack = gdn_inputs(T, 2), packing((T,))
    pool = torch.randn(1, HV, K, V, device="cuda") * 0.5
    cap = Capture(torch.full((1,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))
    tu = replace(gdn_tri.TUNING, state_pipe=1, state_pipe_many=1, **kw)
    for launch in record(gdn_tri, lambda: gdn_tri.launch_chunked(x, pack, pool, cap, tu), run=False):
        if launch.name in ("gdn_chunk_state_kernel", "gdn_chunk_out_kernel", "gdn_chunk_wu_kernel"):
            try:
                t = time_cuda(lambda i: launch(), target_s=10e-3)
                print(f"T={T} BT={bt} {kw} {launch.name} {t.median_us:.1f} us", flush=True)
            except Exception as e:
                print(f"T={T} BT={bt} {kw} {launch.name} FAIL {str(e)[:200]}", flush=True)
    gdn_tri.BT = 64


def conv_step():
    import runtime as rb
    import step_trace
    from gdn_trt.plugins.causal_conv1d import triton as conv_tri
    base = conv_tri.TUNING
    for bd, w in ((1024, 8), (512, 4), (256, 4), (256, 2), (128, 2), (128, 1), (1024, 8)):
        conv_tri.TUNING = replace(base, update_bd=bd, update_warps=w)
        o = rb.Ours(rb.configs()["ours"])
        for n in (8, 64, 256):
            fn = o.step_fn("decode", [1] * n, "static")
            evs = step_trace.trace(fn)
            conv = [(b - a) / 1e3 for a, b, name in evs if "conv" in name]
            print(f"conv bd={bd} w={w} N={n}: union {rb.union_ns(evs) / 1e3:.1f} us, conv {sum(conv) / len(conv):.2f} us",
                  flush=True)
    conv_tri.TUNING = base


if __name__ == "__main__":
    if "conv" in sys.argv:
        conv_step()
    if "ncu" in sys.argv:
        from cases import fla_chunk
        x, pack = gdn_inputs(4096, 2), packing((4096,))
        pool = torch.randn(1, HV, K, V, device="cuda") * 0.5
        cap = Capture(torch.full((1,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))
        tu = replace(gdn_tri.TUNING, state_pipe=1, state_pipe_many=1)
        for _ in range(2):
            gdn_tri.launch_chunked(x, pack, pool, cap, tu)
            fla_chunk(x, None, pool)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        gdn_tri.launch_chunked(x, pack, pool, cap, tu)
        fla_chunk(x, None, pool)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    if "dec" in sys.argv:
        N = 64
        x, pack = gdn_inputs(N, 1), packing([1] * N)
        pools = [torch.randn(N, HV, K, V, device="cuda") * 0.5 for _ in range(4)]
        for i in range(4):
            gdn_tri.launch_recurrent(x, pack, pools[i], None, gdn_tri.TUNING)
        src = torch.randn(N * HV * K * V, device="cuda")
        dst = torch.empty_like(src)
        dst.copy_(src)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        gdn_tri.launch_recurrent(x, pack, pools[1], None, gdn_tri.TUNING)
        dst.copy_(src)
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    if "bt" in sys.argv:
        for T in (4096, 16384):
            passes(T, 64)
            passes(T, 128, state_stages=2)
            passes(T, 128, state_stages=2, out_warps=8)
            passes(T, 128, state_stages=2, state_warps=8, out_warps=8)
