"""The chunked prefill pass by pass: each launch of ours timed alone, per tuning, beside FLA 0.6.0's kernels.

    python bench/passes.py [--T 4096,16384] [--varlen] [--variant "name=field:value,field:value" ...] [--no-fla]
                           [--out DIR] [--name passes]

For each length (and 16 x 1024 with --varlen) and each tuning (the default, then every --variant: fields of
`gated_delta_rule.triton.Tuning`, values as Python literals): the whole prefill as `launch_chunked` runs it, then
each of its launches alone with the state pass in one launch (`state_pipe = 1`), each replayed on its own call's
buffers (`common.time_cuda`; the Gluon state pass, `Tuning.state_gluon`, as `state_gluon_kernel`). FLA: the whole
call and `kernel_breakdown`'s per-kernel means, and the configs its autotuners chose (printed and kept in the JSON's
meta). Rows: case, tuning, launch, time_us.
"""

from __future__ import annotations

import argparse
import ast
import importlib
from dataclasses import replace
from pathlib import Path

import torch
from cases import HV, K, V, fla_chunk, gdn_inputs, packing
from common import RESULTS, device_info, kernel_breakdown, time_cuda, write_results

from gdn_trt.plugins.gated_delta_rule import gluon_state
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.packing import Capture
from gdn_trt.plugins.triton_aot import record

COLUMNS = ["case", "tuning", "launch", "time_us"]


def parse_variant(text: str) -> tuple[str, dict]:
    name, _, fields = text.partition("=")
    kw = {}
    try:
        for item in filter(None, fields.split(",")):
            key, _, value = item.partition(":")
            kw[key.strip()] = ast.literal_eval(value.strip())
        replace(gdn_tri.TUNING, **kw)  # an unknown field fails here, before anything runs
    except (TypeError, ValueError, SyntaxError) as e:
        raise SystemExit(f'--variant {text!r}: expected "name=field:value,..." with Tuning fields ({e})') from e
    return name.strip(), kw


def fla_configs() -> dict[str, str]:
    """The configs FLA's autotuners chose, per kernel and key."""
    out = {}
    for mod in ("fla.ops.common.chunk_delta_h", "fla.ops.common.chunk_o", "fla.ops.gated_delta_rule.wy_fast",
                "fla.ops.gated_delta_rule.chunk_fwd"):
        try:
            m = importlib.import_module(mod)
        except ImportError:
            continue
        for name, obj in vars(m).items():
            for _ in range(4):  # heuristics wrap the autotuner: look through .fn
                cache = getattr(obj, "cache", None)
                if isinstance(cache, dict) and cache and hasattr(obj, "configs"):
                    out[f"{mod}.{name}"] = "; ".join(f"{k}: {v}" for k, v in cache.items())
                    break
                obj = getattr(obj, "fn", None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="4096,16384")
    ap.add_argument("--varlen", action="store_true", help="also 16 sequences of 1024 tokens")
    ap.add_argument("--variant", action="append", default=[], help='"name=field:value,field:value"')
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="passes")
    args = ap.parse_args()
    variants = [("default", {})] + [parse_variant(v) for v in args.variant]
    cases = [[int(t)] for t in args.T.split(",") if t] + ([[1024] * 16] if args.varlen else [])
    rows, meta = [], device_info()
    for lengths in cases:
        T, N = sum(lengths), len(lengths)
        case = f"prefill {T}" if N == 1 else f"varlen {N}x{lengths[0]}"
        x, pack = gdn_inputs(T, 2), packing(lengths)
        pool = torch.randn(N, HV, K, V, device="cuda") * 0.5
        cap = Capture(torch.full((N,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))

        def add(tuning: str, launch: str, fn) -> None:
            t = time_cuda(lambda i: fn(), target_s=10e-3)
            rows.append(dict(case=case, tuning=tuning, launch=launch, time_us=round(t.median_us, 1)))
            print(f"{case:15s} {tuning:28s} {launch:28s} {t.median_us:9.1f} us", flush=True)

        for name, kw in variants:
            tu = replace(gdn_tri.TUNING, **kw)
            add(name, "whole prefill", lambda tu=tu: gdn_tri.launch_chunked(x, pack, pool, cap, tu))
            one = replace(tu, state_pipe=1, state_pipe_many=1)
            # the Gluon state pass (`Tuning.state_gluon`) is a kernel of gluon_state, launched from there
            for launch in record((gdn_tri, gluon_state), lambda: gdn_tri.launch_chunked(x, pack, pool, cap, one),
                                 run=True):
                add(name, launch.name.removeprefix("gdn_chunk_"), launch)
        if not args.no_fla:
            cu = pack.cu_seqlens.long() if N > 1 else None
            add("FLA 0.6.0", "whole call", lambda: fla_chunk(x, cu, pool))
            for kname, us in sorted(kernel_breakdown(lambda: fla_chunk(x, cu, pool)).items(), key=lambda kv: -kv[1]):
                rows.append(dict(case=case, tuning="FLA 0.6.0", launch=kname[:60], time_us=round(us, 1)))
                print(f"{case:15s} {'FLA 0.6.0':28s} {kname[:60]:28s} {us:9.1f} us (profiler)", flush=True)
    if not args.no_fla:
        meta["fla_configs"] = fla_configs()
        for k, v in meta["fla_configs"].items():
            print("FLA config", k, v, flush=True)
    meta["variants"] = {n: kw for n, kw in variants}
    write_results(args.name, rows, meta, COLUMNS, None, args.out)


if __name__ == "__main__":
    main()
