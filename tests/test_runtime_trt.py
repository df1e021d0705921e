"""The session on TensorRT plans (marked gpu; skipped, with its reason, where tensorrt does not import): export and
build every mode of a tiny stack, per layer and as stack plans, then the same steps on backend="trt" and
backend="torch" must agree, pools included. Not run in this repository's
CI or GPU sessions so far (no TensorRT there); docs/tensorrt.md holds the steps for a machine that has it."""

from __future__ import annotations

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.session import Session, SessionOptions

from .tolerances import assert_close

pytestmark = pytest.mark.gpu
trt = pytest.importorskip("tensorrt", reason="TensorRT is not installed: pip install 'gdn-trt[trt]'")


@pytest.fixture(scope="module", params=[False, True], ids=["per-layer", "stack"])
def built(tmp_path_factory, request):
    from gdn_trt.export.artifacts import ExportPlan, Manifest, export_checkpoint
    from gdn_trt.export.build import BuildOptions, build_graph
    from gdn_trt.export.spec import Limits

    root = tmp_path_factory.mktemp("trt")
    ck = load_checkpoint(make_synthetic_checkpoint("tiny-3.5", root / "ckpt", seed=0))
    limits = Limits(max_seqs=4, max_tokens=64, max_draft=4, pool_slots=4)
    m = Manifest.load(export_checkpoint(ck, root / "onnx", ExportPlan(limits=limits, stack=request.param)))
    for rec in m.graphs:
        build_graph(m, rec, BuildOptions(root / "engines"))
    return ck, root / "engines", request.param


def test_trt_session_equals_torch_session(built):
    """Per-layer plans, and the stack plans of tiny-3.5's one run of three GDN layers (one enqueue per step), both
    with the weights bound from the session's one copy."""
    ck, engines, stack = built
    opts = SessionOptions(limits=RuntimeLimits(max_seqs=4, max_prefill_tokens=64, max_draft=4), graphs=False)
    sessions = [Session.open(ck, engines_dir=str(engines), backend="trt", device="cuda", options=opts),
                Session.open(ck, backend="torch", device="cuda", options=opts)]
    assert {e.name for c in sessions[0].selector.engines for e in c} == {"trt-stack" if stack else "trt"}
    assert (engines / "config.json").is_file()  # build --out is the plans folder itself
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 12, ck.config.stream_dim, generator=g).cuda()
    outs = []
    for s in sessions:
        a, b = s.add_sequence(), s.add_sequence()
        o = s.prefill_batch({a: Prompt(h[0, :7]), b: Prompt(h[1, :5])})
        d = s.decode({a: h[0, 7:8], b: h[1, 5:6]})
        v = s.verify({a: h[0, 8:11], b: h[1, 6:6]})
        s.accept({a: 2, b: 0})
        outs.append([o[a].hidden, o[b].hidden, d[a], d[b], v[a],
                     *(t for st in s.pool.layers.values() for t in st.tensors())])
    for k, (x, y) in enumerate(zip(outs[0], outs[1])):
        assert_close(f"trt vs torch [{k}]", y, x, tol(torch.float32))
