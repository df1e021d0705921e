"""`Guard`: one thread at a time in a session.

A `Session` is not thread-safe and does not pretend to be: its calls mutate shared host tables and device buffers
without locks, and interleaving two threads' steps silently mixed their results (3 of 3 trials wrong). So every
public call of a session and of its open step enters the guard; a second thread that enters while a call of another
thread is in flight, or while another thread's step is open (from `begin_step` until it closes or aborts), gets a
`ConcurrentUseError` naming the thread that holds the session, and nothing changes. A thread re-enters freely (the
dict API opens a step inside its own call). It refuses instead of waiting: a lock would serialize the steps of two
threads in an order neither chose, and hide a host bug that usually means two schedulers share one session.
Serve one session from one thread (or put a lock of your own around whole steps).

A session on a CUDA device also refuses a call that launches device work while another device is current
(`WrongDeviceError`, before anything changes): Triton launches its kernels, and the session records its events and
creates its capture stream, on the current device's current stream, so a session on cuda:1 called with cuda:0
current would queue its work on the wrong device. Call it under `with torch.cuda.device(k):` (or
`torch.cuda.set_device(k)`). The check runs on a first entry only (a steady step: once, in `begin_step`); the
session's host-only queries (`position`, `sequences`, `adapter_of`, `stats`) skip it.

Cost, measured on the shared 2-core CPU machine (2026-12-04, timeit): a first entry 0.38-0.66 us (the lock), a
call of the holding thread about 0.3 us (the wrapper's `*args, **kwargs`), against 0.03-0.05 us unguarded. A steady
decode step in place enters once (`begin_step`), holds the session while the step is open, and calls `input`,
`run` and `close` as the holder, which pass straight through (2026-12-03, with re-entries counted: about 2 us).
"""

from __future__ import annotations

import functools
import threading
from threading import get_ident
from typing import Callable, TypeVar

import torch

from gdn_trt.model.errors import GdnTrtError

F = TypeVar("F", bound=Callable)


class ConcurrentUseError(GdnTrtError, RuntimeError):
    """A session entered by a second thread while another thread's call or open step holds it."""


class WrongDeviceError(GdnTrtError, RuntimeError):
    """A call that launches device work, made while a CUDA device other than the session's is current."""


class Guard:
    """Owner thread and depth of the calls in flight (an open step counts as one); `cuda`: the index of the session's
    CUDA device (None off CUDA), which must be current at a first entry that launches device work."""

    def __init__(self, cuda: int | None = None) -> None:
        lock = threading.Lock()
        self._acquire, self._release = lock.acquire, lock.release
        self._owner: int | None = None
        self._depth = 0
        self.cuda = cuda

    def enter(self, what: str, device: bool = True) -> None:
        me = get_ident()
        if self._owner == me:  # only this thread sets or clears its own ownership
            self._depth += 1
            return
        if not self._acquire(False):
            raise ConcurrentUseError(f"{what}: this session is in use by thread {self.holder or 'another thread'!r} "
                                     f"(a call in flight or an open step); thread "
                                     f"{threading.current_thread().name!r} may not enter it. A Session serves one "
                                     "thread at a time: serve it from one thread or lock whole steps yourself")
        if device and self.cuda is not None:
            current = torch.cuda.current_device()
            if current != self.cuda:
                self._release()
                raise WrongDeviceError(f"{what}: this session is on cuda:{self.cuda} but cuda:{current} is the current "
                                       "device, whose streams its kernels and events would use; call it under "
                                       f"`with torch.cuda.device({self.cuda}):` or after "
                                       f"torch.cuda.set_device({self.cuda})")
        self._owner, self._depth = me, 1

    def exit(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._release()

    @property
    def holder(self) -> str | None:
        """The name of the thread holding the session (None when free)."""
        owner = self._owner
        if owner is None:
            return None
        return next((t.name for t in threading.enumerate() if t.ident == owner), f"ident {owner}")


def guarded(fn: F | None = None, *, host_only: bool = False) -> F:
    """Run a method of an object with a `_guard` inside it (see the module docstring); `@guarded(host_only=True)`: a
    method that launches no device work, callable whatever device is current.

    A call of the thread that holds the session (a call inside its own call, or on its open step) runs at once and
    counts nothing: the hold of the outer call or of the open step keeps the session (`Step.close` and `abort`
    release the step's hold as their last act)."""
    if fn is None:
        return functools.partial(guarded, host_only=host_only)
    what, device = fn.__name__, not host_only

    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        g = self._guard
        if g._owner == get_ident():
            return fn(self, *args, **kwargs)
        g.enter(what, device)
        try:
            return fn(self, *args, **kwargs)
        finally:
            g.exit()

    return call
