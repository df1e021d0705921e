"""Stack export (`gdn-trt export --stack`): one graph per mode for each run of consecutive GDN layers, compared in ONNX
Runtime against the torch layers like the per-layer graphs.

Every mode of: a plain run (tiny-3.5, layers 0-2, dense MLPs), an hc run holding an hc+PLE layer (tiny-4exp with a
dense MLP in each GDN layer, layers 0-2: hc, hc+PLE, hc; an in-memory checkpoint, since the released hc family runs
an MoE after every mixer and so has runs of one layer) and the two-layer run of a hybrid layout whose attention
layers split the GDN layers into (0), (2, 3), (5). The graphs take every layer's pools (`l<i>.ssm_pool`, ...) and
weights as inputs, the files follow the GraphSpec, the manifest records the runs and the engine config, and a graph
that binds one layer's weights where another's belong fails the comparison.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch
from polygraphy.json import load_json

from gdn_trt.export import cli
from gdn_trt.export.artifacts import ExportPlan, Manifest, checkpoint_path, export_checkpoint
from gdn_trt.export.compare import CompareOptions, compare_graph, layers_of
from gdn_trt.export.data import loader_script
from gdn_trt.export.runners import TorchRunner
from gdn_trt.export.spec import Limits, Role, graph_spec
from gdn_trt.export.tolerances import bound, errors, within
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.modes import LayerMode
from gdn_trt.plugins.spec import NAMESPACE
from gdn_trt.runtime.session import synthetic

from .test_compare import swap_inputs
from .test_polygraphy_cli import polygraphy
from .test_runtime_stack import HC_DENSE, HYBRID

LIMITS = Limits(max_seqs=4, max_tokens=96, max_draft=4, pool_slots=6, seq_buckets=(2, 4))
CASES = {"plain": (preset("tiny-3.5"), "all", (0, 1, 2)), "hc+ple": (HC_DENSE, "all", (0, 1, 2)),
         "hybrid": (HYBRID, "2,3", (2, 3))}
GRAPHS = [pytest.param(c, m, id=f"{c}-{m.value}") for c in CASES for m in LayerMode]


@pytest.fixture(scope="module")
def stacks(tmp_path_factory) -> dict[str, tuple[Manifest, dict[int, GdnLayer]]]:
    """case -> (its export manifest, its torch layers). The hc run is a config no HF checkpoint has (Qwen4-Exp runs
    an MoE after every mixer), so its checkpoint stays in memory; the others are written and loaded back."""
    root = tmp_path_factory.mktemp("stack")
    out = {}
    for name, (cfg, layers, _) in CASES.items():
        if cfg.is_hc:
            ck = synthetic(cfg, 1)[0]
        else:
            ck = load_checkpoint(make_synthetic_checkpoint(cfg, root / "ckpt" / cfg.name, seed=1))
        m = Manifest.load(export_checkpoint(ck, root / name, ExportPlan(layers=layers, limits=LIMITS, stack=True)))
        out[name] = m, {lw.index: GdnLayer(ck.config, lw, torch.float32).eval() for lw in ck.layers}
    return out


def _record(m: Manifest, mode: LayerMode):
    (rec,) = [g for g in m.graphs if g.spec.mode is mode]
    return rec


@pytest.mark.parametrize("case,mode", GRAPHS)
def test_stack_graph_follows_its_spec_and_matches_torch_in_onnxrt(stacks, case, mode):
    cfg, _, ids = CASES[case]
    m, layers = stacks[case]
    rec = _record(m, mode)
    spec = graph_spec(cfg, ids, mode, LIMITS, "float32")
    assert rec.spec == spec and rec.path == f"stack{ids[0]}-{ids[-1]}/{spec.stem}.onnx"
    model = onnx.load(str(m.root / rec.path), load_external_data=False)
    assert [v.name for v in model.graph.input] == list(spec.input_names)
    assert [v.name for v in model.graph.output] == list(spec.output_names)
    ple = sum(cfg.has_ple(i) for i in ids)
    assert sum(n.domain == NAMESPACE for n in model.graph.node) == 2 * len(ids) + ple, "each layer's custom ops"
    assert not model.graph.initializer or max(len(t.raw_data) for t in model.graph.initializer) <= 64, \
        "weights are inputs, not initializers"
    res = compare_graph(m, rec, layers, CompareOptions(("torch", "onnxrt")))
    assert {r["output"] for r in res.records} == set(spec.output_names)
    assert res.passed, res.summary() + "\n" + "\n".join(
        f"{r['output']} it{r['iteration']}: {r['rel_rms']:.2e} (bound {r['bound_rel_rms']:.0e})"
        for r in res.records if not r["passed"])


def test_manifest_records_the_runs_and_the_engine_config(stacks):
    m = stacks["hc+ple"][0]
    assert m.data["stack"] is True and m.data["weights"] == "inputs"
    assert [g["layers"] for g in m.data["graphs"]] == [[0, 1, 2]] * len(LayerMode)
    ec = m.data["engine_config"]
    assert ec["stack_runs"] == [[0, 1, 2]] and ec["graphs"] == [{"layers": [0, 1, 2],
                                                                  "modes": [x.value for x in LayerMode]}]
    assert ec["ple_layer_ids"] == [1] and ec["num_linear_attn_layers"] == 3


def test_hybrid_layout_exports_runs_and_single_layers(stacks, tmp_path):
    ck = load_checkpoint(checkpoint_path(stacks["hybrid"][0]))
    assert ExportPlan(stack=True).graph_layers(ck) == [(0,), (2, 3), (5,)]
    assert ExportPlan().graph_layers(ck) == [(0,), (2,), (3,), (5,)]
    assert cli.main(["export", "--checkpoint", str(checkpoint_path(stacks["hybrid"][0])), "--out", str(tmp_path),
                     "--stack", "--modes", "decode_multi_seq", "--max-seqs", "4", "--pool-slots", "6"]) == 0
    (m,) = Manifest.find(tmp_path)
    assert [g.path for g in m.graphs] == ["layer0/decode_multi_seq.onnx", "stack2-3/decode_multi_seq.onnx",
                                          "layer5/decode_multi_seq.onnx"]
    assert [g.spec.layer_ids for g in m.graphs] == [(0,), (2, 3), (5,)]


def test_a_stack_binding_one_layers_weights_to_another_fails(stacks, tmp_path):
    src = stacks["plain"][0].root
    shutil.copytree(src.parent, tmp_path / "onnx")
    m = Manifest.load(tmp_path / "onnx" / src.name)
    rec = _record(m, LayerMode.DECODE_MULTI_SEQ)
    assert all(t.role is Role.WEIGHT for t in rec.spec.inputs if t.name in ("l0.mixer.out_proj", "l1.mixer.out_proj"))
    swap_inputs(m.root / rec.path, "l0.mixer.out_proj", "l1.mixer.out_proj")
    res = compare_graph(m, rec, layers_of(m, "float32"), CompareOptions(("torch", "onnxrt")))
    assert not res.passed and res.worst()["rel_rms"] > 1e-2


def test_polygraphy_runs_a_stack_graph_on_its_data_loader(stacks, tmp_path):
    """`polygraphy run stack0-2/<mode>.onnx --onnxrt --data-loader-script stack0-2/<mode>_data.py` from the export
    folder: the loader feeds every layer's real weights (read from the export's checkpoint) to the `l<i>.` weight
    inputs, and the graph's outputs equal the torch layers'."""
    m, layers = stacks["plain"]
    rec = _record(m, LayerMode.DECODE_MULTI_SEQ)
    spec, script = rec.spec, loader_script(m.root / rec.path)
    assert script.parent.name == "stack0-2" and "layers 0-2" in script.read_text()
    ins, outs = tmp_path / "inputs.json", tmp_path / "outputs.json"
    polygraphy("run", rec.path, "--onnxrt", "--data-loader-script", str(script.relative_to(m.root)),
               "--save-inputs", str(ins), "--save-outputs", str(outs), cwd=m.root)
    feeds, results = load_json(ins), load_json(outs)[0][1]
    weights = {t.name: layers[t.layer].weights()[t.local].numpy() for t in spec.inputs if t.role is Role.WEIGHT}
    assert len(feeds) == len(results) == 2 and len(weights) == 3 * len(layers[0].weights())
    with TorchRunner([layers[i] for i in spec.layer_ids], spec, "cpu") as runner:
        for feed, got in zip(feeds, results):
            assert all(np.array_equal(feed[n], w) for n, w in weights.items())
            want = runner.infer(feed)
            for name in spec.output_names:
                assert within(bound(spec, name), *errors(want[name], got[name])), name
