"""Per-step PLE prestage: hash a step's token ids, gather their rows on the host, upload them into a fixed device
buffer.

One `Prestage` per PLE layer. Per step ("hoisted input", docs/math.md#host-side):
    ids -> hash (with each sequence's host-owned id carry, all sequences at once) -> gather rows (LRU cache / file
    fault-in) into a host staging buffer (pinned when the device is CUDA) -> one non-blocking copy into
    `ple_rows [max_tokens, heads, d_h]` on the device -> id carries advanced.
`ple_rows` is allocated once and never moves, so an engine or a captured CUDA graph can bind its address; the
rows of a step occupy `ple_rows[at:at + T]` in the packed token order of the step's sequences (`put`), followed by
`pad` zero rows for the padding sequences of a CUDA-graph bucket.

Ordering rules (why the events): the copy is asynchronous, so a staging buffer must not be rewritten before the
copy that last read it has run: there are two, used in turn, each with a CUDA event recorded after its copy and
waited on before it is refilled, so the host can prepare a step while the copy of the one before is still queued
behind the GPU. `ple_rows` must not be rewritten while a graph replay may still read it (`rearm(consumed=event)`
makes the next upload wait on the replay's event on the device, without a host sync). On the CPU both are trivially
satisfied.

Carries: the keyed API (`add_carry`, `stage`) keeps them per sequence key and changes them only when a stage
succeeds, so a failed stage leaves them as they were and the runtime can snapshot (`get_carry`) and restore
(`set_carry`) them. A session keeps its carries itself, in arrays by pool slot (`feeds.PleFeeds`), and calls the
pure parts: `hasher.hash_packed` (ids and carries in, rows and new carries out) and `put` (rows in, device view out).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.checkpoint import PleTable
from gdn_trt.model.config import GdnConfig

from .hashing import NgramHasher, as_ids
from .store import RowStore


@dataclass(frozen=True)
class PrestageCounters:
    hits: int = 0  # row references served from the host cache (see store.py for the exact rule)
    misses: int = 0  # rows faulted in from the table file
    bytes_read: int = 0
    evictions: int = 0
    resident: int = 0
    uploads: int = 0  # host-to-device copies (one per non-empty stage)
    tokens: int = 0  # tokens staged
    bytes_uploaded: int = 0


class Prestage:
    """Host half of one PLE layer: id carries, hashing, row cache, staging and the fixed device buffer.

    `max_tokens`: the most tokens one step may stage (the device buffer's first dimension).
    `cache_rows`: capacity of the host row cache, in rows.
    """

    def __init__(self, cfg: GdnConfig, layer_idx: int, table: PleTable, max_tokens: int,
                 device: str | torch.device, cache_rows: int):
        self.hasher = NgramHasher.for_layer(cfg, layer_idx)
        t = self.hasher.table
        if (table.rows, table.dim) != (t.rows, t.dim):
            raise ValueError(f"layer {layer_idx}: PLE table is {table.rows}x{table.dim}, the config needs "
                             f"{t.rows}x{t.dim}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.layer_idx, self.max_tokens = layer_idx, int(max_tokens)
        self.device = torch.device(device)
        self.store = RowStore(table, cache_rows=cache_rows)
        shape = (self.max_tokens, self.hasher.heads, t.dim)
        # pinned staging lets the copy run truly asynchronously; pinning needs CUDA, and CPU targets gain nothing
        cuda = self.device.type == "cuda"
        # two, used in turn (the module docstring); the CPU runs the same path (so it holds what budget.py counts)
        self._staging = [torch.empty(shape, dtype=self.store.dtype, pin_memory=cuda) for _ in range(2)]
        self._copy_done: list[torch.cuda.Event | None] = [None] * len(self._staging)  # after each one's last upload
        self._k = 0
        self.ple_rows = torch.zeros(shape, dtype=self.store.dtype, device=self.device)
        self._consumed: torch.cuda.Event | None = None  # the next upload waits on it (set by rearm)
        self._carries: dict[Hashable, np.ndarray] = {}
        self._uploads = self._tokens = 0

    # ---- id carries ----
    def add_carry(self, key: Hashable, carry: object = None) -> None:
        """Start tracking a sequence; a fresh carry is all EOS (HF's initial id context)."""
        if key in self._carries:
            raise KeyError(f"sequence {key!r} already has a PLE id carry")
        self._carries[key] = self.hasher.initial_carry()[0] if carry is None else self._checked_carry(carry)

    def drop_carry(self, key: Hashable) -> None:
        self._known(key)
        del self._carries[key]

    def get_carry(self, key: Hashable) -> np.ndarray:
        """A copy of the sequence's id carry [ngram_size - 1] int64 (the last ids it was staged with)."""
        return self._known(key).copy()

    def set_carry(self, key: Hashable, carry: object) -> None:
        self._known(key)
        self._carries[key] = self._checked_carry(carry)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._carries

    # ---- the step ----
    def stage(self, seqs: Sequence[tuple[Hashable, object]], stream: torch.cuda.Stream | None = None) -> Tensor:
        """Rows for a step: seqs = [(key, token_ids [T_k]), ...] -> view `ple_rows[:T]` [T, heads, d_h], T = sum T_k.

        The copy is enqueued on `stream` (default: the current stream of the device), so work queued after it on
        that stream sees the rows. The returned view aliases the fixed buffer: the next stage overwrites it.
        Bad input (unknown or repeated key, too many tokens, ids outside the vocabulary) raises and changes nothing.
        """
        keys = [k for k, _ in seqs]
        for k in keys:
            self._known(k)
        if len(set(keys)) != len(keys):
            raise ValueError(f"a sequence appears twice in one step: {keys}")
        ids = [as_ids(x, f"token ids of {k!r}") for k, x in seqs]
        for k, x in zip(keys, ids):
            if x.ndim != 1:
                raise ValueError(f"token ids of {k!r} must be 1-D, got shape {x.shape}")
        lens = [x.size for x in ids]
        T = sum(lens)
        if T > self.max_tokens:
            raise ValueError(f"step has {T} tokens, more than max_tokens={self.max_tokens}")
        carries = np.stack([self._carries[k] for k in keys]) if keys else self.hasher.initial_carry(0)
        cu = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)])
        flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        rows, new_carries = self.hasher.hash_packed(flat, cu, carries)  # validates the ids; pure
        out = self.put(rows, 0, 0, stream)
        for k, c in zip(keys, new_carries):
            self._carries[k] = c
        return out

    def put(self, rows: np.ndarray, at: int, pad: int, stream: torch.cuda.Stream | None = None) -> Tensor:
        """Table rows `rows [T, heads]` (from `hasher.hash_packed`) into `ple_rows[at:at + T]`, and zeros into the
        `pad` rows after them, with one copy; returns the view `ple_rows[at:at + T + pad]`. Enqueued on `stream`
        (default: the current stream of the device)."""
        T = rows.shape[0]
        if at + T + pad > self.max_tokens:
            raise ValueError(f"step has {at + T + pad} tokens, more than max_tokens={self.max_tokens}")
        if T + pad:
            staging = self._next_staging()
            if T:
                self.store.gather_flat(rows.reshape(-1), staging[at:at + T].view(-1, staging.shape[-1]))
            if pad:
                staging[at + T:at + T + pad].zero_()
            self._upload(staging, at, T + pad, stream)
        self._tokens += T
        return self.ple_rows[at:at + T + pad]

    def rearm(self, consumed: torch.cuda.Event | None = None) -> None:
        """Make the buffers reusable after a step consumed them (e.g. a CUDA-graph replay that read `ple_rows`).

        Waits (host) until the uploads have finished reading the staging buffers. `consumed`, an event recorded on
        the consumer's stream after it read `ple_rows`, makes the next upload wait for it on the device, so the
        upload cannot overwrite rows a replay on another stream is still reading. On the CPU nothing is pending.
        """
        for k in range(len(self._staging)):
            self._wait(k)
        self._consumed = consumed

    def counters(self) -> PrestageCounters:
        s = self.store.counters()
        token_bytes = self.hasher.heads * self.store.row_bytes  # every staged token is uploaded exactly once
        return PrestageCounters(s.hits, s.misses, s.bytes_read, s.evictions, s.resident, self._uploads,
                                self._tokens, self._tokens * token_bytes)

    @property
    def staging(self) -> Tensor:
        """The host staging buffer the last upload read (pinned on CUDA)."""
        return self._staging[self._k]

    # ---- internals ----
    def _next_staging(self) -> Tensor:
        self._k = (self._k + 1) % len(self._staging)
        self._wait(self._k)
        return self._staging[self._k]

    def _upload(self, staging: Tensor, at: int, n: int, stream: torch.cuda.Stream | None) -> None:
        src, dst = staging[at:at + n], self.ple_rows[at:at + n]
        if self.device.type != "cuda":
            dst.copy_(src)
        else:
            stream = stream or torch.cuda.current_stream(self.device)
            if self._consumed is not None:
                stream.wait_event(self._consumed)
            with torch.cuda.stream(stream):
                dst.copy_(src, non_blocking=True)
                done = self._copy_done[self._k] = self._copy_done[self._k] or torch.cuda.Event()
                done.record(stream)
        self._consumed = None
        self._uploads += 1

    def _wait(self, k: int) -> None:
        """The host may rewrite staging buffer k once the copy that last read it has run."""
        done = self._copy_done[k]
        if done is not None:
            done.synchronize()

    def _known(self, key: Hashable) -> np.ndarray:
        try:
            return self._carries[key]
        except KeyError:
            raise KeyError(f"sequence {key!r} has no PLE id carry (add_carry first, or it was dropped)") from None

    def _checked_carry(self, carry: object) -> np.ndarray:
        c = as_ids(carry, "carry").copy()
        if c.shape != (self.hasher.context,):
            raise ValueError(f"carry must be [{self.hasher.context}], got shape {c.shape}")
        if np.any((c < 0) | (c >= self.hasher.vocab_size)):
            raise ValueError(f"carry {c.tolist()} outside the vocabulary [0, {self.hasher.vocab_size})")
        return c
