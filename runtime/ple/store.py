"""The PLE row table on the host: memory-mapped (a flat file, or the HF shards in place) with a bounded LRU cache of
hot rows.

The table (Qwen4-Exp: 320M rows x 160, ~100 GB bf16) never has to fit in RAM: rows are read from the file
mapping on a miss (the "NVMe fault-in") and the most recently used ones are kept in a fixed-size host cache,
since n-gram accesses are Zipfian (docs/math.md#host-side). Addresses depend only on token ids, so a step's
rows are all known before the layer runs and are gathered here in one call.

Counting (`StoreCounters`): a `gather` is atomic. Every row reference it serves is either a hit (the row was
cached when the gather started, or it is a repeat of a row this gather already read) or a miss (the first
reference to a row that was not cached; the row is read from the file exactly once per gather). So
`hits + misses` = references served and `bytes_read = misses * row_bytes`. Recency: a gather first touches its
cached rows, then inserts its new ones (evicting the least recently used), each group in the order of first
occurrence in row-major `rows`.

Not thread-safe: one stager owns a store.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.checkpoint import PleTable

from .lru import Lru

# raw integer dtype of each element size: numpy has no bfloat16, so rows are read as bits and viewed in torch
_RAW = {2: np.int16, 4: np.int32}


@dataclass(frozen=True)
class StoreCounters:
    hits: int = 0
    misses: int = 0
    bytes_read: int = 0  # bytes read from the file mapping (misses * row_bytes)
    evictions: int = 0
    resident: int = 0  # rows in the cache now


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or dt.itemsize not in _RAW:
        raise ValueError(f"unsupported PLE table dtype {name!r}; expected bfloat16, float16 or float32")
    return dt


class RowStore:
    """`table` memory-mapped read-only, with an LRU cache of `capacity` rows.

    Give the capacity as `cache_rows` or as `cache_bytes` (rounded down to whole rows), not both; 0 disables the
    cache (every distinct row of a gather is read from the file).
    """

    def __init__(self, table: PleTable, cache_rows: int | None = None, cache_bytes: int | None = None):
        if (cache_rows is None) == (cache_bytes is None):
            raise ValueError("give the cache capacity as exactly one of cache_rows or cache_bytes")
        self.table = table
        self.dtype = _torch_dtype(table.dtype)
        self.rows, self.dim = int(table.rows), int(table.dim)
        self.row_bytes = self.dim * self.dtype.itemsize
        cap = cache_rows if cache_rows is not None else int(cache_bytes) // self.row_bytes
        if cap < 0:
            raise ValueError(f"cache capacity must be >= 0, got {cap}")
        self.capacity = int(cap)
        # one read-only mapping per file; a segment is a row range of one file (flat file, or a safetensors shard)
        self._maps: dict[Path, mmap.mmap] = {}
        self._segments: list[np.ndarray] = []
        starts = [0]
        for seg in table.parts():
            path = Path(seg.path)
            size = path.stat().st_size
            need = seg.offset + seg.rows * self.row_bytes
            # a flat file must hold exactly the table; a shard's data section is followed by other tensors
            if seg.rows <= 0 or self.dim <= 0 or size < need or (not table.segments and size != need):
                raise ValueError(f"{path}: {size} bytes, expected {seg.rows} rows x {self.dim} x "
                                 f"{self.dtype.itemsize} from byte {seg.offset}")
            if path not in self._maps:
                with open(path, "rb") as f:
                    self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                if hasattr(mmap, "MADV_RANDOM"):
                    # rows are scattered: kernel read-ahead would pull ~128 KiB around every 320-byte row
                    self._maps[path].madvise(mmap.MADV_RANDOM)
            self._segments.append(np.frombuffer(self._maps[path], dtype=_RAW[self.dtype.itemsize],
                                                count=seg.rows * self.dim, offset=seg.offset).reshape(seg.rows,
                                                                                                     self.dim))
            starts.append(starts[-1] + seg.rows)
        if starts[-1] != self.rows:
            raise ValueError(f"table segments hold {starts[-1]} rows, the table declares {self.rows}")
        self._starts = np.array(starts, dtype=np.int64)
        self._cache = torch.empty((self.capacity, self.dim), dtype=self.dtype)
        self._lru = Lru(self.capacity)
        self._hits = self._misses = self._evictions = 0

    # ---- public ----
    def gather(self, rows: object, out: Tensor) -> Tensor:
        """Rows of the table into `out`: rows [...] integer (e.g. [T, heads]) -> out [..., dim] (returned).

        `out` is caller-owned (e.g. a pinned staging buffer): CPU, contiguous, the table's dtype, shape
        `rows.shape + (dim,)`. Bad input raises before any counter or cache entry changes.
        """
        self.gather_flat(self._check(rows, out), out.view(-1, self.dim))
        return out

    def gather_flat(self, idx: np.ndarray, flat: Tensor) -> Tensor:
        """`gather` without its checks, for rows the caller computed itself (the PLE hash: always in range):
        idx [n] int64 -> flat [n, dim] (a CPU tensor of the table's dtype, or a view of one)."""
        if idx.size == 0:
            return flat
        u = self._lru.update(idx)
        new_vals, alive = None, np.zeros(0, dtype=bool)
        if u.uniq_new.size:
            # the distinct new rows, read from the file once each in ascending offset order
            order = np.argsort(u.uniq_new, kind="stable")
            raw = np.empty((u.uniq_new.size, self.dim), dtype=_RAW[self.dtype.itemsize])
            raw[order] = self._read(u.uniq_new[order])
            new_vals = torch.from_numpy(raw).view(self.dtype)
            alive = u.slot_new >= 0
        if u.ref_slot is None:
            # more rows than the cache holds: serve each reference from where its value is before the cache changes
            hits, miss = np.flatnonzero(u.slot >= 0), np.flatnonzero(u.slot < 0)
            flat[torch.from_numpy(hits)] = self._cache[torch.from_numpy(u.slot[hits])]
            srt = np.argsort(u.uniq_new, kind="stable")
            which = srt[np.searchsorted(u.uniq_new[srt], idx[miss])]
            flat[torch.from_numpy(miss)] = new_vals[torch.from_numpy(which)]
        if alive.any():
            self._cache[torch.from_numpy(u.slot_new[alive])] = new_vals[torch.from_numpy(np.flatnonzero(alive))]
        if u.ref_slot is not None:
            torch.index_select(self._cache, 0, torch.from_numpy(u.ref_slot), out=flat)
        self._hits += idx.size - u.uniq_new.size
        self._misses += u.uniq_new.size
        self._evictions += u.evictions
        return flat

    def counters(self) -> StoreCounters:
        return StoreCounters(self._hits, self._misses, self._misses * self.row_bytes, self._evictions,
                             self._lru.resident)

    def cached_rows(self) -> list[int]:
        """Rows in the cache, least recently used first (diagnostics and tests)."""
        return self._lru.order().tolist()

    def close(self) -> None:
        """Release the mappings (arrays viewing them must go first, or mmap refuses to close)."""
        self._segments = []
        for m in self._maps.values():
            m.close()

    def _read(self, rows: np.ndarray) -> np.ndarray:
        """Rows (ascending) from their segments' mappings -> [len(rows), dim] raw integers."""
        seg = np.searchsorted(self._starts, rows, side="right") - 1
        out = np.empty((rows.size, self.dim), dtype=_RAW[self.dtype.itemsize])
        for k in np.unique(seg).tolist():
            pick = seg == k
            out[pick] = self._segments[k][rows[pick] - self._starts[k]]
        return out

    def __enter__(self) -> "RowStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----
    def _check(self, rows: object, out: Tensor) -> np.ndarray:
        if isinstance(rows, Tensor):
            if rows.device.type != "cpu":
                raise ValueError(f"rows must be on the CPU (host-side hash), got {rows.device}")
            rows = rows.numpy()
        r = np.asarray(rows)
        if r.dtype == np.bool_ or not np.issubdtype(r.dtype, np.integer):
            raise TypeError(f"rows must be integers, got dtype {r.dtype}")
        if not isinstance(out, Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != self.dtype:
            raise TypeError(f"out has dtype {out.dtype}, the table holds {self.dtype}")
        want = tuple(r.shape) + (self.dim,)
        if tuple(out.shape) != want:
            raise ValueError(f"out must have shape {want} (rows.shape + (dim,)), got {tuple(out.shape)}")
        if out.device.type != "cpu" or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous CPU tensor, got device {out.device}, "
                             f"contiguous={out.is_contiguous()}")
        idx = r.astype(np.int64, copy=False).reshape(-1)
        bad = (idx < 0) | (idx >= self.rows)
        if bad.any():
            raise IndexError(f"rows {idx[bad][:4].tolist()} out of range [0, {self.rows})")
        return idx
