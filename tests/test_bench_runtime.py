"""`bench/runtime.py` reports this host's speed at the runtime's own Python beside its enqueue figures: the same
code's in-place enqueue differed about 2x between two H200 hosts (2026-12-04), so a figure without it cannot be
compared across hosts. The script's CPU smoke mode (tiny shapes, nothing measured means anything) runs here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def runtime_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("runtime", "host_cpu"):
        sys.modules.pop(name, None)
    import runtime as module

    yield module
    for name in ("runtime", "host_cpu"):
        sys.modules.pop(name, None)


def test_runtime_bench_reports_the_host_reference(runtime_bench, monkeypatch, tmp_path):
    calls = []
    real = runtime_bench.static_reference

    def reference(steps: int = 200):
        calls.append(steps)
        return real(20)  # the stubbed step itself (it asserts that its graph entry replayed), fewer steps

    monkeypatch.setattr(runtime_bench, "static_reference", reference)
    monkeypatch.setattr(sys, "argv", ["runtime.py", "--smoke", "--only", "static", "--out", str(tmp_path)])
    runtime_bench.main()
    assert calls == [200]
    result = json.loads(next(tmp_path.glob("*-runtime.json")).read_text())
    meta, rows = result["meta"], result["rows"]
    assert meta["host_ref_us"] > 0 and meta["host_ref_cpu_us"] > 0
    md = next(tmp_path.glob("*-runtime.md")).read_text()
    assert f"in {meta['host_ref_us']:.1f} us ({meta['host_ref_cpu_us']:.1f} us of CPU)" in md
    assert [(r["stack"], r["case"]) for r in rows] == [("static", "decode 1"), ("static", "decode 8")]
