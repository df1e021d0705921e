"""The README's time for the two commands is a measurement: it cites the newest `bench/results/*-fresh-clone.json`
(written by `bench/fresh_clone.py` on a fresh clone, install included) and quotes its figures and load average."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SENTENCE = re.compile(r"`make run` took (?P<run>[\d.]+) min and `make test` (?P<test>[\d.]+) min .*?"
                      r"load average (?P<load>[\d.]+) .*?\(`bench/results/(?P<file>[\w-]+-fresh-clone)\.md`", re.S)


def test_readme_cites_the_newest_fresh_clone_measurement():
    text = (ROOT / "README.md").read_text()
    m = SENTENCE.search(text)
    assert m, "README.md must state the measured time of make run and make test (bench/fresh_clone.py)"
    runs = sorted((ROOT / "bench" / "results").glob("*-fresh-clone.json"))
    assert runs and runs[-1].stem == m["file"], f"cite the newest measurement, {runs[-1].stem if runs else None}"
    doc = json.loads(runs[-1].read_text())
    assert all(s["rc"] == 0 for s in doc["steps"].values()), "a measurement counts only if every step passed"
    fresh = doc["fresh_clone_seconds"]
    assert float(m["run"]) == round(fresh["make run"] / 60, 1)
    assert float(m["test"]) == round(fresh["make test"] / 60, 1)
    loads = [s["load_mean"] for s in doc["steps"].values()]
    assert float(m["load"]) == round(max(loads), 1)
    assert (ROOT / "bench" / "results" / f"{m['file']}.md").is_file()
