"""Each pending verify keeps its own stash rows until it is accepted: verifies of other
sequences in later steps, in any order and any mix of step kinds, never touch them; `accept({seq: 0})` always works;
when the free stash rows are scattered, the pending rows are packed to the start (`SeqTable.stash_window`) and their
verifies still accept exactly. Checked bit for bit against a twin session that runs the same steps and accepts each
verify at once (an accept is a copy, so delaying it changes no bit)."""

from __future__ import annotations

import random

import pytest
import torch

from gdn_trt.runtime import Prompt

from .test_runtime_support import HC_PLE, LIMITS, PLAIN, inputs, open_session, slot_state


def _pools(s, seqs):
    return {q: [t.clone() for t in slot_state(s, q)] for q in seqs}


def _same(a, b, seqs, twin_seqs):
    for q, t in zip(seqs, twin_seqs):
        assert a.position(q) == b.position(t)
        for x, y in zip(slot_state(a, q), slot_state(b, t)):
            assert torch.equal(x, y), f"sequence {q}: state differs from the twin's"


def _ids(ids, n, at):
    return None if ids is None else ids[at:at + n]


@pytest.mark.parametrize("name", [PLAIN, HC_PLE])
def test_packing_pending_rows_when_no_gap_fits(name):
    """Five sequences verify 4 drafts each in five steps (rows 0..20 of 24); three accept, leaving gaps of 4, 4 and
    8 rows; a step of those three with 4 drafts each needs 12 rows: the two pending verifies move to rows 0..8 and
    the step takes 8..20. Every accept then matches the twin bit for bit."""
    s, t = open_session(name), open_session(name)
    h, ids = inputs(s, 16, seed=3)
    seqs = [s.add_sequence() for _ in range(5)]
    twin = [t.add_sequence() for _ in range(5)]
    for sess, qs in ((s, seqs), (t, twin)):
        sess.prefill_batch({q: Prompt(h[:4], _ids(ids, 4, 0)) for q in qs})
    counts = [2, 1, 4, 0, 3]
    for k in range(5):
        s.verify({seqs[k]: h[4:8]}, None if ids is None else {seqs[k]: ids[4:8]})
        t.verify({twin[k]: h[4:8]}, None if ids is None else {twin[k]: ids[4:8]})
        t.accept({twin[k]: counts[k]})
    assert [s._seqs[q].pending.row for q in seqs] == [0, 4, 8, 12, 16]
    s.accept({seqs[k]: counts[k] for k in (0, 2, 4)})
    again = [seqs[k] for k in (0, 2, 4)]
    tags = [twin[k] for k in (0, 2, 4)]
    hv = h[8:12]
    s.verify({q: hv for q in again}, None if ids is None else {q: ids[8:12] for q in again})
    t.verify({q: hv for q in tags}, None if ids is None else {q: ids[8:12] for q in tags})
    assert [s._seqs[seqs[k]].pending.row for k in (1, 3)] == [0, 4]  # packed to the start
    assert sorted(s._seqs[q].pending.row for q in again) == [8, 12, 16]
    s.accept({seqs[1]: counts[1], seqs[3]: counts[3]})
    s.accept({q: j for q, j in zip(again, (3, 0, 4))})
    t.accept({q: j for q, j in zip(tags, (3, 0, 4))})
    _same(s, t, seqs, twin)


@pytest.mark.parametrize("name", [PLAIN, HC_PLE])
def test_random_interleaved_verifies_equal_the_twin(name):
    """200 random steps (verify, decode, prefill, mixed) over 6 sequences, each verify accepted (often 0, often
    late) only after other sequences verified in between; the twin accepts at once. Pools, positions and PLE
    carries equal bit for bit; accept(0) of every pending verify works at any time."""
    rng = random.Random(7)
    s, t = open_session(name), open_session(name)
    h, ids = inputs(s, 64, seed=5)
    seqs = [s.add_sequence() for _ in range(LIMITS.max_seqs)]
    twin = dict(zip(seqs, [t.add_sequence() for _ in seqs]))
    for sess, m in ((s, {q: q for q in seqs}), (t, twin)):
        sess.prefill_batch({m[q]: Prompt(h[:3], _ids(ids, 3, 0)) for q in seqs})
    pending: dict[int, int] = {}  # seq -> the count it will accept
    for _ in range(200):
        free = [q for q in seqs if q not in pending]
        if pending and (not free or rng.random() < 0.3):
            q = rng.choice(sorted(pending))
            s.accept({q: pending.pop(q)})
            continue
        group = rng.sample(free, rng.randint(1, len(free)))
        kinds = {q: rng.choice(["decode", "verify", "verify", "prefill"]) for q in group}
        feeds, tok = {"decode": {}, "verify": {}, "prefill": {}}, {}
        for q, k in kinds.items():
            n = {"decode": 1, "verify": rng.randint(0, LIMITS.max_draft), "prefill": rng.randint(1, 5)}[k]
            at = rng.randrange(0, 64 - n)
            feeds[k][q] = Prompt(h[at:at + n]) if k == "prefill" else h[at:at + n]
            if ids is not None:
                tok[q] = ids[at:at + n]
        for sess, m in ((s, {q: q for q in seqs}), (t, twin)):
            args = {k: {m[q]: v for q, v in d.items()} or None for k, d in feeds.items()}
            sess.step(**args, token_ids={m[q]: v for q, v in tok.items()} or None)
        for q in feeds["verify"]:
            j = rng.choice([0, 0, rng.randint(0, feeds["verify"][q].shape[0])])
            pending[q] = j
            t.accept({twin[q]: j})
    s.accept(pending)
    _same(s, t, seqs, [twin[q] for q in seqs])


def test_accept_zero_always_works_and_the_sequence_steps_again():
    """However many verifies of others followed, accept({a: 0}) keeps a's state bit for bit, and a can decode and
    verify again."""
    s = open_session(PLAIN)
    h, _ = inputs(s, 12, seed=9)
    a, *others = [s.add_sequence() for _ in range(LIMITS.max_seqs)]
    s.prefill_batch({q: Prompt(h[:3]) for q in (a, *others)})
    kept = _pools(s, [a])[a]
    s.verify({a: h[3:7]})
    for k, q in enumerate(others):
        s.verify({q: h[3:3 + 1 + k % 4]})
        if k % 2:
            s.accept({q: 1})
    s.accept({a: 0})
    assert all(torch.equal(x, y) for x, y in zip(slot_state(s, a), kept)) and s.position(a) == 3
    s.decode({a: h[3:4]})
    s.verify({a: h[4:8]})
    s.accept({a: 4})
    assert s.position(a) == 8
