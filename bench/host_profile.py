"""Where the host time of a decode step goes, on the machine that runs it (the H200's host for the real figure).

    python bench/host_profile.py [--n 1,256] [--steps 300] [--top 25] [--stack ours|ple|noPLE] [--smoke]
    python bench/host_profile.py --eager "verify 64x4,prefill 4096" [--steps 30] [--top 25] [--smoke]

The `ours` stack of `bench/runtime.py` (4 Qwen3-Next GDN layers, bf16, CUDA graphs): per N, every step started on
an idle GPU, the three phases of the batched API timed apart (open: `begin_step`, the request check, index copy and
PLE staging; run: `step.run`, the graph replay; close: the commit), medians in us, with `run(x)` and with the input
and output in place (`step.input()`, `run(..., copy=False)`); on CUDA then `bench/runtime.py`'s own measure
(`timed`) of the in-place step after 20 and after 1 back-to-back steps, the in-place phases again, and with a spin
wait; the step's CUDA calls alone (`bare`: the graph replay, an event record); then cProfile over back-to-back
steps, the functions by own time; then graphs of in_proj's and out_proj's GEMMs alone at M = 1, 64, 256
(`gemm_graphs`); last, per N, the kernels one replay of the bucket's graphs runs (`census`). Prints only: the
figures go into the closing notes of the issue they serve.

`--eager CASES` (bench/runtime.py's case names) profiles steps that run without a graph instead: on the H200 the
eager verify 64 x 4 took 3.3 ms of host enqueue against 0.96 ms of device time, and the prefill of 4096 tokens 5.7
against 2.8 ms (2026-12-04-runtime-twelfth.md), which a dozen launches a layer do not explain. Per case: the
phases (open, run, close and, for verify, the accept) of steps started on an idle GPU; every call that made the host
wait for the GPU during one step (`torch.cuda.set_sync_debug_mode`, with the runtime's frames of each); the
allocator's device allocations (`cudaMalloc` segments) over the timed steps; for verify, the accept of two drafts
of each sequence with its fold through torch and through `runtime/fold.py`'s kernel (host time, events' span); then
cProfile as above.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
import traceback
import warnings
from pathlib import Path

import runtime as rb  # bench/runtime.py: the same session, stack and inputs


def spin() -> None:
    """Wait for the GPU by polling an event: the host thread never leaves the CPU (`torch.cuda.synchronize` may)."""
    ev = rb.torch.cuda.Event()
    ev.record()
    while not ev.query():
        pass


def phases(o: "rb.Ours", n: int, steps: int, static: bool, wait=None) -> dict[str, float]:
    """`static`: the step's input and output in place (`step.input()`, `run(..., copy=False)`); `wait`: how the
    GPU is waited for before each step (`rb.sync`, or `spin`)."""
    s, seqs = o.sess, o.seqs[:n]
    x = rb.torch.randn(n, o.cfg.stream_dim, device=rb.DEV).to(s.dtype)
    ids = o.token_ids(n)
    out = {"open": [], "run": [], "close": [], "whole": []}
    pk = s._steps.pack
    for k in range(steps + 3):
        if k == 3:
            copies = pk.copies
        (wait or rb.sync)()
        t0 = time.perf_counter()
        st = s.begin_step(seqs, "decode", None, ids)
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
    # index-buffer uploads per step (the step's slots, the graph io words): 0 in a steady loop that sends nothing
    return {**{k: statistics.median(v) for k, v in out.items()}, "uploads": (pk.copies - copies) / steps}


def _fmt(p: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.2f} per step" if k == "uploads" else f"{k} {v:.1f} us" for k, v in p.items())


def bare(o: "rb.Ours", n: int, steps: int) -> dict[str, float]:
    """The CUDA calls of a step alone, each started on an idle GPU (medians in us): the decode graph's replay
    (`graph.replay()` of the bucket's captured graphs), one event record, and a replay whose wait spins on an event
    instead of `torch.cuda.synchronize` (does the idle wait itself slow the next call?)."""
    graphs = o.sess.graphs.replayable(n)
    return launch_costs(graphs, steps) if graphs else {}


def launch_costs(graphs: list, steps: int) -> dict[str, float]:
    """`bare`'s figures for any list of captured graphs, replayed in order (medians in us)."""
    ev = rb.torch.cuda.Event()
    out = {"replay": [], "record": [], "replay_after_spin": []}
    for k in range(steps + 3):
        rb.sync()
        t0 = time.perf_counter()
        for g in graphs:
            g.replay()
        t1 = time.perf_counter()
        ev.record()
        t2 = time.perf_counter()
        while not ev.query():
            pass
        t3 = time.perf_counter()
        for g in graphs:
            g.replay()
        t4 = time.perf_counter()
        if k >= 3:
            for name, v in (("replay", t1 - t0), ("record", t2 - t1), ("replay_after_spin", t4 - t3)):
                out[name].append(v * 1e6)
    rb.sync()
    return {k: statistics.median(v) for k, v in out.items()}


def census(o: "rb.Ours", n: int) -> str:
    """The kernels of one replay of bucket n's decode graphs, by name (torch.profiler; after the timed figures,
    since CUPTI slows every launch once it has run): how many graphs and kernels the replay launches. Why: the
    replay's host time grew with N (6.2 / 9.4 / 11.2 us at N = 1 / 64 / 256, and an event record right after it
    12.0 / 17.4 / 26.2 us, H100 host, 2026-12-05) for graphs meant to hold the same launches at every N. They do: one
    graph of 26 kernels at every N; the GEMMs differ (Triton below N = 64, cuBLAS from there), and only N = 256's
    graph cost more to launch on the next H100 host (bench/results/2026-12-05-host-profile-h100-census.txt)."""
    from collections import Counter

    graphs = o.sess.graphs.replayable(n) or []
    rb.sync()
    with rb.torch.profiler.profile(activities=[rb.torch.profiler.ProfilerActivity.CUDA]) as prof:
        for g in graphs:
            g.replay()
        rb.sync()
    names = Counter(e.name[:50] for e in prof.events() if e.device_type == rb.torch.autograd.DeviceType.CUDA)
    return (f"{len(graphs)} graphs, {sum(names.values())} device events: "
            + ", ".join(f"{k} x{v}" for k, v in names.most_common()))


def gemm_graphs(ms: list[int], steps: int) -> str:
    """Which launch makes the N = 256 graph dear to launch: graphs of one projection's GEMM alone (in_proj [M,
    2048] x [12352, 2048]^T and out_proj [M, 4096] x [2048, 4096]^T, bf16), 8 nodes as in the step, at each M:
    torch's linear (cuBLAS, and cuBLASLt where torch can be told to prefer it), the skinny Triton GEMM with 64 x 64
    tiles (M-tiles of 64 past M = 64: a launch the step could take instead), and 8 copies of the same output as the
    control; per graph the replay's host time and an event record's right after it (medians, us)."""
    import triton

    from gdn_trt.plugins.glue import gemm

    torch = rb.torch
    F = torch.nn.functional
    lib = torch.backends.cuda.preferred_blas_library()
    out = []
    for proj, (n_w, k_w) in (("in_proj", (12352, 2048)), ("out_proj", (2048, 4096))):
        w = torch.randn(n_w, k_w, device="cuda", dtype=torch.bfloat16)
        for m in ms:
            x = torch.randn(m, k_w, device="cuda", dtype=torch.bfloat16)
            y = F.linear(x, w)
            cfg = gemm.Config(max(16, min(64, triton.next_power_of_2(m))), 64, 64, 4, 4)
            for name, fn, blas in ((f"linear {proj} M={m}", lambda: F.linear(x, w), lib),
                                   (f"linear-lt {proj} M={m}", lambda: F.linear(x, w), "cublaslt"),
                                   (f"skinny {proj} M={m}", lambda: gemm.launch(x, w, cfg), lib),
                                   (f"copy {proj} M={m}", y.clone, lib)):
                torch.backends.cuda.preferred_blas_library(blas)
                try:
                    fn()
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        for _ in range(8):
                            fn()
                    t = launch_costs([g], steps)
                    out.append(f"{name}: replay {t['replay']:.1f} us  record {t['record']:.1f} us")
                    del g
                except Exception as e:  # a backend this build lacks: say so, keep the other rows
                    out.append(f"{name}: {type(e).__name__}: {e}")
                finally:
                    torch.backends.cuda.preferred_blas_library(lib)
    torch.cuda.synchronize()
    return "\n".join(out)


def hot(fn, steps: int, top: int) -> str:
    """cProfile of `steps` calls of the step function `fn` after a warm-up: the functions by own time."""
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


def eager_phases(o: "rb.Ours", case: str, steps: int) -> dict[str, float]:
    """Medians (us) of a step of `case` started on an idle GPU, by phase; `accept` (verify) takes no draft, as
    bench/runtime.py's step does."""
    kind, lengths = rb.CASES[case]
    s, seqs = o.sess, o.seqs[:len(lengths)]
    x = rb.torch.randn(sum(lengths), o.cfg.stream_dim, device=rb.DEV).to(s.dtype)
    L = rb.np.array(lengths)
    out = {"open": [], "run": [], "close": [], "accept": [], "whole": []}
    for k in range(steps + 2):
        rb.sync()
        t0 = time.perf_counter()
        st = s.begin_step(seqs, kind, None if kind == "decode" else L)
        st.__enter__()
        t1 = time.perf_counter()
        st.run(x)
        t2 = time.perf_counter()
        st.__exit__(None, None, None)
        t3 = time.perf_counter()
        if kind == "verify":
            s.accept_batch(seqs, rb.np.zeros(len(lengths), dtype=rb.np.int64))
        t4 = time.perf_counter()
        if k >= 2:  # the first steps compile and warm
            for name, v in (("open", t1 - t0), ("run", t2 - t1), ("close", t3 - t2), ("accept", t4 - t3),
                            ("whole", t4 - t0)):
                out[name].append(v * 1e6)
    rb.sync()
    return {k: statistics.median(v) for k, v in out.items() if kind == "verify" or k != "accept"}


def accept_cost(o: "rb.Ours", case: str, steps: int, drafts: int = 2) -> dict[str, float]:
    """Accepting `drafts` of each sequence's drafts after a verify step of `case`, with accept's fold through torch
    (a gather and a scatter per layer and state part) and through `runtime/fold.py`'s kernel: medians (us) of the
    host call, started on an idle GPU, and of the span of CUDA events around it (0 on the CPU). On an idle GPU the
    first event completes at once, so the span is the call's host time up to its last launch plus what the device
    does after it, not the device time (2026-12-05, H100: a span of 559 us for a fold kernel of 385 us alone,
    bench/fold_rate.py)."""
    from gdn_trt.runtime import stack

    kind, lengths = rb.CASES[case]
    s, seqs = o.sess, o.seqs[:len(lengths)]
    x = rb.torch.randn(sum(lengths), o.cfg.stream_dim, device=rb.DEV).to(s.dtype)
    counts = rb.np.minimum(rb.np.array(lengths), drafts)
    cuda = rb.DEV == "cuda"
    ev = [rb.torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
    was, out = stack.FOLD_KERNEL, {}
    try:
        for on in (False, True):
            stack.FOLD_KERNEL = on
            host, dev = [], []
            for k in range(steps + 2):
                with s.begin_step(seqs, kind, rb.np.array(lengths)) as st:
                    st.run(x)
                rb.sync()
                if cuda:
                    ev[0].record()
                t = time.perf_counter()
                s.accept_batch(seqs, counts)
                host.append((time.perf_counter() - t) * 1e6)
                if cuda:
                    ev[1].record()
                rb.sync()
                dev.append(ev[0].elapsed_time(ev[1]) * 1e3 if cuda else 0.0)
            tag = "kernel" if on else "torch"
            out[f"{tag} host"], out[f"{tag} span"] = statistics.median(host[2:]), statistics.median(dev[2:])
    finally:
        stack.FOLD_KERNEL = was
    return out


def waits(fn) -> list[str]:
    """The calls of one `fn()` that made the host wait for the GPU (torch's sync debug mode), each with its innermost
    frames of this repository: where an eager step is serialised behind the device."""
    found: list[str] = []

    def note(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "gdn_trt" in f.filename or "/bench/" in f.filename]
        found.append(f"{message} <- " + " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}"
                                                    for f in reversed(frames[-4:])))

    torch = rb.torch
    if rb.DEV != "cuda":
        return found
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")  # before the hook: the mode's own note on turning it on is no wait
        old, warnings.showwarning = warnings.showwarning, note
        try:
            fn()
        finally:
            warnings.showwarning = old
            torch.cuda.set_sync_debug_mode("default")
    rb.sync()
    return found


def segments(fn, steps: int) -> int:
    """Device allocations (`cudaMalloc`, each a device-wide sync) the caching allocator made over `steps` calls."""
    if rb.DEV != "cuda":
        return 0
    key = "segment.all.allocated"
    before = rb.torch.cuda.memory_stats().get(key, 0)
    for _ in range(steps):
        fn()
    rb.sync()
    return rb.torch.cuda.memory_stats().get(key, 0) - before


def eager(o: "rb.Ours", case: str, steps: int, top: int) -> None:
    kind, lengths = rb.CASES[case]
    p = eager_phases(o, case, steps)
    print(f"{case}: " + _fmt(p), flush=True)
    fn = o.step_fn(kind, lengths)
    for _ in range(3):
        fn()
    rb.sync()
    found = waits(fn)
    print(f"{case}: {len(found)} host waits for the GPU in one step" + "".join(f"\n  {w}" for w in found[:12]),
          flush=True)
    print(f"{case}: {segments(fn, steps)} device allocations over {steps} steps", flush=True)
    if kind == "verify":
        a = accept_cost(o, case, steps)
        print(f"{case}: accepting 2 drafts of each, fold by " + "  ".join(f"{k} {v:.1f} us" for k, v in a.items()),
              flush=True)
    print(hot(fn, steps, top), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,256")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--eager", default="", help="comma-separated bench/runtime.py cases to profile eagerly instead")
    ap.add_argument("--stack", default="ours", choices=("ours", "ple", "noPLE"),
                    help="bench/runtime.py's stack to profile (ple: Qwen4-Exp with a PLE layer, its feeds hoisted)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks this script only")
    args = ap.parse_args()
    if args.smoke:
        rb.DEV = "cpu"
    o = rb.Ours(rb.configs(args.smoke)[args.stack], False if args.eager else None)  # --eager: verify without graphs
    if args.eager:
        for case in args.eager.split(","):
            eager(o, case.strip(), args.steps, args.top)
        return
    ns = [int(v) for v in args.n.split(",")]
    for n in ns:
        for static in (False, True):
            p = phases(o, n, args.steps, static)
            print(f"decode N={n}{' in place' if static else ''}: " + _fmt(p),
                  flush=True)
        if rb.DEV == "cuda":
            # `timed` measured about 11 us above the phases' whole step in one process (2026-12-05, N = 256): its
            # idle calls follow back-to-back steps, so time it after 20 and after 1, then the phases again after it
            for back in (20, 1):
                idle = rb.timed(o.step_fn("decode", [1] * n, "static"), back).enqueue
                print(f"decode N={n} in place, bench/runtime.py's measure (`timed`, after {back} back-to-back "
                      f"steps): enqueue {idle:.1f} us", flush=True)
            print(f"decode N={n} in place, again: " + _fmt(phases(o, n, args.steps, True)), flush=True)
            p = phases(o, n, args.steps, True, spin)
            print(f"decode N={n} in place, spin wait: " + _fmt(p),
                  flush=True)
            print(f"decode N={n} bare: " + "  ".join(f"{k} {v:.1f} us" for k, v in bare(o, n, args.steps).items()),
                  flush=True)
        print(hot(o.step_fn("decode", [1] * n), args.steps, args.top), flush=True)
    if rb.DEV == "cuda":
        print(gemm_graphs([1, 64, 256], args.steps), flush=True)
        for n in ns:  # last: after torch.profiler every launch pays for CUPTI
            print(f"decode N={n} census: {census(o, n)}", flush=True)


if __name__ == "__main__":
    main()
