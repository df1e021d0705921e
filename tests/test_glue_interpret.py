"""The fused glue's Triton kernels on the CPU under the Triton interpreter (fp32), so CI checks their logic.

As in test_triton_interpret.py, Triton picks the interpreter at import, so `test_interpreter` reruns this file in a
subprocess with TRITON_INTERPRET=1 and only there are the cases below defined: every kernel against its float64
reference on random inputs with row-strided operands, one and four streams, non-power-of-two widths and poisoned
(NaN) outputs; and the layer with the Triton glue against the torch glue in every mode and layer variant.
Only fp32: the interpreter casts fp32 to bf16 by truncation (Triton 3.9: 32462 of 65536 random values differ
from torch's round-to-nearest-even), so bf16 runs here would not be the GPU's arithmetic; bf16 is checked on the
GPU (test_glue.py).
"""

from __future__ import annotations


import pytest
import torch

from .kernel_support import INSIDE, rerun_under_interpreter

if not INSIDE:

    def test_interpreter():
        rerun_under_interpreter(__file__)

else:
    from gdn_trt.model.modes import LayerMode
    from gdn_trt.plugins.glue import op as glue_op
    from gdn_trt.plugins.glue import triton as glue_triton

    from .glue_support import LAYERS, Shape, assert_same_step, entry, glue_cases, make_layer, reference, run_step
    from gdn_trt.export.tolerances import tol

    from .tolerances import assert_close

    F32 = torch.float32

    @pytest.mark.parametrize("shape", [Shape(5, 40), Shape(3, 24, n=4, HV=3, V=12, I=20, R=6)],
                             ids=["plain", "hc4"])
    def test_kernels_match_float64(shape, monkeypatch):
        new = glue_triton._new
        monkeypatch.setattr(glue_triton, "_new", lambda *a: new(*a).fill_(float("nan")))
        for seed in range(2):
            for name, args in glue_cases(shape, F32, "cpu", seed).items():
                got = getattr(glue_triton, entry(name))(*args)
                got = got if isinstance(got, tuple) else (got,)
                for k, (ref, g) in enumerate(zip(reference(name, args), got)):
                    assert_close(f"{name}[{k}] seed {seed}", ref, g, tol(F32, "glue"))

    def test_empty_step_launches_nothing():
        for name, args in glue_cases(Shape(0, 40, n=1), F32, "cpu", 0).items():
            out = getattr(glue_triton, entry(name))(*args)
            assert all(t.shape[0] == 0 for t in (out if isinstance(out, tuple) else (out,)) if t is not None)

    @pytest.mark.parametrize("case", LAYERS, ids=lambda c: f"{c[0]}-layer{c[1]}")
    def test_layer_with_triton_glue_equals_torch_glue(case, monkeypatch):
        monkeypatch.setattr(glue_op, "_impl", lambda x: glue_triton)
        layer = make_layer(*case, F32)
        for mode in LayerMode:
            assert_same_step(mode.value, run_step(layer, mode, False, seed=1), run_step(layer, mode, True, seed=1),
                             tol(F32))

    @pytest.mark.parametrize("layer_idx", [1, 2], ids=["hc+ple", "hc"])
    def test_hc_rank_left_to_the_host_triton_glue_equals_torch_glue(layer_idx, monkeypatch):
        """A tensor-parallel rank's hc layer whose host does the reduction returns (write-gated delta, streams):
        the fused path (inject kernel onto zero streams) equals the torch path. A mixer-only layer's one reduction
        is then the host's, so no collective runs and the process-group check is patched out."""
        from gdn_trt.model.checkpoint import random_layer
        from gdn_trt.model.config import Shard, preset
        from gdn_trt.model.layer import GdnLayer
        from gdn_trt.model.tp import TpSpec, shard_config

        monkeypatch.setattr(glue_op, "_impl", lambda x: glue_triton)
        monkeypatch.setattr(TpSpec, "check", lambda self, cfg: None)
        cfg = shard_config(preset("tiny-4exp-tp"), Shard(2, 1))
        lw = random_layer(cfg, layer_idx, torch.Generator().manual_seed(3))
        layer = GdnLayer(cfg, lw, F32, TpSpec(host_reduce=True))
        for mode in LayerMode:
            ref, got = run_step(layer, mode, False, seed=2), run_step(layer, mode, True, seed=2)
            assert ref.residual is not None and got.residual is not None  # (delta, streams)
            assert_same_step(mode.value, ref, got, tol(F32))
