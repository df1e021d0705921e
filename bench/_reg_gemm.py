"""Experiment (removed once it has answered): does a GEMM that streams its weight through registers, as a copy
kernel does, beat the shared-memory pipelines at M = 64?

    python bench/_reg_gemm.py [--m 8,64] [--smoke]

Every in_proj GEMM measured so far (cuBLAS; our tiles with cp.async or TMA pipelines, deeper or warp-specialized;
split-K; row ranges) streams the weight [12352, 2048] at about 3.1 TB/s on the H200 at M = 64, where a kernel that
only reads the same bytes reaches about 4.0. All of them bring the weight through shared memory. Re-reading x from
the L2 is not what holds them: the same loop with its x tile loaded once took the same time (H100, 2026-12-05:
20.82 against 20.79 us at M = 64, 19.62 against 19.58 at M = 8, cuBLAS 20.91 / 19.65). This kernel loads each
weight tile with plain vector loads into registers one K step ahead (num_stages = 1: no cp.async pipeline), so
that BN x BK x 2 bytes a program are in flight while the tensor cores take the tile before. Rows, per M, weights
rotated past the L2, each with the weight's bytes over its time:
- `cuBLAS` (F.linear) and `gemm` (the table's launch for that M, plugins/glue/gemm.py);
- `regs BN,BK,warps`: this kernel (checked against F.linear);
- `read`: bench/probes.stream_kernel reading the weight's bytes and writing nothing (the rate to reach);
- `copy`: the same kernel reading and writing them (the figure over the bytes read: half the copy rate).
--smoke: CPU, under TRITON_INTERPRET=1, tiny shapes, checked against F.linear, nothing timed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def reg_kernel(x, w, y, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """y^T tile [BN, BM] of program i_n; K a multiple of BK. The tiles of step k + 1 are loaded before the product of
    step k, so their loads are in flight while it runs."""
    i_n = tl.program_id(0)
    o_n = i_n * BN + tl.arange(0, BN)
    o_m = tl.arange(0, BM)
    o_k = tl.arange(0, BK)
    p_w = w + (o_n % N).to(tl.int64)[:, None] * K + o_k[None, :]
    p_x = x + o_m[None, :].to(tl.int64) * K + o_k[:, None]
    m_x = (o_m < M)[None, :]
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    b_w = tl.load(p_w, eviction_policy="evict_first")
    b_x = tl.load(p_x, mask=m_x, other=0.0)
    for k in range(BK, K, BK):
        n_w = tl.load(p_w + k, eviction_policy="evict_first")
        n_x = tl.load(p_x + k, mask=m_x, other=0.0)
        acc = tl.dot(b_w, b_x, acc)
        b_w = n_w
        b_x = n_x
    acc = tl.dot(b_w, b_x, acc)
    tl.store(y + o_m[None, :] * N + o_n[:, None], acc.to(y.dtype.element_ty), mask=(o_n < N)[:, None] & m_x)


def reg_gemm(x, w, bn: int = 64, bk: int = 256, warps: int = 8):
    M, K = x.shape
    N = w.shape[0]
    assert K % bk == 0
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    reg_kernel[(triton.cdiv(N, bn),)](x, w, y, M, N, K, BM=max(16, triton.next_power_of_2(M)), BN=bn, BK=bk,
                                      num_warps=warps, num_stages=1)
    return y


CONFIGS = ((64, 256, 8), (64, 128, 4), (64, 128, 8), (32, 256, 4), (128, 128, 8), (64, 512, 8), (32, 512, 8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="8,64")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        x, w = torch.randn(5, 128), torch.randn(200, 128)
        for bn, bk, warps in ((64, 32, 4), (32, 64, 4)):
            d = (reg_gemm(x, w, bn, bk, warps) - F.linear(x, w)).abs().max().item()
            assert d < 1e-3, d
        print(f"smoke: max |diff| {d:.3g}")
        return
    from common import n_sets_for, time_cuda
    from probes import stream_kernel

    from gdn_trt.plugins.glue import gemm

    N, K = 12352, 2048
    nw = n_sets_for(N * K * 2)
    wts = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(nw)]
    sink = torch.empty(1, device="cuda")
    n_rd, block = N * K // 2, 4096

    flat = [t.view(torch.float32).view(-1) for t in wts]
    dst = torch.empty_like(flat[0])

    def read(i):  # the weight's bytes read as fp32, nothing written
        stream_kernel[(triton.cdiv(n_rd, block),)](flat[i % nw], sink, n_rd, 0, BLOCK=block, PDL=False)

    def copy(i):  # read and written: the rate the floor takes (reported over the bytes read)
        stream_kernel[(triton.cdiv(n_rd, block),)](flat[i % nw], dst, n_rd, n_rd, BLOCK=block, PDL=False)

    for M in (int(v) for v in args.m.split(",")):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x, wts[0]).float()
        rows = [("cuBLAS", lambda i: F.linear(x, wts[i % nw])), ("gemm", lambda i: gemm.linear(x, wts[i % nw])),
                ("read", read), ("copy (bytes read)", copy)]
        for bn, bk, warps in CONFIGS:
            d = (reg_gemm(x, wts[0], bn, bk, warps).float() - ref).abs().max().item()
            rows.append((f"regs {bn},{bk},{warps} (max |diff| {d:.3g})",
                         lambda i, c=(bn, bk, warps): reg_gemm(x, wts[i % nw], *c)))
        for name, fn in rows:
            try:
                us = time_cuda(fn, nw).median_s * 1e6
            except Exception as e:  # a config past the registers or shared memory: say so, go on
                print(f"M={M} {name}: failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            print(f"M={M} {name}: {us:.2f} us, weight {N * K * 2 / us / 1e6:.2f} TB/s", flush=True)


if __name__ == "__main__":
    main()
