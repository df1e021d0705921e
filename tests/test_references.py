"""The float64 references against independent formulations and against each other (op level).

- gated delta rule: the chunked WY form against the token loop, and the token loop against a dense closed form
  S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T written with explicit matrices;
- causal conv: the windowed loop against `torch.nn.functional.conv1d` with dilation over [history | x];
- the op variants pinned to each other: stash rows == states after each token, capture == prefix run,
  varlen == per-sequence loop, slot -1 and zero-length sequences leave every buffer untouched.
Shapes keep K != V and G in {1, 2, 3}; T crosses chunk boundaries (1, 3, 63, 64, 65, 300).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gdn_trt.export.tolerances import tol
from gdn_trt.plugins.causal_conv1d import naive as conv_ref
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule import naive as gdn_ref
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Capture, Packing
from gdn_trt.plugins.spec import Activation

from .tolerances import assert_close

F64 = torch.float64
EXACT = tol(F64)


def gdn_inputs(T: int, H: int, G: int, K: int, V: int, dtype=F64) -> GdnInputs:
    HV = H * G
    return GdnInputs(torch.randn(T, H, K, dtype=dtype), torch.randn(T, H, K, dtype=dtype),
                     torch.randn(T, HV, V, dtype=dtype), torch.randn(T, HV, dtype=dtype) * 2,
                     torch.randn(T, HV, dtype=dtype) * 2, torch.randn(HV, dtype=F64).clamp(-3, 2.5),
                     torch.randn(HV, dtype=F64))


def sliced(x: GdnInputs, a: int, b: int) -> GdnInputs:
    return GdnInputs(x.q[a:b], x.k[a:b], x.v[a:b], x.a[a:b], x.b[a:b], x.A_log, x.dt_bias)


def dense_rule(x: GdnInputs, S: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """S_t = alpha_t (I - beta_t k k^T) S_{t-1} + beta_t k v^T, o_t = S_t^T q_t, with q, k expanded by
    consecutive grouping; an independent spelling of the recurrence (explicit K x K matrices)."""
    G = x.v.shape[1] // x.q.shape[1]
    K = x.q.shape[-1]
    q = x.q / torch.sqrt((x.q ** 2).sum(-1, keepdim=True) + 1e-6) * K ** -0.5
    k = x.k / torch.sqrt((x.k ** 2).sum(-1, keepdim=True) + 1e-6)
    alpha = torch.exp(-torch.exp(x.A_log) * torch.log1p(torch.exp(x.a + x.dt_bias)))
    beta = 1 / (1 + torch.exp(-x.b))
    o = torch.empty_like(x.v)
    eye = torch.eye(K, dtype=F64)
    for t in range(x.q.shape[0]):
        for hv in range(x.v.shape[1]):
            kk, qq = k[t, hv // G], q[t, hv // G]
            S[hv] = alpha[t, hv] * (eye - beta[t, hv] * torch.outer(kk, kk)) @ S[hv] + beta[t, hv] * torch.outer(
                kk, x.v[t, hv])
            o[t, hv] = S[hv].T @ qq
    return o, S


SHAPES = [pytest.param(T, H, G, K, V, id=f"T{T}-H{H}-G{G}-K{K}-V{V}")
          for T, H, G, K, V in [(1, 2, 2, 8, 6), (3, 1, 3, 5, 7), (63, 2, 1, 8, 4), (64, 1, 2, 6, 10),
                                (65, 2, 3, 4, 6), (300, 1, 2, 8, 6)]]


@pytest.mark.parametrize("T,H,G,K,V", SHAPES)
def test_wy_chunks_equal_token_loop(T, H, G, K, V):
    x = gdn_inputs(T, H, G, K, V)
    pool = torch.randn(3, H * G, K, V, dtype=F64)
    pool_rec, pool_chk = pool.clone(), pool.clone()
    pack = Packing.build([T], [1])
    o_rec = gdn_ref.recurrent(x, pack, pool_rec)
    o_chk = gdn_ref.chunked(x, pack, pool_chk, Capture(torch.tensor([-1], dtype=torch.int32),
                                                       torch.zeros(1, H * G, K, V, dtype=F64)))
    assert_close("o", o_rec, o_chk, EXACT)
    assert_close("final state", pool_rec[1], pool_chk[1], EXACT)
    assert torch.equal(pool_rec[[0, 2]], pool[[0, 2]]) and torch.equal(pool_chk[[0, 2]], pool[[0, 2]])


@pytest.mark.parametrize("T,H,G,K,V", SHAPES[:4])
def test_token_loop_equals_dense_rule(T, H, G, K, V):
    x = gdn_inputs(T, H, G, K, V)
    S0 = torch.randn(H * G, K, V, dtype=F64)
    pool = S0[None].clone()
    o = gdn_ref.recurrent(x, Packing.build([T], [0]), pool)
    o_ref, S_ref = dense_rule(x, S0.clone())
    assert_close("o", o_ref, o, EXACT)
    assert_close("state", S_ref, pool[0], EXACT)


def test_varlen_equals_loop_of_sequences():
    lengths, slots = [5, 0, 70, 1, 64], [3, 0, 1, -1, 4]
    x = gdn_inputs(sum(lengths), 2, 3, 6, 4)
    pool = torch.randn(6, 6, 6, 4, dtype=F64)
    for variant in ("recurrent", "chunked"):
        packed, looped = pool.clone(), pool.clone()
        cap = Capture(torch.full((5,), -1, dtype=torch.int32), torch.zeros(5, 6, 6, 4, dtype=F64))
        fn = getattr(gdn_ref, variant)
        args = (cap,) if variant == "chunked" else ()
        o = fn(x, Packing.build(lengths, slots), packed, *args)
        start = 0
        for L, s in zip(lengths, slots):
            if s >= 0:
                cap1 = (Capture(torch.tensor([-1], dtype=torch.int32), torch.zeros(1, 6, 6, 4, dtype=F64)),)
                o1 = fn(sliced(x, start, start + L), Packing.build([L], [s]), looped,
                        *(cap1 if variant == "chunked" else ()))
                assert_close(f"{variant} o seq slot {s}", o1, o[start:start + L], EXACT)
            else:
                assert not o[start:start + L].any(), "padding sequence output rows must be zero"
            start += L
        assert_close(f"{variant} pool", looped, packed, EXACT)
        assert torch.equal(packed[[2, 5]], pool[[2, 5]]), "unused slots must stay untouched"


def test_stash_rows_are_states_after_each_token():
    lengths, slots = [4, 0, 3], [2, 0, 1]
    x = gdn_inputs(7, 2, 2, 5, 3)
    pool = torch.randn(3, 4, 5, 3, dtype=F64)
    before = pool.clone()
    stash = torch.full((7, 4, 5, 3), float("nan"), dtype=F64)
    o = gdn_ref.recurrent_stash(x, Packing.build(lengths, slots), pool, stash)
    assert torch.equal(pool, before), "verify must not touch the pool"
    walk = before.clone()
    for t in range(4):  # sequence 0, slot 2: one decode step at a time
        o1 = gdn_ref.recurrent(sliced(x, t, t + 1), Packing.build([1], [2]), walk)
        assert_close(f"o[{t}]", o1, o[t:t + 1], EXACT)
        assert_close(f"stash[{t}]", walk[2], stash[t], EXACT)
    assert_close("seq 2 last stash row", gdn_ref.recurrent(sliced(x, 4, 7), Packing.build([3], [1]), walk), o[4:7],
                 EXACT)
    assert_close("seq 2 stash", walk[1], stash[6], EXACT)


@pytest.mark.parametrize("c", [0, 1, 40, 64, 65, 100])
def test_capture_is_prefix_state_and_tail_replays(c):
    T = 100
    x = gdn_inputs(T, 1, 2, 6, 4)
    pool = torch.randn(2, 2, 6, 4, dtype=F64)
    full = pool.clone()
    cap = Capture(torch.tensor([c], dtype=torch.int32), torch.full((1, 2, 6, 4), float("nan"), dtype=F64))
    o_full = gdn_ref.chunked(x, Packing.build([T], [1]), full, cap)
    prefix = pool.clone()
    none = Capture(torch.tensor([-1], dtype=torch.int32), torch.zeros(1, 2, 6, 4, dtype=F64))
    gdn_ref.chunked(sliced(x, 0, c), Packing.build([c], [1]), prefix, none)
    assert_close("capture == prefix state", prefix[1], cap.buf[0], EXACT)
    tail = pool.clone()
    tail[0] = cap.buf[0]  # restore the capture into another slot and replay the tail from it
    o_tail = gdn_ref.chunked(sliced(x, c, T), Packing.build([T - c], [0]), tail, none)
    assert_close("tail outputs", o_full[c:], o_tail, EXACT)
    assert_close("tail final state", full[1], tail[0], EXACT)


def conv_by_F(x: torch.Tensor, hist: torch.Tensor, conv: ConvParams) -> torch.Tensor:
    """Independent formulation: dilated depthwise F.conv1d over [history | x], valid region (hist [n, D])."""
    seq = torch.cat([hist, x], dim=0).T[None]
    y = F.conv1d(seq, conv.weight[:, None, :], groups=x.shape[1], dilation=conv.dilation)[0].T
    return F.silu(y) if conv.activation == Activation.SILU else y


@pytest.mark.parametrize("dilation,act,T", [(1, Activation.SILU, 1), (1, Activation.SILU, 17), (3, Activation.SILU, 2),
                                            (3, Activation.SILU, 40), (2, Activation.NONE, 9)])
def test_conv_equals_conv1d_with_history(dilation, act, T):
    D, W = 7, 4
    conv = ConvParams(torch.randn(D, W, dtype=F64), dilation, act)
    pool = torch.randn(3, (W - 1) * dilation, D, dtype=F64)
    x = torch.randn(T, D, dtype=F64)
    want = conv_by_F(x, pool[2], conv)
    new_window = torch.cat([pool[2], x], 0)[-(W - 1) * dilation:]
    for variant in ("update", "prefill"):
        p = pool.clone()
        extra = (Capture(torch.tensor([T], dtype=torch.int32), torch.zeros(1, (W - 1) * dilation, D, dtype=F64)),)
        y = getattr(conv_ref, variant)(x, conv, Packing.build([T], [2]), p, *(extra if variant == "prefill" else ()))
        assert_close(f"{variant} y", want, y, EXACT)
        assert torch.equal(p[2], new_window), "state = last (W-1)*dilation pre-conv inputs"
        assert torch.equal(p[:2], pool[:2])
        if variant == "prefill":
            assert torch.equal(extra[0].buf[0], new_window)


def test_conv_stash_and_capture_windows():
    D, W, d = 5, 4, 3
    conv = ConvParams(torch.randn(D, W, dtype=F64), d)
    n = (W - 1) * d
    pool = torch.randn(2, n, D, dtype=F64)
    x = torch.randn(6, D, dtype=F64)
    stash = torch.full((6, n, D), float("nan"), dtype=F64)
    before = pool.clone()
    y = conv_ref.update_stash(x, conv, Packing.build([2, 4], [1, 0]), pool, stash)
    assert torch.equal(pool, before), "verify must not touch the pool"
    walk = before.clone()
    for t, slot in [(0, 1), (1, 1), (2, 0), (3, 0), (4, 0), (5, 0)]:
        y1 = conv_ref.update(x[t:t + 1], conv, Packing.build([1], [slot]), walk)
        assert torch.equal(y1, y[t:t + 1]) and torch.equal(walk[slot], stash[t])
    cap = Capture(torch.tensor([0, 3], dtype=torch.int32), torch.full((2, n, D), float("nan"), dtype=F64))
    p = before.clone()
    conv_ref.prefill(x, conv, Packing.build([2, 4], [1, 0]), p, cap)
    assert torch.equal(cap.buf[0], before[1]), "capture at 0 = the initial window"
    assert torch.equal(cap.buf[1], stash[4]), "capture at 3 = window after the third token"


def test_padding_slot_and_empty_sequences_leave_buffers_untouched():
    x = gdn_inputs(3, 1, 2, 4, 4)
    pool = torch.randn(2, 2, 4, 4, dtype=F64)
    before = pool.clone()
    o = gdn_ref.recurrent(x, Packing.build([1, 0, 2], [-1, 0, -1]), pool)
    assert torch.equal(pool, before) and not o.any()
    conv = ConvParams(torch.randn(4, 4, dtype=F64))
    cpool = torch.randn(2, 3, 4, dtype=F64)
    cb = cpool.clone()
    y = conv_ref.update(torch.randn(3, 4, dtype=F64), conv, Packing.build([3], [-1]), cpool)
    assert torch.equal(cpool, cb) and not y.any()


BAD_PACKINGS = [
    pytest.param(lambda: (torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)),
                 "rise from 0 to T", id="cu_seqlens-total"),
    pytest.param(lambda: (torch.tensor([0, 3, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)),
                 "rise from 0 to T", id="cu_seqlens-decreasing"),
    pytest.param(lambda: (torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int32)),
                 "distinct", id="duplicate-slots"),
    pytest.param(lambda: (torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 5], dtype=torch.int32)),
                 "out of range", id="slot-out-of-range"),
    pytest.param(lambda: (torch.tensor([0, 1, 2]), torch.tensor([0, 1], dtype=torch.int32)), "int32",
                 id="int64-cu_seqlens"),
    pytest.param(lambda: (torch.tensor([0, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)),
                 "N\\+1", id="count-mismatch"),
]


@pytest.mark.parametrize("make,match", BAD_PACKINGS)
def test_bad_packing_is_rejected_without_writes(make, match):
    x = gdn_inputs(2, 1, 2, 4, 4)
    pool = torch.randn(3, 2, 4, 4, dtype=F64)
    before = pool.clone()
    with pytest.raises(ValueError, match=match):
        gdn_ref.recurrent(x, Packing(*make()), pool)
    assert torch.equal(pool, before)


def test_bad_shapes_and_dtypes_are_rejected():
    x = gdn_inputs(2, 2, 2, 4, 4)
    pack = Packing.build([2], [0])
    with pytest.raises(ValueError, match="ssm_pool must be"):
        gdn_ref.recurrent(x, pack, torch.zeros(1, 4, 4, 5, dtype=F64))
    with pytest.raises(ValueError, match="fp32"):
        gdn_ref.recurrent(x, pack, torch.zeros(1, 4, 4, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of key heads"):
        gdn_ref.recurrent(GdnInputs(x.q, x.k, torch.randn(2, 3, 4, dtype=F64), x.a[:, :3], x.b[:, :3],
                                    x.A_log[:3], x.dt_bias[:3]), pack, torch.zeros(1, 3, 4, 4, dtype=F64))
    with pytest.raises(ValueError, match="one dtype"):
        gdn_ref.recurrent(GdnInputs(x.q.float(), x.k, x.v, x.a, x.b, x.A_log, x.dt_bias), pack,
                          torch.zeros(1, 4, 4, 4, dtype=F64))
    with pytest.raises(ValueError, match="ssm_stash"):
        gdn_ref.recurrent_stash(x, pack, torch.zeros(1, 4, 4, 4, dtype=F64), torch.zeros(1, 4, 4, 4, dtype=F64))
    with pytest.raises(ValueError, match="capture_at must be -1 or 0..len"):
        gdn_ref.chunked(x, pack, torch.zeros(1, 4, 4, 4, dtype=F64),
                        Capture(torch.tensor([3], dtype=torch.int32), torch.zeros(1, 4, 4, 4, dtype=F64)))
    conv = ConvParams(torch.randn(4, 4, dtype=F64))
    with pytest.raises(ValueError, match="activation dtype"):
        conv_ref.update(torch.randn(2, 4), conv, pack, torch.zeros(1, 3, 4, dtype=F64))
    with pytest.raises(ValueError, match="conv_pool must be"):
        conv_ref.update(torch.randn(2, 4, dtype=F64), conv, pack, torch.zeros(1, 4, 2, dtype=F64))
