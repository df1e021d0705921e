"""Every bad input raises a clear exception and leaves every pool, stash, capture buffer, id carry, position and
pending verify exactly as it was (a hash of all of them is taken before and after each call)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.runtime.backends import TorchEngine
from gdn_trt.runtime.budget import BudgetError, RuntimeLimits
from gdn_trt.runtime.select import NoEngineError
from gdn_trt.runtime.seqs import Prompt, SequenceError
from gdn_trt.runtime.session import Session, SessionOptions
from gdn_trt.runtime.state import PoolFullError, SnapshotError

from .test_runtime_support import HC_PLE, LIMITS, PLAIN, fingerprint, inputs, open_session


@pytest.fixture(scope="module")
def world():
    """A PLE session with: a (prefilled, idle), b (verified, not accepted), r (released); a plain session p."""
    s = open_session(HC_PLE)
    h, ids = inputs(s, 12, seed=0)
    a, b, r = s.add_sequence(), s.add_sequence(), s.add_sequence()
    s.prefill_batch({a: Prompt(h[:6], ids[:6]), b: Prompt(h[:6], ids[:6]), r: Prompt(h[:3], ids[:3])})
    s.verify({b: h[6:9]}, {b: ids[6:9]})
    s.release(r)
    p = open_session(PLAIN)
    pa = p.add_sequence()
    p.prefill(pa, torch.randn(4, p.cfg.stream_dim))
    return dict(s=s, a=a, b=b, r=r, h=h, ids=ids, p=p, pa=pa, blob=s.snapshot(a), pblob=p.snapshot(pa))


def one(w, n=1, seq="a", at=6):
    return w["h"][at:at + n]


CASES = {
    # (call, exception, message fragment)
    "decode unknown seq": (lambda w: w["s"].decode({999: one(w)}, {999: w["ids"][6:7]}), SequenceError, "unknown"),
    "decode released seq": (lambda w: w["s"].decode({w["r"]: one(w)}, {w["r"]: w["ids"][6:7]}), SequenceError,
                            "released"),
    "snapshot released seq": (lambda w: w["s"].snapshot(w["r"]), SequenceError, "released"),
    "release twice": (lambda w: w["s"].release(w["r"]), SequenceError, "released"),
    "decode two tokens": (lambda w: w["s"].decode({w["a"]: one(w, 2)}, {w["a"]: w["ids"][6:8]}), ValueError,
                          "one token"),
    "decode wrong width": (lambda w: w["s"].decode({w["a"]: torch.randn(1, 7)}, {w["a"]: w["ids"][6:7]}),
                           ValueError, "must be [tokens"),
    "decode wrong dtype": (lambda w: w["s"].decode({w["a"]: one(w).double()}, {w["a"]: w["ids"][6:7]}),
                           ValueError, "computes in"),
    "decode not a tensor": (lambda w: w["s"].decode({w["a"]: [0.0]}, {w["a"]: w["ids"][6:7]}), TypeError,
                            "tensor"),
    "decode without token ids (PLE)": (lambda w: w["s"].decode({w["a"]: one(w)}), ValueError, "need the token ids"),
    "token ids wrong length": (lambda w: w["s"].decode({w["a"]: one(w)}, {w["a"]: w["ids"][6:8]}), ValueError,
                               "must be [1]"),
    "token ids outside vocab": (lambda w: w["s"].decode({w["a"]: one(w)}, {w["a"]: np.array([10 ** 7])}),
                                ValueError, "vocabulary"),
    "token ids float": (lambda w: w["s"].decode({w["a"]: one(w)}, {w["a"]: np.array([1.5])}), TypeError,
                        "integers"),
    "token ids for a seq not stepped": (lambda w: w["s"].decode({w["a"]: one(w)}, {w["a"]: w["ids"][6:7],
                                                                                  999: w["ids"][6:7]}),
                                        ValueError, "not in the step"),
    "plain model given token ids": (lambda w: w["p"].decode({w["pa"]: torch.randn(1, w["p"].cfg.stream_dim)},
                                                            {w["pa"]: np.array([3])}), ValueError, "no PLE"),
    "decode during pending verify": (lambda w: w["s"].decode({w["b"]: one(w)}, {w["b"]: w["ids"][6:7]}),
                                     SequenceError, "unaccepted verify"),
    "seq in two kinds": (lambda w: w["s"].step(decode={w["a"]: one(w)}, verify={w["a"]: one(w, 2)},
                                               token_ids={w["a"]: w["ids"][6:7]}), ValueError, "more than one kind"),
    "verify too many drafts": (lambda w: w["s"].verify({w["a"]: w["h"][:5]}, {w["a"]: w["ids"][:5]}), ValueError,
                               "max_draft"),
    "prefill no tokens": (lambda w: w["s"].prefill(w["a"], w["h"][:0], token_ids=w["ids"][:0]), ValueError,
                          "no tokens"),
    "prefill over max_prefill_tokens": (
        lambda w: w["s"].prefill(w["a"], torch.randn(LIMITS.max_prefill_tokens + 1, w["s"].cfg.stream_dim),
                                 token_ids=np.zeros(LIMITS.max_prefill_tokens + 1, dtype=np.int64)),
        ValueError, "max_prefill_tokens"),
    "prefill capture_at past the end": (lambda w: w["s"].prefill(w["a"], w["h"][:3], w["ids"][:3], capture_at=4),
                                        ValueError, "capture_at"),
    "prefill capture_at negative": (lambda w: w["s"].prefill(w["a"], w["h"][:3], w["ids"][:3], capture_at=-2),
                                    ValueError, "capture_at"),
    "prefill not a Prompt": (lambda w: w["s"].step(prefill={w["a"]: w["h"][:3]}), TypeError, "Prompt"),
    "token ids given twice": (lambda w: w["s"].step(prefill={w["a"]: Prompt(w["h"][:2], w["ids"][:2])},
                                                    token_ids={w["a"]: w["ids"][:2]}), ValueError, "twice"),
    "accept without verify": (lambda w: w["s"].accept({w["a"]: 1}), SequenceError, "no verify"),
    "accept more than drafted": (lambda w: w["s"].accept({w["b"]: 4}), ValueError, "0..3"),
    "accept negative": (lambda w: w["s"].accept({w["b"]: -1}), ValueError, "0..3"),
    "accept with a bad seq among good": (lambda w: w["s"].accept({w["b"]: 1, 999: 0}), SequenceError, "unknown"),
    "restore truncated": (lambda w: w["s"].restore(w["blob"][:-9]), SnapshotError, "checksum"),
    "restore flipped byte": (lambda w: w["s"].restore(_flip(w["blob"], len(w["blob"]) // 2)), SnapshotError,
                             "checksum"),
    "restore other config": (lambda w: w["s"].restore(w["pblob"]), SnapshotError, "config"),
    "restore not bytes": (lambda w: w["s"].restore("GDNSNAP"), SnapshotError, "bytes"),
}


def _flip(blob: bytes, i: int) -> bytes:
    b = bytearray(blob)
    b[i] ^= 0x40
    return bytes(b)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_raises_and_changes_nothing(world, name):
    call, exc, fragment = CASES[name]
    sessions = (world["s"], world["p"])
    before = [fingerprint(s) for s in sessions]
    with pytest.raises(exc, match=None) as info:
        call(world)
    assert fragment in str(info.value), f"message {str(info.value)!r} lacks {fragment!r}"
    assert [fingerprint(s) for s in sessions] == before


def test_too_many_sequences_leaves_pool_unchanged():
    s = open_session(PLAIN, limits=dataclasses.replace(LIMITS, max_seqs=2))
    a = s.add_sequence()
    s.prefill(a, torch.randn(3, s.cfg.stream_dim))
    s.add_sequence()
    blob = s.snapshot(a)
    before = fingerprint(s)
    with pytest.raises(PoolFullError, match="max_seqs"):
        s.add_sequence()
    with pytest.raises(PoolFullError, match="max_seqs"):
        s.restore(blob)
    assert fingerprint(s) == before


def test_accept_after_a_later_verify_of_another_sequence():
    """Each pending verify keeps its own stash rows: a later verify of b leaves a's acceptable
    (tests/test_verify_stash.py checks the states against a twin)."""
    s = open_session(PLAIN)
    h, _ = inputs(s, 8, seed=1)
    a, b = s.add_sequence(), s.add_sequence()
    s.prefill_batch({a: Prompt(h[:2]), b: Prompt(h[:2])})
    s.verify({a: h[2:4]})
    s.verify({b: h[2:5]})
    assert s._seqs[a].pending.row + 2 <= s._seqs[b].pending.row  # b's window lies after a's rows
    s.accept({a: 1})
    s.accept({b: 0})
    assert (s.position(a), s.position(b)) == (3, 2)


class _NoVerify(TorchEngine):
    """A real torch engine that covers no verify step of more than 2 tokens (like a TensorRT profile would)."""

    def refuse(self, mode, seqs, tokens):
        if mode.spec.writes is Writes.STASH and tokens > 2:
            return f"profile max is 2 tokens, the step has {tokens}"
        return super().refuse(mode, seqs, tokens)


def test_no_engine_covers_the_step():
    s = open_session(PLAIN)
    s.selector.engines = [[_NoVerify(c[0].layer, c[0].device)] for c in s.selector.engines]
    h, _ = inputs(s, 6, seed=2)
    a = s.add_sequence()
    s.prefill(a, h[:2])
    before = fingerprint(s)
    with pytest.raises(NoEngineError, match="profile max is 2 tokens") as info:
        s.verify({a: h[2:5]})
    assert LayerMode.DECODE_BATCHED.value in str(info.value) and LayerMode.VERIFY_MULTI.value in str(info.value)
    assert fingerprint(s) == before
    s.verify({a: h[2:4]})  # covered: runs


def test_open_fails_early_naming_the_limit_to_lower():
    opts = SessionOptions(limits=RuntimeLimits(max_seqs=4096, max_prefill_tokens=64), memory_budget=1 << 20)
    with pytest.raises(BudgetError, match="lower max_seqs"):
        Session.open(PLAIN, backend="torch", device="cpu", options=opts)
    opts = SessionOptions(limits=RuntimeLimits(max_seqs=2, max_prefill_tokens=1 << 20), memory_budget=1 << 28)
    with pytest.raises(BudgetError, match="lower max_prefill_tokens"):
        Session.open(PLAIN, backend="torch", device="cpu", options=opts)


def test_unknown_backend_and_trt_without_tensorrt():
    with pytest.raises(ValueError, match="backend must be one of"):
        Session.open(PLAIN, backend="onnx", device="cpu")
    with pytest.raises(RuntimeError, match="backend='trt' cannot run: TensorRT needs a CUDA device"):
        Session.open(PLAIN, backend="trt", device="cpu", engines_dir="engines")
