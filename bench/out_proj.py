"""The out_proj end of a decode step: the gated norm inside the GEMM's x loads and the L2 warm-up of its weight.

    python bench/out_proj.py [--n 1,8,64,256] [--tails 0,0.5,1] [--out DIR]      (CUDA only)

Per N, with the gated norm as its own kernel or inside the skinny GEMM (`op.gated_norm_linear`; `gate` off:
`gemm.takes_gate` answers no) and per share of the GDN decode kernel's programs that prefetch out_proj's weight into
L2 (`Tuning.rec_l2_tail`, 0: no warm-up, plugins/l2.py), on `bench/runtime.py`'s `ours` stack (4 Qwen3-Next GDN layers, bf16, CUDA graphs, the batched API in place): the wall per step over
back-to-back steps (GPU-bound there: its device time), then from one profile per row the GDN kernel's and the
out_proj GEMM's mean time (the kernel after the GDN decode's gated norm, or after the GDN kernel itself where the
GEMM norms). Each row is a freshly opened session, since a captured graph keeps the launches it captured. Writes
`<out>/<date>-out-proj.{json,md}`.
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import replace
from pathlib import Path

import runtime as rb  # bench/runtime.py: the session, stack and timing
import step_trace

from common import RESULTS, device_info, write_results
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.glue import gemm


def _mean(us: list[float]) -> float:
    return round(sum(us) / len(us), 2) if us else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1,8,64,256")
    ap.add_argument("--tails", default="0,0.5,1")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not rb.torch.cuda.is_available():
        raise SystemExit("out_proj.py needs CUDA")
    base, takes = gdn_tri.TUNING, gemm.takes_gate

    def fresh(n: int, gate: bool, tail: float):
        """The static decode step of n sequences on a newly opened session with this row's settings."""
        gc.collect()
        rb.torch.cuda.empty_cache()  # the previous row's session: one at a time fits the device
        gdn_tri.TUNING = replace(base, rec_l2_tail=tail)
        gemm.takes_gate = takes if gate else (lambda *a: False)
        return rb.Ours(rb.configs()["ours"]).step_fn("decode", [1] * n, "static")

    rows = [{"n": int(n), "gate": gate, "tail": float(t)} for n in args.n.split(",") for gate in (False, True)
            for t in args.tails.split(",")]
    for r in rows:  # every row timed before any is profiled (bench/runtime.py: CUPTI stays attached)
        r["step_us"] = round(rb.timed(fresh(r["n"], r["gate"], r["tail"]), args.steps)[0], 1)
        print(r, flush=True)
    plain = {r["n"]: r["step_us"] for r in rows if r["tail"] == 0 and not r["gate"]}
    for r in rows:
        spans = step_trace.trace(fresh(r["n"], r["gate"], r["tail"]))
        r["vs_plain"] = round(r["step_us"] / plain[r["n"]], 3)
        r["gdn_us"] = _mean([(b - a) / 1e3 for a, b, name in spans if "gdn_recurrent" in name])
        # out_proj: the kernel after each gated norm, or after each GDN kernel where the GEMM norms
        after = "gdn_recurrent" if r["gate"] else "gated_norm"
        r["out_proj_us"] = _mean([(spans[i + 1][1] - spans[i + 1][0]) / 1e3 for i, (_, _, name) in enumerate(spans)
                                  if after in name and i + 1 < len(spans)])
        r["union_us"] = round(rb.union_ns(spans) / 1e3, 1)
        print(r, flush=True)
    gdn_tri.TUNING, gemm.takes_gate = base, takes
    print("wrote", *write_results("out-proj", rows, device_info(),
                                  ["n", "gate", "tail", "step_us", "vs_plain", "union_us", "gdn_us", "out_proj_us"],
                                  out_dir=args.out), flush=True)


if __name__ == "__main__":
    main()
