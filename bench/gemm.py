"""The decode projections' GEMM: cuBLAS (F.linear) against the skinny Triton GEMM of plugins/glue/gemm.py.

    python bench/gemm.py [--out DIR] [--sweep] [--deadline S]

Shapes: Qwen3-Next's in_proj [12352, 2048] and out_proj [2048, 4096] (the GEMMs of its decode step), at M (tokens)
in {1, 8, 64, 128, 256}; and, to place the dispatch, the other decode-sized projections of the presets at
M in {1, 8, 64}: Qwen3.5's MLP, Qwen4-Exp's hc up-projection [10240, 320] and PLE projections. bf16, weights
rotated over sets bigger than the L2 (bench/common.time_cuda: CUDA-graph replay), so every call streams its
weight from HBM. Per (shape, M): cuBLAS and ours in us, TB/s (weight + x + y bytes over the time), % of the copy
rate measured in the same run, ours / cuBLAS, and whether `op.linear` sends the call to ours (`dispatched`). Past
the table (M > 64) ours runs `BIG`, the best large-M launch of the sweep, only to show where cuBLAS wins.

`--sweep` first times every candidate launch of `CANDIDATES` on the two Qwen3-Next shapes at each M bucket and
writes `<date>-gemm-sweep.{json,md}` (per candidate: us per shape and the sum); `--apply` then writes the best per
bucket into gemm.TABLE and the crossover into op.GEMM_MAX_M (sources and the running modules): where they come from.
Writes `<out>/<date>-gemm.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# bench/common.py: Python puts the script's folder first on sys.path (run as `python bench/<name>.py`)
from common import RESULTS, copy_bandwidth, device_info, n_sets_for, time_cuda, write_results

from gdn_trt.plugins.glue import gemm
from gdn_trt.plugins.glue import op as glue

C = gemm.Config
DT = torch.bfloat16
MAIN = {"next.in_proj": (12352, 2048), "next.out_proj": (2048, 4096)}  # [N, K]
OTHER = {"3.5.mlp.gate_up": (24576, 4096), "3.5.mlp.down": (4096, 12288), "4exp.hc.up": (10240, 320),
         "4exp.ple.key": (10240, 2560), "4exp.ple.value": (2560, 2560)}
MAIN_M = (1, 8, 64, 128, 256)
OTHER_M = (1, 8, 64)
BIG = C(128, 64, 64, 4, 4)
_FMA = [C(1, 8, 512, 1, 4, False), C(1, 16, 256, 1, 4, False), C(1, 16, 512, 1, 4, False),
        C(1, 32, 256, 1, 4, False), C(1, 8, 1024, 1, 4, False)]
_DOT16 = [C(16, 16, 256, 4), C(16, 16, 512, 3), C(16, 32, 256, 4), C(16, 32, 128, 6), C(16, 64, 128, 4)]
# M bucket -> candidates, in order of priority under the deadline (the decode step's M = 1, 8, 64 first)
CANDIDATES = {
    1: _FMA + _DOT16,
    8: _DOT16,
    64: [C(64, 16, 256, 4), C(64, 32, 128, 4), C(64, 32, 256, 3), C(64, 64, 128, 4)],
    2: [C(2, 16, 256, 1, 4, False), C(2, 8, 512, 1, 4, False), C(16, 32, 256, 4)],
    4: [C(4, 8, 256, 1, 4, False), C(4, 16, 256, 1, 4, False), C(16, 32, 256, 4)],
    16: [C(16, 16, 256, 4), C(16, 32, 256, 4), C(16, 32, 128, 6)],
    32: [C(32, 16, 256, 4), C(32, 32, 256, 4), C(32, 32, 128, 5)],
    128: [C(128, 64, 64, 4), C(128, 64, 128, 3, 8), C(64, 64, 128, 4)],
    256: [C(128, 64, 64, 4), C(128, 128, 64, 4, 8)],
}
COLUMNS = ["shape", "N", "K", "M", "cublas_us", "ours_us", "ours_over_cublas", "cublas_TBps", "ours_TBps",
           "cublas_pct_copy", "ours_pct_copy", "dispatched", "config"]


class Operands:
    """Rotating weight sets of one [N, K] shape (together several times the L2) and an x per M."""

    def __init__(self, N: int, K: int):
        self.N, self.K = N, K
        self.ws = [torch.randn(N, K, device="cuda", dtype=DT) * 0.02 for _ in range(n_sets_for(N * K * 2))]
        self.xs: dict[int, torch.Tensor] = {}

    def x(self, M: int) -> torch.Tensor:
        if M not in self.xs:
            self.xs[M] = torch.randn(M, self.K, device="cuda", dtype=DT)
        return self.xs[M]

    def bytes(self, M: int) -> int:
        return 2 * (self.N * self.K + M * self.K + M * self.N)

    def time(self, M: int, f, reps: int = 25) -> float:
        x, ws = self.x(M), self.ws
        return time_cuda(lambda i: f(x, ws[i % len(ws)]), n_sets=len(ws), reps=reps).median_us


def sweep(ops: dict[str, Operands], deadline: float, t0: float) -> tuple[list[dict], dict[int, tuple[C, float, float]]]:
    """Every candidate at each M bucket on the main shapes; returns the rows and per M the best config (least
    summed time over the shapes: the layer's GEMM time), its summed time and cuBLAS's."""
    rows, best = [], {}
    for M, cands in CANDIDATES.items():
        cublas = {s: o.time(M, F.linear, 15) for s, o in ops.items()}
        rows.append({"M": M, "config": "cuBLAS", **{f"{s}_us": v for s, v in cublas.items()},
                     "sum_us": sum(cublas.values())})
        for cfg in cands:
            if time.perf_counter() - t0 > deadline:
                rows.append({"M": M, "config": str(cfg), "error": "deadline"})
                continue
            try:
                us = {s: o.time(M, lambda x, w, c=cfg: gemm.launch(x, w, c), 15) for s, o in ops.items()}
            except Exception as e:  # noqa: BLE001 - recorded in the results, never hidden
                rows.append({"M": M, "config": str(cfg), "error": f"{type(e).__name__}: {str(e)[:160]}"})
                continue
            row = {"M": M, "config": str(cfg), **{f"{s}_us": v for s, v in us.items()}, "sum_us": sum(us.values()),
                   "sum_over_cublas": sum(us.values()) / sum(cublas.values())}
            rows.append(row)
            if M not in best or row["sum_us"] < best[M][1]:
                best[M] = (cfg, row["sum_us"], sum(cublas.values()))
            print(f"sweep M {M:4d} {cfg}  " + "  ".join(f"{s} {v:7.2f}" for s, v in us.items())
                  + f"  cuBLAS {sum(cublas.values()):7.2f}", flush=True)
        if M in best:
            rows.append({"M": M, "config": f"best: {best[M][0]}", "sum_us": best[M][1],
                         "sum_over_cublas": best[M][1] / best[M][2]})
    return rows, best


def apply_table(best: dict[int, tuple[C, float, float]], date: str) -> None:
    """Writes the sweep's winners into gemm.TABLE (source and the running module; every bucket, so that the tests run
    the kernel at every decode-sized M) and the crossover into op.GEMM_MAX_M: the last bucket of the run from M = 1
    where the best launch beats cuBLAS."""
    table = [(M, *best[M]) for M in sorted(best)]
    table = [(m, cfg, ours / cublas) for m, cfg, ours, cublas in table]
    wins = 0
    for m, _, r in table:
        if r >= 1:
            break
        wins = m
    if not wins:
        raise SystemExit("no M bucket where the skinny GEMM beats cuBLAS: table left as it was")
    root = Path(gemm.__file__).resolve().parent
    lines = "".join(f"    ({m}, Config({c.bm}, {c.bn}, {c.bk}, {c.stages}, {c.warps}{'' if c.dot else ', dot=False'})),"
                    f"  # {r:.2f}x cuBLAS (in_proj + out_proj)\n" for m, c, r in table)
    src = (root / "gemm.py").read_text()
    head = src.index("TABLE: tuple[")
    body = src.index("(\n", head) + 2
    end = src.index("\n)\n", body) + 1
    src = src[:body] + lines + src[end:]
    start = src.index("# (largest M, config)")
    src = src[:start] + ("# (largest M, config): the first entry whose M bound holds is used; the winners of the sweep on "
                         f"the H200,\n# {date} (bench/results/{date}-gemm-sweep.md)\n") + src[src.index("TABLE: tuple["):]
    (root / "gemm.py").write_text(src)
    op_src = (root / "op.py").read_text()
    at = op_src.index("GEMM_MAX_M = ")
    op_src = op_src[:at] + f"GEMM_MAX_M = {wins}" + op_src[op_src.index("\n", at):]
    (root / "op.py").write_text(op_src)
    gemm.TABLE = tuple((m, c) for m, c, _ in table)
    glue.GEMM_MAX_M = wins
    print("applied table", gemm.TABLE, "crossover", glue.GEMM_MAX_M, flush=True)


def measure(name: str, o: Operands, M: int, copy: float) -> dict:
    cfg = gemm.config_for(M) if M <= gemm.TABLE[-1][0] else BIG
    cub = o.time(M, F.linear)
    ours = o.time(M, lambda x, w: gemm.launch(x, w, cfg))
    b = o.bytes(M)
    dispatched = M <= glue.GEMM_MAX_M and o.N >= glue.GEMM_MIN_N  # op.linear's rule for bf16 contiguous operands
    return {"shape": name, "N": o.N, "K": o.K, "M": M, "cublas_us": cub, "ours_us": ours,
            "ours_over_cublas": ours / cub, "cublas_TBps": b / cub / 1e6, "ours_TBps": b / ours / 1e6,
            "cublas_pct_copy": 100 * b / cub / 1e-6 / copy, "ours_pct_copy": 100 * b / ours / 1e-6 / copy,
            "dispatched": dispatched, "config": str(cfg)}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    main = [r for r in rows if r["shape"] in MAIN]
    fig, ax = plt.subplots(figsize=(11, 5))
    xs = range(len(main))
    ax.bar([i - 0.2 for i in xs], [r["cublas_pct_copy"] for r in main], 0.4, label="cuBLAS (F.linear)")
    ax.bar([i + 0.2 for i in xs], [r["ours_pct_copy"] for r in main], 0.4, label="Triton skinny GEMM")
    ax.axhline(85, color="k", lw=1, ls="--", label="target: 85 % of copy")
    ax.set_xticks(list(xs), [f"{r['shape'].split('.')[-1]}\nM={r['M']}" for r in main], fontsize=8)
    ax.set_ylabel("% of the copy rate (weight + x + y bytes)")
    ax.set_title("Qwen3-Next decode projections, bf16, H200")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--apply", action="store_true", help="with --sweep: write the winners into gemm.TABLE and the "
                    "crossover into op.GEMM_MAX_M before the comparison runs")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which sweep candidates are skipped")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    t0 = time.perf_counter()
    meta = device_info()
    bw = copy_bandwidth()
    meta.update({f"copy_{k}": round(v, 3) for k, v in bw.items() if k != "best"}, dtype="bfloat16",
                table=[(m, str(c)) for m, c in gemm.TABLE], dispatch=f"M <= {glue.GEMM_MAX_M}, N >= {glue.GEMM_MIN_N}")
    print("device", meta, flush=True)
    ops = {s: Operands(*nk) for s, nk in MAIN.items()}
    if args.sweep:
        rows, best = sweep(ops, args.deadline, t0)
        print("best per M:", {m: str(c) for m, c in best.items()}, flush=True)
        if args.apply:
            apply_table(best, meta["date"])
            meta.update(table=[(m, str(c)) for m, c in gemm.TABLE], dispatch=f"M <= {glue.GEMM_MAX_M}, "
                        f"N >= {glue.GEMM_MIN_N}")
        write_results("gemm-sweep", rows, {**meta, "elapsed_s": round(time.perf_counter() - t0, 1)},
                      ["M", "config", *[f"{s}_us" for s in MAIN], "sum_us", "sum_over_cublas", "error"],
                      out_dir=args.out)
    rows = []
    for s, o in ops.items():
        for M in MAIN_M:
            rows.append(measure(s, o, M, bw["best"]))
            print(rows[-1], flush=True)
    del ops
    for s, nk in OTHER.items():
        o = Operands(*nk)
        for M in OTHER_M:
            rows.append(measure(s, o, M, bw["best"]))
            print(rows[-1], flush=True)
        del o
    meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
    print("wrote", *write_results("gemm", rows, meta, COLUMNS, plot, args.out), flush=True)


if __name__ == "__main__":
    main()
