"""Exported model folders: every (layer, mode) graph of a checkpoint, and the manifest that lists them.

Layout (the folder given, `<out>/`): `layer<i>/<mode>[+hc][+ple][+lora].onnx` per GDN layer and mode, or with
`--stack` `stack<a>-<b>/<stem>.onnx` per run of consecutive GDN layers (`spec.gdn_runs`; a run of one layer keeps
its per-layer graph), beside each graph its Polygraphy data loader `<stem>_data.py` (`data.py`: `polygraphy run
<graph> --onnxrt --data-loader-script <stem>_data.py`, the weight inputs fed from the checkpoint), and
`manifest.json` with the checkpoint path, config hash, limits, tool versions, whether the weights are graph inputs
(the default) or inside the graphs (`--embed-weights`, + `.onnx.data`), the LoRA adapter merged into the weights
(path and digest; `ExportPlan.adapter`), the form (`jit`, or `aot` with `--aot`: the multi-kernel ops as chains of
pass plugins, `aot_form.py`), the engine config a loader reads (`engine_config.py`), and per graph its GraphSpec,
layers, node counts, size and sha256. Every path in the manifest is relative to its folder, so an export moved
together with its checkpoint (a preset's synthetic checkpoint sits inside it) keeps resolving them.
`gdn-trt build` and `gdn-trt compare` read the manifest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import onnx
import torch

from gdn_trt.model.checkpoint import Checkpoint
from gdn_trt.model.config import GdnConfig, Shard
from gdn_trt.model.dtypes import DTYPES
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.peft import load_adapter, merge_checkpoint
from gdn_trt.model.lora import shard_adapter
from gdn_trt.model.tp import TpSpec, full_config
from gdn_trt.plugins.spec import NAMESPACE

from .data import write_loader_script
from .digest import graph_files, sha256_files
from .engine_config import engine_config
from .onnx_export import export_graph
from .spec import GraphSpec, Limits, Variant, gdn_runs, graph_spec, rank_parts

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ExportPlan:
    """What to export from one checkpoint."""

    modes: tuple[LayerMode, ...] = tuple(LayerMode)
    layers: str = "all"  # "all", "variants" (first GDN layer of each variant) or comma-separated indices
    dtype: str | None = None  # activation dtype; None = the checkpoint's
    limits: Limits = Limits()
    adapter: Path | None = None  # a PEFT LoRA adapter merged into the weights before export (W + scale B A)
    stack: bool = False  # one graph per run of consecutive GDN layers (`gdn_runs`) instead of one per layer
    weights: bool = True  # weights as graph inputs; False = inside the graphs as initializers (--embed-weights)
    aot: bool = False  # the AOT form: multi-kernel ops as chains of one-kernel pass plugins (`aot_form.py`)

    def graph_layers(self, ck: Checkpoint | GdnConfig) -> list[tuple[int, ...]]:
        """The layers of each graph to export (per mode): one layer each, or with `stack` each run of the planned
        layers (`gdn_runs`: a run ends at a layer left out, an attention layer or a GDN layer whose FFN the host
        runs)."""
        cfg = ck if isinstance(ck, GdnConfig) else ck.config
        ids = self.layer_ids(cfg)
        return gdn_runs(cfg, tuple(ids)) if self.stack else [(i,) for i in ids]

    def layer_ids(self, ck: Checkpoint | GdnConfig) -> list[int]:
        cfg = ck if isinstance(ck, GdnConfig) else ck.config
        ids = list(cfg.gdn_layer_ids)
        if self.layers == "all":
            return ids
        if self.layers == "variants":
            seen: dict[Variant, int] = {}
            for i in ids:
                seen.setdefault(Variant.of(cfg, i), i)
            return sorted(seen.values())
        want = [int(s) for s in self.layers.split(",") if s.strip()]
        bad = [i for i in want if i not in ids]
        if bad:
            raise ValueError(f"layers {bad} are not GDN layers of {cfg.name}; its GDN layers are {ids} "
                             "(--layers all, variants or some of those)")
        return want


@dataclass(frozen=True)
class GraphRecord:
    """One exported graph as listed in the manifest (paths relative to the export folder)."""

    spec: GraphSpec
    path: str
    nodes: int
    custom_nodes: int
    bytes: int
    sha256: str

    def summary(self) -> str:
        s = self.spec
        return (f"{s.where} {s.stem}: {len(s.inputs)} inputs, {len(s.outputs)} outputs, {self.nodes} nodes "
                f"({self.custom_nodes} {NAMESPACE}), {self.bytes / 1e6:.2f} MB -> {self.path}")

    def to_json(self) -> dict:
        part = {} if self.spec.part is None else {"part": self.spec.part.value}
        return {"layer": self.spec.layer_idx, "layers": list(self.spec.layer_ids), "mode": self.spec.mode.value,
                "variant": self.spec.variant.value, **part,
                "path": self.path, "nodes": self.nodes, "custom_nodes": self.custom_nodes, "bytes": self.bytes,
                "sha256": self.sha256, "graph_spec": self.spec.to_json()}

    @staticmethod
    def from_json(d: dict) -> "GraphRecord":
        return GraphRecord(GraphSpec.from_json(d["graph_spec"]), d["path"], d["nodes"], d["custom_nodes"],
                           d["bytes"], d["sha256"])


def _record(spec: GraphSpec, path: Path, root: Path) -> GraphRecord:
    model = onnx.load(str(path), load_external_data=False)
    files = graph_files(path)
    return GraphRecord(spec, str(path.relative_to(root)), len(model.graph.node),
                       sum(n.domain == NAMESPACE for n in model.graph.node),
                       sum(f.stat().st_size for f in files), sha256_files(files))


def _portable(path: Path | None, root: Path) -> str | None:
    """`path` relative to the export folder `root` (readers resolve it against the manifest's folder)."""
    if path is None:
        return None
    return os.path.relpath(Path(path).resolve(), root.resolve())


def checkpoint_path(manifest: "Manifest") -> Path | None:
    ck = manifest.data.get("checkpoint")
    return None if ck is None else (manifest.root / ck).resolve()


def exported_weights(manifest: "Manifest", ck: Checkpoint) -> Checkpoint:
    """The weights the graphs of `manifest` hold: `ck`, with the manifest's merged adapter merged again (its digest
    checked, so a changed adapter file is an error, not a silent mismatch)."""
    ad = manifest.data.get("adapter")
    if ad is None:
        return ck
    path = (manifest.root / ad["path"]).resolve()
    adapter = rank_adapter(path, ck.config, ad["name"])
    if adapter.digest() != ad["digest"]:
        raise ValueError(f"{path}: adapter digest {adapter.digest()} differs from the export's {ad['digest']} "
                         "(the adapter changed since the export)")
    return merge_checkpoint(ck, adapter)


def tp_fields(cfg: GdnConfig) -> dict:
    """What a rank's manifest and engine config record (only at tp > 1: a whole model's files are unchanged)."""
    return {"size": cfg.tp_size, "rank": cfg.tp_rank, "reduce": "host"}


def export_layer(cfg: GdnConfig, lw, dtype: str) -> GdnLayer:
    """The layer a graph is traced from. A tensor-parallel rank's (`cfg.tp_size` > 1) leaves its all-reduce to the
    host: the graph outputs the rank's partial sum and holds no collective. Why not TensorRT's all-reduce inside
    the plan: it ties the plan to one communicator and to TensorRT-LLM's plugin library, and the engines that host
    these layers (vLLM, SGLang, TensorRT-LLM) own their communicator and fuse the reduction with their residual add
    and RMSNorm; the runtime does it with `torch.distributed` where no host stands after the layer."""
    return GdnLayer(cfg, lw, DTYPES[dtype], TpSpec(host_reduce=True) if cfg.tp_size > 1 else None).eval()


def rank_adapter(path: Path, cfg: GdnConfig, name: str | None = None):
    """A PEFT adapter for `cfg`: loaded for the whole model and cut for a tensor-parallel rank's config."""
    whole = full_config(cfg)
    adapter = load_adapter(path, whole, name)
    return adapter if cfg.tp_size == 1 else shard_adapter(adapter, whole, Shard(cfg.tp_size, cfg.tp_rank))


def rank_folder(out: Path, rank: int) -> Path:
    """Where rank `rank`'s graphs of `gdn-trt export --tp N` go (and its plans under `gdn-trt build --out`)."""
    return Path(out) / f"rank{rank}"


def export_checkpoint(ck: Checkpoint, out: Path, plan: ExportPlan,
                      progress: Callable[[GraphRecord], None] | None = None) -> Path:
    """Export every planned (layer, mode) of `ck` into the folder `out`; write and return the manifest path.
    `progress(record)` is called after each graph."""
    cfg = ck.config
    dtype = plan.dtype or cfg.dtype
    root = Path(out)
    merged = None
    if plan.adapter is not None:
        adapter = rank_adapter(plan.adapter, cfg)
        ck = merge_checkpoint(ck, adapter)
        merged = {"name": adapter.name, "digest": adapter.digest(), "path": _portable(plan.adapter, root),
                  "skipped_tensors": len(adapter.skipped)}
    by_index = {lw.index: lw for lw in ck.layers}
    records = []
    for ids in plan.graph_layers(ck):
        layers = [export_layer(cfg, by_index[i], dtype) for i in ids]
        for mode in plan.modes:
            for part in rank_parts(cfg, ids[0]):  # a rank's dense-MLP layer: its mixer and mlp graphs
                spec = graph_spec(cfg, ids if len(ids) > 1 else ids[0], mode, plan.limits, dtype, plan.weights,
                                  plan.aot, part)
                path = export_graph(layers, spec, root / spec.folder / f"{spec.stem}.onnx")
                rec = _record(spec, path, root)
                write_loader_script(path, spec)
                records.append(rec)
                if progress:
                    progress(rec)
    manifest = {
        "model": cfg.name, "config_hash": cfg.config_hash(), "checkpoint": _portable(ck.path, root),
        "adapter": merged, "dtype": dtype, "limits": GraphSpec.to_json(records[0].spec)["limits"] if records else None,
        "weights": "inputs" if plan.weights else "inside", "stack": plan.stack, "form": "aot" if plan.aot else "jit",
        "engine_config": engine_config(cfg, dtype, plan.limits, [r.spec for r in records], plan.weights),
        "versions": {"torch": torch.__version__, "onnx": onnx.__version__},
        "graphs": [r.to_json() for r in records],
    }
    if cfg.tp_size > 1:
        manifest["tp"] = tp_fields(cfg)
    path = root / MANIFEST
    path.write_text(json.dumps(manifest, indent=2))
    return path


@dataclass(frozen=True)
class Manifest:
    """A model folder read back: its JSON and the graph records."""

    path: Path
    data: dict
    graphs: tuple[GraphRecord, ...]

    @property
    def root(self) -> Path:
        return self.path.parent

    @staticmethod
    def load(path: str | Path) -> "Manifest":
        p = Path(path)
        if p.is_dir():
            p = p / MANIFEST
        if not p.exists():
            raise FileNotFoundError(f"{p}: no export manifest (run `gdn-trt export` first)")
        data = json.loads(p.read_text())
        return Manifest(p, data, tuple(GraphRecord.from_json(g) for g in data["graphs"]))

    @staticmethod
    def find(path: str | Path) -> list["Manifest"]:
        """The manifest of a model folder, or those of every model folder directly under `path`."""
        p = Path(path)
        if (p / MANIFEST).exists():
            return [Manifest.load(p)]
        found = sorted(p.glob(f"*/{MANIFEST}"))
        if not found:
            raise FileNotFoundError(f"{p}: no {MANIFEST} here or in its subfolders (run `gdn-trt export` first)")
        return [Manifest.load(f) for f in found]

    def select(self, modes: tuple[LayerMode, ...] | None = None) -> list[GraphRecord]:
        return [g for g in self.graphs if modes is None or g.spec.mode in modes]
