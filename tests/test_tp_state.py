"""Per-rank state and memory under tensor parallelism: a rank's pools hold only its heads (the PLE carry whole), its
snapshots record tp size and rank and restore only on the same rank of the same size (checked before any other
header field and before a slot is touched), and the budget of `tp` ranks is what one rank really allocates."""

from __future__ import annotations

import json
import struct
import zlib

import pytest
import torch

from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import Shard, preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.state import BufferSpec
from gdn_trt.model.tp import TpError, shard_config
from gdn_trt.runtime import state as st
from gdn_trt.runtime.budget import RuntimeLimits, budget
from gdn_trt.runtime.state import SnapshotError, StatePool

SPEC = BufferSpec(torch.float32)
LIMITS = RuntimeLimits(max_seqs=5, max_prefill_tokens=64, max_draft=3, ple_cache_rows=32)


def _pool(cfg, seed: int) -> tuple[StatePool, int]:
    pool = StatePool(cfg, 3, SPEC, weights=None)
    slot = pool.allocate()
    g = torch.Generator().manual_seed(seed)
    for s in pool.layers.values():
        for t in s.tensors():
            t[slot] = torch.randn(t[slot].shape, generator=g)
    return pool, slot


@pytest.mark.parametrize("name", ["tiny-next-tp", "tiny-4exp-tp"])
def test_rank_pools_hold_only_its_heads(name):
    cfg = preset(name)
    for n in (2, 4):
        pool = StatePool(shard_config(cfg, Shard(n, n - 1)), 2, SPEC)
        for i, s in pool.layers.items():
            HV, K, V = cfg.ssm_state_shape
            assert s.ssm.shape == (2, HV // n, K, V)
            assert s.conv.shape == (2, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim // n)
            if cfg.has_ple(i):  # the PLE carry spans the whole streams on every rank
                assert s.ple_conv.shape == (2, *cfg.ple_conv_state_shape)


def test_snapshot_restores_only_on_its_rank_and_tp_size():
    cfg = preset("tiny-4exp-tp")
    pools = {(n, r): _pool(shard_config(cfg, Shard(n, r)), seed=10 * n + r) for n in (1, 2, 4) for r in range(n)}
    blobs = {k: p.encode(p.read_slot(slot, 7)) for k, (p, slot) in pools.items()}
    for k, (p, slot) in pools.items():
        back = p.decode(blobs[k])
        assert all(torch.equal(a, b) for a, b in zip(back.tensors, p.read_slot(slot, 7).tensors))
        header = json.loads(blobs[k][st._PREFIX.size:st._PREFIX.size + st._PREFIX.unpack_from(blobs[k])[2]])
        assert header["tp"] == {"size": k[0], "rank": k[1]}
    for (n, r), (p, _) in pools.items():
        for (m, q), blob in blobs.items():
            if (m, q) == (n, r):
                continue
            with pytest.raises(SnapshotError, match=rf"rank {q} of tp={m}, this pool holds rank {r} of tp={n}"):
                p.decode(blob)


def test_a_relabelled_rank_snapshot_is_refused_by_the_config_hash():
    """A snapshot of rank 1 re-labelled rank 0 passes the tp check, and the config hash (the rank is in it)
    refuses it."""
    cfg = preset("tiny-next-tp")
    p0, _ = _pool(shard_config(cfg, Shard(2, 0)), seed=1)
    p1, s1 = _pool(shard_config(cfg, Shard(2, 1)), seed=2)
    blob = p1.encode(p1.read_slot(s1, 3))
    _, version, hlen = st._PREFIX.unpack_from(blob)
    header = json.loads(blob[st._PREFIX.size:st._PREFIX.size + hlen])
    forged = json.dumps({**header, "tp": {"size": 2, "rank": 0}}).encode()
    body = st._PREFIX.pack(st.MAGIC, version, len(forged)) + forged + blob[st._PREFIX.size + hlen:-4]
    with pytest.raises(SnapshotError, match="taken with config"):
        p0.decode(body + struct.pack("<I", zlib.crc32(body)))


@pytest.mark.parametrize("name", ["tiny-next-tp", "tiny-3.5-tp", "tiny-4exp-tp"])
def test_budget_of_a_rank_is_what_the_rank_allocates(name, tmp_path):
    cfg = preset(name)
    make_synthetic_checkpoint(name, tmp_path, seed=3)
    for n in (2, 4):
        rank_cfg = shard_config(cfg, Shard(n, 1))
        b = budget(cfg, LIMITS, "float32", graphs=False, tp=n)
        assert b.cfg == shard_config(cfg, Shard(n, 0)) and f"per rank of tp={n}" in b.table()
        rows = {r.item.split(" (")[0]: r.device for r in b.rows}
        pool = StatePool(rank_cfg, LIMITS.max_seqs, SPEC)
        assert rows["state pools"] == sum(t.numel() * t.element_size() for s in pool.layers.values()
                                          for t in s.tensors())
        ck = load_checkpoint(tmp_path, Shard(n, 1))
        layers = [GdnLayer(ck.config, lw, torch.float32) for lw in ck.layers]
        assert rows["weights"] == sum(t.numel() * t.element_size() for m in layers for t in m.buffers())
        whole = {r.item.split(" (")[0]: r.device for r in budget(cfg, LIMITS, "float32", graphs=False).rows}
        if not cfg.is_hc:  # no PLE carry: the state splits evenly
            assert rows["state pools"] * n == whole["state pools"]
        if cfg.ple_layer_ids:  # PLE staging is replicated
            assert rows["PLE staging"] == whole["PLE staging"]
    with pytest.raises(TpError, match="valid tensor-parallel sizes are 1, 2, 4"):
        budget(cfg, LIMITS, "float32", graphs=False, tp=3)
