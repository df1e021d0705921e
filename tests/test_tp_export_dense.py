"""Export per tensor-parallel rank of dense-MLP layers (Qwen3.5 dense, `tiny-3.5-tp` layer 0): two graphs per rank
and mode, `<mode>+mixer.onnx` and `<mode>+mlp.onnx`, the host's all-reduce between them. Here the host is the test:
each rank's mixer graph runs in ONNX Runtime on the rank's slices of the inputs, its partial `x_out` are summed by
hand (the all-reduce), each rank's mlp graph takes that sum and the mixer's `residual_out`, and its partial `x_out`
summed plus its `residual_out` must be the whole layer's hidden state (the tp = 1 torch layer); the gathered pools
and captures must be the whole layer's. The plans finder refuses the part plans naming the missing piece.

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
from gdn_trt.export.runners import TorchRunner, onnxrt_runner
from gdn_trt.export.spec import GraphSpec, Limits, Role, graph_spec
from gdn_trt.export.tolerances import bound
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import Shard, preset
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.tp import Part, TpError, shard_config
from gdn_trt.runtime.plan_files import PlanMismatchError
from gdn_trt.runtime.plans import find_plans

from .test_tp_export import _run
from .tolerances import assert_close
from .tp_support import gather_part, rank_part

TP, LAYER = 2, 0
MODES = (LayerMode.DECODE_MULTI_SEQ, LayerMode.PREFILL_VARLEN)
CFG = preset("tiny-3.5-tp")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-export-dense")
    ck = make_synthetic_checkpoint(CFG, root / "ckpt", seed=5)
    dst = root / "onnx"
    assert CFG.has_mlp(LAYER)
    assert export_main(["export", "--checkpoint", str(ck), "--tp", str(TP), "--layers", str(LAYER), "--modes",
                        ",".join(m.value for m in MODES), "--out", str(dst)]) == 0
    return ck, dst


def _rank_feed(rec, lay, feed: dict, r: int) -> dict:
    """Rank r's inputs of a mixer graph: its slices of the whole layer's buffers, the shared rest, its weights."""
    mine = dict(weight_feed(rec.spec, [lay]))
    for t in rec.spec.inputs:
        if t.role in (Role.POOL, Role.STASH, Role.CAPTURE):
            mine[t.name] = rank_part(CFG, t.name.rpartition("_")[0], torch.as_tensor(feed[t.name]), TP, r).numpy()
        elif t.role is not Role.WEIGHT:
            mine[t.name] = feed[t.name]
    return mine


def test_rank_part_graphs_with_the_hosts_all_reduce_between_them_are_the_whole_layer(export):
    ck_dir, dst = export
    whole = export_layer(CFG, next(lw for lw in load_checkpoint(ck_dir).layers if lw.index == LAYER), CFG.dtype)
    ranks = []
    for r in range(TP):
        m = Manifest.load(dst / f"rank{r}")
        rank_ck = load_checkpoint(ck_dir, Shard(TP, r))
        assert m.data["engine_config"]["graphs"] == [{"layers": [LAYER], "modes": [x.value for x in MODES],
                                                      "parts": ["mixer", "mlp"]}]
        assert sorted(g.path for g in m.graphs) == sorted(f"layer{LAYER}/{x.value}+{p}.onnx" for x in MODES
                                                          for p in ("mixer", "mlp"))
        ranks.append((m, export_layer(rank_ck.config, next(lw for lw in rank_ck.layers if lw.index == LAYER),
                                      CFG.dtype)))
    checked = 0
    for mode in MODES:
        recs = [{g.spec.part: g for g in m.graphs if g.spec.mode is mode} for m, _ in ranks]
        mlp_spec = recs[0][Part.MLP].spec
        assert [t.name for t in mlp_spec.inputs] == ["x", "residual", "mlp.gate_up", "mlp.down", "norms.post_norm"]
        assert not any(t.name.startswith("mlp.") or t.name == "norms.post_norm"
                       for t in recs[0][Part.MIXER].spec.inputs)
        spec = graph_spec(CFG, LAYER, mode, recs[0][Part.MIXER].spec.limits, CFG.dtype)
        data = GraphData(spec, iterations=1, seed=13, weights=weight_feed(spec, [whole]))
        for feed in data:
            ref = _run(TorchRunner(whole, spec), feed)
            mixed = [_run(onnxrt_runner(m.root / rec[Part.MIXER].path), _rank_feed(rec[Part.MIXER], lay, feed, r))
                     for r, (rec, (m, lay)) in enumerate(zip(recs, ranks))]
            assert not torch.allclose(mixed[0]["x_out"], mixed[1]["x_out"])  # partial sums, not the whole
            assert torch.equal(mixed[0]["residual_out"], mixed[1]["residual_out"])  # replicated
            reduced = sum(o["x_out"] for o in mixed)  # the host's first all-reduce
            mlp_outs = []
            for rec, (m, lay) in zip(recs, ranks):
                feed_mlp = {"x": reduced.numpy(), "residual": mixed[0]["residual_out"].numpy(),
                            **weight_feed(rec[Part.MLP].spec, [lay])}
                mlp_outs.append(_run(onnxrt_runner(m.root / rec[Part.MLP].path), feed_mlp))
            assert not torch.allclose(mlp_outs[0]["x_out"], mlp_outs[1]["x_out"])
            hidden = sum(o["x_out"] for o in mlp_outs) + mlp_outs[0]["residual_out"]  # the host's second
            assert_close(f"{mode.value}: summed mlp parts + residual", (ref["x_out"] + ref["residual_out"]).double(),
                         hidden.double(), bound(spec, "x_out"))
            assert_close(f"{mode.value}: mlp residual_out", ref["residual_out"].double(),
                         mlp_outs[1]["residual_out"].double(), bound(spec, "residual_out"))
            for o in spec.outputs:
                if o.role in (Role.POOL, Role.STASH, Role.CAPTURE):
                    got = gather_part(CFG, o.aliases.rpartition("_")[0], [x[o.name] for x in mixed])
                    assert_close(f"{mode.value}: {o.name}", ref[o.name].double(), got.double(), bound(spec, o.name))
                    checked += 1
    assert checked == 6  # decode_multi_seq: 2 pools; prefill_varlen: 2 pools + 2 captures


def test_part_specs_round_trip_and_only_a_ranks_dense_layer_has_parts():
    rank = shard_config(CFG, Shard(TP, 1))
    for part in Part:
        s = graph_spec(rank, LAYER, LayerMode.VERIFY_MULTI, Limits(), part=part)
        assert GraphSpec.from_json(s.to_json()) == s and s.stem == f"verify_multi+{part.value}"
    assert "part" not in graph_spec(CFG, LAYER, LayerMode.DECODE, Limits()).to_json()
    with pytest.raises(TpError, match=r"has the graphs \['mixer', 'mlp'\] per mode"):
        graph_spec(rank, LAYER, LayerMode.DECODE, Limits())  # the whole layer would hold its first all-reduce
    with pytest.raises(TpError, match=r"has the graphs \[None\]"):
        graph_spec(CFG, LAYER, LayerMode.DECODE, Limits(), part=Part.MLP)  # a whole model has no parts


def test_part_plans_are_refused_by_the_plans_finder_naming_the_missing_piece(export, tmp_path):
    ck_dir, dst = export
    m = Manifest.load(dst / "rank1")
    (tmp_path / "config.json").write_text(json.dumps(m.data["engine_config"]))
    rec = next(g for g in m.graphs if g.spec.part is Part.MLP)
    # what gdn-trt build writes beside a plan: its manifest with the GraphSpec (no TensorRT here, so no plan file:
    # the refusal comes before the plan is looked for)
    (tmp_path / "layer0").mkdir()
    (tmp_path / "layer0" / "x.json").write_text(json.dumps({"config_hash": rec.spec.config_hash,
                                                            "graph_spec": rec.spec.to_json(), "plan": "x.plan"}))
    with pytest.raises(PlanMismatchError, match=r"mlp part plan of dense-MLP layer 0 \(rank 1 of tp=2\).*torch "
                                                r"backend"):
        find_plans(tmp_path, load_checkpoint(ck_dir, Shard(TP, 1)).config, "float32")


def test_lora_slots_on_dense_rank_layers_are_refused_before_writing(tmp_path, capsys):
    out = tmp_path / "o"
    assert export_main(["export", "--preset", "tiny-3.5-tp", "--tp", "2", "--layers", "0", "--modes", "decode",
                        "--lora-slots", "2", "--out", str(out)]) == 2
    assert "no per-sequence LoRA slots yet" in capsys.readouterr().err
    assert not out.exists()
