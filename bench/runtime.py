"""Runtime decode benchmark on the H200: a 4-layer GDN stack, N in {1, 8, 64, 256} sequences per step.

Variants (bf16 activations, fp32 state, synthetic weights made in memory):
- eager:        Qwen3-Next layer shapes (C 2048, H 16, HV 32, K = V 128), every step launched op by op;
- cuda graph:   the same stack, each decode step one CUDA-graph replay (bucket = N);
- PLE vetoed:   Qwen4-Exp shapes (4 hc streams of 2560, same GDN heads) with PLE on the second layer, the PLE
                layer vetoing capture: graph segments around an eager PLE layer whose rows are staged in between;
- PLE hoisted:  the same stack, rows staged for the PLE layer before one whole-stack replay.
(The PLE n-gram table is shrunk to ~85k rows so the file stays small; its row width is the real 160.)

Per (variant, N): decode tokens/s over timed steps (wall clock between two device synchronisations); the host time
per step, as the duration of each call inside that loop (once the GPU is the bottleneck the launch queue fills and
this equals the step time), and as the duration of a call started on an idle GPU ("enqueue": the host's own cost).
The same token ids are decoded every step, so after the first step the PLE rows come from the host cache. Writes
`<out>/<date>-runtime.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

# bench/common.py: Python puts the script's folder first on sys.path (run as `python bench/<name>.py`)
from common import RESULTS, device_info, write_results

from gdn_trt.model.config import PRESETS, GdnConfig
from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.session import Session, SessionOptions

NS = (1, 8, 64, 256)
STACK = ("linear_attention",) * 4


def configs() -> dict[str, GdnConfig]:
    plain = PRESETS["qwen3-next-80b-a3b"].replace(layer_types=STACK, name="qwen3-next-4L")
    ple = PRESETS["qwen4-exp"].replace(layer_types=STACK, ple_layer_ids=(2,), ngram_vocab_size_base=5_000,
                                       name="qwen4-exp-4L-ple")
    return {"plain": plain, "ple": ple}


@dataclass
class Row:
    variant: str
    model: str
    n: int
    steps: int
    step_ms: float  # wall time per decode step
    tokens_per_s: float
    host_us: float  # duration of a decode call inside the timed loop (the launch queue may be full: GPU-bound)
    path: str  # graph / graph+eager / eager, as the session ran it
    enqueue_us: float = float("nan")  # duration of a decode call started on an idle GPU: the pure host cost


VARIANTS = (("eager", "plain", False, True), ("cuda graph", "plain", True, True),
            ("PLE vetoed", "ple", True, False), ("PLE hoisted", "ple", True, True))


def measure(sess: Session, n: int, steps: int, seqs: list[int]) -> tuple[float, float, str]:
    cfg = sess.cfg
    g = torch.Generator().manual_seed(n)
    h = torch.randn(n, 1, cfg.stream_dim, generator=g).to(sess.device, sess.dtype)
    ids = torch.randint(0, cfg.vocab_size, (n, 1), generator=g).numpy() if sess.feeds else None
    batch = {q: h[k] for k, q in enumerate(seqs[:n])}
    tok = None if ids is None else {q: ids[k] for k, q in enumerate(seqs[:n])}
    for _ in range(3):  # capture + acceptance gate + steady state
        sess.decode(batch, tok)
    kind = next(k for k in sess.stats().kinds.values() if k.modes)
    before = dict(kind.paths)
    torch.cuda.synchronize()
    host = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        sess.decode(batch, tok)
        host += time.perf_counter() - t
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    enqueue = []
    for _ in range(10):  # started on an idle GPU, a call cannot block on a full launch queue
        torch.cuda.synchronize()
        t = time.perf_counter()
        sess.decode(batch, tok)
        enqueue.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    path = next(p for p, c in kind.paths.items() if c > before.get(p, 0))
    return wall / steps, host / steps, sorted(enqueue)[len(enqueue) // 2], path


def run(steps: int) -> list[Row]:
    rows = []
    cfgs = configs()
    for variant, model, graphs, hoisted in VARIANTS:
        cfg = cfgs[model]
        opts = SessionOptions(limits=RuntimeLimits(max_seqs=max(NS), max_prefill_tokens=64, max_draft=1,
                                                   graph_buckets=NS, ple_cache_rows=1 << 16),
                              dtype=torch.bfloat16, graphs=graphs, ple_hoisted=hoisted)
        sess = Session.open(cfg, backend="torch", device="cuda", options=opts)
        seqs = [sess.add_sequence() for _ in range(max(NS))]
        for n in NS:
            step, host, enq, path = measure(sess, n, steps, seqs)
            rows.append(Row(variant, cfg.name, n, steps, step * 1e3, n / step, host * 1e6, path, enq * 1e6))
            print(f"{variant:<12} N={n:<4} {rows[-1].tokens_per_s:>11.0f} tok/s  step {step * 1e3:7.3f} ms  "
                  f"host {host * 1e6:7.1f} us  enqueue {enq * 1e6:7.1f} us  ({path})", flush=True)
        del sess
        torch.cuda.empty_cache()
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for v, *_ in VARIANTS:
        rs = [r for r in rows if r["variant"] == v]
        a.plot([r["n"] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", label=v)
        b.plot([r["n"] for r in rs], [r["enqueue_us"] for r in rs], marker="o", label=v)
    for ax, title, unit in ((a, "decode throughput", "tokens/s"), (b, "host time per step (idle GPU)", "us")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequences per step (N)")
        ax.set_ylabel(unit)
        ax.set_title(f"4-layer GDN stack, {title}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--steps", type=int, default=50)
    args = p.parse_args()
    rows = [asdict(r) for r in run(args.steps)]
    meta = {**device_info(), "configs": {k: c.name for k, c in configs().items()}, "activations": "bfloat16",
            "state": "float32", "steps": args.steps}
    columns = ["variant", "model", "n", "tokens_per_s", "step_ms", "host_us", "enqueue_us", "path"]
    paths = write_results("runtime", rows, meta, columns, plot, args.out)
    print("wrote " + ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
