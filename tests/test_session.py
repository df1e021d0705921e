"""Session-level invariants on the CPU (torch backend), plain (tiny-3.5) and hc+PLE (tiny-4exp) stacks.

T decodes == one prefill of T tokens == the plain sequential computation; accept(j) after a verify == j decodes
(j = 0..K, zero-draft sequences included); restore of a prefill capture + tail prefill == the full prefill; a
snapshot restored mid-decode continues bit for bit; sequences joining and leaving never touch the state of the
others, and a recycled slot (poisoned with NaN) starts from zeros.
"""

from __future__ import annotations

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.state import StepOutput
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.stack import StepContext

from .test_runtime_support import HC_PLE, PLAIN, inputs, open_session, reference, slot_state, sub, tok
from .tolerances import assert_close

TOL = tol(torch.float32)
PRESETS = [pytest.param(PLAIN, id="plain"), pytest.param(HC_PLE, id="hc+ple")]


def assert_states_close(name: str, ref: list[torch.Tensor], got: list[torch.Tensor]) -> None:
    assert len(ref) == len(got)
    for k, (r, g) in enumerate(zip(ref, got)):
        if r.dtype == torch.int64:  # PLE id carries: exact
            assert torch.equal(r, g), f"{name}: id carry {k} {g.tolist()} != {r.tolist()}"
        else:
            assert_close(f"{name}[{k}]", r, g, TOL)


@pytest.fixture(params=PRESETS)
def sess(request):
    return open_session(request.param)


def test_decodes_equal_prefill_and_reference(sess):
    T = 13
    h, ids = inputs(sess, T, seed=1)
    a, b = sess.add_sequence(), sess.add_sequence()
    pre = sess.prefill(a, h, token_ids=ids).hidden
    dec = torch.cat([sess.decode({b: h[t:t + 1]}, tok(ids, b, t, t + 1))[b] for t in range(T)])
    assert_close("decode outputs vs prefill", pre, dec, TOL)
    assert_close("prefill vs sequential reference", reference(sess, h, ids), pre, TOL)
    assert_states_close("state after T decodes vs prefill", slot_state(sess, a), slot_state(sess, b))
    assert sess.position(a) == sess.position(b) == T


def test_accept_j_equals_j_decodes(sess):
    P, K = 6, 4
    h, ids = inputs(sess, P + K + 2, seed=2)
    for j in range(K + 1):
        a, b = sess.add_sequence(), sess.add_sequence()
        sess.prefill_batch({s: Prompt(h[:P], sub(ids, 0, P)) for s in (a, b)})
        drafts = sess.verify({a: h[P:P + K]}, tok(ids, a, P, P + K))[a]
        sess.accept({a: j})
        dec = [sess.decode({b: h[t:t + 1]}, tok(ids, b, t, t + 1))[b] for t in range(P, P + j)]
        if j:
            assert_close(f"verify rows vs decodes (j={j})", torch.cat(dec), drafts[:j], TOL)
        assert sess.position(a) == sess.position(b) == P + j
        assert_states_close(f"accept({j}) vs {j} decodes", slot_state(sess, b), slot_state(sess, a))
        # the committed state carries on: the next decode agrees (PLE carries included)
        t = P + j
        nxt = sess.decode({a: h[t:t + 1], b: h[t:t + 1]}, None if ids is None else {a: ids[t:t + 1],
                                                                                      b: ids[t:t + 1]})
        assert_close(f"decode after accept({j})", nxt[b], nxt[a], TOL)
        sess.release(a)
        sess.release(b)
    assert sess.stats().accepted == sum(range(K + 1))


def test_verify_multi_with_zero_drafts(sess):
    P = 5
    h, ids = inputs(sess, P + 4, seed=3)
    drafts = {0: 0, 1: 2, 2: 4}
    seqs = {k: sess.add_sequence() for k in drafts}
    refs = {k: sess.add_sequence() for k in drafts}
    sess.prefill_batch({s: Prompt(h[:P], sub(ids, 0, P)) for s in [*seqs.values(), *refs.values()]})
    outs = sess.verify({seqs[k]: h[P:P + n] for k, n in drafts.items()},
                       None if ids is None else {seqs[k]: ids[P:P + n] for k, n in drafts.items()})
    assert outs[seqs[0]].shape[0] == 0
    accept = {0: 0, 1: 1, 2: 4}
    sess.accept({seqs[k]: j for k, j in accept.items()})
    for k, j in accept.items():
        for t in range(P, P + j):
            sess.decode({refs[k]: h[t:t + 1]}, tok(ids, refs[k], t, t + 1))
        assert_states_close(f"seq with {drafts[k]} drafts, accept {j}", slot_state(sess, refs[k]),
                            slot_state(sess, seqs[k]))
    g = sess.stats().kinds
    assert g[next(k for k in g if k.value == "verify")].modes == {LayerMode.VERIFY_MULTI.value: 1}


def test_restore_capture_plus_tail_equals_full_prefill(sess):
    L = [11, 7, 9]
    caps = [5, 0, 9]  # middle, at the start (the state before), at the end (the final state)
    data = [inputs(sess, n, seed=10 + k) for k, n in enumerate(L)]
    seqs = [sess.add_sequence() for _ in L]
    res = sess.prefill_batch({s: Prompt(h, ids, c) for s, (h, ids), c in zip(seqs, data, caps)})
    for s, (h, ids), c, n in zip(seqs, data, caps, L):
        blob = res[s].capture
        assert blob is not None
        r = sess.restore(blob)
        assert sess.position(r) == c
        if c < n:
            tail = sess.prefill(r, h[c:], token_ids=sub(ids, c, n)).hidden
            assert_close(f"tail after restore at {c}", res[s].hidden[c:], tail, TOL)
        assert_states_close(f"state after restore at {c} + tail", slot_state(sess, s), slot_state(sess, r))
        sess.release(r)
    assert sess.stats().captures == 3 and sess.stats().restores == 3


def test_snapshot_restore_continues_bit_for_bit(sess):
    h, ids = inputs(sess, 12, seed=4)
    a = sess.add_sequence()
    sess.prefill(a, h[:8], token_ids=sub(ids, 0, 8))
    sess.decode({a: h[8:9]}, tok(ids, a, 8, 9))
    b = sess.restore(sess.snapshot(a))
    assert sess.position(b) == 9
    for t in range(9, 12):
        oa = sess.decode({a: h[t:t + 1]}, tok(ids, a, t, t + 1))[a]
        ob = sess.decode({b: h[t:t + 1]}, tok(ids, b, t, t + 1))[b]
        assert torch.equal(oa, ob)
    assert all(torch.equal(x, y) for x, y in zip(slot_state(sess, a), slot_state(sess, b)))


def test_join_and_leave_never_disturb_others(sess):
    h, ids = inputs(sess, 16, seed=5)
    hb, idb = inputs(sess, 6, seed=6)
    solo = open_session(sess.cfg.name)
    s = solo.add_sequence()
    want = [solo.prefill(s, h[:6], token_ids=sub(ids, 0, 6)).hidden]
    want += [solo.decode({s: h[t:t + 1]}, tok(ids, s, t, t + 1))[s] for t in range(6, 12)]

    def step_keeps_others(participants, **step):
        others = [q for q in sess.sequences if q not in participants]
        before = {q: slot_state(sess, q) for q in others}
        out = sess.step(**step).outputs
        for q in others:
            assert all(torch.equal(x, y) for x, y in zip(before[q], slot_state(sess, q))), f"seq {q} disturbed"
        return out

    a, b = sess.add_sequence(), sess.add_sequence()
    got = [sess.prefill(a, h[:6], token_ids=sub(ids, 0, 6)).hidden]
    got.append(step_keeps_others({a, b}, decode={a: h[6:7]}, prefill={b: Prompt(hb, idb)},
                                 token_ids=tok(ids, a, 6, 7) or {})[a])
    got.append(step_keeps_others({a}, decode={a: h[7:8]}, token_ids=tok(ids, a, 7, 8) or {})[a])
    slot_b = sess._seqs[b].slot
    sess.release(b)
    for st in sess.pool.layers.values():  # a previous tenant's garbage in the freed slot
        for t in st.tensors():
            t[slot_b] = float("nan")
    c = sess.add_sequence()
    assert sess._seqs[c].slot == slot_b
    hc, idc = inputs(sess, 5, seed=7)
    out = step_keeps_others({a, c}, decode={a: h[8:9]}, prefill={c: Prompt(hc[:4], sub(idc, 0, 4))},
                            token_ids=tok(ids, a, 8, 9) or {})
    got.append(out[a])
    assert_close("recycled slot starts from zeros", reference(sess, hc[:4], sub(idc, 0, 4)), out[c], TOL)
    out = step_keeps_others({a, c}, decode={a: h[9:10]}, verify={c: hc[4:5]},
                            token_ids={} if ids is None else {a: ids[9:10], c: idc[4:5]})
    got.append(out[a])
    sess.accept({c: 1})
    for t in (10, 11):
        got.append(step_keeps_others({a, c}, decode={a: h[t:t + 1], c: hc[4:5]},
                                     token_ids={} if ids is None else {a: ids[t:t + 1], c: idc[4:5]})[a])
    assert_close("sequence A among joiners and leavers vs alone", torch.cat(want), torch.cat(got), TOL)


def test_padding_slot_minus_one_writes_nothing(sess):
    """A bucket-padded decode (slots [s, -1, -1]) through the whole stack changes only slot s."""
    a, b = sess.add_sequence(), sess.add_sequence()
    h, ids = inputs(sess, 4, seed=8)
    sess.prefill_batch({a: Prompt(h[:2], sub(ids, 0, 2)), b: Prompt(h[2:], sub(ids, 2, 4))})
    before = {q: slot_state(sess, q) for q in (a, b)}
    sa = sess._seqs[a].slot
    x = torch.zeros(3, sess.cfg.stream_dim)
    x[0] = h[0]
    packed = sess.stack.packed(x, [1, 1, 1], [sa, -1, -1])
    rows = {i: torch.zeros(3, sess.cfg.ple_heads, sess.cfg.ple_head_dim) for i in sess.cfg.gdn_layer_ids}
    engines = tuple(c[0] for c in sess.selector.engines)
    out = sess.stack.run(LayerMode.DECODE_MULTI_SEQ, engines, packed, StepContext(rows.__getitem__, None, None))
    assert torch.isfinite(StepOutput(out.x, out.residual).hidden()).all()
    assert all(torch.equal(x, y) for x, y in zip(before[b], slot_state(sess, b)))
    assert not all(torch.equal(x, y) for x, y in zip(before[a], slot_state(sess, a)))


def test_verify_graphs_need_graphs():
    """Verify graphs are captured beside decode graphs: asking for them with graphs off is refused when the options
    are made, naming both; left out, they follow `graphs` (on by default since the H100 measured them)."""
    from gdn_trt.runtime.session import SessionOptions

    with pytest.raises(ValueError, match="verify_graphs=True needs graphs=True"):
        SessionOptions(graphs=False, verify_graphs=True)
    assert SessionOptions(verify_graphs=True).graphs
    assert SessionOptions().verify_graphs is True and SessionOptions(graphs=False).verify_graphs is False
    assert SessionOptions(verify_graphs=False).verify_graphs is False
