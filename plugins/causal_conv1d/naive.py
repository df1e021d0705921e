"""Sequential reference of the depthwise causal conv with state, over the packed varlen layout.

    y[t, c] = act( sum_j weight[c, j] * x[t - (W-1-j)*dilation, c] )

with the history before a sequence's first token read from `conv_pool[slot]` ([(W-1)*dilation, D]: the last
pre-conv inputs, oldest first, one row per token) and written back after its last token. Serves the GDN conv
(W=4, dilation 1, silu) and the PLE conv (W=4, dilation = ngram_size, silu). Arithmetic in fp32 (fp64 for fp64
inputs); y in the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..packing import Capture, Packing, check_buffer, compute_dtype
from ..spec import Activation
from .io import ConvParams


def conv_sequence(x: Tensor, hist: Tensor, conv: ConvParams) -> tuple[Tensor, Tensor]:
    """One sequence: x [L, D], hist [state_len, D] (oldest first) -> (y [L, D] pre-cast, windows
    [L, state_len, D] after each token). Computed in the dtype of `x`."""
    L, n = x.shape[0], conv.state_len
    buf = torch.cat([hist.to(x.dtype), x], dim=0)  # [n + L, D]: history rows, then the tokens
    w = conv.weight.to(x.dtype)
    y = torch.zeros_like(x)
    for j in range(conv.width):
        back = (conv.width - 1 - j) * conv.dilation
        y = y + w[:, j] * buf[n - back: n - back + L]
    if conv.activation == Activation.SILU:
        y = F.silu(y)
    windows = torch.stack([buf[t + 1: t + 1 + n] for t in range(L)]) if L else buf.new_zeros((0, *hist.shape))
    return y, windows


def _sequences(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> list[tuple[int, slice, int]]:
    conv.check(x, conv_pool)
    pack.check_shapes(x.shape[0])
    pack.check_values(x.shape[0], conv_pool.shape[0])
    cu = pack.cu_seqlens.tolist()
    return [(n, slice(cu[n], cu[n + 1]), slot) for n, slot in enumerate(pack.slots.tolist())]


def update(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> Tensor:
    """Decode modes: conv from conv_pool[slot], new window written back. x [T, D] -> y [T, D]."""
    seqs = _sequences(x, conv, pack, conv_pool)
    xc = x.to(compute_dtype(x.dtype))
    y = torch.zeros_like(xc)
    for _, sl, slot in seqs:
        if slot < 0 or sl.start == sl.stop:
            continue
        y[sl], windows = conv_sequence(xc[sl], conv_pool[slot], conv)
        conv_pool[slot] = windows[-1].to(conv_pool.dtype)
    return y.to(x.dtype)


def update_stash(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, conv_stash: Tensor) -> Tensor:
    """Verify modes: the pool is only read; the window after token t goes to conv_stash[t] ([T, state_len, D])."""
    check_buffer("conv_stash", conv_stash, (x.shape[0], *conv.state_shape()), conv_pool.dtype)
    seqs = _sequences(x, conv, pack, conv_pool)
    xc = x.to(compute_dtype(x.dtype))
    y = torch.zeros_like(xc)
    for _, sl, slot in seqs:
        if slot < 0 or sl.start == sl.stop:
            continue
        y[sl], windows = conv_sequence(xc[sl], conv_pool[slot], conv)
        conv_stash[sl] = windows.to(conv_stash.dtype)
    return y.to(x.dtype)


def prefill(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, capture: Capture) -> Tensor:
    """Prefill modes: as `update`, and the window after capture.at[n] tokens goes to capture.buf[n]."""
    capture.check(pack.num_seqs, conv.state_shape())
    seqs = _sequences(x, conv, pack, conv_pool)
    capture.check_values(pack.lengths())
    xc = x.to(compute_dtype(x.dtype))
    y = torch.zeros_like(xc)
    at = capture.at.tolist()
    for n, sl, slot in seqs:
        if slot < 0:
            continue
        hist = conv_pool[slot]
        if sl.stop > sl.start:
            y[sl], windows = conv_sequence(xc[sl], hist, conv)
        if at[n] >= 0:
            capture.buf[n] = (hist if at[n] == 0 else windows[at[n] - 1]).to(capture.buf.dtype)
        if sl.stop > sl.start:
            conv_pool[slot] = windows[-1].to(conv_pool.dtype)
    return y.to(x.dtype)
