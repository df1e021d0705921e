"""Mode equivalences of the layer, plain, hc and hc+PLE, float64 on the CPU.

T x DECODE == PREFILL of T tokens; PREFILL_VARLEN == loop of PREFILL per sequence, each from its own slot;
DECODE_MULTI_SEQ == loop of DECODE; VERIFY stash row j == state after j+1 DECODE steps (pools untouched);
DECODE_BATCHED == VERIFY_MULTI of one sequence; capture at c == PREFILL of the first c tokens, and the tail replayed
from the capture == the full prefill; prefill in two calls == one prefill; slot -1 leaves every pool row untouched.
Pools start random, so a wrong slot or a dropped initial state shows.
"""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput
from gdn_trt.plugins.packing import Packing

from .tolerances import assert_close

F64 = torch.float64
EXACT = tol(F64)
SLOTS = 6
# (preset, layer index): plain mixer-only, plain + dense MLP, plain Qwen3.5, hc + PLE, hc without PLE
CASES = [("tiny-next", 0), ("tiny-next-mlp", 1), ("tiny-3.5", 2), ("tiny-4exp", 1), ("tiny-4exp", 2)]


@pytest.fixture(scope="module", params=[pytest.param(c, id=f"{c[0]}-layer{c[1]}") for c in CASES])
def case(request, tmp_path_factory):
    name, i = request.param
    ck = load_checkpoint(make_synthetic_checkpoint(name, tmp_path_factory.mktemp(name), seed=2))
    lw = next(lw for lw in ck.layers if lw.index == i)
    return ck.config, GdnLayer(ck.config, lw, F64)


def random_state(cfg, i: int) -> LayerState:
    s = LayerState.allocate(cfg, i, SLOTS, BufferSpec(F64))
    for t in s.tensors():
        t.copy_(torch.randn_like(t) * 0.5)
    return s


def clone(s):
    return type(s)(**{f.name: (getattr(s, f.name).clone() if getattr(s, f.name) is not None else None)
                      for f in fields(s)})


class Data:
    """Random activations for T tokens: x, residual (plain), ple_rows (PLE layers)."""

    def __init__(self, cfg, layer: GdnLayer, T: int):
        self.cfg = cfg
        self.x = torch.randn(T, cfg.stream_dim, dtype=F64)
        self.res = None if cfg.is_hc else torch.randn(T, cfg.stream_dim, dtype=F64)
        self.rows = torch.randn(T, cfg.ple_heads, cfg.ple_head_dim, dtype=F64) if layer.ple is not None else None

    def step(self, idx, lengths, slots) -> StepInput:
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        return StepInput(self.x[idx], Packing.build(lengths, slots), pick(self.res), pick(self.rows))


def no_capture(cfg, i, n):
    return StateCapture.none(cfg, i, n, BufferSpec(F64))


def assert_states(name, want: LayerState, got: LayerState, rows=None):
    for f in fields(LayerState):
        w, g = getattr(want, f.name), getattr(got, f.name)
        if w is not None:
            assert_close(f"{name} {f.name}", w if rows is None else w[rows], g if rows is None else g[rows], EXACT)


def test_decode_steps_equal_prefill(case):
    cfg, layer = case
    T, d = 70, Data(cfg, case[1], 70)
    s0 = random_state(cfg, layer.index)
    pre, dec = clone(s0), clone(s0)
    out, pre, _ = layer.prefill(d.step(slice(0, T), [T], [4]), pre, no_capture(cfg, layer.index, 1))
    for t in range(T):
        o, dec = layer.decode(d.step(slice(t, t + 1), [1], [4]), dec)
        assert_close(f"token {t}", out.x[t:t + 1], o.x, EXACT)
        if o.residual is not None:
            assert_close(f"residual {t}", out.residual[t:t + 1], o.residual, EXACT)
    assert_states("final", pre, dec)
    assert_states("untouched", s0, pre, rows=[0, 1, 2, 3, 5])


def test_varlen_prefill_equals_single_prefills(case):
    cfg, layer = case
    lengths, slots = [5, 66, 1, 0, 9], [2, 0, 5, 1, 3]
    d = Data(cfg, layer, sum(lengths))
    s0 = random_state(cfg, layer.index)
    packed = clone(s0)
    out, packed, _ = layer.prefill_varlen(d.step(slice(None), lengths, slots), packed,
                                          no_capture(cfg, layer.index, len(lengths)))
    looped, a = clone(s0), 0
    for L, s in zip(lengths, slots):
        o, looped, _ = layer.prefill(d.step(slice(a, a + L), [L], [s]), looped, no_capture(cfg, layer.index, 1))
        assert_close(f"seq in slot {s}", o.x, out.x[a:a + L], EXACT)
        a += L
    assert_states("pools", looped, packed)


def test_multi_seq_decode_equals_single_decodes_and_padding_writes_nothing(case):
    cfg, layer = case
    slots = [3, -1, 0, 5]
    d = Data(cfg, layer, 4)
    s0 = random_state(cfg, layer.index)
    multi = clone(s0)
    out, multi = layer.decode_multi_seq(d.step(slice(None), [1] * 4, slots), multi)
    single = clone(s0)
    for n, s in enumerate(slots):
        if s >= 0:
            o, single = layer.decode(d.step(slice(n, n + 1), [1], [s]), single)
            assert_close(f"seq {n}", o.x, out.x[n:n + 1], EXACT)
    assert_states("pools", single, multi)
    assert_states("padding and unused rows", s0, multi, rows=[1, 2, 4])


def test_verify_stash_rows_equal_decode_steps(case):
    cfg, layer = case
    drafts, slots = [3, 0, 2], [1, 4, 2]
    T = sum(drafts)
    d = Data(cfg, layer, T)
    s0 = random_state(cfg, layer.index)
    pools = clone(s0)
    stash = StateStash.allocate(cfg, layer.index, T, BufferSpec(F64))
    for t in (stash.conv, stash.ssm, stash.ple_conv):
        if t is not None:
            t.fill_(float("nan"))
    out, stash = layer.verify_multi(d.step(slice(None), drafts, slots), pools, stash)
    assert_states("verify leaves the pools", s0, pools)
    walk, row = clone(s0), 0
    for k, s in zip(drafts, slots):
        for j in range(k):
            o, walk = layer.decode(d.step(slice(row, row + 1), [1], [s]), walk)
            assert_close(f"slot {s} draft {j} output", o.x, out.x[row:row + 1], EXACT)
            for f in fields(StateStash):
                if getattr(stash, f.name) is not None:
                    assert_close(f"slot {s} draft {j} {f.name}", getattr(walk, f.name)[s],
                                 getattr(stash, f.name)[row], EXACT)
            row += 1


def test_decode_batched_equals_verify_of_one_sequence(case):
    cfg, layer = case
    d = Data(cfg, layer, 4)
    s0 = random_state(cfg, layer.index)
    spec = BufferSpec(F64)
    a, sa = layer.decode_batched(d.step(slice(None), [4], [3]), clone(s0), StateStash.allocate(cfg, layer.index, 4,
                                                                                               spec))
    b, sb = layer.verify_multi(d.step(slice(None), [4], [3]), clone(s0), StateStash.allocate(cfg, layer.index, 4, spec))
    assert torch.equal(a.x, b.x) and torch.equal(sa.ssm, sb.ssm) and torch.equal(sa.conv, sb.conv)


def test_capture_then_tail_replay_equals_full_prefill(case):
    cfg, layer = case
    lengths, slots, at = [70, 30, 12], [0, 3, 5], [64, 0, 12]
    d = Data(cfg, layer, sum(lengths))
    s0 = random_state(cfg, layer.index)
    spec = BufferSpec(F64)
    cap = StateCapture.allocate(cfg, layer.index, torch.tensor(at, dtype=torch.int32), spec)
    out, full, cap = layer.prefill_varlen(d.step(slice(None), lengths, slots), clone(s0), cap)
    a = 0
    for n, (L, s, c) in enumerate(zip(lengths, slots, at)):
        prefix = clone(s0)
        layer.prefill(d.step(slice(a, a + c), [c], [s]), prefix, no_capture(cfg, layer.index, 1))
        for f in fields(LayerState):
            if getattr(prefix, f.name) is not None:
                assert_close(f"seq {n} capture {f.name}", getattr(prefix, f.name)[s], getattr(cap, f.name)[n], EXACT)
        # restore the capture into a free slot (1) and replay the tail from it
        tail = clone(s0)
        for f in fields(LayerState):
            if getattr(tail, f.name) is not None:
                getattr(tail, f.name)[1] = getattr(cap, f.name)[n]
        o, tail, _ = layer.prefill(d.step(slice(a + c, a + L), [L - c], [1]), tail, no_capture(cfg, layer.index, 1))
        assert_close(f"seq {n} tail outputs", out.x[a + c:a + L], o.x, EXACT)
        for f in fields(LayerState):
            if getattr(tail, f.name) is not None:
                assert_close(f"seq {n} tail state {f.name}", getattr(full, f.name)[s], getattr(tail, f.name)[1], EXACT)
        a += L


def test_prefill_in_two_calls_equals_one(case):
    cfg, layer = case
    d = Data(cfg, layer, 100)
    s0 = random_state(cfg, layer.index)
    one, two = clone(s0), clone(s0)
    out, one, _ = layer.prefill(d.step(slice(0, 100), [100], [2]), one, no_capture(cfg, layer.index, 1))
    o1, two, _ = layer.prefill(d.step(slice(0, 37), [37], [2]), two, no_capture(cfg, layer.index, 1))
    o2, two, _ = layer.prefill(d.step(slice(37, 100), [63], [2]), two, no_capture(cfg, layer.index, 1))
    assert_close("outputs", out.x, torch.cat([o1.x, o2.x]), EXACT)
    assert_states("pools", one, two)


def test_fp32_layer_tracks_float64(tmp_path):
    """The same layer computing in fp32 (fp32 state) stays within fp32 rounding of the float64 run."""
    cfg = preset("tiny-3.5")
    ck = load_checkpoint(make_synthetic_checkpoint(cfg, tmp_path, seed=4))
    x = torch.randn(90, cfg.hidden_size, dtype=F64)
    ref = GdnLayer(cfg, ck.layers[0], F64).forward_sequence(x)
    got = GdnLayer(cfg, ck.layers[0], torch.float32).forward_sequence(x.float())
    assert_close("fp32 vs fp64", ref, got, tol(torch.float32))
