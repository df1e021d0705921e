"""What the README promises a newcomer: the wall time of `make run` and `make test` on a fresh clone, install included.

    python3 bench/fresh_clone.py [--repo .] [--dest /tmp/gdn-trt-fresh] [--out bench/results] [--name fresh-clone]

Clones the repository's committed HEAD into `--dest` (removed first), then times, in that clone, `make
.venv/.installed` (the venv and the pip installs both commands start with), `make run` and `make test`, each as its
own process group (stopped by its id after `--limit` seconds). The load average is sampled every 10 s, since a shared
machine's figures are only comparable beside it. Writes `<out>/<date>-<name>.json` and `.md`; the README's sentence
on the two commands cites the newest such file (`tests/test_readme_promises.py` checks it). Packages come from
wherever this machine's pip is configured to take them (an index mirror makes the install faster than a first
download; the JSON records the installed size).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

STEPS = (("install", ".venv/.installed"), ("make run", "run"), ("make test", "test"))


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


class Sampler(threading.Thread):
    """The 1-minute load average every `period` seconds until stopped."""

    def __init__(self, period: float = 10.0):
        super().__init__(daemon=True)
        self.period, self.samples, self._done = period, [], threading.Event()

    def run(self) -> None:
        while not self._done.wait(self.period):
            self.samples.append(loadavg()[0])

    def stop(self) -> list[float]:
        self._done.set()
        return self.samples


def timed(cmd: list[str], cwd: Path, log: Path, limit: float) -> dict:
    """Run `cmd` in its own process group; its output to `log`; stop that group (only) after `limit` s."""
    sampler = Sampler()
    sampler.start()
    start, load0 = time.perf_counter(), loadavg()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            rc = p.wait()
    seconds = time.perf_counter() - start
    samples = sampler.stop()
    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    return {"command": " ".join(cmd), "rc": rc, "seconds": round(seconds, 1), "load_start": load0,
            "load_end": loadavg(), "load_mean": round(sum(samples) / len(samples), 2) if samples else load0[0],
            "last_line": tail[0] if tail else ""}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", type=Path, default=Path("."), help="the repository to clone (its committed HEAD)")
    p.add_argument("--dest", type=Path, default=Path("/tmp/gdn-trt-fresh"), help="the clone (removed first)")
    p.add_argument("--out", type=Path, default=Path("bench/results"), help="where the JSON and markdown go")
    p.add_argument("--name", default="fresh-clone", help="file stem after the date")
    p.add_argument("--limit", type=float, default=3600, help="seconds each step may take")
    args = p.parse_args(argv)
    repo = args.repo.resolve()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                            check=True).stdout.strip()
    shutil.rmtree(args.dest, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(repo), str(args.dest)], check=True)
    logs = args.dest.parent / f"{args.dest.name}-logs"
    logs.mkdir(exist_ok=True)
    steps = {}
    for name, target in STEPS:
        steps[name] = timed(["make", target], args.dest, logs / f"{target.strip('.').replace('/', '_')}.log",
                            args.limit)
        print(f"{name}: rc {steps[name]['rc']}, {steps[name]['seconds']:.0f} s, load {steps[name]['load_mean']}",
              flush=True)
    venv = args.dest / ".venv"
    meta = {"date": dt.date.today().isoformat(), "commit": commit, "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
            "venv_bytes": du(venv) if venv.exists() else None, "logs": str(logs)}
    fresh = {"make run": steps["install"]["seconds"] + steps["make run"]["seconds"],
             "make test": steps["install"]["seconds"] + steps["make test"]["seconds"]}
    doc = {"meta": meta, "steps": steps, "fresh_clone_seconds": fresh}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"{meta['date']}-{args.name}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2))
    rows = [f"| {n} | {s['rc']} | {s['seconds']:.0f} | {s['load_mean']} | {s['last_line'][:90]} |"
            for n, s in steps.items()]
    stem.with_suffix(".md").write_text(
        f"# Fresh clone, {meta['date']} (commit {commit}, {meta['cpus']} CPUs, Python {meta['python']})\n\n"
        "| step | exit | seconds | mean 1-min load | last line |\n|---|---|---|---|---|\n" + "\n".join(rows)
        + f"\n\nFrom a fresh clone, install included: `make run` {fresh['make run'] / 60:.1f} min, `make test` "
          f"{fresh['make test'] / 60:.1f} min; the venv holds {meta['venv_bytes'] / 2**30:.2f} GiB.\n")
    print(f"{stem}.json: make run {fresh['make run']:.0f} s, make test {fresh['make test']:.0f} s (install included)")
    return 0 if all(s["rc"] == 0 for s in steps.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
