"""A session of one tensor-parallel rank: `Session.open(..., options=SessionOptions(tp=TpSpec(group)))`.

Each rank's process opens its own session over its shard (`model/tp.py`): the size and rank come from the process
group (`TpSpec.group`, None = the default group), the checkpoint's rank slices are read (`load_checkpoint(dir,
shard)`; a preset's or a loaded whole checkpoint's weights are cut with `shard_layer`), and every buffer the session
sizes from its config (pools, verify stash, prefill captures, adapter slots, the budget) holds the rank's heads.
Snapshots record the rank (`runtime/state.py`) and restore only on the same rank of the same tp size.

Where the all-reduce runs. The engines of a rank compute their layer with its LAST reduction left out (the layers
are built with `host_reduce=True`: a rank's TensorRT graph has no collective in it either, `export/artifacts.py`
says why), and the runtime finishes it (`RankTp.finish`) wherever no host stands after the layer:
- `step.run` and the dict API (a stack of GDN layers only): after every layer, `all_reduce` over the group; the
  rank's output is the whole hidden state, equal on every rank.
- `step.layer` / `step.mixer` (a host's model around the layers): all-reduced too, unless the session was opened
  with `TpSpec(group, host_reduce=True)`. Then the host gets this rank's partial sum and fuses the reduction with
  its own residual add and RMSNorm (SGLang's `reduce_results=False`): `step.mixer` returns the rank's partial mixer
  output `[rows, C]` (the host's hidden is `residual + all_reduce(y)`); `step.layer` returns the pair
  `(x, residual)` whether or not a residual was given, where the layer's hidden state is `all_reduce(x) + residual`
  (hc layers: x = the rank's write-gated delta `[rows, n*C]`, residual = the streams). A dense-MLP layer's first
  reduction (after `out_proj`, before the post-attention RMSNorm, which needs the whole mixer output) always runs in
  the layer; `step.mixer` of such a layer returns the partial `out_proj` sum (the host owns the MLP).

CUDA graphs: NCCL's all-reduce can be captured (NCCL >= 2.9 supports stream capture), gloo's cannot (it runs on the
host), so at tp > 1 every engine of a session whose group is not NCCL vetoes capture, naming the backend.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace

import torch.distributed as dist

from gdn_trt.model.checkpoint import Checkpoint
from gdn_trt.model.config import GdnConfig, Shard
from gdn_trt.model.lora import Adapter, shard_adapter
from gdn_trt.model.state import StepOutput
from gdn_trt.model.tp import TpError, TpSpec, shard_config, shard_layer

from .engine import Engine


def shard_of(spec: TpSpec | None) -> Shard:
    """The rank this process holds: its rank and the size of `spec.group` (tp = 1 without a spec). A spec without
    an initialised `torch.distributed` is a `TpError`."""
    if spec is None:
        return Shard()
    if not (dist.is_available() and dist.is_initialized()):
        raise TpError("SessionOptions.tp names a process group: initialise torch.distributed (init_process_group) "
                      "in every rank's process before Session.open")
    return Shard(dist.get_world_size(spec.group), dist.get_rank(spec.group))


def cut_checkpoint(ck: Checkpoint, shard: Shard) -> Checkpoint:
    """Rank `shard` of a loaded checkpoint: a whole one is cut (`shard_layer`), a rank's one must be that rank."""
    cfg = ck.config
    if cfg.tp_size > 1:
        if (cfg.tp_size, cfg.tp_rank) != (shard.size, shard.rank):
            raise TpError(f"the checkpoint holds rank {cfg.tp_rank} of tp={cfg.tp_size}, this process is rank "
                          f"{shard.rank} of tp={shard.size}")
        return ck
    if shard.size == 1:
        return ck
    layers = [shard_layer(cfg, lw, shard) for lw in ck.layers]
    return replace(ck, config=shard_config(cfg, shard), layers=layers)


def load_rank(load_source, src, seed: int, shard: Shard) -> tuple[Checkpoint, tempfile.TemporaryDirectory | None]:
    """The rank's checkpoint of `src` (`load_source(src, seed, shard)` reads only the rank's slices of a checkpoint
    directory; a preset, config or loaded checkpoint is made or taken whole and cut here)."""
    ck, tmp = load_source(src, seed, shard)
    return cut_checkpoint(ck, shard), tmp


def backend_of(spec: TpSpec) -> str:
    """The `torch.distributed` backend of the spec's group ("nccl", "gloo", ...)."""
    return str(dist.get_backend(spec.group)).lower()


@dataclass(frozen=True)
class RankTp:
    """What a rank's session knows of its tensor parallelism: the whole model's config, the rank, the spec the host
    gave (group, host_reduce) and the group's backend."""

    whole: GdnConfig
    shard: Shard
    spec: TpSpec
    backend: str

    @staticmethod
    def of(whole: GdnConfig, shard: Shard, spec: TpSpec) -> "RankTp | None":
        """None for tp = 1 (the session runs as it always did)."""
        if shard.size == 1:
            return None
        return RankTp(whole, shard, spec, backend_of(spec))

    def layer_spec(self) -> TpSpec:
        """The spec the rank's layers are built with: the last reduction left out, the runtime finishes it."""
        return TpSpec(self.spec.group, host_reduce=True)

    @property
    def capture_veto(self) -> str | None:
        if self.backend == "nccl":
            return None
        return (f"tensor parallel over {self.backend}: its all-reduce runs on the host and cannot be captured in a "
                "CUDA graph (NCCL's can)")

    def mark(self, engines: list[list[Engine]]) -> None:
        """Give every engine the session's capture veto (`Engine.tp_veto`)."""
        for cands in engines:
            for e in cands:
                e.tp_veto = self.capture_veto

    def finish(self, out: StepOutput, is_hc: bool) -> StepOutput:
        """The layer's output after its last all-reduce: plain (x + the others' partial sums, residual); hc, where
        the partial output is (delta, streams): the streams plus the summed delta; the mixer alone: its summed
        output."""
        x = self.spec.all_reduce(out.x)
        if is_hc and out.residual is not None:
            return StepOutput(out.residual + x)
        return StepOutput(x, out.residual)

    def adapter(self, adapter: Adapter) -> Adapter:
        """The rank's part of an adapter loaded for the whole model (one already cut for this rank passes)."""
        if adapter.config_hash == shard_config(self.whole, self.shard).config_hash():
            return adapter
        return shard_adapter(adapter, self.whole, self.shard)

    def describe(self) -> dict:
        """For `SessionStats.tp`."""
        return {"size": self.shard.size, "rank": self.shard.rank, "backend": self.backend,
                "reduce": "host" if self.spec.host_reduce else "runtime"}

