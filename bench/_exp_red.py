"""Probe (not kept): the split-K skinny GEMM's reduction tail on out_proj [2048, 4096] at decode M.

RED 0: as plugins/glue/gemm.py (the last ticket sums the partials in a loop over the runtime slice count);
RED 1: the same, the loop unrolled over a constexpr slice count (the partials' loads issued together);
RED 2: no reduction at all, each program stores its own partial (a lower bound on the tail, not a GEMM);
RED 3: every program of a tile waits for all partials (spin on the ticket) and sums its 1/split of the tile's rows.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from common import time_cuda
from gemm import Operands

from gdn_trt.plugins.glue import gemm


@triton.jit
def k_red(x, w, y, ws, cnt, M, N, K, s_x, k_slice, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
          NS: tl.constexpr, RED: tl.constexpr):
    i_n, i_m, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k_lo = i_s * k_slice
    k_hi = tl.minimum(K, k_lo + k_slice)
    o_m = i_m * BM + tl.arange(0, BM)
    o_k = k_lo + tl.arange(0, BK)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    r_n = (o_n % N).to(tl.int64)
    m_m = o_m < M
    p_w = w + r_n[:, None] * K + o_k[None, :]
    p_x = x + o_m[None, :].to(tl.int64) * s_x + o_k[:, None]
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BK):
        b_w = tl.load(p_w)
        b_x = tl.load(p_x, mask=m_m[None, :], other=0.0)
        acc = tl.dot(b_w, b_x, acc)
        p_w += BK
        p_x += BK
    p_y = y + o_m[None, :].to(tl.int64) * N + o_n[:, None]
    m_y = m_n[:, None] & m_m[None, :]
    tile = i_m * tl.num_programs(0) + i_n
    p_ws = ws + tile * NS * (BN * BM) + tl.arange(0, BN)[:, None] * BM + tl.arange(0, BM)[None, :]
    if RED == 2:
        tl.store(p_ws + i_s * (BN * BM), acc)
        if i_s == 0:
            tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_y)
    elif RED == 3:
        tl.store(p_ws + i_s * (BN * BM), acc)
        tl.debug_barrier()
        tl.atomic_add(cnt + tile, 1, sem="release", scope="gpu")
        while tl.atomic_add(cnt + tile, 0, sem="acquire", scope="gpu") < NS:
            pass
        RB: tl.constexpr = BN // NS
        o_r = i_s * RB + tl.arange(0, RB)
        p_r = ws + tile * NS * (BN * BM) + o_r[:, None] * BM + tl.arange(0, BM)[None, :]
        part = tl.zeros([RB, BM], dtype=tl.float32)
        for s in tl.static_range(NS):
            part += tl.load(p_r + s * (BN * BM), cache_modifier=".cg")
        o_n2 = i_n * BN + o_r
        tl.store(y + o_m[None, :].to(tl.int64) * N + o_n2[:, None], part.to(y.dtype.element_ty),
                 mask=(o_n2 < N)[:, None] & m_m[None, :])
        tl.debug_barrier()
        done = tl.atomic_add(cnt + N // BN + 1 + tile, 1, sem="acq_rel", scope="gpu")
        if done == NS - 1:  # every program is past its spin: reset both counters for the next launch
            tl.atomic_xchg(cnt + tile, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt + N // BN + 1 + tile, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(p_ws + i_s * (BN * BM), acc)
        tl.debug_barrier()
        ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == NS - 1:
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            if RED == 1:
                for s in tl.static_range(NS):
                    acc += tl.load(p_ws + s * (BN * BM), cache_modifier=".cg")
            else:
                for s in range(0, tl.num_programs(2)):
                    acc += tl.load(p_ws + s * (BN * BM), cache_modifier=".cg")
            tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_y)
            tl.atomic_xchg(cnt + tile, 0, sem="relaxed", scope="gpu")


def launch(x, w, cfg, red, ws, cnt):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    bm = max(16, triton.next_power_of_2(M))
    k_slice = triton.cdiv(triton.cdiv(K, cfg.split), cfg.bk) * cfg.bk
    grid = (triton.cdiv(N, cfg.bn), triton.cdiv(M, bm), cfg.split)
    k_red[grid](x, w, y, ws, cnt, M, N, K, x.stride(0), k_slice, BM=bm, BN=cfg.bn, BK=cfg.bk, NS=cfg.split, RED=red,
                num_warps=cfg.warps, num_stages=cfg.stages)
    return y


def main():
    C = gemm.Config
    ops = Operands(2048, 4096)
    ws = torch.empty(1 << 24, dtype=torch.float32, device="cuda")
    cnt = torch.zeros(1 << 12, dtype=torch.int32, device="cuda")
    cfgs = {16: [C(16, 64, 128, 4, 4, split=4), C(16, 32, 256, 4, 4, split=4), C(16, 128, 128, 3, 8, split=8)],
            64: [C(64, 64, 128, 4, 4, split=4), C(64, 64, 64, 4, 4, split=4), C(64, 128, 128, 3, 8, split=8),
                 C(64, 128, 64, 4, 4, split=8), C(64, 32, 256, 4, 4, split=2), C(64, 32, 128, 4, 4, split=4),
                 C(64, 256, 64, 3, 8, split=16)]}
    ms = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [16, 64]
    for M in ms:
        x = ops.x(M)
        ref = F.linear(x.float(), ops.ws[0].float())
        print(f"M={M} cuBLAS {ops.time(M, F.linear):.2f} us  table {ops.time(M, gemm.linear):.2f} us", flush=True)
        for cfg in cfgs[M]:
            line = f"  bn={cfg.bn} bk={cfg.bk} st={cfg.stages} w={cfg.warps} split={cfg.split}:"
            for red in (0, 1, 2, 3):
                if red == 3 and cfg.bn // cfg.split < 1:
                    continue
                try:
                    y = launch(x, ops.ws[0], cfg, red, ws, cnt)
                    err = ((y.float() - ref).norm() / ref.norm()).item()
                    t = ops.time(M, lambda a, b: launch(a, b, cfg, red, ws, cnt))
                    line += f"  red{red} {t:.2f} ({err:.1e})"
                except Exception as e:  # noqa: BLE001
                    line += f"  red{red} error {type(e).__name__}: {str(e)[:80]}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
