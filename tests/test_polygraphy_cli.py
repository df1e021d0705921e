"""Polygraphy's own CLI on an export: `polygraphy run <export>/layer<i>/<mode>.onnx --onnxrt --data-loader-script
<export>/layer<i>/<mode>_data.py` runs, on inputs that respect the GraphSpec (valid packings, distinct slots, a
padding sequence, capture points), and its outputs equal the torch layer's; `--save-inputs` then `--load-inputs` (for
a machine without gdn-trt) runs the same inputs again."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from polygraphy.json import load_json

from gdn_trt.export.compare import layers_of
from gdn_trt.export.data import loader_script
from gdn_trt.export.runners import TorchRunner
from gdn_trt.export.spec import Variant
from gdn_trt.export.tolerances import bound, errors, within
from gdn_trt.model.modes import LayerMode, Writes

from .test_export import VARIANTS, exported, record  # noqa: F401 (exported: the shared session fixture)

# the `polygraphy` console script's own entry point, run by this interpreter
POLYGRAPHY = [sys.executable, "-c", "import sys; from polygraphy.tools import main; sys.argv[0] = 'polygraphy'; "
                                    "sys.exit(main())"]


def polygraphy(*args: str, cwd) -> subprocess.CompletedProcess:
    p = subprocess.run([*POLYGRAPHY, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "PASSED" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]
    return p


def test_every_graph_has_its_data_loader_script(exported):
    for m in exported.values():
        for rec in m.graphs:
            script = loader_script(m.root / rec.path)
            text = script.read_text()
            assert f"polygraphy run {rec.path} --onnxrt --data-loader-script {script.parent.name}/{script.name}" \
                in text
            assert "--trt-min-shapes" in text and "--strongly-typed" in text


@pytest.mark.parametrize("variant, mode", [(Variant.PLAIN, LayerMode.DECODE_MULTI_SEQ),
                                           (Variant.HC_PLE, LayerMode.VERIFY_MULTI),
                                           (Variant.HC_PLE, LayerMode.PREFILL_VARLEN)],
                         ids=["plain-decode_multi_seq", "hc+ple-verify_multi", "hc+ple-prefill_varlen"])
def test_polygraphy_run_onnxrt_on_an_export(exported, variant, mode, tmp_path):
    m, rec = exported[variant], record(exported, variant, mode)
    spec, script = rec.spec, loader_script(m.root / rec.path)
    ins, outs = tmp_path / "inputs.json", tmp_path / "outputs.json"
    polygraphy("run", rec.path, "--onnxrt", "--data-loader-script", str(script.relative_to(m.root)),
               "--save-inputs", str(ins), "--save-outputs", str(outs), cwd=m.root)
    feeds = load_json(ins)
    results = load_json(outs)[0][1]  # (runner name, [iteration outputs])
    assert len(feeds) == len(results) == 2
    assert any(np.any(f["slots"] == -1) for f in feeds), "a padding sequence (slot -1) in some iteration"
    assert m.data["model"] == spec.model == VARIANTS[variant][0]
    layer = layers_of(m, "float32")[spec.layer_idx]
    with TorchRunner(layer, spec, "cpu") as torch_runner:
        for feed, got in zip(feeds, results):
            cu, slots = feed["cu_seqlens"], feed["slots"]
            live = slots[slots >= 0]
            assert cu[0] == 0 and np.all(np.diff(cu) >= 0) and len(set(live.tolist())) == len(live)
            assert np.all(slots < spec.limits.pool_slots)
            if mode.spec.writes is Writes.POOLS_CAPTURE:
                assert np.all((feed["capture_at"] >= -1) & (feed["capture_at"] <= np.diff(cu)))
            want = torch_runner.infer(feed)
            for name in spec.output_names:
                assert within(bound(spec, name), *errors(want[name], got[name])), name
    polygraphy("run", rec.path, "--onnxrt", "--load-inputs", str(ins), "--load-outputs", str(outs), cwd=m.root)
