"""Error plot of one comparison: relative RMS error per output and runner pair against its bound (PNG)."""

from __future__ import annotations

import logging
from pathlib import Path

_log = logging.getLogger(__name__)


def error_plot(result, path: Path) -> Path | None:
    """Bars: worst relative RMS error over the iterations per (output, runner pair), log scale; ticks: bounds.
    Returns None, and says why, when matplotlib is not installed (the JSON holds the same numbers)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        _log.warning("no error plot for %s: matplotlib is not installed (%s); pip install matplotlib", path, e)
        return None
    outputs = list(dict.fromkeys(r["output"] for r in result.records))
    pairs = list(dict.fromkeys(tuple(r["pair"]) for r in result.records))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(outputs) * len(pairs)), 4.0))
    width = 0.8 / max(1, len(pairs))
    floor = 1e-12  # exact matches still get a visible bar on the log axis
    for j, pair in enumerate(pairs):
        worst = [max((r["rel_rms"] for r in result.records if r["output"] == o and tuple(r["pair"]) == pair),
                     default=0.0) for o in outputs]
        xs = [i + j * width for i in range(len(outputs))]
        ax.bar(xs, [max(w, floor) for w in worst], width, label=" vs ".join(pair))
    bounds = [next(r["bound_rel_rms"] for r in result.records if r["output"] == o) for o in outputs]
    ax.scatter([i + 0.4 - width / 2 for i in range(len(outputs))], bounds, marker="_", s=600, color="red",
               label="bound", zorder=3)
    ax.set_yscale("log")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(outputs))], outputs, rotation=30, ha="right")
    ax.set_ylabel("relative RMS error (worst iteration)")
    spec = result.record.spec
    ax.set_title(f"{spec.model} layer {spec.layer_idx} {spec.stem}: {'PASS' if result.passed else 'FAIL'}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
