"""`gdn-trt`: one command with subcommands; each module below adds its own (`register(subparsers)`)."""

from __future__ import annotations

import argparse
import importlib
import sys

_COMMAND_MODULES = ("gdn_trt.export.cli", "gdn_trt.runtime.plan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gdn-trt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
