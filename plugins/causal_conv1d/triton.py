"""Triton kernels of the depthwise causal conv with state: same names, arguments and semantics as `naive.py`.

Per sequence the conv reads the buffer [hist ; x] of rows: hist = conv_pool[slot] [n, D] (n = (W-1)*dilation
pre-conv inputs, oldest first, one row of D channels per token), then the sequence's tokens. Buffer row b is
hist[b] for b < n and x[bos + b - n] after; token i (0-based in its sequence) sees taps b = n + i - (W-1-j)*dilation,
j = 0..W-1, and the window after i tokens is rows [i, i + n). Every buffer row is a run along D, as x and y are,
so every access of every kernel is coalesced along the channels.

- `update` / `update_stash` (decode, verify): `conv_update_kernel`, one program per (channel tile, sequence),
  a loop over the sequence's few tokens; the window after each token goes to the stash, or the last window to
  the pool (after a barrier: the pool row is also read as history). One token (decode) reads each history row
  once instead.
- `prefill`: `conv_chunk_kernel` computes y for chunks of `Tuning.chunk_bt` tokens of every sequence in parallel
  (grid sized from shapes; each program finds its sequence by a prefix sum over cu_seqlens), for tokens i >= n
  only, so it streams x with 16-byte loads and never reads the pool; then `conv_state_kernel`, per
  (channel tile, sequence), computes the first n tokens (whose taps reach into the history), the capture window
  and the final window.
  Two launches because the final window overwrites the history row.

Arithmetic in fp32, y in the activation dtype. x may be a strided view (a column slice of the projection); its
row stride is passed to the kernels. Every launch is CUDA-graph safe (no host reads of tensor data, allocations
sized from shapes only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from .. import pdl
from ..packing import Capture, Packing
from ..spec import Activation
from .io import ConvParams


@dataclass(frozen=True)
class Tuning:
    """Launch parameters: the winners of `bench/kernels.py --sweep conv` on the H200 (Qwen3-Next conv, D = 8192,
    W = 4; bench/results/2026-12-03-conv-sweep.md)."""

    # the one-token update: 1024 channels on 8 warps took 10.83 us at N = 256 against 11.70 with 256 on 4 (FLA
    # 11.53; H200, bench/results/2026-12-03-kernels-round2.md, conv-var)
    update_bd: int = 1024
    update_warps: int = 8
    state_bd: int = 256  # the channel tile of the prefill's state launch (its tiling before the update's changed)
    state_warps: int = 4
    # one-token update of the GDN conv (dilation 1, W = 4): the weights as one aligned [BD, W] tile, its columns
    # picked in registers (a layout conversion through shared memory per tap: 11 barriers in the sm_90 code), as in
    # the probe that ran in 10.2 us at N = 256 (2026-12-03-kernels-variants.md); off: W strided 2-byte loads per
    # channel, already in the rows' layout (measured slower in the old [S, D, n] layout, 16.5 against 13.1 us,
    # where the history tile had the weight tile's layout; not timed in this one)
    update_wtile: bool = True
    # small tiles, many programs in flight: 16 x 128 on 2 warps took 201 us at T = 16384 against 322 us with the
    # earlier 64 x 128 on 4 warps (the loads of one program are W shifted copies of the same rows)
    chunk_bt: int = 16
    chunk_bd: int = 128
    chunk_warps: int = 2


TUNING = Tuning()


@triton.jit
def load_taps(x_seq, pool_row, o_d, m, b_pos, s_xt, D: tl.constexpr, STATE_LEN: tl.constexpr):
    """Buffer rows b_pos (int32, any shape broadcast against the channels o_d; mask m) as fp32: history row b of
    the pool ([n, D], row stride D) for b < n, else row b - n of x (x_seq points at the sequence's first row).
    Both are runs along D, so every access is coalesced."""
    b_pos = b_pos + tl.zeros_like(o_d)  # broadcast a scalar position first (the interpreter needs a vector mask)
    b_h = tl.load(pool_row + b_pos * D + o_d, mask=m & (b_pos < STATE_LEN), other=0.0)
    b_x = tl.load(x_seq + (b_pos - STATE_LEN) * s_xt + o_d, mask=m & (b_pos >= STATE_LEN), other=0.0)
    return b_h.to(tl.float32) + b_x.to(tl.float32)


@triton.jit
def conv_taps(x_seq, weight, pool_row, o_d, m_d, b_i, s_xt, s_wd,
              D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr, STATE_LEN: tl.constexpr, ACT: tl.constexpr):
    """y of the token at sequence-local position b_i (scalar) for channels o_d (mask m_d):
    act(sum_j w[:, j] x[i - (W-1-j) dil])."""
    b_y = tl.load(weight + o_d * s_wd, mask=m_d, other=0.0).to(tl.float32) * load_taps(
        x_seq, pool_row, o_d, m_d, STATE_LEN + b_i - (W - 1) * DIL, s_xt, D, STATE_LEN)
    for j in tl.static_range(1, W):
        b_w = tl.load(weight + o_d * s_wd + j, mask=m_d, other=0.0).to(tl.float32)
        b_y += b_w * load_taps(x_seq, pool_row, o_d, m_d, STATE_LEN + b_i - (W - 1 - j) * DIL, s_xt, D, STATE_LEN)
    if ACT == 1:
        b_y = b_y * tl.sigmoid(b_y)
    return b_y


@triton.jit
def window_after(x_seq, pool_row, o_d, m_d, b_i, s_xt, D: tl.constexpr, STATE_LEN: tl.constexpr,
                 BS: tl.constexpr):
    """The window after b_i tokens of the sequence: buffer rows [b_i, b_i + n) as a [BS, BD] fp32 tile (rows past
    n masked), its offsets [BS, BD] into an [n, D] row and its mask."""
    o_s = tl.arange(0, BS)
    m_sd = (o_s < STATE_LEN)[:, None] & m_d[None, :]
    b_win = load_taps(x_seq, pool_row, o_d[None, :], m_sd, b_i + o_s[:, None], s_xt, D, STATE_LEN)
    return b_win, o_s[:, None] * D + o_d[None, :], m_sd


@triton.jit
def conv_update_kernel(
    x, weight, y, pool, stash,  # x [T, D] (row stride s_xt); weight [D, W]; y [T, D]; pool [S, n, D]; stash [T, n, D]
    cu_seqlens, slots, s_xt,
    S_WD: tl.constexpr,  # the weight's row stride (W when contiguous): a constant, so weight rows are aligned
    D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr, STATE_LEN: tl.constexpr, ACT: tl.constexpr,
    BD: tl.constexpr, BS: tl.constexpr, BW: tl.constexpr, STASH: tl.constexpr, WTILE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    i_d, i_n = tl.program_id(0), tl.program_id(1)
    b_cu = tl.load(cu_seqlens + i_n)
    bos = b_cu.to(tl.int64)
    n_t = tl.load(cu_seqlens + i_n + 1) - b_cu
    slot = tl.load(slots + i_n).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    y += bos * D
    pdl.enter(PDL)  # x is the previous kernel's output; the packing is not (plugins/pdl.py)
    if slot < 0:
        for i in range(0, n_t):
            tl.store(y + i * D + o_d, tl.zeros([BD], dtype=y.dtype.element_ty), mask=m_d)
        return
    x += bos * s_xt
    pool_row = pool + slot * STATE_LEN * D
    stash += bos * STATE_LEN * D
    if n_t == 1:
        # one token (every decode step): the taps are whole history rows (runs along D, as x and y), read once.
        # In the [S, D, n] layout of before the update at N = 256 took 16.5 us (FLA 11.1); a probe of this layout
        # with the slot lookup ran it in 10.2 (bench/probes.py, 2026-12-03-kernels-variants.md)
        b_x = tl.load(x + o_d, mask=m_d, other=0.0).to(tl.float32)
        if WTILE and (DIL == 1) and (BW == W) and (S_WD == W):
            # the GDN conv (W = 4): the weights as one aligned [BD, W] tile (8-byte rows) instead of W 2-byte
            # gathers per channel (those cost about 3.4 us of the 16.5 above), columns picked in registers
            o_w = tl.arange(0, BW)
            b_w = tl.load(weight + o_d[:, None] * W + o_w[None, :], mask=m_d[:, None], other=0.0).to(tl.float32)
            b_y = tl.sum(tl.where((o_w == W - 1)[None, :], b_w, 0.0), 1) * b_x
            for j in tl.static_range(W - 1):
                b_h = tl.load(pool_row + j * D + o_d, mask=m_d, other=0.0).to(tl.float32)
                b_y += tl.sum(tl.where((o_w == j)[None, :], b_w, 0.0), 1) * b_h
        else:
            b_y = tl.load(weight + o_d * S_WD + (W - 1), mask=m_d, other=0.0).to(tl.float32) * b_x
            for j in tl.static_range(W - 1):  # tap j of the token is history row j * DIL (n = (W-1) DIL rows)
                b_h = tl.load(pool_row + j * DIL * D + o_d, mask=m_d, other=0.0).to(tl.float32)
                b_y += tl.load(weight + o_d * S_WD + j, mask=m_d, other=0.0).to(tl.float32) * b_h
        if ACT == 1:
            b_y = b_y * tl.sigmoid(b_y)
        tl.store(y + o_d, b_y.to(y.dtype.element_ty), mask=m_d)
        b_win, o_sd, m_sd = window_after(x, pool_row, o_d, m_d, 1, s_xt, D, STATE_LEN, BS)
        if STASH:
            tl.store(stash + o_sd, b_win.to(stash.dtype.element_ty), mask=m_sd)
        else:
            tl.debug_barrier()  # every read of the history row precedes its overwrite
            tl.store(pool_row + o_sd, b_win.to(pool.dtype.element_ty), mask=m_sd)
        return
    for i in range(0, n_t):
        b_y = conv_taps(x, weight, pool_row, o_d, m_d, i, s_xt, S_WD, D, W, DIL, STATE_LEN, ACT)
        tl.store(y + i * D + o_d, b_y.to(y.dtype.element_ty), mask=m_d)
        if STASH:
            b_win, o_sd, m_sd = window_after(x, pool_row, o_d, m_d, i + 1, s_xt, D, STATE_LEN, BS)
            tl.store(stash + i * STATE_LEN * D + o_sd, b_win.to(stash.dtype.element_ty), mask=m_sd)
    if not STASH:
        if n_t > 0:
            b_win, o_sd, m_sd = window_after(x, pool_row, o_d, m_d, n_t, s_xt, D, STATE_LEN, BS)
            tl.debug_barrier()  # every read of the history row precedes its overwrite
            tl.store(pool_row + o_sd, b_win.to(pool.dtype.element_ty), mask=m_sd)


@triton.jit
def conv_chunk_kernel(
    x, weight, y, cu_seqlens, slots, N, s_xt, s_wd,
    D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr, STATE_LEN: tl.constexpr, ACT: tl.constexpr,
    BD: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr,
):
    """y for a chunk of BT tokens of one sequence, rows i >= n only: every tap then lies inside x, so this pass
    streams x with no history gathers (rows i < n are the state kernel's)."""
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    # chunk i_c -> (sequence, chunk in sequence) by a prefix sum of per-sequence chunk counts
    o_n = tl.arange(0, BN)
    m_n = o_n < N
    b_bos = tl.load(cu_seqlens + o_n, mask=m_n, other=0)
    b_cnt = (tl.load(cu_seqlens + o_n + 1, mask=m_n, other=0) - b_bos + BT - 1) // BT
    b_end = tl.cumsum(b_cnt, 0)
    i_n = tl.sum((b_end <= i_c).to(tl.int32), 0)
    if i_n >= N:
        return
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    n_t = tl.load(cu_seqlens + i_n + 1) - tl.load(cu_seqlens + i_n)
    slot = tl.load(slots + i_n)
    i_t0 = (i_c - tl.sum(tl.where(o_n == i_n, b_end - b_cnt, 0), 0)) * BT

    o_i = i_t0 + tl.arange(0, BT)  # sequence-local token positions (int32)
    m_t = (o_i < n_t) & (o_i >= STATE_LEN)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    m_y = m_t[:, None] & m_d[None, :]
    p_y = y + bos * D + o_i[:, None] * D + o_d[None, :]
    if slot < 0:
        tl.store(p_y, tl.zeros([BT, BD], dtype=y.dtype.element_ty), mask=m_y)
        return
    x += bos * s_xt
    b_y = tl.zeros([BT, BD], dtype=tl.float32)
    for j in tl.static_range(W):
        b_w = tl.load(weight + o_d * s_wd + j, mask=m_d, other=0.0).to(tl.float32)
        p_x = x + (o_i - (W - 1 - j) * DIL)[:, None] * s_xt + o_d[None, :]
        b_y += b_w[None, :] * tl.load(p_x, mask=m_y, other=0.0).to(tl.float32)
    if ACT == 1:
        b_y = b_y * tl.sigmoid(b_y)
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_y)


@triton.jit
def conv_state_kernel(
    x, weight, y, pool, cap, cu_seqlens, slots, capture_at, s_xt, s_wd,
    D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr, STATE_LEN: tl.constexpr, ACT: tl.constexpr,
    BD: tl.constexpr, BS: tl.constexpr,
):
    """Per (channel tile, sequence): y for the first min(n, len) tokens (their taps reach into the history), the
    capture window and the final window (the pool row is read before it is overwritten). Every row it reads or
    writes is a run of channels, so its accesses are coalesced along D."""
    i_d, i_n = tl.program_id(0), tl.program_id(1)
    slot = tl.load(slots + i_n).to(tl.int64)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    length = tl.load(cu_seqlens + i_n + 1) - tl.load(cu_seqlens + i_n)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    y += bos * D
    if slot < 0:
        for i in range(0, tl.minimum(length, STATE_LEN)):
            tl.store(y + i * D + o_d, tl.zeros([BD], dtype=y.dtype.element_ty), mask=m_d)
        return
    c_at = tl.load(capture_at + i_n)
    x += bos * s_xt
    pool_row = pool + slot * STATE_LEN * D
    for i in range(0, tl.minimum(length, STATE_LEN)):
        b_y = conv_taps(x, weight, pool_row, o_d, m_d, i, s_xt, s_wd, D, W, DIL, STATE_LEN, ACT)
        tl.store(y + i * D + o_d, b_y.to(y.dtype.element_ty), mask=m_d)
    if c_at >= 0:
        b_win, o_sd, m_sd = window_after(x, pool_row, o_d, m_d, c_at, s_xt, D, STATE_LEN, BS)
        tl.store(cap + i_n.to(tl.int64) * STATE_LEN * D + o_sd, b_win.to(cap.dtype.element_ty), mask=m_sd)
    if length > 0:
        b_win, o_sd, m_sd = window_after(x, pool_row, o_d, m_d, length, s_xt, D, STATE_LEN, BS)
        tl.debug_barrier()  # every read of the history row precedes its overwrite
        tl.store(pool_row + o_sd, b_win.to(pool.dtype.element_ty), mask=m_sd)


def _new(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Every output comes from here (shapes only; tests swap it to poison outputs with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _check(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> Tensor:
    conv.check(x, conv_pool)
    pack.check_shapes(x.shape[0])
    if not conv_pool.is_contiguous() or conv.weight.stride(1) != 1:
        raise ValueError("conv_pool and the conv weight must be contiguous for the Triton kernels")
    # a column slice of the projection has unit stride along D; anything else is copied once
    return x if x.stride(1) == 1 else x.contiguous()


def _meta(conv: ConvParams) -> dict:
    return dict(D=conv.weight.shape[0], W=conv.width, DIL=conv.dilation, STATE_LEN=conv.state_len,
                ACT=int(conv.activation == Activation.SILU))


def launch_update(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, conv_stash: Tensor | None,
                  tuning: Tuning) -> Tensor:
    x = _check(x, conv, pack, conv_pool)
    T, D = x.shape
    y = _new((T, D), x.dtype, x.device)
    N = pack.num_seqs
    if N == 0 or T == 0:
        return y
    BD = min(tuning.update_bd, triton.next_power_of_2(D))
    conv_update_kernel[(triton.cdiv(D, BD), N)](
        x, conv.weight, y, conv_pool, conv_pool if conv_stash is None else conv_stash, pack.cu_seqlens, pack.slots,
        x.stride(0), S_WD=conv.weight.stride(0), BD=BD, BS=triton.next_power_of_2(conv.state_len),
        BW=triton.next_power_of_2(conv.width), STASH=conv_stash is not None, WTILE=tuning.update_wtile,
        num_warps=tuning.update_warps, **_meta(conv), **pdl.options(x.device))
    return y


def update(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor) -> Tensor:
    """Decode modes: x [T, D] -> y [T, D]; the window after each sequence's last token goes to conv_pool[slot]."""
    return launch_update(x, conv, pack, conv_pool, None, TUNING)


def update_stash(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, conv_stash: Tensor) -> Tensor:
    """Verify modes: the pool is only read; the window after token t goes to conv_stash[t] [T, n, D]."""
    if tuple(conv_stash.shape) != (x.shape[0], *conv.state_shape()) or not conv_stash.is_contiguous():
        raise ValueError(f"conv_stash must be a contiguous [{x.shape[0]}, {conv.state_len}, {conv.weight.shape[0]}] "
                         f"tensor, got {tuple(conv_stash.shape)}")
    return launch_update(x, conv, pack, conv_pool, conv_stash, TUNING)


def prefill(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, capture: Capture) -> Tensor:
    """Prefill modes: as `update`, and the window after capture.at[n] tokens goes to capture.buf[n]."""
    return launch_prefill(x, conv, pack, conv_pool, capture, TUNING)


def launch_prefill(x: Tensor, conv: ConvParams, pack: Packing, conv_pool: Tensor, capture: Capture,
                   tuning: Tuning) -> Tensor:
    x = _check(x, conv, pack, conv_pool)
    capture.check(pack.num_seqs, conv.state_shape())
    if not capture.buf.is_contiguous():
        raise ValueError("the conv capture buffer must be contiguous for the Triton kernels")
    T, D = x.shape
    N = pack.num_seqs
    y = _new((T, D), x.dtype, x.device)
    if N == 0:
        return y
    meta = _meta(conv)
    if T > 0:
        BD, BT = min(tuning.chunk_bd, triton.next_power_of_2(D)), tuning.chunk_bt
        conv_chunk_kernel[(triton.cdiv(D, BD), triton.cdiv(T, BT) + N)](
            x, conv.weight, y, pack.cu_seqlens, pack.slots, N, x.stride(0), conv.weight.stride(0),
            BD=BD, BT=BT, BN=max(2, triton.next_power_of_2(N)), num_warps=tuning.chunk_warps, **meta)
    BD = min(tuning.state_bd, triton.next_power_of_2(D))
    conv_state_kernel[(triton.cdiv(D, BD), N)](
        x, conv.weight, y, conv_pool, capture.buf, pack.cu_seqlens, pack.slots, capture.at, x.stride(0),
        conv.weight.stride(0), BD=BD, BS=triton.next_power_of_2(conv.state_len), num_warps=tuning.state_warps,
        **meta)
    return y
