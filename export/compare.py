"""`gdn-trt compare`: the same inputs through torch, ONNX Runtime and TensorRT with Polygraphy's `Comparator`.

Per exported graph: the GraphSpec-aware inputs of `data.py`, `Comparator.run` over the runners (torch first: it
is the reference), `Comparator.compare_accuracy` with `RelRmsCompare` (every runner against torch, every output
against its bound from `tolerances.py`), a JSON of every (runner pair, iteration, output) error and an error plot
(PNG: worst relative RMS error per output and runner pair, log scale, with the bounds).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from polygraphy.comparator import Comparator

from gdn_trt.model.checkpoint import load_checkpoint
from gdn_trt.model.dtypes import DTYPES
from gdn_trt.model.layer import GdnLayer

from .artifacts import GraphRecord, Manifest, checkpoint_path, exported_weights
from .data import GraphData
from .runners import TorchRunner, onnxrt_runner, trt_runner
from .spec import GraphSpec, Role
from .tolerances import bound, errors, within

BACKENDS = ("torch", "onnxrt", "trt")
_log = logging.getLogger(__name__)


class RelRmsCompare:
    """Polygraphy compare function: relative RMS error per output against the one tolerance table; keeps every
    measurement in `records` for the JSON and the plot."""

    def __init__(self, spec: GraphSpec):
        self.spec = spec
        self.records: list[dict] = []
        self._iteration: dict[tuple[str, str], int] = {}

    def __call__(self, ref, got) -> OrderedDict:
        pair = (ref.runner_name, got.runner_name)
        it = self._iteration.get(pair, 0)
        self._iteration[pair] = it + 1
        out = OrderedDict()
        for name in self.spec.output_names:
            tol = bound(self.spec, name)
            a, b = ref[name], got[name]
            if a.shape != b.shape:
                rel, mx, ok = float("inf"), float("inf"), False
            else:
                rel, mx = errors(a, b)
                ok = within(tol, rel, mx)
            out[name] = ok
            self.records.append({"pair": list(pair), "iteration": it, "output": name, "rel_rms": rel,
                                 "max_abs": mx, "bound_rel_rms": tol.rel_rms, "floor": tol.floor, "passed": ok})
        return out


@dataclass
class GraphResult:
    record: GraphRecord
    runners: list[str]
    cases: list[dict]
    records: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.records) and all(r["passed"] for r in self.records)

    def worst(self) -> dict:
        return max(self.records, key=lambda r: r["rel_rms"] / r["bound_rel_rms"])

    def summary(self) -> str:
        s, w = self.record.spec, self.worst()
        return (f"{s.where} {s.stem}: {' vs '.join(self.runners)}: {'PASS' if self.passed else 'FAIL'} "
                f"(worst: {w['output']} rel RMS {w['rel_rms']:.2e}, bound {w['bound_rel_rms']:.0e}, "
                f"max-abs {w['max_abs']:.2e}), {len(self.cases)} iterations")

    def to_json(self) -> dict:
        s = self.record.spec
        return {"model": s.model, "layer": s.layer_idx, "layers": list(s.layer_ids), "mode": s.mode.value,
                "graph": s.stem,
                "onnx": self.record.path, "runners": self.runners, "passed": self.passed, "cases": self.cases,
                "records": self.records}


@dataclass(frozen=True)
class CompareOptions:
    backends: tuple[str, ...] = ("torch", "onnxrt")
    device: str = "cpu"  # torch runner
    iterations: int = 2
    engines: Path | None = None  # plans from `gdn-trt build`; None = build in memory from the ONNX file
    out: Path | None = None  # JSON + PNG per graph


def weight_feed(spec: GraphSpec, layers: list[GdnLayer]) -> dict[str, np.ndarray]:
    """The value of every weight input of `spec` (role weight) from its layer's buffers, by input name."""
    by_index = {la.index: la.weights() for la in layers}
    return {t.name: by_index[t.layer][t.local].detach().cpu().numpy()
            for t in spec.inputs if t.role is Role.WEIGHT}


def compare_graph(manifest: Manifest, rec: GraphRecord, layers: GdnLayer | dict[int, GdnLayer],
                  opts: CompareOptions) -> GraphResult:
    """`layers`: the graph's layer, or the export's layers by index (`layers_of`; a stack graph needs its run)."""
    spec = rec.spec
    if isinstance(layers, GdnLayer):
        layers = {layers.index: layers}
    missing = [i for i in spec.layer_ids if i not in layers]
    if missing:
        raise ValueError(f"{rec.path} runs {spec.where}: no torch layer {missing} given to compare it with")
    run = [layers[i] for i in spec.layer_ids]
    data = GraphData(spec, opts.iterations, weights=weight_feed(spec, run))
    runners = []
    if "torch" in opts.backends:
        runners.append(TorchRunner(run, spec, opts.device))
    if "onnxrt" in opts.backends:
        runners.append(onnxrt_runner(manifest.root / rec.path))
    if "trt" in opts.backends:
        plan = None
        if opts.engines is not None:
            plan = opts.engines / spec.model / Path(rec.path).with_suffix(".plan")
        bucket = spec.bucket_for({**data.cases[0].sizes(), "S": spec.limits.pool_slots})
        runners.append(trt_runner(spec, manifest.root / rec.path, plan, bucket))
    if len(runners) < 2:
        raise ValueError(f"compare needs two backends or more, got {opts.backends}")
    results = Comparator.run(runners, data_loader=list(data))
    cmp = RelRmsCompare(spec)
    Comparator.compare_accuracy(results, compare_func=cmp, comparisons=[(0, i) for i in range(1, len(runners))])
    res = GraphResult(rec, [r.name for r in runners], [vars(c) for c in data.cases], cmp.records)
    if opts.out is not None:
        base = opts.out / spec.model / Path(rec.path).with_suffix("")
        base.parent.mkdir(parents=True, exist_ok=True)
        base.with_suffix(".json").write_text(json.dumps(res.to_json(), indent=2))
        error_plot(res, base.with_suffix(".png"))
    return res


def layers_of(manifest: Manifest, dtype: str) -> dict[int, GdnLayer]:
    """The exported checkpoint's layers, loaded again with the real loader (and the merged adapter, if any)."""
    ck_path = checkpoint_path(manifest)
    if ck_path is None or not ck_path.exists():
        raise FileNotFoundError(f"{manifest.path}: checkpoint {ck_path!r} not found; the torch runner needs it")
    ck = load_checkpoint(ck_path)
    if ck.config.config_hash() != manifest.data["config_hash"]:
        raise ValueError(f"{ck_path}: config hash {ck.config.config_hash()} differs from the export's "
                         f"{manifest.data['config_hash']}")
    ck = exported_weights(manifest, ck)
    return {lw.index: GdnLayer(ck.config, lw, DTYPES[dtype]).eval() for lw in ck.layers}


def error_plot(result: GraphResult, path: Path) -> Path | None:
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
    ax.set_title(f"{spec.model} {spec.where} {spec.stem}: {'PASS' if result.passed else 'FAIL'}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
