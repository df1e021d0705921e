"""Experiment (removed once it has answered): can the GDN decode's state stream carry the next projections' weights
into L2, so that out_proj (and part of the next layer's in_proj) then read them from L2?

    python bench/_l2_prefetch.py [--n 64] [--smoke]

At N = 64 on the H200 a layer's GDN decode streams 268 MB of fp32 state (read and written) at about the copy rate,
then out_proj [2048, 4096] reads 16.8 MB of weight at 1.8 TB/s (9.6 us alone, a short K loop a program: latency,
not bandwidth) and the next in_proj [12352, 2048] 50.6 MB at 3.1. Weight bytes moved during the state stream ride
the DRAM at its rate; the GEMMs after it would then read from L2. Rows (each a sequence of launches, weights and
state rotated past the L2, bench/common.time_cuda):
- `stream`: a copy of one layer's state at N (bench/probes.stream_kernel, evict-first loads, streaming stores);
- `out`, `in`: out_proj (the table's launch) and in_proj (cuBLAS, as the step runs them at M = 64) alone;
- `stream, out, in`: the three in a row, no prefetch;
- `... + pf out` / `+ pf out, in/2` / `(evict_last)`: the same, every program of the stream also issuing one bulk
  L2 prefetch (`cp.async.bulk.prefetch.L2`) of its share of out_proj's weight (and of the first half of in_proj's),
  optionally with an evict-last cache policy.
--smoke: CPU, under TRITON_INTERPRET=1, tiny shapes, the stream without prefetch (inline PTX does not run there).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _prefetch(ptr, nbytes, EVICT_LAST: tl.constexpr):
    """One bulk L2 prefetch of nbytes (a multiple of 16) at ptr (16-byte aligned) by the program's first thread."""
    if EVICT_LAST:
        tl.inline_asm_elementwise(
            "{ .reg .pred %pf; .reg .u32 %tf; .reg .b64 %pol; mov.u32 %tf, %tid.x; setp.eq.u32 %pf, %tf, 0; "
            "createpolicy.fractional.L2::evict_last.b64 %pol, 1.0; "
            "@%pf cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, %pol; mov.u32 $0, 0; }",
            "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise(
            "{ .reg .pred %pf; .reg .u32 %tf; mov.u32 %tf, %tid.x; setp.eq.u32 %pf, %tf, 0; "
            "@%pf cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [ptr, nbytes], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def stream_pf_kernel(src, dst, n, w1, b1, w2, b2, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PF: tl.constexpr,
                     EVICT_LAST: tl.constexpr):
    """Copies BLOCK fp32 values of src to dst; with PF, program i first prefetches bytes [i, i + 1) x CHUNK of the
    region w1 [b1 bytes] followed by w2 [b2 bytes] (uint8 pointers; b1, b2 multiples of CHUNK)."""
    i = tl.program_id(0)
    if PF:
        lo = i.to(tl.int64) * CHUNK
        if lo < b1:
            _prefetch(w1 + lo, CHUNK, EVICT_LAST)
        elif lo < b1 + b2:
            _prefetch(w2 + (lo - b1), CHUNK, EVICT_LAST)
    o = i.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(src + o, mask=o < n, other=0.0, eviction_policy="evict_first")
    tl.store(dst + o, v, mask=o < n, cache_modifier=".cs")


BLOCK, CHUNK = 4096, 8192


def stream(src, dst, w1=None, b1=0, w2=None, b2=0, evict_last=False):
    n = src.numel()
    grid = triton.cdiv(n, BLOCK)
    assert b1 % CHUNK == 0 and b2 % CHUNK == 0 and (b1 + b2) // CHUNK <= grid
    pf = w1 is not None
    w1 = src if w1 is None else w1
    w2 = w1 if w2 is None else w2
    stream_pf_kernel[(grid,)](src, dst, n, w1, b1, w2, b2, CHUNK=CHUNK, BLOCK=BLOCK, PF=pf, EVICT_LAST=evict_last)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        src, dst, w = torch.randn(3 * BLOCK + 5), torch.empty(3 * BLOCK + 5), torch.zeros(CHUNK, dtype=torch.uint8)
        stream(src, dst)  # no prefetch: inline PTX does not run in the interpreter (the prefetch kernels compile
        assert torch.equal(src, dst)  # for sm_90, checked where this was written)
        print("smoke: the stream copied its values")
        return
    from common import n_sets_for, time_cuda

    from gdn_trt.plugins.glue import gemm

    dev, bf = "cuda", torch.bfloat16
    state = args.n * 32 * 128 * 128  # fp32 values of one layer's recurrent state at N (Qwen3-Next: 32 heads, 128^2)
    R = max(2, n_sets_for(state * 8))
    srcs = [torch.randn(state, device=dev) for _ in range(R)]
    dst = torch.empty(state, device=dev)
    W = max(3, n_sets_for((2048 * 4096 + 12352 * 2048) * 2))
    wo = [torch.randn(2048, 4096, device=dev, dtype=bf) * 0.02 for _ in range(W)]
    wi = [torch.randn(12352, 2048, device=dev, dtype=bf) * 0.02 for _ in range(W)]
    xo = torch.randn(args.n, 4096, device=dev, dtype=bf)
    xi = torch.randn(args.n, 2048, device=dev, dtype=bf)
    bo = 2048 * 4096 * 2
    bi = (12352 * 2048 * 2 // 2) // CHUNK * CHUNK
    u8 = [(a.view(torch.uint8).view(-1), b.view(torch.uint8).view(-1)) for a, b in zip(wo, wi)]
    ref = gemm.linear(xo, wo[0])

    def seq(i, pf_out=False, pf_in=False, evict_last=False):
        o, w = u8[i % W]
        if pf_out:
            stream(srcs[i % R], dst, o, bo, w, bi if pf_in else 0, evict_last)
        else:
            stream(srcs[i % R], dst)
        gemm.linear(xo, wo[i % W])
        F.linear(xi, wi[i % W])

    rows = (("stream", lambda i: stream(srcs[i % R], dst)),
            ("out", lambda i: gemm.linear(xo, wo[i % W])),
            ("in", lambda i: F.linear(xi, wi[i % W])),
            ("stream, out, in", seq),
            ("stream + pf out, out, in", lambda i: seq(i, True)),
            ("stream + pf out, in/2, out, in", lambda i: seq(i, True, True)),
            ("stream + pf out (evict_last), out, in", lambda i: seq(i, True, False, True)),
            ("stream + pf out, in/2 (evict_last), out, in", lambda i: seq(i, True, True, True)))
    n_sets = R * W
    for name, fn in rows:
        us = time_cuda(fn, n_sets).median_s * 1e6
        print(f"N={args.n} {name}: {us:.2f} us", flush=True)
    seq(0, True, True, True)
    assert torch.equal(gemm.linear(xo, wo[0]), ref)


if __name__ == "__main__":
    main()
