"""Experiment (not kept unless it wins): the gated output norm inside out_proj's K loop.

    python bench/_gnorm_gemm.py [--m 8,64]

out_proj's x is y = w * RMSNorm(o) * silu(z) per value head (gated_norm_kernel, then the skinny GEMM of gemm.py).
Here each K step of the GEMM is one value head (BK = V = 128): it loads that head's o and z rows, computes y with
gated_rows (the same roundings, so y is the same bf16 tile) and multiplies it with the weight tile; one launch
instead of two. Times, per M: the two launches (gated norm + the table's GEMM) against the fused one, in a CUDA
graph with PDL as in the step, weights rotated past the L2; checks the fused output equals the unfused one bit for
bit (same tiles, same accumulation order).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from common import n_sets_for, time_cuda

from gdn_trt.plugins import pdl
from gdn_trt.plugins.glue import gemm
from gdn_trt.plugins.glue import triton as gt
from gdn_trt.plugins.glue.decode_norm import gated_rows


@triton.jit
def gnorm_gemm_kernel(o, z, gw, w, y, ws, cnt, M, N, K, s_zt, s_zh, eps, k_slice,
                      BM: tl.constexpr, BN: tl.constexpr, V: tl.constexpr, SPLIT: tl.constexpr,
                      PRE: tl.constexpr, PDL: tl.constexpr = False):
    dt = y.dtype.element_ty
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k_lo = i_s * k_slice
    k_hi = tl.minimum(K, k_lo + k_slice)
    o_m = i_m * BM + tl.arange(0, BM)
    o_v = tl.arange(0, V)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    r_n = (o_n % N).to(tl.int64)
    m_m = o_m < M
    p_w = w + r_n[:, None] * K + (k_lo + o_v)[None, :]
    if PRE:  # the first weight tile before the wait: nothing before this kernel writes the weight
        b_w0 = tl.load(p_w)
    pdl.enter(PDL)
    b_gw = tl.load(gw + o_v).to(tl.float32)
    p_o = o + o_m[:, None].to(tl.int64) * K + (k_lo + o_v)[None, :]  # [BM, V]: o is [M, HV * V] contiguous
    h0 = k_lo // V
    p_z = z + o_m[:, None].to(tl.int64) * s_zt + h0 * s_zh + o_v[None, :]
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, V):
        b_o = tl.load(p_o, mask=m_m[:, None], other=0.0).to(tl.float32)
        b_z = tl.load(p_z, mask=m_m[:, None], other=0.0).to(tl.float32)
        b_x = gated_rows(b_o, b_z, b_gw, eps, V, True, dt)  # [BM, V]
        if PRE:
            if k0 == k_lo:
                b_w = b_w0
            else:
                b_w = tl.load(p_w)
        else:
            b_w = tl.load(p_w)
        acc = tl.dot(b_w, tl.trans(b_x), acc)
        p_w += V
        p_o += V
        p_z += s_zh
    p_y = y + o_m[None, :].to(tl.int64) * N + o_n[:, None]
    m_y = m_n[:, None] & m_m[None, :]
    tile = i_m * tl.num_programs(0) + i_n
    p_ws = ws + tile * SPLIT * (BN * BM) + tl.arange(0, BN)[:, None] * BM + tl.arange(0, BM)[None, :]
    tl.store(p_ws + i_s * (BN * BM), acc)
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLIT - 1:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            acc += tl.load(p_ws + s * (BN * BM), cache_modifier=".cg")
        tl.store(p_y, acc.to(dt), mask=m_y)
        tl.atomic_xchg(cnt + tile, 0, sem="relaxed", scope="gpu")


def fused(o, z, gw, w, eps, cfg, pre, stages):
    M, HV, V = o.shape
    K, N = HV * V, w.shape[0]
    y = torch.empty(M, N, dtype=o.dtype, device=o.device)
    bm = gemm._bm(cfg, M)
    k_slice = triton.cdiv(triton.cdiv(K, cfg.split), V) * V
    split = triton.cdiv(K, k_slice)
    grid = (triton.cdiv(N, cfg.bn), triton.cdiv(M, bm), split)
    ws, cnt = gemm._workspace(o.device, grid[0] * grid[1], split, cfg.bn * bm)
    gnorm_gemm_kernel[grid](o, z, gw, w, y, ws, cnt, M, N, K, z.stride(0), z.stride(1), eps, k_slice,
                            BM=bm, BN=cfg.bn, V=V, SPLIT=split, PRE=pre, num_warps=cfg.warps, num_stages=stages,
                            **pdl.options(o.device))
    return y


def unfused(o, z, gw, w, eps, cfg):
    yn = gt.gated_rms_norm(o, z, gw, eps, "silu")
    return gemm.launch(yn.view(o.shape[0], -1), w, cfg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", default="8,64")
    args = ap.parse_args()
    HV, V, C, eps = 32, 128, 2048, 1e-6
    dt = torch.bfloat16
    nw = n_sets_for(C * HV * V * 2)
    ws = [torch.randn(C, HV * V, device="cuda", dtype=dt) * 0.02 for _ in range(nw)]
    gw = torch.randn(V, device="cuda") * 0.1 + 1
    for M in [int(v) for v in args.m.split(",")]:
        cfg = gemm.config_for(M, C)
        o = torch.randn(M, HV, V, device="cuda", dtype=dt)
        proj = torch.randn(M, 12352, device="cuda", dtype=dt)
        z = proj[:, 8192:8192 + HV * V].view(M, HV, V)
        with pdl.scope():
            ref = unfused(o, z, gw, ws[0], eps, cfg)
            rows = [("unfused", lambda i: unfused(o, z, gw, ws[i % nw], eps, cfg))]
            for pre in (False, True):
                for st in (2, 3, 4):
                    got = fused(o, z, gw, ws[0], eps, cfg, pre, st)
                    same = torch.equal(got, ref)
                    rows.append((f"fused pre={pre} stages={st} same={same}",
                                 lambda i, pre=pre, st=st: fused(o, z, gw, ws[i % nw], eps, cfg, pre, st)))
            for name, fn in rows:
                t = time_cuda(fn, nw)
                print(f"M={M} {cfg} {name}: {t.median_s * 1e6:.2f} us ({t.method})", flush=True)


if __name__ == "__main__":
    main()
