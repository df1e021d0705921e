"""`gdn-trt compare`: the same inputs through torch, ONNX Runtime (or ONNX's reference evaluator) and TensorRT with
Polygraphy's `Comparator`.

Per exported graph: the GraphSpec-aware inputs of `data.py`, `Comparator.run` over the runners (torch first: it
is the reference), `Comparator.compare_accuracy` with `RelRmsCompare` (every runner against torch, every output
against its bound from `tolerances.py`). `report.py` writes one JSON and one plot per run. Graphs are compared in
the dtype they were exported in: a bfloat16 export (every real checkpoint) runs in ONNX's reference evaluator
(`runners.OnnxRefRunner`), since ONNX Runtime's CPU provider has no bf16 kernels.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from polygraphy.comparator import Comparator

from gdn_trt.model.checkpoint import load_checkpoint
from gdn_trt.model.dtypes import DTYPES
from gdn_trt.model.layer import GdnLayer

from .artifacts import GraphRecord, Manifest, checkpoint_path, exported_weights
from .data import GraphData
from .runners import OnnxRefRunner, TorchRunner, onnxrt_runner, trt_runner
from .spec import GraphSpec
from .tolerances import bound, errors, within

BACKENDS = ("torch", "onnxrt", "onnxref", "trt")
ONNXRT_DTYPES = ("float32", "float16")  # what ONNX Runtime's CPU provider runs end to end (bf16: no Add kernel)


def backends_for(text: str, dtype: str, trt_available: bool) -> tuple[str, ...]:
    """The runners of `--backends` for an export in `dtype`: `auto` = torch, the ONNX runner that runs this dtype
    on a CPU, and trt where TensorRT imports. Raises ValueError for unknown names or onnxrt on a bf16 export."""
    if text == "auto":
        return ("torch", "onnxrt" if dtype in ONNXRT_DTYPES else "onnxref") + (("trt",) if trt_available else ())
    names = tuple(b.strip() for b in text.split(",") if b.strip())
    bad = [b for b in names if b not in BACKENDS]
    if bad:
        raise ValueError(f"unknown backends {bad}; choose from {', '.join(BACKENDS)} (or auto)")
    if len(names) < 2:
        raise ValueError(f"compare needs two backends or more, got {list(names)}")
    if "onnxrt" in names and dtype not in ONNXRT_DTYPES:
        raise ValueError(f"this export is {dtype}: ONNX Runtime's CPU provider has no {dtype} kernels (its session "
                         "fails on the first Add); use onnxref, ONNX's reference evaluator: --backends torch,onnxref")
    return names


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
            if tuple(a.shape) != tuple(b.shape):
                rel, mx, ok = float("inf"), float("inf"), False
            else:
                rel, mx = errors(a, b)
                ok = within(tol, rel, mx)
            out[name] = ok
            self.records.append({"pair": list(pair), "iteration": it, "output": name, "rel_rms": rel,
                                 "max_abs": mx, "bound_rel_rms": tol.rel_rms, "floor": tol.floor, "passed": ok})
        return out


def share_words(rel: float, tol: float) -> str:
    """An error as a share of its bound, in words: `3% of its bound`, `2.4x its bound`, `exact`."""
    if rel == 0:
        return "exact (no difference)"
    share = rel / tol
    if share < 0.01:
        return "under 1% of its bound"
    return f"{share:.0%} of its bound" if share < 10 else f"{share:.0f}x its bound"


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
        """The measurement closest to (or furthest over) its bound: the largest error / bound."""
        return max(self.records, key=lambda r: r["rel_rms"] / r["bound_rel_rms"])

    def name(self) -> str:
        return f"layer {self.record.spec.layer_idx} {self.record.spec.stem}"

    def closest(self) -> str:
        """Which output came closest to its bound, in words (the metric spelled out)."""
        w = self.worst()
        floor = (f"; passes because every element is within the {w['floor']:.0e} floor"
                 if w["passed"] and w["rel_rms"] > w["bound_rel_rms"] else "")
        return (f"{w['output']} at {share_words(w['rel_rms'], w['bound_rel_rms'])} (relative RMS error "
                f"{w['rel_rms']:.1e}, bound {w['bound_rel_rms']:.0e}, largest element difference {w['max_abs']:.1e}"
                f"{floor})")

    def summary(self) -> str:
        n = len(self.cases)
        return (f"{self.name()}: {'PASS' if self.passed else 'FAIL'} {' vs '.join(self.runners)}, {n} "
                f"iteration{'s' if n != 1 else ''}; closest to its bound: {self.closest()}")

    def to_json(self) -> dict:
        s = self.record.spec
        return {"model": s.model, "layer": s.layer_idx, "mode": s.mode.value, "graph": s.stem, "dtype": s.act_dtype,
                "onnx": self.record.path, "runners": self.runners, "passed": self.passed, "cases": self.cases,
                "records": self.records}


@dataclass(frozen=True)
class CompareOptions:
    backends: tuple[str, ...] = ("torch", "onnxrt")
    device: str = "cpu"  # torch runner
    iterations: int = 2
    engines: Path | None = None  # this export's plans from `gdn-trt build`; None = build in memory from the ONNX


def compare_graph(manifest: Manifest, rec: GraphRecord, layer: GdnLayer, opts: CompareOptions) -> GraphResult:
    spec = rec.spec
    data = GraphData(spec, opts.iterations)
    runners = []
    if "torch" in opts.backends:
        runners.append(TorchRunner(layer, spec, opts.device))
    if "onnxrt" in opts.backends:
        runners.append(onnxrt_runner(manifest.root / rec.path))
    if "onnxref" in opts.backends:
        runners.append(OnnxRefRunner(manifest.root / rec.path, spec))
    if "trt" in opts.backends:
        plan = None if opts.engines is None else opts.engines / Path(rec.path).with_suffix(".plan")
        bucket = spec.bucket_for({**data.cases[0].sizes(), "S": spec.limits.pool_slots})
        runners.append(trt_runner(spec, manifest.root / rec.path, plan, bucket))
    if len(runners) < 2:
        raise ValueError(f"compare needs two backends or more, got {opts.backends}")
    results = Comparator.run(runners, data_loader=list(data))
    cmp = RelRmsCompare(spec)
    Comparator.compare_accuracy(results, compare_func=cmp, comparisons=[(0, i) for i in range(1, len(runners))])
    return GraphResult(rec, [r.name for r in runners], [vars(c) for c in data.cases], cmp.records)


def layers_of(manifest: Manifest, dtype: str) -> dict[int, GdnLayer]:
    """The exported checkpoint's layers, loaded again with the real loader (and the merged adapter, if any)."""
    ck_path = checkpoint_path(manifest)
    if ck_path is None or not ck_path.exists():
        raise FileNotFoundError(f"{manifest.path}: its checkpoint {ck_path} is not there (the manifest records it "
                                "relative to its folder: move an export together with its checkpoint); the torch "
                                "runner needs it")
    ck = load_checkpoint(ck_path)
    if ck.config.config_hash() != manifest.data["config_hash"]:
        raise ValueError(f"{ck_path}: config hash {ck.config.config_hash()} differs from the export's "
                         f"{manifest.data['config_hash']}")
    ck = exported_weights(manifest, ck)
    return {lw.index: GdnLayer(ck.config, lw, DTYPES[dtype]).eval() for lw in ck.layers}
