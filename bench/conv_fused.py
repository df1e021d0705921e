"""The decode step with the conv update inside the GDN decode launch (`gated_delta_rule.triton_fused`) against the two
launches in turn.

    python bench/conv_fused.py [--n 1,8,64,256] [--steps 300] [--out DIR]      (CUDA only)

Per N and way (`fused`, then `two launches`: `GdnLayer.fuse_conv` off), on a fresh session of `bench/runtime.py`'s
`ours` stack (4 Qwen3-Next GDN layers, bf16, CUDA graphs, the static decode step): the wall per step over
back-to-back steps, then from a profile the step's device time (union), its floor (`bench/runtime.py`'s: weights
and each sequence's fp32 state read and written once at the copy rate) and a layer's kernels with the gap before
each (`gemm_step.layer_means`). vs_two: the step against the two launches' at the same N. Every row is timed before
any is profiled (CUPTI stays attached). Writes `<out>/<date>-conv-fused.{json,md}`.
"""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import gemm_step
import runtime as rb  # bench/runtime.py: the session, stack and timing
import step_trace

from common import RESULTS, copy_bandwidth, device_info, write_results
from gdn_trt.model.layer import GdnLayer
from gdn_trt.runtime.budget import slot_bytes, weight_bytes

WAYS = {"fused": True, "two launches": False}


def fresh(n: int, fuse: bool):
    gc.collect()
    rb.torch.cuda.empty_cache()  # the previous row's session: one at a time fits the device
    GdnLayer.fuse_conv = fuse
    return rb.Ours(rb.configs()["ours"]).step_fn("decode", [1] * n, "static")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1,8,64,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not rb.torch.cuda.is_available():
        raise SystemExit("conv_fused.py needs CUDA")
    rows = [{"n": int(n), "way": way} for n in args.n.split(",") for way in WAYS]
    cfg, bw = rb.configs()["ours"], copy_bandwidth()["best"]
    try:
        for r in rows:
            r["step_us"] = round(rb.timed(fresh(r["n"], WAYS[r["way"]]), args.steps)[0], 1)
            print(r, flush=True)
        for r in rows:
            spans = step_trace.trace(fresh(r["n"], WAYS[r["way"]]))
            two = next(t for t in rows if t["n"] == r["n"] and not WAYS[t["way"]])
            r["vs_two"] = round(r["step_us"] / two["step_us"], 3)
            r["union_us"] = round(rb.union_ns(spans) / 1e3, 1)
            r["floor_us"] = round((weight_bytes(cfg, "bfloat16") + 2 * r["n"] * slot_bytes(cfg, "bfloat16")) / bw * 1e6, 1)
            r["union_vs_floor"] = round(r["union_us"] / r["floor_us"], 2)
            r["layer"] = "; ".join(f"{name.split('<')[0][:22]} {us:.1f} ({gap:+.1f})"
                                   for name, us, gap in gemm_step.layer_means(spans))
            print(r, flush=True)
    finally:
        GdnLayer.fuse_conv = True
    meta = {**device_info(), "copy_TBps": round(bw / 1e12, 3)}
    print("wrote", *write_results("conv-fused", rows, meta,
                                  ["n", "way", "step_us", "vs_two", "union_us", "floor_us", "union_vs_floor", "layer"],
                                  out_dir=args.out), flush=True)


if __name__ == "__main__":
    main()
