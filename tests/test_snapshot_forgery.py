"""Forged snapshots: blobs re-sealed with a valid checksum whose header or values are wrong are refused with a
`SnapshotError` (never another exception), before a slot is taken, and the session is bit-identical afterwards.

The header is checked against a strict schema (exact key sets, exact types: a bool is not an int, ranges, the
pool's names, dtypes, shapes and offsets), the values (finite state, PLE id carries inside the vocabulary) and the
weights digest (a snapshot restores only onto the weights it was taken with).
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
import torch

from gdn_trt.model.dtypes import DTYPES
from gdn_trt.runtime import state as st
from gdn_trt.runtime.state import SnapshotError

from .test_runtime_support import HC_PLE, PLAIN, fingerprint, inputs, open_session


@pytest.fixture(scope="module")
def snap():
    s = open_session(HC_PLE)
    h, ids = inputs(s, 9, seed=0)
    a = s.add_sequence()
    s.prefill(a, h, token_ids=ids)
    return s, a, s.snapshot(a)


def _split(blob: bytes) -> tuple[int, dict, bytes]:
    _, version, hlen = st._PREFIX.unpack_from(blob)
    start = st._PREFIX.size
    return version, json.loads(blob[start:start + hlen]), blob[start + hlen:-4]


def _seal_raw(version: int, header: bytes, payload: bytes) -> bytes:
    body = st._PREFIX.pack(st.MAGIC, version, len(header)) + header + payload
    return body + struct.pack("<I", zlib.crc32(body))


def _seal(version: int, header, payload: bytes) -> bytes:
    return _seal_raw(version, json.dumps(header).encode(), payload)


def _refused(s, blob: bytes, match: str | None = None) -> None:
    before = (fingerprint(s), s.sequences, s.pool.free_slots)
    with pytest.raises(SnapshotError, match=match):
        s.restore(blob)
    assert before == (fingerprint(s), s.sequences, s.pool.free_slots)


def _entry(h: dict, part: str) -> tuple[int, dict]:
    return next((k, t) for k, t in enumerate(h["tensors"]) if t["name"].endswith(part))


def _with_tensor(h, k, **change):
    ts = [dict(t) for t in h["tensors"]]
    ts[k].update(change)
    return {**h, "tensors": ts}


HEADERS = {
    "position true": lambda h: {**h, "position": True},
    "position 2**80": lambda h: {**h, "position": 2 ** 80},
    "position float": lambda h: {**h, "position": 9.0},
    "position string": lambda h: {**h, "position": "9"},
    "position null": lambda h: {**h, "position": None},
    "extra key": lambda h: {**h, "note": "hi"},
    "missing key": lambda h: {k: v for k, v in h.items() if k != "config"},
    "config not a string": lambda h: {**h, "config": ["tiny-4exp"]},
    "config_hash a number": lambda h: {**h, "config_hash": 7},
    "header a list": lambda h: [h],
    "header a string": lambda h: "tiny-4exp",
    "header null": lambda h: None,
    "tensors a dict": lambda h: {**h, "tensors": {"a": 1}},
    "tensor entry a list": lambda h: {**h, "tensors": [list(t.values()) for t in h["tensors"]]},
    "tensor entry extra key": lambda h: _with_tensor(h, 0, extra=1),
    "tensor entry missing key": lambda h: {**h, "tensors": [{k: v for k, v in t.items() if k != "offset"}
                                                            for t in h["tensors"]]},
    "offset true": lambda h: _with_tensor(h, 0, offset=False),
    "shape of bools": lambda h: _with_tensor(h, 0, shape=[True] * len(h["tensors"][0]["shape"])),
    "shape a string": lambda h: _with_tensor(h, 0, shape="64,3"),
    "dtype unknown": lambda h: _with_tensor(h, 0, dtype="complex64"),
    "dtype a list": lambda h: _with_tensor(h, 0, dtype=["float32"]),
    "weights digest of other weights": lambda h: {**h, "weights": "0" * 64},
    "weights digest a number": lambda h: {**h, "weights": 0},
    "tp of another rank": lambda h: {**h, "tp": {"size": 2, "rank": 1}},
    "tp size true": lambda h: {**h, "tp": {"size": True, "rank": 0}},
    "tp without rank": lambda h: {**h, "tp": {"size": 1}},
    "tp a list": lambda h: {**h, "tp": [1, 0]},
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_forged_header_refused(snap, case):
    s, _, blob = snap
    v, h, p = _split(blob)
    _refused(s, _seal(v, HEADERS[case](h), p))


RAW_HEADERS = {
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "not utf-8": b'{"config": "\xff\xfe"}',
    "utf-16": json.dumps({"a": 1}).encode("utf-16"),
    "NaN literal": b'{"position": NaN}',
    "huge integer": b'{"position": ' + b"9" * 5000 + b"}",
    "duplicate key": None,  # built from the real header below
    "empty": b"",
}


@pytest.mark.parametrize("case", list(RAW_HEADERS))
def test_malformed_header_bytes_refused(snap, case):
    s, _, blob = snap
    v, h, p = _split(blob)
    raw = RAW_HEADERS[case]
    if raw is None:  # the real header with a second "position" key: json.loads would keep the last one
        text = json.dumps(h)
        raw = (text[:-1] + ', "position": 3}').encode()
    _refused(s, _seal_raw(v, raw, p))


def _payload_with(h: dict, p: bytes, part: str, fn) -> bytes:
    k, t = _entry(h, part)
    n = int(np.prod(t["shape"])) * torch.tensor([], dtype=DTYPES[t["dtype"]]).element_size()
    x = torch.frombuffer(bytearray(p[t["offset"]:t["offset"] + n]), dtype=DTYPES[t["dtype"]]).clone()
    fn(x)
    raw = x.view(torch.uint8).numpy().tobytes()
    return p[:t["offset"]] + raw + p[t["offset"] + n:]


@pytest.mark.parametrize("part,value", [("ssm", float("nan")), ("conv", float("inf")), ("ple_conv", -float("inf"))])
def test_non_finite_state_refused(snap, part, value):
    s, _, blob = snap
    v, h, p = _split(blob)

    def poison(x):
        x[3] = value

    _refused(s, _seal(v, h, _payload_with(h, p, "." + part, poison)), "not finite")


@pytest.mark.parametrize("value", [-1, 1000, 2 ** 40])
def test_out_of_vocabulary_id_carry_refused_before_a_slot_is_taken(snap, value):
    s, _, blob = snap
    v, h, p = _split(blob)

    def oov(x):
        x[0] = value

    n = len(s.sequences)
    _refused(s, _seal(v, h, _payload_with(h, p, ".ple_ids", oov)), "vocabulary")
    assert len(s.sequences) == n and s.pool.free_slots == s.limits.max_seqs - n


def test_header_length_larger_than_any_real_header_refused(snap):
    s, _, blob = snap
    v, h, p = _split(blob)
    _refused(s, _seal(v, {**h, "config": "x" * 2_000_000}, p))


def test_restore_onto_other_weights_refused():
    """Same config, other weights (another seed of the synthetic model): refused, naming the weights; the same
    weights restore."""
    a, b, same = open_session(PLAIN, seed=0), open_session(PLAIN, seed=1), open_session(PLAIN, seed=0)
    q = a.add_sequence()
    a.prefill(q, torch.randn(4, a.cfg.stream_dim))
    blob = a.snapshot(q)
    _refused(b, blob, "other weights")
    assert same.position(same.restore(blob)) == 4


def test_round_trip_still_exact(snap):
    s, a, blob = snap
    b = s.restore(blob)
    assert s.snapshot(b) == blob
    s.release(b)
