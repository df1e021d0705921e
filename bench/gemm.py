"""The decode projections' GEMM: cuBLAS (F.linear) against the skinny Triton GEMM of plugins/glue/gemm.py.

    python bench/gemm.py [--out DIR] [--sweep [--apply]] [--deadline S]
    python bench/gemm.py --apply-from RESULTS/<date>-gemm-sweep.json     (no GPU: writes that sweep's winners)

Shapes: Qwen3-Next's in_proj [12352, 2048] and out_proj [2048, 4096] (the GEMMs of its decode step), at M (tokens)
in {1, 2, 4, 8, 16, 32, 64, 128, 256}; and, to place the dispatch, the other decode-sized projections of the presets
at M in {1, 8, 64}: Qwen3.5's MLP, Qwen4-Exp's hc up-projection [10240, 320] and PLE projections. bf16, weights
rotated over sets bigger than the L2 (bench/common.time_cuda: CUDA-graph replay), so every call streams its
weight from HBM. Per (shape, M): cuBLAS and ours in us, TB/s (weight + x + y bytes over the time), % of the copy
rate measured in the same run, ours / cuBLAS, and whether `op.linear` sends the call to ours (`dispatched`). Past
the table (M > 64) ours runs `BIG`, the best large-M launch of an earlier sweep, only to show where cuBLAS wins.

`--sweep` first times every candidate launch (`candidates`: tiles and split-K slices per width class) on each of
the two Qwen3-Next shapes at each M bucket beside cuBLAS, and writes `<date>-gemm-sweep.{json,md}`; `--apply` then
writes the best per (M bucket, shape) into gemm.TABLE with its time over cuBLAS's (source and running module):
`op.linear` dispatches to ours exactly where that ratio is below 1. Writes `<out>/<date>-gemm.{json,md,png}`.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
from dataclasses import replace
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
ROW_N = {"next.in_proj": gemm.WIDE_N, "next.out_proj": 0}  # the table rows (min_n) each main shape tunes
OTHER = {"3.5.mlp.gate_up": (24576, 4096), "3.5.mlp.down": (4096, 12288), "4exp.hc.up": (10240, 320),
         "4exp.ple.key": (10240, 2560), "4exp.ple.value": (2560, 2560)}
MAIN_M = (1, 2, 4, 8, 16, 32, 64, 128, 256)
OTHER_M = (1, 8, 64)
BIG = C(128, 64, 64, 4, 4)
# (BN, BK, stages, warps, split) per width class, BM = max(16, next pow2 of M). Programs = N-tiles x split against
# the 132 SMs: in_proj [12352, 2048] has 386 / 193 / 97 / 49 N-tiles at BN = 32 / 64 / 128 / 256; out_proj
# [2048, 4096] has 128 / 64 / 32 / 16 at BN = 16 / 32 / 64 / 128, so split 2-8 gives it 128 programs. Only the
# launches that gemm.config_for would run are timed (split programs <= gemm.SMS): the first split-K sweep
# (results/2026-12-03-gemm-sweep-all-splits.md) timed up to 512 programs and every split launch past 132 lost, e.g.
# out_proj at M = 64 with BN = 64: split 4 (128 programs) 9.63 us, split 8 (256) 13.6 us; in_proj at M = 64 with
# BN = 64: split 1 (193) 18.7 us, split 2 (386) 24.1 us.
_WIDE = [(32, 128, 6, 4, 1), (32, 256, 4, 4, 1), (64, 128, 4, 4, 1), (64, 64, 4, 4, 1), (256, 64, 4, 8, 2),
         (128, 64, 4, 4, 1), (128, 64, 4, 8, 1), (128, 128, 3, 8, 1), (64, 64, 8, 4, 1), (64, 128, 6, 8, 1)]
# row ranges (gemm.Config.spread): (BN at least, BK, stages, warps, split, spread); in_proj's 12352 rows over 132 /
# 264 / 396 programs are ranges of 94 / 47 / 32 rows in blocks of 128 / 64 / 32
_WIDE_SPREAD = [(16, 64, 4, 4, 1, 1), (16, 64, 4, 8, 1, 1), (16, 128, 3, 8, 1, 1), (16, 64, 5, 4, 1, 1),
                (16, 64, 4, 4, 1, 2), (16, 128, 4, 4, 1, 2), (16, 128, 4, 4, 1, 3)]
_NARROW = [(16, 512, 3, 4, 1), (32, 256, 4, 4, 2), (64, 128, 4, 4, 4), (64, 256, 3, 4, 4), (64, 64, 4, 4, 4),
           (128, 64, 4, 4, 8), (128, 128, 3, 8, 8)]
# the same tilings with TMA tiles (gemm.Config.tma: BK <= 64 for bf16), first timed in the sweep that follows the
# sitting which wrote them (no device then)
_WIDE_TMA = [(64, 64, 4, 4, 1), (64, 64, 6, 4, 1), (128, 64, 4, 4, 1), (128, 64, 4, 8, 1), (32, 64, 8, 4, 1),
             # deeper pipelines of the 64 x 64 tile, which led at M = 64 with 6 stages (15.7 against cuBLAS's 16.9 us,
             # 3.3 TB/s): in the N = 64 step in_proj streams at 2.7 TB/s where a copy of its bytes takes 4.0
             # (bench/results/2026-12-05-chain-trace-h200.md). Timed on an H100 (M = 64, 2026-12-05,
             # bench/results/2026-12-05-gemm-sweep-h100-m64.md): 6 stages 21.8 us, 8 stages 23.1 (8 warps 24.6),
             # 10 stages 25.4, cuBLAS 21.9; non-TMA 8 stages 23.1, BK 128 at 6 stages 23.7: more bytes in flight a
             # program did not stream faster
             (64, 64, 8, 4, 1), (64, 64, 8, 8, 1), (64, 64, 10, 4, 1)]
_NARROW_TMA = [(64, 64, 4, 4, 4), (64, 64, 6, 4, 4), (32, 64, 6, 4, 2), (128, 64, 4, 8, 8)]
# the FMA form (BM = M <= 4): BN = 8 or 16 weight rows per program (out_proj: 256 or 128 N-tiles, no room to split)
_FMA_WIDE = [(8, 1024, 1), (16, 512, 1)]
_FMA_NARROW = [(8, 1024, 1), (8, 512, 1), (16, 512, 1)]
M_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # the table's rows, decode-sized M


def candidates(m: int, shape: str) -> list:
    """The launches the sweep times at M bucket m on one of the main shapes (in order of priority)."""
    bm = max(16, 1 << (m - 1).bit_length())
    dots, fmas = (_WIDE, _FMA_WIDE) if ROW_N[shape] else (_NARROW, _FMA_NARROW)
    out = [C(bm, bn, bk, st, wp, split=sp) for bn, bk, st, wp, sp in dots]
    out += [C(bm, bn, bk, st, wp, split=sp, tma=True) for bn, bk, st, wp, sp in
            (_WIDE_TMA if ROW_N[shape] else _NARROW_TMA)]
    if ROW_N[shape]:
        out += [C(bm, bn, bk, st, wp, split=sp, spread=k) for bn, bk, st, wp, sp, k in _WIDE_SPREAD]
    if m <= 4:
        out = [C(m, bn, bk, 1, 4, False, sp) for bn, bk, sp in (fmas if m == 1 else fmas[:2])] + out
    # what gemm.config_for would run: a split cut to N-tiles x split <= SMS
    return [c for c in out if c.split == 1 or gemm.fit(c, m, MAIN[shape][0]) == c]


def cfg_src(c: C) -> str:
    return (f"Config({c.bm}, {c.bn}, {c.bk}, {c.stages}, {c.warps}" + ("" if c.dot else ", dot=False")
            + (f", split={c.split}" if c.split > 1 else "") + (f", spread={c.spread}" if c.spread else "")
            + (", late=True" if c.late else "") + (", tma=True" if c.tma else "") + ")")


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


def sweep(ops: dict[str, Operands], deadline: float, t0: float, buckets=M_BUCKETS) -> list[dict]:
    """Every candidate at each M bucket on each main shape beside cuBLAS; the rows (`cfg` holds the launch's fields
    for `--apply-from`), the best per (M, shape) marked."""
    rows = []
    for M in buckets:
        for s, o in ops.items():
            cub = o.time(M, F.linear, 15)
            rows.append({"M": M, "shape": s, "config": "cuBLAS", "us": cub, "TBps": o.bytes(M) / cub / 1e6})
            best = None
            for cfg in candidates(M, s):
                programs = gemm.tiles(cfg, M, o.N) * cfg.split
                row = {"M": M, "shape": s, "config": str(cfg), "programs": programs,
                       "cfg": [cfg.bm, cfg.bn, cfg.bk, cfg.stages, cfg.warps, cfg.dot, cfg.split, cfg.spread,
                               cfg.late, cfg.tma]}
                if time.perf_counter() - t0 > deadline:
                    rows.append({**row, "error": "deadline"})
                    continue
                try:
                    us = o.time(M, lambda x, w, c=cfg: gemm.launch(x, w, c), 15)
                except Exception as e:  # noqa: BLE001 - recorded in the results, never hidden
                    rows.append({**row, "error": f"{type(e).__name__}: {str(e)[:160]}"})
                    continue
                rows.append({**row, "us": us, "cublas_us": cub, "over_cublas": us / cub, "TBps": o.bytes(M) / us / 1e6})
                if best is None or us < best["us"]:
                    best = rows[-1]
                print(f"sweep M {M:3d} {s} {cfg} {programs:4d} programs {us:7.2f} us (cuBLAS {cub:7.2f})", flush=True)
            if best is not None:
                best["best"] = True
    return rows


def winners(rows: list[dict]) -> dict[tuple[int, str], tuple[C, float, float]]:
    """(M, shape) -> (launch, its us, cuBLAS's us) of the rows marked best (a sweep's rows or its JSON)."""
    return {(r["M"], r["shape"]): (C(*r["cfg"]), r["us"], r["cublas_us"]) for r in rows if r.get("best")}


def apply_table(best: dict[tuple[int, str], tuple[C, float, float]], date: str) -> None:
    """Writes the sweep's winners into gemm.TABLE (source and the running module): per M bucket a wide row (tuned on
    in_proj) and a narrow one (out_proj), each with its time over cuBLAS's, which `gemm.dispatched` reads (every
    bucket stays in the table, so that the tests run the kernel at every decode-sized M). A sweep of some buckets
    (`--m`) rewrites only theirs: the other rows keep their lines, and each rewritten line ends with this sweep's
    date (its file: bench/results/<date>-gemm-sweep.md)."""
    root = Path(gemm.__file__).resolve().parent
    src = (root / "gemm.py").read_text()
    body = src.index("(\n", src.index("TABLE: tuple[")) + 2
    old = src[body:src.index("\n)\n", body) + 1]
    # each row's source line by its (M, width) key, read from the line itself (not paired with TABLE by position)
    old_lines = {}
    for line in old.splitlines(keepends=True):
        key = re.match(r"\s*Row\((\d+), (WIDE_N|0),", line)
        if key:
            old_lines[(int(key[1]), gemm.WIDE_N if key[2] == "WIDE_N" else 0)] = line
    if set(old_lines) != {(r.max_m, r.min_n) for r in gemm.TABLE}:
        raise SystemExit("gemm.TABLE's source has a row that is not one `Row(M, WIDE_N or 0, ...)` line: rewrite it "
                         "by hand")
    partial = any((M, s) not in best for M in M_BUCKETS for s in MAIN)
    table, lines = [], []
    for M in M_BUCKETS:
        for s in MAIN:
            if (M, s) not in best:
                if (M, ROW_N[s]) in old_lines:
                    table.append(gemm.row_for(M, MAIN[s][0]))
                    lines.append(old_lines[(M, ROW_N[s])])
                continue
            cfg, us, cub = best[(M, s)]
            # the late trigger is decided in the step (bench/gemm_step.py), not by a call timed alone: kept
            cfg = replace(cfg, late=gemm.row_for(M, MAIN[s][0]).cfg.late)
            table.append(gemm.Row(M, ROW_N[s], cfg, round(us / cub, 3)))
            N, K = MAIN[s]
            tbps = 2 * (N * K + M * K + M * N) / us / 1e6
            lines.append(f"    Row({M}, {'WIDE_N' if ROW_N[s] else 0}, {cfg_src(cfg)}, {us / cub:.3f}),"
                         f"  # {us:.1f} against {cub:.1f} us, {tbps:.2f} TB/s" + (f", {date}" if partial else "")
                         + "\n")
    if not best:
        raise SystemExit("the sweep has no winner: table left as it was")
    src = src[:body] + "".join(lines) + src[src.index("\n)\n", body) + 1:]
    if not partial:
        at = src.index("# H200, ")
        src = src[:at] + f"# H200, {date} (bench/results/{date}-gemm-sweep.md), against cuBLAS on the same shape.\n" \
            + src[src.index("TABLE: tuple[", at):]
    (root / "gemm.py").write_text(src)
    gemm.TABLE = tuple(table)
    print("applied table", *gemm.TABLE, sep="\n  ", flush=True)


def dispatch_note() -> str:
    return ", ".join(f"M <= {r.max_m} {'wide' if r.min_n else 'narrow'}" for r in gemm.TABLE if r.vs_cublas < 1) + \
        f" (N >= {glue.GEMM_MIN_N}, K >= {glue.GEMM_MIN_K})"


def measure(name: str, o: Operands, M: int, copy: float) -> dict:
    cfg = gemm.config_for(M, o.N) if M <= gemm.TABLE[-1].max_m else BIG
    cub = o.time(M, F.linear)
    ours = o.time(M, lambda x, w: gemm.launch(x, w, cfg))
    b = o.bytes(M)
    # op.linear's rule for bf16 contiguous operands
    dispatched = o.N >= glue.GEMM_MIN_N and o.K >= glue.GEMM_MIN_K and gemm.dispatched(M, o.N)
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
    ap.add_argument("--apply", action="store_true", help="with --sweep: write the winners into gemm.TABLE before the "
                    "comparison runs")
    ap.add_argument("--apply-from", type=Path, metavar="JSON", help="write the winners of a sweep's "
                    "<date>-gemm-sweep.json into gemm.TABLE and exit (no GPU needed)")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which sweep candidates are skipped")
    ap.add_argument("--m", default=",".join(map(str, M_BUCKETS)), help="the M buckets the sweep times (comma list; "
                    "--apply then rewrites only their rows)")
    args = ap.parse_args()
    if args.apply_from:
        saved = json.loads(args.apply_from.read_text())
        apply_table(winners(saved["rows"]), saved["meta"]["date"])
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    t0 = time.perf_counter()
    meta = device_info()
    bw = copy_bandwidth()
    meta.update({f"copy_{k}": round(v, 3) for k, v in bw.items() if k != "best"}, dtype="bfloat16",
                table=[(r.max_m, r.min_n, str(r.cfg), r.vs_cublas) for r in gemm.TABLE], dispatch=dispatch_note())
    print("device", meta, flush=True)
    ops = {s: Operands(*nk) for s, nk in MAIN.items()}
    if args.sweep:
        rows = sweep(ops, args.deadline, t0, tuple(int(m) for m in args.m.split(",")))
        if args.apply:
            apply_table(winners(rows), meta["date"])
            meta.update(table=[(r.max_m, r.min_n, str(r.cfg), r.vs_cublas) for r in gemm.TABLE],
                        dispatch=dispatch_note())
        write_results("gemm-sweep", rows, {**meta, "elapsed_s": round(time.perf_counter() - t0, 1)},
                      ["M", "shape", "config", "programs", "us", "cublas_us", "over_cublas", "TBps", "best", "error"],
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
