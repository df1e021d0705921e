"""Injected engine faults (no tests here): `Faulty` is the real torch engine of a layer that raises
`InjectedFault` once when armed for its layer, either before it runs (the earlier layers of the step wrote) or after
(it wrote too), optionally only while a CUDA stream is capturing. `install` puts one in place of every layer's
engine of a session (the same way tests/test_session_errors.py::_NoVerify does)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gdn_trt.runtime.backends import TorchEngine


class InjectedFault(RuntimeError):
    """The fault an armed engine raises (a stand-in for a kernel error, an OOM or an enqueue failure)."""


@dataclass
class Arm:
    """Fire once at `layer`: before (`after=False`) or after the engine's real run; `capture`: only while a CUDA
    stream is capturing (the runtime's graph capture of a decode bucket)."""

    layer: int | None = None
    after: bool = False
    capture: bool = False
    fired: int = 0

    def set(self, layer: int, after: bool = False, capture: bool = False) -> None:
        self.layer, self.after, self.capture = layer, after, capture

    def clear(self) -> None:
        self.layer = None


class Faulty(TorchEngine):
    arm: Arm

    def run(self, call, stream):
        a = self.arm
        hit = a.layer == self.layer_idx and (not a.capture or torch.cuda.is_current_stream_capturing())
        if not hit:
            return super().run(call, stream)
        a.layer = None
        a.fired += 1
        what = f"injected fault at layer {self.layer_idx} {'after' if a.after else 'before'} its {call.mode.value}"
        if a.after:
            super().run(call, stream)
        raise InjectedFault(what)


def install(sess) -> Arm:
    arm = Arm()
    engines = []
    for cands in sess.selector.engines:
        e = Faulty(cands[0].layer, cands[0].device)
        e.arm = arm
        engines.append([e])
    sess.selector.engines = engines
    return arm
