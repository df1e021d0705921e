"""Norms of the layer, computed in fp32 (fp64 for fp64 inputs) and cast back, in HF's operation order."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from gdn_trt.plugins.packing import compute_dtype


def rms_norm_1p(x: Tensor, w: Tensor, eps: float, group: int | None = None) -> Tensor:
    """Zero-centred RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), over the last dim or over groups of `group`
    channels (Qwen4-Exp grouped norms: one norm per stream, never one over n*C)."""
    cd = compute_dtype(x.dtype)
    xf = x.to(cd)
    if group is not None:
        xf = xf.reshape(*x.shape[:-1], x.shape[-1] // group, group)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if group is not None:
        y = y.reshape(x.shape)
    return (y * (1.0 + w.to(cd))).to(x.dtype)


def gated_rms_norm(o: Tensor, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
    """GDN output norm per value head (plain w, norm before gate): w * norm(o) * act(z). o, z [T, HV, V]."""
    cd = compute_dtype(o.dtype)
    of = o.to(cd)
    y = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype)
    y = w * y
    gate = F.silu(z.to(cd)) if act == "silu" else torch.sigmoid(z.to(cd))
    return (y.to(cd) * gate).to(o.dtype)
