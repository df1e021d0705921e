"""`gdn-trt compare`: the same inputs through torch, ONNX Runtime (or ONNX's reference evaluator) and TensorRT with
Polygraphy's `Comparator`.

Per exported graph: the GraphSpec-aware inputs of `data.py`, `Comparator.run` over the runners (torch first: it
is the reference), `Comparator.compare_accuracy` with `RelRmsCompare` (every runner against torch, every output
against its bound from `tolerances.py`). `report.py` writes one JSON and one plot per run. Graphs are compared in
the dtype they were exported in: a bfloat16 export (every real checkpoint) runs in ONNX's reference evaluator
(`runners.OnnxRefRunner`), since ONNX Runtime's CPU provider has no bf16 kernels. Every runner gets the layers'
real weights on the weight inputs (`weight_feed`), and a stack graph is compared against its run of torch layers.
`polygraphy_loader` gives the same feeds to Polygraphy's own CLI (the `<stem>_data.py` scripts of an export).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from polygraphy.comparator import Comparator

from gdn_trt.model.checkpoint import load_checkpoint
from gdn_trt.model.config import Shard
from gdn_trt.model.layer import GdnLayer

from .artifacts import GraphRecord, Manifest, checkpoint_path, export_layer, exported_weights
from .data import GraphData, loader_graph
from .runners import OnnxRefRunner, TorchRunner, from_torch, onnxrt_runner, trt_runner
from .spec import GraphSpec, Role
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
        """'layer 3 decode' or 'layers 3-5 decode' (a stack graph)."""
        return f"{self.record.spec.where} {self.record.spec.stem}"

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
        return {"model": s.model, "layer": s.layer_idx, "layers": list(s.layer_ids), "mode": s.mode.value,
                "graph": s.stem, "dtype": s.act_dtype,
                "onnx": self.record.path, "runners": self.runners, "passed": self.passed, "cases": self.cases,
                "records": self.records}


@dataclass(frozen=True)
class CompareOptions:
    backends: tuple[str, ...] = ("torch", "onnxrt")
    device: str = "cpu"  # torch runner
    iterations: int = 2
    engines: Path | None = None  # this export's plans from `gdn-trt build`; None = build in memory from the ONNX


def weight_feed(spec: GraphSpec, layers: list[GdnLayer]) -> dict:
    """The value of every weight input of `spec` (role weight) from its layer's buffers, by input name: numpy, or
    torch where numpy lacks the dtype (bfloat16)."""
    by_index = {la.index: la.weights() for la in layers}
    return {t.name: from_torch(by_index[t.layer][t.local]) for t in spec.inputs if t.role is Role.WEIGHT}


def compare_graph(manifest: Manifest, rec: GraphRecord, layers: GdnLayer | dict[int, GdnLayer] | None,
                  opts: CompareOptions) -> GraphResult:
    """`layers`: the graph's layer, or the export's layers by index (`layers_of`; a stack graph needs its run), or
    None to load the graph's layers from the export's checkpoint. They are the torch runner's layers and the values
    of the weight inputs (which every runner needs, torch among the backends or not)."""
    spec = rec.spec
    if layers is None:
        layers = layers_of(manifest, spec.act_dtype, spec.layer_ids)
    elif isinstance(layers, GdnLayer):
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


def layers_of(manifest: Manifest, dtype: str, ids: tuple[int, ...] | None = None) -> dict[int, GdnLayer]:
    """The exported checkpoint's layers (those of `ids`, default all), loaded again with the real loader (and the
    merged adapter, if any)."""
    ck_path = checkpoint_path(manifest)
    if ck_path is None or not ck_path.exists():
        raise FileNotFoundError(f"{manifest.path}: its checkpoint {ck_path} is not there (the manifest records it "
                                "relative to its folder: move an export together with its checkpoint); the torch "
                                "runner needs it")
    tp = manifest.data.get("tp")  # a rank's export: read its slices, its layers leave the reduction to the host
    ck = load_checkpoint(ck_path, None if tp is None else Shard(tp["size"], tp["rank"]))
    if ck.config.config_hash() != manifest.data["config_hash"]:
        raise ValueError(f"{ck_path}: config hash {ck.config.config_hash()} differs from the export's "
                         f"{manifest.data['config_hash']}")
    ck = exported_weights(manifest, ck)
    return {lw.index: export_layer(ck.config, lw, dtype) for lw in ck.layers if ids is None or lw.index in ids}


def polygraphy_loader(script: str | Path, iterations: int = 2):
    """The `load_data` of a loader script written by `data.write_loader_script`: a no-argument generator function
    of the feeds `compare_graph` gives the script's graph (a layer's or a stack's), its GraphSpec read from the
    export's manifest.json (the script's folder's parent) and its weight inputs the layers' real weights
    (`layers_of`: the export's checkpoint, with any merged adapter; graphs with the weights inside need none)."""
    root, graph = loader_graph(script)
    manifest = Manifest.load(root)
    found = [g for g in manifest.graphs if Path(g.path).as_posix() == graph]
    if not found:
        raise FileNotFoundError(f"{manifest.path} lists no graph {graph}: export again")
    spec = found[0].spec
    weights = None
    if not spec.weights_inside:
        layers = layers_of(manifest, manifest.data["dtype"], spec.layer_ids)
        weights = weight_feed(spec, [layers[i] for i in spec.layer_ids])
    data = GraphData(spec, iterations, weights=weights)

    def load_data():
        yield from data

    return load_data
