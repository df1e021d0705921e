"""One thread at a time in a session (`runtime/guard.py`): a second thread entering any public call
of the session or of another thread's open step, while a call is in flight or a step is open, gets a
`ConcurrentUseError` naming the holding thread, and nothing changes; the holder's results equal a one-thread twin's.
Real threads, ordered by events (deterministic)."""

from __future__ import annotations

import threading

import pytest
import torch

from gdn_trt.model.errors import GdnTrtError
from gdn_trt.runtime import Prompt
from gdn_trt.runtime.backends import TorchEngine
from gdn_trt.runtime.guard import ConcurrentUseError

from .test_runtime_support import PLAIN, fingerprint, inputs, open_session, slot_state


class _Held(TorchEngine):
    """A real torch engine that, while `gate` is set up, signals `inside` and waits for `go` before running."""

    inside: threading.Event | None = None
    go: threading.Event | None = None

    def run(self, call, stream):
        if self.inside is not None:
            self.inside.set()
            assert self.go.wait(30)
        return super().run(call, stream)


def _world():
    s, t = open_session(PLAIN), open_session(PLAIN)
    h, _ = inputs(s, 8, seed=4)
    for sess in (s, t):
        a, b = sess.add_sequence(), sess.add_sequence()
        sess.prefill_batch({a: Prompt(h[:3]), b: Prompt(h[:2])})
    return s, t, h, a, b


def _refused_everywhere(s, step, a, b, h, holder: str) -> int:
    """Every public call from this thread is refused naming `holder`; returns how many were tried."""
    calls = [lambda: s.decode({b: h[3:4]}), lambda: s.verify({b: h[3:5]}), lambda: s.add_sequence(),
             lambda: s.release(b), lambda: s.snapshot(b), lambda: s.position(b), lambda: s.sequences,
             lambda: s.begin_step([b], "decode"), lambda: s.accept({b: 0}), lambda: s.stats(),
             lambda: s.prefill(b, h[:1]), lambda: s.adapter_of(b)]
    if step is not None:
        calls += [lambda: step.run(h[3:4]), lambda: step.layer(s.cfg.gdn_layer_ids[0], h[3:4]), lambda: step.close(),
                  lambda: step.abort()]
    for call in calls:
        with pytest.raises(ConcurrentUseError, match=f"in use by thread '{holder}'") as info:
            call()
        assert isinstance(info.value, GdnTrtError) and "\n" not in str(info.value)
    return len(calls)


def test_a_second_thread_is_refused_while_a_step_is_open():
    s, t, h, a, b = _world()
    opened, go, out = threading.Event(), threading.Event(), {}

    def holder():
        with s.begin_step([a], "decode") as step:
            out["step"] = step
            opened.set()
            assert go.wait(30)
            out["y"] = step.run(h[3:4])

    th = threading.Thread(target=holder, name="scheduler-A")
    th.start()
    assert opened.wait(30)
    before = fingerprint(s)
    assert _refused_everywhere(s, out["step"], a, b, h, "scheduler-A") == 16
    assert fingerprint(s) == before
    go.set()
    th.join(30)
    want = t.decode({a: h[3:4]})[a]
    assert torch.equal(out["y"], want)
    assert all(torch.equal(x, y) for x, y in zip(slot_state(s, a), slot_state(t, a)))
    assert torch.equal(s.decode({b: h[3:4]})[b], t.decode({b: h[3:4]})[b])  # free again for this thread


def test_a_second_thread_is_refused_while_a_call_is_in_flight():
    s, t, h, a, b = _world()
    inside, go, out = threading.Event(), threading.Event(), {}
    s.selector.engines = [[_Held(c[0].layer, c[0].device)] for c in s.selector.engines]
    held = s.selector.engines[0][0]
    held.inside, held.go = inside, go

    def holder():
        out["y"] = s.verify({a: h[3:6]})[a]

    th = threading.Thread(target=holder, name="scheduler-B")
    th.start()
    assert inside.wait(30)  # the verify is inside layer 0's engine
    before = fingerprint(s)
    _refused_everywhere(s, None, a, b, h, "scheduler-B")
    assert fingerprint(s) == before
    held.inside = None
    go.set()
    th.join(30)
    assert torch.equal(out["y"], t.verify({a: h[3:6]})[a])
    s.accept({a: 2})
    t.accept({a: 2})
    assert all(torch.equal(x, y) for x, y in zip(slot_state(s, a), slot_state(t, a)))


def test_the_holding_thread_reenters_and_releases_on_every_exit():
    """The dict API re-enters (step inside step()); a refused call, a closed step and an aborted step all leave the
    session free for another thread."""
    s, _, h, a, b = _world()
    with pytest.raises(ValueError):
        s.decode({a: h[:2]})  # refused inside the guard
    with s.begin_step([a], "decode") as step:
        step.run(h[3:4])
    step = s.begin_step([b], "decode")
    step.abort()
    with pytest.raises(RuntimeError):
        with s.begin_step([b], "decode"):
            raise RuntimeError("host error before any layer")
    assert s._guard.holder is None
    done = {}
    th = threading.Thread(target=lambda: done.update(y=s.decode({b: h[4:5]})), name="other")
    th.start()
    th.join(30)
    assert b in done["y"]


def test_a_guarded_call_keeps_its_signature_and_the_holder_reenters_uncounted():
    """`guarded` keeps a method's signature and docs (`functools.wraps`); a call of the holding thread inside its open
    step counts nothing, so closing the step frees the session."""
    import inspect

    from gdn_trt.runtime.session import Session
    from gdn_trt.runtime.steps import Step

    for fn in (Session.begin_step, Step.run, Step.layer, Step.input, Session.accept_batch):
        assert inspect.signature(fn) == inspect.signature(fn.__wrapped__) and fn.__doc__ == fn.__wrapped__.__doc__
    s, _, h, a, b = _world()
    st = s.begin_step(seqs=[a], kind="decode")
    assert s._guard._depth == 1
    y = st.run(x=h[3:4])
    assert s._guard._depth == 1 and st.run.__name__ == "run"
    st.close()
    assert s._guard.holder is None and s._guard._depth == 0
    with s.begin_step([a, b], "decode") as st:
        st.run(h[3:5], copy=True)
    assert s._guard.holder is None and y.shape == (1, s.cfg.stream_dim)


def test_device_work_is_refused_while_another_cuda_device_is_current(monkeypatch):
    """A session on cuda:1 called while cuda:0 is current (Triton launches and the session's events and capture
    stream would follow cuda:0): every call that launches device work is a `WrongDeviceError` naming both devices
    and changes nothing; the host-only queries answer; with cuda:1 current the same calls run and equal a twin's.
    (CPU: the session's guard is given the index a session opened on cuda:1 has, the current device is patched.)"""
    from gdn_trt.runtime.guard import WrongDeviceError

    s, t, h, a, b = _world()
    s._guard.cuda = 1
    current = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    before = fingerprint(s)
    calls = [lambda: s.decode({b: h[3:4]}), lambda: s.verify({b: h[3:5]}), lambda: s.add_sequence(),
             lambda: s.release(b), lambda: s.snapshot(b), lambda: s.begin_step([b], "decode"),
             lambda: s.accept({b: 0}), lambda: s.prefill(b, h[:1]), lambda: s.accept_batch([b], [0])]
    for call in calls:
        with pytest.raises(WrongDeviceError, match=r"on cuda:1 but cuda:0 is the current device.*"
                                                   r"torch\.cuda\.device\(1\)") as info:
            call()
        assert isinstance(info.value, GdnTrtError) and s._guard.holder is None
    assert fingerprint(s) == before
    assert (s.position(a), sorted(s.sequences), s.adapter_of(a)) == (t.position(a), sorted(t.sequences), None)
    assert s.stats().table() == t.stats().table()
    current[0] = 1
    assert torch.equal(s.decode({b: h[3:4]})[b], t.decode({b: h[3:4]})[b])
    with s.begin_step([a], "decode") as st:
        current[0] = 0  # the step's own calls pass as the holder's: the check ran when it opened
        y = st.run(h[4:5])
    assert torch.equal(y, t.decode({a: h[4:5]})[a])
