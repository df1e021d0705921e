"""The kernels of one decode step in launch order, with their start, length and the gap before each, on the device.

    python bench/step_trace.py [--n 64] [--out DIR]      (CUDA only)

Where `bench/runtime.py` sums the step's device time by category, this lists the kernels of one step of its `ours`
stack (4 Qwen3-Next GDN layers, bf16, CUDA graphs, the batched API in place: its `static` path) as torch.profiler
sees them in the last of five profiled steps: `start_us` from the step's first kernel, `us` the kernel's interval,
`gap_us` the time since the previous kernel ended (negative: the two overlap, as kernels launched with programmatic
dependent launch do). Per N: the step's span, the union of the intervals (runtime.py's device time) and the sum.
Writes `<out>/<date>-step-trace.{json,md}`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import runtime as rb  # bench/runtime.py: the session, stack and timing

from common import RESULTS, device_info, write_results

REPS = 5


def trace(fn) -> list[tuple[int, int, str]]:
    """(start ns, end ns, name) of the device kernels of the last of REPS calls of fn, in start order."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    rb.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        rb.sync()
    evs = rb.device_spans(prof)
    per = len(evs) // REPS
    if per * REPS != len(evs):
        raise RuntimeError(f"{len(evs)} kernels in {REPS} steps: the steps launch different kernels")
    return evs[-per:]


def rows_for(n: int, evs: list[tuple[int, int, str]]) -> list[dict]:
    t0, end, rows = evs[0][0], None, []
    for a, b, name in evs:
        gap = None if end is None else (a - end) / 1e3
        end = b if end is None else max(end, b)
        rows.append({"n": n, "kernel": name[:90], "start_us": round((a - t0) / 1e3, 2), "us": round((b - a) / 1e3, 2),
                     "gap_us": None if gap is None else round(gap, 2)})
    rows.append({"n": n, "kernel": f"step: span {(end - t0) / 1e3:.1f} us, union {rb.union_ns(evs) / 1e3:.1f} us, sum "
                 f"{sum(b - a for a, b, _ in evs) / 1e3:.1f} us, {len(evs)} kernels"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="64")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if not rb.torch.cuda.is_available():
        raise SystemExit("step_trace.py needs CUDA: the profiler's device events are what it lists")
    o = rb.Ours(rb.configs()["ours"])
    rows = []
    for n in (int(v) for v in args.n.split(",")):
        fn = o.step_fn("decode", [1] * n, "static")
        rows += rows_for(n, trace(fn))
        print(rows[-1]["kernel"], flush=True)
    meta = device_info()
    print("wrote", *write_results("step-trace", rows, meta, ["n", "kernel", "start_us", "us", "gap_us"],
                                  out_dir=args.out), flush=True)


if __name__ == "__main__":
    main()
