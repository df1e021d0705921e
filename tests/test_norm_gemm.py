"""The layer's input add and norm in the in-projection's K loop (`glue.norm_linear`, gemm.py's NORM; off by default,
`triton.Tuning.norm_in_gemm`).

CPU: bad calls refused before anything runs; the layer's choice per mode and LoRA, bit for bit against the unfused
path (the entry runs its float64 reference); the table's launches with the norm compile for sm_90 without spills.
Interpreter (rerun of this file with TRITON_INTERPRET=1): the kernel with the norm, in the launch forms the table
uses (and FMA and split-K rows, which the norm turns into one-slice tl.dot launches), against float64 on
non-power-of-two M, N not a multiple of the block, K a multiple of the K step and not, x and the delta as row views
of wider buffers, outputs poisoned with NaN; r bit for bit x + d. GPU (marked gpu): Qwen3-Next's in_proj in bf16
against float64 and r bit for bit the norm kernel's, and a CUDA-graph replay equal to the eager call bit for bit.

The bound (`within_norm_bound`): y = rs * sum_k a_k w_k with a = r (1 + nw) rounded to the operand dtype (one
relative rounding: u_in = 2^-8 for bf16; for fp32 the 2 u32 of the K term's "+ 2" cover it) and rs = rsqrt(mean
r^2 + eps):
the K-term fp32 sum errs by at most (K + 1) u32 of the sum of magnitudes (as in test_glue_gemm's `within_bound`),
the sum of squares of K positive terms by K u32 relative, the mean, eps and rsqrt by a few more roundings (the
interpreter's rsqrt is numpy's; the GPU's approximate one is within 2 ulp), so rs errs by at most (K / 2 + 4) u32,
and the scale and the output cast add one rounding each.
"""

from __future__ import annotations

import pytest
import torch

from .kernel_support import INSIDE, rerun_under_interpreter

U32 = 2.0**-24
EPS = 1e-6


def _case(M: int, N: int, K: int, dtype=torch.float32, device="cpu", seed: int = 0):
    """x and d [M, K] as row views of wider buffers (NaN past their columns), the norm weight nw [K] and w [N, K]."""
    g = torch.Generator().manual_seed(seed + 1000 * M + N)

    def rows(scale: float) -> torch.Tensor:
        big = torch.full((M, K + 24), float("nan"), dtype=dtype)
        big[:, :K] = (torch.randn(M, K, generator=g) * scale).to(dtype)
        return big.to(device)[:, :K]

    return (rows(3.0), rows(1.0), (torch.randn(K, generator=g) * 0.1).to(dtype).to(device),
            (torch.randn(N, K, generator=g) * K ** -0.5).to(dtype).to(device))


def within_norm_bound(x, d, nw, w, y, r, eps: float, u_in: float, u_out: float) -> None:
    """The module docstring's bound, elementwise in float64, around the norm of the stored r (the residual the
    layer carries on)."""
    K = x.shape[1]
    rd, wd = r.double(), w.double()
    rs = torch.rsqrt(rd.pow(2).mean(1, keepdim=True) + eps)
    a = rd * (1.0 + nw.double())
    ref = rs * (a @ wd.T)
    mag = rs * (a.abs() @ wd.abs().T)
    limit = (u_out + (K / 2 + 6) * U32) * ref.abs() + (u_in + (K + 2) * U32) * mag
    err = (y.double() - ref).abs()
    assert torch.isfinite(y).all(), "non-finite outputs (unwritten elements?)"
    worst = (err / limit.clamp_min(1e-300)).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the bound (M {x.shape[0]}, N {w.shape[0]}, K {K})"


if not INSIDE:
    from gdn_trt.plugins.glue import op as glue

    def test_interpreter():
        rerun_under_interpreter(__file__)

    @pytest.mark.parametrize("bad, match", [("delta of another width", "residual delta"),
                                            ("delta of other rows", "residual delta"),
                                            ("norm weight of another width", "norm weight"),
                                            ("weight of another K", "w \\[N, K\\]"),
                                            ("bf16 delta", "share dtype")])
    def test_norm_linear_refuses_bad_calls(bad, match):
        x, d, nw, w = _case(4, 96, 64)
        args = {"delta of another width": (x, d[:, :32], nw, EPS, w), "delta of other rows": (x, d[:3], nw, EPS, w),
                "norm weight of another width": (x, d, nw[:32], EPS, w),
                "weight of another K": (x, d, nw, EPS, w[:, :32]),
                "bf16 delta": (x, d.to(torch.bfloat16), nw, EPS, w)}[bad]
        with pytest.raises(ValueError, match=match):
            glue.norm_linear(*args)

    def test_cpu_is_the_norm_and_the_projection():
        """Off CUDA the entry is its reference: `add_rms_norm` over the whole row, then `linear`, exactly."""
        x, d, nw, w = _case(5, 40, 48, torch.float64)
        y, r = glue.norm_linear(x, d, nw, EPS, w)
        h, r2 = glue.add_rms_norm(x, (d,), nw, EPS, 48)
        assert torch.equal(r, r2) and torch.equal(y, glue.linear(h, w))

    def test_layer_takes_the_norm_in_gemm_without_in_proj_lora(monkeypatch):
        """The layer's choice (`_Io.norm_in_gemm`), with the kernel's own test (`glue.norm_in_gemm`) forced true on
        the CPU so that `glue.norm_linear` runs its float64 reference: taken in every mode (the projection touches
        no state) and there equal bit for bit to the norm and the projection (output and every buffer), not taken
        with LoRA updates on in_proj (they need the normed input)."""
        from gdn_trt.model.lora import Proj

        from .glue_support import check_fused_choice, make_layer

        layer = make_layer("tiny-next", 0, torch.float64)
        assert not layer.cfg.is_hc and layer._by_proj[Proj.IN_PROJ], "the preset's layer 0 is plain with in_proj LoRA"
        check_fused_choice(monkeypatch, layer, "norm_in_gemm", "norm_linear", lambda mode, lora: not lora)

    def test_table_with_the_norm_compiles_for_sm90_without_spills():
        """Each wide launch of the table (in_proj's) with the norm, compiled as the H200 would at Qwen3-Next's
        in_proj (K 2048) and an uneven K: no spilled registers, shared memory within the sm_90 limit."""
        from gdn_trt.plugins import triton_aot
        from gdn_trt.plugins.glue import gemm

        for row in gemm.TABLE:
            if not row.min_n:
                continue
            for K in (2048, 2560 + 64):
                x, w = torch.empty(row.max_m, K, dtype=torch.bfloat16), torch.empty(12352, K, dtype=torch.bfloat16)
                norm = (torch.empty_like(x), torch.empty(K, dtype=torch.bfloat16), EPS, torch.empty_like(x))
                (launch,) = triton_aot.record(gemm, lambda: gemm.launch(x, w, row.cfg, norm=norm))
                c = triton_aot.compile_launch(launch)
                assert c.spill_stack == 0 and c.shared <= triton_aot.SMEM_LIMIT, f"{row.cfg} K {K}: {c.row()}"

    @pytest.mark.gpu  # skipped without CUDA by conftest's marker, with its reason
    @pytest.mark.parametrize("M", [1, 8, 33, 64])
    def test_in_proj_bf16_against_float64_and_replayed(M):
        """Qwen3-Next's in_proj [12352, 2048] in bf16 at the table's launch for M: y within the bound (u_in 2^-8
        for the bf16 operand a), r bit for bit the norm kernel's, and a CUDA-graph replay bit for bit the eager
        call."""
        from gdn_trt.plugins.glue import triton as glue_tri

        x, d, nw, w = _case(M, 12352, 2048, torch.bfloat16, "cuda")
        y, r = glue_tri.norm_linear(x, d, nw, EPS, w)
        _, r_norm = glue_tri.add_rms_norm(x, (d,), nw, EPS, 2048)
        assert torch.equal(r, r_norm)
        within_norm_bound(x, d, nw, w, y, r, EPS, 2.0**-8, 2.0**-8)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            glue_tri.norm_linear(x, d, nw, EPS, w)  # warm on the capture's stream
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg, rg = glue_tri.norm_linear(x, d, nw, EPS, w)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg, y) and torch.equal(rg, r)

else:
    from gdn_trt.plugins.glue import gemm
    from gdn_trt.plugins.glue import triton as glue_tri

    C = gemm.Config
    # the table's wide (in_proj) launches, a plain one, an FMA row and a split-K row (both become one-slice tl.dot
    # launches with the norm: gemm.norm_config)
    CONFIGS = [C(16, 16, 32), C(16, 16, 32, spread=2), C(1, 8, 64, dot=False), C(16, 16, 32, split=3),
               *(r.cfg for r in gemm.TABLE if r.min_n)]

    @pytest.mark.parametrize("cfg", CONFIGS, ids=str)
    def test_kernel_with_the_norm_fp32_against_float64(cfg, monkeypatch):
        """fp32 (IEEE dots): y within the bound, r bit for bit x + d, every output element written (NaN-poisoned
        buffers), the buffers' columns past K never read (NaN there)."""
        new = gemm._new
        monkeypatch.setattr(gemm, "_new", lambda *a: new(*a).fill_(float("nan")))
        bk = gemm.norm_config(cfg).bk
        for M in (1, 3, 17):
            for N, K in ((50, 2 * bk), (70, bk + 40)):
                x, d, nw, w = _case(M, N, K)
                r = torch.full((M, K), float("nan"))
                y = gemm.launch(x, w, cfg, norm=(d, nw, EPS, r))
                assert torch.equal(r, x + d), (cfg, M, N, K)
                within_norm_bound(x, d, nw, w, y, r, EPS, 0.0, U32)

    def test_entry_is_the_tables_launch_with_the_norm(monkeypatch):
        """`triton.norm_linear` at M = 5 on an in_proj-wide weight (the table's wide row for M <= 8): y within the
        bound, r bit for bit x + d, both freshly allocated (poisoned) and fully written."""
        new = glue_tri._new
        monkeypatch.setattr(glue_tri, "_new", lambda *a: new(*a).fill_(float("nan")))
        x, d, nw, w = _case(5, gemm.WIDE_N, 128)
        y, r = glue_tri.norm_linear(x, d, nw, EPS, w)
        assert torch.equal(r, x + d)
        within_norm_bound(x, d, nw, w, y, r, EPS, 0.0, U32)
