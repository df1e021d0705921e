"""The `make run` job on the CPU without export (the scenario only): every check passes and the report says so."""

from __future__ import annotations

import json

from gdn_trt.app import main


def test_the_main_job_serves_and_checks_its_scenario(tmp_path, capsys):
    assert main.main(["--no-export", "--presets", "tiny-3.5", "--device", "cpu", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "run-report.json").read_text())
    assert report["passed"]
    checks = report["scenarios"]["tiny-3.5"]["checks"]
    assert len(checks) == 7 and all(c["ok"] and c["rel_rms"] <= c["bound"] for c in checks)
