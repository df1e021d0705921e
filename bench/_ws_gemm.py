"""Experiment (not kept unless it wins): the skinny GEMM's TMA loop with Triton's warp specialization.

    python bench/_ws_gemm.py [--m 8,64]

in_proj [12352, 2048] at M tokens: cuBLAS (F.linear), the table's launch (gemm.config_for) and a TMA loop
(`tl.range(..., warp_specialize=WS)`: a producer warp issuing the bulk copies, consumer warp groups the wgmma) at
several tiles and depths, weights rotated past the L2 (bench/common.time_cuda), each checked against F.linear (max
|diff| printed). Its first device call (H100, Triton 3.6, 2026-12-05) printed nothing in 150 s and was cut: run it
alone, with a time limit, and see which compile stalls.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from common import n_sets_for, time_cuda

from gdn_trt.plugins.glue import gemm


@triton.jit
def ws_kernel(w_desc, x_desc, y, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr,
              STAGES: tl.constexpr):
    i_n = tl.program_id(0)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for k0 in tl.range(0, K, BK, num_stages=STAGES, warp_specialize=WS):
        b_w = w_desc.load([i_n * BN, k0])
        b_x = tl.trans(x_desc.load([0, k0]))
        acc = tl.dot(b_w, b_x, acc)
    o_n = i_n * BN + tl.arange(0, BN)
    o_m = tl.arange(0, BM)
    tl.store(y + o_m[None, :] * N + o_n[:, None], acc.to(y.dtype.element_ty),
             mask=(o_m < M)[None, :] & (o_n < N)[:, None])


def ws(x, w, bn, bk, stages, warps, on):
    M, K = x.shape
    N = w.shape[0]
    bm = max(16, triton.next_power_of_2(M))
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    wd = TensorDescriptor(w, list(w.shape), list(w.stride()), [bn, bk])
    xd = TensorDescriptor(x, list(x.shape), list(x.stride()), [bm, bk])
    ws_kernel[(triton.cdiv(N, bn),)](wd, xd, y, M, N, K, BM=bm, BN=bn, BK=bk, WS=on, STAGES=stages,
                                     num_warps=warps)
    return y


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="8,64")
    ap.add_argument("--tiles", default="64,64,4,4;64,64,6,4;128,64,4,4;128,64,4,8;64,128,3,4;128,128,3,8",
                    help="BN,BK,stages,warps;... (each timed with and without warp specialization)")
    args = ap.parse_args()
    N, K = 12352, 2048
    dt = torch.bfloat16
    nw = n_sets_for(N * K * 2)
    wts = [torch.randn(N, K, device="cuda", dtype=dt) * 0.02 for _ in range(nw)]
    for M in [int(v) for v in args.m.split(",")]:
        x = torch.randn(M, K, device="cuda", dtype=dt)
        ref = F.linear(x, wts[0])
        rows = [("cuBLAS", lambda i: F.linear(x, wts[i % nw])),
                (f"table {gemm.config_for(M, N)}", lambda i: gemm.launch(x, wts[i % nw], gemm.config_for(M, N)))]
        for bn, bk, st, wp in (tuple(int(v) for v in t.split(",")) for t in args.tiles.split(";")):
            for on in (False, True):
                rows.append((f"ws={on} BN={bn} BK={bk} stages={st} warps={wp}",
                             lambda i, a=(bn, bk, st, wp, on): ws(x, wts[i % nw], *a)))
        for name, fn in rows:  # one at a time, printed as it goes: a compile that hangs leaves the rows before it
            try:
                d = (fn(0).float() - ref.float()).abs().max().item()
                t = time_cuda(fn, nw)
                print(f"M={M} {name}: {t.median_s * 1e6:.2f} us ({t.method}), max |diff| {d:.3g}", flush=True)
            except Exception as e:  # noqa: BLE001 - a launch this Triton refuses: say so, go on
                print(f"M={M} {name}: {type(e).__name__}: {str(e)[:160]}", flush=True)

if __name__ == "__main__":
    main()
