"""Skinny GEMM for the decode-sized projections: y [M, N] = x [M, K] W [N, K]^T with M (tokens) small.

Why: at decode the layer's projections read a weight of tens of megabytes to multiply a handful of rows, so their
time is the weight's bytes over the memory rate. cuBLAS streams them at about 2.8 TB/s at M = 1 on the H200
(Qwen3-Next in_proj [12352, 2048] and out_proj [2048, 4096]: 101 of the 146 us of a 4-layer decode step,
bench/results/2026-12-03-runtime-final.md) against a 4.25 TB/s copy rate. This kernel only streams: each program
owns BN weight rows (N-tiles; enough of them to fill the 132 SMs, no split-K) and walks K in BK-wide tiles,
pipelined over `stages` buffers, multiplying each tile by the BM x BK tile of x it needs (a few kilobytes, served
from L2) and accumulating in fp32:
- `dot`: y^T tile = W tile x^T tile on the tensor cores ("swap AB": the weight rows fill the MMA's M side, so the
  token count only has to reach tl.dot's minimum of 16: BM = max(16, next pow2 of M));
- FMA (M <= 4): a [BM, BN, BK] fp32 product accumulated in registers and summed over K once at the end, for BN
  below the MMA's 16 rows (more programs for the narrow out_proj).
Deterministic: each output element is one program's fixed-order sum (no atomics, no split-K), so a CUDA-graph replay
equals the eager call bit for bit. Weight rows past N are wrapped (`% N`) instead of masked, so every weight load is
unmasked and vectorised (only the store is masked); token rows past M are masked, so they read nothing. `TABLE`
holds the launch per M bucket and `op.GEMM_MAX_M` the crossover with cuBLAS, both written by
`bench/gemm.py --sweep --apply` on the H200; `op.linear` sends a call here only below the crossover
(and N >= `op.GEMM_MIN_N`), in bf16 and fp16 (fp32 operands take IEEE dots: the interpreter tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor


@dataclass(frozen=True)
class Config:
    """One launch: BM token rows x BN weight rows per program, BK-wide K steps over `stages` pipeline buffers."""

    bm: int
    bn: int
    bk: int
    stages: int = 4
    warps: int = 4
    dot: bool = True  # tensor-core tiles (BM, BN >= 16); False: the FMA form (BM <= 4)

    def check(self) -> None:
        if self.dot and (self.bm < 16 or self.bn < 16 or self.bk < 16):
            raise ValueError(f"tl.dot tiles need BM, BN, BK >= 16: {self}")
        if not self.dot and self.bm > 4:
            raise ValueError(f"the FMA form holds a [BM, BN, BK] product in registers: BM <= 4, got {self}")


# (largest M, config): the first entry whose M bound holds is used; the best launch per M bucket of the sweep on the
# H200, 2026-12-03 (bench/results/2026-12-03-gemm-sweep.md), time of in_proj + out_proj against cuBLAS's. Only M = 1
# beats cuBLAS, so `op.GEMM_MAX_M` dispatches only there; the larger buckets stay so that the kernel is tested at
# every decode-sized M (and the next sweep starts from them).
TABLE: tuple[tuple[int, Config], ...] = (
    (1, Config(1, 8, 1024, 1, 4, dot=False)),  # 0.88x cuBLAS (21.8 against 24.8 us)
    (2, Config(16, 32, 256, 4, 4)),  # 1.04x
    (4, Config(16, 32, 256, 4, 4)),  # 1.05x
    (8, Config(16, 64, 128, 4, 4)),  # 1.01x
    (16, Config(16, 32, 128, 6, 4)),  # 1.03x
    (32, Config(32, 32, 128, 5, 4)),  # 1.11x
    (64, Config(64, 64, 128, 4, 4)),  # 1.16x
)


def config_for(m: int) -> Config:
    for bound, cfg in TABLE:
        if m <= bound:
            return cfg
    raise ValueError(f"no skinny-GEMM config for M = {m} (table up to {TABLE[-1][0]})")


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Every output comes from here (shapes only; tests swap it to poison outputs with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


@triton.jit
def gemm_kernel(
    x, w, y,  # x [M, K] with row stride s_x; w [N, K] contiguous; y [M, N] contiguous
    M, N, K, s_x,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr, DOT: tl.constexpr,
    IEEE: tl.constexpr,
):
    """Program (i_n, i_m): y[i_m*BM : +BM, i_n*BN : +BN] over the whole of K."""
    dt = y.dtype.element_ty
    i_n, i_m = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    o_m = i_m * BM + tl.arange(0, BM)
    o_k = tl.arange(0, BK)
    r_n = (o_n % N).to(tl.int64)  # wrapped weight rows: unmasked loads, the store drops them
    m_m = o_m < M  # masked token rows: at M = 1 of BM = 16, 15 rows read no memory
    if DOT:
        p_w = w + r_n[:, None] * K + o_k[None, :]  # [BN, BK]
        p_x = x + o_m[None, :].to(tl.int64) * s_x + o_k[:, None]  # [BK, BM]
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for k0 in range(0, K, BK):
            if EVEN_K:
                b_w = tl.load(p_w)
                b_x = tl.load(p_x, mask=m_m[None, :], other=0.0)
            else:
                m_k = k0 + o_k < K
                b_w = tl.load(p_w, mask=m_k[None, :], other=0.0)
                b_x = tl.load(p_x, mask=m_m[None, :] & m_k[:, None], other=0.0)
            if IEEE:
                acc = tl.dot(b_w, b_x, acc, input_precision="ieee")
            else:
                acc = tl.dot(b_w, b_x, acc)
            p_w += BK
            p_x += BK
        m_y = (o_n < N)[:, None] & (o_m < M)[None, :]
        tl.store(y + o_m[None, :].to(tl.int64) * N + o_n[:, None], acc.to(dt), mask=m_y)
    else:
        p_w = w + r_n[None, :, None] * K + o_k[None, None, :]  # [1, BN, BK]
        p_x = x + o_m[:, None, None].to(tl.int64) * s_x + o_k[None, None, :]  # [BM, 1, BK]
        acc = tl.zeros([BM, BN, BK], dtype=tl.float32)
        for k0 in range(0, K, BK):
            if EVEN_K:
                b_w = tl.load(p_w)
                b_x = tl.load(p_x, mask=m_m[:, None, None], other=0.0)
            else:
                m_k = (k0 + o_k < K)[None, None, :]
                b_w = tl.load(p_w, mask=m_k, other=0.0)
                b_x = tl.load(p_x, mask=m_m[:, None, None] & m_k, other=0.0)
            acc += b_w.to(tl.float32) * b_x.to(tl.float32)
            p_w += BK
            p_x += BK
        b_y = tl.sum(acc, 2)  # [BM, BN]
        m_y = (o_m < M)[:, None] & (o_n < N)[None, :]
        tl.store(y + o_m[:, None].to(tl.int64) * N + o_n[None, :], b_y.to(dt), mask=m_y)


def launch(x: Tensor, w: Tensor, cfg: Config) -> Tensor:
    """x [M, K] (unit stride along K), w [N, K] contiguous -> y [M, N] in x's dtype, with launch `cfg`."""
    cfg.check()
    M, K = x.shape
    N = w.shape[0]
    y = _new((M, N), x.dtype, x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.zero_()
    bm = cfg.bm if cfg.dot else min(cfg.bm, triton.next_power_of_2(M))
    grid = (triton.cdiv(N, cfg.bn), triton.cdiv(M, bm))
    gemm_kernel[grid](x, w, y, M, N, K, x.stride(0), BM=bm, BN=cfg.bn, BK=cfg.bk, EVEN_K=K % cfg.bk == 0,
                      DOT=cfg.dot, IEEE=x.dtype == torch.float32, num_warps=cfg.warps, num_stages=cfg.stages)
    return y


def linear(x: Tensor, w: Tensor) -> Tensor:
    """y = x w^T, x [M, K] (M <= the table's largest bound), w [N, K] -> [M, N] (the Triton entry of naive.linear)."""
    return launch(x, w, config_for(x.shape[0]))
