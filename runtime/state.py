"""State pools of a stack of GDN layers, correct by construction, and their snapshot format.

One `StatePool` owns, for every GDN layer of a checkpoint, the pools of `model.state.LayerState` (GDN conv, fp32
recurrent state, PLE conv carry) with one row ("slot") per live sequence, plus the PLE id carries (the last
ngram_size-1 token ids per sequence, kept on the host by the PLE prestage). Invariants:
- a slot is zeroed in every layer (and its id carries reset) when it is handed out, so a new sequence never
  inherits a previous tenant's state;
- padding rows use slot -1, which the ops skip; the allocator never hands out -1;
- a snapshot reads a sequence's state only after the step that last wrote it has completed on its stream (the
  step's `Fence`), and restore validates the whole blob before any pool row is written.

Snapshot format (version 1), little-endian:
    b"GDNSNAP" | u8 version | u32 header length | header (UTF-8 JSON) | payload | u32 crc32 of all before
The header names the config hash, the token position, the layout string and one entry per tensor (name, dtype,
shape, byte offset into the payload). The payload holds, for one token boundary, every layer's conv, ssm and
ple_conv rows and the PLE id carries.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.dtypes import DTYPES, dtype_name
from gdn_trt.model.errors import GdnTrtError
from gdn_trt.model.state import BufferSpec, LayerState

MAGIC = b"GDNSNAP"
FORMAT_VERSION = 1
# How every tensor of a slot is laid out; a change here is a format change (bump FORMAT_VERSION).
LAYOUT = ("ssm [HV, K, V] key-dim rows; conv [conv_dim, W-1] pre-conv inputs oldest first; "
          "ple_conv [n*C, (k-1)*dilation] oldest first; ple_ids [ngram_size-1] int64 oldest first")
_PREFIX = struct.Struct("<7sBI")
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
    """Completion marker of the last step that wrote some slots: a CUDA event, or nothing on the CPU (where the
    ops are synchronous)."""

    def __init__(self, device: torch.device):
        self.event = torch.cuda.Event() if device.type == "cuda" else None

    def record(self, stream: torch.cuda.Stream | None) -> "Fence":
        if self.event is not None:
            self.event.record(stream)
        return self

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


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
    """

    def __init__(self, cfg: GdnConfig, slots: int, spec: BufferSpec):
        if slots < 1:
            raise ValueError(f"a pool needs at least one slot, got max_seqs={slots}")
        self.cfg, self.slots, self.spec = cfg, slots, spec
        self.device = torch.device(spec.device)
        self.layers: dict[int, LayerState] = {i: LayerState.allocate(cfg, i, slots, spec) for i in cfg.gdn_layer_ids}
        self.id_carries: dict[int, IdCarries] = {}
        self._free = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._fence: dict[int, Fence] = {}

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
        self._fence.pop(slot, None)
        return slot

    def free(self, slot: int) -> None:
        if slot < 0 or slot >= self.slots or slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")
        self._fence.pop(slot, None)
        self._free.append(slot)

    def mark_written(self, slots: list[int], fence: Fence) -> None:
        """The step whose completion `fence` marks wrote these slots: snapshots of them wait for it."""
        for s in slots:
            if s >= 0:
                self._fence[s] = fence

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
        fence = self._fence.get(slot)
        if fence is not None:
            fence.wait()
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
        try:
            header = json.loads(body[_PREFIX.size:_PREFIX.size + hlen])
        except ValueError as e:
            raise SnapshotError(f"snapshot header is not valid JSON: {e}") from None
        self._check_header(header, len(body) - _PREFIX.size - hlen)
        payload = body[_PREFIX.size + hlen:]
        tensors = tuple(_tensor(payload[m["offset"]:m["offset"] + e.nbytes], e)
                        for m, e in zip(header["tensors"], self.layout()))
        return SlotState(tensors, int(header["position"]))

    def _check_header(self, header: dict, payload_bytes: int) -> None:
        want = self.cfg.config_hash()
        if header.get("config_hash") != want:
            raise SnapshotError(f"snapshot was taken with config {header.get('config')!r} (hash "
                                f"{header.get('config_hash')}), this pool runs {self.cfg.name!r} (hash {want})")
        if header.get("layout") != LAYOUT:
            raise SnapshotError(f"snapshot state layout differs: {header.get('layout')!r}")
        pos = header.get("position")
        if not isinstance(pos, int) or pos < 0:
            raise SnapshotError(f"snapshot token position must be an int >= 0, got {pos!r}")
        got, entries = header.get("tensors"), self.layout()
        if not isinstance(got, list) or len(got) != len(entries):
            raise SnapshotError(f"snapshot holds {len(got) if isinstance(got, list) else '?'} tensors, "
                                f"this pool's slot has {len(entries)}")
        offset = 0
        for m, e in zip(got, entries):
            seen = (m.get("name"), m.get("dtype"), tuple(m.get("shape") or ()), m.get("offset"))
            if seen != (e.name, e.dtype, e.shape, offset):
                raise SnapshotError(f"snapshot tensor {seen[0]} is {seen[1]} {list(seen[2])} at byte {seen[3]}; "
                                    f"this pool needs {e.name} {e.dtype} {list(e.shape)} at byte {offset}")
            offset += e.nbytes
        if offset != payload_bytes:
            raise SnapshotError(f"snapshot payload is {payload_bytes} bytes, the header describes {offset}")


def _raw(t: Tensor) -> bytes:
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _tensor(raw: bytes, e: TensorEntry) -> Tensor:
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(DTYPES[e.dtype]).reshape(e.shape)
