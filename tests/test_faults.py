"""Faults in the middle of a step: an engine that raises at layer k (before or after its own run)
in every step kind (decode, verify, prefill, mixed) and every way of calling the layers (the dict API, `step.layer`,
`step.mixer`). The contract (`steps.py`, docs/architecture.md): the fault reaches the caller; the step's sequences
are marked failed with the reason and refuse every call but release (a snapshot too: their state may be
half-written); every other sequence (an idle one, one with a pending verify and its stash rows) is bit-for-bit
untouched; releasing frees the slots and new sequences work. A soak of random steps with random faults ends with no
slot leaked, every surviving sequence bit-equal to a fault-free twin session fed the same inputs, and every failed
one reported (tried / held / broken counted as in tests/test_adversarial.py; the long run is `slow`).
On the GPU a fault at the CUDA-graph capture of a decode bucket is absorbed: the capture fails, the bucket runs
eagerly from then on (`stats().graphs.gate_failures` says why) and the step completes exactly as the eager twin's.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from gdn_trt.runtime import Prompt, RuntimeLimits
from gdn_trt.runtime.seqs import SequenceError
from gdn_trt.runtime.session import Session, SessionOptions

from .adversarial_support import Tally
from .fault_support import InjectedFault, install
from .test_runtime_support import HC_PLE, LIMITS, PLAIN, inputs, open_session, slot_state

KINDS = {"decode": ["decode"], "verify": ["verify"], "prefill": ["prefill"], "mixed": ["decode", "verify", "prefill"]}
SCALES = [pytest.param(2_000, id="ci"), pytest.param(100_000, id="long", marks=pytest.mark.slow)]


def _request(s, seqs, kinds, rng, h, ids):
    """A step's request both ways: the dict API's arguments and begin_step's arrays (kind order kept)."""
    lengths = [1 if k == "decode" else rng.randint(0 if k == "verify" else 1, 4) for k in kinds]
    at = [rng.randrange(0, h.shape[0] - 4) for _ in seqs]
    feeds = {"decode": {}, "verify": {}, "prefill": {}}
    tok = {}
    for q, k, n, a in zip(seqs, kinds, lengths, at):
        feeds[k][q] = Prompt(h[a:a + n]) if k == "prefill" else h[a:a + n]
        if ids is not None:
            tok[q] = ids[a:a + n]
    x = torch.cat([h[a:a + n] for a, n in zip(at, lengths)])
    packed = None if ids is None else np.concatenate([tok[q] for q in seqs])
    return dict(feeds=feeds, tok=tok or None, x=x, packed=packed, lengths=np.array(lengths, dtype=np.int64))


def _run(s, api, seqs, kinds, req):
    if api == "dict":
        return s.step(**{k: d or None for k, d in req["feeds"].items()}, token_ids=req["tok"])
    with s.begin_step(np.array(seqs, dtype=np.int64), kinds, req["lengths"], req["packed"]) as st:
        x = req["x"]
        for i in s.cfg.gdn_layer_ids:
            if api == "layer":
                x = st.layer(i, x)
            else:
                st.mixer(i, x[:, :s.cfg.hidden_size].contiguous())


def _frozen(s, seqs):
    """Everything of these sequences a step must not touch: slot state, position, pending verify and its stash."""
    out = []
    for q in seqs:
        v = s._seqs[q]
        out += [t.clone() for t in slot_state(s, q)]
        out.append(torch.tensor([v.position, -1 if v.pending is None else v.pending.count]))
        if v.pending is not None:
            r, n = v.pending.row, v.pending.count
            out += [t[r:r + n].clone() for st in s.stack.buffers.stash.values()
                    for t in (st.conv, st.ssm, st.ple_conv) if t is not None]
    return out


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def _failed_everywhere(s, q, reason: str, h) -> str | None:
    """None when every call on failed sequence q but release is refused naming the reason."""
    calls = {"decode": lambda: s.decode({q: h[:1]}) if s.feeds is None else s.decode({q: h[:1]}, {q: [1]}),
             "begin_step": lambda: s.begin_step([q], "decode", token_ids=None if s.feeds is None else [1]),
             "snapshot": lambda: s.snapshot(q), "accept": lambda: s.accept({q: 0})}
    for name, call in calls.items():
        try:
            call()
        except SequenceError as e:
            if "failed in an earlier step" not in str(e) or reason not in str(e):
                return f"{name}: refused without the reason: {e}"
            continue
        return f"{name} of a failed sequence was not refused"
    return None


@pytest.mark.parametrize("name", [PLAIN, HC_PLE])
def test_a_fault_at_every_layer_of_every_step_kind(name):
    s = open_session(name)
    arm = install(s)
    rng = random.Random(1)
    h, ids = inputs(s, 40, seed=2)
    by = [s.add_sequence(), s.add_sequence()]  # bystanders: one idle, one with a pending verify
    s.prefill_batch({q: Prompt(h[:3], None if ids is None else ids[:3]) for q in by})
    s.verify({by[1]: h[3:6]}, None if ids is None else {by[1]: ids[3:6]})
    frozen = _frozen(s, by)
    tally = Tally(f"faults mid-step {name}")
    apis = ["dict", "layer"] + (["mixer"] if not s.cfg.ple_layer_ids else [])
    for kind, kinds in KINDS.items():
        for api in apis:
            for layer in s.cfg.gdn_layer_ids:
                for after in (False, True):
                    what = f"{kind} via {api}, fault at layer {layer} {'after' if after else 'before'}"
                    victims = [s.add_sequence() for _ in kinds]
                    s.prefill_batch({q: Prompt(h[:2], None if ids is None else ids[:2]) for q in victims})
                    req = _request(s, victims, kinds, rng, h, ids)
                    arm.set(layer, after)
                    tally.record(what, _fault_case(s, api, victims, kinds, req, layer, h))
                    arm.clear()
                    if not _same(_frozen(s, by), frozen):
                        tally.record(what, "a bystander's state, position, pending verify or stash rows changed")
                    for q in victims:
                        s.release(q)
                    if s.pool.free_slots != LIMITS.max_seqs - len(by):
                        tally.record(what, f"slots leaked: {s.pool.free_slots} free")
                    q = s.add_sequence()  # a new sequence in a freed slot works
                    s.prefill(q, h[:2], None if ids is None else ids[:2])
                    s.release(q)
    s.accept({by[1]: 2})
    tally.check()
    assert tally.tried == 4 * len(apis) * len(s.cfg.gdn_layer_ids) * 2


def _fault_case(s, api, victims, kinds, req, layer, h) -> str | None:
    try:
        _run(s, api, victims, kinds, req)
    except InjectedFault as e:
        if f"at layer {layer}" not in str(e):
            return f"another fault surfaced: {e}"
    except Exception as e:  # noqa: BLE001 - anything else is the finding
        return f"the fault surfaced as {type(e).__name__}: {e}"
    else:
        return "the fault did not reach the caller"
    for q in victims:
        problem = _failed_everywhere(s, q, f"InjectedFault: injected fault at layer {layer}", h)
        if problem:
            return f"sequence {q}: {problem}"
    return None


def test_snapshot_of_a_failed_sequence_is_refused_and_restore_of_an_earlier_one_works():
    s = open_session(PLAIN)
    arm = install(s)
    h, _ = inputs(s, 8, seed=3)
    a = s.add_sequence()
    s.prefill(a, h[:3])
    blob = s.snapshot(a)
    arm.set(s.cfg.gdn_layer_ids[1])
    with pytest.raises(InjectedFault):
        s.decode({a: h[3:4]})
    with pytest.raises(SequenceError, match=f"sequence {a} failed in an earlier step .*InjectedFault.*half-written"):
        s.snapshot(a)
    assert s.position(a) == 3 and a in s.sequences  # reads stay open: the sequence is reported, not hidden
    s.release(a)
    r = s.restore(blob)
    twin = open_session(PLAIN)
    t = twin.add_sequence()
    twin.prefill(t, h[:3])
    assert torch.equal(s.decode({r: h[3:4]})[r], twin.decode({t: h[3:4]})[t])


# ---- the soak ----
def _soak(name: str, steps: int, seed: int) -> Tally:
    """`steps` random steps (with adds, releases and accepts between them) on a session with random faults and on
    a fault-free twin fed the same inputs."""
    rng = random.Random(seed)
    main, twin = open_session(name), open_session(name)
    arm = install(main)
    install(twin)  # the same engine class, never armed
    h, ids = inputs(main, 48, seed=seed)
    tally = Tally(f"fault soak {name}, {steps} steps")
    live: list[int] = []
    pending: dict[int, int] = {}
    failed: dict[int, str] = {}
    both = (main, twin)
    apis = ["dict", "layer"]
    k = 0
    while k < steps:
        r = rng.random()
        ready = [q for q in live if q not in pending and q not in failed]
        if len(live) < LIMITS.max_seqs and (r < 0.15 or not ready):
            got = [sess.add_sequence() for sess in both]
            assert got[0] == got[1]
            live.append(got[0])
            continue
        if r < 0.25 and live:
            q = rng.choice(live)
            for sess in both:
                sess.release(q)
            live.remove(q)
            pending.pop(q, None)
            failed.pop(q, None)
            continue
        if r < 0.35 and pending:
            q = rng.choice(sorted(pending))
            j = rng.randint(0, pending.pop(q))
            for sess in both:
                sess.accept({q: j})
            continue
        if not ready:
            continue
        k += 1
        seqs = rng.sample(ready, rng.randint(1, len(ready)))
        kinds = sorted((rng.choice(["decode", "verify", "prefill"]) for _ in seqs),
                       key=["decode", "verify", "prefill"].index)
        req = _request(main, seqs, kinds, rng, h, ids)
        api = rng.choice(apis)
        fault = rng.random() < 0.2
        if fault:
            layer = rng.choice(main.cfg.gdn_layer_ids)
            arm.set(layer, rng.random() < 0.5)
        what = f"step {k} ({'/'.join(kinds)} via {api}{f', fault at layer {layer}' if fault else ''})"
        problem = None
        try:
            _run(main, api, seqs, kinds, req)
            if fault:
                problem = "the fault did not reach the caller"
        except InjectedFault as e:
            if not fault:
                problem = f"a fault nobody armed: {e}"
            for q in seqs:
                failed[q] = str(e)
        except Exception as e:  # noqa: BLE001 - anything else is the finding
            problem = f"raised {type(e).__name__}: {e}"
        arm.clear()
        _run(twin, api, seqs, kinds, req)
        if not fault:
            pending.update({q: int(n) for q, n, kd in zip(seqs, req["lengths"], kinds) if kd == "verify"})
        flags = main._seqs.failed[[main._seqs.slot(q) for q in seqs]]
        if problem is None and (bool(flags.all()) != fault or bool(flags.any()) != fault):
            problem = f"failed flags {flags.tolist()} after a step {'with' if fault else 'without'} a fault"
        tally.record(what, problem)
    for q in live:  # every survivor equals its fault-free twin; every failed one is reported with its reason
        if q in failed:
            tally.record(f"failed sequence {q}", _failed_everywhere(main, q, failed[q], h))
            continue
        same = main.position(q) == twin.position(q) and _same(slot_state(main, q), slot_state(twin, q))
        tally.record(f"survivor {q}", None if same else "state differs from the fault-free twin")
    for q in live:
        for sess in both:
            sess.release(q)
    leaked = [sess.pool.free_slots for sess in both] != [LIMITS.max_seqs] * 2
    tally.record("slots after releasing everything", f"free slots {main.pool.free_slots}" if leaked else None)
    print(f"\n{tally.summary()}: {arm.fired} faults fired")
    return tally


@pytest.fixture
def one_thread():
    """Tiny matrices gain nothing from intra-op threads, and on a shared 2-core machine two threads made the soak
    18x slower (200 steps: 19.4 s against 1.08 s, 2026-12-03)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("name", [PLAIN, HC_PLE])
def test_random_steps_with_random_faults(name, scale, one_thread):
    steps = scale if name == PLAIN else scale // 4
    _soak(name, steps, seed=11).check()


# ---- on the GPU: a fault at the capture of a decode bucket's CUDA graph ----
def open_session_cuda(name, limits, graphs=True):
    return Session.open(name, backend="torch", device="cuda",
                        options=SessionOptions(limits=limits, graphs=graphs, dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("name", [PLAIN, HC_PLE])
def test_a_fault_at_graph_capture_falls_back_to_eager_and_a_fault_in_eager_fails_the_step(name):
    lim = RuntimeLimits(max_seqs=4, max_prefill_tokens=32, max_draft=4, graph_buckets=(2, 4), ple_cache_rows=64)
    s = open_session_cuda(name, lim)
    ref = open_session_cuda(name, lim, graphs=False)
    arm = install(s)
    install(ref)
    h, ids = inputs(s, 8, seed=5)
    h = h.to(s.device, s.dtype)
    seqs = [[sess.add_sequence() for _ in range(2)] for sess in (s, ref)]
    for sess, qs in zip((s, ref), seqs):
        sess.prefill_batch({q: Prompt(h[:3], None if ids is None else ids[:3]) for q in qs})
    layer = s.cfg.gdn_layer_ids[-1]
    arm.set(layer, capture=True)  # fires inside the capture of bucket 2
    tok = None if ids is None else {q: ids[3:4] for q in seqs[0]}
    out = s.decode({q: h[3:4] for q in seqs[0]}, tok)
    want = ref.decode({q: h[3:4] for q in seqs[1]}, None if ids is None else {q: ids[3:4] for q in seqs[1]})
    assert arm.fired == 1 and any("capture failed: InjectedFault" in g for g in s.stats().graphs.gate_failures)
    for q, r in zip(seqs[0], seqs[1]):  # the step ran eagerly: the eager twin's bits
        assert torch.equal(out[q], want[r])
        assert _same(slot_state(s, q), slot_state(ref, r))
    arm.set(layer)  # the bucket is eager now: a fault in a layer fails the step's sequences
    with pytest.raises(InjectedFault):
        s.decode({q: h[4:5] for q in seqs[0]}, None if ids is None else {q: ids[4:5] for q in seqs[0]})
    for q in seqs[0]:
        assert _failed_everywhere(s, q, "InjectedFault", h) is None
        s.release(q)
    assert s.pool.free_slots == lim.max_seqs
