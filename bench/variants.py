"""Variant and probe measurements of bench/kernels.py (`--only floor,decode-var,prefill-var,conv-var`).

Each function adds rows to a `kernels.Bench` (section = the group's name): the launch floor and a Triton copy
(the ceilings), the decode kernel in each tiling at N = 1 .. 256 beside its state traffic alone and a persistent
prefetching version, the chunked prefill with its first pass fused or not, and the conv update in three pool
layouts with and without the slot lookup (probes.py). The variants are compared with the kernels as committed
(`Tuning`), whose rows the headline sections add.
"""

from __future__ import annotations

from dataclasses import replace

import probes
import torch
import triton
from cases import HV, STATE_BYTES, H, K, V, D_CONV, DT, gdn_inputs, packing, rel_rms
from common import n_sets_for, time_cuda

from gdn_trt.plugins.causal_conv1d import triton as conv_tri
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri


def _sm() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def floors(b) -> None:
    """The per-launch floor (an empty kernel, graph replay) and the Triton streaming ceiling (1 GiB fp32 copy)."""
    x = torch.zeros(1, device="cuda")
    b.add("floor", "empty kernel", "launch", time_cuda(lambda i: probes.empty_kernel[(1,)](x)))
    n = 1 << 28
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    t = time_cuda(lambda i: probes.copy_kernel[(triton.cdiv(n, 4096),)](src, dst, n, BLOCK=4096, num_warps=8),
                  target_s=20e-3, reps=10)
    b.add("floor", "triton copy 1 GiB", "copy", t, TBps=8 * n / t.median_s / 1e12,
          pct_copy_bw=100 * 8 * n / t.median_s / b.copy_bw)


def decode_variants(b) -> None:
    """Every tiling at every N (the few/many switch of `_rec_tiling` is chosen from these rows), then at N = 64 and
    256 the state traffic alone in the same tiling and the persistent prefetching kernel."""
    few, some, many = [(8, 1), (16, 1), (16, 2), (32, 2), (64, 2)], [(8, 1), (16, 1), (32, 2)], \
        [(16, 1), (32, 1), (32, 2), (64, 2), (64, 4)]
    for n, tilings in ((1, few), (2, some), (4, some), (8, few), (16, some), (64, many), (256, many)):
        for bv, w in tilings:
            tu = replace(b.gdn, rec_bv=bv, rec_warps=w, rec_few_below=0)
            b.recurrent(n, 1, False, tu, f"tile bv{bv} w{w}", fla=False)["section"] = "decode-var"
    for n in (64, 256):
        sets = n_sets_for(n * STATE_BYTES)
        pools = [torch.randn(n, HV, K, V, device="cuda") for _ in range(sets)]
        slots = torch.arange(n, dtype=torch.int32, device="cuda")
        nbytes = 2 * n * STATE_BYTES
        for bv, w in ((32, 2), (64, 2)):
            t = time_cuda(lambda i: probes.rec_copy_kernel[(V // bv, HV, n)](pools[i % sets], slots, HV=HV, K=K, V=V,
                                                                             BV=bv, num_warps=w), sets)
            b.add("decode-var", f"decode {n}x1", f"state copy only bv{bv} w{w}", t, state_TBps=nbytes / t.median_s / 1e12,
                  pct_copy_bw=100 * nbytes / t.median_s / b.copy_bw)
        x = gdn_inputs(n, 1)
        pool0 = pools[0].clone()  # the timed runs below update pools[0] in place
        ref_pool = pool0.clone()
        o_ref = gdn_tri.launch_recurrent(x, packing([1] * n), ref_pool, None, b.gdn)
        # 210-212 registers per thread (sm_90 compile on the CPU): at most 9 (16 x 1 warp) or 4 (32 x 2 warps) per SM
        for bv, w, per_sm in ((16, 1, 4), (16, 1, 8), (32, 2, 2), (32, 2, 4)):
            items = (V // bv) * HV * n
            grid = (min(items, per_sm * _sm()),)
            o = torch.empty(n, HV, V, dtype=DT, device="cuda")

            def run(i, pool=None):
                probes.rec_prefetch_kernel[grid](x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias, o,
                                                 pool if pool is not None else pools[i % sets], slots, items,
                                                 K ** -0.5, H=H, HV=HV, K=K, V=V, BV=bv, num_warps=w)
            p = pool0.clone()
            run(0, p)
            err_o, err_s = rel_rms(o_ref.float(), o.float()), rel_rms(ref_pool, p)
            t = time_cuda(run, sets)
            b.add("decode-var", f"decode {n}x1", f"prefetch bv{bv} w{w} {per_sm}/SM", t,
                  state_TBps=nbytes / t.median_s / 1e12, pct_copy_bw=100 * nbytes / t.median_s / b.copy_bw,
                  rel_rms_o=err_o, rel_rms_state=err_s)


PREFILL_VARIANTS = [
    ("fused, per-head solve (Tuning)", dict()),
    ("unfused w/u, shared solve (2 launches)", dict(fuse_wu=False, solve_share=True)),
    ("fused, shared solve", dict(solve_share=True)),
    ("fused, 2 warps", dict(solve_warps=2)),
]


def prefill_variants(b) -> None:
    for lengths in ([16384], [1024] * 16):
        for name, change in PREFILL_VARIANTS:
            b.chunked(lengths, replace(b.gdn, **change), name, fla=False)["section"] = "prefill-var"


# the one-token conv update's Tuning variants, timed beside the default (tests/test_triton_conv.py checks each)
CONV_UPDATE_VARIANTS = [("weight gathers", dict(update_wtile=False)), ("bd512 w4", dict(update_bd=512, update_warps=4)),
                        ("bd1024 w8", dict(update_bd=1024, update_warps=8)), ("bd128 w2", dict(update_bd=128, update_warps=2))]


def conv_variants(b, n: int = 256) -> None:
    """The one-token conv update in its [S, n, D] pool: the default and each variant, and the probe that measured
    this layout first (bench/probes.py, layout 2, with the cu_seqlens / slots lookups) on the same history."""
    x = torch.randn(n, D_CONV, device="cuda").to(DT)
    weight = torch.randn(D_CONV, 4, device="cuda").to(DT)
    sets = n_sets_for(n * D_CONV * 4 * 2)
    hist = [torch.randn(n, 3, D_CONV, device="cuda").to(DT) for _ in range(sets)]
    pack = packing([1] * n)
    y_ref = conv_tri.launch_update(x, ConvParams(weight, 1, 1), pack, hist[0].clone(), None, b.conv)
    b.conv_update(n, b.conv, "ours (Tuning)", fla=False)["section"] = "conv-var"
    for label, change in CONV_UPDATE_VARIANTS:
        b.conv_update(n, replace(b.conv, **change), f"ours {label}", fla=False)["section"] = "conv-var"
    nbytes = 2 * n * D_CONV * 2 + 2 * n * D_CONV * 3 * 2
    y = torch.empty_like(x)

    def run(i, pool=None):
        probes.conv_update_kernel[(D_CONV // 256, n)](
            x, weight, y, pool if pool is not None else hist[i % sets], pack.cu_seqlens, pack.slots, D=D_CONV, BD=256,
            LAYOUT=2, INDIRECT=True, num_warps=4)
    run(0, hist[0].clone())
    err = rel_rms(y_ref.float(), y.float())
    t = time_cuda(run, sets)
    b.add("conv-var", f"conv update {n}", "probe [S, 3, D] slots bd256 w4", t, TBps=nbytes / t.median_s / 1e12,
          pct_copy_bw=100 * nbytes / t.median_s / b.copy_bw, rel_rms_o=err)


def plot(rows: list[dict], path) -> None:
    """The variant sections: decode share of the copy rate by N and tiling (with the state-only probe), prefill
    time per variant, conv update time per probe."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 5.5))
    dec = [r for r in rows if r["section"] == "decode-var"]
    for impl in dict.fromkeys(r["impl"] for r in dec):
        pts = sorted((int(r["case"].split()[1].split("x")[0]), r["pct_copy_bw"]) for r in dec if r["impl"] == impl)
        style = "o-" if impl.startswith("tile") else ("s--" if impl.startswith("state") else "x:")
        ax1.plot([n for n, _ in pts], [p for _, p in pts], style, label=impl)
    ax1.set_xscale("log", base=2)
    ax1.axhline(90, color="k", lw=0.8)
    ax1.set_xlabel("sequences N (decode, one token each)")
    ax1.set_ylabel("fp32 state traffic, % of the copy rate")
    ax1.legend(fontsize=7)
    for ax, section in ((ax2, "prefill-var"), (ax3, "conv-var")):
        sel = [r for r in rows if r["section"] == section]
        ax.barh([f"{r['case']}: {r['impl']}" for r in sel], [r["time_us"] for r in sel])
        ax.tick_params(axis="y", labelsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("median time per call (us, CUDA-graph replay)")
    fig.suptitle("GDN and conv kernel variants on the H200 (Qwen3-Next shapes, bf16, fp32 state)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
