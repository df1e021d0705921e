"""The fused glue (plugins/glue) and the layer's fused path.

CPU: the float64 references equal the layer's torch code (norms.py) on random inputs; the layer with the fused path
switched on (CPU -> the references) equals the torch path in float64 in every mode and layer variant, LoRA slots
included, outputs and every state buffer; bad arguments raise before anything runs; the ONNX export path and
torch.compile keep the torch code. GPU (marked gpu): each Triton kernel against float64 at real shapes (Qwen3-Next,
Qwen4-Exp) with poisoned outputs, the fused layer against the torch-glue layer on CUDA in every mode (fp32 and bf16;
tiny and real shapes), and a CUDA-graph replay of the fused layer equal to its eager run bit for bit.
The Triton kernels also run on the CPU under the interpreter: test_glue_interpret.py.
"""

from __future__ import annotations

import os

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.config import PRESETS
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.norms import gated_rms_norm, rms_norm_1p
from gdn_trt.plugins.glue import naive
from gdn_trt.plugins.glue import op as glue

from .glue_support import (LAYERS, Shape, assert_same_step, decode_eager_and_replayed, entry, glue_cases, make_layer,
                           reference, run_step)
from .tolerances import assert_close

F64 = torch.float64
EXACT = tol(F64)


def test_references_equal_the_layer_torch_code():
    x, d, w = torch.randn(7, 96, dtype=F64), torch.randn(7, 96, dtype=F64), torch.randn(96, dtype=F64) * 0.1
    h, r = naive.add_rms_norm(x, (d,), w, 1e-6, 96)
    assert_close("residual", x + d, r, EXACT)
    assert_close("norm", rms_norm_1p(x + d, w, 1e-6), h, EXACT)
    h, r = naive.add_rms_norm(x, (), w, 1e-6, 24)
    assert r is x
    assert_close("grouped norm", rms_norm_1p(x, w, 1e-6, group=24), h, EXACT)
    o, z, gw = torch.randn(5, 3, 16, dtype=F64), torch.randn(5, 3, 16, dtype=F64), torch.randn(16, dtype=F64)
    for act in ("silu", "sigmoid"):
        want = gated_rms_norm(o, z, gw, 1e-6, act)
        assert_close(f"gated norm {act}", want, naive.gated_rms_norm(o, z, gw, 1e-6, act), EXACT)


@pytest.mark.parametrize("mode", list(LayerMode), ids=lambda m: m.value)
@pytest.mark.parametrize("case", LAYERS, ids=lambda c: f"{c[0]}-layer{c[1]}")
def test_fused_path_equals_torch_path_float64(case, mode):
    """The fused path's structure (what is fused, the PLE terms added in the hc norm, the inject gates) computes
    the layer's function: with the float64 references as its kernels it matches the torch code to rounding."""
    layer = make_layer(*case, F64)
    assert_same_step(mode.value, run_step(layer, mode, False), run_step(layer, mode, True), EXACT)


@pytest.mark.parametrize("mode", [LayerMode.DECODE_MULTI_SEQ, LayerMode.VERIFY_MULTI, LayerMode.PREFILL_VARLEN],
                         ids=lambda m: m.value)
@pytest.mark.parametrize("case", [("tiny-next-mlp", 1), ("tiny-4exp", 1)], ids=lambda c: c[0])
def test_fused_path_applies_lora_slots(case, mode):
    layer = make_layer(*case, F64)
    plain = run_step(layer, mode, True)
    a, b = run_step(layer, mode, False, lora=True), run_step(layer, mode, True, lora=True)
    assert_same_step(mode.value, a, b, EXACT)
    assert not torch.allclose(plain.x, b.x), "the adapters changed nothing: the test would not see them dropped"


def test_default_path_is_the_torch_code_on_cpu_and_under_tracing(monkeypatch):
    layer = make_layer("tiny-4exp", 1, torch.float32)
    x = torch.zeros(1, layer.cfg.stream_dim)
    assert layer.fused_glue is None and not layer._fused(x)
    layer.fused_glue = True
    assert layer._fused(x)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)
    assert not layer._fused(x), "export must trace the torch code whatever the switch says"


def test_bad_arguments_raise_before_anything_runs():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="must divide"):
        glue.add_rms_norm(x, (), torch.ones(32), 1e-6, 5)
    with pytest.raises(ValueError, match=r"residual delta must be \[4, 32\]"):
        glue.add_rms_norm(x, (torch.randn(3, 32),), torch.ones(32), 1e-6, 32)
    with pytest.raises(ValueError, match="at most two"):
        glue.add_rms_norm(x, (x, x, x), torch.ones(32), 1e-6, 32)
    with pytest.raises(ValueError, match="unit stride"):
        glue.add_rms_norm(torch.randn(32, 4).T, (), torch.ones(32), 1e-6, 32)
    with pytest.raises(ValueError, match="share dtype"):
        glue.add_rms_norm(x, (x.double(),), torch.ones(32), 1e-6, 32)
    with pytest.raises(ValueError, match="inject"):
        glue.hc_norm(x, (), torch.ones(32), torch.randn(3, 32), 1e-6)
    with pytest.raises(ValueError, match="act must be"):
        glue.gated_rms_norm(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.ones(4), 1e-6, "relu")
    with pytest.raises(ValueError, match="streams must be"):
        glue.hc_inject(torch.randn(4, 30), torch.randn(4, 4, 4), torch.randn(4, 8))
    with pytest.raises(ValueError, match="logits must be"):
        glue.hc_inject(torch.randn(4, 32), torch.randn(4, 4), torch.randn(4, 8))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles for sm_90: not under the interpreter")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kernels_compile_for_sm90_without_spills(dtype):
    """Every glue launch at Qwen4-Exp shapes (4 streams of 2560: the widest rows), compiled here as the H200 would
    (plugins/triton_aot.py): no spilled registers (a spill would put a row's fp32 copy in local memory)."""
    pytest.importorskip("triton")
    from gdn_trt.plugins import triton_aot
    from gdn_trt.plugins.glue import triton as glue_triton

    for name, args in glue_cases(REAL["qwen4-exp"], dtype, "cpu", 0).items():
        (launch,) = triton_aot.record(glue_triton, lambda: getattr(glue_triton, entry(name))(*args))
        c = triton_aot.compile_launch(launch)
        assert c.spill_stack == 0 and c.registers <= 255, f"{name}: {c.row()}"


# ---- GPU ----
def _poison(monkeypatch, module) -> None:
    new = module._new
    monkeypatch.setattr(module, "_new", lambda *a: new(*a).fill_(float("nan")))


REAL = {"qwen3-next": Shape(T=33, C=2048, n=1, HV=32, V=128, I=5632, R=320),
        "qwen4-exp": Shape(T=33, C=2560, n=4, HV=32, V=128, I=5632, R=320)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", list(REAL), ids=str)
def test_kernels_match_float64_at_real_shapes(shape, dtype, monkeypatch):
    from gdn_trt.plugins.glue import triton as glue_triton

    _poison(monkeypatch, glue_triton)
    bound = tol(dtype, "glue")
    for seed in range(2):
        for name, args in glue_cases(REAL[shape], dtype, "cuda", seed).items():
            got = getattr(glue, entry(name))(*args)
            got = got if isinstance(got, tuple) else (got,)
            for k, (ref, g) in enumerate(zip(reference(name, args), got)):
                assert_close(f"{shape} {name}[{k}] seed {seed}", ref, g, bound)


GPU_LAYERS = [("tiny-next-mlp", 1), ("tiny-4exp", 1)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", GPU_LAYERS + [("qwen3-next-80b-a3b", 0), ("qwen4-exp", 1)],
                         ids=lambda c: f"{c[0]}-layer{c[1]}")
def test_fused_layer_equals_torch_glue_layer_on_cuda(case, dtype):
    if case[0] in PRESETS and not case[0].startswith("tiny") and dtype == torch.float32:
        pytest.skip("real shapes in bf16 only (fp32 compiles another set of GDN kernels: device time)")
    layer = make_layer(*case, dtype, "cuda")
    bound = tol(dtype, "layer") if dtype == torch.bfloat16 else tol(dtype)
    for mode in LayerMode:
        lora = case in GPU_LAYERS and mode is LayerMode.VERIFY_MULTI
        assert_same_step(f"{case[0]} {mode.value}", run_step(layer, mode, False, lora=lora),
                         run_step(layer, mode, True, lora=lora), bound)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_LAYERS, ids=lambda c: c[0])
def test_fused_layer_graph_replay_equals_eager_bit_for_bit(case):
    layer = make_layer(*case, torch.bfloat16, "cuda")
    cfg = layer.cfg
    x = torch.randn(4, cfg.stream_dim, device="cuda").bfloat16()
    res = None if cfg.is_hc else torch.randn_like(x)
    rows = torch.randn(4, cfg.ple_heads, cfg.ple_head_dim, device="cuda").bfloat16() if layer.ple is not None else None
    want, out = decode_eager_and_replayed(layer, x, res, rows)
    assert torch.equal(want.x, out.x)
