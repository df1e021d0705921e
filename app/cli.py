"""`gdn-trt`: one command with subcommands. `export`, `build`, `refit` and `compare` come from `gdn_trt.export.cli`
(`register(subparsers)`); `budget` (alias `plan`, its first name) and `selftest` are here:

    gdn-trt budget --preset qwen3-next-80b-a3b --max-seqs 256 [--device-memory 80GiB]
"""

from __future__ import annotations

import argparse
import os
import sys

from gdn_trt.export import cli as export_cli
from gdn_trt.model.config import GdnConfig, preset
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.tp import TpError
from gdn_trt.runtime.budget import BudgetError, RuntimeLimits, budget, parse_bytes


def register_budget(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("budget", aliases=["plan"], help="print the runtime memory budget for a model and "
                                                               "limits")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--preset", help="a GdnConfig preset name (e.g. qwen3-next-80b-a3b)")
    src.add_argument("--checkpoint", help="an HF checkpoint directory (only config.json is read)")
    p.add_argument("--max-seqs", type=int, default=RuntimeLimits.max_seqs)
    p.add_argument("--max-prefill-tokens", type=int, default=RuntimeLimits.max_prefill_tokens)
    p.add_argument("--max-draft", type=int, default=RuntimeLimits.max_draft)
    p.add_argument("--ple-cache-rows", type=int, default=RuntimeLimits.ple_cache_rows)
    p.add_argument("--dtype", default=None, help="activation dtype (default: the config's)")
    p.add_argument("--no-graphs", action="store_true", help="budget without CUDA-graph buckets")
    p.add_argument("--lora-slots", type=int, default=0, help="per-sequence LoRA adapter slots (0 = none)")
    p.add_argument("--lora-rank", type=int, default=LoraLimits.max_rank, help="rank of every LoRA slot")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size: the budget of one of its ranks")
    p.add_argument("--device-memory", default=None,
                   help="budget to check against, e.g. 80GiB (exit 1 naming the limit to lower if it does not fit)")
    p.set_defaults(func=_budget)


def _budget(args: argparse.Namespace) -> int:
    if args.preset:
        cfg = preset(args.preset)
    else:
        cfg = GdnConfig.from_hf(os.path.join(args.checkpoint, "config.json"), name=os.path.basename(args.checkpoint))
    lora = LoraLimits(args.lora_slots, args.lora_rank) if args.lora_slots else None
    limits = RuntimeLimits(args.max_seqs, args.max_prefill_tokens, args.max_draft, (), args.ple_cache_rows, lora)
    try:
        need = budget(cfg, limits, args.dtype or cfg.dtype, graphs=not args.no_graphs, tp=args.tp)
    except TpError as e:
        print(f"gdn-trt budget: {e}", file=sys.stderr)
        return 2
    print(need.table())
    if args.device_memory:
        try:
            need.check(parse_bytes(args.device_memory), f"a {args.device_memory} device")
        except BudgetError as e:
            print(f"does not fit: {e}")
            return 1
        print(f"fits in {args.device_memory}")
    return 0


def register_selftest(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("selftest", add_help=False,
                              help="on a machine with TensorRT and a GPU: check the plugins, aliasing and context "
                                   "memory, then the whole flow (export, build every mode and stack, compare, "
                                   "scenario on the engines); gdn-trt selftest --help for its options")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda a: _selftest(a.rest))


def _selftest(argv: list[str]) -> int:
    from gdn_trt.app import selftest  # imports torch and onnx only when asked for

    return selftest.main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["selftest"]:  # its own parser: argparse's REMAINDER drops a leading option such as --out
        return _selftest(argv[1:])
    parser = argparse.ArgumentParser(prog="gdn-trt", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    export_cli.register(sub)
    register_budget(sub)
    register_selftest(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
