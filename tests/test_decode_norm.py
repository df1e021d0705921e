"""The GDN decode with the output's gated norm in its epilogue (`glue.recurrent_norm`, plugins/glue/decode_norm.py).

CPU: bad calls refused with the pool unchanged; the layer takes it in the two one-token decode modes only (the
kernel's own test forced true, so the CPU runs the float64 reference), and there output and every buffer equal the
unfused layer's bit for bit; both tilings compile for sm_90 without spills. Interpreter (rerun of this file with
TRITON_INTERPRET=1): the fused kernel in every form the recurrent kernel's tuning gives it (many and few sequences,
operands or tile first, column chunks, output after the update) against the recurrent kernel followed by the gated
norm: the pool bit for bit (the same token step), y within the bound of its roundings against float64 of the
recurrent kernel's o; padding rows zero, pool rows outside the step bit for bit, outputs poisoned with NaN, the
tickets back at zero. GPU (marked gpu): the real shapes against the two kernels and under graph replay, and the
real layers' decode with it on and off.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Packing

from gdn_trt.export.tolerances import tol

from .kernel_support import INSIDE, rerun_under_interpreter
from .tolerances import assert_close

U32 = 2.0 ** -24


def _case(lengths, slots, H=2, G=2, K=32, V=32, S=6, dtype=torch.float32, device="cpu", seed=0):
    """A decode step: x (GdnInputs), its packing, a pool of S random slots, z [T, HV, V], w [V]."""
    g = torch.Generator().manual_seed(seed)
    HV, T = H * G, sum(lengths)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(device)  # noqa: E731
    x = GdnInputs(r(T, H, K).to(dtype), r(T, H, K).to(dtype), r(T, HV, V).to(dtype), r(T, HV).to(dtype),
                  r(T, HV).to(dtype), r(HV, scale=0.5), r(HV, scale=0.5))
    return (x, Packing.build(lengths, slots, device), r(S, HV, K, V, scale=0.3), r(T, HV, V).to(dtype),
            r(V, scale=0.5).to(dtype))


def gated_f64(o: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float, act: str) -> torch.Tensor:
    o, z, w = o.double(), z.double(), w.double()
    y = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * w
    return y * (z * torch.sigmoid(z) if act == "silu" else torch.sigmoid(z))


def test_bad_calls_are_refused_with_the_pool_unchanged():
    from gdn_trt.plugins.glue import op as glue

    x, pack, pool, z, w = _case([1, 1], [0, 3])
    before = pool.clone()
    for bad in ({"z": z[:, :, :-1]}, {"z": z.transpose(1, 2)}, {"w": w[:-1]}, {"act": "relu"},
                {"pool": pool[:, :-1]}, {"z": z.double()}):
        args = dict(x=x, pack=pack, pool=pool, z=z, w=w, act="silu") | bad
        with pytest.raises(ValueError):
            glue.recurrent_norm(args["x"], args["pack"], args["pool"], args["z"], args["w"], 1e-6, args["act"])
    assert torch.equal(pool, before)


def test_the_cpu_runs_the_reference_of_both_ops_in_float64():
    """On the CPU `recurrent_norm` is the GDN op's decode (its pool update included) followed by the gated norm."""
    from gdn_trt.plugins.gated_delta_rule import op as gdn_op
    from gdn_trt.plugins.glue import op as glue

    x, pack, pool, z, w = _case([1, 1, 1], [2, -1, 0], dtype=torch.float64)
    x = GdnInputs(*(t.double() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)))
    pool, z, w = pool.double(), z.double(), w.double()
    want_pool = pool.clone()
    o, _ = gdn_op.recurrent(x, pack, want_pool)
    got = glue.recurrent_norm(x, pack, pool, z, w, 1e-6, "silu")
    assert torch.equal(pool, want_pool)
    assert torch.allclose(got, gated_f64(o, z, w, 1e-6, "silu"), rtol=1e-13, atol=1e-15)  # float64 both ways


def test_layer_takes_the_fused_norm_in_decode_modes_only(monkeypatch):
    """The layer's choice (`_Io.norm_in_decode`), with the kernel's own test (`glue.norm_in_decode`) forced true on
    the CPU so that `glue.recurrent_norm` runs its float64 reference: taken in the two one-token decode modes, with
    or without LoRA (the norm has no LoRA site), and there equal bit for bit to the GDN op and the gated norm
    (output and every buffer); not taken in the other modes."""
    from gdn_trt.model.modes import Writes

    from .glue_support import check_fused_choice, make_layer

    for name in ("tiny-next", "tiny-4exp"):
        layer = make_layer(name, 1 if name == "tiny-4exp" else 0, torch.float64)
        check_fused_choice(monkeypatch, layer, "norm_in_decode", "recurrent_norm", lambda mode, lora: (
            mode.spec.one_token_per_sequence and mode.spec.writes is Writes.POOLS))

if not INSIDE:
    def test_interpreter():
        rerun_under_interpreter(__file__, "-k", "interp")

    @pytest.mark.parametrize("few", [False, True], ids=["many", "few"])
    def test_compiles_for_sm90_without_spills(few, monkeypatch):
        """Both tilings at Qwen3-Next's heads (bf16), recorded from `launch` as the H200 would run them: no spilled
        registers, and no more registers than the recurrent kernel's own launch of the same tiling."""
        from gdn_trt.plugins import triton_aot
        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
        from gdn_trt.plugins.glue import decode_norm

        if not few:
            monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, rec_few_below=0))
        x, pack, pool, z, w = _case([1] * 4, [0, 1, 2, 3], H=16, K=128, V=128, dtype=torch.bfloat16)
        (fused,) = triton_aot.record(decode_norm, lambda: decode_norm.launch(x, pack, pool, z, w, 1e-6, "silu"))
        (alone,) = triton_aot.record(gdn_tri, lambda: gdn_tri.launch_recurrent(x, pack, pool, None, gdn_tri.TUNING))
        c, ref = triton_aot.compile_launch(fused), triton_aot.compile_launch(alone)
        assert fused.args["BV"] == alone.args["BV"] and fused.num_warps == alone.num_warps
        assert c.spill_stack == 0 and c.registers <= max(ref.registers, 64), (c.row(), ref.row())
        # with PDL as the runtime launches it: the ticket is an acquire-release add at GPU scope behind a CTA
        # barrier, the head's outputs are read back from L2, the counter is reset, and the dependents are released
        ptx = triton_aot.compile_kernel(replace(fused, args=dict(fused.args, PDL=True))).asm["ptx"]
        for op in ("bar.sync", "atom.global.gpu.acq_rel.add", "ld.global.cg", "atom.global.gpu.relaxed.exch",
                   "griddepcontrol.wait", "griddepcontrol.launch_dependents"):
            assert op in ptx, op

if INSIDE:
    from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
    from gdn_trt.plugins.glue import decode_norm
    from gdn_trt.plugins.glue import triton as glue_tri

    FORMS = {"default": {}, "tile-first": {"rec_qkv_first": False}, "chunks": {"rec_chunk": 8},
             "q-after": {"rec_q_after": True}}

    @pytest.mark.parametrize("form", list(FORMS))
    @pytest.mark.parametrize("few", [False, True], ids=["many", "few"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    def test_interp_fused_against_the_two_kernels(form, few, dtype, monkeypatch):
        tuning = replace(gdn_tri.TUNING, rec_bv=16, rec_bv_few=8, rec_few_below=1 << 20 if few else 0,
                         **FORMS[form])
        monkeypatch.setattr(gdn_tri, "TUNING", tuning)
        nan = lambda shape, dt, dev: torch.full(shape, float("nan"), dtype=dt, device=dev)  # noqa: E731
        monkeypatch.setattr(gdn_tri, "_new", nan)
        monkeypatch.setattr(glue_tri, "_new", nan)
        lengths, slots = [1, 1, 2, 1, 1], [4, -1, 0, 5, 2]  # a padding row; one sequence of two tokens
        x, pack, pool, z, w = _case(lengths, slots, dtype=dtype, seed=len(form) + few)
        assert decode_norm.takes(x, pack)
        ref_pool = pool.clone()
        o = gdn_tri.launch_recurrent(x, pack, ref_pool, None, tuning)
        y_two = glue_tri.gated_rms_norm(o, z, w, 1e-6, "silu")
        y = decode_norm.launch(x, pack, pool, z, w, 1e-6, "silu")
        assert torch.equal(pool, ref_pool), "the state differs from the recurrent kernel's"
        assert torch.isfinite(y).all(), "rows left unwritten"
        assert not y[1].any(), "the padding row is not zero"
        assert not decode_norm._COUNTERS[(torch.device("cpu"), pack.num_seqs * x.v.shape[1])].any()
        ref = gated_f64(o, z, w, 1e-6, "silu")
        # the bound: the V-term fp32 sum of squares and the rsqrt err by at most (V + 4) u32 relative, halved by the
        # square root, the exp and sigmoid of act(z) by a few u32; then the three roundings to the activation dtype
        # (after the norm, after w, at the end: u = 2^-24 in fp32; 2^-7 each in bf16, which the interpreter
        # truncates): |y - ref| <= ((1 + u)^3 (1 + (V / 2 + 8) u32) - 1) |ref|
        u = U32 if dtype == torch.float32 else 2.0 ** -7
        V = x.v.shape[2]
        bound = ((1 + u) ** 3 * (1 + (V / 2 + 8) * U32) - 1) * ref.abs()
        err = (y.double() - ref).abs()
        assert (err <= bound).all(), f"{(err / bound.clamp_min(1e-300)).max().item():.2f}x the bound"
        # and against the gated norm kernel on the same o: only the sum's order differs
        assert ((y.double() - y_two.double()).abs() <= 2 * bound).all()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 8, 64])
def test_real_shapes_against_the_two_kernels_and_under_replay(n):
    """Qwen3-Next's heads (16 key, 32 value, 128 x 128) in bf16, N one-token sequences (every fifth padding): the
    pool bit for bit against the recurrent kernel, y within the bound against float64 of that kernel's o, and a
    CUDA-graph replay equal to the eager call bit for bit."""
    from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
    from gdn_trt.plugins.glue import decode_norm

    slots = [-1 if k % 5 == 4 else k for k in range(n)]
    x, pack, pool, z, w = _case([1] * n, slots, H=16, K=128, V=128, S=n + 2, dtype=torch.bfloat16, device="cuda")
    assert decode_norm.takes(x, pack)
    ref_pool, start = pool.clone(), pool.clone()
    o = gdn_tri.recurrent(x, pack, ref_pool)
    y = decode_norm.launch(x, pack, pool, z, w, 1e-6, "silu")
    assert torch.equal(pool, ref_pool)
    ref = gated_f64(o, z, w, 1e-6, "silu")
    u = 2.0 ** -8  # round to nearest on the GPU
    bound = ((1 + u) ** 3 * (1 + (128 / 2 + 8) * U32) - 1) * ref.abs()
    assert ((y.double() - ref).abs() <= bound).all()
    pool.copy_(start)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode_norm.launch(x, pack, pool.clone(), z, w, 1e-6, "silu")
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y_g = decode_norm.launch(x, pack, pool, z, w, 1e-6, "silu")
    pool.copy_(start)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y_g, y) and torch.equal(pool, ref_pool)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [("qwen3-next-80b-a3b", 0), ("qwen4-exp", 1)], ids=["plain", "hc+ple"])
def test_layer_decode_with_the_norm_in_decode(case, monkeypatch):
    """The real-shape layer in both one-token decode modes with `triton.Tuning.norm_in_decode` on and off: the
    pools bit for bit, the output within the table's bound for a layer whose glue rounds at the same points (the
    norm's sum of squares in another order may flip one bf16 rounding, which out_proj carries on), and the fused
    launch ran."""
    from gdn_trt.model.modes import LayerMode
    from gdn_trt.plugins.glue import decode_norm
    from gdn_trt.plugins.glue import triton as glue_tri

    from .glue_support import make_layer, run_step

    ran_fused = []
    launch = decode_norm.launch
    monkeypatch.setattr(decode_norm, "launch", lambda *a: ran_fused.append(1) or launch(*a))
    layer = make_layer(*case, torch.bfloat16, "cuda")
    for mode in (LayerMode.DECODE, LayerMode.DECODE_MULTI_SEQ):
        ran = {}
        for on in (False, True):
            monkeypatch.setattr(glue_tri, "TUNING", replace(glue_tri.TUNING, norm_in_decode=on))
            ran_fused.clear()
            ran[on] = run_step(layer, mode, True)
            assert bool(ran_fused) == on, mode.value
        for k in ran[False].buffers:
            assert torch.equal(ran[False].buffers[k], ran[True].buffers[k]), f"{mode.value} {k}"
        assert_close(f"{case[0]} {mode.value}", ran[False].x, ran[True].x, tol(torch.bfloat16, "layer"))
