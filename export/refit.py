"""`gdn-trt refit`: new weights (e.g. a merged LoRA adapter) into plans built with `--refittable`, without a rebuild.

Only for plans that hold their weights (exported with `--embed-weights`): the default export takes the weights as
graph inputs, where a merged adapter is a rebinding of the weights the runtime holds and nothing is refitted. Kept
for plans used outside this runtime (trtexec, Polygraphy, a C++ loader that wants TensorRT to fold the weights);
the runtime refuses plans with weights inside, since each mode's plan would hold its own copy.

A merged adapter changes weight values only (W' = W + scale B A on the target projections): exported again with
`gdn-trt export --adapter`, the graphs keep every node and every initializer name, shape and dtype, which is what
TensorRT's `OnnxParserRefitter` needs to match the new weights to the engine's. `check_refit_pair` checks exactly
that on two ONNX files (no TensorRT needed; the test suite runs it); `refit_plans` does the refit itself:
deserialize (plugins registered first), `trt.Refitter` + `trt.OnnxParserRefitter.refit_from_file(new onnx)`, no
missing weights, `refit_cuda_engine`, serialize to a temporary file that replaces the plan only on success, and the
plan manifest updated (ONNX sha256, merged adapter digest, plan sha256). Written to TensorRT 10's Python API and not
yet run: no machine of this project has had TensorRT (docs/tensorrt.md, open items).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from gdn_trt.model.modes import LayerMode

from .artifacts import Manifest
from .digest import sha256_files


def check_refit_pair(old: Path, new: Path) -> list[str]:
    """The initializer names whose values differ between two exports of one graph; ValueError when the graphs
    differ in anything but weight values (nodes, I/O, initializer names, shapes or dtypes)."""
    a, b = (onnx.load(str(p)) for p in (old, new))

    def nodes(m):
        return [(n.op_type, n.domain, tuple(n.input), tuple(n.output)) for n in m.graph.node]

    if nodes(a) != nodes(b):
        raise ValueError(f"{new}: its nodes differ from {old}'s: not a refit of the same graph")
    io = lambda m: [(v.name, str(v.type)) for v in (*m.graph.input, *m.graph.output)]  # noqa: E731
    if io(a) != io(b):
        raise ValueError(f"{new}: graph inputs or outputs differ from {old}'s")
    wa = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer}
    wb = {t.name: numpy_helper.to_array(t) for t in b.graph.initializer}
    if set(wa) != set(wb):
        raise ValueError(f"{new}: initializers {sorted(set(wa) ^ set(wb))} are in one file only")
    bad = [n for n in wa if (wa[n].shape, wa[n].dtype) != (wb[n].shape, wb[n].dtype)]
    if bad:
        raise ValueError(f"{new}: initializers {bad} changed shape or dtype (refit replaces values only)")
    return sorted(n for n in wa if not np.array_equal(wa[n], wb[n]))


def refit_plans(manifest: Manifest, engines: Path, modes: tuple[LayerMode, ...] | None = None) -> list[Path]:
    """Refit the plans under `engines` (the folder `gdn-trt build --out` wrote for this export) with the weights of
    `manifest`'s graphs; returns the plans."""
    from .build import import_tensorrt, load_plugins

    trt = import_tensorrt()
    load_plugins()  # JIT plugins must be registered in the deserialising process
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    done = []
    for rec in manifest.select(modes):
        plan = engines / Path(rec.path).with_suffix(".plan")
        meta_path = plan.with_suffix(".json")
        if not meta_path.exists():
            raise FileNotFoundError(f"{plan}: no plan manifest; build it with gdn-trt build --refittable")
        meta = json.loads(meta_path.read_text())
        if not rec.spec.weights_inside:
            raise ValueError(f"{rec.path}: its weights are graph inputs, so there is nothing to refit: a merged "
                             "adapter is installed by binding the merged weights (Session.open on the merged "
                             "checkpoint, same plans); refit serves plans exported with --embed-weights")
        if not meta.get("refittable"):
            raise ValueError(f"{plan} was built without --refittable: rebuild it (gdn-trt build --refittable)")
        if meta["graph_spec"] != rec.spec.to_json():
            raise ValueError(f"{plan}: built from another GraphSpec than {rec.path} (limits, config or mode differ)")
        engine = runtime.deserialize_cuda_engine(plan.read_bytes())
        if engine is None or not engine.refittable:
            raise RuntimeError(f"{plan}: TensorRT could not deserialize it as a refittable engine")
        refitter = trt.Refitter(engine, logger)
        parser = trt.OnnxParserRefitter(refitter, logger)
        if not parser.refit_from_file(str(manifest.root / rec.path)):
            errs = [parser.get_error(i).desc() for i in range(parser.num_errors)]
            raise RuntimeError(f"{plan}: refit from {rec.path} failed: {errs}")
        missing = refitter.get_missing_weights()
        if missing:
            raise RuntimeError(f"{plan}: the new graph does not provide weights {list(missing)}")
        if not refitter.refit_cuda_engine():
            raise RuntimeError(f"{plan}: refit_cuda_engine failed")
        tmp = plan.with_suffix(".plan.tmp")
        tmp.write_bytes(bytes(engine.serialize()))
        tmp.replace(plan)
        adapter = manifest.data.get("adapter")
        onnx = os.path.relpath(manifest.root / rec.path, plan.parent)  # relative to the manifest's folder
        meta.update(onnx=onnx, onnx_sha256=rec.sha256, merged_adapter=adapter and adapter["digest"],
                    plan_sha256=sha256_files([plan]), plan_bytes=plan.stat().st_size, refit_from=onnx)
        meta_path.write_text(json.dumps(meta, indent=2))
        done.append(plan)
    return done
