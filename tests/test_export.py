"""Export of every LayerMode for the three layer variants (plain, hc, hc+PLE) and the GraphSpec contract of the files.

The exports run once per session through the real command (`gdn-trt export --preset ...`: synthetic checkpoint,
real loader), three processes at once; `exported_models` shares them with the compare and plugin tests.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from gdn_trt.export.artifacts import Manifest, checkpoint_path
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.export.onnx_export import export_mode
from gdn_trt.export.spec import Limits, Role, Variant, graph_spec
from gdn_trt.model.checkpoint import load_checkpoint
from gdn_trt.model.layer import GdnLayer
from gdn_trt.plugins.spec import NAMESPACE

# (variant, preset, layer); tiny-4exp has PLE on its layer 1 (one-indexed ple_layer_ids = (2,))
VARIANTS = {Variant.PLAIN: ("tiny-3.5", 0), Variant.HC: ("tiny-4exp", 0), Variant.HC_PLE: ("tiny-4exp", 1)}
LIMITS = ["--max-seqs", "8", "--max-tokens", "96", "--max-draft", "4", "--pool-slots", "12", "--seq-buckets", "2,8"]
GRAPHS = [pytest.param(v, m, id=f"{v.value}-{m.value}") for v in VARIANTS for m in LayerMode]
_ONNX_DTYPES = {"float32": onnx.TensorProto.FLOAT, "int32": onnx.TensorProto.INT32}
_cache: dict[Variant, Manifest] = {}


def exported_models(tmp_path_factory) -> dict[Variant, Manifest]:
    """variant -> the manifest of its export (one export per session, whichever module asks first)."""
    if _cache:
        return _cache
    root = tmp_path_factory.mktemp("onnx")
    procs = {}
    for variant, (preset, layer) in VARIANTS.items():
        out = root / variant.value
        cmd = [sys.executable, "-m", "gdn_trt.export.cli", "export", "--preset", preset, "--layers", str(layer),
               "--out", str(out), *LIMITS]
        procs[variant] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out)
    for variant, (p, out) in procs.items():
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, f"export of {variant.value} failed:\n{log[-4000:]}"
        _cache[variant] = Manifest.load(out)
        _cache[variant].data["log"] = log
    return _cache


@pytest.fixture(scope="session")
def exported(tmp_path_factory):
    return exported_models(tmp_path_factory)


def record(exported, variant: Variant, mode: LayerMode):
    (rec,) = [g for g in exported[variant].graphs if g.spec.mode is mode]
    return rec


def test_export_prints_one_line_per_graph_and_a_manifest(exported):
    for variant, m in exported.items():
        log = m.data["log"]
        assert f"synthetic checkpoint of preset {VARIANTS[variant][0]} (seed 0)" in log
        for mode in LayerMode:
            stem = mode.value + ("" if variant is Variant.PLAIN else "+" + variant.value)
            line = next(ln for ln in log.splitlines() if f" {stem}: " in ln)
            custom = 3 if variant is Variant.HC_PLE else 2  # GDN conv + recurrence (+ PLE conv)
            assert "inputs" in line and "outputs" in line and f"nodes ({custom} gdn_trt)" in line and "MB ->" in line
        assert "6 graphs, manifest:" in log
        assert [g.spec.mode for g in m.graphs] == list(LayerMode)


def test_out_is_the_export_folder_and_its_paths_are_relative(exported):
    """`--out X` writes X/manifest.json (no model folder nested under X); the preset's synthetic checkpoint sits in
    X/checkpoint/<preset>, and the manifest records every path relative to its folder."""
    for variant, m in exported.items():
        name = VARIANTS[variant][0]
        assert m.path.parent.name == variant.value and m.data["model"] == name
        assert not (m.root / name).exists()
        assert m.data["checkpoint"] == f"checkpoint/{name}" and checkpoint_path(m) == m.root / "checkpoint" / name
        assert all(not Path(g["path"]).is_absolute() for g in m.data["graphs"])


@pytest.mark.parametrize("variant,mode", GRAPHS)
def test_graph_io_matches_graphspec(exported, variant, mode):
    m = exported[variant]
    rec = record(exported, variant, mode)
    ck = load_checkpoint(checkpoint_path(m))
    spec = graph_spec(ck.config, VARIANTS[variant][1], mode, Limits(8, 96, 4, 12, (2, 8)), "float32")
    assert rec.spec == spec
    path = m.root / rec.path
    model = onnx.load(str(path), load_external_data=False)
    for vis, tspecs in ((model.graph.input, spec.inputs), (model.graph.output, spec.outputs)):
        assert [v.name for v in vis] == [t.name for t in tspecs]
        for v, t in zip(vis, tspecs):
            tt = v.type.tensor_type
            assert tt.elem_type == _ONNX_DTYPES[t.dtype], t.name
            dims = tuple(d.dim_param or d.dim_value for d in tt.shape.dim)
            assert dims == t.dims, f"{t.name}: {dims} != {t.dims}"
    for out, inp in spec.aliases.items():
        o, i = spec.output(out), spec.input(inp)
        assert (o.dtype, o.dims) == (i.dtype, i.dims), f"{out} must have the shape and dtype of {inp}"
    writes_pools = mode.spec.writes is not Writes.STASH
    assert sorted(spec.aliases.values()) == sorted(t.name for t in spec.inputs
                                                    if t.role.value in ("stash", "capture")
                                                    or (t.role.value == "pool" and writes_pools))


@pytest.mark.parametrize("variant", list(VARIANTS), ids=lambda v: v.value)
def test_files_are_checked_self_contained_and_hashed(exported, variant):
    m = exported[variant]
    for rec in m.graphs:
        path = m.root / rec.path
        onnx.checker.check_model(str(path), full_check=True)
        model = onnx.load(str(path), load_external_data=False)
        custom = {n.op_type for n in model.graph.node if n.domain == NAMESPACE}
        assert custom and custom == {(f.name) for f in model.functions if f.domain == NAMESPACE}
        assert {o.domain: o.version for o in model.opset_import}[NAMESPACE] == 1
        weights = [t.name for t in rec.spec.inputs if t.role is Role.WEIGHT]
        assert weights and set(weights) <= {v.name for v in model.graph.input}, "weights are graph inputs"
        big = [(t.name, list(t.dims)) for t in model.graph.initializer if np.prod(t.dims, dtype=np.int64) > 8]
        assert not big, f"weights as inputs: no weight may stay inside the graph, found {big}"
        assert not path.with_name(path.name + ".data").exists()
        assert hashlib.sha256(path.read_bytes()).hexdigest() == rec.sha256


def test_export_is_a_pure_function_of_config_weights_and_mode(exported, tmp_path):
    m = exported[Variant.PLAIN]
    rec = record(exported, Variant.PLAIN, LayerMode.DECODE_MULTI_SEQ)
    ck = load_checkpoint(checkpoint_path(m))
    layer = GdnLayer(ck.config, ck.layers[0], torch.float32).eval()
    path = export_mode(layer, LayerMode.DECODE_MULTI_SEQ, tmp_path, Limits(8, 96, 4, 12, (2, 8)))
    original = m.root / rec.path
    assert path.read_bytes() == original.read_bytes()
    assert not Path(str(path) + ".data").exists() and not Path(str(original) + ".data").exists()


def test_embedded_weights_are_initializers_in_the_data_file(exported, tmp_path):
    """`--embed-weights`: the graph takes no weight input and holds every float weight of the layer as an external
    initializer (one copy per mode: what refit and the selftest's cost measurement need)."""
    m = exported[Variant.HC_PLE]
    ck = load_checkpoint(checkpoint_path(m))
    layer = GdnLayer(ck.config, ck.layers[1], torch.float32).eval()
    path = export_mode(layer, LayerMode.DECODE, tmp_path, Limits(8, 96, 4, 12, (2, 8)), weights=False)
    model = onnx.load(str(path), load_external_data=False)
    spec = graph_spec(ck.config, 1, LayerMode.DECODE, Limits(8, 96, 4, 12, (2, 8)), "float32", weights=False)
    assert spec.weights_inside and [v.name for v in model.graph.input] == list(spec.input_names)
    external = {t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    assert {f"runs.0.layer.{n}" for n in layer.weights() if layer.weights()[n].numel() > 256} <= external
    assert Path(str(path) + ".data").stat().st_size > 0
