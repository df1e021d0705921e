"""Helpers shared by the runtime tests (no tests here): sessions on the tiny presets, inputs, the plain sequential
reference (`GdnLayer.forward_sequence` chained over the stack) and a fingerprint of every piece of session state."""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.select import GraphPolicy
from gdn_trt.runtime.session import Session, SessionOptions

PLAIN, HC_PLE = "tiny-3.5", "tiny-4exp"
LIMITS = RuntimeLimits(max_seqs=6, max_prefill_tokens=96, max_draft=4, ple_cache_rows=64)


def open_session(name: str, limits: RuntimeLimits = LIMITS, **kw) -> Session:
    return Session.open(name, backend="torch", device="cpu", options=SessionOptions(limits=limits, **kw))


def pad_to_buckets(sess: Session) -> Session:
    """Give `sess` CUDA-graph buckets 1, 3 and 6 for decode and verify groups (verify at max_draft rows a sequence):
    on the CPU, whose engines veto capture, its layers then run eagerly on the padded rows."""
    sess.selector.policy = GraphPolicy(True, (1, 3, 6), True, sess.limits.max_draft)
    sess.selector._memo.clear()
    return sess


def inputs(sess: Session, n: int, seed: int) -> tuple[torch.Tensor, np.ndarray | None]:
    """hidden [n, stream_dim] and, for PLE models, token ids [n] (with an EOS in the middle, to cross segments)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, sess.cfg.stream_dim, generator=g, dtype=torch.float32)
    if sess.feeds is None:
        return h, None
    ids = torch.randint(0, sess.cfg.vocab_size, (n,), generator=g).numpy()
    if n > 4:
        ids[n // 2] = sess.cfg.eos_token_id
    return h, ids


def sub(ids: np.ndarray | None, a: int, b: int):
    return None if ids is None else ids[a:b]


def tok(ids: np.ndarray | None, seq: int, a: int, b: int) -> dict | None:
    return None if ids is None else {seq: ids[a:b]}


def reference(sess: Session, h: torch.Tensor, ids: np.ndarray | None, layers: list | None = None) -> torch.Tensor:
    """The plain sequential computation: each layer's `forward_sequence` from a fresh state, chained; PLE rows
    hashed from a fresh EOS carry and read straight from the table file. `layers`: other weights of the same model
    (e.g. with a LoRA adapter merged); default the session's."""
    x = h
    for layer in layers or [cands[0].layer for cands in sess.selector.engines]:
        rows = None
        if layer.ple is not None:
            p = sess.feeds.stages[layer.index]
            r, _ = p.hasher.hash_sequence(ids)
            table = np.fromfile(p.store.table.path, dtype=np.float32).reshape(p.store.rows, p.store.dim)
            rows = torch.from_numpy(table[r])
        x = layer.forward_sequence(x, rows)
    return x


def slot_state(sess: Session, seq: int) -> list[torch.Tensor]:
    """Every tensor of a sequence's committed state (pools of every layer and PLE id carries)."""
    return list(sess.pool.read_slot(sess._seqs[seq].slot, sess.position(seq)).tensors)


def fingerprint(sess: Session) -> str:
    """Hash of everything a step may change: pools, stashes, captures, id carries, positions, pending verifies."""
    h = hashlib.sha256()
    for st in list(sess.pool.layers.values()) + list(sess.stack.buffers.stash.values()) + \
            list(sess.stack.buffers.capture.values()):
        for t in (x for x in (st.conv, st.ssm, st.ple_conv) if x is not None):
            h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    if sess.feeds is not None:
        for c in sess.feeds.carry.values():  # every slot's PLE id carry
            h.update(c.tobytes())
    for seq, s in sorted(sess._seqs.items()):
        h.update(repr((seq, s.slot, s.position, None if s.pending is None else
                       (s.pending.epoch, s.pending.row, s.pending.count))).encode())
    h.update(repr((sess.pool.free_slots, sess._seqs.epoch)).encode())
    return h.hexdigest()
