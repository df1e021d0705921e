"""Kernel benchmark on the GPU: our Triton kernels vs FLA 0.6.0 (fla-core) on identical inputs.

    python bench/kernels.py [--out DIR] [--sweep rec,chunk,varlen,conv] [--only sweep,decode,verify,prefill,...]

Qwen3-Next GDN shapes (H=16, HV=32, K=V=128), bf16 activations, fp32 state. Both sides get the same raw inputs
and do the same work: gates (g from a, A_log, dt_bias; sigmoid beta), the q/k L2 norm and the scale in the kernel
(FLA: use_gate_in_kernel, use_beta_sigmoid_in_kernel, use_qk_l2norm_in_kernel), initial state in, final state out.
Timing: CUDA-graph replay of many calls rotating over input sets bigger than the L2 (bench/common.py), median.
Reported: time, ours/FLA time ratio, fp32 state traffic vs the copy bandwidth measured in the same run (decode,
verify), nominal TFLOP/s and Mtok/s (prefill), bandwidth of the conv, and the accuracy of both against float64.
The sweep picks our launch parameters first (on the largest case of each kernel) and the headline rows use them;
without it (`--only` leaving out sweep) the rows use the committed defaults (`triton.Tuning`). The variant
sections (bench/variants.py) time the `Tuning` variants beside the defaults; the run ends with a summary per case
(default, fastest variant, FLA), also written as `summary` rows. Decode also runs `ours PDL`: the same calls
launched with programmatic dependent launch, as the runtime's step launches them (plugins/pdl.py).
`--only round2 --prefill-T 16384` is the round-2 call: every case of the kernel targets beside FLA, the variants
and the per-pass breakdown.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

# bench/common.py: Python puts the script's folder first on sys.path (run as `python bench/<name>.py`)
from common import (RESULTS, copy_bandwidth, device_info, kernel_breakdown, n_sets_for, time_cuda,
                    write_results)

import variants
from cases import (CHUNK_FLOP_PER_TOKEN, D_CONV, FLA, HV, STATE_BYTES, W_CONV, DT, H, K, V, fla_chunk, fla_recurrent,
                   gdn_inputs, packing, rel_rms)

from gdn_trt.plugins import pdl
from gdn_trt.plugins.causal_conv1d import triton as conv_tri
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule import naive as gdn_naive
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Capture

# ---- cases ----

class Bench:
    def __init__(self, copy_bw: float):
        self.copy_bw = copy_bw
        self.rows: list[dict] = []
        self.gdn = gdn_tri.TUNING
        self.conv = conv_tri.TUNING
        self.peer = True  # False (--no-fla): our rows only

    def add(self, section: str, case: str, impl: str, t, **metrics) -> dict:
        row = dict(section=section, case=case, impl=impl, time_us=t.median_us, p10_us=t.p10_s * 1e6,
                   p90_us=t.p90_s * 1e6, timing=t.method, **metrics)
        self.rows.append(row)
        print(f"{section:9s} {case:22s} {impl:24s} {t.median_us:10.1f} us  "
              + "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()),
              flush=True)
        return row

    def ratio(self, ours: dict, fla: dict) -> None:
        ours["ours_over_fla"] = ours["time_us"] / fla["time_us"]

    # recurrent: decode N x 1 and verify N x k
    def recurrent(self, N: int, k: int, stash: bool, tuning=None, label: str | None = None, fla: bool = True):
        T = N * k
        x, pack = gdn_inputs(T, 1), packing([k] * N)
        sets = n_sets_for(N * STATE_BYTES)
        pools = [torch.randn(N, HV, K, V, device="cuda") * 0.5 for _ in range(sets)]
        st = torch.empty(T, HV, K, V, device="cuda") if stash else None
        tuning = tuning or self.gdn
        t = time_cuda(lambda i: gdn_tri.launch_recurrent(x, pack, pools[i % sets], st, tuning), sets)
        state_bytes = (N + (T if stash else N)) * STATE_BYTES
        case = f"{'verify' if k > 1 else 'decode'} {N}x{k}" + (" stash" if stash else "")
        bw = state_bytes / t.median_s
        ours = self.add("recurrent", case, label or "ours", t, state_TBps=bw / 1e12,
                        pct_copy_bw=100 * bw / self.copy_bw)
        with pdl.scope():
            if label is None and not stash and pdl.enabled(torch.device("cuda")):
                # the same calls launched with PDL, as the runtime's step launches them (plugins/pdl.py): a call's
                # state load overlaps the call before it (another pool: no call reads what the one before writes)
                tp = time_cuda(lambda i: gdn_tri.launch_recurrent(x, pack, pools[i % sets], st, tuning), sets)
                bwp = state_bytes / tp.median_s
                self.add("recurrent", case, "ours PDL", tp, state_TBps=bwp / 1e12,
                         pct_copy_bw=100 * bwp / self.copy_bw)
        if fla and self.peer and not stash:
            tf = time_cuda(lambda i: fla_recurrent(x, N, pools[i % sets]), sets)
            bwf = state_bytes / tf.median_s
            self.ratio(ours, self.add("recurrent", case, FLA, tf, state_TBps=bwf / 1e12,
                                      pct_copy_bw=100 * bwf / self.copy_bw))
        return ours

    def chunked(self, lengths: list[int], tuning=None, label: str | None = None, fla: bool = True):
        T, N = sum(lengths), len(lengths)
        x, pack = gdn_inputs(T, 2), packing(lengths)
        sets = n_sets_for(T * (2 * H * K + 2 * HV * V) * 2 + N * STATE_BYTES, cap=8)
        pools = [torch.randn(N, HV, K, V, device="cuda") * 0.5 for _ in range(sets)]
        cap = Capture(torch.full((N,), -1, dtype=torch.int32, device="cuda"), torch.empty(N, HV, K, V, device="cuda"))
        tuning = tuning or self.gdn
        t = time_cuda(lambda i: gdn_tri.launch_chunked(x, pack, pools[i % sets], cap, tuning), sets, target_s=10e-3)
        case = f"prefill {T}" if N == 1 else f"varlen {N}x{lengths[0]}"
        flop = CHUNK_FLOP_PER_TOKEN * T
        ours = self.add("chunked", case, label or "ours", t, tflops=flop / t.median_s / 1e12,
                        mtok_s=T / t.median_s / 1e6)
        if fla and self.peer:
            cu = pack.cu_seqlens.long() if N > 1 else None
            tf = time_cuda(lambda i: fla_chunk(x, cu, pools[i % sets]), sets, target_s=10e-3)
            self.ratio(ours, self.add("chunked", case, FLA, tf, tflops=flop / tf.median_s / 1e12,
                                      mtok_s=T / tf.median_s / 1e6))
        return ours

    def conv_prefill(self, lengths: list[int], tuning=None, label: str = "ours", fla: bool = True):
        from fla.modules.causal_conv1d.ops import causal_conv1d

        T, N = sum(lengths), len(lengths)
        pack = packing(lengths)
        x = torch.randn(T, D_CONV, device="cuda").to(DT)
        conv = ConvParams(torch.randn(D_CONV, W_CONV, device="cuda").to(DT), 1, 1)
        pool = torch.randn(N, W_CONV - 1, D_CONV, device="cuda").to(DT)
        cap = Capture(torch.full((N,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))
        sets = n_sets_for(2 * T * D_CONV * 2, cap=8)
        xs = [x] + [torch.randn_like(x) for _ in range(sets - 1)]
        tuning = tuning or self.conv
        t = time_cuda(lambda i: conv_tri.launch_prefill(xs[i % sets], conv, pack, pool, cap, tuning), sets)
        nbytes = 2 * T * D_CONV * 2 + 2 * N * D_CONV * (W_CONV - 1) * 2
        case = f"conv prefill {T}" if N == 1 else f"conv varlen {N}x{lengths[0]}"
        ours = self.add("conv", case, label, t, TBps=nbytes / t.median_s / 1e12,
                        pct_copy_bw=100 * nbytes / t.median_s / self.copy_bw)
        if not (fla and self.peer):
            return ours
        h0 = torch.randn(N, D_CONV, W_CONV, device="cuda").to(DT)
        cu = pack.cu_seqlens.long() if N > 1 else None
        tf = time_cuda(lambda i: causal_conv1d(xs[i % sets][None], weight=conv.weight, initial_state=h0,
                                               output_final_state=True, activation="silu", cu_seqlens=cu), sets)
        self.ratio(ours, self.add("conv", case, FLA, tf, TBps=nbytes / tf.median_s / 1e12,
                                  pct_copy_bw=100 * nbytes / tf.median_s / self.copy_bw))
        return ours

    def conv_update(self, N: int, tuning=None, label: str = "ours", fla: bool = True):
        from fla.modules.causal_conv1d.ops import causal_conv1d_update

        pack = packing([1] * N)
        x = torch.randn(N, D_CONV, device="cuda").to(DT)
        conv = ConvParams(torch.randn(D_CONV, W_CONV, device="cuda").to(DT), 1, 1)
        sets = n_sets_for(N * D_CONV * W_CONV * 2)
        tuning = tuning or self.conv
        pools = [torch.randn(N, W_CONV - 1, D_CONV, device="cuda").to(DT) for _ in range(sets)]
        caches = [torch.randn(N, D_CONV, W_CONV, device="cuda").to(DT) for _ in range(sets)]
        t = time_cuda(lambda i: conv_tri.launch_update(x, conv, pack, pools[i % sets], None, tuning), sets)
        nbytes = 2 * N * D_CONV * 2 + 2 * N * D_CONV * (W_CONV - 1) * 2
        ours = self.add("conv", f"conv update {N}", label, t, TBps=nbytes / t.median_s / 1e12,
                        pct_copy_bw=100 * nbytes / t.median_s / self.copy_bw)
        if not (fla and self.peer):
            return ours
        tf = time_cuda(lambda i: causal_conv1d_update(x, caches[i % sets], weight=conv.weight, activation="silu"),
                       sets)
        self.ratio(ours, self.add("conv", f"conv update {N}", FLA, tf, TBps=nbytes / tf.median_s / 1e12,
                                  pct_copy_bw=100 * nbytes / tf.median_s / self.copy_bw))
        return ours

    def breakdown(self, lengths: list[int], fla: bool) -> None:
        """Device time per kernel of one chunked call (profiler, eager), ours and optionally FLA's."""
        T, N = sum(lengths), len(lengths)
        x, pack = gdn_inputs(T, 4), packing(lengths)
        pool = torch.randn(N, HV, K, V, device="cuda") * 0.5
        cap = Capture(torch.full((N,), -1, dtype=torch.int32, device="cuda"), torch.empty(N, HV, K, V, device="cuda"))
        case = f"prefill {T}" if N == 1 else f"varlen {N}x{lengths[0]}"
        variants_on = replace(self.gdn, **variants.WY)
        runs = [("ours", lambda: gdn_tri.launch_chunked(x, pack, pool, cap, self.gdn)),
                ("ours, state_wy (both tilings)", lambda: gdn_tri.launch_chunked(x, pack, pool, cap, variants_on))]
        if fla and self.peer:
            cu = pack.cu_seqlens.long() if N > 1 else None
            runs.append((FLA, lambda: fla_chunk(x, cu, pool)))
        for impl, fn in runs:
            for name, us in sorted(kernel_breakdown(fn).items(), key=lambda kv: -kv[1]):
                if us >= 1.0:
                    self.rows.append(dict(section="breakdown", case=case, impl=impl, kernel=name[:60], time_us=us))
                    print(f"breakdown {case:22s} {impl:24s} {us:10.1f} us  {name[:70]}", flush=True)

    # ---- accuracy against float64 (naive.py run in float64 on the GPU) ----
    def accuracy(self, lengths: list[int], chunk: bool) -> None:
        T, N = sum(lengths), len(lengths)
        x, pack = gdn_inputs(T, 3), packing(lengths)
        pool = torch.randn(N, HV, K, V, device="cuda") * 0.5
        x64 = GdnInputs(*(t.double() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)))
        p64 = pool.double()
        no_cap = Capture(torch.full((N,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(p64))
        o64 = gdn_naive.chunked(x64, pack, p64, no_cap) if chunk else gdn_naive.recurrent(x64, pack, p64)
        p_ours = pool.clone()
        if chunk:
            o = gdn_tri.chunked(x, pack, p_ours, Capture(no_cap.at, torch.empty_like(pool)))
        else:
            o = gdn_tri.recurrent(x, pack, p_ours)
        impls = [("ours", o, p_ours)]
        if self.peer:
            cu = pack.cu_seqlens.long() if N > 1 else None
            of, hf = (fla_chunk(x, cu, pool.clone()) if chunk else
                      fla_recurrent(x, N if len(set(lengths)) == 1 else None, pool.clone()))
            impls.append((FLA, of.reshape(o.shape), hf))
        case = ("prefill " if chunk else "recurrent ") + ("x".join(map(str, (N, lengths[0]))))
        for impl, oo, hh in impls:
            self.rows.append(dict(section="accuracy", case=case, impl=impl, rel_rms_o=rel_rms(o64, oo),
                                  rel_rms_state=rel_rms(p64, hh)))
            print(f"accuracy  {case:22s} {impl:24s} o {self.rows[-1]['rel_rms_o']:.3e}  "
                  f"state {self.rows[-1]['rel_rms_state']:.3e}", flush=True)

    # ---- launch-parameter sweep (ours) ----
    def sweep(self, parts: set[str]) -> None:
        """One parameter group at a time, each on top of the best so far; the winners become self.gdn."""
        if "rec" in parts:
            # (32, 2): spill-free under Triton 3.6 where the default spills 136 B (bench/results/2026-12-02-aot.md)
            changes = [dict(rec_bv=bv, rec_warps=w, rec_stream=st) for bv, w, st in
                       ((64, 2, False), (32, 1, True), (32, 2, True), (64, 2, True), (64, 4, True), (128, 4, True))]
            self.gdn = self._best(lambda tu, name: self.recurrent(256, 1, False, tu, name, fla=False), self.gdn,
                                  changes, lambda c: f"sweep rec bv{c['rec_bv']} w{c['rec_warps']}"
                                                     f"{' stream' if c['rec_stream'] else ''}")[1]
        if "chunk" in parts:
            groups = [
                [dict(solve_warps=w, solve_bk=bk, solve_share=sh) for w, bk, sh in
                 ((1, 64, False), (1, 64, True), (2, 64, True), (1, 32, True))],
                [dict(wu_warps=w) for w in (4, 8)],
                # the state pass is bound by the bytes each program step moves (w and kn re-read per V-tile:
                # bench/results/2026-12-02-kernels.md), so wider V-tiles are in the sweep; 2 stages fit two
                # programs per SM (80 KB of shared memory against 116.5 KB: bench/results/2026-12-02-aot.md)
                [dict(state_bv=bv, state_warps=w, state_stages=st) for bv, w, st in
                 ((32, 4, 3), (32, 4, 2), (32, 8, 3), (16, 4, 3), (64, 4, 3), (64, 8, 3), (64, 8, 2))],
                [dict(out_bv=bv, out_warps=w) for bv, w in ((64, 4), (128, 4), (128, 8))],
            ]
            run = lambda tu, name: self.chunked([16384], tu.single_sequence_tiling(), name, fla=False)  # noqa: E731
            best = (math.inf, self.gdn)
            for group in groups:
                t, tu = self._best(run, best[1], group)
                if t < best[0]:
                    best = (t, tu)
            self.gdn = best[1]
        if "varlen" in parts:
            # many short sequences give the state pass 16x the programs of one long one, so settings that lose at
            # T = 16384 (2 stages: two programs per SM; wider V-tiles: fewer re-reads of w and k) may win here.
            # Here launch_chunked takes the many-sequence tiling (Tuning.state_bv_many, state_stages_many), which
            # this sweep informs; reported beside the chosen tuning, which it does not change.
            varlen = [1024] * 16
            self._best(lambda tu, name: self.chunked(varlen, tu.single_sequence_tiling(), name, fla=False), self.gdn,
                       [dict(state_bv=bv, state_warps=w, state_stages=st) for bv, w, st in
                        ((32, 4, 3), (32, 4, 2), (32, 2, 2), (64, 4, 2), (64, 4, 3), (64, 8, 2), (16, 4, 2),
                         (16, 2, 2))], lambda c: _sweep_name("sweep varlen", c))
            self._best(lambda tu, name: self.chunked(varlen, tu, name, fla=False), self.gdn,
                       [dict(solve_share=False), dict(solve_warps=2)], lambda c: _sweep_name("sweep varlen", c))
            # the switch point: a few long sequences, where the many-sequence tiling is taken from N = 2 (Qwen3-Next:
            # 4 V-tiles x 32 heads x 2 > 132 SMs) but has only 2 x 32 x N programs
            for n in (2, 4, 8):
                for label, tu in (("auto", self.gdn), ("single-sequence tiling", self.gdn.single_sequence_tiling())):
                    self._swept(self.chunked([16384 // n] * n, tu, f"sweep varlen {n}x{16384 // n} {label}",
                                             fla=False))
        if "conv" in parts:
            # FLA autotunes its conv over 16-128 channel tiles and the warp count; ours are this sweep's winners,
            # committed as causal_conv1d.triton.Tuning (the prefill group first: its state launch uses update_bd)
            self.conv = self._best(
                lambda tu, name: self.conv_prefill([16384], tu, name, fla=False), self.conv,
                [dict(chunk_bd=bd, chunk_bt=bt, chunk_warps=w) for bd, bt, w in
                 ((128, 64, 4), (64, 64, 4), (32, 64, 2), (128, 32, 4), (128, 32, 2), (64, 32, 4), (64, 32, 2),
                  (128, 16, 4), (128, 16, 2), (256, 16, 4), (256, 32, 8))])[1]
            self.conv = self._best(
                lambda tu, name: self.conv_update(256, tu, name, fla=False), self.conv,
                [dict(update_bd=bd, update_warps=w) for bd, w in
                 ((256, 4), (256, 2), (128, 4), (128, 2), (128, 1), (64, 2), (64, 1), (512, 4), (512, 8),
                  (1024, 8))])[1]
            print("chosen conv tuning:", self.conv, flush=True)
        print("chosen tuning:", self.gdn, flush=True)

    @staticmethod
    def _swept(row: dict) -> float:
        row["section"] = "sweep"
        return row["time_us"]

    def _best(self, run, base, changes: list[dict], name=lambda c: _sweep_name("sweep", c)) -> tuple[float, Any]:
        """Times `run(replace(base, **change), name(change))` (which adds a row) for each change; returns the
        fastest (time, tuning)."""
        best = (math.inf, base)
        for change in changes:
            tu = replace(base, **change)
            t = self._swept(run(tu, name(change)))
            if t < best[0]:
                best = (t, tu)
        return best


def _sweep_name(prefix: str, change: dict) -> str:
    return prefix + " " + " ".join(f"{k}={v}" for k, v in change.items())


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    timed = [r for r in rows if r["section"] in ("recurrent", "chunked", "conv") and r["impl"] in ("ours", FLA)]
    if not timed:
        return variants.plot(rows, path)
    cases = list(dict.fromkeys(r["case"] for r in timed))
    def get(c: str, impl: str) -> float:
        return next((r["time_us"] for r in timed if r["case"] == c and r["impl"] == impl), float("nan"))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.5))
    xs = range(len(cases))
    ax1.bar([i - 0.2 for i in xs], [get(c, "ours") for c in cases], 0.4, label="ours (Triton)")
    ax1.bar([i + 0.2 for i in xs], [get(c, FLA) for c in cases], 0.4, label=FLA)
    ax1.set_yscale("log")
    ax1.set_ylabel("median time per call (us, CUDA-graph replay)")
    ax1.set_xticks(list(xs), cases, rotation=60, ha="right", fontsize=8)
    ax1.legend()
    sp = [get(c, FLA) / get(c, "ours") for c in cases]
    ax2.bar(list(xs), sp, color=["tab:green" if s >= 1 else "tab:red" for s in sp])
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_ylabel("speed-up over FLA (FLA time / our time)")
    ax2.set_xticks(list(xs), cases, rotation=60, ha="right", fontsize=8)
    fig.suptitle("GDN kernels on the H200: ours vs FLA 0.6.0 (Qwen3-Next shapes, bf16, fp32 state)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


COLUMNS = ["section", "case", "impl", "kernel", "time_us", "ours_over_fla", "state_TBps", "pct_copy_bw", "TBps",
           "tflops", "mtok_s", "rel_rms_o", "rel_rms_state", "timing"]


SECTIONS = ("floor", "sweep", "decode", "decode-var", "verify", "prefill", "prefill-var", "prefill-pipe", "solve-probe",
            "breakdown", "conv", "conv-var", "accuracy")
# the final call of round 2: every case of the kernel targets beside FLA, the variants, the per-pass breakdown
ROUND2 = "floor,decode,decode-var,prefill,prefill-var,prefill-pipe,solve-probe,breakdown,conv,conv-var"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--sweep", default="rec,chunk", help="parameter groups to sweep: rec, chunk, varlen, conv")
    ap.add_argument("--name", default="kernels", help="results file stem: <date>-<name>.json/.md/.png")
    ap.add_argument("--no-fla", action="store_true", help="our rows only (FLA's first calls autotune for a while)")
    ap.add_argument("--only", default=",".join(x for x in SECTIONS if x != "sweep"),
                    help=f"comma-separated subset of {SECTIONS} (default: all but the sweep), or 'round2' for "
                         f"{ROUND2}")
    ap.add_argument("--pipe-match", default="", help="prefill-pipe: only the variants whose name holds this text")
    ap.add_argument("--prefill-T", default="4096,16384,65536",
                    help="single-sequence prefill lengths of the prefill section (varlen 16 x 1024 always runs)")
    args = ap.parse_args()
    only = set((ROUND2 if args.only == "round2" else args.only).split(","))
    meta = device_info()
    bw = copy_bandwidth()
    meta.update({f"copy_{k}": round(v, 3) for k, v in bw.items() if k != "best"})
    print("device", meta, flush=True)
    b = Bench(bw["best"])
    b.peer = not args.no_fla
    # a run cut by `timeout` (SIGTERM) still writes what it measured, and says so in the meta
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        if "floor" in only:
            variants.floors(b)
        if "sweep" in only:
            b.sweep(set(args.sweep.split(",")))
        meta["gdn_tuning"] = str(b.gdn)
        meta["conv_tuning"] = str(b.conv)
        if "decode" in only:
            for n in (1, 8, 64, 256):
                b.recurrent(n, 1, False)
        if "decode-var" in only:
            variants.decode_variants(b)
        if "prefill" in only:
            for t in map(int, args.prefill_T.split(",")):
                b.chunked([t])
            b.chunked([1024] * 16)
        if "prefill-var" in only:
            variants.prefill_variants(b)
        if "prefill-pipe" in only:
            variants.pipe_variants(b, [int(t) for t in args.prefill_T.split(",")], args.pipe_match)
        if "solve-probe" in only:
            variants.solve_probe(b)
        if "conv" in only:
            b.conv_prefill([16384])
            b.conv_prefill([1024] * 16)
            b.conv_update(256)
        if "conv-var" in only:
            variants.conv_variants(b)
        if "accuracy" in only:
            b.accuracy([1] * 8, chunk=False)
            b.accuracy([4] * 64, chunk=False)
            b.accuracy([4096], chunk=True)
            b.accuracy([1024] * 4, chunk=True)  # varlen: the state pass's many-sequence tiling
        if "verify" in only:
            b.recurrent(64, 4, False)
            b.recurrent(64, 4, True)
        # last: once torch.profiler has run, CUPTI stays attached to the process (torch keeps it where CUDA graphs
        # are used) and every later launch pays for it (bench/runtime.py measured a step's host time doubling)
        if "breakdown" in only:  # FLA's kernels with the prefill section (its first call autotunes for a while)
            b.breakdown([16384], fla="prefill" in only)
            b.breakdown([1024] * 16, fla="prefill" in only)
    except SystemExit:
        meta["cut"] = "stopped by SIGTERM (time limit) before the remaining sections"
    b.rows += variants.summary(b.rows)
    paths = write_results(args.name, b.rows, meta, COLUMNS, plot, args.out)
    print("wrote", *paths, flush=True)
    print(paths[1].read_text())


if __name__ == "__main__":
    main()
