"""The skinny GEMM of the decode projections (plugins/glue/gemm.py) and its dispatch (`glue.op.linear`).

Every comparison with float64 uses the bound that fp32 accumulation and one output rounding guarantee, element by
element (`within_bound`), not a tuned tolerance. CPU: `op.linear` is F.linear itself off CUDA and in fp32; every
launch of the table compiles for sm_90 without spills within the shared-memory limit. Interpreter (rerun of this
file with TRITON_INTERPRET=1): the kernel in both forms against float64 on non-power-of-two M, N not a multiple of
the block and K not a multiple of the K step, outputs poisoned with NaN. GPU (marked gpu): the real Qwen3-Next
shapes against float64 and against cuBLAS, graph replay equal to eager bit for bit, the dispatch boundaries, and a
real-shape layer whose decode graph runs the kernel.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from .kernel_support import INSIDE, rerun_under_interpreter

U_ACC = 2.0**-24  # fp32 unit roundoff


def within_bound(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, u_out: float) -> None:
    """|y - x w^T| <= u_out |x w^T| + (1 + u_out) (K + 1) u32 (|x| |w|^T), elementwise, in float64.
    Why this bound: the products of bf16 or fp16 values are exact in fp32 (fp32 operands: one rounding each, the
    "+ 1"), the K-term fp32 sum in any order errs by at most K u32 times the sum of the magnitudes (the tensor cores
    truncate at each of their K/16 k-steps, at most 2^-23 of that sum each: inside it), and the cast to the output
    dtype adds one relative rounding u_out (2^-8 for bf16 round-to-nearest; 2^-7 where the interpreter truncates;
    2^-24 for fp32)."""
    xd, wd = x.double(), w.double()
    ref = xd @ wd.T
    mag = xd.abs() @ wd.abs().T
    err = (y.double() - ref).abs()
    limit = u_out * ref.abs() + (1 + u_out) * (x.shape[1] + 1) * U_ACC * mag
    assert torch.isfinite(y).all(), "non-finite outputs (unwritten elements?)"
    worst = (err / limit.clamp_min(1e-300)).max().item()
    assert worst <= 1.0, f"error {worst:.2f}x the bound (M {x.shape[0]}, N {w.shape[0]}, K {x.shape[1]})"


if not INSIDE:
    from gdn_trt.plugins.glue import op as glue

    def test_interpreter():
        rerun_under_interpreter(__file__)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
    def test_cpu_is_f_linear_exactly(dtype):
        x, w = torch.randn(5, 48, dtype=dtype), torch.randn(2048, 48, dtype=dtype)
        assert torch.equal(glue.linear(x, w), F.linear(x, w))

    def test_table_covers_the_dispatch_and_checks_configs():
        pytest.importorskip("triton")
        from gdn_trt.plugins.glue import gemm

        assert glue.GEMM_MAX_M <= gemm.TABLE[-1][0], "the crossover is past the table"
        for m in range(1, gemm.TABLE[-1][0] + 1):
            gemm.config_for(m).check()
        with pytest.raises(ValueError, match="no skinny-GEMM config"):
            gemm.config_for(gemm.TABLE[-1][0] + 1)
        with pytest.raises(ValueError, match="tl.dot tiles"):
            gemm.Config(8, 16, 64).check()
        with pytest.raises(ValueError, match="FMA form"):
            gemm.Config(8, 16, 64, dot=False).check()

    def test_table_compiles_for_sm90_without_spills():
        """Each launch of the table at Qwen3-Next's in_proj (K 2048) and an uneven K, compiled as the H200 would
        (plugins/triton_aot.py): no spilled registers, shared memory within the sm_90 limit."""
        pytest.importorskip("triton")
        from gdn_trt.plugins import triton_aot
        from gdn_trt.plugins.glue import gemm

        for bound, cfg in gemm.TABLE:
            for K in (2048, 2560 + 64):
                x, w = torch.empty(bound, K, dtype=torch.bfloat16), torch.empty(12352, K, dtype=torch.bfloat16)
                (launch,) = triton_aot.record(gemm, lambda: gemm.launch(x, w, cfg))
                c = triton_aot.compile_launch(launch)
                assert c.spill_stack == 0 and c.shared <= triton_aot.SMEM_LIMIT, f"{cfg} K {K}: {c.row()}"

    # ---- GPU ----
    NEXT = {"in_proj": (12352, 2048), "out_proj": (2048, 4096)}  # Qwen3-Next [N, K]

    def _crossover(monkeypatch) -> int:
        """The dispatch's crossover moved to the table's last bound: the tests check the dispatch and the layer with
        the kernel at every M it has a launch for (on the H200 it dispatches only where it beats cuBLAS)."""
        from gdn_trt.plugins.glue import gemm

        monkeypatch.setattr(glue, "GEMM_MAX_M", gemm.TABLE[-1][0])
        return glue.GEMM_MAX_M

    def _poison(monkeypatch):
        from gdn_trt.plugins.glue import gemm

        new = gemm._new
        monkeypatch.setattr(gemm, "_new", lambda *a: new(*a).fill_(float("nan")))

    @pytest.mark.gpu
    @pytest.mark.parametrize("name", list(NEXT))
    def test_real_shapes_against_float64_and_cublas(name, monkeypatch):
        """Within the fp32-accumulation bound of float64 at every M bucket (non-powers of two included), and no
        less accurate than cuBLAS on the same inputs (RMS error at most 1.05x F.linear's: both round once to bf16,
        which dominates; cuBLAS may also reduce split-K partials in bf16)."""
        from gdn_trt.plugins.glue import gemm

        _poison(monkeypatch)
        N, K = NEXT[name]
        w = torch.randn(N, K, device="cuda").bfloat16() * 0.02
        for M in (1, 2, 3, 5, 8, 16, 17, 33, 64):
            x = torch.randn(M, K, device="cuda").bfloat16()
            y = gemm.linear(x, w)
            within_bound(x, w, y, 2.0**-8)
            ref = x.double() @ w.double().T
            ours, cublas = (y.double() - ref).norm().item(), (F.linear(x, w).double() - ref).norm().item()
            assert ours <= 1.05 * cublas, f"M {M}: RMS error {ours:.3e} against cuBLAS's {cublas:.3e}"

    @pytest.mark.gpu
    def test_row_strided_input_and_fp16():
        from gdn_trt.plugins.glue import gemm

        w = torch.randn(4096, 2048, device="cuda").half() * 0.02
        big = torch.randn(6, 4096, device="cuda").half()
        x = big[:, 1000:3048]  # row stride 4096
        within_bound(x, w, gemm.linear(x, w), 2.0**-11)

    @pytest.mark.gpu
    @pytest.mark.parametrize("M", [1, 8, 64])
    def test_graph_replay_equals_eager_bit_for_bit(M):
        from gdn_trt.plugins.glue import gemm

        N, K = NEXT["in_proj"]
        x = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16() * 0.02
        want = gemm.linear(x, w)
        assert torch.equal(want, gemm.linear(x, w)), "two eager calls differ: not deterministic"
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = gemm.linear(x, w)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(want, out)

    @pytest.mark.gpu
    def test_dispatch_boundaries(monkeypatch):
        """Triton exactly where op.linear says (bf16 / fp16, 1 <= M <= GEMM_MAX_M, N >= GEMM_MIN_N); everything
        else is F.linear bit for bit."""
        from gdn_trt.plugins.glue import gemm

        top = _crossover(monkeypatch)
        calls = []
        launch = gemm.launch
        monkeypatch.setattr(gemm, "launch", lambda *a: calls.append(a[0].shape[0]) or launch(*a))
        w = torch.randn(2048, 512, device="cuda").bfloat16()
        for M in (1, top):
            glue.linear(torch.randn(M, 512, device="cuda").bfloat16(), w)
        assert calls == [1, top]
        x = torch.randn(4, 512, device="cuda").bfloat16()
        cases = {"M over the crossover": (torch.randn(top + 1, 512, device="cuda").bfloat16(), w),
                 "fp32": (x.float(), w.float()),
                 "N under GEMM_MIN_N": (x, w[: glue.GEMM_MIN_N - 16]),
                 "transposed weight": (x, torch.randn(512, 2048, device="cuda").bfloat16().T),
                 "K-strided x": (torch.randn(512, 4, device="cuda").bfloat16().T, w)}
        for why, (a, b) in cases.items():
            assert torch.equal(glue.linear(a, b), F.linear(a, b)), why
        assert calls == [1, top], "a call outside the dispatch reached the Triton GEMM"

    @pytest.mark.gpu
    def test_real_layer_decode_graph_runs_the_kernel_and_replays_bit_for_bit(monkeypatch):
        """The Qwen3-Next layer at real shapes, decode of 4 sequences: in_proj and out_proj go to the Triton GEMM,
        and a CUDA-graph replay of the step equals its eager run bit for bit (output and pools)."""
        from gdn_trt.model.state import BufferSpec, LayerState, StepInput
        from gdn_trt.plugins.glue import gemm
        from gdn_trt.plugins.packing import Packing

        from .glue_support import make_layer

        assert _crossover(monkeypatch) >= 4
        calls = []
        launch = gemm.launch
        monkeypatch.setattr(gemm, "launch", lambda x, w, c: calls.append(tuple(w.shape)) or launch(x, w, c))
        layer = make_layer("qwen3-next-80b-a3b", 0, torch.bfloat16, "cuda")
        cfg, spec = layer.cfg, BufferSpec(torch.bfloat16, "cuda")
        x = torch.randn(4, cfg.stream_dim, device="cuda").bfloat16()
        step = StepInput(x, Packing.build([1] * 4, [0, 2, -1, 1], "cuda"), torch.randn_like(x), None)
        start = LayerState.allocate(cfg, layer.index, 3, spec)
        for t in start.tensors():
            t.normal_()
        copy = lambda: LayerState(*[t.clone() if t is not None else None  # noqa: E731
                                    for t in (start.conv, start.ssm, start.ple_conv)])
        eager, graphed, warm = copy(), copy(), copy()
        want, _ = layer.decode_multi_seq(step, eager)
        assert sorted(set(calls)) == sorted({tuple(layer.mixer.in_proj.shape), tuple(layer.mixer.out_proj.shape)})
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            layer.decode_multi_seq(step, warm)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, _ = layer.decode_multi_seq(step, graphed)
        for a, b in zip(graphed.tensors(), start.tensors()):
            a.copy_(b)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(want.x, out.x) and torch.equal(want.residual, out.residual)
        assert all(torch.equal(a, b) for a, b in zip(eager.tensors(), graphed.tensors()))

else:
    from gdn_trt.plugins.glue import gemm

    C = gemm.Config
    # both forms, small and table-sized tiles; (M values, N, K): non-power-of-two M, N not a multiple of BN,
    # K a multiple of BK (the unmasked loop) and not (the masked tail)
    CONFIGS = [C(1, 8, 64, dot=False), C(4, 8, 32, dot=False), C(16, 16, 64), C(32, 32, 32),
               *(c for _, c in gemm.TABLE)]

    def _shapes(cfg):
        ms = sorted({1, 3, min(cfg.bm, 4) + (cfg.bm > 4) * 3, cfg.bm + 5})
        return [(ms, 50, 2 * cfg.bk), (ms, 70, cfg.bk + 96)]

    @pytest.mark.parametrize("cfg", CONFIGS, ids=str)
    def test_kernel_fp32_against_float64(cfg, monkeypatch):
        new = gemm._new
        monkeypatch.setattr(gemm, "_new", lambda *a: new(*a).fill_(float("nan")))
        for ms, N, K in _shapes(cfg):
            for M in ms:
                x, w = torch.randn(M, K), torch.randn(N, K)
                within_bound(x, w, gemm.launch(x, w, cfg), U_ACC)

    @pytest.mark.parametrize("cfg", [c for c in CONFIGS if not c.dot], ids=str)
    def test_fma_form_bf16_against_float64(cfg):
        """bf16 only in the FMA form: the interpreter (Triton 3.9) multiplies bf16 tl.dot operands wrongly (a 16 x 16
        bf16 dot errs by 2e10; the same values as fp32 are exact), and casts fp32 to bf16 by truncation (2^-7)."""
        for ms, N, K in _shapes(cfg):
            for M in ms:
                x, w = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
                within_bound(x, w, gemm.launch(x, w, cfg), 2.0**-7)

    def test_row_strided_input_and_empty_shapes():
        big = torch.randn(3, 300)
        x, w = big[:, 17:145], torch.randn(40, 128)
        within_bound(x, w, gemm.launch(x, w, C(16, 16, 64)), U_ACC)
        assert gemm.launch(torch.randn(0, 128), w, C(16, 16, 64)).shape == (0, 40)
        assert torch.equal(gemm.launch(torch.randn(2, 0), torch.randn(40, 0), C(16, 16, 64)), torch.zeros(2, 40))
