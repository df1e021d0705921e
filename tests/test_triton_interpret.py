"""The Triton kernels on the CPU, under the Triton interpreter, so CI checks their logic without a GPU.

Triton picks the interpreter when it is imported (TRITON_INTERPRET=1), and other test modules import it
normally, so the cases run in a subprocess: `test_interpreter` starts `pytest` on this file with the variable
set, and only there are the cases below defined. They call the same checks as the GPU tests (fp32, small
shapes that still have K != V, non-power-of-two V and D, G in {1, 2, 3}, padding and empty sequences, captures
at 0, inside, at a chunk boundary and at the end, dilation and no activation).
"""

from __future__ import annotations


import pytest
import torch

from .kernel_support import INSIDE, rerun_under_interpreter

if not INSIDE:

    @pytest.mark.parametrize("family", ["gdn", "conv", "aot"])
    def test_interpreter(family):
        rerun_under_interpreter(__file__, "-k", family, timeout=600)

else:
    from gdn_trt.plugins.samples import Heads, Step
    from gdn_trt.plugins.spec import Activation

    from .test_triton_conv import Conv, check_conv
    from .test_triton_gdn import check_chunked, check_recurrent

    F32 = torch.float32

    def test_gdn_decode():
        check_recurrent(Step((1, 1, 1), (3, -1, 0)), Heads(2, 2, 16, 32), F32, "cpu", stash=False)

    def test_gdn_verify_stash():
        check_recurrent(Step((3, 0, 2, 1), (1, 2, -1, 5)), Heads(1, 3, 16, 24), F32, "cpu", stash=True)

    def test_gdn_verify_pool():
        check_recurrent(Step((2, 0, 3), (4, 1, 0)), Heads(2, 1, 8, 16), F32, "cpu", stash=False)

    def test_gdn_recurrent_many_sequence_tiling(monkeypatch):
        # the recurrent kernel's tile for many sequences (here forced; small steps take the few-sequence tile)
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, rec_few_below=0, rec_bv=32))
        check_recurrent(Step((1, 1, 1), (3, -1, 0)), Heads(2, 2, 16, 48), F32, "cpu", stash=False)
        check_recurrent(Step((3, 0, 2), (1, 2, 5)), Heads(1, 3, 16, 24), F32, "cpu", stash=True)

    def test_gdn_recurrent_subtiles(monkeypatch):
        # the many-sequence tile as sub-tiles (Tuning.rec_sub): one-token sequences take the pipelined loop, longer
        # ones the sub-tile loop; V = 48 in 32-wide tiles of 16-wide sub-tiles (the last masked)
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, rec_few_below=0, rec_bv=32, rec_sub=16))
        check_recurrent(Step((1, 1, 3, 1), (3, -1, 0, 2)), Heads(2, 2, 16, 48), F32, "cpu", stash=False)
        check_recurrent(Step((3, 0, 1, 2), (1, 2, 5, -1)), Heads(1, 3, 16, 48), F32, "cpu", stash=True)

    def test_gdn_recurrent_variants(monkeypatch):
        # the state tile through a TMA descriptor (Tuning.rec_tma / rec_tma_few): the descriptor's bounds stand in
        # for the masks (K < BK: K = 24 below; V not a multiple of the tile), in one tile and in sub-tiles; the
        # output from the updated tile (rec_q_after); the tile as column chunks (rec_chunk); the tile before the first
        # token's operands (rec_qkv_first off)
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        for change in (dict(rec_tma_few=True), dict(rec_few_below=0, rec_bv=32, rec_tma=True),
                       dict(rec_few_below=0, rec_bv=32, rec_sub=16, rec_tma=True),
                       dict(rec_few_below=0, rec_bv=32, rec_q_after=True),
                       dict(rec_few_below=0, rec_bv=32, rec_chunk=8), dict(rec_few_below=0, rec_bv=32, rec_chunk=16,
                                                                           rec_q_after=True),
                       dict(rec_qkv_first=False), dict(rec_few_below=0, rec_bv=32, rec_qkv_first=False)):
            monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, **change))
            check_recurrent(Step((1, 1, 3, 1), (3, -1, 0, 2)), Heads(2, 2, 24, 48), F32, "cpu", stash=False)
            check_recurrent(Step((3, 0, 1, 2), (1, 2, 5, -1)), Heads(1, 3, 16, 40), F32, "cpu", stash=True)

    def test_gdn_recurrent_persistent(monkeypatch):
        # the persistent grid (Tuning.rec_persist) on 2 "SMs", so each program walks several items: one-token
        # sequences in the pipelined loop (padding among them), a 3-token, an empty and a 2-token padding sequence
        # in the loop after it; whole tiles (K = 16, V = 32: no load masks) and masked ones (K = 24, V = 48), in one
        # tile and in K-halves, over 2 and 3 stages
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "_sm_count", lambda dev: 2)
        for change in (dict(rec_persist=1), dict(rec_persist=2, rec_persist_stages=3),
                       dict(rec_persist=2, rec_persist_kh=True), dict(rec_persist=3, rec_persist_kh=True,
                                                                      rec_persist_stages=3)):
            monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, rec_few_below=0, rec_bv=32, **change))
            check_recurrent(Step((1, 1, 1, 1, 1), (3, -1, 0, 2, 6)), Heads(2, 2, 16, 32), F32, "cpu", stash=False)
            check_recurrent(Step((1, 1, 3, 1, 0, 2), (3, -1, 0, 2, 5, -1)), Heads(2, 2, 24, 48), F32, "cpu",
                            stash=False)
            check_recurrent(Step((3, 0, 1, 2), (1, 2, 5, -1)), Heads(1, 3, 16, 40), F32, "cpu", stash=True)

    def test_gdn_recurrent_persistent_word_reads(monkeypatch):
        # the persistent grid reading bf16 q, k, v, a, b as 4-byte words (Tuning.rec_persist_pairs; aligned inputs)
        # gives bit for bit what it gives with plain reads (checked against float64 in fp32 above; the bf16 bound is
        # checked on the GPU: here the interpreter's bf16 output rounding alone is over it, 3.3e-3 in every decode
        # kernel), in one tile and in K-halves, whole tiles and masked ones (V = 48 in 32-wide tiles)
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        from .kernel_support import poisoned
        from .test_triton_gdn import _dead_rows, aligned_inputs

        monkeypatch.setattr(gdn_tri, "_sm_count", lambda dev: 2)
        for change in (dict(rec_persist=2), dict(rec_persist=3, rec_persist_kh=True, rec_persist_stages=3)):
            for step, heads in ((Step((1, 1, 1, 1, 1), (3, -1, 0, 2, 6)), Heads(2, 2, 16, 32)),
                                (Step((1, 1, 3, 1, 0, 2), (3, -1, 0, 2, 5, -1)), Heads(1, 4, 24, 48))):
                x, pack, pool = aligned_inputs(step, heads, torch.bfloat16, "cpu", 8)
                got = []
                for pairs in (False, True):
                    tu = replace(gdn_tri.TUNING, rec_few_below=0, rec_bv=32, rec_persist_pairs=pairs, **change)
                    p = pool.clone()
                    with poisoned(gdn_tri):
                        got.append((gdn_tri.launch_recurrent(x, pack, p, None, tu), p))
                (o_plain, p_plain), (o_pairs, p_pairs) = got
                assert torch.isfinite(o_pairs).all() and (o_pairs[_dead_rows(step)] == 0).all()
                assert torch.equal(o_plain, o_pairs) and torch.equal(p_plain, p_pairs)

    def test_gdn_recorded_launches_run_and_replay():
        # triton_aot.record(..., run=True), as bench/passes.py times each pass alone: the recorded call computes what
        # the plain one does, bit for bit, and a recorded launch replays on its own buffers (the output pass
        # rewrites o the same way)
        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
        from gdn_trt.plugins.packing import Capture
        from gdn_trt.plugins.samples import make_inputs
        from gdn_trt.plugins.triton_aot import record

        step = Step((70, 3), (1, 0), (-1, 2))
        x, pack, pool = make_inputs(step, Heads(1, 2, 16, 32), F32, "cpu")
        at = torch.tensor(step.capture_at, dtype=torch.int32)
        pools, caps, outs = [pool.clone(), pool.clone()], [torch.zeros(2, *x.state_shape) for _ in range(2)], []
        outs.append(gdn_tri.launch_chunked(x, pack, pools[0], Capture(at, caps[0]), gdn_tri.TUNING))
        launches = record(gdn_tri, lambda: outs.append(gdn_tri.launch_chunked(x, pack, pools[1], Capture(at, caps[1]),
                                                                              gdn_tri.TUNING)), run=True)
        assert torch.equal(outs[0], outs[1]) and torch.equal(pools[0], pools[1]) and torch.equal(caps[0], caps[1])
        outs[1].fill_(float("nan"))
        next(launch for launch in launches if launch.name == "gdn_chunk_out_kernel")()
        assert torch.equal(outs[0], outs[1])

    def test_gdn_chunked_varlen():
        check_chunked(Step((1, 70, 0), (0, 3, 5), (1, 64, 0)), Heads(1, 2, 16, 32), F32, "cpu")

    def test_gdn_chunked_capture_inside():
        check_chunked(Step((65, 9), (-1, 2), (-1, 9)), Heads(1, 3, 32, 16), F32, "cpu")
        check_chunked(Step((66,), (6,), (33,)), Heads(1, 1, 16, 16), F32, "cpu")

    def test_gdn_chunked_per_head_solve(monkeypatch):
        # the solve pass with one program per value head (Tuning.solve_share off; the default shares k k^T)
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, solve_share=False))
        check_chunked(Step((70, 3), (1, 0), (-1, 2)), Heads(1, 3, 32, 16), F32, "cpu")
        check_chunked(Step((65, 1), (0, 2), (64, 0)), Heads(2, 2, 16, 24), F32, "cpu")

    def test_gdn_chunked_fused_wu(monkeypatch):
        # w and u formed in the solve's program (Tuning.fuse_wu), shared and per-head solve, V wider than one BD
        # slice
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, fuse_wu=True))
        check_chunked(Step((70, 3), (1, 0), (-1, 2)), Heads(1, 3, 32, 16), F32, "cpu")
        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, fuse_wu=True, solve_share=False, fuse_bd=16))
        check_chunked(Step((70, 3), (1, 0), (-1, 2)), Heads(1, 2, 16, 40), F32, "cpu")

    def test_gdn_chunked_rq_first(monkeypatch):
        # 1 / |q| from pass 1, loaded by the output pass (Tuning.rq_first, the default), or reduced by the output pass
        # itself; shared and per-head solve
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, rq_first=False))
        check_chunked(Step((70, 3, 0), (1, 0, 2), (-1, 2, 0)), Heads(1, 3, 48, 16), F32, "cpu")
        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, rq_first=True, solve_share=False))
        check_chunked(Step((65, 1), (0, 2), (64, 0)), Heads(2, 2, 16, 24), F32, "cpu")

    def test_gdn_chunked_wu_loop(monkeypatch):
        # the w/u pass over runtime K and V slices (Tuning.wu_stages > 0), K and V wider than one 64-wide slice
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, wu_stages=2))
        check_chunked(Step((70, 3), (1, 0), (-1, 2)), Heads(1, 2, 80, 72), F32, "cpu")
        # and K in one tile, V slices unrolled (wu_stages 0, the default before 2026-12-04)
        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, wu_stages=0, wu_warps=8))
        check_chunked(Step((70, 3), (1, 0), (-1, 2)), Heads(1, 2, 80, 72), F32, "cpu")

    @pytest.mark.parametrize("many", [False, True], ids=["single-tiling", "many-tiling"])
    def test_gdn_chunked_state_cuts(many, monkeypatch):
        # the state pass's chunk segments around capture cuts: a partial chunk before and after a cut (130 tokens
        # cut at 33), a cut on a chunk boundary with a partial chunk after it (70 at 64), whole chunks only (128
        # from a snapshot at 0), one partial chunk (3), a capture at the end (64 at 64); the state in one block, as
        # K halves, and with v_new formed in the state pass (WY). (Written for Tuning.state_full, the full chunks
        # without row masks, taken out after timing: commit 213e0d9.)
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        if many:  # the many-sequence tiling on a one-SM "device"
            monkeypatch.setattr(gdn_tri, "_sm_count", lambda dev: 1)
        step = Step((130, 3, 64, 70, 128), (0, 1, 2, 3, 4), (33, -1, 64, 64, 0))
        for extra in ({}, dict(state_kb=True, state_kb_many=True), dict(state_wy=True, state_wy_many=True)):
            monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, **extra))
            check_chunked(step, Heads(1, 2, 16, 32), F32, "cpu")

    def test_gdn_chunked_state_halves(monkeypatch):
        # the state pass with the state as two 64-row halves (Tuning.state_kb): K = 96 (second half masked) and
        # K = 16, captures inside and at the ends
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, state_kb=True))
        check_chunked(Step((70, 3, 65), (1, 0, 2), (-1, 2, 64)), Heads(1, 2, 96, 24), F32, "cpu")
        check_chunked(Step((66,), (6,), (33,)), Heads(1, 1, 16, 16), F32, "cpu")

    def test_gdn_chunked_many_sequence_tiling(monkeypatch):
        # the state pass's tiling for many sequences (Tuning.state_bv_many), taken here on a one-SM "device":
        # V = 96 in 64-wide tiles, the second half masked
        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "_sm_count", lambda dev: 1)
        assert gdn_tri._state_tiling(gdn_tri.TUNING, 96, 2, torch.device("cpu"))[0] == 64
        check_chunked(Step((70, 3, 65), (1, 0, 2), (-1, 2, 64)), Heads(1, 2, 16, 96), F32, "cpu")

    @pytest.mark.parametrize("kb", [False, True], ids=["one-block", "k-halves"])
    def test_gdn_chunked_state_wy(kb, monkeypatch):
        # v_new formed in the state pass from T, v and b, no w/u pass (Tuning.state_wy / state_wy_many), the state
        # in one block or as K halves (state_kb / state_kb_many): the single-sequence tiling (K = 96: the second
        # half masked), then the many-sequence one on a one-SM "device" (V = 96 in 64-wide tiles); G = 1, 2 and
        # 3, padding and empty sequences, captures inside, at 0, at a chunk boundary, at the end and none
        from dataclasses import replace

        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "TUNING", replace(gdn_tri.TUNING, state_wy=True, state_wy_many=True,
                                                       state_kb=kb, state_kb_many=kb))
        assert gdn_tri._state_tiling(gdn_tri.TUNING, 24, 2, torch.device("cpu")).wy
        check_chunked(Step((70, 3, 0), (1, 0, 2), (-1, 2, 0)), Heads(1, 3, 96, 24), F32, "cpu")
        check_chunked(Step((66,), (6,), (33,)), Heads(1, 1, 16, 16), F32, "cpu")
        monkeypatch.setattr(gdn_tri, "_sm_count", lambda dev: 1)
        assert gdn_tri._state_tiling(gdn_tri.TUNING, 96, 2, torch.device("cpu")).bv == 64
        check_chunked(Step((70, 3, 65), (1, 0, 2), (-1, 2, 64)), Heads(1, 2, 16, 96), F32, "cpu")

    def test_gdn_chunked_pipeline(monkeypatch):
        # the state pass in windows (Tuning.state_pipe): one launch's results bit for bit, the windows splitting a
        # sequence inside, at its capture cut and between sequences, in the single- and many-sequence tilings (K
        # halves and WY forms); empty and padding sequences, captures at 0, inside, at a boundary and at the end
        from .test_triton_gdn import check_pipeline

        check_pipeline(Step((200,), (3,), (70,)), Heads(1, 2, 16, 24), F32, "cpu", 4)
        check_pipeline(Step((70, 0, 65, 5, 130), (1, 0, 2, -1, 4), (-1, 0, 64, 2, 128)), Heads(1, 3, 16, 24), F32,
                       "cpu", 8, state_kb=True)
        check_pipeline(Step((70, 0, 65, 5, 130), (1, 0, 2, -1, 4), (-1, 0, 64, 2, 128)), Heads(1, 2, 96, 16), F32,
                       "cpu", 3, state_wy=True, state_wy_many=True)
        from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

        monkeypatch.setattr(gdn_tri, "_sm_count", lambda dev: 1)  # the many-sequence tiling
        for wy in (False, True):
            check_pipeline(Step((70, 0, 65, 5, 130), (1, 0, 2, -1, 4), (-1, 0, 64, 2, 128)), Heads(1, 2, 16, 96),
                           F32, "cpu", 4, state_wy_many=wy)

    def test_gdn_chunked_k_slices():
        # K = 48: the solve pass accumulates k k^T over two 32-wide K slices, the second one half masked
        check_chunked(Step((80, 5), (1, 0), (64, -1)), Heads(1, 2, 48, 24), F32, "cpu")

    def test_conv_update():
        check_conv(Step((1, 1, 1), (3, -1, 0)), Conv(40), F32, "cpu", "update")
        # one-token path with dilation (taps every DIL-th history column) and no activation; two tokens: the loop
        check_conv(Step((1, 2, 1), (0, 4, 2)), Conv(20, W=3, dilation=2, activation=Activation.NONE), F32,
                   "cpu", "update")

    def test_conv_update_weight_gathers(monkeypatch):
        # the one-token update with the weights as per-tap strided loads (Tuning.update_wtile off), a bench variant
        from dataclasses import replace

        from gdn_trt.plugins.causal_conv1d import triton as conv_tri

        monkeypatch.setattr(conv_tri, "TUNING", replace(conv_tri.TUNING, update_wtile=False, update_bd=16))
        check_conv(Step((1, 1, 1), (3, -1, 0)), Conv(40), F32, "cpu", "update")
        check_conv(Step((1, 2, 1), (0, 4, 2)), Conv(40), F32, "cpu", "update_stash")

    def test_conv_update_stash():
        check_conv(Step((3, 0, 2, 1), (1, 2, -1, 5)), Conv(24, dilation=3), F32, "cpu", "update_stash")

    def test_conv_prefill():
        check_conv(Step((3, 0, 5, 70), (1, 2, -1, 5), (2, 0, 1, 65)), Conv(24, dilation=3), F32, "cpu",
                   "prefill")
        check_conv(Step((7, 130), (4, 6), (3, 1)), Conv(20, W=3, dilation=2, activation=Activation.NONE), F32,
                   "cpu", "prefill")

    # ---- the AOT form: each plugin's wrapper kernel with the launch `aot_kernel` compiles (tests/aot_support.py),
    # the chunked ops as their pass chains; dimensions fixed or free as the modes' graphs leave them ----

    def _aot_gdn(tuning, monkeypatch):
        from gdn_trt.plugins.gated_delta_rule import aot as gdn_aot

        from .aot_support import GDN_CHUNKED, GDN_RECURRENT, GDN_RECURRENT_STASH, Case, check_gdn, interpret_launch

        # fp32 runs here (the interpreter has no bf16): the 16-bit tuning is forced onto it too
        monkeypatch.setattr(gdn_aot, "_tuning", lambda dtype: tuning)
        for case, heads in [(Case(GDN_RECURRENT, Step((1, 1, 1), (3, -1, 0))), Heads(2, 2, 16, 48)),
                            (Case(GDN_RECURRENT, Step((1,), (2,)), ("S",)), Heads(1, 3, 16, 24)),
                            (Case(GDN_RECURRENT_STASH, Step((3, 0, 2, 1), (1, 2, -1, 5))), Heads(1, 3, 16, 24)),
                            (Case(GDN_RECURRENT_STASH, Step((3,), (4,)), ("T", "S")), Heads(2, 1, 16, 16)),
                            (Case(GDN_CHUNKED, Step((1, 70, 0, 5), (0, 3, 5, -1), (1, 64, 0, 2))), Heads(1, 2, 48, 40)),
                            (Case(GDN_CHUNKED, Step((66,), (6,), (33,)), ("T", "S")), Heads(2, 2, 16, 16)),
                            (Case(GDN_CHUNKED, Step((3,), (1,), (3,)), ("T", "S")), Heads(1, 3, 32, 24))]:
            check_gdn(case, heads, F32, "cpu", interpret_launch)

    def test_aot_gdn_fp32_tuning(monkeypatch):
        from gdn_trt.plugins.gated_delta_rule.aot import AOT_TUNING_FP32

        _aot_gdn(AOT_TUNING_FP32, monkeypatch)

    def test_aot_gdn_16bit_tuning(monkeypatch):
        from gdn_trt.plugins.gated_delta_rule.aot import AOT_TUNING

        _aot_gdn(AOT_TUNING, monkeypatch)

    def test_aot_conv():
        from .aot_support import CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, Case, check_conv, conv_attrs, \
            interpret_launch

        silu, dil = Conv(40), Conv(20, W=3, dilation=2, activation=Activation.NONE)
        for op, step, free, conv in [
                (CONV_UPDATE, Step((1, 1, 1), (3, -1, 0)), ("T", "N", "S"), silu),
                (CONV_UPDATE, Step((1,), (2,)), ("S",), dil),
                (CONV_UPDATE_STASH, Step((3, 0, 2, 1), (1, 2, -1, 5)), ("T", "N", "S"), dil),
                (CONV_UPDATE_STASH, Step((2,), (1,)), ("T", "S"), silu),
                (CONV_PREFILL, Step((3, 0, 5, 70), (1, 2, -1, 5), (2, 0, 1, 65)), ("T", "N", "S"), dil),
                (CONV_PREFILL, Step((1,), (4,), (1,)), ("T", "S"), silu),
                (CONV_PREFILL, Step((65,), (0,), (-1,)), ("T", "S"), dil)]:
            check_conv(Case(op, step, free, conv_attrs(conv)), conv, F32, "cpu", interpret_launch)

    def test_aot_pass_bodies_compute_what_their_kernels_compute():
        # each pass's ONNX function body (what ONNX Runtime runs, and TensorRT without the plugins) against its
        # kernel on the kernel's own inputs, intermediates included, at every element the kernel writes
        from .aot_support import (CONV_PREFILL, GDN_CHUNKED, Case, check_bodies_against_kernels, check_conv,
                                  check_gdn, conv_attrs, interpret_launch, recording)

        log = []
        check_gdn(Case(GDN_CHUNKED, Step((1, 70, 0, 5, 66), (0, 3, 5, -1, 6), (1, 64, 0, 2, 33))), Heads(1, 2, 48, 40),
                  F32, "cpu", recording(interpret_launch, log))
        conv = Conv(24, dilation=3)
        check_conv(Case(CONV_PREFILL, Step((3, 0, 5, 70), (1, 2, -1, 5), (2, 0, 1, 65)), attrs=conv_attrs(conv)),
                   conv, F32, "cpu", recording(interpret_launch, log))
        assert [spec.name for spec, *_ in log] == [
            "gated_delta_rule_chunk_solve", "gated_delta_rule_chunk_wu", "gated_delta_rule_chunk_state",
            "gated_delta_rule_chunk_out", "causal_conv1d_prefill_chunk", "causal_conv1d_prefill_state"]
        assert check_bodies_against_kernels(log) > 0
