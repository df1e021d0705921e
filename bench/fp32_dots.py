"""fp32 activations in the chunked prefill: compile time, run time and accuracy for each dot precision.

    python bench/fp32_dots.py [--prec tf32x3,ieee] [--heads 16,3,128,128]

One varlen step of the GPU tests (`gdn_trt.plugins.samples.VARLEN_STEP`, which tests/test_triton_gdn.py runs: lengths
1..1000 with captures, an empty and a padding sequence) at the given heads (H, G, K, V); per precision: the first call
(Triton compiles the four passes for it; a fresh process, so nothing is cached in memory, and TRITON_CACHE_DIR should be
empty), the median of 5 later calls, and the relative RMS error of o, the pool and the captures against the float64
reference (plugins/gated_delta_rule/naive.py). Prints one line per precision as it finishes, so a run cut by a time
limit still reports the precisions done.

Status (H200, 2026-12-02): run once at the default heads with time limits of 60 s (tf32x3) and 45 s (ieee); both
were cut before printing their line: the first call's compile takes longer than that. The compile alone is now
measured on the CPU (`python -m gdn_trt.plugins.triton_aot`, bench/results/2026-12-02-aot.md); this script still
has the run time and the accuracy on the GPU to report, with a limit of a few minutes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from gdn_trt.plugins.gated_delta_rule import naive
from gdn_trt.plugins.gated_delta_rule import triton as tri
from gdn_trt.plugins.packing import Capture, Packing
from gdn_trt.plugins.samples import VARLEN_STEP as STEP
from gdn_trt.plugins.samples import Heads, f64_inputs, make_inputs


def rel_rms(ref: torch.Tensor, got: torch.Tensor) -> float:
    ref, got = ref.double(), got.double().cpu()
    return ((got - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prec", default="tf32x3,ieee", help="values of Tuning.fp32_dot (the solve keeps its own)")
    ap.add_argument("--heads", default="16,3,128,128")
    ap.add_argument("--device", default="cuda", help="cpu only under TRITON_INTERPRET=1 (a logic check)")
    args = ap.parse_args()
    dev = args.device
    heads = Heads(*map(int, args.heads.split(",")))
    x, pack, pool = make_inputs(STEP, heads, torch.float32, dev)
    N = len(STEP.lengths)
    at = torch.tensor(STEP.capture_at, dtype=torch.int32)
    cap_ref = torch.zeros((N, *x.state_shape), dtype=torch.float64)
    pool_ref = pool.cpu().double()
    o_ref = naive.chunked(f64_inputs(x), Packing(pack.cu_seqlens.cpu(), pack.slots.cpu()), pool_ref,
                          Capture(at, cap_ref))
    live = [n for n in range(N) if STEP.slots[n] >= 0]
    rows = [STEP.slots[n] for n in live]
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for prec in args.prec.split(","):
        tuning = replace(tri.TUNING, fp32_dot=prec)
        times = []
        for i in range(6):
            p, cap = pool.clone(), torch.zeros((N, *x.state_shape), device=dev)
            sync()
            t0 = time.perf_counter()
            o = tri.launch_chunked(x, pack, p, Capture(at.to(dev), cap), tuning)
            sync()
            times.append(time.perf_counter() - t0)
        print(f"{heads} fp32 dots={prec:7s} first call {times[0]:8.2f} s  "
              f"later {statistics.median(times[1:]) * 1e3:8.3f} ms  rel RMS o {rel_rms(o_ref, o):.2e}  "
              f"pool {rel_rms(pool_ref[rows], p[rows]):.2e}  capture {rel_rms(cap_ref[live], cap[live]):.2e}",
              flush=True)


if __name__ == "__main__":
    main()
