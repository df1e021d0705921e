"""The PLE row cache's index: which table row sits in which cache slot, and the least-recently-used order, in numpy
arrays so that a gather of thousands of row references costs a few vectorized operations, not one Python dict
operation per row (a 256-sequence Qwen4-Exp decode step references 4096 rows per PLE layer: the dict and
`OrderedDict.move_to_end` loops of the first version took about 1 ms of host time per step on the CPU machine).

- `row -> slot`: open addressing with linear probing over P >= 4 x capacity entries (load <= 1/4, so a lookup
  probes about 1.2 entries), deleted entries marked as tombstones; the table is rebuilt when tombstones pass P/4.
- recency: every slot has a stamp (the tick of its last use); a queue of (slot, stamp) records appended in stamp
  order gives the least recently used slot as the first record from the head whose stamp is still the slot's own
  (later uses of a slot leave its older records stale). The queue is compacted when it fills.

`Lru.update(refs)` applies one gather with the policy of `store.py`'s docstring (touch the gather's cached rows in
first-occurrence order, then insert its new rows in first-occurrence order, each eviction taking the least recently
used slot) and says where every row goes; the store moves the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_EMPTY, _TOMB = -1, -2
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of row * 2^64/phi spread any row pattern


@dataclass(frozen=True)
class Update:
    """One gather's outcome. refs [n]: the row references in order; `uniq_new [m]`: the distinct rows that were not
    cached, in first-occurrence order, and `new_ref [m]`: the index of each one's first reference; `slot_new [m]`:
    the cache slot each new row ends in (-1: evicted again by a later new row of the same gather, or no cache);
    `ref_slot [n]`: the cache slot of each reference when every row of the gather is cached at its end, else None;
    `slot [n]`: the cache slot each reference found its row in when the gather started (-1: not cached);
    `evictions`: slots taken from a row."""

    slot: np.ndarray
    ref_slot: np.ndarray | None
    uniq_new: np.ndarray
    new_ref: np.ndarray
    slot_new: np.ndarray
    evictions: int


class Lru:
    """The index of a cache of `capacity` slots (see the module docstring)."""

    def __init__(self, capacity: int):
        self.capacity = C = int(capacity)
        bits = max(4, int(np.ceil(np.log2(max(4 * C, 16)))))
        self._shift = np.uint64(64 - bits)
        self._P = 1 << bits
        self._key = np.full(self._P, _EMPTY, dtype=np.int64)
        self._val = np.zeros(self._P, dtype=np.int64)
        self._tombs = 0
        self.row_of = np.full(C, -1, dtype=np.int64)  # slot -> row (-1 = free)
        self.stamp = np.full(C, -1, dtype=np.int64)
        self.size = 0  # slots 0..size-1 are taken: an eviction always reuses the victim's slot
        self._tick = 0
        Q = max(64, 8 * C)
        self._q_slot = np.zeros(Q, dtype=np.int64)
        self._q_stamp = np.zeros(Q, dtype=np.int64)
        self._head = self._tail = 0
        self._at = np.arange(0, dtype=np.int64)

    # ---- the row -> slot table ----
    def _home(self, rows: np.ndarray) -> np.ndarray:
        return ((rows.astype(np.uint64) * _MIX) >> self._shift).astype(np.int64)

    def _find(self, rows: np.ndarray) -> np.ndarray:
        """Table position of each row, -1 where it is absent."""
        pos = np.full(rows.size, -1, dtype=np.int64)
        todo, h = np.arange(rows.size), self._home(rows)
        mask = self._P - 1
        while todo.size:
            k = self._key[h]
            found = k == rows[todo]
            pos[todo[found]] = h[found]
            go = ~found & (k != _EMPTY)
            todo, h = todo[go], (h[go] + 1) & mask
        return pos

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """Cache slot of each row, -1 where it is not cached."""
        if self.size == 0:
            return np.full(rows.size, -1, dtype=np.int64)
        h = self._home(rows)
        k = self._key[h]
        found = k == rows
        out = np.where(found, self._val[h], -1)
        # at load <= 1/4 most rows sit at their home entry; the others probe on from there
        todo = np.flatnonzero(~found & (k != _EMPTY))
        mask = self._P - 1
        h = (h[todo] + 1) & mask
        while todo.size:
            k = self._key[h]
            found = k == rows[todo]
            out[todo[found]] = self._val[h[found]]
            go = ~found & (k != _EMPTY)
            todo, h = todo[go], (h[go] + 1) & mask
        return out

    def _insert(self, rows: np.ndarray, slots: np.ndarray) -> None:
        """Insert distinct rows that are absent; each claims the first free entry of its probe sequence."""
        todo, h = np.arange(rows.size), self._home(rows)
        mask = self._P - 1
        while todo.size:
            free = self._key[h] < 0
            # of several rows probing the same free entry, the first takes it; the rest probe on
            hf, first = np.unique(h[free], return_index=True)
            win = np.flatnonzero(free)[first]
            self._tombs -= int((self._key[hf] == _TOMB).sum())
            self._key[hf], self._val[hf] = rows[todo[win]], slots[todo[win]]
            lose = np.ones(todo.size, dtype=bool)
            lose[win] = False
            todo, h = todo[lose], np.where(free[lose], h[lose], (h[lose] + 1) & mask)

    def _delete(self, rows: np.ndarray) -> None:
        pos = self._find(rows)
        self._key[pos] = _TOMB
        self._tombs += rows.size
        if self._tombs > self._P // 4:
            live = self.row_of[: self.size]
            keep = live >= 0
            self._key.fill(_EMPTY)
            self._tombs = 0
            self._insert(live[keep], np.flatnonzero(keep))

    def _arange(self, n: int) -> np.ndarray:
        if self._at.size < n:
            self._at = np.arange(max(n, 2 * self._at.size), dtype=np.int64)
        return self._at[:n]

    # ---- recency ----
    def _push(self, slots: np.ndarray, stamps: np.ndarray) -> None:
        n = slots.size
        if self._tail + n > self._q_slot.size:
            self._compact(n)
        self._q_slot[self._tail:self._tail + n] = slots
        self._q_stamp[self._tail:self._tail + n] = stamps
        self._tail += n

    def _compact(self, room: int) -> None:
        s, t = self._q_slot[self._head:self._tail], self._q_stamp[self._head:self._tail]
        keep = self.stamp[s] == t
        s, t = s[keep], t[keep]
        if s.size + room > self._q_slot.size:
            size = 2 * (s.size + room)
            self._q_slot, self._q_stamp = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
        self._q_slot[:s.size], self._q_stamp[:s.size] = s, t
        self._head, self._tail = 0, s.size

    def _victims(self, k: int) -> np.ndarray:
        """The k least recently used slots, in order (k <= size), taken off the queue."""
        out, want = [np.zeros(0, dtype=np.int64)], k
        while want:
            end = min(self._tail, self._head + 2 * want + 64)
            s = self._q_slot[self._head:end]
            ok = np.flatnonzero(self.stamp[s] == self._q_stamp[self._head:end])
            take = ok[:want]
            if take.size < want and end == self._tail:
                raise RuntimeError("PLE cache index: fewer live slots than its size says (a bug)")
            out.append(s[take])
            want -= take.size
            self._head = self._head + int(take[-1]) + 1 if want == 0 else end
        return np.concatenate(out)

    @property
    def resident(self) -> int:
        return self.size

    def order(self) -> np.ndarray:
        """Cached rows, least recently used first."""
        taken = np.flatnonzero(self.row_of[: self.size] >= 0)
        return self.row_of[taken[np.argsort(self.stamp[taken], kind="stable")]]

    # ---- one gather ----
    def update(self, refs: np.ndarray) -> Update:
        n, C = refs.size, self.capacity
        slot = self.lookup(refs)
        hit = slot >= 0
        if C and hit.all():  # the steady state of a decode loop: touch only, no index change
            stamps = self._tick + self._arange(n)
            self._tick += 2 * n
            self.stamp[slot[::-1]] = stamps[::-1]  # reversed: a slot keeps its first reference's stamp
            self._push(slot, stamps)  # a repeated slot's later records are stale: the queue skips them
            none = stamps[:0]
            return Update(slot, slot, none, none, none, 0)
        miss_refs = np.flatnonzero(~hit)
        uniq, first = np.unique(refs[miss_refs], return_index=True)
        order = np.argsort(first, kind="stable")
        uniq_new, new_ref = uniq[order], miss_refs[first[order]]
        m = uniq_new.size
        if C == 0:
            return Update(slot, None, uniq_new, new_ref, np.full(m, -1, dtype=np.int64), 0)
        tick = self._tick
        self._tick += 2 * n
        hits = np.flatnonzero(hit)
        if hits.size:  # each slot keeps the stamp of its first reference (reversed assignment: first one wins)
            self.stamp[slot[hits[::-1]]] = tick + hits[::-1]
            first = self.stamp[slot[hits]] == tick + hits  # repeats would only add stale records
            self._push(slot[hits[first]], tick + hits[first])
        free = C - self.size
        evictions = max(0, m - free)
        seq = np.arange(self.size, self.size + min(m, free))
        kept = True  # every row of the gather still cached at its end (no victim was touched by it)
        if evictions:
            victims = self._victims(min(evictions, self.size))
            kept = bool((self.stamp[victims] < tick).all()) and m <= C
            gone = self.row_of[victims]
            self.row_of[victims] = -1
            self._delete(gone)
            seq = np.concatenate([seq, victims])
        # new row q takes seq[q]; past C new rows, each evicts the new row inserted C before it
        slot_new = seq[np.arange(m) % C] if m else seq[:0]
        alive = np.arange(m) >= m - C
        self.size = min(C, self.size + m)
        stamps = tick + n + new_ref
        self.row_of[slot_new[alive]] = uniq_new[alive]
        self.stamp[slot_new[alive]] = stamps[alive]
        self._insert(uniq_new[alive], slot_new[alive])
        self._push(slot_new, stamps)
        slot_new = np.where(alive, slot_new, -1)
        ref_slot = None
        if kept:
            ref_slot = slot.copy()
            ref_slot[miss_refs] = self.lookup(refs[miss_refs])
        return Update(slot, ref_slot, uniq_new, new_ref, slot_new, evictions)
