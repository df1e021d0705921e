"""Helpers shared by the Triton kernel tests (the random inputs and `Step` are in `gdn_trt.plugins.samples`)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

INSIDE = os.environ.get("TRITON_INTERPRET") == "1"  # this process runs under the Triton interpreter


def rerun_under_interpreter(test_file: str, *pytest_args: str, timeout: int = 900) -> None:
    """Run `test_file` again in a subprocess with TRITON_INTERPRET=1 (Triton picks the interpreter at import, so the
    interpreter cases of a file exist only in such a process) and assert that its cases ran and passed."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    here = Path(test_file)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args, str(here)],
                          cwd=here.parent.parent, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"interpreter cases failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


@contextmanager
def poisoned(module):
    """Make every buffer a Triton module allocates (`module._new`) start as NaN, so unwritten rows fail loudly."""
    orig = module._new
    module._new = lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
    try:
        yield
    finally:
        module._new = orig
