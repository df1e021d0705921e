"""Helpers of the tensor-parallel tests (no tests here): the cases, their inputs, the process that runs one rank,
and the hand-written split and gather of the state buffers between the whole model and its ranks.

`run_world(root, job)` spawns 4 processes joined by `torch.distributed` over gloo (rendezvous in a file of `root`,
so no port is picked or raced for): tp = 4 over all of them, tp = 2 over the process groups {0, 1} and {2, 3}, each
pair taking every other tp = 2 case. A rank loads its shard of the checkpoints with `load_checkpoint(dir,
Shard(tp, rank))` and its adapters with `shard_adapter`, runs its cases from its slice of the starting pools and
saves what it computed to `root/rank<r>.pt`. The test process computes the whole layer's answers and compares.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gdn_trt.model.checkpoint import load_checkpoint
from gdn_trt.model.config import GdnConfig, Shard
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import LoraInput, LoraLimits, build_slots, shard_adapter
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.model.peft import load_adapter
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput
from gdn_trt.model.tp import TpSpec
from gdn_trt.plugins.packing import Packing

F64 = torch.float64
SLOTS = 6
LIMITS = LoraLimits(max_adapters=2, max_rank=6)
ADAPTER_OF = [1, -1, 0, 1]  # LoRA slot of the k-th sequence of a step (-1: none)
# per mode: sequence lengths, pool rows (-1 = padding) and prefill capture points
STEPS = {
    LayerMode.DECODE: ([1], [4], None),
    LayerMode.DECODE_MULTI_SEQ: ([1, 1, 1, 1], [3, -1, 0, 5], None),
    LayerMode.DECODE_BATCHED: ([4], [3], None),
    LayerMode.VERIFY_MULTI: ([3, 0, 2], [1, 4, 2], None),
    LayerMode.PREFILL: ([70], [2], [64]),
    LayerMode.PREFILL_VARLEN: ([5, 66, 9], [2, 0, 5], [3, -1, 9]),
}
STATE_PARTS = tuple(f.name for f in fields(LayerState))


@dataclass(frozen=True)
class Case:
    """One layer step: the checkpoint (and adapter) folder of `preset`, the layer, the mode, whether the host
    reduces the last projection, whether the step carries per-sequence LoRA."""

    preset: str
    layer: int
    mode: LayerMode
    host_reduce: bool
    lora: bool

    @property
    def name(self) -> str:
        return (f"{self.preset} layer {self.layer} {self.mode.value}{' host-reduced' if self.host_reduce else ''}"
                f"{' +lora' if self.lora else ''}")


def step_inputs(cfg: GdnConfig, case: Case, seed: int) -> dict:
    """Random activations and starting pools (whole model) of one case, poisoned nowhere: pools start random so a
    dropped initial state or a wrong slot shows."""
    g = torch.Generator().manual_seed(seed)
    lengths, rows, at = STEPS[case.mode]
    T = sum(lengths)
    rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=F64)  # noqa: E731
    pools = LayerState.allocate(cfg, case.layer, SLOTS, BufferSpec(F64))
    return {"x": rnd(T, cfg.stream_dim), "residual": None if cfg.is_hc else rnd(T, cfg.stream_dim),
            "ple_rows": rnd(T, cfg.ple_heads, cfg.ple_head_dim) if cfg.has_ple(case.layer) else None,
            "lora_idx": torch.tensor([ADAPTER_OF[k] for k, n in enumerate(lengths) for _ in range(n)],
                                     dtype=torch.int32),
            "pools": {p: None if getattr(pools, p) is None else rnd(*getattr(pools, p).shape) * 0.5
                      for p in STATE_PARTS}}


def run_case(layer: GdnLayer, case: Case, data: dict, slots) -> dict:
    """One step of `layer` (whole or a rank) on `data` (pools already the layer's): what it returned and wrote."""
    cfg, spec = layer.cfg, BufferSpec(F64)
    lengths, rows, at = STEPS[case.mode]
    T = sum(lengths)
    pools = LayerState(**{p: None if t is None else t.clone() for p, t in data["pools"].items()})
    lora = LoraInput(data["lora_idx"], slots) if case.lora else None
    step = StepInput(data["x"], Packing.build(lengths, rows), data["residual"], data["ple_rows"], lora)
    writes = case.mode.spec.writes
    extra = None
    if writes is Writes.STASH:
        extra = StateStash.allocate(cfg, case.layer, T, spec)
        for t in (extra.conv, extra.ssm, extra.ple_conv):
            if t is not None:
                t.fill_(float("nan"))  # every row must be written
    elif writes is Writes.POOLS_CAPTURE:
        extra = StateCapture.allocate(cfg, case.layer, torch.tensor(at, dtype=torch.int32), spec)
    res = layer.run(case.mode, step, pools, extra)
    out = res[0]
    got = {"x": out.x, "residual": out.residual, "pools": {p: getattr(pools, p) for p in STATE_PARTS}}
    if extra is not None:
        got["extra"] = {p: getattr(res[-1], p) for p in STATE_PARTS}
    return got


# ---- the state of the whole model <-> a rank's (written here by hand, not with model/tp.py) ----
def _conv_blocks(cfg: GdnConfig, size: int) -> list[tuple[int, int]]:
    """(start, width per rank) of the conv channel blocks [Q | K | V] of the whole model."""
    kd, vd = cfg.key_dim, cfg.value_dim
    return [(0, kd // size), (kd, kd // size), (2 * kd, vd // size)]


def rank_part(cfg: GdnConfig, part: str, t: torch.Tensor | None, size: int, rank: int) -> torch.Tensor | None:
    """Rank `rank`'s share of a whole-model buffer [rows, ...] of state part `part` (`cfg` = the whole model); conv
    buffers hold their channels on the last dim ([rows, W-1, conv_dim])."""
    if t is None or part == "ple_conv":  # the PLE carry spans the whole streams: every rank holds all of it
        return None if t is None else t.clone()
    if part == "ssm":
        k = cfg.linear_num_value_heads // size
        return t[:, rank * k:(rank + 1) * k].clone()
    return torch.cat([t[..., s + rank * w:s + (rank + 1) * w] for s, w in _conv_blocks(cfg, size)], dim=-1)


def gather_part(cfg: GdnConfig, part: str, ranks: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The whole-model buffer from the ranks' shares (the inverse of `rank_part`)."""
    if ranks[0] is None or part == "ple_conv":
        return ranks[0]
    if part == "ssm":
        return torch.cat(ranks, dim=1)
    size, out = len(ranks), []
    for k, (_, w) in enumerate(_conv_blocks(cfg, size)):
        off = sum(w2 for _, w2 in _conv_blocks(cfg, size)[:k])
        out += [r[..., off:off + w] for r in ranks]
    return torch.cat(out, dim=-1)


# ---- the ranks' processes ----
WORLD = 4  # one spawn: tp = 4 over all four processes, tp = 2 over the groups {0, 1} and {2, 3}


@contextmanager
def gloo_world(rank: int, root: str):
    """This process as rank `rank` of WORLD gloo processes (a file rendezvous under `root`); yields the groups of
    the pairs {0, 1} and {2, 3} (every process creates every group, in order)."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    try:
        yield [dist.new_group([0, 1]), dist.new_group([2, 3])]
    finally:
        dist.destroy_process_group()


def _worker(rank: int, root: str) -> None:
    with gloo_world(rank, root) as pairs:
        job = torch.load(Path(root) / "job.pt", weights_only=False)
        out = {4: _run_job(job, 4, job[4], Shard(4, rank), None)}
        # each pair runs every other tp = 2 case: the pair {2, 3} also checks ranks of a group that is not the world
        half = [(k, c) for k, c in enumerate(job[2]) if k % 2 == rank // 2]
        out[2] = dict(zip([k for k, _ in half], _run_job(job, 2, [c for _, c in half], Shard(2, rank % 2),
                                                          pairs[rank // 2])))
        torch.save(out, Path(root) / f"rank{rank}.pt")


def _run_job(job: dict, size: int, cases: list[tuple[Case, dict]], shard: Shard, group) -> list[dict]:
    cks, layers, slots, out = {}, {}, {}, []
    for case, data in cases:
        folder = Path(job["folders"][case.preset])
        if case.preset not in cks:
            whole = load_checkpoint(folder / "ckpt").config
            ck = load_checkpoint(folder / "ckpt", shard)
            ads = [shard_adapter(load_adapter(folder / f"adapter{k}", whole), whole, shard) for k in range(2)]
            cks[case.preset] = (ck, ads)
        ck, ads = cks[case.preset]
        key = (case.preset, case.layer, case.host_reduce)
        if key not in layers:
            lw = next(lw for lw in ck.layers if lw.index == case.layer)
            layers[key] = GdnLayer(ck.config, lw, F64, TpSpec(group, case.host_reduce))
            slots[key] = build_slots(ck.config, case.layer, LIMITS, ads, F64)
        cfg = job["configs"][case.preset]
        mine = dict(data, pools={p: rank_part(cfg, p, t, size, shard.rank) for p, t in data["pools"].items()})
        out.append(run_case(layers[key], case, mine, slots[key]))
    return out


def run_world(root: Path, job: dict) -> dict[int, list[list[dict]]]:
    """Run `job` ({tp size: [(case, inputs)]}) on 4 gloo processes; returns, per tp size and case, the results of
    the case's ranks in rank order."""
    torch.save(job, root / "job.pt")
    mp.spawn(_worker, args=(str(root),), nprocs=WORLD, join=True)
    got = [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    return {4: [[got[r][4][k] for r in range(4)] for k in range(len(job[4]))],
            2: [[got[2 * (k % 2) + r][2][k] for r in range(2)] for k in range(len(job[2]))]}
