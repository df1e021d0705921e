"""The record of one `gdn-trt compare` run: `compare.json` (every runner pair, iteration and output of every graph)
and `compare.png`, one plot of every graph's outputs: error / bound on a log scale, the bound at 1."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .compare import GraphResult

_log = logging.getLogger(__name__)
_EXACT = 1e-4  # exact matches (error 0) are drawn at this share of the bound, the bottom of the log axis


def write_report(results: list[GraphResult], out: Path, meta: dict) -> tuple[Path, Path | None]:
    """Write `<out>/compare.json` and `<out>/compare.png`; returns both paths (the plot None without matplotlib)."""
    out.mkdir(parents=True, exist_ok=True)
    failed = [r for r in results if not r.passed]
    doc = {**meta, "passed": bool(results) and not failed, "graphs": [r.to_json() for r in results]}
    if results:
        w = closest(results)
        doc["closest"] = {"graph": w.name(), "text": w.closest()}
    path = out / "compare.json"
    path.write_text(json.dumps(doc, indent=2))
    return path, summary_plot(results, out / "compare.png") if results else None


def closest(results: list[GraphResult]) -> GraphResult:
    """The graph whose worst output is closest to (or furthest over) its bound."""
    return max(results, key=lambda r: r.worst()["rel_rms"] / r.worst()["bound_rel_rms"])


def summary_plot(results: list[GraphResult], path: Path) -> Path | None:
    """Per graph (x axis) and output (marker), the worst iteration's error / bound on a log scale; the line at 1
    is the bound. Returns None, and says why, when matplotlib is not installed (the JSON has the same numbers)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        _log.warning("no plot %s: matplotlib is not installed (%s); pip install matplotlib", path, e)
        return None
    outputs = list(dict.fromkeys(r["output"] for res in results for r in res.records))
    pairs = list(dict.fromkeys(tuple(r["pair"]) for res in results for r in res.records))
    fig, ax = plt.subplots(figsize=(max(7.0, 0.45 * len(results) + 3), 4.8))
    markers = "o^sDvP*Xh<>p"
    for k, out in enumerate(outputs):
        for j, pair in enumerate(pairs):
            xs, ys = [], []
            for i, res in enumerate(results):
                got = [r for r in res.records if r["output"] == out and tuple(r["pair"]) == pair]
                if got:
                    share = max(r["rel_rms"] / r["bound_rel_rms"] for r in got)
                    xs.append(i + (j - (len(pairs) - 1) / 2) * 0.2)
                    ys.append(max(share, _EXACT))
            if xs:
                ax.scatter(xs, ys, marker=markers[k % len(markers)], s=28, color=f"C{k % 10}", alpha=0.85,
                           label=out if j == 0 else None)
    ax.axhline(1.0, color="red", lw=1.2, label="bound")
    ax.set_yscale("log")
    models = list(dict.fromkeys(r.record.spec.model for r in results))
    ax.set_xticks(range(len(results)), [(f"{r.record.spec.model} " if len(models) > 1 else "") + r.name()
                                        for r in results], rotation=60, ha="right", fontsize="small")
    ax.set_ylabel("error / bound (worst iteration)")
    vs = "; ".join(" vs ".join(p) for p in pairs)
    ok = sum(r.passed for r in results)
    ax.set_title(f"{', '.join(models)}: {ok}/{len(results)} graphs within their bounds ({vs})\n"
                 f"error = relative RMS against torch; 1 = the bound; exact matches drawn at {_EXACT:.0e}",
                 fontsize="medium")
    ax.legend(fontsize="x-small", ncol=1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
