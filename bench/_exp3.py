"""EXPERIMENT: the decode kernel's first-token operands before the tile (rec_qkv_first) or prefetched into L1
(rec_prefetch_in): the kernel alone at N = 1 / 8 / 64 / 256 (bit-for-bit against the default, then timed in two
interleaved rounds), then the static decode step of bench/runtime.py (wall and union)."""
import statistics
import sys
from dataclasses import replace

import torch
from cases import HV, K, STATE_BYTES, V, gdn_inputs, packing
from common import n_sets_for, time_cuda

import probes
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri

BASE = gdn_tri.TUNING
VARS = {"base": {}, "qkvf": dict(rec_qkv_first=True), "pf": dict(rec_prefetch_in=True)}


def kernel():
    for n in (1, 8, 64, 256):
        x, pack = gdn_inputs(n, 1), packing([1] * n)
        sets = n_sets_for(n * STATE_BYTES)
        pools = [torch.randn(n, HV, K, V, device="cuda") * 0.5 for _ in range(sets)]
        ref_pool = pools[0].clone()
        outs = {}
        for name, ch in VARS.items():
            p = ref_pool.clone()
            o = gdn_tri.launch_recurrent(x, pack, p, None, replace(BASE, **ch))
            outs[name] = (o, p)
        for name in VARS:
            same = torch.equal(outs[name][0], outs["base"][0]) and torch.equal(outs[name][1], outs["base"][1])
            print(f"n={n} {name}: bit-equal to base: {same}", flush=True)
        res = {}
        for rnd in range(3):
            for name, ch in VARS.items():
                tu = replace(BASE, **ch)
                t = time_cuda(lambda i: gdn_tri.launch_recurrent(x, pack, pools[i % sets], None, tu), sets)
                res.setdefault(name, []).append(t.median_us)
        if n >= 64:
            slots = torch.arange(n, dtype=torch.int32, device="cuda")
            t = time_cuda(lambda i: probes.rec_copy_kernel[(V // 64, HV, n)](pools[i % sets], slots, HV=HV, K=K, V=V,
                                                                             BV=64, num_warps=2), sets)
            res["copy"] = [t.median_us]
        for name, v in res.items():
            print(f"KERNEL n={n:3d} {name:5s} {[round(a, 2) for a in v]} median {statistics.median(v):.2f} us "
                  f"{2 * n * STATE_BYTES / statistics.median(v) / 1e6:.3f} TB/s", flush=True)


def time_loop(fn, reps=200):
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def step():
    import runtime as rb
    import step_trace
    res = {}
    for rnd in range(2):
        for name, ch in VARS.items():
            gdn_tri.TUNING = replace(BASE, **ch)
            o = rb.Ours(rb.configs()["ours"])
            for n in (1, 8, 64, 256):
                fn = o.step_fn("decode", [1] * n, "static")
                wall = time_loop(fn)
                unions, gdn = [], []
                for _ in range(3):
                    evs = step_trace.trace(fn)
                    unions.append(rb.union_ns(evs) / 1e3)
                    gdn += [(b - a) / 1e3 for a, b, nm in evs if "recurrent" in nm]
                res.setdefault((n, name), []).append((wall, statistics.median(unions), statistics.mean(gdn)))
                print(f"round {rnd} {name:5s} N={n:3d}: wall {wall:7.1f} union {statistics.median(unions):7.1f} "
                      f"gdn {statistics.mean(gdn):6.2f}", flush=True)
            del o
    gdn_tri.TUNING = BASE
    for (n, name), v in sorted(res.items()):
        print(f"STEP N={n:3d} {name:5s} wall {[round(x[0], 1) for x in v]} union {[round(x[1], 1) for x in v]} "
              f"gdn {[round(x[2], 2) for x in v]}")


SWEEP_MANY = {"base": {}, "qkvf": dict(rec_qkv_first=True),
              "qkvf ch16": dict(rec_qkv_first=True, rec_chunk=16), "qkvf ch32": dict(rec_qkv_first=True, rec_chunk=32),
              "qkvf qa": dict(rec_qkv_first=True, rec_q_after=True),
              "qkvf cap200": dict(rec_qkv_first=True, rec_maxnreg=200),
              "qkvf qa cap200": dict(rec_qkv_first=True, rec_q_after=True, rec_maxnreg=200),
              "qkvf bv32 w1": dict(rec_qkv_first=True, rec_bv=32, rec_warps=1),
              "qkvf bv128 w4": dict(rec_qkv_first=True, rec_bv=128, rec_warps=4),
              "qkvf bv64 w4": dict(rec_qkv_first=True, rec_bv=64, rec_warps=4)}
SWEEP_FEW = {"base": {}, "qkvf": dict(rec_qkv_first=True), "qkvf few8": dict(rec_qkv_first=True, rec_bv_few=8),
             "qkvf few32": dict(rec_qkv_first=True, rec_bv_few=32), "qkvf few16 w2": dict(rec_qkv_first=True,
                                                                                          rec_warps_few=2),
             "qkvf many": dict(rec_qkv_first=True, rec_few_below=0), "many": dict(rec_few_below=0)}


def sweep():
    for n in (1, 8, 64, 256):
        x, pack = gdn_inputs(n, 1), packing([1] * n)
        sets = n_sets_for(n * STATE_BYTES)
        pools = [torch.randn(n, HV, K, V, device="cuda") * 0.5 for _ in range(sets)]
        res = {}
        table = SWEEP_FEW if n < 64 else SWEEP_MANY
        for rnd in range(2):
            for name, ch in table.items():
                tu = replace(BASE, **ch)
                try:
                    t = time_cuda(lambda i: gdn_tri.launch_recurrent(x, pack, pools[i % sets], None, tu), sets)
                    res.setdefault(name, []).append(t.median_us)
                except Exception as e:  # noqa: BLE001
                    print(f"n={n} {name} FAIL {str(e)[:150]}", flush=True)
        for name, v in res.items():
            print(f"SWEEP n={n:3d} {name:15s} {[round(a, 2) for a in v]} min {min(v):.2f} us "
                  f"{2 * n * STATE_BYTES / min(v) / 1e6:.3f} TB/s", flush=True)


if __name__ == "__main__":
    if "sweep" in sys.argv:
        sweep()
    if "kernel" in sys.argv:
        kernel()
    if "step" in sys.argv:
        step()


def host():
    """The in-place step's enqueue after each kind of wait: sync; sync then a 2 ms CPU busy loop (the GPU long
    idle, the CPU hot); spinning on an event (never leaving the CPU); per N, 200 calls each, medians."""
    import time
    import runtime as rb

    def busy(us):
        t = time.perf_counter()
        while time.perf_counter() - t < us * 1e-6:
            pass

    def spin():
        ev = torch.cuda.Event()
        ev.record()
        while not ev.query():
            pass

    o = rb.Ours(rb.configs()["ours"])
    for n in (1, 8, 64, 256):
        fn = o.step_fn("decode", [1] * n, "static")
        for _ in range(5):
            fn()
        out = {}
        for name, wait in (("sync", rb.sync), ("sync+busy2ms", lambda: (rb.sync(), busy(2000))),
                           ("spin", spin), ("sync", rb.sync)):
            ts = []
            for _ in range(200):
                wait()
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            rb.sync()
            out.setdefault(name, []).append(round(statistics.median(ts) * 1e6, 1))
        print(f"HOST N={n:3d} " + "  ".join(f"{k} {v}" for k, v in out.items()), flush=True)


if __name__ == "__main__" and "host" in sys.argv:
    host()
