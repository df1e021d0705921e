"""`gdn-trt export --aot`: the AOT form of every mode and variant, against the torch layer in ONNX Runtime.

The prefill modes are exported through the real command (three processes, one per variant: plain, hc, hc+PLE);
their multi-kernel op nodes must be exactly the pass chains (`spec.AOT_CHAINS`) with the intermediates the GraphSpec
declares (role scratch, shapes and dtypes in the value_info), and ONNX Runtime (the pass bodies) must agree with
the torch layer. The decode and verify modes have no multi-kernel op: their AOT form is their JIT form, byte for
byte (the rewrite leaves their graphs as they are), and the session's JIT exports are compared in test_compare.py.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import onnx
import pytest

from gdn_trt.export.aot_form import max_seqs, to_aot
from gdn_trt.export.artifacts import Manifest, checkpoint_path
from gdn_trt.export.compare import CompareOptions, compare_graph, layers_of
from gdn_trt.export.spec import Role, Variant, graph_spec
from gdn_trt.model.checkpoint import load_checkpoint
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.plugins.spec import AOT_CHAINS, AOT_PLUGINS, CONV_PREFILL, GDN_CHUNKED, NAMESPACE, PLUGINS_BY_NAME

from .test_export import LIMITS, VARIANTS, exported, record  # noqa: F401 (exported: the shared session fixture)

PREFILL = [m for m in LayerMode if m.spec.writes is Writes.POOLS_CAPTURE]
_cache: dict[Variant, Manifest] = {}


@pytest.fixture(scope="session")
def aot_exported(tmp_path_factory) -> dict[Variant, Manifest]:
    if _cache:
        return _cache
    root = tmp_path_factory.mktemp("onnx-aot")
    procs = {}
    for variant, (preset, layer) in VARIANTS.items():
        cmd = [sys.executable, "-m", "gdn_trt.export.cli", "export", "--preset", preset, "--layers", str(layer),
               "--out", str(root / variant.value), "--aot", "--modes", ",".join(m.value for m in PREFILL), *LIMITS]
        procs[variant] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for variant, p in procs.items():
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, f"export --aot of {variant.value} failed:\n{log[-4000:]}"
        _cache[variant] = Manifest.load(root / variant.value)  # --out is the export folder itself
    return _cache


@pytest.mark.parametrize("mode", PREFILL, ids=lambda m: m.value)
@pytest.mark.parametrize("variant", list(VARIANTS), ids=lambda v: v.value)
def test_aot_prefill_graph_is_pass_chains_and_matches_torch(aot_exported, variant, mode):
    m = aot_exported[variant]
    assert m.data["form"] == "aot"
    (rec,) = [g for g in m.graphs if g.spec.mode is mode]
    spec = rec.spec
    assert spec.aot and spec.scratch and all(t.role is Role.SCRATCH for t in spec.scratch)
    model = onnx.load(str(m.root / rec.path), load_external_data=False)
    custom = [n for n in model.graph.node if n.domain == NAMESPACE]
    assert all(PLUGINS_BY_NAME[n.op_type] in AOT_PLUGINS for n in custom), "every node one kernel"
    convs = 2 if variant is Variant.HC_PLE else 1
    chains = [p.name for op, k in ((GDN_CHUNKED, 1), (CONV_PREFILL, convs)) for _ in range(k) for p in AOT_CHAINS[op]]
    assert sorted(n.op_type for n in custom) == sorted(chains)
    for n in custom:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        assert attrs.get("max_seqs", max_seqs(spec)) == max_seqs(spec) == (1 if mode.spec.seqs == 1 else 8)
    info = {v.name: v.type.tensor_type for v in model.graph.value_info}
    for t in spec.scratch:
        dims = tuple(d.dim_param or d.dim_value for d in info[t.name].shape.dim)
        assert dims == t.dims, (t.name, dims, t.dims)
    made = [o for n in custom for o in n.output]
    scratch = [o for o in made if o in {t.name for t in spec.scratch}]
    assert sorted(scratch) == sorted(t.name for t in spec.scratch), "each intermediate made once"
    assert len(made) - len(scratch) == 3 * (1 + convs), "the rest are the ops' own outputs"
    assert {f.name for f in model.functions} == {n.op_type for n in custom}
    res = compare_graph(m, rec, layers_of(m, "float32"), CompareOptions(("torch", "onnxrt")))
    assert res.passed, res.summary()


@pytest.mark.parametrize("variant", list(VARIANTS), ids=lambda v: v.value)
def test_decode_and_verify_graphs_are_already_aot(exported, variant):
    """Without a multi-kernel op the AOT form is the JIT form: no scratch, the rewrite changes nothing, every node
    has an `aot_impl`."""
    m = exported[variant]
    cfg = load_checkpoint(checkpoint_path(m)).config
    for mode in LayerMode:
        if mode in PREFILL:
            continue
        rec = record(exported, variant, mode)
        spec = rec.spec
        aot = graph_spec(cfg, spec.layer_idx, mode, spec.limits, spec.act_dtype, aot=True)
        assert aot.scratch == () and aot.inputs == spec.inputs and aot.outputs == spec.outputs
        model = onnx.load(str(m.root / rec.path), load_external_data=False)
        rewritten = to_aot(copy.deepcopy(model), aot)
        assert rewritten.SerializeToString() == model.SerializeToString()
        assert all(PLUGINS_BY_NAME[n.op_type] in AOT_PLUGINS for n in model.graph.node if n.domain == NAMESPACE)

