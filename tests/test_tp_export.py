"""Export per tensor-parallel rank (`gdn-trt export --tp 2`): each rank's graphs, run in ONNX Runtime on the rank's
slices of the same inputs, output partial sums whose total (plus the replicated rest) is the whole layer's output
(the tp = 1 torch layer), and the rank's pools, stashes and captures are the slices of the whole layer's. One layer
per family: Qwen3-Next (mixer-only), Qwen3.5 without a dense MLP (its MoE models' layers), Qwen4-Exp with hc and
PLE; the verify and prefill modes (stash; pools and capture). Each rank folder has its manifest and engine config
naming the rank; the plans finder takes a rank's folder and refuses another rank's plans naming both.

Tolerance: the compare bound of each output (`export.tolerances.bound`, float32): the rank graphs run in ONNX
Runtime (the ops' ONNX function bodies) against the torch layer, and the partial sums add in another order.
"""

from __future__ import annotations

import json

import pytest
import torch

from gdn_trt.export.artifacts import Manifest, export_layer
from gdn_trt.export.cli import main as export_main
from gdn_trt.export.compare import weight_feed
from gdn_trt.export.data import GraphData
from gdn_trt.export.engine_config import model_fields
from gdn_trt.export.runners import TorchRunner, as_torch, onnxrt_runner
from gdn_trt.export.spec import Role, graph_spec
from gdn_trt.export.tolerances import bound
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import Shard, preset
from gdn_trt.model.modes import LayerMode
from gdn_trt.runtime.plan_files import PlanMismatchError
from gdn_trt.runtime.plans import find_plans

from .tolerances import assert_close
from .tp_support import gather_part, rank_part

TP = 2
MODES = (LayerMode.VERIFY_MULTI, LayerMode.PREFILL_VARLEN)
CASES = {  # name -> (config, layer)
    "tiny-next-tp": (preset("tiny-next-tp"), 0),
    "tiny-3.5-tp-moe": (preset("tiny-3.5-tp").replace(name="tiny-3.5-tp-moe", intermediate_size=0,
                                                      dense_mlp_layers=()), 0),
    "tiny-4exp-tp": (preset("tiny-4exp-tp"), 2),
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-export")
    out = {}
    for name, (cfg, layer) in CASES.items():
        ck = make_synthetic_checkpoint(cfg, root / name / "ckpt", seed=3)
        assert load_checkpoint(ck).config.config_hash() == cfg.config_hash()  # the variant round-trips
        dst = root / name / "onnx"
        rc = export_main(["export", "--checkpoint", str(ck), "--tp", str(TP), "--layers", str(layer), "--modes",
                          ",".join(m.value for m in MODES), "--out", str(dst)])
        assert rc == 0
        out[name] = (ck, dst)
    return out


def _run(runner, feed: dict) -> dict:
    with runner:
        return {k: as_torch(v).clone() for k, v in runner.infer(feed).items()}


@pytest.mark.parametrize("name", list(CASES))
def test_rank_graphs_sum_to_the_whole_layer(exports, name):
    cfg, layer = CASES[name]
    ck_dir, dst = exports[name]
    whole_ck = load_checkpoint(ck_dir)
    whole = export_layer(cfg, next(lw for lw in whole_ck.layers if lw.index == layer), cfg.dtype)
    ranks = []
    for r in range(TP):
        m = Manifest.load(dst / f"rank{r}")
        rank_ck = load_checkpoint(ck_dir, Shard(TP, r))
        assert m.data["tp"] == {"size": TP, "rank": r, "reduce": "host"}
        assert m.data["config_hash"] == rank_ck.config.config_hash() != cfg.config_hash()
        assert m.data["engine_config"]["tp"] == m.data["tp"]
        assert m.data["engine_config"]["recurrent_state_num_heads"] == cfg.linear_num_value_heads // TP
        ranks.append((m, export_layer(rank_ck.config, rank_ck.layers[[lw.index for lw in rank_ck.layers].index(layer)],
                                      cfg.dtype)))
    checked = 0
    for mode in MODES:
        recs = [next(g for g in m.graphs if g.spec.mode is mode) for m, _ in ranks]
        spec = graph_spec(cfg, layer, mode, recs[0].spec.limits, cfg.dtype)
        data = GraphData(spec, iterations=1, seed=11, weights=weight_feed(spec, [whole]))
        for feed in data:
            ref = _run(TorchRunner(whole, spec), feed)
            outs = []
            for r, (rec, (m, lay)) in enumerate(zip(recs, ranks)):
                rspec = rec.spec
                mine = dict(weight_feed(rspec, [lay]))
                for t in rspec.inputs:
                    if t.role in (Role.POOL, Role.STASH, Role.CAPTURE):
                        part = t.name.rpartition("_")[0]
                        mine[t.name] = rank_part(cfg, part, as_torch(feed[t.name]), TP, r).numpy()
                    elif t.role is not Role.WEIGHT:
                        mine[t.name] = feed[t.name]
                outs.append(_run(onnxrt_runner(m.root / rec.path), mine))
            hidden = sum(o["x_out"] for o in outs) + outs[0]["residual_out"]
            want = ref["streams_out"] if cfg.is_hc else ref["x_out"] + ref["residual_out"]
            assert_close(f"{name} {mode.value}: summed rank outputs", want.double(), hidden.double(),
                         bound(spec, "streams_out" if cfg.is_hc else "x_out"))
            assert not torch.allclose(outs[0]["x_out"], outs[1]["x_out"])
            for o in spec.outputs:
                if o.role in (Role.POOL, Role.STASH, Role.CAPTURE):
                    part = o.aliases.rpartition("_")[0]
                    got = gather_part(cfg, part, [x[o.name] for x in outs])
                    assert_close(f"{name} {mode.value}: {o.name}", ref[o.name].double(), got.double(),
                                 bound(spec, o.name))
                    checked += 1
    assert checked >= 4


def test_plans_of_a_rank_are_found_by_rank_and_another_rank_is_refused(exports, tmp_path):
    ck_dir, dst = exports["tiny-next-tp"]
    cfg = load_checkpoint(ck_dir).config
    configs = {r: load_checkpoint(ck_dir, Shard(TP, r)).config for r in range(TP)}
    for r in range(TP):  # what gdn-trt build writes beside a rank's plans: its engine config (no TensorRT here)
        (tmp_path / f"rank{r}").mkdir()
        ec = Manifest.load(dst / f"rank{r}").data["engine_config"]
        (tmp_path / f"rank{r}" / "config.json").write_text(json.dumps(ec))
        assert ec["tp"] == {"size": TP, "rank": r, "reduce": "host"} and model_fields(configs[r], "float32")["tp"]
    # the parent folder: rank 1's session goes to rank1/ (no plan manifest there: that is what it says)
    with pytest.raises(FileNotFoundError, match="rank1"):
        find_plans(tmp_path, configs[1], "float32")
    with pytest.raises(PlanMismatchError, match="rank 0 of tp=2; this session holds rank 1 of tp=2"):
        find_plans(tmp_path / "rank0", configs[1], "float32")
    with pytest.raises(PlanMismatchError, match="this session holds the whole model"):
        find_plans(tmp_path, cfg, "float32")


def test_rank_exports_that_would_hold_a_collective_are_refused_before_writing(tmp_path, capsys):
    out = tmp_path / "o"
    for extra, why in ((["--stack"], "stack graph"),
                       (["--tp", "3"], "does not divide")):
        args = ["export", "--preset", "tiny-next-tp", "--tp", "2", "--modes", "decode", "--out", str(out), *extra]
        assert export_main(args) == 2
        assert why in capsys.readouterr().err
        assert not out.exists()
