"""The GDN decode step with the output's gated RMSNorm in its epilogue (`glue.recurrent_norm`, one launch where the
layer runs the recurrent kernel and `gated_norm_kernel`).

Why: in the decode step at N = 64 on the H200 the gated norm is its own kernel between the GDN decode and out_proj:
7.4 us of interval per layer, 4.6 of it beside the GDN decode's tail (PDL), so about 2.8 us a layer of the step's
device time (bench/results/2026-12-04-gemm-step-late.md); at N = 1, 3.4 us with 1.8 beside.

How: the grid, tiling and token step are the recurrent kernel's one-tile path (`triton_recurrent`: the same helpers
and the same V-tile and warps per sequence count, `gated_delta_rule.triton._rec_tiling`), so o and the state come
out bit for bit as that kernel writes them. The norm needs a value head's whole output (V columns), which the head's
NV programs (V-tiles) compute between them: each writes its columns of o, then draws a ticket from the (sequence,
head)'s int32 counter (an atomic add, release and acquire at GPU scope, after a CTA barrier: every thread's columns
are written before the ticket releases them); the program that draws the last ticket reads the head's V outputs
back (from L2: `.cg`), computes y = (w * RMSNorm(o)) * act(z) as `gated_norm_kernel` does row by row
(`gated_rows`, which that kernel calls too: the same roundings; only the order of the V-term sum of squares may
differ), writes it and sets the counter back to 0 for the next launch or graph replay. Padding sequences (slot -1)
write zero rows of o and y. The counters are allocated once per (device, sequences x heads) and kept (a captured
graph holds their address), like the split-K GEMM's (`gemm._workspace`): the first launch of a geometry must be
eager, and launches of one geometry must be ordered on one stream, as a session's are (two streams running the same
sequences x heads at once would mix their tickets).

PDL (plugins/pdl.py): the kernel waits where the recurrent kernel enters, but lets the next kernel (out_proj) launch
only after its state store, not at its start: out_proj's programs would otherwise hold SM slots through the whole
decode, as the conv's did through in_proj (`gemm.Config.late`).

Timed on the H200 (bench/results/2026-12-05-switches.md): its GPU tests pass, but the decode step's replay took
0.991 / 1.013 / 1.025 / 1.039x the unfused one's at N = 1 / 8 / 64 / 256, so `Tuning.norm_in_decode` stays off
(GDN_TRT_NORM_IN_DECODE=1 turns it on).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import pdl
from ..gated_delta_rule import triton as gdn_tri
from ..gated_delta_rule.io import GdnInputs
from ..gated_delta_rule.triton_recurrent import operands_first, tile_offsets, token_ptrs, token_steps
from ..packing import Packing


@triton.jit
def gated_rows(b_o, b_z, b_w, eps, V: tl.constexpr, SILU: tl.constexpr, dt: tl.constexpr):
    """y = (w * RMSNorm(o)) * act(z) of rows o, z [R, BW] held in fp32 (masked lanes 0), w [BW] fp32; rounded to dt
    after the norm, after w and at the end, where the layer's torch code rounds (`gated_norm_kernel` too)."""
    b_y = (b_o * tl.rsqrt(tl.sum(b_o * b_o, 1) / V + eps)[:, None]).to(dt)
    b_y = (b_w[None, :] * b_y.to(tl.float32)).to(dt)
    if SILU:
        b_g = b_z * tl.sigmoid(b_z)
    else:
        b_g = tl.sigmoid(b_z)
    return (b_y.to(tl.float32) * b_g).to(dt)


@triton.jit
def decode_norm_kernel(
    q, k, v, a, b, A_log, dt_bias,  # as gdn_recurrent_kernel
    o,  # [T, HV, V] contiguous: the GDN output
    pool,  # [S, HV, K, V] fp32, contiguous
    cu_seqlens, slots,
    s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_at, s_ah, s_bt, s_bh,
    scale,
    z, s_zt, s_zh, w, y, cnt, eps,  # z [T, HV, V] (unit last stride), w [V], y [T, HV, V] contiguous, cnt [N * HV]
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BW: tl.constexpr, STREAM: tl.constexpr,
    Q_AFTER: tl.constexpr, CH: tl.constexpr, QKV_FIRST: tl.constexpr, SILU: tl.constexpr, PDL: tl.constexpr = False,
):
    i_v, i_hv, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    slot = tl.load(slots + i_n).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_h = m_k[:, None] & m_v[None, :]
    if slot < 0:
        # padding sequence: zero rows of o and y, no state touched
        pdl.enter(PDL)
        for t in range(bos, eos):
            tl.store(o + (t * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=o.dtype.element_ty), mask=m_v)
            tl.store(y + (t * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=y.dtype.element_ty), mask=m_v)
        return
    if eos == bos:
        return
    pool += (slot * HV + i_hv) * K * V + i_v * BV
    LOAD_HINT: tl.constexpr = "evict_first" if STREAM else ""
    STORE_HINT: tl.constexpr = ".cs" if STREAM else ""
    p_q, p_k, p_v, p_a, p_b, p_o = token_ptrs(q, k, v, a, b, o, bos, i_h, i_hv, i_v, s_qt, s_qh, s_kt, s_kh, s_vt,
                                              s_vh, s_at, s_ah, s_bt, s_bh, HV, V, BV)
    o_c, m_v, o_h, m_h = tile_offsets(o_k, m_k, m_v, m_h, i_v, BV, V, CH)
    n_t = eos - bos
    if QKV_FIRST:  # the recurrent kernel's operands-first form (Tuning.rec_qkv_first)
        pdl.wait(PDL)
        b_h, p_q, p_k, p_v, p_a, p_b, p_o, _ = operands_first(
            p_q, p_k, p_v, p_a, p_b, p_o, pool, pool, A_log + i_hv, dt_bias + i_hv, scale, o_k, m_k, o_c, m_v, o_h, m_h,
            s_qt, s_kt, s_vt, s_at, s_bt, HV, K, V, False, LOAD_HINT, STORE_HINT, Q_AFTER, CH)
        n_t -= 1
    else:
        b_h = tl.load(pool + o_h, mask=m_h, other=0.0, eviction_policy=LOAD_HINT)
        pdl.wait(PDL)
    b_h = token_steps(b_h, p_q, p_k, p_v, p_a, p_b, p_o, pool, A_log + i_hv, dt_bias + i_hv, scale, n_t,
                      o_k, m_k, o_c, m_v, o_h, m_h, s_qt, s_kt, s_vt, s_at, s_bt, HV, K, V, False, STORE_HINT,
                      Q_AFTER, CH)
    tl.store(pool + o_h, b_h, mask=m_h, cache_modifier=STORE_HINT)
    pdl.release(PDL)
    # the head's gated norm, by the last of its V-tile programs to get here (the module docstring)
    tl.debug_barrier()  # every thread's columns of o are written before the ticket releases them
    c = cnt + i_n * HV + i_hv
    ticket = tl.atomic_add(c, 1, sem="acq_rel", scope="gpu")
    if ticket == tl.num_programs(0) - 1:
        o_w = tl.arange(0, BW)
        m_w = (o_w < V)[None, :]
        n_w = tl.load(w + o_w, mask=o_w < V, other=0.0).to(tl.float32)
        for t in range(bos, eos):
            at = (t * HV + i_hv) * V + o_w[None, :]
            n_o = tl.load(o + at, mask=m_w, other=0.0, cache_modifier=".cg").to(tl.float32)
            n_z = tl.load(z + t * s_zt + i_hv * s_zh + o_w[None, :], mask=m_w, other=0.0).to(tl.float32)
            tl.store(y + at, gated_rows(n_o, n_z, n_w, eps, V, SILU, y.dtype.element_ty), mask=m_w)
        tl.atomic_xchg(c, 0, sem="relaxed", scope="gpu")


_COUNTERS: dict[tuple, Tensor] = {}  # (device, sequences x heads) -> int32 tickets, zero between launches


def _counters(device: torch.device, n: int) -> Tensor:
    hit = _COUNTERS.get((device, n))
    if hit is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the decode norm's tickets for {n} (sequence, head) pairs are allocated by its first "
                               "launch, which must be eager: run this call once before capturing it")
        hit = _COUNTERS[(device, n)] = torch.zeros(n, dtype=torch.int32, device=device)
    return hit


def _form(x: GdnInputs, pack: Packing) -> tuple[int, int, bool] | None:
    """(V-tile, warps, few-sequence tiling) of the recurrent kernel's launch for this call
    (`gated_delta_rule.triton._rec_tiling`), or None where that launch takes a form this kernel does not have
    (sub-tiles, TMA, prefetch ahead or the persistent grid)."""
    t = gdn_tri.TUNING
    HV, V = x.v.shape[1:]
    few = gdn_tri._rec_few(t, V, HV * pack.num_seqs)
    BV, warps = gdn_tri._rec_tiling(t, V, HV * pack.num_seqs)
    if (t.rec_tma_few if few else t.rec_tma) or (0 < t.rec_sub < BV) or (t.rec_persist > 0 and not few) \
            or (t.rec_ahead and not few):
        return None
    return BV, warps, few


def takes(x: GdnInputs, pack: Packing) -> bool:
    """Whether this kernel has the form of the recurrent kernel's launch for this call: otherwise
    `op.recurrent_norm` runs the two kernels."""
    return _form(x, pack) is not None


def launch(x: GdnInputs, pack: Packing, ssm_pool: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """y [T, HV, V] = gated_rms_norm(recurrent(x)) (see the module docstring); ssm_pool[slot] updated in place.
    The caller checked the call (`op.recurrent_norm`) and that this form takes it (`takes`)."""
    gdn_tri._check(x, pack, ssm_pool)
    t = gdn_tri.TUNING
    q, k, v, a, b = gdn_tri._operands(x)
    T, H, K = q.shape
    HV, V = v.shape[1:]
    N = pack.num_seqs
    o = gdn_tri._new((T, HV, V), q.dtype, q.device)
    y = gdn_tri._new((T, HV, V), q.dtype, q.device)
    if N == 0 or T == 0:
        return y
    BV, warps, few = _form(x, pack)
    strides = (*q.stride()[:2], *k.stride()[:2], *v.stride()[:2], *a.stride(), *b.stride())
    decode_norm_kernel[(triton.cdiv(V, BV), HV, N)](
        q, k, v, a, b, x.A_log, x.dt_bias, o, ssm_pool, pack.cu_seqlens, pack.slots, *strides, K ** -0.5,
        z, z.stride(0), z.stride(1), w, y, _counters(q.device, N * HV), eps,
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, BW=triton.next_power_of_2(V),
        STREAM=t.rec_stream, Q_AFTER=t.rec_q_after, CH=t.rec_chunk if not few and 0 < t.rec_chunk < BV else 0,
        QKV_FIRST=t.rec_qkv_first, SILU=act == "silu", num_warps=warps, **pdl.options(q.device),
        **({"maxnreg": t.rec_maxnreg} if t.rec_maxnreg and not few else {}))
    return y
