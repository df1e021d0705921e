"""State pools of a stack of GDN layers, correct by construction, and their snapshot format.

One `StatePool` owns, for every GDN layer of a checkpoint, the pools of `model.state.LayerState` (GDN conv, fp32
recurrent state, PLE conv carry) with one row ("slot") per live sequence, plus the PLE id carries (the last
ngram_size-1 token ids per sequence, kept on the host by the PLE prestage). Invariants:
- a slot is zeroed in every layer (and its id carries reset) when it is handed out, so a new sequence never
  inherits a previous tenant's state;
- padding rows use slot -1, which the ops skip; the allocator never hands out -1;
- a snapshot reads a sequence's state only after the step that last wrote it has completed on its stream (the
  step's `Fence`), and restore validates the whole blob before any pool row is written.

Snapshot format (version 4), little-endian:
    b"GDNSNAP" | u8 version | u32 header length | header (UTF-8 JSON) | payload | u32 crc32 of all before
The header names the config hash and name, the tensor-parallel size and rank whose heads the state holds
(`{"size": 1, "rank": 0}` for a whole model; a rank's pools hold only its heads, `model/tp.py`), the digest of the
weights the state was computed with (`model.checkpoint.weights_digest`), the token position, the layout string and
one entry per tensor (name, dtype, shape, byte offset into the payload). The payload holds, for one token boundary,
every layer's conv, ssm and ple_conv rows and the PLE id carries. Version 1 had no weights digest,
version 2 no tp and the conv rows channel-major, version 3 one of the two.

The CRC catches accidents only: anyone can re-seal a blob. So `decode` trusts nothing in it. Before any tensor is
built it checks the header length against what this pool's header can be, parses the header as strict JSON (UTF-8,
no duplicate keys, no NaN literals, any nesting error a `SnapshotError`), and checks it against an exact schema:
the key sets, the types (a JSON `true` is not an int), the position range 0..2**62, the tp size and rank, the config
hash, the weights digest, the layout and every tensor entry equal to this pool's, the payload size. Then the
values: every float of the state finite and every PLE id carry inside the vocabulary. Every failure is a
`SnapshotError` and nothing of the pool is read or written, so `Session.restore` takes a slot only for a blob that
will restore.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.dtypes import DTYPES, dtype_name
from gdn_trt.model.errors import GdnTrtError
from gdn_trt.model.state import BufferSpec, LayerState

MAGIC = b"GDNSNAP"
FORMAT_VERSION = 4
# Positions count tokens; 2**62 is beyond any run and leaves int64 headroom for position + drafts arithmetic.
MAX_POSITION = 2 ** 62
_HEADER_KEYS = frozenset({"config_hash", "config", "tp", "weights", "position", "layout", "tensors"})
_TP_KEYS = frozenset({"size", "rank"})
_ENTRY_KEYS = frozenset({"name", "dtype", "shape", "offset"})
# How every tensor of a slot is laid out; a change here is a format change (bump FORMAT_VERSION).
LAYOUT = ("ssm [HV, K, V] key-dim rows; conv [W-1, conv_dim] pre-conv inputs oldest first; "
          "ple_conv [(k-1)*dilation, n*C] oldest first; ple_ids [ngram_size-1] int64 oldest first")
_PREFIX = struct.Struct("<7sBI")
FENCES = 64  # the streams a pool keeps a fence for; the steps of any further stream wait for the whole device
_CRC = struct.Struct("<I")


class SnapshotError(GdnTrtError, ValueError):
    """A snapshot that cannot be restored into this pool (corrupt, truncated, foreign config or layout)."""


class PoolFullError(GdnTrtError, RuntimeError):
    """Every slot is taken: the limit to raise is max_seqs (or release sequences first)."""


class IdCarries(Protocol):
    """Host-side PLE id carry of one PLE layer, by slot (the PLE prestage implements it)."""

    def read(self, slot: int) -> list[int]: ...

    def write(self, slot: int, ids: list[int]) -> None: ...

    def reset(self, slot: int) -> None: ...


class Fence:
    """Completion marker of the steps that wrote some slots: the stream they were enqueued on (None: the CPU, where
    the ops are synchronous, or every stream of the device). Waiting synchronizes that stream, so every step enqueued
    on it so far, the writing one included, has completed. Marking costs no CUDA call: an event recorded after each
    step's graph launch took 6-16 us of the H200's host (bench/host_profile.py `bare`, 2026-12-03)."""

    def __init__(self, index: int, stream: torch.cuda.Stream | None, device: torch.device):
        self.index, self.stream, self.device = index, stream, device

    def wait(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()
        elif self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a slot's state in the snapshot: `layer<i>.<part>`, dtype, shape (of one slot)."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = DTYPES[self.dtype].itemsize
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class SlotState:
    """All state of one sequence at one token boundary, as host tensors in layout order, and its position."""

    tensors: tuple[Tensor, ...]
    position: int


class StatePool:
    """Pools of every GDN layer of `cfg` with `slots` rows each, in `spec`'s dtype and device.

    Args:
        cfg: the model config (the one shape authority).
        slots: pool rows (the max_seqs limit).
        spec: activation dtype and device of the buffers (the recurrent state is fp32 or wider).
        weights: digest of the weights (`model.checkpoint.weights_digest`); a snapshot restores only into a pool of
            the same digest.
    """

    def __init__(self, cfg: GdnConfig, slots: int, spec: BufferSpec, weights: str | None = None):
        if slots < 1:
            raise ValueError(f"a pool needs at least one slot, got max_seqs={slots}")
        self.cfg, self.slots, self.spec = cfg, slots, spec
        self.weights = weights  # digest of the weights the state is computed with; snapshots record it
        self.device = torch.device(spec.device)
        self.layers: dict[int, LayerState] = {i: LayerState.allocate(cfg, i, slots, spec) for i in cfg.gdn_layer_ids}
        self.id_carries: dict[int, IdCarries] = {}
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        # the fence of the step that last wrote each slot, as an index into the pool's fences (-1 = none): one per
        # stream the steps ran on, fence 0 the whole device. A snapshot may wait for later steps of the stream than
        # the one that wrote its slot, never for fewer.
        self._fence_of = np.full(slots, -1, dtype=np.int64)
        self._fences = [Fence(0, None, self.device)]
        self._by_stream: dict[int, Fence] = {}  # id(stream) -> its fence (the fence holds the stream: ids stay unique)

    # ---- slots ----
    def attach_id_carries(self, layer_idx: int, carries: IdCarries) -> None:
        """Register the PLE id carry of a PLE layer so that allocation resets it and snapshots include it."""
        if not self.cfg.has_ple(layer_idx):
            raise ValueError(f"layer {layer_idx} has no PLE, so it has no id carry")
        self.id_carries[layer_idx] = carries

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        """A slot zeroed in every layer, id carries reset (to EOS by the prestage)."""
        if not self._free:
            raise PoolFullError(f"all {self.slots} slots are in use: raise max_seqs or release a sequence")
        slot = self._free.pop()
        for st in self.layers.values():
            for t in st.tensors():
                t[slot].zero_()
        for carries in self.id_carries.values():
            carries.reset(slot)
        self._fence_of[slot] = -1
        return slot

    def free(self, slot: int) -> None:
        if slot < 0 or slot >= self.slots or slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")
        self._fence_of[slot] = -1
        self._free.append(slot)

    def fence(self, stream: torch.cuda.Stream | None) -> Fence:
        """The fence of a step enqueued on `stream` (the current stream; None: the device): pass it to
        `mark_written`."""
        hit = self._by_stream.get(id(stream)) if stream is not None else None
        if hit is not None:
            return hit
        if stream is None or len(self._fences) > FENCES:
            return self._fences[0]
        hit = self._by_stream[id(stream)] = Fence(len(self._fences), stream, self.device)
        self._fences.append(hit)
        return hit

    def mark_written(self, slots: np.ndarray | list[int] | int | slice, fence: Fence) -> None:
        """The step whose completion `fence` (from `fence()`) marks wrote these slots: snapshots of them wait for
        it."""
        self._fence_of[slots] = fence.index

    # ---- layout ----
    def layout(self) -> tuple[TensorEntry, ...]:
        """Every tensor of one slot, in snapshot order."""
        out = []
        for i, st in self.layers.items():
            for part in ("conv", "ssm", "ple_conv"):
                t = getattr(st, part)
                if t is not None:
                    out.append(TensorEntry(f"layer{i}.{part}", dtype_name(t.dtype), tuple(t.shape[1:])))
            if i in self.id_carries:
                out.append(TensorEntry(f"layer{i}.ple_ids", "int64", (self.cfg.ngram_size - 1,)))
        return tuple(out)

    def read_slot(self, slot: int, position: int) -> SlotState:
        """A host copy of `slot`'s whole state, after its last writing step completed."""
        self._check_live(slot)
        k = int(self._fence_of[slot])
        if k >= 0:
            self._fences[k].wait()
        carries = {i: c.read(slot) for i, c in self.id_carries.items()}
        return SlotState(self.rows_of(self.layers, slot, carries), position)

    def rows_of(self, states: dict[int, LayerState], row: int, carries: dict[int, list[int]]) -> tuple[Tensor, ...]:
        """Host copies of row `row` of per-layer buffers shaped like the pools (the pools themselves, or prefill
        capture buffers), with the given id carries, in snapshot layout order."""
        out = []
        for i in self.layers:
            out += [t[row].detach().to("cpu", copy=True) for t in states[i].tensors()]
            if i in self.id_carries:
                out.append(torch.tensor(carries[i], dtype=torch.int64))
        return tuple(out)

    def write_slot(self, slot: int, state: SlotState) -> None:
        """Write a validated `SlotState` (layout order) into `slot`."""
        self._check_live(slot)
        it = iter(state.tensors)
        for i, st in self.layers.items():
            for t in st.tensors():
                t[slot].copy_(next(it))
            if i in self.id_carries:
                self.id_carries[i].write(slot, next(it).tolist())

    def _check_live(self, slot: int) -> None:
        if slot < 0 or slot >= self.slots or slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")

    # ---- snapshots ----
    def encode(self, state: SlotState) -> bytes:
        """Serialize a `SlotState` of this pool's layout (see the module docstring)."""
        entries, offset, meta = self.layout(), 0, []
        if len(entries) != len(state.tensors):
            raise ValueError(f"slot state has {len(state.tensors)} tensors, the layout {len(entries)}")
        for e in entries:
            meta.append({"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "offset": offset})
            offset += e.nbytes
        header = json.dumps({"config_hash": self.cfg.config_hash(), "config": self.cfg.name,
                             "tp": {"size": self.cfg.tp_size, "rank": self.cfg.tp_rank}, "weights": self.weights,
                             "position": state.position, "layout": LAYOUT, "tensors": meta}).encode()
        payload = b"".join(_raw(t) for t in state.tensors)
        body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)) + header + payload
        return body + _CRC.pack(zlib.crc32(body))

    def decode(self, blob: bytes) -> SlotState:
        """Parse and validate a snapshot against this pool; raises `SnapshotError` naming the first mismatch.
        Reads no pool state and writes none."""
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise SnapshotError(f"a snapshot is bytes, got {type(blob).__name__}")
        blob = bytes(blob)
        if len(blob) < _PREFIX.size + _CRC.size:
            raise SnapshotError(f"snapshot truncated: {len(blob)} bytes is shorter than any header")
        magic, version, hlen = _PREFIX.unpack_from(blob)
        if magic != MAGIC:
            raise SnapshotError(f"not a gdn-trt snapshot (magic {magic!r})")
        if version != FORMAT_VERSION:
            raise SnapshotError(f"snapshot format version {version}, this runtime reads {FORMAT_VERSION}")
        body, (crc,) = blob[:-_CRC.size], _CRC.unpack_from(blob, len(blob) - _CRC.size)
        if _PREFIX.size + hlen > len(body):
            raise SnapshotError(f"snapshot truncated: header of {hlen} bytes does not fit in {len(blob)} bytes")
        if zlib.crc32(body) != crc:
            raise SnapshotError("snapshot checksum mismatch: the blob is corrupt or truncated")
        if hlen > self._max_header():
            raise SnapshotError(f"snapshot header of {hlen} bytes is larger than any header of this pool "
                                f"({self._max_header()} bytes at most)")
        header = _parse(body[_PREFIX.size:_PREFIX.size + hlen])
        self._check_header(header, len(body) - _PREFIX.size - hlen)
        payload = body[_PREFIX.size + hlen:]
        tensors = tuple(_tensor(payload[m["offset"]:m["offset"] + e.nbytes], e)
                        for m, e in zip(header["tensors"], self.layout()))
        self._check_values(tensors)
        return SlotState(tensors, header["position"])

    def _max_header(self) -> int:
        """A bound on this pool's header: the fixed fields, a config name of up to 1 KiB, 256 bytes per tensor
        entry (a real entry is under 100)."""
        return 2048 + len(LAYOUT) + 256 * len(self.layout())

    def _check_header(self, header: object, payload_bytes: int) -> None:
        if not isinstance(header, dict):
            raise SnapshotError(f"snapshot header must be a JSON object, got {type(header).__name__}")
        _keys("snapshot header", header, _HEADER_KEYS)
        _typed("config_hash", header["config_hash"], str)
        _typed("config", header["config"], str)
        self._check_tp(header["tp"])
        want = self.cfg.config_hash()
        if header["config_hash"] != want:
            raise SnapshotError(f"snapshot was taken with config {header['config']!r} (hash "
                                f"{header['config_hash']}), this pool runs {self.cfg.name!r} (hash {want})")
        if header["weights"] is not None:
            _typed("weights", header["weights"], str)
        if header["weights"] != self.weights:
            raise SnapshotError(f"snapshot was taken with other weights (digest {str(header['weights'])[:16]}), this "
                                f"pool computes with {str(self.weights)[:16]}: restore it into a session of the same "
                                "checkpoint")
        if header["layout"] != LAYOUT:
            raise SnapshotError(f"snapshot state layout differs: {header['layout']!r}")
        pos = header["position"]
        if type(pos) is not int or not 0 <= pos <= MAX_POSITION:
            raise SnapshotError(f"snapshot token position must be an int in 0..2**62, got {pos!r}")
        got, entries = header["tensors"], self.layout()
        if not isinstance(got, list) or len(got) != len(entries):
            raise SnapshotError(f"snapshot holds {len(got) if isinstance(got, list) else '?'} tensors, "
                                f"this pool's slot has {len(entries)}")
        offset = 0
        for m, e in zip(got, entries):
            if not isinstance(m, dict):
                raise SnapshotError(f"snapshot tensor entry for {e.name} must be a JSON object, got "
                                    f"{type(m).__name__}")
            _keys(f"snapshot tensor entry for {e.name}", m, _ENTRY_KEYS)
            shape = m["shape"]
            exact = (type(m["name"]) is str and type(m["dtype"]) is str and type(m["offset"]) is int
                     and isinstance(shape, list) and all(type(d) is int for d in shape))
            if not exact or (m["name"], m["dtype"], tuple(shape), m["offset"]) != (e.name, e.dtype, e.shape, offset):
                raise SnapshotError(f"snapshot tensor {str(m['name'])[:80]!r} is {str(m['dtype'])[:40]!r} "
                                    f"{str(shape)[:80]} at byte {str(m['offset'])[:40]}; this pool needs {e.name} "
                                    f"{e.dtype} {list(e.shape)} at byte {offset}")
            offset += e.nbytes
        if offset != payload_bytes:
            raise SnapshotError(f"snapshot payload is {payload_bytes} bytes, the header describes {offset}")

    def _check_tp(self, tp: object) -> None:
        """The snapshot holds the heads of this pool's tensor-parallel rank: same tp size, same rank."""
        if not isinstance(tp, dict):
            raise SnapshotError(f"snapshot header field tp must be a JSON object, got {type(tp).__name__}")
        _keys("snapshot header field tp", tp, _TP_KEYS)
        _typed("tp.size", tp["size"], int)
        _typed("tp.rank", tp["rank"], int)
        got, want = (tp["size"], tp["rank"]), (self.cfg.tp_size, self.cfg.tp_rank)
        if got != want:
            raise SnapshotError(f"snapshot holds the state of rank {got[1]} of tp={got[0]}, this pool holds rank "
                                f"{want[1]} of tp={want[0]}: restore a rank's snapshot on the same rank of the same "
                                "tp size")

    def _check_values(self, tensors: tuple[Tensor, ...]) -> None:
        """Every float of the state finite, every PLE id carry inside the vocabulary."""
        V = self.cfg.vocab_size
        for e, t in zip(self.layout(), tensors):
            if t.dtype.is_floating_point:
                if not bool(torch.isfinite(t).all()):
                    raise SnapshotError(f"snapshot tensor {e.name} is not finite ({int(torch.isnan(t).sum())} NaN, "
                                        f"{int(torch.isinf(t).sum())} infinite values)")
            elif t.numel() and not (0 <= int(t.min()) and int(t.max()) < V):
                raise SnapshotError(f"snapshot tensor {e.name} holds token ids {t.tolist()} outside the vocabulary "
                                    f"[0, {V})")


def _parse(raw: bytes) -> object:
    """Strict JSON: UTF-8, no duplicate keys, no NaN or Infinity literals; every failure a `SnapshotError`."""
    def pairs(items: list[tuple[str, object]]) -> dict:
        d = dict(items)
        if len(d) != len(items):
            raise ValueError(f"duplicate keys {sorted({k for k, _ in items if sum(k == j for j, _ in items) > 1})}")
        return d

    def constant(name: str) -> float:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=pairs, parse_constant=constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise SnapshotError(f"snapshot header is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None


def _keys(what: str, d: dict, want: frozenset[str]) -> None:
    if set(d) != want:
        missing, extra = sorted(want - set(d)), sorted(set(d) - want)
        raise SnapshotError(f"{what}: missing keys {missing}, unknown keys {[k[:40] for k in extra][:8]}")


def _typed(name: str, value: object, kind: type) -> None:
    if type(value) is not kind:
        raise SnapshotError(f"snapshot header field {name} must be a {kind.__name__}, got {type(value).__name__}")


def _raw(t: Tensor) -> bytes:
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensor(raw: bytes, e: TensorEntry) -> Tensor:
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(DTYPES[e.dtype]).reshape(e.shape)
