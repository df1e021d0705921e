"""`bench/glue.py` takes every row's host figure before its first profile: once torch.profiler has run in a
process, CUPTI stays attached and every later launch pays for it (a decode step's enqueue more than doubled at N = 1,
H200, 2026-12-04), so a host time taken after any profile is not the one a user sees. Run on the CPU with the CUDA
timers replaced by recorders (the layer itself runs, decode N = 1, both eager glues)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture
def glue(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    sys.modules.pop("glue", None)
    import glue as module

    yield module
    sys.modules.pop("glue", None)


def test_glue_takes_every_host_figure_before_any_profile(glue, monkeypatch, tmp_path):
    events: list[tuple[str, str]] = []

    def timed(fn, n_sets=1, **_):
        for i in range(n_sets):
            fn(i)
        return SimpleNamespace(median_us=1.0, p10_s=1e-6, p90_s=1e-6, method="recorded")

    def host(run):
        events.append(("host", run.glue))
        return 1.0

    def breakdown(fn, iters=5):
        fn()
        events.append(("profile", ""))
        return {"gdn_decode": 4.0, "nvjet_gemm": 8.0, "add": 2.0}, 12.0

    monkeypatch.setattr(glue, "DEV", "cpu")
    monkeypatch.setattr(glue, "CASES", {"decode N=1": glue.CASES["decode N=1"]})
    monkeypatch.setattr(glue, "time_cuda", timed)
    monkeypatch.setattr(glue, "host_us", host)
    monkeypatch.setattr(glue, "kernel_profile", breakdown)
    monkeypatch.setattr(glue, "copy_bandwidth", lambda: {"eager_TBps": 1.0, "best": 1e12})
    monkeypatch.setattr(glue, "device_info", lambda: {"device": "cpu"})
    monkeypatch.setattr(sys, "argv", ["glue.py", "--only", "qwen3-next", "--compile-cases", "", "--out",
                                      str(tmp_path)])
    glue.main()
    kinds = [k for k, _ in events]
    assert [g for k, g in events if k == "host"] == ["torch", "fused"]
    assert kinds == ["host", "host", "profile", "profile"], kinds
    rows = json.loads(next(tmp_path.glob("*-glue.json")).read_text())["rows"]
    assert [(r["glue"], r["gemm_us"], r["gdn_us"], r["glue_us"]) for r in rows] == [("torch", 2.0, 1.0, 0.5),
                                                                                   ("fused", 2.0, 1.0, 0.5)]
