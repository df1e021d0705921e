"""The Triton kernels as the H200 would compile them, compiled here on the CPU (`plugins/triton_aot.py`).

A kernel whose shared memory exceeds the block limit compiles fine and fails only when loaded on the GPU ("out of
resource": the state pass with 4 stages on fp32 activations did, 2026-12-02). Here every launch of the prefill and
decode entry points at Qwen3-Next-class shapes, with the default tuning, is compiled for sm_90 and its shared
memory checked against the limit, so such a tuning never reaches the device. The AOT kernels (`plugins/aot.py`, what
each plugin's `@trtp.aot_impl` returns to TensorRT) are compiled the same way, every one of them, with the checks
TensorRT's AOT launcher needs (no Triton scratch, one CTA, shared memory within 48 KiB, the PTX parameter order).
"""

from __future__ import annotations

import os

import pytest
import torch

from gdn_trt.plugins import triton_aot

from .test_triton_conv import UPDATE_VARIANTS as CONV_UPDATE_VARIANTS

# under the interpreter the kernels are not JIT functions and there is nothing to compile
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="compiles for sm_90: meaningless under TRITON_INTERPRET=1")

KERNELS = {"gdn_chunk_intra_kernel", "gdn_chunk_wu_kernel", "gdn_chunk_state_kernel", "gdn_chunk_out_kernel",
           "gdn_recurrent_kernel"}


# Qwen3-Next (G=2) and Qwen3.5-27B (G=3) heads; fp32 only at G=3, the largest fp32 kernels (CI time: ~20 s each)
@pytest.mark.parametrize("heads, dtype", [((16, 2, 128, 128), torch.bfloat16), ((16, 3, 128, 128), torch.bfloat16),
                                          ((16, 3, 128, 128), torch.float32)], ids=["G2-bf16", "G3-bf16", "G3-fp32"])
def test_default_tuning_fits_sm90(heads, dtype):
    launches = triton_aot.gdn_launches(dtype, heads)
    assert {launch.name for launch in launches} == KERNELS
    # the state pass in both of its tilings: several sequences (the varlen step) and one alone
    tilings = {(launch.args["BV"], launch.num_stages) for launch in launches if launch.name == "gdn_chunk_state_kernel"}
    assert len(tilings) == 2, tilings
    # the recurrent kernel in both of its tilings: few sequences and many
    rec = {(launch.args["BV"], launch.num_warps) for launch in launches if launch.name == "gdn_recurrent_kernel"}
    assert len(rec) == 2, rec
    for launch in launches:
        c = triton_aot.compile_launch(launch)
        assert c.shared <= triton_aot.SMEM_LIMIT, (
            f"{c.name} ({dtype}) needs {c.shared} B of shared memory, over sm_90's {triton_aot.SMEM_LIMIT}: "
            f"lower its stages or tile in gated_delta_rule.triton.Tuning")
        assert c.registers <= 255


def _variant_launches():
    from .test_triton_gdn import CHUNK_VARIANTS, ORDER_ONLY, REC_VARIANTS

    for name, change in {**CHUNK_VARIANTS, **REC_VARIANTS}.items():
        if name in ORDER_ONLY:
            continue
        many = name in REC_VARIANTS and not name.startswith("tma-few")  # the many-sequence tiling forced
        yield pytest.param(dict(change, rec_few_below=0) if many else change, id=name)


@pytest.mark.parametrize("change", list(_variant_launches()))
def test_variant_tunings_fit_sm90(change):
    """Every Tuning variant the bench times (and the GPU tests check) inside sm_90's shared memory, without
    spills in the kernels it changes (bf16, Qwen3-Next heads; only the launches the variant changes)."""
    from dataclasses import replace

    from gdn_trt.plugins.gated_delta_rule import triton as gdn

    def key(launch):
        return (launch.name, tuple(sorted((k, str(v)) for k, v in launch.args.items() if k.isupper())),
                launch.num_warps, launch.num_stages, launch.maxnreg)

    base = {key(launch) for launch in triton_aot.gdn_launches(torch.bfloat16)}
    changed = [launch for launch in triton_aot.gdn_launches(torch.bfloat16, **change) if key(launch) not in base]
    assert changed, f"the variant {change} changes no launch"
    assert replace(gdn.TUNING, **change) != gdn.TUNING
    for launch in changed:
        c = triton_aot.compile_launch(launch)
        assert c.shared <= triton_aot.SMEM_LIMIT, c.row()
        if launch.maxnreg:  # a register cap trades spills for programs per SM (Tuning.rec_maxnreg): bounded
            assert c.registers <= launch.maxnreg and c.spill_stack <= 256, c.row()
        elif launch.name in ("gdn_recurrent_kernel", "gdn_chunk_wu_kernel", "gdn_chunk_out_kernel"):
            assert c.spill_stack <= 8, c.row()
        elif launch.name == "gdn_decode_persist_kernel":
            # the 64 x 2 tile in 3 stages spills 16 B (Triton 3.9): at 255 registers the tile beside the scalars of
            # the next items that the pipeliner carries; timed as it is (Tuning.rec_persist)
            assert c.spill_stack <= 16, c.row()


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_gluon_state_pass_compiles_for_sm90(dt):
    """The Gluon state pass (`gluon_state`, which the JIT launches on sm_90 only) compiles for sm_90 at Qwen3-Next's
    heads within one block's shared memory and without spills, its TMA descriptors typed as `launcher` builds them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from gdn_trt.plugins.gated_delta_rule import gluon_state as gs

    def desc(block):
        return f"tensordesc<{dt}[{block[0]}, {block[1]}],{gs._layout(block[1])!r}>"

    bv = 32  # the one V-tile `gluon_state.usable` takes
    sig = {"w_d": desc([64, 128]), "k_d": desc([64, 128]), "u_d": desc([64, bv]), "h_d": desc([128, bv]),
           "vn_d": desc([64, bv]), "rk": "*fp32", "gam": "*fp32", "v_new": f"*{dt}", "pool": "*fp32", "cap": "*fp32",
           "cu_seqlens": "*i32", "slots": "*i32", "capture_at": "*i32", **dict.fromkeys(
               ["H", "HV", "K", "V", "BV", "BT", "STAGES"], "constexpr"), "c_lo": "i32", "c_hi": "i32"}
    names = list(sig)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in sig if sig[n].startswith("*")}
    src = GluonASTSource(gs.gdn_chunk_state_gluon_kernel, sig, attrs=attrs,
                         constexprs=dict(H=16, HV=32, K=128, V=128, BV=bv, BT=gs.BT, STAGES=gs.STAGES))
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    registers, stack = triton_aot._resource_usage(k.asm["cubin"])
    assert k.metadata.shared <= triton_aot.SMEM_LIMIT and stack == 0, (k.metadata.shared, registers, stack)
    assert k.asm["ptx"].count("cp.async.bulk.tensor") >= 5  # the three loads and the two stores go by TMA


@pytest.mark.parametrize("change", [{}, *(pytest.param(c, id=n) for n, c in CONV_UPDATE_VARIANTS.items())])
def test_conv_kernels_compile_for_sm90(change):
    # the conv kernels are small; what this catches is code the interpreter runs but the compiler rejects (the
    # default tuning and each update variant the bench times)
    launches = triton_aot.conv_launches(torch.bfloat16, **change)
    assert [launch.name for launch in launches] == ["conv_update_kernel", "conv_chunk_kernel", "conv_state_kernel"]
    for launch in launches:
        c = triton_aot.compile_launch(launch)
        assert c.shared <= triton_aot.SMEM_LIMIT and c.spill_stack == 0, c.row()


def test_recorder_refuses_an_incomplete_launch():
    from gdn_trt.plugins.gated_delta_rule import triton as gdn

    def bad():
        gdn.gdn_recurrent_kernel[(1,)](1, 2)

    with pytest.raises(TypeError, match="launch without"):
        triton_aot.record(gdn, bad)
    assert isinstance(gdn.gdn_recurrent_kernel, triton_aot.JITFunction), "the kernel must be put back"


def test_a_tuning_over_the_limit_is_caught():
    """The check has teeth: the 4-stage state pass on fp32 activations at K = V = 128 is over the limit."""
    launches = triton_aot.gdn_launches(torch.float32, state_stages=4)
    state = next(launch for launch in launches if launch.name == "gdn_chunk_state_kernel" and launch.num_stages == 4)
    assert triton_aot.compile_launch(state).shared > triton_aot.SMEM_LIMIT


def test_state_pass_chunk_loop_is_pipelined():
    """The state pass's chunk chain is latency-bound: Triton software-pipelines its loop (the next chunks' w, u and k
    copied into shared memory by cp.async while this one steps). A barrier in the loop body turns that off without
    a word (with a `tl.debug_barrier` per chunk the single-sequence kernel held 28 KB of shared memory against 117,
    and its chain took about 2.2x as long at T = 4096; H200, 2026-12-04): both tilings, bf16, sm_90."""
    states = [launch for launch in triton_aot.gdn_launches(torch.bfloat16) if launch.name == "gdn_chunk_state_kernel"]
    assert len(states) == 2, "both state tilings"
    for launch in states:
        after_first_loop = triton_aot.compile_kernel(launch).asm["ttgir"].split("scf.for", 1)[1]
        assert "ttg.async_copy_global_to_local" in after_first_loop, f"{launch.args['BV']}: no cp.async"


def test_state_pass_wgmma_descriptors_are_uniform():
    """The state pass's chunk loops run to bounds read from memory, which ptxas cannot tell are the same in every
    lane: the loops may diverge, so their wgmma descriptors are built in per-thread registers and moved to uniform
    ones (R2UR) before every wgmma, on the chunk chain. With the bounds broadcast from lane 0
    (`Tuning.state_uniform`) the moves go (T = 4096 / 16384 / 16 x 1024: the state pass 90.7 / 347.6 / 291.5 us
    against 92.6 / 354.9 / 314.2; H200, 2026-12-04-passes-uni.md): both tilings, bf16, sm_90."""
    for uniform in (True, False):
        states = [launch for launch in triton_aot.gdn_launches(torch.bfloat16, state_uniform=uniform)
                  if launch.name == "gdn_chunk_state_kernel"]
        assert len(states) == 2, "both state tilings"
        for launch in states:
            moves = triton_aot.sass(launch).count("R2UR ")
            if uniform:
                assert moves <= 4, f"bv {launch.args['BV']}: {moves} R2UR"
            else:  # the check sees the moves where they are
                assert moves >= 40, f"bv {launch.args['BV']}: {moves} R2UR without state_uniform"


# ---- the AOT kernels (plugins/aot.py): what each plugin's @trtp.aot_impl hands TensorRT, compiled for sm_90 ----

def _sm90():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


FREE, NO_N = ("T", "N", "S"), ("T", "S")  # multi-sequence modes; single-sequence ones (N = 1 fixed)


@pytest.mark.parametrize("act, G, free", [("bfloat16", 2, FREE), ("bfloat16", 2, NO_N), ("float32", 3, FREE)],
                         ids=["bf16-G2", "bf16-G2-N1", "fp32-G3"])
def test_every_aot_kernel_compiles_for_sm90(act, G, free):
    """Every AOT plugin's kernel at Qwen3-Next (G = 2) / Qwen3.5 (G = 3) heads and the Qwen3-Next conv (and the
    PLE conv's dilation 3, no activation), as `aot_impl` compiles it: the compile itself refuses non-zero Triton
    scratch, more than one CTA, cooperative / PDL launches, tensor memory, TMA descriptors and shared memory over
    48 KiB (`aot.check_metadata`); here also the PTX parameters (TensorRT's order, then at most Triton's two
    scratch pointers) and the target."""
    from gdn_trt.plugins import aot
    from gdn_trt.plugins.spec import AOT_PLUGINS

    sizes = dict(T=1065, N=1 if "N" not in free else 2, S=8, H=16, HV=16 * G, K=128, V=128, D=8192, W=4)
    for spec in AOT_PLUGINS:
        for conv in ({"dilation": 1, "activation": 1}, {"dilation": 3, "activation": 0}):
            if not spec.name.startswith("causal") and conv["dilation"] > 1:
                continue
            attrs = {**conv, "max_seqs": 64}
            k = aot.aot_kernel(spec, aot.spec_shapes(spec, dict(sizes, L=3 * conv["dilation"]), free),
                               aot.spec_dtypes(spec, act), {a: attrs[a] for a in spec.attrs}, _sm90())
            given = ["u64"] * len(spec.inputs) + ["u32"] * len(k.scalars) + ["u64"] * len(spec.outputs)
            declared = aot.ptx_params(k.ptx, k.name)
            assert declared[:len(given)] == given and declared[len(given):] in ([], ["u64"], ["u64", "u64"]), (
                spec.name, declared)
            assert k.shared <= aot.AOT_SMEM_LIMIT and ".target sm_90" in k.ptx, spec.name
            assert all(aot.value(g) >= 1 for g in k.grid), (spec.name, k.grid)


def test_aot_ptx_version_is_capped():
    """`ptx_version` lowers the PTX ISA the kernel declares (the engine must load on the build machine's driver)."""
    from gdn_trt.plugins import aot
    from gdn_trt.plugins.spec import CONV_UPDATE

    p = aot.family(CONV_UPDATE)(CONV_UPDATE, aot.spec_shapes(CONV_UPDATE, dict(T=4, N=4, S=8, D=64, W=4, L=3)),
                                aot.spec_dtypes(CONV_UPDATE, "bfloat16"), {"dilation": 1, "activation": 1})
    c = aot.compile_plan(p.fn, p.signature, p.constexprs, p.num_warps, p.num_stages, _sm90(), 80)
    assert aot.ptx_isa(c.ptx) == 80


def test_aot_compile_refuses_what_tensorrt_cannot_launch():
    """The checks have teeth: the state pass in the JIT's many-sequence tiling (64 wide, 2 stages: 96 KB of shared
    memory in bf16) is refused, and so is a kernel whose runtime parameters do not follow the plugin's order."""
    from gdn_trt.plugins import aot
    from gdn_trt.plugins.gated_delta_rule import triton as gdn
    from gdn_trt.plugins.spec import GDN_CHUNK_STATE

    shapes = aot.spec_shapes(GDN_CHUNK_STATE, dict(T=1065, N=2, S=8, H=16, HV=32, K=128, V=128))
    p = aot.family(GDN_CHUNK_STATE)(GDN_CHUNK_STATE, shapes, aot.spec_dtypes(GDN_CHUNK_STATE, "bfloat16"),
                                    {"max_seqs": 64})
    meta = dict(p.constexprs, BV=gdn.TUNING.state_bv_many)
    with pytest.raises(RuntimeError, match="shared"):
        aot.compile_plan(p.fn, p.signature, tuple(meta.items()), p.num_warps, gdn.TUNING.state_stages_many, _sm90(),
                         None)
    swapped = (p.signature[1], p.signature[0], *p.signature[2:])
    with pytest.raises(TypeError, match="do not follow"):
        aot.compile_plan(p.fn, swapped, p.constexprs, p.num_warps, p.num_stages, _sm90(), None)
