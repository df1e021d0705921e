"""What an exported graph's and a plan's sha256 cover, computed once for the writers (export, build, refit) and the
reader that checks them (`runtime/plan_files.py`).

An exported graph is its `.onnx` file followed by its external weights (`.onnx.data`, when present); a plan is its
one file. Files are read in 16 MiB chunks, so a multi-GB plan is hashed without being held in memory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable

_CHUNK = 16 << 20


def graph_files(onnx: Path) -> list[Path]:
    """The files of one exported graph, in digest order: the `.onnx` file and its `.onnx.data` if it exists."""
    onnx = Path(onnx)
    data = onnx.with_name(onnx.name + ".data")
    return [onnx] + ([data] if data.exists() else [])


def sha256_files(paths: Iterable[Path]) -> str:
    """sha256 of the concatenated bytes of `paths` (hex)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()
