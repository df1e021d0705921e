"""The steady verify-accept loop on the CPU (`request.Loop`, `steps._Steady` with rows, `dictapi.accept`).

A speculative decoding loop verifies the same sequences with the same draft counts and accepts them all, step after
step. The loop's second verify reuses the first one's checked request and bound views, and its accept skips the
checks the loop holds. Against a twin session whose every request is checked in full (the loop ended before each
accept), outputs and the whole state agree bit for bit. Anything else that changes the sequence table ends the loop,
and the full checks then refuse what they must, changing nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_trt.runtime.seqs import SequenceError
from gdn_trt.runtime.steps import StepError

from .test_runtime_support import HC_PLE, LIMITS, PLAIN, fingerprint, inputs, open_session, pad_to_buckets

K = LIMITS.max_draft


def _pair(name: str, pad: bool):
    """Two sessions of the same weights; `pad`: verify groups padded to buckets (eager on the CPU's engines)."""
    return [pad_to_buckets(open_session(name)) if pad else open_session(name) for _ in range(2)]


def _verify(s, seqs, lengths, x):
    with s.begin_step(seqs, "verify", lengths) as st:
        out = st.run(x)
    return st, out


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("lengths", [[K, K, K], [2, K, 1]])
def test_the_loop_equals_full_checks_bit_for_bit(lengths, pad):
    """Verify 3 sequences, accept different counts (none, some, every draft), ten times: the loop (arrays reused)
    takes its fast paths from the second round on; the twin ends its loop before every accept, so each of its
    requests and accepts is checked in full. Outputs, the pools, the stash and the pending verifies agree bit for
    bit after every round."""
    loop, full = _pair(PLAIN, pad)
    qs = np.array([loop.add_sequence() for _ in range(3)])
    assert [full.add_sequence() for _ in range(3)] == qs.tolist()
    h, _ = inputs(loop, 16, seed=7)
    for s in (loop, full):
        for k, q in enumerate(qs.tolist()):
            s.prefill(q, h[3 * k:3 * k + 3])
    L = np.array(lengths)
    g = torch.Generator().manual_seed(3)
    specs = []
    for r in range(10):
        x = torch.randn(int(L.sum()), loop.cfg.stream_dim, generator=g)
        counts = np.array([(r + k) % (n + 1) for k, n in enumerate(lengths)])
        st, out = _verify(loop, qs, L, x)
        ref_st, ref = _verify(full, qs.tolist(), L.tolist(), x)
        assert torch.equal(out, ref), f"round {r}"
        specs.append(st._spec)
        assert (st._steady is not None and st._steady.rows is not None) == (r > 0), f"round {r}"
        assert ref_st._steady is None
        full._steps.last.pop("verify")  # the twin's accept takes the full checks
        loop.accept_batch(qs, counts)
        full.accept_batch(qs, counts)
        assert loop._steps.last["verify"].stage == "ready"
        assert fingerprint(loop) == fingerprint(full), f"round {r}"
    assert all(sp is specs[0] for sp in specs)
    assert loop.stats().accepted == full.stats().accepted > 0


def test_accepts_fold_through_the_index_buffer_and_leave_the_step_data():
    """An accept's (stash row, slot) pairs go through the index buffer's own region: the next verify of the loop
    sends nothing, and the slots and offsets the device holds are still its own."""
    s = open_session(PLAIN)
    qs = np.array([s.add_sequence() for _ in range(3)])
    h, _ = inputs(s, 12, seed=2)
    L = np.array([2, 3, 1])
    pk = s._steps.pack
    lo = pk.regions["fold"][0]
    for r in range(3):
        before = pk.copies
        _verify(s, qs, L, h[:6])
        assert pk.copies - before == (1 if r == 0 else 0), f"round {r}"
        cu = pk.view("cu", 0, 4).tolist()
        assert pk.view("slots", 0, 3).tolist() == [s._seqs.slot(int(q)) for q in qs] and cu == [0, 2, 5, 6]
        s.accept_batch(qs, np.array([1, 3, 0]))
        assert pk.dev[lo:lo + 4].tolist() == [0, 4, 0, 1]  # stash rows 0 and 2 + 2, slots 0 and 1
        assert pk.view("slots", 0, 3).tolist() == [s._seqs.slot(int(q)) for q in qs]
        assert pk.view("cu", 0, 4).tolist() == cu


def _ready(s, qs, L, h):
    _verify(s, qs, L, h[:int(L.sum())])
    s.accept_batch(qs, np.zeros(qs.size, dtype=np.int64))
    assert s._steps.last["verify"].stage == "ready"


def test_the_loop_ends_at_any_other_change():
    """Each change below ends the loop: the next verify is checked in full (a new request), and a request the
    change makes wrong is refused by name, changing nothing."""
    s = open_session(PLAIN)
    qs = np.array([s.add_sequence() for _ in range(3)])
    h, _ = inputs(s, 16, seed=5)
    L = np.array([1, 2, 1])

    def spec_after(change):
        _ready(s, qs, L, h)
        old = s._steps.last["verify"].spec
        change()
        st, _ = _verify(s, qs, L, h[:4])
        s.accept_batch(qs, np.zeros(3, dtype=np.int64))
        return st._spec is old

    assert spec_after(lambda: None)  # nothing changed: the same request
    assert not spec_after(lambda: s.add_sequence())
    other = s.sequences[-1]
    assert not spec_after(lambda: (_verify(s, np.array([other]), np.array([1]), h[:1]), s.accept({other: 0})))
    # the lengths array rewritten in place: checked again, and refused
    _ready(s, qs, L, h)
    bad = L.copy()
    _ready(s, qs, bad, h)
    bad[1] = K + 1
    before = fingerprint(s)
    with pytest.raises(ValueError, match=f"verify of sequence {qs[1]} brings {K + 1} draft tokens"):
        s.begin_step(qs, "verify", bad)
    assert fingerprint(s) == before
    # a released sequence: refused by name
    _ready(s, qs, L, h)
    s.release(int(qs[2]))
    before = fingerprint(s)
    with pytest.raises(SequenceError, match=f"sequence {qs[2]} was released"):
        s.begin_step(qs, "verify", L)
    assert fingerprint(s) == before


def test_an_accept_other_than_the_loops_is_checked_in_full():
    """While the loop's verify is pending: an accept of a subset, or of its sequences in another order, takes the
    full checks (and ends the loop); counts out of range on the loop's own accept are refused, naming the sequence,
    and change nothing; after a failed step the loop is over and its sequences refused."""
    s = open_session(PLAIN)
    qs = np.array([s.add_sequence() for _ in range(3)])
    h, _ = inputs(s, 16, seed=9)
    L = np.array([2, 2, 1])
    _ready(s, qs, L, h)
    _verify(s, qs, L, h[:5])
    before = fingerprint(s)
    with pytest.raises(ValueError, match=f"sequence {qs[2]}: accepted count must be an int in 0..1, got 2"):
        s.accept_batch(qs, np.array([1, 2, 2]))
    with pytest.raises(ValueError, match=f"sequence {qs[0]}: accepted count must be an int in 0..2, got -1"):
        s.accept_batch(qs, np.array([-1, 0, 0]))
    assert fingerprint(s) == before and s._steps.last["verify"].stage == "pending"
    s.accept_batch(qs[::-1].copy(), np.array([1, 2, 0]))  # another order: the full path
    assert s._steps.last["verify"].stage != "ready"
    assert [s.position(int(q)) for q in qs] == [0, 2, 1]
    with pytest.raises(SequenceError, match=f"sequence {qs[0]} has no verify to accept"):
        s.accept_batch(qs, np.zeros(3, dtype=np.int64))
    _ready(s, qs, L, h)
    _verify(s, qs, L, h[:5])
    s.accept_batch(qs[:2].copy(), np.array([2, 2]))  # a subset: the full path; the third stays pending
    assert s._steps.last["verify"].stage != "ready"
    with pytest.raises(SequenceError, match=f"sequence {qs[2]} has an unaccepted verify"):
        s.begin_step(qs, "verify", L)
    s.accept({int(qs[2]): 1})
    _ready(s, qs, L, h)
    with pytest.raises(RuntimeError, match="the host's model failed"):
        with s.begin_step(qs, "verify", L) as st:
            st.run(h[:5])
            raise RuntimeError("the host's model failed after the layers ran")
    with pytest.raises(SequenceError, match="failed in an earlier step"):
        s.accept_batch(qs, np.zeros(3, dtype=np.int64))
    with pytest.raises(SequenceError, match="failed in an earlier step"):
        s.begin_step(qs, "verify", L)


def test_no_loop_beside_another_pending_verify_or_with_token_ids():
    """A verify while another sequence's verify holds stash rows binds no steady step (its window is not row 0),
    nor does a verify of a PLE model (its token ids change every step); both still agree with their full checks
    (`test_step_context`)."""
    s = open_session(PLAIN)
    a, b, c = (s.add_sequence() for _ in range(3))
    h, _ = inputs(s, 16, seed=1)
    _verify(s, np.array([c]), np.array([2]), h[:2])
    for r in range(2):
        st, _ = _verify(s, np.array([a, b]), np.array([1, 1]), h[2:4])
        assert st._steady is None and st._binds[0].stash_at == 2
        s.accept_batch(np.array([a, b]), np.array([1, 0]))
    p = open_session(HC_PLE)
    qs = np.array([p.add_sequence() for _ in range(2)])
    hp, ids = inputs(p, 8, seed=2)
    for r in range(2):
        with p.begin_step(qs, "verify", np.array([1, 1]), ids[r:r + 2]) as st:
            st.run(hp[:2])
        assert st._steady is None and p._steps.last.get("verify") is None
        p.accept_batch(qs, np.array([1, 1]))


def test_a_refused_verify_step_leaves_the_loop_able_to_go_on():
    """A loop verify opened and refused before any layer call (a layer out of order) changes nothing; aborted, the
    next verify is checked in full, and the loop goes on from there."""
    s = open_session(PLAIN)
    qs = np.array([s.add_sequence() for _ in range(2)])
    h, _ = inputs(s, 8, seed=4)
    L = np.array([1, 1])
    _ready(s, qs, L, h)
    before = fingerprint(s)
    st = s.begin_step(qs, "verify", L)
    with pytest.raises(StepError):
        st.layer(st._layers[-1], h[:2])
    st.abort()
    assert fingerprint(s) == before
    for r in range(2):
        st, _ = _verify(s, qs, L, h[:2])
        assert (st._steady is not None) == (r > 0)
        s.accept_batch(qs, np.array([1, 0]))
    assert [s.position(int(q)) for q in qs] == [2, 0]


@pytest.mark.parametrize("seed", range(4))
def test_random_operations_against_full_checks(seed):
    """Random operations around a verify-accept loop (its verify and accept again and again, between them adds,
    releases, other sequences' steps and accepts, accepts of a subset or in another order, bad counts, the draft
    counts' array rewritten in place, a step failing after its layers ran) on the loop's session and on a twin
    whose every request and accept is checked in full: the same outputs, the same refusals (type and message) and
    bit-for-bit the same state after every operation."""
    import random

    rng = random.Random(seed)
    loop, full = open_session(PLAIN), open_session(PLAIN)
    C = loop.cfg.stream_dim
    g = torch.Generator().manual_seed(seed)
    group = np.array([loop.add_sequence() for _ in range(3)])
    assert [full.add_sequence() for _ in range(3)] == group.tolist()
    L = np.array([K, 2, 1])

    def both(fn):
        outs = []
        for s in (loop, full):
            if s is full:
                s._steps.last.pop("verify", None)
            try:
                outs.append(("ok", fn(s)))
            except Exception as e:  # noqa: BLE001 (the twins must refuse alike)
                outs.append((type(e).__name__, str(e)))
        return outs

    def verify(seqs, lengths, fail=False):
        x = torch.randn(int(np.asarray(lengths).sum()), C, generator=g)

        def run(s):
            with s.begin_step(seqs, "verify", lengths) as st:
                out = st.run(x)
                if fail:
                    raise RuntimeError("the host's model failed after the layers ran")
            return out
        return run

    def others(s):
        return [q for q in s.sequences if q not in group.tolist()]

    took, spec = 0, None
    for t in range(300):
        op = rng.choice(["loop"] * 12 + ["accept"] * 12 + ["reorder", "subset", "bad", "add", "release", "decode",
                                                           "other", "accept_other", "mutate", "fail"]
                        + ["regroup"] * 3)
        if op == "loop":
            fn = verify(group, L)
        elif op == "accept":
            fn = lambda s: s.accept_batch(group, np.array([rng_c[k] for k in range(group.size)]))  # noqa: E731
        elif op == "reorder":
            fn = lambda s: s.accept_batch(group[::-1].copy(), np.zeros(group.size, dtype=np.int64))  # noqa: E731
        elif op == "subset":
            fn = lambda s: s.accept_batch(group[:1].copy(), np.zeros(1, dtype=np.int64))  # noqa: E731
        elif op == "bad":
            fn = lambda s: s.accept_batch(group, L + 1)  # noqa: E731
        elif op == "add":
            fn = lambda s: s.add_sequence() if len(s.sequences) < LIMITS.max_seqs else None  # noqa: E731
        elif op == "release":
            q = rng.choice(loop.sequences) if loop.sequences else None
            fn = lambda s: s.release(q) if q is not None else None  # noqa: E731
        elif op == "decode":
            fn = lambda s: s.decode({q: torch.ones(1, C) for q in others(s)}) if others(s) else None  # noqa: E731
        elif op == "other":
            fn = lambda s: s.verify({q: torch.ones(2, C) for q in others(s)[:1]}) if others(s) else None  # noqa
        elif op == "accept_other":
            fn = lambda s: s.accept({q: 1 for q in others(s)[:1]}) if others(s) else None  # noqa: E731
        elif op == "mutate":
            L[rng.randrange(L.size)] = rng.randint(0, K)
            continue
        elif op == "fail":
            fn = verify(group, L, fail=True)
        else:  # a new group: live sequences, whichever they are
            live = loop.sequences
            if len(live) < 2:
                continue
            group = np.array(sorted(rng.sample(live, rng.randint(1, min(3, len(live))))))
            L = np.array([rng.randint(0, K) for _ in group])
            continue
        rng_c = [rng.randint(0, int(n)) for n in L]
        a, b = both(fn)
        assert a[0] == b[0], (t, op, a, b)
        if a[0] == "ok" and isinstance(a[1], torch.Tensor):
            assert torch.equal(a[1], b[1]), (t, op)
        elif a[0] != "ok":
            assert a[1] == b[1], (t, op)
        assert fingerprint(loop) == fingerprint(full), (t, op)
        last = loop._steps.last.get("verify")
        if op == "loop" and a[0] == "ok":
            took += last.spec is spec  # the request of the loop's last verify, handed back
            spec = last.spec
        if a[0] == "RuntimeError":  # a failed step: release its sequences, and carry on with a new group
            for q in set(group.tolist()) & set(loop.sequences):
                for s in (loop, full):
                    s.release(q)
            fresh = [loop.add_sequence() for _ in range(min(2, LIMITS.max_seqs - len(loop.sequences)))]
            assert [full.add_sequence() for _ in fresh] == fresh
            group, L = np.array(fresh), np.array([1, K][:len(fresh)])
    assert took >= 5, took  # the loop went round, not only its full checks
