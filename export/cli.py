"""`gdn-trt export | build | compare`: thin argparse layers over `artifacts`, `build` and `compare`.

    gdn-trt export --preset tiny-3.5 --out artifacts/onnx     # synthetic checkpoint (seed 0) under the out dir
    gdn-trt export --checkpoint DIR [--modes prefill,decode] [--layers all|variants|0,2] [--dtype float32]
    gdn-trt export --checkpoint DIR --adapter LORA_DIR          # a PEFT LoRA adapter merged into the weights
    gdn-trt export --checkpoint DIR --lora-slots 4 --lora-rank 16   # per-sequence adapter slots as graph inputs
    gdn-trt export --preset tiny-3.5 --stack                    # one graph per run of consecutive GDN layers
    gdn-trt export --preset tiny-3.5 --aot                      # every node one kernel (AOT plugins)
    gdn-trt build --onnx artifacts/onnx --out engines [--refittable]   # needs TensorRT >= 10.8
    gdn-trt build --onnx artifacts/onnx-aot --plugins aot       # plans that run without Python (TensorRT >= 10.9)
    gdn-trt refit --engines engines --onnx artifacts/onnx-merged    # new weights into --embed-weights plans
    gdn-trt compare --onnx artifacts/onnx [--backends torch,onnxrt,trt] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from gdn_trt.model.config import DEFAULT_PRESET, preset
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import LayerMode

from .spec import Limits

DEFAULT_ONNX = Path("artifacts/onnx")


def _modes(text: str | None) -> tuple[LayerMode, ...] | None:
    if not text:
        return None
    try:
        return tuple(LayerMode(m.strip()) for m in text.split(",") if m.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"modes are {[m.value for m in LayerMode]}, got {text!r}") from None


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="ONNX graphs of every layer mode (+ manifest)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", type=Path, help="HF checkpoint directory")
    src.add_argument("--preset", help=f"make a synthetic checkpoint of this preset (seed 0); default {DEFAULT_PRESET}")
    p.add_argument("--out", type=Path, default=DEFAULT_ONNX)
    p.add_argument("--modes", type=_modes, help="comma-separated LayerMode values (default: all)")
    p.add_argument("--layers", default="all", help="all | variants (first layer of each variant) | 0,2,...")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="activation dtype (default: config)")
    p.add_argument("--max-seqs", type=int, default=Limits.max_seqs)
    p.add_argument("--max-tokens", type=int, default=Limits.max_tokens)
    p.add_argument("--max-draft", type=int, default=Limits.max_draft)
    p.add_argument("--pool-slots", type=int, default=Limits.pool_slots)
    p.add_argument("--seq-buckets", type=_ints, default=(), help="upper bounds of the N profiles, e.g. 8,64")
    p.add_argument("--token-buckets", type=_ints, default=(), help="upper bounds of the PREFILL T profiles")
    p.add_argument("--adapter", type=Path, help="PEFT LoRA adapter directory merged into the weights (W + scale B A)")
    p.add_argument("--lora-slots", type=int, default=0,
                   help="per-sequence LoRA: adapter slots as graph inputs (0 = none)")
    p.add_argument("--lora-rank", type=int, default=LoraLimits.max_rank, help="rank of every LoRA slot")
    p.add_argument("--lora-targets", default="", help="comma-separated HF target names (default: all of the family)")
    p.add_argument("--stack", action="store_true", default=False,
                   help="one graph per mode for each run of consecutive GDN layers (one enqueue per run and step) "
                        "instead of one per layer; default: per layer")
    p.add_argument("--aot", action="store_true", default=False,
                   help="the AOT form: the chunked GDN op and the conv prefill as chains of one-kernel pass plugins, "
                        "so every node can take TensorRT's ahead-of-time kernel (gdn-trt build --plugins aot); "
                        "default: one node per op (JIT plugins)")
    p.add_argument("--embed-weights", action="store_true", default=False,
                   help="weights inside the graphs as initializers (one copy per mode's plan; for refit and cost "
                        "measurements) instead of graph inputs bound from one copy per layer; default: inputs")
    p.set_defaults(func=run_export)

    p = sub.add_parser("build", help="TensorRT plans from exported graphs (needs TensorRT >= 10.8)")
    p.add_argument("--onnx", type=Path, default=DEFAULT_ONNX, help="export folder (a model folder or its parent)")
    p.add_argument("--out", type=Path, default=Path("engines"))
    p.add_argument("--modes", type=_modes)
    p.add_argument("--plugins", choices=("auto", "jit", "aot", "none"), default="auto",
                   help="how the custom nodes run: jit (Python QDPs: Python and Triton in the serving process), aot "
                        "(compiled kernels in the plan, no Python; TensorRT >= 10.9, needs an `export --aot` graph), "
                        "none (function bodies inlined); auto = aot for an --aot export, else jit")
    p.add_argument("--no-plugins", action="store_true", help="= --plugins none")
    p.add_argument("--refittable", action="store_true", help="plans whose weights `gdn-trt refit` can replace")
    p.set_defaults(func=run_build)

    p = sub.add_parser("refit", help="replace the weights of refittable plans by those of another export")
    p.add_argument("--engines", type=Path, default=Path("engines"), help="plans built with --refittable")
    p.add_argument("--onnx", type=Path, required=True, help="export of the same graphs with the new weights")
    p.add_argument("--modes", type=_modes)
    p.set_defaults(func=run_refit)

    p = sub.add_parser("compare", help="torch vs ONNX Runtime vs TensorRT on the exported graphs (Polygraphy)")
    p.add_argument("--onnx", type=Path, default=DEFAULT_ONNX, help="export folder (a model folder or its parent)")
    p.add_argument("--modes", type=_modes)
    p.add_argument("--backends", default="auto", help="comma-separated from torch,onnxrt,trt; auto = torch,onnxrt "
                   "and trt when TensorRT imports")
    p.add_argument("--device", default="auto", help="torch runner device: cpu | cuda | auto")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--engines", type=Path, help="plans from gdn-trt build (default: build in memory)")
    p.add_argument("--out", type=Path, default=Path("artifacts/compare"))
    p.add_argument("--verbose", action="store_true", help="Polygraphy's per-iteration output statistics")
    p.set_defaults(func=run_compare)


def run_export(args) -> int:
    from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
    from .artifacts import ExportPlan, export_checkpoint

    if args.checkpoint is None:
        name = args.preset or DEFAULT_PRESET
        preset(name)
        path = make_synthetic_checkpoint(name, args.out / "checkpoints" / name, seed=0)
        print(f"synthetic checkpoint of preset {name} (seed 0): {path}")
    else:
        path = args.checkpoint
    ck = load_checkpoint(path)
    lora = None
    if args.lora_slots:
        lora = LoraLimits(args.lora_slots, args.lora_rank, tuple(t for t in args.lora_targets.split(",") if t))
        lora.resolve(ck.config)
    limits = Limits(args.max_seqs, args.max_tokens, args.max_draft, args.pool_slots, args.seq_buckets,
                    args.token_buckets, lora)
    plan = ExportPlan(args.modes or tuple(LayerMode), args.layers, args.dtype, limits, args.adapter, args.stack,
                      not args.embed_weights, args.aot)
    total = len(plan.graph_layers(ck)) * len(plan.modes)
    with tqdm(total=total, desc=f"export {ck.config.name}", unit="graph", file=sys.stderr) as bar:
        def progress(rec):
            tqdm.write(rec.summary())
            bar.update(1)

        manifest = export_checkpoint(ck, args.out, plan, progress)
    merged = json.loads(manifest.read_text())["adapter"]
    if merged:
        print(f"merged LoRA adapter {merged['name']} (digest {merged['digest']}; {merged['skipped_tensors']} tensors "
              "of modules outside the GDN layers not used)")
    if lora:
        print(f"per-sequence LoRA: {lora.max_adapters} adapter slots of rank {lora.max_rank} on "
              f"{', '.join(t.value for t in lora.resolve(ck.config))}")
    print(f"{total} graphs, manifest: {manifest}")
    return 0


def _tensorrt_or_none(command: str):
    """The tensorrt module, or None after saying on stderr how to install it (the caller exits 2)."""
    from .build import TrtUnavailable, import_tensorrt

    try:
        return import_tensorrt()
    except TrtUnavailable as e:
        print(f"gdn-trt {command}: {e}", file=sys.stderr)
        return None


def run_build(args) -> int:
    from .artifacts import Manifest
    from .build import BuildOptions, build_graph, plugin_label

    trt = _tensorrt_or_none("build")
    if trt is None:
        return 2
    for m in Manifest.find(args.onnx):
        impl = "none" if args.no_plugins else args.plugins
        if impl == "auto":
            impl = "aot" if m.data.get("form") == "aot" else "jit"
        opts = BuildOptions(args.out, plugins=impl, refittable=args.refittable)
        form = m.data.get("form", "jit")
        print(f"TensorRT {trt.__version__}; plugins: {plugin_label(impl)}; {m.data['model']} ({form} form)")
        for rec in tqdm(m.select(args.modes), desc=f"build {m.data['model']}", unit="plan", file=sys.stderr):
            plan = build_graph(m, rec, opts)
            tqdm.write(f"{rec.spec.where} {rec.spec.stem}: {len(rec.spec.buckets)} profiles, "
                       f"{plan.stat().st_size / 1e6:.2f} MB -> {plan}")
    return 0


def run_refit(args) -> int:
    from .artifacts import Manifest
    from .refit import refit_plans

    trt = _tensorrt_or_none("refit")
    if trt is None:
        return 2
    print(f"TensorRT {trt.__version__}")
    for m in Manifest.find(args.onnx):
        for plan in refit_plans(m, args.engines, args.modes):
            print(f"refit {plan}")
    return 0


def _backends(text: str) -> tuple[str, ...]:
    from .build import TrtUnavailable, import_tensorrt

    if text != "auto":
        names = tuple(b.strip() for b in text.split(",") if b.strip())
        bad = [b for b in names if b not in ("torch", "onnxrt", "trt")]
        if bad:
            raise SystemExit(f"gdn-trt compare: unknown backends {bad}; choose from torch, onnxrt, trt")
        return names
    try:
        import_tensorrt()
        return ("torch", "onnxrt", "trt")
    except TrtUnavailable as e:
        print(f"compare: no TensorRT runner ({str(e).split('.')[0]}); comparing torch and onnxrt")
        return ("torch", "onnxrt")


def run_compare(args) -> int:
    import torch

    from .artifacts import Manifest
    from .build import TrtUnavailable
    from .compare import CompareOptions, compare_graph, layers_of

    if not args.verbose:
        from polygraphy.logger import G_LOGGER

        G_LOGGER.module_severity = G_LOGGER.WARNING  # per-output stats of every iteration: the JSON keeps them
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    opts = CompareOptions(_backends(args.backends), device, args.iterations, args.engines, args.out)
    results = []
    try:
        for m in Manifest.find(args.onnx):
            layers = layers_of(m, m.data["dtype"])
            recs = m.select(args.modes)
            for rec in tqdm(recs, desc=f"compare {m.data['model']}", unit="graph", file=sys.stderr):
                res = compare_graph(m, rec, layers, opts)
                tqdm.write(res.summary())
                results.append(res)
    except TrtUnavailable as e:
        print(f"gdn-trt compare: {e}", file=sys.stderr)
        return 2
    failed = [r for r in results if not r.passed]
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"backends": list(opts.backends), "device": device, "passed": not failed,
               "graphs": [{k: v for k, v in r.to_json().items() if k != "records"} for r in results]}
    (args.out / "compare.json").write_text(json.dumps(summary, indent=2))
    print(f"{len(results) - len(failed)}/{len(results)} graphs within tolerance; results: {args.out}")
    return 1 if failed or not results else 0


def main(argv: list[str] | None = None) -> int:
    """The three commands without the rest of `gdn-trt` (tests, `python -m gdn_trt.export.cli`)."""
    parser = argparse.ArgumentParser(prog="gdn-trt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
