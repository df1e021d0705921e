"""Float64-capable references of the gated delta rule over the packed varlen layout.

Two independent formulations of the same recurrence (docs/math.md#gated-delta-rule, #chunked-form-prefill):
- `recurrent*`: the token loop S <- exp(g) S; S <- S + k (beta (v - S^T k))^T; o = S^T q, one token at a time;
- `chunked`: the WY form over chunks of 64 tokens (T = (I + A)^-1, W, U, per-chunk state hand-off).
Tests pin them to each other; the CPU dispatch of the ops runs these functions. Arithmetic is done in fp32, or in
fp64 when the inputs are fp64. All functions write the pools / stash / capture buffers in place and return `o`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..packing import Capture, Packing, check_buffer, compute_dtype
from .io import GdnInputs

CHUNK = 64
L2_EPS = 1e-6


def gates(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, cd: torch.dtype) -> tuple[Tensor, Tensor]:
    """g = -exp(A_log) * softplus(a + dt_bias) (log-space decay, <= 0) and beta = sigmoid(b); both [T, HV]."""
    g = -A_log.to(cd).exp() * F.softplus(a.to(cd) + dt_bias.to(cd))
    return g, torch.sigmoid(b.to(cd))


def l2norm(x: Tensor) -> Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last dim (eps inside the sqrt, as HF and FLA)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def prepare(x: GdnInputs) -> tuple[Tensor, ...]:
    """Normalised, scaled q and k expanded to value heads, v, g, beta; all [T, HV, .] in the compute dtype."""
    cd = compute_dtype(x.q.dtype)
    G = x.v.shape[1] // x.q.shape[1]
    q = l2norm(x.q.to(cd)) * x.q.shape[-1] ** -0.5
    k = l2norm(x.k.to(cd))
    g, beta = gates(x.a, x.b, x.A_log, x.dt_bias, cd)
    return q.repeat_interleave(G, 1), k.repeat_interleave(G, 1), x.v.to(cd), g, beta


def token_loop(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor) -> tuple[Tensor, Tensor]:
    """The recurrence over one sequence. q, k [L, HV, K]; v [L, HV, V]; g, beta [L, HV]; S [HV, K, V].

    Returns (o [L, HV, V], states [L, HV, K, V] after each token)."""
    o = torch.empty_like(v)
    states = torch.empty((q.shape[0], *S.shape), dtype=S.dtype, device=S.device)
    for t in range(q.shape[0]):
        S = S * g[t].exp()[:, None, None]
        delta = beta[t][:, None] * (v[t] - torch.einsum("hk,hkv->hv", k[t], S))
        S = S + k[t][:, :, None] * delta[:, None, :]
        o[t] = torch.einsum("hk,hkv->hv", q[t], S)
        states[t] = S
    return o, states


def wy_chunks(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor) -> tuple[Tensor, Tensor]:
    """The same recurrence in the chunked WY form (chunk 64). Same shapes as `token_loop`; returns (o, final S)."""
    L = q.shape[0]
    o = torch.empty_like(v)
    for s0 in range(0, L, CHUNK):
        sl = slice(s0, min(s0 + CHUNK, L))
        # [HV, n, .] per chunk
        qc, kc, vc = (t[sl].transpose(0, 1) for t in (q, k, v))
        gam = g[sl].transpose(0, 1).cumsum(-1)  # chunk-local log-decay cumsum, [HV, n]
        bc = beta[sl].transpose(0, 1)
        n = gam.shape[-1]
        diff = gam[:, :, None] - gam[:, None, :]  # gam_r - gam_s
        strict = torch.ones(n, n, dtype=torch.bool, device=q.device).tril(-1)
        incl = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        # mask before exp: exp(gam_r - gam_s) for s > r can overflow
        decay_strict = torch.where(strict, diff, float("-inf")).exp()
        decay_incl = torch.where(incl, diff, float("-inf")).exp()
        A = bc[:, :, None] * (kc @ kc.transpose(-1, -2)) * decay_strict
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        Tm = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
        W = Tm @ ((bc * gam.exp())[:, :, None] * kc)
        U = Tm @ (bc[:, :, None] * vc)
        delta = U - W @ S  # [HV, n, V]
        o[sl] = (gam.exp()[:, :, None] * (qc @ S) + ((qc @ kc.transpose(-1, -2)) * decay_incl) @ delta
                 ).transpose(0, 1)
        last = gam[:, -1:]
        S = last.exp()[:, :, None] * S + ((last - gam).exp()[:, :, None] * kc).transpose(-1, -2) @ delta
    return o, S


def _sequences(x: GdnInputs, pack: Packing, ssm_pool: Tensor) -> list[tuple[int, slice, int]]:
    """(index, token slice, pool slot) of every sequence, after checking shapes and values."""
    x.check(pack, ssm_pool)
    pack.check_values(x.num_tokens, ssm_pool.shape[0])
    cu = pack.cu_seqlens.tolist()
    return [(n, slice(cu[n], cu[n + 1]), slot) for n, slot in enumerate(pack.slots.tolist())]


def recurrent(x: GdnInputs, pack: Packing, ssm_pool: Tensor) -> Tensor:
    """DECODE / DECODE_MULTI_SEQ: token loop per sequence from ssm_pool[slot], final state written back.

    Returns o [T, HV, V] in the input dtype (rows of padding sequences are zero)."""
    seqs = _sequences(x, pack, ssm_pool)
    q, k, v, g, beta = prepare(x)
    o = torch.zeros_like(v)
    for _, sl, slot in seqs:
        if slot < 0 or sl.start == sl.stop:
            continue
        S0 = ssm_pool[slot].to(q.dtype)
        o[sl], states = token_loop(q[sl], k[sl], v[sl], g[sl], beta[sl], S0)
        ssm_pool[slot] = states[-1].to(ssm_pool.dtype)
    return o.to(x.q.dtype)


def recurrent_stash(x: GdnInputs, pack: Packing, ssm_pool: Tensor, ssm_stash: Tensor) -> Tensor:
    """DECODE_BATCHED / VERIFY_MULTI: the pool is only read; the state after token t goes to ssm_stash[t]."""
    check_buffer("ssm_stash", ssm_stash, (x.num_tokens, *x.state_shape))
    seqs = _sequences(x, pack, ssm_pool)
    q, k, v, g, beta = prepare(x)
    o = torch.zeros_like(v)
    for _, sl, slot in seqs:
        if slot < 0 or sl.start == sl.stop:
            continue
        o[sl], states = token_loop(q[sl], k[sl], v[sl], g[sl], beta[sl], ssm_pool[slot].to(q.dtype))
        ssm_stash[sl] = states.to(ssm_stash.dtype)
    return o.to(x.q.dtype)


def chunked(x: GdnInputs, pack: Packing, ssm_pool: Tensor, capture: Capture) -> Tensor:
    """PREFILL / PREFILL_VARLEN: WY chunks per sequence from ssm_pool[slot]; final state written back, and the
    state after capture.at[n] tokens copied to capture.buf[n] (the sequence is split there: same math)."""
    capture.check(pack.num_seqs, x.state_shape)
    seqs = _sequences(x, pack, ssm_pool)
    capture.check_values(pack.lengths())
    q, k, v, g, beta = prepare(x)
    o = torch.zeros_like(v)
    at = capture.at.tolist()
    for n, sl, slot in seqs:
        if slot < 0:
            continue
        S = ssm_pool[slot].to(q.dtype)
        cuts = [sl.start, sl.stop] if at[n] < 0 else [sl.start, sl.start + at[n], sl.stop]
        for lo, hi in zip(cuts, cuts[1:]):
            if hi > lo:
                o[lo:hi], S = wy_chunks(q[lo:hi], k[lo:hi], v[lo:hi], g[lo:hi], beta[lo:hi], S)
            if at[n] >= 0 and hi == sl.start + at[n]:
                capture.buf[n] = S.to(capture.buf.dtype)
        ssm_pool[slot] = S.to(ssm_pool.dtype)
    return o.to(x.q.dtype)
