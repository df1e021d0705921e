"""The skinny GEMM of the decode projections (plugins/glue/gemm.py) and its dispatch (`glue.op.linear`).

Every comparison with float64 uses the bound that fp32 accumulation and one output rounding guarantee, element by
element (`within_bound`), not a tuned tolerance. CPU: `op.linear` is F.linear itself off CUDA and in fp32; the
dispatch follows the table's measured ratios; every launch of the table compiles for sm_90 without spills within the
shared-memory limit. Interpreter (rerun of this file with TRITON_INTERPRET=1): the kernel in both forms, with and
without split-K, against float64 on non-power-of-two M, N not a multiple of the block and K not a multiple of the K
step or of split x K step, outputs poisoned with NaN and token rows past M poisoned in x; the split-K workspace is
allocated once and its counters are back at zero after every call. GPU (marked gpu): the real Qwen3-Next shapes
against float64 and against cuBLAS, repeated split-K calls bit for bit (the arrival order of the slices varies),
graph replay equal to eager bit for bit, a first split-K launch under capture refused, the dispatch boundaries, and
a real-shape layer whose decode graph runs the kernel.
The conv in the epilogue (`glue.linear_conv`): bad calls refused with the pool untouched, the reference against
its definition, and the layer's choice of it per mode and LoRA, bit for bit against the unfused path (CPU); every kernel form against float64 with padding rows and pool rows outside the step checked
(interpreter); on the GPU the real in_proj against the GEMM followed by the conv kernel bit for bit, against float64
and under graph replay, and the real layers' decode with it on and off bit for bit.
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


def _conv_case(M: int, N: int, K: int, D: int, S: int, dtype=torch.float32, device="cpu"):
    """x [M, K], w [N, K], the GDN conv over the first D of N channels, a pool of S slots and the packing of M
    one-token sequences: every fourth one padding (slot -1), the others on distinct slots, spread over the pool."""
    from gdn_trt.plugins.causal_conv1d.io import ConvParams
    from gdn_trt.plugins.packing import Packing

    g = torch.Generator().manual_seed(M * 1000 + N)
    slots = [-1 if m % 4 == 1 else s for m, s in zip(range(M), torch.randperm(S, generator=g).tolist())]
    mk = lambda *shape, scale=1.0: (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)  # noqa: E731
    return (mk(M, K), mk(N, K, scale=K ** -0.5), ConvParams(mk(D, 4, scale=0.5)), Packing.build([1] * M, slots,
            device), mk(S, 3, D))


if not INSIDE:
    from gdn_trt.plugins.glue import op as glue

    def test_interpreter():
        rerun_under_interpreter(__file__)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
    def test_cpu_is_f_linear_exactly(dtype):
        x, w = torch.randn(5, 48, dtype=dtype), torch.randn(2048, 48, dtype=dtype)
        assert torch.equal(glue.linear(x, w), F.linear(x, w))

    def test_table_covers_the_dispatch_and_checks_configs():
        from gdn_trt.plugins.glue import gemm

        top = gemm.TABLE[-1].max_m
        for m in range(1, top + 1):
            for n in (glue.GEMM_MIN_N, 2048, gemm.WIDE_N, 12352):
                gemm.config_for(m, n).check()
        with pytest.raises(ValueError, match="no skinny-GEMM config"):
            gemm.config_for(top + 1, 2048)
        assert not gemm.dispatched(0, 2048) and not gemm.dispatched(top + 1, 12352)
        with pytest.raises(ValueError, match="tl.dot tiles"):
            gemm.Config(8, 16, 64).check()
        with pytest.raises(ValueError, match="FMA form"):
            gemm.Config(8, 16, 64, dot=False).check()
        with pytest.raises(ValueError, match="split"):
            gemm.Config(16, 16, 64, split=0).check()
        with pytest.raises(ValueError, match="TMA"):
            gemm.Config(16, 16, 128, tma=True).check()
        with pytest.raises(ValueError, match="TMA"):
            gemm.Config(4, 16, 64, dot=False, tma=True).check()

    def test_dispatch_follows_the_measured_ratios():
        """op.linear's choice per M and width is the table row's: ours exactly where its sweep time beat cuBLAS's."""
        from gdn_trt.plugins.glue import gemm

        last = {}  # min_n -> the bound of the previous row of that width class
        for row in gemm.TABLE:
            n = 12352 if row.min_n else 2048
            for m in range(last.get(row.min_n, 0) + 1, row.max_m + 1):
                assert gemm.row_for(m, n) is row
                assert gemm.dispatched(m, n) == (row.vs_cublas < 1), (m, row)
            last[row.min_n] = row.max_m

    def test_table_compiles_for_sm90_without_spills():
        """Each launch of the table at Qwen3-Next's in_proj (K 2048) and an uneven K, compiled as the H200 would
        (plugins/triton_aot.py): no spilled registers, shared memory within the sm_90 limit."""
        from gdn_trt.plugins import triton_aot
        from gdn_trt.plugins.glue import gemm

        for row in gemm.TABLE:
            N = 12352 if row.min_n else 2048
            # in_proj's rows also with the conv in the epilogue (`op.linear_conv`: Qwen3-Next's 8192 conv channels)
            convs = [None] + ([(torch.empty(8192, 4, dtype=torch.bfloat16), torch.empty(9, 3, 8192,
                                dtype=torch.bfloat16), torch.empty(row.max_m, dtype=torch.int32))] if row.min_n else [])
            for K in (2048, 2560 + 64):
                for conv in convs:
                    x, w = torch.empty(row.max_m, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
                    (launch,) = triton_aot.record(gemm, lambda: gemm.launch(x, w, row.cfg, conv))
                    c = triton_aot.compile_launch(launch)
                    assert c.spill_stack == 0 and c.shared <= triton_aot.SMEM_LIMIT, \
                        f"{row.cfg} K {K} conv {conv is not None}: {c.row()}"

    def test_linear_conv_refuses_bad_calls_and_changes_nothing():
        """Each bad call raises before anything is written: the pool is unchanged bit for bit."""
        from dataclasses import replace

        from gdn_trt.plugins.packing import Packing

        x, w, conv, pack, pool = _conv_case(4, 96, 64, 32, 6)
        before = pool.clone()
        bad = {"conv wider than the projection": (x, w[:16], conv, pack, pool),
               "width 3": (x, w, replace(conv, weight=conv.weight[:, :3].contiguous()), pack, pool),
               "dilation 2": (x, w, replace(conv, dilation=2), pack, pool),
               "pool of another width": (x, w, conv, pack, pool[:, :, :16]),
               "more sequences than tokens": (x, w, conv, Packing.build([1] * 5, list(range(5))), pool),
               "K mismatch": (x[:, :32], w, conv, pack, pool)}
        for why, args in bad.items():
            with pytest.raises(ValueError):
                glue.linear_conv(*args)
            assert torch.equal(pool, before), why

    def test_linear_conv_reference_is_the_projection_then_the_conv():
        """The float64 reference (CPU: naive.linear_conv) against its definition, op by op: the projection, its
        first D columns through causal_conv1d's own update (the conv op the unfused path calls) on a copy of the
        pool; the columns past D are the projection itself."""
        import torch.nn.functional as F

        from gdn_trt.plugins.causal_conv1d import op as conv_op

        x, w, conv, pack, pool = _conv_case(7, 96, 64, 48, 10, torch.float64)
        want_pool = pool.clone()
        proj = F.linear(x, w)
        want, _ = conv_op.update(proj[:, :48].contiguous(), conv, pack, want_pool)
        y = glue.linear_conv(x, w, conv, pack, pool)
        assert torch.equal(y[:, 48:], proj[:, 48:]) and torch.equal(y[:, :48], want)
        assert torch.equal(pool, want_pool)

    def test_layer_takes_the_fused_conv_in_decode_modes_only(monkeypatch):
        """The layer's choice (`_Io.conv_in_gemm`), with the kernel's own test (`glue.conv_in_gemm`) forced true on
        the CPU so that `glue.linear_conv` runs its float64 reference: taken in the two one-token decode modes and
        there equal bit for bit to the projection and the conv op (output and every buffer), not taken in the other
        modes nor with LoRA updates on in_proj (then the LoRA update must apply to the projection)."""
        from gdn_trt.model.lora import Proj
        from gdn_trt.model.modes import Writes

        from .glue_support import check_fused_choice, make_layer

        layer = make_layer("tiny-next", 0, torch.float64)
        assert layer._by_proj[Proj.IN_PROJ], "the preset's layer has no LoRA site on in_proj"
        check_fused_choice(monkeypatch, layer, "conv_in_gemm", "linear_conv", lambda mode, lora: (
            mode.spec.one_token_per_sequence and mode.spec.writes is Writes.POOLS and not lora))

    @pytest.mark.parametrize("conv", [False, True], ids=["plain", "conv"])
    def test_tma_launches_compile_for_sm90(conv):
        """TMA launches (`Config.tma`) at Qwen3-Next's shapes compiled as the H200 would: the tiles arrive by bulk
        tensor copies (cp.async.bulk.tensor in the PTX), no spills, shared memory within the limit; in_proj also
        with the conv in its epilogue."""
        from gdn_trt.plugins import triton_aot
        from gdn_trt.plugins.glue import gemm

        C = gemm.Config
        cases = [((12352, 2048), C(64, 64, 64, 4, 4, tma=True)), ((12352, 2048), C(16, 128, 64, 4, 8, tma=True))]
        if not conv:
            cases.append(((2048, 4096), C(64, 64, 64, 6, 4, split=4, tma=True)))
        for (N, K), cfg in cases:
            x, w = torch.empty(cfg.bm, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
            cv = (torch.empty(8192, 4, dtype=torch.bfloat16), torch.empty(9, 3, 8192, dtype=torch.bfloat16),
                  torch.empty(cfg.bm, dtype=torch.int32)) if conv else None
            (launch,) = triton_aot.record(gemm, lambda: gemm.launch(x, w, cfg, cv))
            c = triton_aot.compile_launch(launch)
            assert c.spill_stack == 0 and c.shared <= triton_aot.SMEM_LIMIT, f"{cfg}: {c.row()}"
            assert "cp.async.bulk.tensor" in triton_aot.compile_kernel(launch).asm["ptx"], f"{cfg}: no TMA copy"

    # ---- GPU ----
    NEXT = {"in_proj": (12352, 2048), "out_proj": (2048, 4096)}  # Qwen3-Next [N, K]

    def _crossover(monkeypatch) -> int:
        """The dispatch opened to every M the table has a launch for: the tests check the dispatch and the layer with
        the kernel at every such M (on the H200 it dispatches only where the launch beat cuBLAS)."""
        from gdn_trt.plugins.glue import gemm

        top = gemm.TABLE[-1].max_m
        monkeypatch.setattr(gemm, "dispatched", lambda m, n: 1 <= m <= top)
        return top

    def _poison(monkeypatch):
        from gdn_trt.plugins.glue import gemm

        new = gemm._new
        monkeypatch.setattr(gemm, "_new", lambda *a: new(*a).fill_(float("nan")))

    def _bm(M: int) -> int:
        return max(16, 1 << (M - 1).bit_length())  # tl.dot's 16 rows at least, else the next power of two

    def _split_cfg(name: str, M: int):
        """A split-K launch for a real shape (out_proj: 32 N-tiles of 64 rows x 8 K-slices; in_proj: 4 slices)."""
        from gdn_trt.plugins.glue import gemm

        bm = _bm(M)
        return gemm.Config(bm, 64, 128, 4, 4, split=8) if name == "out_proj" else gemm.Config(bm, 128, 64, 4, 4,
                                                                                            split=4)

    def _spread_cfg(name: str, M: int):
        """Row ranges for a real shape (in_proj: 132 programs of 93-94 rows; out_proj: 264 of 7-8 rows x 2 slices)."""
        from gdn_trt.plugins.glue import gemm

        bm = _bm(M)
        return gemm.Config(bm, 16, 128, 4, 4, split=2, spread=2) if name == "out_proj" else \
            gemm.Config(bm, 16, 64, 4, 4, spread=1)

    def _tma_cfg(name: str, M: int):
        """TMA tiles for a real shape (in_proj: 193 N-tiles; out_proj: 32 N-tiles x 4 K-slices)."""
        from gdn_trt.plugins.glue import gemm

        return gemm.Config(_bm(M), 64, 64, 4, 4, split=4 if name == "out_proj" else 1, tma=True)

    def _counters_at_zero():
        from gdn_trt.plugins.glue import gemm

        for key, (_, cnt) in gemm._WORK.items():
            assert cnt.device.type != "cuda" or int(cnt.abs().sum()) == 0, f"counters of {key} left non-zero"

    @pytest.mark.gpu
    @pytest.mark.parametrize("name", list(NEXT))
    def test_real_shapes_against_float64_and_cublas(name, monkeypatch):
        """The table's launch, a split-K one and a row-range one (spread), within the fp32-accumulation bound of
        float64 at every M bucket (non-powers of two included), and no less accurate than cuBLAS on the same inputs
        (RMS error at most 1.05x F.linear's: both round once to bf16, which dominates; cuBLAS may also reduce split-K
        partials in bf16)."""
        from gdn_trt.plugins.glue import gemm

        _poison(monkeypatch)
        N, K = NEXT[name]
        w = torch.randn(N, K, device="cuda").bfloat16() * 0.02
        for M in (1, 2, 3, 5, 8, 16, 17, 33, 64):
            x = torch.randn(M, K, device="cuda").bfloat16()
            for cfg in (gemm.config_for(M, N), _split_cfg(name, M), _spread_cfg(name, M), _tma_cfg(name, M)):
                y = gemm.launch(x, w, cfg)
                within_bound(x, w, y, 2.0**-8)
                ref = x.double() @ w.double().T
                ours, cublas = (y.double() - ref).norm().item(), (F.linear(x, w).double() - ref).norm().item()
                assert ours <= 1.05 * cublas, f"M {M} {cfg}: RMS error {ours:.3e} against cuBLAS's {cublas:.3e}"
        _counters_at_zero()

    @pytest.mark.gpu
    @pytest.mark.parametrize("name", list(NEXT))
    @pytest.mark.parametrize("M", [2, 16, 64])
    def test_split_k_repeats_and_replays_bit_for_bit(name, M):
        """The slices of a tile finish in a different order from call to call; the last one sums them in slice
        order, so 20 eager calls, and graph replays, give the same bits; every call leaves the counters at zero."""
        from gdn_trt.plugins.glue import gemm

        N, K = NEXT[name]
        cfg = _split_cfg(name, M)
        x = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16() * 0.02
        want = gemm.launch(x, w, cfg)
        for _ in range(20):
            assert torch.equal(want, gemm.launch(x, w, cfg)), "two eager calls differ: not deterministic"
        _counters_at_zero()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = gemm.launch(x, w, cfg)
        for _ in range(3):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(want, out)
        _counters_at_zero()

    @pytest.mark.gpu
    @pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")  # the refused capture captured nothing
    def test_first_split_k_launch_under_capture_is_refused():
        """A geometry's workspace is allocated by its first, eager launch; a first launch under capture raises a
        clear error instead of capturing a counter reset that an eager call would never see."""
        from gdn_trt.plugins.glue import gemm

        x = torch.randn(3, 4096, device="cuda").bfloat16()
        w = torch.randn(2048, 4096, device="cuda").bfloat16()
        cfg = gemm.Config(16, 32, 64, 4, 4, split=5)  # a geometry no other test launches
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="must be eager"):
            with torch.cuda.graph(g):
                gemm.launch(x, w, cfg)
        torch.cuda.synchronize()
        within_bound(x, w, gemm.launch(x, w, cfg), 2.0**-8)

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
        """Triton exactly where op.linear says (bf16 / fp16, gemm.dispatched, N >= GEMM_MIN_N, K >= GEMM_MIN_K);
        everything else is F.linear bit for bit."""
        from gdn_trt.plugins.glue import gemm

        top = _crossover(monkeypatch)
        calls = []
        launch = gemm.launch
        monkeypatch.setattr(gemm, "launch", lambda *a: calls.append(a[0].shape[0]) or launch(*a))
        K = glue.GEMM_MIN_K
        w = torch.randn(2048, K, device="cuda").bfloat16()
        for M in (1, top):
            glue.linear(torch.randn(M, K, device="cuda").bfloat16(), w)
        assert calls == [1, top]
        x = torch.randn(4, K, device="cuda").bfloat16()
        cases = {"M past the table": (torch.randn(top + 1, K, device="cuda").bfloat16(), w),
                 "fp32": (x.float(), w.float()),
                 "N under GEMM_MIN_N": (x, w[: glue.GEMM_MIN_N - 16]),
                 "K under GEMM_MIN_K": (x[:, : K - 16], w[:, : K - 16].contiguous()),
                 "transposed weight": (x, torch.randn(K, 2048, device="cuda").bfloat16().T),
                 "K-strided x": (torch.randn(K, 4, device="cuda").bfloat16().T, w)}
        for why, (a, b) in cases.items():
            assert torch.equal(glue.linear(a, b), F.linear(a, b)), why
        assert calls == [1, top], "a call outside the dispatch reached the Triton GEMM"

    @pytest.mark.gpu
    @pytest.mark.parametrize("M", [1, 8, 33, 64])
    def test_conv_epilogue_real_shapes_against_float64_and_the_two_kernels(M, monkeypatch):
        """Qwen3-Next's in_proj with the conv (D = 8192 of 12352 channels) in the GEMM's epilogue, bf16: the same
        bits as the same GEMM launch followed by the conv kernel (output and pool), within the float64
        reference's bound, pool rows outside the step and padding rows' conv columns as they must be, and a graph
        replay equal to the eager call."""
        from gdn_trt.plugins.causal_conv1d import triton as conv_tri
        from gdn_trt.plugins.glue import gemm, naive

        _poison(monkeypatch)
        N, K = NEXT["in_proj"]
        calls = []
        launch = gemm.launch
        monkeypatch.setattr(gemm, "launch", lambda *a: calls.append(len(a)) or launch(*a))
        x, w, conv, pack, pool = _conv_case(M, N, K, 8192, 2 * M + 3, torch.bfloat16, "cuda")
        two_pool = pool.clone()
        ref_pool = pool.double()
        before = pool.clone()
        y = glue.linear_conv(x, w, conv, pack, pool)
        assert calls == [4], "the call did not reach the GEMM with the conv in its epilogue"
        two = gemm.launch(x, w, gemm.config_for(M, N))
        two[:, :8192] = conv_tri.update(two[:, :8192], conv, pack, two_pool)
        assert torch.equal(y, two) and torch.equal(pool, two_pool)
        ref = naive.linear_conv(x.double(), w.double(), type(conv)(conv.weight.double()), pack, ref_pool)
        within_bound(x, w[8192:], y[:, 8192:], 2.0**-8)  # the columns past the conv: the projection itself
        # the conv's columns: the newest tap is the projection rounded to bf16, so it errs by within_bound's bound
        # e_p (u_out |p| + (K + 1) u32 |x| |w|^T); silu's slope is below 1.1, the four-tap fp32 sum errs by at most
        # 4 u32 times its magnitudes, fp32 sigmoid (ex2.approx) by 2^-20 of them, and y is rounded to bf16 once
        xd, wd, cw = x.double(), w[:8192].double(), conv.weight.double()
        p = xd @ wd.T
        e_p = 2.0**-8 * p.abs() + (1 + 2.0**-8) * (K + 1) * U_ACC * (xd.abs() @ wd.abs().T)
        h = before.double()[pack.slots.long().clamp_min(0)]  # [M, 3, D]: each token's window before the step
        taps = cw[:, 3].abs() * p.abs() + (cw[:, :3].T.abs()[None] * h.abs()).sum(1)
        bound = (1 + 2.0**-8) * (1.1 * (cw[:, 3].abs() * e_p + 4 * U_ACC * taps) + 2.0**-20 * taps) \
            + 2.0**-8 * ref[:, :8192].abs() + 1e-30
        err = (y[:, :8192].double() - ref[:, :8192]).abs()
        assert (err <= bound).all(), f"conv columns err {(err / bound).max().item():.2f}x the bound"
        live = pack.slots.tolist()
        untouched = [s for s in range(pool.shape[0]) if s not in live]
        assert torch.equal(pool[untouched], before[untouched])
        kept = [s for s in live if s >= 0]
        assert torch.equal(pool[kept, :2], before[kept, 1:]), "the window did not shift by one token"
        pad = [m for m, s in enumerate(live) if s < 0]
        assert torch.equal(y[pad, :8192], torch.zeros_like(y[pad, :8192]))
        pool.copy_(before)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = glue.linear_conv(x, w, conv, pack, pool)
        pool.copy_(before)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y) and torch.equal(pool, two_pool)

    @pytest.mark.gpu
    @pytest.mark.parametrize("case", [("qwen3-next-80b-a3b", 0), ("qwen4-exp", 1)], ids=lambda c: c[0])
    def test_layer_decode_with_the_conv_in_gemm_equals_the_two_kernels_bit_for_bit(case, monkeypatch):
        """The real-shape layer (plain, and hc with PLE) in both one-token decode modes with
        `triton.Tuning.conv_in_gemm` on and off, the GEMM dispatched at every M of the table so that both runs
        take the same projection launch: the same output and pools bit for bit, and the fused launch ran."""
        from dataclasses import replace

        from gdn_trt.model.modes import LayerMode
        from gdn_trt.plugins.glue import gemm
        from gdn_trt.plugins.glue import triton as glue_tri

        from .glue_support import make_layer, run_step

        _crossover(monkeypatch)
        convs = []
        launch = gemm.launch
        monkeypatch.setattr(gemm, "launch", lambda *a: convs.append(len(a) == 4) or launch(*a))
        layer = make_layer(*case, torch.bfloat16, "cuda")
        for mode in (LayerMode.DECODE, LayerMode.DECODE_MULTI_SEQ):
            ran = {}
            for on in (False, True):
                monkeypatch.setattr(glue_tri, "TUNING", replace(glue_tri.TUNING, conv_in_gemm=on))
                convs.clear()
                ran[on] = run_step(layer, mode, True)
                assert any(convs) == on, f"{mode.value}: the fused launch {'did not run' if on else 'ran'}"
            assert torch.equal(ran[False].x, ran[True].x), mode.value
            assert ran[False].residual is None or torch.equal(ran[False].residual, ran[True].residual)
            for k in ran[False].buffers:
                assert torch.equal(ran[False].buffers[k], ran[True].buffers[k]), f"{mode.value} {k}"

    @pytest.mark.gpu
    def test_real_layer_decode_graph_runs_the_kernel_and_replays_bit_for_bit(monkeypatch):
        """The Qwen3-Next layer at real shapes, decode of 4 sequences: in_proj and out_proj go to the Triton GEMM,
        and a CUDA-graph replay of the step equals its eager run bit for bit (output and pools)."""
        from gdn_trt.plugins.glue import gemm

        from .glue_support import decode_eager_and_replayed, make_layer

        assert _crossover(monkeypatch) >= 4
        calls = []
        launch = gemm.launch
        monkeypatch.setattr(gemm, "launch", lambda x, w, *a: calls.append(tuple(w.shape)) or launch(x, w, *a))
        layer = make_layer("qwen3-next-80b-a3b", 0, torch.bfloat16, "cuda")
        x = torch.randn(4, layer.cfg.stream_dim, device="cuda").bfloat16()
        want, out = decode_eager_and_replayed(layer, x, torch.randn_like(x), None)
        assert sorted(set(calls)) == sorted({tuple(layer.mixer.in_proj.shape), tuple(layer.mixer.out_proj.shape)})
        assert torch.equal(want.x, out.x) and torch.equal(want.residual, out.residual)

else:
    from gdn_trt.plugins.glue import gemm

    C = gemm.Config
    # both forms, with and without split-K, small and table-sized tiles; (M values, N, K): non-power-of-two M, N not a
    # multiple of BN, K a multiple of BK (the unmasked loop) and not (the masked tail), K not a multiple of split x BK
    # (uneven slices) and K too short for every slice (fewer slices than asked)
    CONFIGS = [C(1, 8, 64, dot=False), C(4, 8, 32, dot=False), C(16, 16, 64), C(32, 32, 32),
               C(1, 8, 64, dot=False, split=2), C(2, 8, 32, dot=False, split=4), C(16, 16, 32, split=3),
               C(32, 16, 64, split=2), C(16, 16, 32, tma=True), C(16, 16, 32, split=3, tma=True),
               *(r.cfg for r in gemm.TABLE)]

    def _shapes(cfg):
        ms = sorted({1, 3, min(cfg.bm, 4) + (cfg.bm > 4) * 3, cfg.bm + 5})
        shapes = [(ms, 50, 2 * cfg.bk), (ms, 70, cfg.bk + 96)]
        if cfg.split > 1:
            shapes.append((ms, 40, cfg.split * cfg.bk + cfg.bk // 2 + 8))
        return shapes

    def _poisoned_x(M: int, K: int, dtype=torch.float32) -> torch.Tensor:
        """x [M, K] as the first rows of a buffer whose rows past M are NaN: the kernel must not read them."""
        big = torch.full((M + 8, K), float("nan"), dtype=dtype)
        big[:M] = torch.randn(M, K).to(dtype)
        return big[:M]

    @pytest.mark.parametrize("cfg", CONFIGS, ids=str)
    def test_kernel_fp32_against_float64(cfg, monkeypatch):
        new = gemm._new
        monkeypatch.setattr(gemm, "_new", lambda *a: new(*a).fill_(float("nan")))
        for ms, N, K in _shapes(cfg):
            for M in ms:
                x, w = _poisoned_x(M, K), torch.randn(N, K)
                within_bound(x, w, gemm.launch(x, w, cfg), U_ACC)

    @pytest.mark.parametrize("cfg", [c for c in CONFIGS if not c.dot], ids=str)
    def test_fma_form_bf16_against_float64(cfg):
        """bf16 only in the FMA form: the interpreter (Triton 3.9) multiplies bf16 tl.dot operands wrongly (a 16 x 16
        bf16 dot errs by 2e10; the same values as fp32 are exact), and casts fp32 to bf16 by truncation (2^-7)."""
        for ms, N, K in _shapes(cfg):
            for M in ms:
                x, w = _poisoned_x(M, K, torch.bfloat16), torch.randn(N, K).bfloat16()
                within_bound(x, w, gemm.launch(x, w, cfg), 2.0**-7)

    @pytest.mark.parametrize("cfg", [c for c in CONFIGS if c.split > 1], ids=str)
    def test_split_k_workspace_is_kept_and_counters_end_at_zero(cfg):
        """Two calls: the same bits, one workspace (allocated by the first, reused by the second), every ticket
        counter back at zero after each."""
        M, N, K = 3, 50, cfg.split * cfg.bk + 8
        x, w = torch.randn(M, K), torch.randn(N, K)
        first = gemm.launch(x, w, cfg)
        kept = {k: (ws.data_ptr(), cnt.data_ptr()) for k, (ws, cnt) in gemm._WORK.items()}
        assert any(k[2] == cfg.split for k in kept), "no split-K workspace was used"
        assert all(int(cnt.abs().sum()) == 0 for _, cnt in gemm._WORK.values())
        assert torch.equal(first, gemm.launch(x, w, cfg))
        assert {k: (ws.data_ptr(), cnt.data_ptr()) for k, (ws, cnt) in gemm._WORK.items()} == kept
        assert all(int(cnt.abs().sum()) == 0 for _, cnt in gemm._WORK.values())

    @pytest.mark.parametrize("cfg", [C(16, 16, 32, spread=1), C(16, 16, 32, split=3, spread=1),
                                     C(32, 16, 64, spread=2), C(32, 16, 32, spread=1, tma=True)], ids=str)
    def test_spread_row_ranges_against_float64(cfg, monkeypatch):
        """Row ranges instead of N-tiles, with the SM count cut to 5 so that the ranges are uneven (40 / 50 / 70
        rows over 5 or 10 programs: 4-14 rows each, the rest of the BN-row block masked), outputs poisoned."""
        new = gemm._new
        monkeypatch.setattr(gemm, "_new", lambda *a: new(*a).fill_(float("nan")))
        monkeypatch.setattr(gemm, "SMS", 5)
        for ms, N, K in _shapes(cfg):
            programs, bn = gemm.row_tiles(cfg, N)
            assert programs == 5 * cfg.spread and bn >= -(-N // programs), (programs, bn)
            for M in ms:
                x, w = _poisoned_x(M, K), torch.randn(N, K)
                within_bound(x, w, gemm.launch(x, w, cfg), U_ACC)

    @pytest.mark.parametrize("cfg", [C(16, 16, 32), C(1, 8, 64, dot=False), C(16, 16, 32, split=3),
                                     C(32, 16, 64, spread=1), C(16, 16, 32, tma=True)], ids=str)
    def test_conv_epilogue_against_float64(cfg, monkeypatch):
        """The conv update in the epilogue (fp32): the conv's channels (40: not a multiple of BN, so one tile holds
        both kinds) against the float64 reference, every fourth token padding (conv columns 0, no pool row
        touched), pool rows outside the step bit for bit, outputs poisoned with NaN. Tolerance: fp32 sums of K
        products and of four taps, about 1e-6 of their magnitudes here."""
        from gdn_trt.plugins.glue import naive

        new = gemm._new
        monkeypatch.setattr(gemm, "_new", lambda *a: new(*a).fill_(float("nan")))
        monkeypatch.setattr(gemm, "SMS", 5)
        M = 2 if cfg.bm == 1 else 7
        x, w, conv, pack, pool = _conv_case(M, 70, 96, 40, 11)
        before, ref_pool = pool.clone(), pool.double()
        y = gemm.launch(x, w, cfg, (conv.weight, pool, pack.slots))
        ref = naive.linear_conv(x.double(), w.double(), type(conv)(conv.weight.double()), pack, ref_pool)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(pool.double(), ref_pool, rtol=1e-5, atol=1e-5)
        live = pack.slots.tolist()
        untouched = [s for s in range(11) if s not in live]
        assert torch.equal(pool[untouched], before[untouched])
        assert all(not y[m, :40].any() for m, s in enumerate(live) if s < 0)

    def test_row_strided_input_and_empty_shapes():
        """A misaligned row-strided x (TMA launches fall back to pointer loads: no descriptor for it), and empty
        shapes; TMA launches on a 16-byte aligned row-strided x take descriptors and agree too."""
        big = torch.randn(3, 300)
        x, w = big[:, 17:145], torch.randn(40, 128)
        assert not gemm._tma_ok(x) and gemm._tma_ok(big[:, 16:144]) and gemm._tma_ok(w)
        within_bound(big[:, 16:144], w, gemm.launch(big[:, 16:144], w, C(16, 16, 32, tma=True)), U_ACC)
        with pytest.raises(ValueError, match="128 bytes"):
            gemm.launch(big[:, 16:144], w, C(16, 16, 64, tma=True))  # 64 fp32 columns: 256 bytes
        for cfg in (C(16, 16, 64), C(16, 16, 32, split=2), C(16, 16, 32, tma=True)):
            within_bound(x, w, gemm.launch(x, w, cfg), U_ACC)
            assert gemm.launch(torch.randn(0, 128), w, cfg).shape == (0, 40)
            assert torch.equal(gemm.launch(torch.randn(2, 0), torch.randn(40, 0), cfg), torch.zeros(2, 40))
