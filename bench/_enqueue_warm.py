"""Experiment (removed once it has answered): does the host enqueue of the in-place decode step drift within one
process, and does the way the host waits for the GPU before each timed call move it?

    python bench/_enqueue_warm.py [--n 1,256] [--rounds 6]

On one H100 host (2026-12-05) the same step's enqueue on an idle GPU read 75.3 us at N = 256, then 33.5 in the next
measure of the same process, and its phases 72.4 then 38.6. Per N, on one session (bench/runtime.py's `Ours`),
`--rounds` consecutive measures of 100 calls, each after torch.cuda.synchronize and followed by a pure-Python probe
timed alike (about 16 us on a 2-core CI CPU), with the hypervisor's steal time over the round; then two of
bench/runtime.py's `timed` with Python's garbage collector frozen and off, two with each call after a blocking-sync
event (the thread sleeps instead of spinning), and two more of `timed`; each with the thread's CPU time.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import runtime as rb
import torch


def _probe() -> int:
    """About 10 us of pure Python that touches none of the runtime: the host's speed at that moment."""
    return sum(i * i for i in range(400))


def steal() -> int:
    """Jiffies the hypervisor ran other work on this VM's CPUs (/proc/stat, all CPUs)."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[8])


def timed_probe(fn, calls: int = 100) -> tuple[float, float, float]:
    """(median enqueue, median probe right after it, its CPU time) over calls each after torch.cuda.synchronize."""
    idle, probe, cpu = [], [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        t, c = time.perf_counter(), time.thread_time()
        fn()
        t2 = time.perf_counter()
        cpu.append(time.thread_time() - c)
        _probe()
        probe.append(time.perf_counter() - t2)
        idle.append(t2 - t)
    torch.cuda.synchronize()
    return statistics.median(idle) * 1e6, statistics.median(probe) * 1e6, statistics.median(cpu) * 1e6


def timed_blocking(fn, calls: int = 100) -> tuple[float, float]:
    ev = torch.cuda.Event(blocking=True)
    idle, cpu = [], []
    for _ in range(calls):
        ev.record()
        ev.synchronize()
        t, c = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c)
        idle.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(idle) * 1e6, statistics.median(cpu) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,256")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    print("host reference (wall, cpu us): %.2f, %.2f" % rb.static_reference(), flush=True)
    o = rb.Ours(rb.configs()["static"])
    t0 = time.perf_counter()
    for n in (int(v) for v in args.n.split(",")):
        fn = o.step_fn("decode", [1] * n, "static")
        fn()
        for r in range(args.rounds):
            st = steal()
            idle, probe, cpu = timed_probe(fn)
            print(f"N={n} round {r} (t={time.perf_counter() - t0:.1f} s): enqueue {idle:.1f} us (cpu {cpu:.1f}), "
                  f"the probe after it {probe:.1f} us, steal {steal() - st} jiffies", flush=True)
        gc.collect()
        gc.freeze()
        gc.disable()
        for r in range(2):
            _, idle, cpu = rb.timed(fn, 100)
            print(f"N={n} gc off {r}: enqueue {idle:.1f} us (cpu {cpu:.1f})", flush=True)
        gc.enable()
        gc.unfreeze()
        for r in range(2):
            idle, cpu = timed_blocking(fn)
            print(f"N={n} blocking wait {r}: enqueue {idle:.1f} us (cpu {cpu:.1f})", flush=True)
        for r in range(2):
            _, idle, cpu = rb.timed(fn, 100)
            print(f"N={n} again {r}: enqueue {idle:.1f} us (cpu {cpu:.1f})", flush=True)


if __name__ == "__main__":
    main()
