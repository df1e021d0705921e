"""in_proj's launch inside the decode step: cuBLAS against skinny-GEMM launches, where a call timed alone may mislead.

    python bench/gemm_step.py [--n 64] [--launches "cublas;64,64,64,4,4,1,0;..."] [--out DIR]      (CUDA only)

`bench/gemm.py` times each launch alone, on weights rotated past the L2; in the step the same call follows the GDN
decode of the previous layer (whose state write-back the L2 still drains) and precedes the conv update, launched
with programmatic dependent launch, so a launch that loses alone may win there or the reverse (2026-12-04: our M = 64
launch lost 0.9 us alone and about 5 us per layer in the step). Per launch (`cublas`, or a `gemm.Config` as
"bm,bn,bk,stages,warps,split,spread[,late[,tma]]"; a "/nopdl" suffix launches every skinny GEMM of the step without
programmatic dependent launch) set as gemm.TABLE's wide row for the bucket of N, on a fresh session of
`bench/runtime.py`'s `ours` stack: the wall per static decode step over back-to-back steps, then from a profile
in_proj's mean interval, the step's device time (union) and a layer's kernels (`layer_means`); vs_cublas is the step
against the first launch's (name cublas first). Writes `<out>/<date>-gemm-step.{json,md}`.
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import replace
from pathlib import Path

import runtime as rb  # bench/runtime.py: the session, stack and timing
import step_trace

from common import RESULTS, device_info, pdl_off, write_results
from gdn_trt.plugins.glue import gemm

DEFAULT = "cublas;64,64,64,4,4,1,0;64,16,64,4,4,1,1;64,16,64,8,4,1,1;64,16,64,8,8,1,1;64,16,128,4,8,1,1"


def with_launch(n: int, launch: str) -> tuple:
    """gemm.TABLE with its wide row for n tokens set to `launch` (dispatched: its ratio below 1; cublas: above)."""
    row = gemm.row_for(n, gemm.WIDE_N)
    launch = launch.removesuffix("/nopdl")
    if launch == "cublas":
        new = replace(row, vs_cublas=2.0)
    else:
        bm, bn, bk, st, wp, sp, spread, *flags = (int(v) for v in launch.split(","))
        late, tma = (bool(f) for f in (*flags, 0, 0)[:2])
        new = replace(row, cfg=gemm.Config(bm, bn, bk, st, wp, split=sp, spread=spread, late=late, tma=tma),
                      vs_cublas=0.5)
    return tuple(new if r is row else r for r in gemm.TABLE)


def layer_means(spans: list[tuple[int, int, str]]) -> list[tuple[str, float, float]]:
    """A layer's kernels in order (each layer starts at its input norm, so in_proj is the second): (name, mean
    interval us, mean gap us before it; negative: it overlaps the one before), the means over the step's layers."""
    layers, end = [], None
    for a, b, name in spans:
        if name.startswith("norm_kernel"):
            layers.append([])
        if layers:
            layers[-1].append((name, (b - a) / 1e3, 0.0 if end is None else (a - end) / 1e3))
        end = b if end is None else max(end, b)
    out = []
    for k, (name, _, _) in enumerate(layers[0]):
        at = [lay[k] for lay in layers if len(lay) > k]
        out.append((name, sum(x[1] for x in at) / len(at), sum(x[2] for x in at) / len(at)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--launches", default=DEFAULT)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not rb.torch.cuda.is_available():
        raise SystemExit("gemm_step.py needs CUDA")
    table = gemm.TABLE

    def fresh(launch: str):
        gc.collect()
        rb.torch.cuda.empty_cache()  # the previous row's session: one at a time fits the device
        gemm.TABLE = with_launch(args.n, launch)
        return rb.Ours(rb.configs()["ours"]).step_fn("decode", [1] * args.n, "static")

    def nopdl(launch: str):
        return pdl_off(gemm if launch.endswith("/nopdl") else None)

    rows = [{"n": args.n, "launch": s} for s in args.launches.split(";")]
    try:
        for r in rows:  # every row timed before any is profiled (bench/runtime.py: CUPTI stays attached)
            with nopdl(r["launch"]):
                r["step_us"] = round(rb.timed(fresh(r["launch"]), args.steps).wall, 1)
            print(r, flush=True)
        for r in rows:
            with nopdl(r["launch"]):
                spans = step_trace.trace(fresh(r["launch"]))
            layer = layer_means(spans)
            r["in_proj_us"] = round(layer[1][1], 2)
            r["union_us"] = round(rb.union_ns(spans) / 1e3, 1)
            r["vs_cublas"] = round(r["step_us"] / rows[0]["step_us"], 3)
            r["layer"] = "; ".join(f"{name.split('<')[0][:22]} {us:.1f} ({gap:+.1f})" for name, us, gap in layer)
            print(r, flush=True)
    finally:
        gemm.TABLE = table
    print("wrote", *write_results("gemm-step", rows, device_info(),
                                  ["n", "launch", "step_us", "vs_cublas", "union_us", "in_proj_us", "layer"],
                                  out_dir=args.out), flush=True)


if __name__ == "__main__":
    main()
