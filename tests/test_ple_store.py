"""PLE row store: gathered rows == the table read directly, exact LRU hit/miss/eviction counts, bad input."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from gdn_trt.model.checkpoint import PleTable, load_checkpoint, load_table, make_synthetic_checkpoint
from gdn_trt.model.config import preset
from gdn_trt.runtime.ple.store import RowStore, StoreCounters


def _table(tmp_path: Path, rows: int, dim: int, dtype: str, seed: int = 0) -> PleTable:
    t = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)).to(getattr(torch, dtype))
    path = tmp_path / f"table-{dtype}-{rows}x{dim}.bin"
    t.view(torch.uint8).numpy().tofile(path)
    return PleTable(path, rows, dim, dtype)


def _gather(store: RowStore, rows: list) -> torch.Tensor:
    r = np.asarray(rows, dtype=np.int64)
    return store.gather(r, torch.empty(r.shape + (store.dim,), dtype=store.dtype))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_gather_equals_table(tmp_path: Path, dtype: str) -> None:
    t = _table(tmp_path, 300, 12, dtype)
    ref = load_table(t)
    rng = np.random.default_rng(0)
    with RowStore(t, cache_rows=40) as store:
        for _ in range(30):  # enough churn that cached rows, fresh rows and evicted slots all get served
            rows = rng.integers(0, 300, (int(rng.integers(1, 9)), 4))
            rows[0, 0] = rows[-1, -1]  # a duplicate inside the gather
            out = torch.full(rows.shape + (12,), float("nan"), dtype=ref.dtype)
            got = store.gather(rows, out)
            assert got is out and got.dtype == ref.dtype
            assert torch.equal(out.view(-1, 12), ref[torch.from_numpy(rows.reshape(-1))])
        c = store.counters()
        assert c.resident <= 40 and len(store.cached_rows()) == c.resident
        assert c.bytes_read == c.misses * 12 * ref.element_size()


def test_synthetic_checkpoint_table(tmp_path: Path) -> None:
    """The table file the checkpoint writer produces (bf16 variant of the hc+PLE preset) reads back row for row."""
    cfg = preset("tiny-4exp").replace(dtype="bfloat16")
    ckpt = load_checkpoint(make_synthetic_checkpoint(cfg, tmp_path / "ckpt"))
    t = ckpt.ple_tables[1]
    ref = load_table(t)
    store = RowStore(t, cache_rows=16)
    assert store.dtype == torch.bfloat16 and (store.rows, store.dim) == tuple(ref.shape)
    rows = np.arange(t.rows).reshape(-1, 4)[::-1].copy()
    out = _gather(store, rows.tolist())
    assert torch.equal(out.view(-1, t.dim), ref[torch.from_numpy(rows.reshape(-1))])


def test_scripted_lru_counts(tmp_path: Path) -> None:
    """Worked by hand from the documented policy (capacity 3)."""
    t = _table(tmp_path, 20, 4, "float32")
    ref = load_table(t)
    store = RowStore(t, cache_rows=3)
    script = [
        # rows,             hits, misses, evictions, cached (LRU first)
        ([[0, 1], [2, 0]],  1, 3, 0, [0, 1, 2]),  # repeat of 0 inside the gather is served from memory
        ([[1]],             2, 3, 0, [0, 2, 1]),
        ([[3, 4]],          2, 5, 2, [1, 3, 4]),  # evicts 0, then 2
        ([[0], [1]],        3, 6, 3, [4, 1, 0]),  # touch 1 first, then insert 0 evicting 3
        ([[5, 6, 7, 8]],    3, 10, 7, [6, 7, 8]),  # more new rows than capacity: the last three stay
        ([[8, 5, 8]],       5, 11, 8, [7, 8, 5]),
    ]
    for rows, hits, misses, ev, cached in script:
        out = _gather(store, rows)
        assert torch.equal(out.view(-1, 4), ref[torch.tensor(rows).reshape(-1)])
        assert store.counters() == StoreCounters(hits, misses, misses * 16, ev, len(cached)), rows
        assert store.cached_rows() == cached, rows


def test_no_cache_and_byte_capacity(tmp_path: Path) -> None:
    t = _table(tmp_path, 20, 4, "bfloat16")  # 8-byte rows
    store = RowStore(t, cache_rows=0)
    _gather(store, [[1, 1, 2]])
    _gather(store, [[1, 1, 2]])
    assert store.counters() == StoreCounters(hits=2, misses=4, bytes_read=32, evictions=0, resident=0)
    by_bytes = RowStore(t, cache_bytes=3 * 8 + 7)
    assert by_bytes.capacity == 3
    _gather(by_bytes, [[0, 1, 2, 3, 4]])
    assert by_bytes.cached_rows() == [2, 3, 4]
    _gather(by_bytes, [[4, 3]])
    assert by_bytes.counters() == StoreCounters(hits=2, misses=5, bytes_read=40, evictions=2, resident=3)


def test_empty_gather(tmp_path: Path) -> None:
    store = RowStore(_table(tmp_path, 10, 4, "float32"), cache_rows=2)
    out = store.gather(np.zeros((0, 3), dtype=np.int64), torch.empty(0, 3, 4))
    assert out.shape == (0, 3, 4) and store.counters() == StoreCounters()


def test_bad_input_changes_nothing(tmp_path: Path) -> None:
    t = _table(tmp_path, 10, 4, "bfloat16")
    store = RowStore(t, cache_rows=4)
    _gather(store, [[1, 2]])
    before, cached = store.counters(), store.cached_rows()
    good = torch.zeros(1, 2, 4, dtype=torch.bfloat16)
    bad_calls = [
        (IndexError, "out of range", lambda: store.gather(np.array([[3, 10]]), good.clone())),
        (IndexError, "out of range", lambda: store.gather(torch.tensor([[-1, 3]]), good.clone())),
        (TypeError, "integers", lambda: store.gather(np.array([[1.0, 2.0]]), good.clone())),
        (TypeError, "dtype", lambda: store.gather(np.array([[3, 4]]), torch.zeros(1, 2, 4))),
        (ValueError, "shape", lambda: store.gather(np.array([[3, 4]]), torch.zeros(2, 2, 4, dtype=torch.bfloat16))),
        (ValueError, "shape", lambda: store.gather(np.array([[3, 4]]), torch.zeros(1, 2, 5, dtype=torch.bfloat16))),
        (ValueError, "contiguous", lambda: store.gather(np.array([[3, 4]]),
                                                        torch.zeros(1, 4, 2, dtype=torch.bfloat16).transpose(1, 2))),
        (TypeError, "torch.Tensor", lambda: store.gather(np.array([[3, 4]]), np.zeros((1, 2, 4)))),
    ]
    for exc, msg, call in bad_calls:
        with pytest.raises(exc, match=msg):
            call()
        assert store.counters() == before and store.cached_rows() == cached


def test_bad_construction(tmp_path: Path) -> None:
    t = _table(tmp_path, 10, 4, "float32")
    with pytest.raises(ValueError, match="exactly one"):
        RowStore(t)
    with pytest.raises(ValueError, match="exactly one"):
        RowStore(t, cache_rows=1, cache_bytes=16)
    with pytest.raises(ValueError, match="bytes, expected"):
        RowStore(PleTable(t.path, 11, 4, "float32"), cache_rows=1)
    with pytest.raises(ValueError, match="dtype"):
        RowStore(PleTable(t.path, 10, 4, "int8"), cache_rows=1)


class _Reference:
    """The documented policy written the plain way (an OrderedDict): the oracle of the array-based index."""

    def __init__(self, capacity: int):
        self.capacity, self.lru, self.hits, self.misses, self.evictions = capacity, OrderedDict(), 0, 0, 0

    def gather(self, rows: list[int]) -> None:
        seen: list[int] = []
        for r in rows:
            if r not in seen:
                seen.append(r)
        cached = [r for r in seen if r in self.lru]
        new = [r for r in seen if r not in self.lru]
        self.hits += len(rows) - len(new)
        self.misses += len(new)
        for r in cached:
            self.lru.move_to_end(r)
        if self.capacity == 0:
            return
        for r in new:
            if len(self.lru) >= self.capacity:
                self.lru.popitem(last=False)
                self.evictions += 1
            self.lru[r] = True


@pytest.mark.parametrize("capacity", [0, 1, 3, 64])
def test_random_gathers_follow_the_policy(tmp_path: Path, capacity: int) -> None:
    """Thousands of Zipf-distributed references (repeats, churn past the capacity, enough deletions to rebuild the
    row table and compact the recency queue): counters, cache order and rows equal the plain reference's."""
    t = _table(tmp_path, 3000, 4, "float32")
    ref_rows = load_table(t)
    store, ref = RowStore(t, cache_rows=capacity), _Reference(capacity)
    rng = np.random.default_rng(capacity)
    for k in range(400):
        rows = (rng.zipf(1.4, int(rng.integers(1, 120))) + k) % 3000
        out = _gather(store, rows.tolist())
        ref.gather(rows.tolist())
        assert torch.equal(out, ref_rows[torch.from_numpy(rows)])
        c = store.counters()
        assert (c.hits, c.misses, c.evictions, c.resident) == (ref.hits, ref.misses, ref.evictions, len(ref.lru)), k
        assert store.cached_rows() == list(ref.lru), k
