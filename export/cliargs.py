"""What every `gdn-trt` subcommand shares: errors in one line, help that shows each flag's default, argument types
that check a value where it is parsed, and `run`, which turns a refused input into one line and an exit code.

Exit codes: 0 done; 1 the input was refused or a check failed (one line on stderr says what and what to do);
2 a bad argument (argparse) or a missing prerequisite (TensorRT); 130 interrupted. `GDN_TRT_TRACEBACK=1` shows the
traceback instead of the line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gdn_trt.model.config import PRESETS
from gdn_trt.model.devices import resolve_device

TRACEBACK_ENV = "GDN_TRT_TRACEBACK"


class Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples as written and appends `(default: ...)` to every option whose help does not already say
    its default (flags that are off unless given say nothing)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("default" in text or not action.option_strings or action.default in (None, argparse.SUPPRESS)
                or isinstance(action.default, bool)):
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with `Help` and a one-line error: `<prog>: error: <what> (<prog> --help lists the options)`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def message(e: BaseException) -> str:
    """The user-facing line of an exception: KeyError without its quotes, OSError with its file."""
    if isinstance(e, KeyError) and e.args:
        return one_line(e.args[0])
    if isinstance(e, OSError) and e.filename and str(e.filename) not in str(e.args[-1]):
        return one_line(f"{e.filename}: {e.strerror or e}")
    return one_line(str(e) or type(e).__name__)


def run(args: argparse.Namespace, prog: str) -> int:
    """`args.func(args)` with every failure as one line on stderr and an exit code (module docstring)."""
    from gdn_trt.model.errors import GdnTrtError

    from .build import TrtUnavailable

    try:
        return int(args.func(args) or 0)
    except TrtUnavailable as e:
        return fail(prog, message(e), 2)
    except KeyboardInterrupt:
        return fail(prog, "interrupted", 130)
    except (GdnTrtError, OSError, ValueError, KeyError) as e:
        if os.environ.get(TRACEBACK_ENV):
            raise
        return fail(prog, message(e), 1)
    except Exception as e:  # a bug, not an input: still one line, with the way to the traceback
        if os.environ.get(TRACEBACK_ENV):
            raise
        return fail(prog, f"unexpected {type(e).__name__}: {message(e)} (a bug: rerun with {TRACEBACK_ENV}=1 and "
                          "report the traceback)", 1)


def fail(prog: str, text: str, code: int) -> int:
    print(f"{prog}: {text}", file=sys.stderr)
    return code


def _int(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is not {what}")
    return value


def positive_int(text: str) -> int:
    return _int(text, 1, "a positive integer (>= 1)")


def count(text: str) -> int:
    return _int(text, 0, "a count (>= 0)")


def ints(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, e.g. 8,64."""
    return tuple(positive_int(x.strip()) for x in text.split(",") if x.strip())


def preset_name(text: str) -> str:
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {text!r}; presets: {', '.join(sorted(PRESETS))}")
    return text


def checkpoint_dir(text: str) -> Path:
    p = Path(text)
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory (give a Hugging Face checkpoint directory "
                                         "with config.json and *.safetensors)")
    if not (p / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text} has no config.json (give a Hugging Face checkpoint directory)")
    return p


def adapter_dir(text: str) -> Path:
    p = Path(text)
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory (give a PEFT LoRA adapter directory with "
                                         "adapter_config.json and adapter_model.safetensors)")
    return p


def existing_dir(text: str) -> Path:
    p = Path(text)
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    return p


def layers(text: str) -> str:
    """`all`, `variants` or comma-separated layer indices (checked against the model once it is read)."""
    if text in ("all", "variants"):
        return text
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ids = []
    if not ids or min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give all, variants or layer indices such as 0,2")
    return ",".join(map(str, ids))


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12}


def byte_size(text: str) -> int:
    """Bytes as trtexec and Polygraphy write them (4G, 512M: K/M/G/T are binary), or 4GiB, 80GB, 1e9."""
    t = text.strip().lower().replace(" ", "")
    number = t.rstrip("kmgtib")
    try:
        value = int(float(number) * _UNITS[t[len(number):]])
    except (KeyError, ValueError):
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 4G, 512M, 80GiB or 1073741824")
    return value


def device(text: str) -> str:
    from gdn_trt.model.devices import DeviceError

    if text == "auto":
        return str(resolve_device(None))
    try:
        return str(resolve_device(text))
    except DeviceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _pool(item: str, default_unit: str) -> tuple[str, int]:
    name, sep, size = item.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{item!r}: write POOL:SIZE, e.g. workspace:4G")
    size = size.strip()
    if default_unit == "mib" and size and size[-1].isdigit():
        size += "M"  # trtexec: a size without a unit is in MiB
    if size[-1:].lower() == "b" and size[:-1][-1:].isdigit():
        size = size[:-1]  # trtexec's B suffix: bytes
    return name.strip().lower(), byte_size(size)


def pool_limit(unit: str):
    """POOL:SIZE as Polygraphy writes it (`workspace:4G`; no suffix = bytes)."""
    return lambda text: _pool(text, unit)


def pool_limits_mib(text: str) -> list[tuple[str, int]]:
    """trtexec's `--memPoolSize=workspace:4096,tacticSharedMem:1K`: comma-separated, no suffix = MiB."""
    return [_pool(item, "mib") for item in text.split(",") if item.strip()]


def opt_level(text: str) -> int:
    level = _int(text, 0, "a builder optimization level (0..5)")
    if level > 5:
        raise argparse.ArgumentTypeError(f"{level} is not a builder optimization level (0..5)")
    return level
