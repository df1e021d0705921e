"""`gdn-trt export | build | refit | compare`: thin argparse layers over `artifacts`, `build`, `refit` and `compare`.

Every flag's help says its default; every command's `--help` ends with examples. Bad arguments and paths are
refused in one line before anything is written (`cliargs.py` has the exit codes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tqdm import tqdm

from gdn_trt.model.config import DEFAULT_PRESET, GdnConfig, preset
from gdn_trt.model.dtypes import ACTIVATION_DTYPES
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import LayerMode

from . import cliargs
from .spec import Limits

ONNX_ROOT = Path("artifacts/onnx")  # the default export folder is <this>/<model>
ENGINES_ROOT = Path("engines")  # the default plans folder is <this>/<model>
MODES = ",".join(m.value for m in LayerMode)

EXPORT_EXAMPLES = """examples:
  gdn-trt export --preset tiny-3.5                    # synthetic checkpoint -> artifacts/onnx/tiny-3.5/
  gdn-trt export --checkpoint /models/Qwen3-Next-80B-A3B --layers variants --modes decode,prefill --out exp/next
  gdn-trt export --checkpoint DIR --max-batch-size 64 --max-input-len 8192 --max-draft-len 4 --pool-slots 65 \\
      --seq-buckets 8,64 --token-buckets 512,8192   # TensorRT-LLM names accepted for the three limits
  gdn-trt export --checkpoint DIR --adapter LORA_DIR                 # a PEFT LoRA adapter merged into the weights
  gdn-trt export --checkpoint DIR --lora-slots 4 --lora-rank 16      # per-sequence adapter slots as graph inputs
  gdn-trt export --preset tiny-3.5 --stack           # one graph per run of consecutive GDN layers: stack<a>-<b>/
  gdn-trt export --checkpoint DIR --embed-weights    # weights inside the graphs (for gdn-trt refit, trtexec)
  gdn-trt export --preset tiny-3.5 --aot --out artifacts/onnx-aot   # every node one kernel (AOT plugins)
  gdn-trt export --preset tiny-4exp-tp --tp 2        # one graph set per tensor-parallel rank: <out>/rank<r>/
  gdn-trt export --preset tiny-3.5-tp --tp 2         # dense-MLP layers: <mode>+mixer.onnx + <mode>+mlp.onnx per rank

The folder gets manifest.json, layer<i>/<mode>.onnx (stack<a>-<b>/<mode>.onnx with --stack; + .onnx.data with
--embed-weights) and beside each graph a Polygraphy data loader (the weight inputs fed from the checkpoint):
  polygraphy run OUT/layer0/decode.onnx --onnxrt --data-loader-script OUT/layer0/decode_data.py
"""

BUILD_EXAMPLES = """examples:
  gdn-trt build --onnx artifacts/onnx/tiny-3.5       # -> engines/tiny-3.5/layer<i>/<mode>.plan + config.json
  gdn-trt build --onnx exp/next --out /srv/engines/next --workspace 4G --timing-cache /srv/next.cache \\
      --builder-optimization-level 5 --verbose
  gdn-trt build --onnx exp/next-embedded --refittable   # an --embed-weights export: plans refit can give new weights
  gdn-trt build --onnx artifacts/onnx-aot --out engines/aot   # an --aot export: plans that run without Python
                                                              # (--plugins auto picks aot; TensorRT >= 10.9)

Flags TensorRT users know: trtexec --memPoolSize=workspace:4096 (MiB), --timingCacheFile, --builderOptimizationLevel,
--verbose; Polygraphy --pool-limit workspace:4G, --builder-optimization-level; TensorRT-LLM --max_batch_size,
--max_input_len, --max_draft_len (here they check the export's limits, which fix the graphs' shapes). Needs TensorRT
>= 10.8 (exit 2 without it; docs/tensorrt.md).
"""

REFIT_EXAMPLES = """examples:
  gdn-trt refit --engines engines/M --onnx artifacts/onnx-math/M    # the merged export's weights into the plans

The plans must come from `gdn-trt build --refittable` of an export with the same GraphSpecs and the weights inside
(`gdn-trt export --embed-weights`): with weights as graph inputs (the default) a merged adapter is a rebinding of
the weights the runtime holds, and there is nothing to refit. Needs TensorRT >= 10.8.
"""

COMPARE_EXAMPLES = """examples:
  gdn-trt compare --onnx artifacts/onnx/tiny-3.5            # torch vs ONNX Runtime -> artifacts/onnx/tiny-3.5/compare/
  gdn-trt compare --onnx exp/next --modes decode --device cuda --iterations 4
  gdn-trt compare --onnx exp/next --engines engines/next --backends torch,onnxrt,trt   # a TensorRT machine

Backends: torch (the reference), onnxrt (ONNX Runtime, float32 and float16 exports), onnxref (ONNX's reference
evaluator: bfloat16 exports, which ONNX Runtime's CPU provider cannot run), trt (TensorRT). Each output of each
iteration must be within its bound (export/tolerances.py): relative RMS error = rms(other - torch) / rms(torch).
Writes compare.json (every measurement) and compare.png (error / bound of every graph and output, log scale).
"""


def _modes(text: str) -> tuple[LayerMode, ...]:
    try:
        return tuple(LayerMode(m.strip()) for m in text.split(",") if m.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"modes are {MODES}; got {text!r}") from None


def _limit_flags(p: argparse.ArgumentParser, defaults: bool) -> None:
    """--max-seqs / --max-tokens / --max-draft with the TensorRT-LLM names as aliases (export sets the limits;
    build, with `defaults` off, checks them against the export's)."""
    what = "" if defaults else "check (default: none) that the export has this many "
    p.add_argument("--max-seqs", "--max-batch-size", "--max_batch_size", dest="max_seqs", type=cliargs.positive_int,
                   default=Limits.max_seqs if defaults else None,
                   help=f"{what or ''}sequences in one multi-sequence step, N (TensorRT-LLM: max_batch_size)")
    p.add_argument("--max-tokens", "--max-input-len", "--max_input_len", "--max-num-tokens", "--max_num_tokens",
                   dest="max_tokens", type=cliargs.positive_int, default=Limits.max_tokens if defaults else None,
                   help=f"{what}tokens of one prefill step, all sequences together, T (TensorRT-LLM: max_input_len, "
                        "max_num_tokens)")
    p.add_argument("--max-draft", "--max-draft-len", "--max_draft_len", dest="max_draft", type=cliargs.positive_int,
                   default=Limits.max_draft if defaults else None,
                   help=f"{what}draft tokens per sequence in one verify step, K (TensorRT-LLM: max_draft_len)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="ONNX graphs of every layer mode of a checkpoint (+ manifest)",
                       description="Export the GDN layers of a checkpoint: one ONNX graph per layer and mode, whose "
                                   "recurrent parts are gdn_trt custom nodes (with ONNX function bodies).",
                       epilog=EXPORT_EXAMPLES)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", type=cliargs.checkpoint_dir,
                     help="a Hugging Face checkpoint directory of Qwen3-Next, Qwen3.5 or Qwen4-Exp (default: none, "
                          "see --preset)")
    src.add_argument("--preset", type=cliargs.preset_name,
                     help=f"instead of a checkpoint: a synthetic one of this preset (seed 0), written into the export "
                          f"folder (default when neither is given: {DEFAULT_PRESET})")
    p.add_argument("--out", type=Path, help=f"the export folder (default: {ONNX_ROOT}/<model>)")
    p.add_argument("--modes", type=_modes, help=f"comma-separated layer modes (default: all, {MODES})")
    p.add_argument("--layers", type=cliargs.layers, default="all",
                   help="all, variants (the first GDN layer of each kind) or layer indices such as 0,2")
    p.add_argument("--dtype", choices=ACTIVATION_DTYPES, help="activation dtype (default: the checkpoint's)")
    _limit_flags(p, defaults=True)
    p.add_argument("--pool-slots", type=cliargs.positive_int, default=Limits.pool_slots,
                   help="rows of every state pool, S (at least --max-seqs; a session's pools must fit)")
    p.add_argument("--seq-buckets", type=cliargs.ints, default=(),
                   help="upper bounds of the N profiles, e.g. 8,64 (default: one profile up to --max-seqs)")
    p.add_argument("--token-buckets", type=cliargs.ints, default=(),
                   help="upper bounds of the prefill T profiles, e.g. 512,8192 (default: one up to --max-tokens)")
    p.add_argument("--adapter", type=cliargs.adapter_dir,
                   help="a PEFT LoRA adapter directory merged into the weights, W + scale B A (default: none)")
    p.add_argument("--lora-slots", type=cliargs.count, default=0,
                   help="per-sequence LoRA: adapter slots as graph inputs (0 = none)")
    p.add_argument("--lora-rank", type=cliargs.positive_int, default=LoraLimits.max_rank, help="rank of every slot")
    p.add_argument("--lora-targets", default="",
                   help="comma-separated HF target names of the slots (default: every target of the family)")
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
    p.add_argument("--tp", type=cliargs.positive_int, default=1,
                   help="tensor-parallel size: one graph set per rank in <out>/rank<r>/, each rank's heads, its graphs "
                        "output the rank's partial sum (the host all-reduces); default: 1, the whole model in <out>")
    p.set_defaults(func=run_export)

    p = sub.add_parser("build", help="TensorRT plans from exported graphs (needs TensorRT >= 10.8)",
                       description="Build one TensorRT plan per exported graph, with a JSON manifest beside it.",
                       epilog=BUILD_EXAMPLES)
    p.add_argument("--onnx", type=cliargs.existing_dir, default=ONNX_ROOT,
                   help="an export folder, or a folder of export folders")
    p.add_argument("--out", type=Path,
                   help=f"the plans folder (default: {ENGINES_ROOT}/<model>); with several exports, <out>/<model>")
    p.add_argument("--modes", type=_modes, help="comma-separated layer modes (default: all exported)")
    p.add_argument("--plugins", choices=("auto", "jit", "aot", "none"), default="auto",
                   help="how the custom nodes run: jit (Python QDPs: Python and Triton in the serving process), aot "
                        "(compiled kernels in the plan, no Python; TensorRT >= 10.9, needs an `export --aot` graph), "
                        "none (function bodies inlined); auto = aot for an --aot export, else jit")
    p.add_argument("--no-plugins", action="store_true", help="= --plugins none")
    p.add_argument("--refittable", action="store_true", help="plans whose weights `gdn-trt refit` can replace")
    p.add_argument("--workspace", type=cliargs.byte_size,
                   help="workspace memory pool limit, e.g. 4G (default: TensorRT's, the device memory)")
    p.add_argument("--pool-limit", "--memory-pool-limit", dest="pool_limit", nargs="+", default=[],
                   action="extend", type=cliargs.pool_limit("bytes"), metavar="POOL:SIZE",
                   help="memory pool limits as Polygraphy writes them, e.g. workspace:4G (pools: trt.MemoryPoolType "
                        "names; default: TensorRT's)")
    p.add_argument("--memPoolSize", dest="pool_limit", type=cliargs.pool_limits_mib, action="extend",
                   metavar="POOL:SIZE[,...]",
                   help="trtexec's form of --pool-limit, e.g. workspace:4096 (MiB unless a suffix says; default: "
                        "TensorRT's)")
    p.add_argument("--timing-cache", "--timingCacheFile", dest="timing_cache", type=Path,
                   help="tactic timing cache file: loaded before each build when it exists, saved after (default: "
                        "none)")
    p.add_argument("--builder-optimization-level", "--builderOptimizationLevel", dest="opt_level",
                   type=cliargs.opt_level,
                   help="0..5: higher searches longer for faster plans (default: TensorRT's, 3)")
    _limit_flags(p, defaults=False)
    p.add_argument("-v", "--verbose", action="store_true", help="TensorRT's and Polygraphy's verbose build log")
    p.set_defaults(func=run_build)

    p = sub.add_parser("refit", help="replace the weights of refittable plans by those of another export",
                       description="Refit plans built with --refittable with the weights of another export of the "
                                   "same graphs (a merged LoRA adapter: no rebuild).", epilog=REFIT_EXAMPLES)
    p.add_argument("--engines", type=cliargs.existing_dir,
                   help=f"the plans folder of `gdn-trt build --refittable` (default: {ENGINES_ROOT}/<model>)")
    p.add_argument("--onnx", type=cliargs.existing_dir, required=True,
                   help="the export with the new weights (an export folder)")
    p.add_argument("--modes", type=_modes, help="comma-separated layer modes (default: all exported)")
    p.set_defaults(func=run_refit)

    p = sub.add_parser("compare", help="torch vs ONNX Runtime vs TensorRT on the exported graphs (Polygraphy)",
                       description="Run the same GraphSpec-valid inputs through torch and the exported graphs and "
                                   "check every output against its bound.", epilog=COMPARE_EXAMPLES)
    p.add_argument("--onnx", type=cliargs.existing_dir, default=ONNX_ROOT,
                   help="an export folder, or a folder of export folders")
    p.add_argument("--modes", type=_modes, help="comma-separated layer modes (default: all exported)")
    p.add_argument("--backends", default="auto",
                   help="comma-separated from torch, onnxrt, onnxref, trt; auto = torch, the ONNX runner of the "
                        "export's dtype (onnxrt, or onnxref for bfloat16) and trt where TensorRT imports")
    p.add_argument("--device", type=cliargs.device, default="auto", help="torch runner device: cpu, cuda or auto")
    p.add_argument("--iterations", type=cliargs.positive_int, default=2, help="input sets per graph")
    p.add_argument("--engines", type=cliargs.existing_dir,
                   help="plans from gdn-trt build (its --out) (default: TensorRT builds each engine in memory)")
    p.add_argument("--out", type=Path, help="folder of compare.json and compare.png (default: <onnx>/compare)")
    p.add_argument("--verbose", action="store_true", help="Polygraphy's per-iteration output statistics")
    p.set_defaults(func=run_compare)


def _config(args) -> GdnConfig:
    if args.checkpoint is None:
        return preset(args.preset or DEFAULT_PRESET)
    return GdnConfig.from_hf(args.checkpoint / "config.json", name=args.checkpoint.name)


def run_export(args) -> int:
    from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
    from gdn_trt.model.peft import load_adapter

    from gdn_trt.model.config import Shard
    from gdn_trt.model.tp import TpError, check_shard, shard_config

    from .artifacts import ExportPlan, export_checkpoint, rank_folder
    from .spec import check_rank_graph, rank_parts

    cfg = _config(args)  # everything below is checked before a file is written
    out = args.out or ONNX_ROOT / cfg.name
    lora = None
    if args.lora_slots:
        lora = LoraLimits(args.lora_slots, args.lora_rank, tuple(t for t in args.lora_targets.split(",") if t))
        lora.resolve(cfg)
    limits = Limits(args.max_seqs, args.max_tokens, args.max_draft, args.pool_slots, args.seq_buckets,
                    args.token_buckets, lora)
    plan = ExportPlan(args.modes or tuple(LayerMode), args.layers, args.dtype, limits, args.adapter, args.stack,
                      not args.embed_weights, args.aot)
    total = len(plan.graph_layers(cfg)) * len(plan.modes) * args.tp
    if args.tp > 1:  # refused before a file is written: a size that does not divide the heads, a stack, LoRA slots
        try:  # on dense-MLP layers (two part graphs each: total counts them)
            check_shard(cfg, Shard(args.tp, 0))
            rank_cfg = shard_config(cfg, Shard(args.tp, 0))
            for ids in plan.graph_layers(cfg):
                check_rank_graph(rank_cfg, ids, lora)
            total += sum(len(rank_parts(rank_cfg, ids[0])) - 1 for ids in plan.graph_layers(cfg)) * len(plan.modes) \
                * args.tp
        except TpError as e:
            print(f"gdn-trt export: {e}", file=sys.stderr)
            return 2
    if args.adapter is not None:
        load_adapter(args.adapter, cfg)
    if args.checkpoint is None:
        path = make_synthetic_checkpoint(cfg.name, out / "checkpoint" / cfg.name, seed=0)  # its folder names the model
        print(f"synthetic checkpoint of preset {cfg.name} (seed 0): {path}")
    else:
        path = args.checkpoint
    ranks = [(Shard(), out)] if args.tp == 1 else [(Shard(args.tp, r), rank_folder(out, r)) for r in range(args.tp)]
    with tqdm(total=total, desc=f"export {cfg.name}", unit="graph", file=sys.stderr) as bar:
        def progress(rec):
            tqdm.write(rec.summary())
            bar.update(1)

        for shard, folder_r in ranks:  # a rank reads only its slices of the checkpoint
            ck = load_checkpoint(path, shard)
            manifest = export_checkpoint(ck, folder_r, plan, progress)
    merged = json.loads(manifest.read_text())["adapter"]
    if merged:
        print(f"merged LoRA adapter {merged['name']} (digest {merged['digest']}; {merged['skipped_tensors']} tensors "
              "of modules outside the GDN layers not used)")
    if lora:
        print(f"per-sequence LoRA: {lora.max_adapters} adapter slots of rank {lora.max_rank} on "
              f"{', '.join(t.value for t in lora.resolve(ck.config))}")
    print(f"{total} graphs, manifest: {manifest}" if args.tp == 1 else
          f"{total} graphs, one manifest per rank: {out}/rank<r>/manifest.json (r = 0..{args.tp - 1})")
    folder = "stack<a>-<b>" if plan.stack else "layer<i>"
    if args.tp > 1:
        folder = f"rank<r>/{folder}"
    print(f"next: gdn-trt compare --onnx {out}; gdn-trt build --onnx {out}; polygraphy run {out}/{folder}/<mode>.onnx "
          f"--onnxrt --data-loader-script {out}/{folder}/<mode>_data.py")
    if total > len(plan.graph_layers(cfg)) * len(plan.modes) * args.tp:
        print("dense-MLP layers: two graphs per mode and rank, <mode>+mixer.onnx and <mode>+mlp.onnx; the host "
              "all-reduces the mixer's x_out and feeds the mlp graph x = that sum, residual = the mixer's residual_out")
    return 0


def _rank(manifest) -> int | None:
    """The tensor-parallel rank of an export (None: a whole model's)."""
    tp = manifest.data.get("tp")
    return None if tp is None else tp["rank"]


def plans_dir(out: Path | None, model: str, several: bool, rank: int | None = None) -> Path:
    """Where the plans of one export go (build) or are (compare, refit): `out` itself, `<out>/<model>` when one
    command covers several exports, `engines/<model>` when no folder is given; a tensor-parallel rank's export
    (`rank`) among several: `<out>/rank<r>` (`<out>` = `engines/<model>` when not given)."""
    if rank is not None and (several or out is None):
        return (ENGINES_ROOT / model if out is None else out) / f"rank{rank}"
    if out is None:
        return ENGINES_ROOT / model
    return out / model if several else out


def _tensorrt_or_none(command: str):
    """The tensorrt module, or None after saying on stderr how to install it (the caller exits 2)."""
    from .build import TrtUnavailable, import_tensorrt

    try:
        return import_tensorrt()
    except TrtUnavailable as e:
        print(f"gdn-trt {command}: {e}", file=sys.stderr)
        return None


def check_limits(args, manifests) -> None:
    """The TensorRT-LLM style limits given to build must be the export's: they fix the graphs' shapes."""
    for m in manifests:
        lim = m.data.get("limits") or {}
        for flag, key in (("--max-seqs (--max-batch-size)", "max_seqs"), ("--max-tokens (--max-input-len)",
                                                                          "max_tokens"),
                          ("--max-draft (--max-draft-len)", "max_draft")):
            want = getattr(args, key)
            if want is not None and lim.get(key) != want:
                raise ValueError(f"{m.root}: exported with {key} = {lim.get(key)}, not {want}; the limits fix the "
                                 f"graphs' shapes: export again with {flag} {want}")


def build_options(args, out: Path, plugins: str = "jit"):
    from .build import BuilderTuning, BuildOptions

    pools = dict(args.pool_limit)
    if args.workspace is not None:
        pools["workspace"] = args.workspace
    tuning = BuilderTuning(tuple(pools.items()), args.timing_cache, args.opt_level)
    return BuildOptions(out, plugins=plugins, refittable=args.refittable, tuning=tuning)


def run_build(args) -> int:
    from .artifacts import Manifest
    from .build import build_graph, plugin_label

    manifests = Manifest.find(args.onnx)
    check_limits(args, manifests)
    trt = _tensorrt_or_none("build")
    if trt is None:
        return 2
    if args.verbose:
        from polygraphy.logger import G_LOGGER

        G_LOGGER.module_severity = G_LOGGER.VERBOSE  # Polygraphy's TensorRT logger follows it
    for m in manifests:
        impl = "none" if args.no_plugins else args.plugins
        if impl == "auto":
            impl = "aot" if m.data.get("form") == "aot" else "jit"
        opts = build_options(args, plans_dir(args.out, m.data["model"], len(manifests) > 1, _rank(m)), impl)
        form = m.data.get("form", "jit")
        print(f"TensorRT {trt.__version__}; plugins: {plugin_label(impl)}; {m.root} ({form} form) -> {opts.out}")
        for rec in tqdm(m.select(args.modes), desc=f"build {m.data['model']}", unit="plan", file=sys.stderr):
            plan = build_graph(m, rec, opts)
            tqdm.write(f"{rec.spec.where} {rec.spec.stem}: {len(rec.spec.buckets)} profiles, "
                       f"{plan.stat().st_size / 1e6:.2f} MB -> {plan}")
    return 0


def run_refit(args) -> int:
    from .artifacts import Manifest
    from .refit import refit_plans

    manifests = Manifest.find(args.onnx)
    trt = _tensorrt_or_none("refit")
    if trt is None:
        return 2
    print(f"TensorRT {trt.__version__}")
    for m in manifests:
        for plan in refit_plans(m, plans_dir(args.engines, m.data["model"], len(manifests) > 1, _rank(m)), args.modes):
            print(f"refit {plan}")
    return 0


def _trt_available() -> bool:
    from .build import TrtUnavailable, import_tensorrt

    try:
        import_tensorrt()
        return True
    except TrtUnavailable:
        return False


def run_compare(args) -> int:
    from .artifacts import Manifest
    from .build import TrtUnavailable
    from .compare import CompareOptions, backends_for, compare_graph, layers_of
    from .report import closest, write_report

    manifests = Manifest.find(args.onnx)
    trt = _trt_available() if args.backends == "auto" else "trt" in args.backends
    plan = [(m, backends_for(args.backends, m.data["dtype"], trt)) for m in manifests]  # all refusals come first
    if not args.verbose:
        from polygraphy.logger import G_LOGGER

        G_LOGGER.module_severity = G_LOGGER.WARNING  # per-output stats of every iteration: the JSON keeps them
    if args.backends == "auto" and not trt:
        print("compare: no TensorRT here (it does not import), so no trt runner")
    out = args.out or args.onnx / "compare"
    results = []
    try:
        for m, backends in plan:
            dtype = m.data["dtype"]
            if "onnxref" in backends and args.backends == "auto":
                print(f"compare: {m.data['model']} is a {dtype} export: ONNX Runtime's CPU provider has no {dtype} "
                      "kernels, so ONNX's reference evaluator (onnxref) runs the graphs, in numpy: slow on big layers")
            engines = plans_dir(args.engines, m.data["model"], len(manifests) > 1, _rank(m)) if args.engines else None
            opts = CompareOptions(backends, args.device, args.iterations, engines)
            layers = layers_of(m, dtype)
            for rec in tqdm(m.select(args.modes), desc=f"compare {m.data['model']}", unit="graph", file=sys.stderr):
                res = compare_graph(m, rec, layers, opts)
                tqdm.write(res.summary())
                results.append(res)
    except TrtUnavailable as e:
        print(f"gdn-trt compare: {e}", file=sys.stderr)
        return 2
    failed = [r for r in results if not r.passed]
    meta = {"device": args.device, "iterations": args.iterations, "exports": [str(m.root) for m, _ in plan]}
    path, png = write_report(results, out, meta)
    print(f"{len(results) - len(failed)}/{len(results)} graphs within tolerance (error: relative RMS against torch; "
          "bounds: export/tolerances.py)")
    if results:
        w = closest(results)
        print(f"closest to its bound: {w.name()} {w.closest()}")
    print(f"results: {path}" + (f", plot: {png}" if png else ""))
    return 1 if failed or not results else 0


def main(argv: list[str] | None = None) -> int:
    """The four commands without the rest of `gdn-trt` (tests, `python -m gdn_trt.export.cli`)."""
    parser = cliargs.Parser(prog="gdn-trt", description=__doc__)
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    return cliargs.run(args, f"gdn-trt {args.command}")


if __name__ == "__main__":
    sys.exit(main())
