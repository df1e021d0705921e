"""Experiment (removed once it has answered): does re-reading x from the L2 hold in_proj at M = 64 below the
stream rate?

    python bench/_x_traffic.py [--m 8,64] [--smoke]

The skinny GEMM (plugins/glue/gemm.py) streams in_proj [12352, 2048] at 3.4-3.5 TB/s at M <= 8 and about 3.1 at
M = 64 on the H200, where a kernel that only copies the same bytes reaches 4.0 in the step. Each program of BN = 64
weight rows reads all of x [M, 2048] from the L2 through its K loop: at M = 64 as many bytes as its weight tile, at
M = 8 (BM = 16) a quarter. If that L2 traffic is what holds it, an x tile shared by a cluster (Hopper's TMA
multicast, Gluon or CUTLASS) is the next GEMM to write; if not, that idea is closed. Rows, per M, each kernel the
table's M = 64 tiling (BN 64, BK 64, 4 stages, 4 warps, pointer loads), weights rotated past the L2:
- `cuBLAS` (F.linear) and `gemm`: the real products (checked against F.linear);
- `x once`: the same loop, the x tile loaded once before it and reused at every K step (not a product: the weight
  stream and the MMAs, pipelined through shared memory as the GEMM's, without the x traffic).
Each with the weight's bytes over its time (TB/s). (A loop summing the weight tiles without MMAs compiled to
register loads outside the shared-memory pipeline, one tile in flight a program: not the same stream, left out.)
--smoke: CPU, under TRITON_INTERPRET=1, tiny shapes, the `gemm` row checked against F.linear, nothing timed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def probe_kernel(x, w, y, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, X_ONCE: tl.constexpr):
    """y^T tile [BN, BM] of program i_n over K in BK steps (K a multiple of BK); X_ONCE: the probe of the module
    docstring."""
    i_n = tl.program_id(0)
    o_n = i_n * BN + tl.arange(0, BN)
    o_m = tl.arange(0, BM)
    o_k = tl.arange(0, BK)
    p_w = w + (o_n % N).to(tl.int64)[:, None] * K + o_k[None, :]
    p_x = x + o_m[None, :].to(tl.int64) * K + o_k[:, None]
    m_x = (o_m < M)[None, :]
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    b_x = tl.load(p_x, mask=m_x, other=0.0)
    for _ in range(0, K, BK):
        b_w = tl.load(p_w)
        if not X_ONCE:
            b_x = tl.load(p_x, mask=m_x, other=0.0)
            p_x += BK
        acc = tl.dot(b_w, b_x, acc)
        p_w += BK
    tl.store(y + o_m[None, :] * N + o_n[:, None], acc.to(y.dtype.element_ty), mask=(o_n < N)[:, None] & m_x)


def probe(x, w, x_once: bool, bn: int = 64, bk: int = 64, stages: int = 4, warps: int = 4):
    M, K = x.shape
    N = w.shape[0]
    assert K % bk == 0
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    probe_kernel[(triton.cdiv(N, bn),)](x, w, y, M, N, K, BM=max(16, triton.next_power_of_2(M)), BN=bn, BK=bk,
                                        X_ONCE=x_once, num_warps=warps, num_stages=stages)
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="8,64")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        x, w = torch.randn(5, 128), torch.randn(200, 128)
        d = (probe(x, w, False) - F.linear(x, w)).abs().max().item()
        assert d < 1e-3, d
        probe(x, w, True)
        print(f"smoke: gemm max |diff| {d:.3g}; the probe ran")
        return
    from common import n_sets_for, time_cuda

    N, K = 12352, 2048
    nw = n_sets_for(N * K * 2)
    wts = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(nw)]
    for M in (int(v) for v in args.m.split(",")):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        d = (probe(x, wts[0], False).float() - F.linear(x, wts[0]).float()).abs().max().item()
        rows = (("cuBLAS", lambda i: F.linear(x, wts[i % nw])),
                (f"gemm (max |diff| {d:.3g})", lambda i: probe(x, wts[i % nw], False)),
                ("x once", lambda i: probe(x, wts[i % nw], True)))
        for name, fn in rows:
            us = time_cuda(fn, nw).median_s * 1e6
            print(f"M={M} {name}: {us:.2f} us, weight {N * K * 2 / us / 1e6:.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
