"""Programmatic dependent launch in the decode step, per kernel family, on the H200 (plugins/pdl.py).

    python bench/pdl.py [--n 1,8,64,256] [--out DIR] [--smoke]

Variants, each on a fresh session of bench/runtime.py's `ours` stack (4 Qwen3-Next GDN layers, bf16, CUDA graphs;
a session's graphs keep the launches they were captured with):
- `off`: no PDL (GDN_TRT_PDL=0); `on`: every kernel of the step with PDL, as the runtime runs it;
- `on -X`: PDL on for every family but X (gemm: the skinny GEMM; gdn: the GDN decode; conv: the conv update;
  glue: the norms), so each family's share of the gain or loss shows;
- `off +gemm64`, `on +gemm64` (`--only`, not in the default set): the skinny GEMM for every projection at M = 64,
  in_proj included, where cuBLAS, which takes no PDL, wins a call timed alone (`gemm.TABLE`): does our GEMM win
  there inside a PDL step?
Per N: `replay_us`, CUDA events around back-to-back replays of the step's graphs (the device's span of a step:
with PDL the kernels overlap, so the profiler's sum of kernel times no longer is the step's device time), and
`wall_us`, back-to-back steps of the batched API with the input and output in place (`bench/runtime.py`'s `static`);
`launch_us`, the host time of the graphs' launch on an idle GPU (`host_profile.bare`, median of 100).
Writes `<out>/<date>-pdl.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path

import runtime as rb  # bench/runtime.py: the session, stack and timing
from host_profile import bare

from common import RESULTS, device_info, bar_figure, pdl_off, write_results

from gdn_trt.plugins.causal_conv1d import triton as conv_tri
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.glue import gemm
from gdn_trt.plugins.glue import triton as glue_tri

FAMILIES = {"gemm": gemm, "gdn": gdn_tri, "conv": conv_tri, "glue": glue_tri}


def variants() -> list[tuple[str, dict]]:
    return [("off", {"env": "0"}), ("on", {}), *((f"on -{f}", {"without": f}) for f in FAMILIES),
            ("off +gemm64", {"env": "0", "m64": True}), ("on +gemm64", {"m64": True})]


OPTIONAL = {"off +gemm64", "on +gemm64"}


def measure(name: str, how: dict, ns: list[int], steps: int) -> list[dict]:
    os.environ["GDN_TRT_PDL"] = how.get("env", "1")
    dispatched = gemm.dispatched
    if how.get("m64"):
        gemm.dispatched = lambda m, n: 1 <= m <= 64
    rows = []
    try:
        with pdl_off(FAMILIES.get(how.get("without"))):  # the family left out launches without PDL
            o = rb.Ours(rb.configs(rb.DEV == "cpu")["ours"])
            for n in ns:
                fn = o.step_fn("decode", [1] * n, "static")
                fn()  # captures the bucket's graphs with this variant's launches and gates them
                wall = rb.timed(fn, steps).wall
                graphs = o.sess.graphs.replayable(n) if rb.DEV == "cuda" else None
                replay = rb.replay_us(graphs) if graphs else float("nan")
                launch = bare(o, n, 100).get("replay", float("nan")) if graphs else float("nan")
                rows.append({"variant": name, "n": n, "replay_us": round(replay, 2), "wall_us": round(wall, 2),
                             "launch_us": round(launch, 2)})
                print(f"{name:18s} N={n:4d}  replay {replay:8.1f} us  wall {wall:8.1f} us  launch {launch:6.1f} us",
                      flush=True)
            del o
    finally:
        gemm.dispatched = dispatched
        os.environ.pop("GDN_TRT_PDL", None)
        gc.collect()
        if rb.DEV == "cuda":
            rb.torch.cuda.empty_cache()
    return rows


def plot(rows: list[dict], path: Path) -> None:
    names = list(dict.fromkeys(r["variant"] for r in rows))
    base = "off" if "off" in names else names[0]
    off = {r["n"]: r["replay_us"] for r in rows if r["variant"] == base}
    bar_figure(path, rows, names, lambda r: r["replay_us"] / off[r["n"]], f"step replay time / {base}", (0.8, 1.15),
                 "decode step, 4 Qwen3-Next GDN layers: programmatic dependent launch per kernel family")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,8,64,256")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks this script only")
    args = ap.parse_args()
    if args.smoke:
        rb.DEV = "cpu"
    ns = [int(v) for v in args.n.split(",")]
    only = set(filter(None, args.only.split(",")))
    rows = []
    for name, how in variants():
        if name in only or (not only and name not in OPTIONAL):
            rows += measure(name, how, ns, args.steps)
    meta = device_info() if rb.DEV == "cuda" else {"device": "cpu (smoke: figures meaningless)"}
    paths = write_results("pdl", rows, meta, ["variant", "n", "replay_us", "wall_us", "launch_us"], plot, args.out)
    print("wrote", *paths, flush=True)


if __name__ == "__main__":
    main()
