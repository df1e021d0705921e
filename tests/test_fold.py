"""Accept's fold in one launch (runtime/fold.py).

CPU: the table's word size (the largest of 4, 2, 1 bytes that divides every row and base), its 16-byte flag, and the
refusal of pairs that differ past the row. Interpreter (rerun of this file with TRITON_INTERPRET=1): the kernel
against torch's gather and scatter bit for bit, fp32 rows over several column programs with a masked tail, bf16 rows
of an odd width (2-byte words), the pool rows outside the accepted slots poisoned with NaN and untouched, the stash
unchanged; and a CPU session's whole scenario with the kernel taking every fold against the same through torch.
sm_90: the kernel compiles without spills and copies in 16-byte vectors where the rows allow. GPU (marked gpu): a
session's whole scenario (verify with partial acceptance, every kind of step) with the kernel equals the same
scenario through torch, bit for bit in every output and every piece of state.
"""

from __future__ import annotations

import pytest
import torch

from gdn_trt.runtime import fold

from .kernel_support import INSIDE, rerun_under_interpreter


def _pairs(rows: int, slots: int, shapes, dtypes, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pools = [torch.full((slots, *s), float("nan"), dtype=d) for s, d in zip(shapes, dtypes)]
    stash = [torch.randn(rows, *s, generator=g).to(d) for s, d in zip(shapes, dtypes)]
    return list(zip(stash, pools))


def test_table_words():
    t = fold.Table.of(_pairs(3, 4, [(2, 64), (3, 8)], [torch.float32, torch.bfloat16]))
    assert (t.word, t.vec, t.widest) == (4, True, 128) and t.words[:, 2].tolist() == [128, 12]
    t = fold.Table.of(_pairs(3, 4, [(2, 64), (3, 5)], [torch.float32, torch.bfloat16]))  # 30-byte rows
    assert (t.word, t.vec, t.widest) == (2, False, 256) and t.words[:, 2].tolist() == [256, 15]
    t = fold.Table.of(_pairs(3, 4, [(3, 6)], [torch.float32]))  # 72-byte rows: 4-byte words, not 16-byte vectors
    assert (t.word, t.vec) == (4, False)
    src, dst = _pairs(3, 4, [(2, 64)], [torch.float32])[0]
    for bad in ((src, dst.to(torch.float64)), (src, dst[:, :1]), (src, dst.transpose(1, 2))):
        with pytest.raises(ValueError, match="contiguous and alike past the row"):
            fold.Table.of([bad])


if not INSIDE:
    def test_interpreter_cases():
        rerun_under_interpreter(__file__, "-k", "interp")

    def test_kernel_compiles_for_sm90_in_16_byte_vectors():
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        from gdn_trt.plugins import triton_aot

        sig = {"table": "*i64", "pairs": "*i64", "n": "i32", "WORD": "constexpr", "VEC": "constexpr",
               "BLOCK": "constexpr"}
        attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
        for word, vec in ((tl.int32, 4), (tl.int16, 8), (tl.int32, 1)):
            k = triton.compile(ASTSource(fold._fold_kernel, sig, attrs=attrs,
                                         constexprs=dict(WORD=word, VEC=vec, BLOCK=fold.BLOCK)),
                               target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
            _, stack = triton_aot._resource_usage(k.asm["cubin"])
            ptx = k.asm["ptx"]
            assert stack == 0, (word, vec)
            # whole 16-byte rows: the row length hint holds the masks per vector, and the copies are v4
            assert ("ld.global.v4" in ptx and "st.global.v4" in ptx) == (vec > 1), (word, vec)

if INSIDE:
    @pytest.mark.parametrize("shapes,dtypes", [
        ([(3, 40), (2, 64, 40), (3, 24)], [torch.bfloat16, torch.float32, torch.bfloat16]),  # 5120 words: 2 blocks
        ([(3, 5), (2, 3, 7)], [torch.bfloat16, torch.float32]),  # 30-byte rows: 2-byte words
    ])
    @pytest.mark.parametrize("index", [torch.int64, torch.int32])  # int32: the index buffer's (PackBuffers.pairs)
    def test_interp_fold_equals_torch(shapes, dtypes, index):
        pairs = _pairs(9, 7, shapes, dtypes, seed=1)
        stash = [s.clone() for s, _ in pairs]
        rows, slots = [4, 0, 8], [6, 2, 3]
        want = []
        for src, dst in pairs:
            w = dst.clone()
            w.index_copy_(0, torch.tensor(slots), src.index_select(0, torch.tensor(rows)))
            want.append(w)
        fold.fold(fold.Table.of(pairs), torch.tensor([rows, slots], dtype=index))
        for (src, dst), w, s in zip(pairs, want, stash):
            assert torch.equal(dst[slots], w[slots])  # the accepted rows, bit for bit
            assert dst[[0, 1, 4, 5]].isnan().all()  # the other slots: their poison untouched
            assert torch.equal(src, s)

    @pytest.mark.parametrize("name", ["tiny-3.5", "tiny-4exp"])
    def test_interp_session_fold_equals_torch(name, monkeypatch):
        """The wiring (`StepBuffers.fold`): a CPU session's whole scenario with the kernel taking every fold (the
        table built from its layers' conv, ssm and, on PLE layers, PLE conv pools and stashes) equals the same
        scenario through torch, bit for bit in every output and every piece of state."""
        from gdn_trt.runtime import stack

        from .test_runtime_support import open_session
        from .test_step_context import _dict_run, _state

        ref, got = [], []
        for on, out in ((False, ref), (True, got)):
            monkeypatch.setattr(stack, "_fold_by_kernel", lambda device: on)
            sess = open_session(name)
            out += _dict_run(sess, False) + _state(sess)
            assert (sess.stack.buffers._fold is not None) == on
        assert len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got))


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", [pytest.param("tiny-3.5", torch.bfloat16, id="plain-bfloat16"),
                                        pytest.param("tiny-4exp", torch.float32, id="hc+ple-float32")])
def test_session_with_the_fold_kernel_equals_one_without(name, dtype, monkeypatch):
    from gdn_trt.runtime import stack

    from .test_step_context import _dict_run, _gpu, _state

    ref, got = [], []
    for on, out in ((False, ref), (True, got)):
        monkeypatch.setattr(stack, "FOLD_KERNEL", on)
        sess = _gpu(name, dtype)
        out += _dict_run(sess, False) + _state(sess)
        assert (sess.stack.buffers._fold is not None) == on  # the kernel ran (the scenario accepts drafts)
    assert len(ref) == len(got)
    for k, (a, b) in enumerate(zip(ref, got)):
        assert torch.equal(a.cpu(), b.cpu()), f"output or state {k} differs"
