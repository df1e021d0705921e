"""Snapshot format: exact round trips, and every kind of bad blob rejected with a clear error, nothing changed.

Truncations and flipped bytes anywhere fail the checksum; blobs re-sealed with a valid checksum but another format
version, layout, config, dtype or tensor list fail the header checks, each naming what differs.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import torch

from gdn_trt.runtime import state as st
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.state import SnapshotError

from .test_runtime_support import HC_PLE, PLAIN, fingerprint, inputs, open_session


@pytest.fixture(scope="module")
def snap():
    s = open_session(HC_PLE)
    h, ids = inputs(s, 9, seed=0)
    a = s.add_sequence()
    s.prefill(a, h[:8], token_ids=ids[:8])
    s.decode({a: h[8:9]}, {a: ids[8:9]})
    return s, a, s.snapshot(a)


def _split(blob: bytes) -> tuple[int, dict, bytes]:
    magic, version, hlen = st._PREFIX.unpack_from(blob)
    start = st._PREFIX.size
    return version, json.loads(blob[start:start + hlen]), blob[start + hlen:-4]


def _seal(version: int, header: dict, payload: bytes, magic: bytes = st.MAGIC) -> bytes:
    h = json.dumps(header).encode()
    body = st._PREFIX.pack(magic, version, len(h)) + h + payload
    return body + struct.pack("<I", zlib.crc32(body))


def test_round_trip_is_exact(snap):
    s, a, blob = snap
    b = s.restore(blob)
    assert s.position(b) == s.position(a) == 9
    assert s.snapshot(b) == blob
    _, header, _ = _split(blob)
    names = [t["name"] for t in header["tensors"]]
    assert "layer1.ple_conv" in names and "layer1.ple_ids" in names  # both PLE carries, same token boundary
    assert header["config_hash"] == s.cfg.config_hash() and header["position"] == 9
    s.release(b)


@pytest.mark.parametrize("cut", [0, 6, 11, 40, -300, -5, -1])
def test_truncated_rejected(snap, cut):
    s, _, blob = snap
    before = fingerprint(s)
    with pytest.raises(SnapshotError, match="truncated|checksum"):
        s.restore(blob[:cut])
    assert fingerprint(s) == before


def test_every_flipped_byte_position_rejected(snap):
    s, _, blob = snap
    before = fingerprint(s)
    step = max(1, len(blob) // 97)
    for i in list(range(0, len(blob), step)) + [len(blob) - 1]:
        b = bytearray(blob)
        b[i] ^= 0x01
        with pytest.raises(SnapshotError):
            s.restore(bytes(b))
    assert fingerprint(s) == before


@pytest.mark.parametrize("change,fragment", [
    (lambda v, h, p: (v + 1, h, p), "format version"),
    (lambda v, h, p: (v, {**h, "layout": "ssm [HV, V, K]"}, p), "layout"),
    (lambda v, h, p: (v, {**h, "config_hash": "0" * 16}, p), "config"),
    (lambda v, h, p: (v, {**h, "position": -3}, p), "position"),
    (lambda v, h, p: (v, {**h, "tensors": h["tensors"][:-1]}, p), "tensors"),
    (lambda v, h, p: (v, {**h, "tensors": [{**h["tensors"][1], "shape": [6, 8, 12]}] + h["tensors"][1:]}, p),
     "layer0.conv"),
    (lambda v, h, p: (v, h, p[:-8]), "payload"),
])
def test_resealed_header_mismatch_rejected(snap, change, fragment):
    s, _, blob = snap
    blob2 = _seal(*change(*_split(blob)))
    before = fingerprint(s)
    with pytest.raises(SnapshotError, match=fragment):
        s.restore(blob2)
    assert fingerprint(s) == before


def test_wrong_magic_rejected(snap):
    s, _, blob = snap
    with pytest.raises(SnapshotError, match="magic"):
        s.restore(_seal(*_split(blob), magic=b"NOTSNAP"))


def test_snapshot_of_another_config_rejected(snap):
    s, _, _ = snap
    p = open_session(PLAIN)
    q = p.add_sequence()
    p.prefill(q, torch.randn(3, p.cfg.stream_dim))
    before = fingerprint(s)
    with pytest.raises(SnapshotError, match="tiny-3.5"):
        s.restore(p.snapshot(q))
    assert fingerprint(s) == before and s.stats().rejected_snapshots >= 1


def test_snapshot_of_another_dtype_rejected():
    """Same config, bf16 conv state: the tensor entries differ, so the restore names the dtype."""
    f32, bf16 = open_session(PLAIN), open_session(PLAIN, dtype=torch.bfloat16)
    q = bf16.add_sequence()
    bf16.prefill(q, torch.randn(3, bf16.cfg.stream_dim, dtype=torch.bfloat16))
    before = fingerprint(f32)
    with pytest.raises(SnapshotError, match="bfloat16"):
        f32.restore(bf16.snapshot(q))
    assert fingerprint(f32) == before


def test_capture_blob_restores_with_its_position_and_carries():
    s = open_session(HC_PLE)
    h, ids = inputs(s, 10, seed=3)
    a = s.add_sequence()
    res = s.prefill_batch({a: Prompt(h, ids, capture_at=4)})[a]
    r = s.restore(res.capture)
    assert s.position(r) == 4
    carry = s.feeds.carry[1][s._seqs[r].slot]
    assert carry.tolist() == ids[2:4].tolist()
