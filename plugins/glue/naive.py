"""References of the fused glue around the GDN kernels: the layer's norms, gates and residual arithmetic, and the
projections' GEMM (`linear`, whose kernel is the skinny GEMM of `gemm.py`).

Each function is the plain math of one fused kernel of `triton.py` (same name, arguments and result), computed in
fp32, or in fp64 when the inputs are fp64, and cast to the input dtype once at the end. The Triton kernels also
round some intermediates to the activation dtype where the layer's torch code does (see `triton.py`); these
references do not, so in float64 they are the exact functions the kernels approximate. Shapes: T tokens, n hc
streams of C channels (D = n*C), HV value heads of V channels, I = the dense MLP width, R = the hc low rank.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..causal_conv1d import naive as conv_naive
from ..causal_conv1d.io import ConvParams
from ..gated_delta_rule import naive as gdn_naive
from ..gated_delta_rule.io import GdnInputs
from ..packing import Packing, compute_dtype
from .io import PleNorms


def _norm(x: Tensor, w: Tensor, eps: float, group: int) -> Tensor:
    """Zero-centred RMSNorm (1 + w) over groups of `group` channels of the last dim, in x's dtype."""
    g = x.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    return (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)).reshape(x.shape) * (1.0 + w.to(x.dtype))


def add_rms_norm(x: Tensor, adds: Sequence[Tensor], w: Tensor, eps: float, group: int) -> tuple[Tensor, Tensor]:
    """r = x + (adds[0] + adds[1] ...) and h = RMSNorm(1 + w) of r over groups of `group` channels.
    x, adds [T, D]; w [D]. Returns (h, r), both [T, D]; r is x itself when `adds` is empty."""
    cd = compute_dtype(x.dtype)
    r = x.to(cd)
    if adds:
        r = r + sum(a.to(cd) for a in adds)
    return _norm(r, w, eps, group).to(x.dtype), (r.to(x.dtype) if adds else x)


def hc_norm(x: Tensor, adds: Sequence[Tensor], w: Tensor, inject: Tensor, eps: float
            ) -> tuple[Tensor, Tensor, Tensor]:
    """The hc sublayer's entry: (hn, r) = `add_rms_norm` over groups of C = D / n (n = inject.shape[0]), and the
    inject logits hn inject^T split by stream group: logits[t, g, i] = <hn[t, group g], inject[i, group g]> in the
    compute dtype (summed over g by `hc_inject`). Returns (hn [T, D], r [T, D], logits [T, n, n])."""
    n = inject.shape[0]
    hn, r = add_rms_norm(x, adds, w, eps, x.shape[-1] // n)
    cd = compute_dtype(x.dtype)
    T = x.shape[0]
    logits = torch.einsum("tgc,igc->tgi", hn.to(cd).reshape(T, n, -1), inject.to(cd).reshape(n, n, -1))
    return hn, r, logits


def gated_rms_norm(o: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """GDN output norm per value head: w * RMSNorm(o) * act(z), act silu or sigmoid. o, z [T, HV, V]; w [V]."""
    cd = compute_dtype(o.dtype)
    of, zf = o.to(cd), z.to(cd)
    y = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps) * w.to(cd)
    return (y * (F.silu(zf) if act == "silu" else torch.sigmoid(zf))).to(o.dtype)


def silu_mul(gu: Tensor) -> Tensor:
    """SwiGLU: gu [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
    gate, up = gu.to(compute_dtype(gu.dtype)).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gu.dtype)


def silu_div(x: Tensor, n: int) -> Tensor:
    """The hc low-rank activation: silu(x / n), x [T, R]."""
    return F.silu(x.to(compute_dtype(x.dtype)) / n).to(x.dtype)


def hc_mix(hn: Tensor, up: Tensor, n: int) -> Tensor:
    """The hc sublayer input: mean over the n streams of sigmoid(up) * hn. hn, up [T, n*C] -> [T, C]."""
    cd = compute_dtype(hn.dtype)
    T = hn.shape[0]
    return (torch.sigmoid(up.to(cd)) * hn.to(cd)).reshape(T, n, -1).mean(1).to(hn.dtype)


def hc_inject(streams: Tensor, logits: Tensor, y: Tensor) -> Tensor:
    """The hc residual: streams + inj[:, i] * y on stream i, inj = 2 sigmoid(logits.sum(1) / n) [T, n] from the
    grouped inject logits of `hc_norm`. streams [T, n*C], logits [T, n, n], y [T, C]."""
    cd = compute_dtype(streams.dtype)
    T, n = logits.shape[:2]
    inj = 2 * torch.sigmoid(logits.to(cd).sum(1) / n)
    out = streams.to(cd).reshape(T, n, -1) + inj[:, :, None] * y.to(cd)[:, None, :]
    return out.reshape(streams.shape).to(streams.dtype)


def ple_gate(key: Tensor, value: Tensor, streams: Tensor, norms: PleNorms) -> tuple[Tensor, Tensor]:
    """Qwen4-Exp PLE gate: per stream i, g = <RMSNorm_key(key_i), RMSNorm_query(streams_i)> / sqrt(C),
    g = sign(g) sqrt(max(|g|, 1e-6)), gv_i = sigmoid(g) value; u = RMSNorm_conv(gv) (all norms (1 + w) per stream).
    key, streams [T, n*C] (key = e key_proj^T), value [T, C] (= e value_proj^T). Returns (gv, u), both [T, n*C]."""
    cd = compute_dtype(key.dtype)
    T, C = value.shape
    n = key.shape[1] // C
    k = _norm(key.to(cd), norms.key, norms.eps, C).reshape(T, n, C)
    q = _norm(streams.to(cd), norms.query, norms.eps, C).reshape(T, n, C)
    g = (k * q).sum(-1, keepdim=True) / C ** 0.5
    g = g.abs().clamp_min(1e-6).sqrt() * g.sign()
    gv = (torch.sigmoid(g) * value.to(cd)[:, None, :]).reshape(T, n * C)
    return gv.to(key.dtype), _norm(gv, norms.conv, norms.eps, C).to(key.dtype)


def linear(x: Tensor, w: Tensor) -> Tensor:
    """y = x w^T of a projection in the compute dtype, cast once: x [M, K], w [N, K] -> [M, N]."""
    cd = compute_dtype(x.dtype)
    return F.linear(x.to(cd), w.to(cd)).to(x.dtype)


def linear_conv(x: Tensor, w: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> Tensor:
    """`linear`, then the conv update (`causal_conv1d.naive.update`) of its first D columns in their place: [M, N];
    writes the window after each sequence's token to conv_pool[slot]."""
    y = linear(x, w)
    D = conv.weight.shape[0]
    y[:, :D] = conv_naive.update(y[:, :D], conv, pack, conv_pool)
    return y


def recurrent_norm(x: GdnInputs, pack: Packing, ssm_pool: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """The GDN decode step (`gated_delta_rule.naive.recurrent`, which updates ssm_pool[slot]), then `gated_rms_norm`
    of its output: [T, HV, V]."""
    return gated_rms_norm(gdn_naive.recurrent(x, pack, ssm_pool), z, w, eps, act)
