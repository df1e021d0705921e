"""The gated delta rule's kernels in TensorRT's AOT parameter order, and their selection (`plan`).

One wrapper `@triton.jit` per plugin: its parameters are the plugin's inputs (pointers, in `spec.py` order), the
int32 scalars, the plugin's outputs (pointers, an aliased output after the input it updates), then constexprs. It
calls the kernel the JIT entry points launch (`triton_recurrent`, `triton_intra`, `triton_chunked`), with
TensorRT's dense strides as constants and an aliased buffer through its output pointer (TensorRT passes the same
address for both). The chunked op is four plugins (`spec.AOT_CHAINS`): solve, w/u, state, output, the launches of
`triton.launch_chunked` with its defaults (w/u unfused, 1 / |q| from the output pass's q tile).

Differences from the JIT launches, all compile-time choices TensorRT's one-kernel-per-plugin model forces:
- `scale` = K^-1/2 is a constexpr (AOT scalars are int32 only);
- the vector over the sequences that locates a chunk (`BN`) is as wide as the node's `max_seqs` attribute when N is
  dynamic (the JIT sizes it from N per step);
- the state pass and the recurrent kernel pick their tiling once per engine: from N when the graph fixes it (decode,
  prefill: N = 1), else the many-sequence tiling (the JIT picks per step);
- tiles whose shared memory exceeds `aot.AOT_SMEM_LIMIT` are shrunk (`AotTuning`; the sizes are checked by
  tests/test_triton_aot.py at Qwen3-Next's and Qwen3.5's heads, and the AOT kernels' speed against the JIT's has
  not been measured yet).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from ..aot_plan import KernelPlan, add, cdiv, pointer_signature, static
from ..spec import (GDN_CHUNK_OUT, GDN_CHUNK_SOLVE, GDN_CHUNK_STATE, GDN_CHUNK_WU, GDN_RECURRENT,
                    GDN_RECURRENT_STASH, OpSpec)
from .triton import H200_SMS, TUNING, _rec_tiling, _uniform, _v_tile
from .triton_chunked import BC, BT, gdn_chunk_out_kernel, gdn_chunk_state_kernel
from .triton_intra import gdn_chunk_intra_kernel, gdn_chunk_wu_kernel
from .triton_recurrent import gdn_recurrent_kernel


@dataclass(frozen=True)
class AotTuning:
    """The tiles of the AOT kernels that differ from `triton.TUNING` (whose other fields they share), per
    activation width: the JIT's state pass pipelines 2-3 stages (96-177 KB of shared memory), its output pass takes
    128-wide V tiles (48 KB in bf16, 128 KB in fp32) and its fp32 w/u pass 64-wide slices in 3 stages, all over
    48 KiB (sm_90 compiles, bench/results/2026-12-03-aot.md)."""

    state_stages: int = 1
    state_bv: int = 32  # one sequence (N fixed at 1)
    state_bv_many: int = 64
    out_bv: int = 64
    out_ks: int = 0  # > 0: the output pass's products over K in slices this wide (`gdn_chunk_out_kernel`'s KS)
    wu_bk: int = 64  # > 0: a runtime loop over K and V slices this wide (the JIT's form); 0: K in one tile
    wu_bv: int = 64
    wu_stages: int = 3  # the loop's software pipeline (Tuning.wu_stages); fp32 in 3 stages takes 64 KB


AOT_TUNING = AotTuning()
AOT_TUNING_FP32 = AotTuning(state_bv=32, state_bv_many=32, out_bv=64, out_ks=16, wu_bk=32, wu_bv=32, wu_stages=1)


def _tuning(dtype: str) -> AotTuning:
    return AOT_TUNING_FP32 if dtype == "float32" else AOT_TUNING


@triton.jit
def gdn_recurrent_aot(q, k, v, a, b, A_log, dt_bias, cu_seqlens, slots, ssm_pool, o, ssm_pool_out,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, STREAM: tl.constexpr, SUB: tl.constexpr, SUB_STAGES: tl.constexpr,
                      SCALE: tl.constexpr):
    gdn_recurrent_kernel(q, k, v, a, b, A_log, dt_bias, o, ssm_pool_out, ssm_pool_out, cu_seqlens, slots,
                         H * K, K, H * K, K, HV * V, V, HV, 1, HV, 1, SCALE, H, HV, K, V, BK, BV, False, STREAM, SUB,
                         SUB_STAGES)


@triton.jit
def gdn_recurrent_stash_aot(q, k, v, a, b, A_log, dt_bias, cu_seqlens, slots, ssm_pool, ssm_stash, o,
                            ssm_stash_out, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BK: tl.constexpr, BV: tl.constexpr, STREAM: tl.constexpr, SUB: tl.constexpr,
                            SUB_STAGES: tl.constexpr, SCALE: tl.constexpr):
    gdn_recurrent_kernel(q, k, v, a, b, A_log, dt_bias, o, ssm_pool, ssm_stash_out, cu_seqlens, slots,
                         H * K, K, H * K, K, HV * V, V, HV, 1, HV, 1, SCALE, H, HV, K, V, BK, BV, True, STREAM, SUB,
                         SUB_STAGES)


@triton.jit
def gdn_chunk_solve_aot(q, k, v, a, b, A_log, dt_bias, cu_seqlens, slots, capture_at, N, rk, gam, t_inv,
                        H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BKS: tl.constexpr,
                        BD: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr,
                        SOLVE_PREC: tl.constexpr, SHARE: tl.constexpr):
    # unfused: t_inv stands in for w and u (their dtype, never written) and rk for rq (RQ off)
    gdn_chunk_intra_kernel(q, k, v, a, b, A_log, dt_bias, rk, rk, gam, t_inv, t_inv, t_inv, cu_seqlens, slots,
                           capture_at, N, H * K, K, H * K, K, HV * V, V, HV, 1, HV, 1, H, HV, K, V, BKS, BD, BN, BT,
                           BC, PREC, SOLVE_PREC, SHARE, False, False)


@triton.jit
def gdn_chunk_wu_aot(k, v, b, t_inv, gam, rk, cu_seqlens, slots, capture_at, N, w, u,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                     BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, LOOP: tl.constexpr):
    gdn_chunk_wu_kernel(k, v, b, t_inv, gam, rk, w, u, cu_seqlens, slots, capture_at, N, H * K, K, HV * V, V, HV, 1,
                        H, HV, K, V, BK, BV, BN, BT, PREC, LOOP)


@triton.jit
def gdn_chunk_state_aot(k, rk, w, u, gam, cu_seqlens, slots, capture_at, ssm_pool, ssm_capture, N, h, v_new,
                        ssm_pool_out, ssm_capture_out, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                        V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
                        PREC: tl.constexpr, UNI: tl.constexpr):
    gdn_chunk_state_kernel(k, rk, w, u, gam, h, v_new, ssm_pool_out, ssm_capture_out, cu_seqlens, slots, capture_at,
                           N, H * K, K, H, HV, K, V, BK, BV, BN, BT, PREC, False, UNI=UNI)


@triton.jit
def gdn_chunk_out_aot(q, k, rk, gam, h, v_new, cu_seqlens, slots, capture_at, N, o,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                      BV: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, SCALE: tl.constexpr,
                      KS: tl.constexpr):
    gdn_chunk_out_kernel(q, k, rk, rk, gam, h, v_new, o, cu_seqlens, slots, capture_at, N, H * K, K, H * K, K, SCALE,
                         H, HV, K, V, BK, BV, BN, BT, PREC, False, KS)


_WRAPPERS = {GDN_RECURRENT: gdn_recurrent_aot, GDN_RECURRENT_STASH: gdn_recurrent_stash_aot,
             GDN_CHUNK_SOLVE: gdn_chunk_solve_aot, GDN_CHUNK_WU: gdn_chunk_wu_aot,
             GDN_CHUNK_STATE: gdn_chunk_state_aot, GDN_CHUNK_OUT: gdn_chunk_out_aot}


def _dims(spec: OpSpec, shapes: dict) -> tuple:
    """(T, H, K, HV, V, N) of a plugin's tensors; the head counts and head dims must be static."""
    k, vs = shapes["k"], shapes["v"] if "v" in shapes else shapes["v_new"]  # [T, H, K], [T, HV, V]
    heads = tuple(static(d) for d in (k[1], k[2], vs[1], vs[2]))
    if None in heads:
        raise ValueError(f"{spec.name}: head counts and head dims must be static in the engine, got k {k}, v {vs}")
    return (k[0], *heads, shapes["slots"][0])


def _bn(spec: OpSpec, N, attrs: dict) -> int:
    """Width of the vector over the sequences: N's power of two when static, else `max_seqs`'."""
    n = static(N)
    top = attrs["max_seqs"]
    if n is not None and n > top:
        raise ValueError(f"{spec.name}: N = {n} exceeds the node's max_seqs = {top}")
    return max(2, triton.next_power_of_2(n if n is not None else top))


def _precisions(dtype: str) -> tuple[str, str]:
    """(dots of the w/u, state and output passes, dots of the solve): `triton.launch_chunked`'s choice."""
    fp32 = dtype == "float32"
    return (TUNING.fp32_dot if fp32 else "tf32"), (TUNING.fp32_solve_dot if fp32 else "tf32")


def plan(spec: OpSpec, shapes: dict, dtypes: dict[str, str], attrs: dict[str, int]) -> KernelPlan:
    """The launch of plugin `spec` (see `aot.aot_kernel` for the arguments)."""
    T, H, K, HV, V, N = _dims(spec, shapes)
    act = dtypes["k"]
    sig = pointer_signature(spec.inputs, dtypes)
    outs = pointer_signature(spec.outputs, dtypes)
    fn = _WRAPPERS[spec]
    meta = dict(H=H, HV=HV, K=K, V=V)
    if spec in (GDN_RECURRENT, GDN_RECURRENT_STASH):
        n = static(N)
        if n is None:  # the many-sequence tiling
            BV, warps = min(TUNING.rec_bv, triton.next_power_of_2(V)), TUNING.rec_warps
        else:
            BV, warps = _rec_tiling(TUNING, V, HV * n)
        sub = TUNING.rec_sub if 0 < TUNING.rec_sub < BV else 0
        meta.update(BK=triton.next_power_of_2(K), BV=BV, STREAM=TUNING.rec_stream, SUB=sub,
                    SUB_STAGES=TUNING.rec_sub_stages, SCALE=K ** -0.5)
        return _plan(fn, sig + outs, meta, warps, 3, (cdiv(V, BV), HV, N))
    tu, (prec, solve_prec) = _tuning(act), _precisions(act)
    BK = max(16, triton.next_power_of_2(K))
    chunks = add(cdiv(T, BT), N * 2)  # >= the chunks of every sequence, a capture cut included
    meta.update(BN=_bn(spec, N, attrs), BT=BT)
    sig = sig + [("N", "i32")] + outs
    if spec is GDN_CHUNK_SOLVE:
        meta.update(BKS=min(TUNING.solve_bk, BK), BD=_v_tile(TUNING.fuse_bd, max(K, V)), BC=BC, PREC=prec,
                    SOLVE_PREC=solve_prec, SHARE=TUNING.solve_share)
        return _plan(fn, sig, meta, TUNING.solve_warps, 3, (chunks, H if TUNING.solve_share else HV, 1), (N,))
    if spec is GDN_CHUNK_WU:
        loop = tu.wu_bk > 0
        meta.update(BK=_v_tile(tu.wu_bk, K) if loop else BK, BV=_v_tile(tu.wu_bv, V), PREC=prec, LOOP=loop)
        return _plan(fn, sig, meta, TUNING.wu_warps, tu.wu_stages if loop else 1, (chunks, HV, 1), (N,))
    if spec is GDN_CHUNK_STATE:
        n = static(N)
        one = n is not None and triton.cdiv(V, _v_tile(tu.state_bv, V)) * HV * n <= H200_SMS
        BV = _v_tile(tu.state_bv if one else tu.state_bv_many, V)
        meta.update(BK=BK, BV=BV, PREC=prec, UNI=_uniform(TUNING))
        return _plan(fn, sig, meta, TUNING.state_warps, tu.state_stages, (cdiv(V, BV), HV, N), (N,))
    BV = _v_tile(tu.out_bv, V)
    meta.update(BK=BK, BV=BV, PREC=prec, SCALE=K ** -0.5, KS=min(tu.out_ks, BK))
    return _plan(fn, sig, meta, TUNING.out_warps, 3, (cdiv(V, BV), chunks, H), (N,))


def _plan(fn, sig: list, meta: dict, warps: int, stages: int, grid: tuple, scalars: tuple = ()) -> KernelPlan:
    return KernelPlan(fn, tuple(sig), tuple(meta.items()), warps, stages, grid, scalars)

