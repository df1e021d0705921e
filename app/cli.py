"""`gdn-trt`: one command with subcommands. `export`, `build`, `refit` and `compare` come from `gdn_trt.export.cli`
(`register(subparsers)`); `budget` (alias `plan`, its first name) and `selftest` are here. Errors are one line on
stderr and an exit code (`gdn_trt.export.cliargs`)."""

from __future__ import annotations

import argparse
import os
import sys

from gdn_trt.export import cli as export_cli
from gdn_trt.export import cliargs
from gdn_trt.export.engine_config import package_version
from gdn_trt.model.config import GdnConfig, preset
from gdn_trt.model.dtypes import ACTIVATION_DTYPES
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.tp import TpError
from gdn_trt.runtime.budget import BudgetError, RuntimeLimits, budget

DESCRIPTION = """\
The Gated-DeltaNet layers of Qwen3-Next, Qwen3.5 and Qwen4-Exp checkpoints as ONNX graphs and TensorRT engines.

A first run, on a CPU:
  gdn-trt export --preset tiny-3.5          # a synthetic checkpoint's layers -> artifacts/onnx/tiny-3.5/
  gdn-trt compare --onnx artifacts/onnx/tiny-3.5      # torch vs ONNX Runtime on every graph
  gdn-trt budget --preset qwen3-next-80b-a3b --max-seqs 256 --device-memory 80GiB

With a real checkpoint (bfloat16 graphs, compared in bfloat16):
  gdn-trt export --checkpoint /models/Qwen3-Next-80B-A3B --layers variants --out exp/next
  gdn-trt compare --onnx exp/next
On a machine with TensorRT >= 10.8 (docs/tensorrt.md):
  gdn-trt build --onnx exp/next --out engines/next --timing-cache next.cache
  gdn-trt compare --onnx exp/next --engines engines/next
  gdn-trt selftest

`gdn-trt COMMAND --help` shows each command's options (with defaults) and examples. The Python runtime:
`from gdn_trt.runtime import Session` (README.md).
"""

EPILOG = f"""exit codes: 0 done; 1 refused input or failed check (one line on stderr says why); 2 bad argument or
TensorRT missing. {cliargs.TRACEBACK_ENV}=1 shows the traceback instead of the line."""

BUDGET_EXAMPLES = """examples:
  gdn-trt budget --preset qwen3-next-80b-a3b --max-seqs 256
  gdn-trt budget --preset qwen3-next-80b-a3b --max-seqs 256 --tp 4      # one rank of four
  gdn-trt budget --checkpoint /models/Qwen3-Next-80B-A3B --max-seqs 64 --device-memory 80GiB   # exit 1: does not fit
  gdn-trt plan --preset qwen4-exp --lora-slots 4 --lora-rank 16 --dtype bfloat16
"""


def register_budget(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("budget", aliases=["plan"], help="the runtime memory budget of a model and limits",
                              description="Print the device memory a Session needs: pools, stashes, captures, "
                                          "CUDA-graph buckets, PLE caches, LoRA slots.", epilog=BUDGET_EXAMPLES)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", type=cliargs.preset_name, help="a GdnConfig preset name, e.g. qwen3-next-80b-a3b")
    src.add_argument("--checkpoint", type=cliargs.checkpoint_dir,
                     help="a Hugging Face checkpoint directory (only config.json is read)")
    p.add_argument("--max-seqs", type=cliargs.positive_int, default=RuntimeLimits.max_seqs,
                   help="live sequences (pool slots per layer)")
    p.add_argument("--max-prefill-tokens", type=cliargs.positive_int, default=RuntimeLimits.max_prefill_tokens,
                   help="tokens of one prefill step")
    p.add_argument("--max-draft", type=cliargs.positive_int, default=RuntimeLimits.max_draft,
                   help="draft tokens per sequence in one verify step")
    p.add_argument("--ple-cache-rows", type=cliargs.positive_int, default=RuntimeLimits.ple_cache_rows,
                   help="PLE host cache rows per PLE layer")
    p.add_argument("--dtype", choices=ACTIVATION_DTYPES, help="activation dtype (default: the config's)")
    p.add_argument("--no-graphs", action="store_true", help="budget without CUDA-graph buckets")
    p.add_argument("--verify-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="with the verify steps' CUDA graphs (SessionOptions.verify_graphs; default: as the graphs)")
    p.add_argument("--lora-slots", type=cliargs.count, default=0, help="per-sequence LoRA adapter slots (0 = none)")
    p.add_argument("--lora-rank", type=cliargs.positive_int, default=LoraLimits.max_rank, help="rank of every slot")
    p.add_argument("--tp", type=cliargs.positive_int, default=1,
                   help="tensor-parallel size: the budget of one of its ranks")
    p.add_argument("--device-memory", type=cliargs.byte_size,
                   help="check against this many bytes, e.g. 80GiB: exit 1 naming the limit to lower if it does not "
                        "fit (default: no check)")
    p.set_defaults(func=_budget)


def _budget(args: argparse.Namespace) -> int:
    if args.preset:
        cfg = preset(args.preset)
    else:
        cfg = GdnConfig.from_hf(os.path.join(args.checkpoint, "config.json"), name=os.path.basename(args.checkpoint))
    lora = LoraLimits(args.lora_slots, args.lora_rank) if args.lora_slots else None
    limits = RuntimeLimits(args.max_seqs, args.max_prefill_tokens, args.max_draft, (), args.ple_cache_rows, lora)
    from gdn_trt.runtime.session import SessionOptions  # its rule: verify graphs follow the graphs, need them

    try:
        options = SessionOptions(graphs=not args.no_graphs, verify_graphs=args.verify_graphs)
    except ValueError:
        print("gdn-trt budget: --verify-graphs needs the graphs (drop --no-graphs): verify steps are captured beside "
              "decode steps", file=sys.stderr)
        return 2
    try:
        need = budget(cfg, limits, args.dtype or cfg.dtype, graphs=options.graphs, tp=args.tp,
                      verify_graphs=options.verify_graphs)
    except TpError as e:
        print(f"gdn-trt budget: {e}", file=sys.stderr)
        return 2
    print(need.table())
    if args.device_memory:
        gib = f"{args.device_memory / (1 << 30):.1f} GiB"
        try:
            need.check(args.device_memory, f"a {gib} device")
        except BudgetError as e:
            print(f"does not fit: {e}")
            return 1
        print(f"fits in {gib}")
    return 0


def register_selftest(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("selftest", add_help=False,
                              help="on a machine with TensorRT and a GPU: check the plugins, aliasing and context "
                                   "memory, then the whole flow (export, build every mode and stack, compare, "
                                   "scenario on the engines); gdn-trt selftest --help for its options")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the selftest's own options")
    p.set_defaults(func=lambda a: _selftest(a.rest))


def _selftest(argv: list[str]) -> int:
    from gdn_trt.app import selftest  # imports torch and onnx only when asked for

    return selftest.main(argv)


def parser() -> cliargs.Parser:
    """The `gdn-trt` parser with every subcommand (the selftest's options are its own: `app/selftest.py`)."""
    p = cliargs.Parser(prog="gdn-trt", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--version", action="version", version=f"gdn-trt {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    export_cli.register(sub)
    register_budget(sub)
    register_selftest(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["selftest"]:  # its options go to its own parser (argparse's REMAINDER drops a leading --flag)
        return cliargs.run(argparse.Namespace(func=lambda a: _selftest(argv[1:])), "gdn-trt selftest")
    args = parser().parse_args(argv)
    return cliargs.run(args, f"gdn-trt {args.command}")


if __name__ == "__main__":
    sys.exit(main())
