"""Where the host time of a decode step goes, on the machine that runs it (the H200's host for the real figure).

    python bench/host_profile.py [--n 1,256] [--steps 300] [--top 25] [--smoke]

The `ours` stack of `bench/runtime.py` (4 Qwen3-Next GDN layers, bf16, CUDA graphs): per N, every step started on
an idle GPU, the three phases of the batched API timed apart (open: `begin_step`, the request check, index copy and
PLE staging; run: `step.run`, the graph replay; close: the commit), medians in us, with `run(x)` and with the input
and output in place (`step.input()`, `run(..., copy=False)`); then cProfile over back-to-back
steps, the functions by own time. Prints only: the figures go into the closing notes of the issue they serve.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import runtime as rb  # bench/runtime.py: the same session, stack and inputs


def phases(o: "rb.Ours", n: int, steps: int, static: bool) -> dict[str, float]:
    """`static`: the step's input and output in place (`step.input()`, `run(..., copy=False)`)."""
    s, seqs = o.sess, o.seqs[:n]
    x = rb.torch.randn(n, o.cfg.stream_dim, device=rb.DEV).to(s.dtype)
    out = {"open": [], "run": [], "close": [], "whole": []}
    for k in range(steps + 3):
        rb.sync()
        t0 = time.perf_counter()
        st = s.begin_step(seqs, "decode")
        st.__enter__()
        t1 = time.perf_counter()
        st.run(st.input(), copy=False) if static else st.run(x)
        t2 = time.perf_counter()
        st.__exit__(None, None, None)
        t3 = time.perf_counter()
        if k >= 3:  # the first steps capture and gate the bucket's graphs
            for name, v in (("open", t1 - t0), ("run", t2 - t1), ("close", t3 - t2), ("whole", t3 - t0)):
                out[name].append(v * 1e6)
    rb.sync()
    return {k: statistics.median(v) for k, v in out.items()}


def hot(o: "rb.Ours", n: int, steps: int, top: int) -> str:
    fn = o.step_fn("decode", [1] * n)
    for _ in range(5):
        fn()
    rb.sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fn()
    prof.disable()
    rb.sync()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks this script only")
    args = ap.parse_args()
    if args.smoke:
        rb.DEV = "cpu"
    o = rb.Ours(rb.configs(args.smoke)["ours"])
    for n in (int(v) for v in args.n.split(",")):
        for static in (False, True):
            p = phases(o, n, args.steps, static)
            print(f"decode N={n}{' in place' if static else ''}: " + "  ".join(f"{k} {v:.1f} us" for k, v in p.items()),
                  flush=True)
        print(hot(o, n, args.steps, args.top), flush=True)


if __name__ == "__main__":
    main()
