"""Tensor parallelism on the CPU: processes joined by `torch.distributed` over gloo run every mode of a layer of each
family as tp = 4 (four processes) and tp = 2 (the process groups {0, 1} and {2, 3}, `TpSpec.group`): Qwen3-Next
with its interleaved projections, mixer-only and with a dense MLP; Qwen3.5 with its dense MLP; Qwen4-Exp with hc and
PLE, and hc alone. Each rank holds its heads, read from the checkpoint files with `load_checkpoint(dir,
Shard(tp, rank))`; the all-reduce runs in the layer or is left to the host (`TpSpec.host_reduce`: the test sums the
ranks' partial outputs), with and without per-sequence LoRA adapters sharded by `shard_adapter`. The ranks' outputs
and their gathered pools, stashes and captures equal the whole layer's (pools start random, stashes NaN; the rows of
other slots stay bit-equal). One spawn of four processes serves both sizes (20 to 50 s on the shared 2-core machine).

Tolerance: `tol(float64)` (relative RMS 1e-11), the suite's bound for two float64 formulations of the same math.
A rank computes its heads' recurrence exactly as the whole layer does (the ops work per head), but its projections
are GEMMs over a subset of rows, and the row-parallel `out_proj` / `down_proj` sum their inputs in tp partial sums
added by the all-reduce (or by the test, when the host reduces), a different order of float64 additions: the
results differ in the last bits, not bit for bit. The ranks' all-reduced outputs are bit-equal to each other.
"""

from __future__ import annotations

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import build_slots
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.model.peft import SyntheticAdapter, load_adapter, make_synthetic_adapter

from .tolerances import assert_close
from .tp_support import F64, LIMITS, STATE_PARTS, STEPS, Case, gather_part, run_case, run_world, step_inputs

EXACT = tol(F64)
# (preset, layer): Qwen3-Next mixer-only and with its dense MLP, Qwen3.5 dense, Qwen4-Exp hc + PLE and hc alone
TP_LAYERS = [("tiny-next-tp", 0), ("tiny-next-tp", 1), ("tiny-3.5-tp", 0), ("tiny-4exp-tp", 1), ("tiny-4exp-tp", 2)]
# the first tiny presets have H = 2: one key head per rank at tp = 2
TP2_LAYERS = [("tiny-next-mlp", 1), ("tiny-3.5", 2), ("tiny-4exp", 1)]
LAYERS = {2: TP_LAYERS + TP2_LAYERS, 4: TP_LAYERS}
ADAPTERS = [SyntheticAdapter(r=3, alpha=5.0), SyntheticAdapter(r=6, alpha=8.0, use_rslora=True)]


def _cases(layers) -> list[Case]:
    return [Case(p, i, m, host, lora) for p, i in layers for m in LayerMode for host in (False, True)
            for lora in (False, True)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    out = {}
    for name in sorted({p for p, _ in LAYERS[2]}):
        make_synthetic_checkpoint(name, root / name / "ckpt", seed=5)
        for k, spec in enumerate(ADAPTERS):
            make_synthetic_adapter(name, root / name / f"adapter{k}", spec, seed=20 + k)
        out[name] = root / name
    return out


@pytest.fixture(scope="module")
def runs(folders, tmp_path_factory):
    """tp -> [(case, inputs, the case's rank results)]: one gloo run of every case of both tp sizes."""
    configs = {p: preset(p) for p in folders}
    cases = {n: _cases(LAYERS[n]) for n in LAYERS}
    job = {n: [(c, step_inputs(configs[c.preset], c, seed=k)) for k, c in enumerate(cases[n])] for n in LAYERS}
    job.update(configs=configs, folders={p: str(f) for p, f in folders.items()})
    got = run_world(tmp_path_factory.mktemp("world"), job)
    return {n: [(c, d, got[n][k]) for k, (c, d) in enumerate(job[n])] for n in LAYERS}


@pytest.fixture(scope="module")
def whole(folders):
    """The whole layers and their LoRA slots, by (preset, layer)."""
    out = {}
    for name, folder in folders.items():
        ck = load_checkpoint(folder / "ckpt")
        ads = [load_adapter(folder / f"adapter{k}", ck.config) for k in range(len(ADAPTERS))]
        for lw in ck.layers:
            out[name, lw.index] = (GdnLayer(ck.config, lw, F64), build_slots(ck.config, lw.index, LIMITS, ads, F64))
    return out


def _check_case(case: Case, data: dict, ranks: list[dict], ref: dict) -> None:
    cfg, what = preset(case.preset), f"tp={len(ranks)} {case.name}"
    if case.host_reduce:  # each rank returns its partial sum: the host's all-reduce is the sum over ranks
        x = torch.stack([r["x"] for r in ranks]).sum(0)
        assert_close(f"{what}: hidden", ref["x"] + (0 if ref["residual"] is None else ref["residual"]),
                     x + ranks[0]["residual"], EXACT)
    else:
        for k, r in enumerate(ranks):
            assert_close(f"{what}: rank {k} output", ref["x"], r["x"], EXACT)
            assert torch.equal(r["x"], ranks[0]["x"]), f"{what}: the ranks' all-reduced outputs differ"
    if ref["residual"] is not None:
        for k, r in enumerate(ranks):
            assert_close(f"{what}: rank {k} residual", ref["residual"], r["residual"], EXACT)
    lengths, rows, _ = STEPS[case.mode]
    untouched = [s for s in range(data["pools"]["ssm"].shape[0])
                 if s not in rows or case.mode.spec.writes is Writes.STASH]
    for p in STATE_PARTS:
        if data["pools"][p] is None:
            continue
        got = gather_part(cfg, p, [r["pools"][p] for r in ranks])
        assert_close(f"{what}: {p} pools", ref["pools"][p], got, EXACT)
        assert torch.equal(got[untouched], data["pools"][p][untouched]), f"{what}: {p} rows of other slots changed"
        if p == "ple_conv":
            assert all(torch.equal(r["pools"][p], ranks[0]["pools"][p]) for r in ranks), f"{what}: PLE carries differ"
        if "extra" in ref:
            assert_close(f"{what}: {p} {case.mode.spec.writes.value}", ref["extra"][p],
                         gather_part(cfg, p, [r["extra"][p] for r in ranks]), EXACT)


@pytest.mark.parametrize("size,name,layer", [pytest.param(n, p, i, id=f"tp{n}-{p}-layer{i}")
                                             for n in (2, 4) for p, i in LAYERS[n]])
def test_ranks_equal_the_whole_layer(runs, whole, size, name, layer):
    base, slots = whole[name, layer]
    mine = [(c, d, r) for c, d, r in runs[size] if (c.preset, c.layer) == (name, layer)]
    for case, data, ranks in mine:
        _check_case(case, data, ranks, run_case(base, case, data, slots))
    assert len(mine) == len(LayerMode) * 4  # every mode, reduced in the layer or by the host, with and without LoRA
