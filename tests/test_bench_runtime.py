"""`bench/runtime.py` reports this host's speed at the runtime's own Python beside its enqueue figures: the same
code's in-place enqueue differed about 2x between two H200 hosts (2026-12-04), so a figure without it cannot be
compared across hosts. The script's CPU smoke mode (tiny shapes, nothing measured means anything) runs here."""

from __future__ import annotations

import json
import math
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
    # the pure-Python probe: at rest in the meta and the reading, and after each row's idle calls in its column
    assert meta["probe_rest_us"] > 0 and f"the pure-Python probe in {meta['probe_rest_us']:.1f} us at rest" in md
    assert all(r["probe_us"] > 0 for r in rows)
    assert [(r["stack"], r["case"]) for r in rows] == [("static", "decode 1"), ("static", "decode 8")]


def test_host_cpu_verify_stub_runs_the_verify_accept_loop_from_its_graph(runtime_bench):
    """`bench/host_cpu.py`'s `verify` column: a verify-accept loop of 3 sequences, each drafting max_draft tokens,
    every step from the stubbed graph of its bucket (4 sequences, 8 rows), the drafts left pending until accept."""
    import host_cpu

    cfg, limits = host_cpu._stub_stack()
    step = host_cpu._static_step(cfg, limits, 3, verify=True)
    step()
    sess = step.sess
    kinds = [k for k in sess.stats().kinds.values() if k.steps]
    assert sess.stats().graphs.replays == 2 and len(kinds) == 1 and kinds[0].paths == {"graph": 2}
    assert kinds[0].modes == {"verify_multi": 2} and sess.stats().drafted == 2 * 3 * limits.max_draft
    assert not sess._seqs.stash_held()  # accept_batch of none cleared every pending verify


def test_host_cpu_churn_checks_every_request_and_replays_the_bucket(runtime_bench):
    """`bench/host_cpu.py`'s `churn` and `vchurn` columns: two sets of 3 sequences in turn (one leaves, one joins),
    every step a new request (no reuse of the last one's checked request or bound views), its index data sent, the
    bucket's stubbed graph replayed; the verify's drafts accepted (none) by the step's own sequences."""
    import host_cpu

    cfg, limits = host_cpu._stub_stack()
    for verify in (False, True):
        step = host_cpu._static_step(cfg, limits, 3, verify, True)
        sess, specs, copies = step.sess, [], []
        for _ in range(4):
            before = sess._steps.pack.copies
            step()
            copies.append(sess._steps.pack.copies - before)
            specs.append(sess._step._spec)
        assert [s.seqs.tolist() for s in specs] == [[1, 2, 3], [0, 1, 2]] * 2
        assert len({id(s) for s in specs}) == 4 and copies == [1, 1, 1, 1]
        assert sess.stats().graphs.replays == 5 and not sess._seqs.stash_held()


def test_switches_bench_smoke_restores_the_switches(runtime_bench, monkeypatch, tmp_path):
    """`bench/switches.py` (the A/B of the switches written without a device, one process) in CPU smoke mode: a row
    per (configuration, N, API), `off` its own reference, and the switches back as they were after the run."""
    from gdn_trt.plugins.glue import triton as glue_tri
    from gdn_trt.runtime import graphs

    sys.modules.pop("switches", None)
    import switches

    before = (glue_tri.TUNING, graphs.IO)
    monkeypatch.setattr(sys, "argv", ["switches.py", "--smoke", "--rounds", "1", "--steps", "3", "--only", "off,io",
                                      "--out", str(tmp_path)])
    switches.main()
    sys.modules.pop("switches", None)
    assert (glue_tri.TUNING, graphs.IO) == before
    rows = json.loads(next(tmp_path.glob("*-switches.json")).read_text())["rows"]
    assert {(r["config"], r["case"], r["api"]) for r in rows} == {
        (c, f"decode {n}", a) for c in ("off", "io") for n in (1, 8) for a in ("static", "ours")}
    assert all(r["enqueue_vs_off"] == 1.0 for r in rows if r["config"] == "off")
    assert all(not r["error"] and r["floor_us"] > 0 for r in rows)


def test_host_profile_eager_phases_smoke(runtime_bench):
    """`bench/host_profile.py --eager` in CPU smoke mode: the phases of an eager verify (with its accept) and of a
    prefill, each a positive time, the whole at least the sum of its parts; the accept's cost with either fold, the
    switch put back."""
    sys.modules.pop("host_profile", None)
    import host_profile

    host_profile.rb.DEV = "cpu"
    try:
        o = host_profile.rb.Ours(host_profile.rb.configs(True)["ours"])
        cases = (("verify 64x4", ("open", "run", "close", "accept")), ("prefill 4096", ("open", "run", "close")))
        for case, parts in cases:
            p = host_profile.eager_phases(o, case, 1)
            assert tuple(p) == (*parts, "whole") and all(v > 0 for v in p.values())
            assert p["whole"] >= sum(p[k] for k in parts) * 0.999
        assert host_profile.waits(lambda: None) == [] and host_profile.segments(lambda: None, 2) == 0
        from gdn_trt.runtime import stack

        was = stack.FOLD_KERNEL
        a = host_profile.accept_cost(o, "verify 64x4", 1)
        assert list(a) == ["torch host", "torch span", "kernel host", "kernel span"] and stack.FOLD_KERNEL == was
        assert a["torch host"] > 0 and a["kernel host"] > 0
    finally:
        sys.modules.pop("host_profile", None)


def test_chain_floor_splits_a_step_by_layer_kernel(runtime_bench):
    """The per-kernel split of `bench/chain_floor.py`: each launch is credited from its start to the next one's
    (the last to the step's end), launches are told apart by name (cuBLAS's in_proj between the norm and the conv,
    a split GEMM's second launch and the final add as `other`), and the stream chain's by position."""
    sys.modules.pop("chain_floor", None)
    import chain_floor

    us = 1000  # events in ns
    layer = ["norm_kernel", "nvjet_tst_gemm", "conv_update_kernel", "gdn_recurrent_kernel", "gated_norm_kernel",
             "gemm_kernel"]
    names = ["graph_io_kernel"] + layer + layer[:5] + ["gemm_kernel", "splitk_reduce", "elementwise_add"]
    starts = [0, 2, 5, 9, 10, 30, 33, 40, 42, 46, 47, 67, 70, 76, 78]
    ours = [(a * us, (a + 3) * us, name) for a, name in zip(starts, names)]  # the last ends at 81
    assert chain_floor.credits(ours) == [2, 3, 4, 1, 20, 3, 7, 2, 4, 1, 20, 3, 6, 2, 3]
    stream = [(k * 10 * us, (k * 10 + 12) * us, "stream_kernel") for k in range(12)]  # ends at 122
    rows = {r["kernel"]: r for r in chain_floor.split(64, ours, stream)}
    assert {k: (r["ours_us"], r["stream_us"], r["diff_us"]) for k, r in rows.items()} == {
        "head": (2, 0, 2), "norm": (3 + 2, 20, -15), "in_proj": (4 + 4, 20, -12), "conv": (1 + 1, 20, -18),
        "gdn": (20 + 20, 20, 20), "gated_norm": (3 + 3, 20, -14), "out_proj": (7 + 6, 22, -9),
        "other": (2 + 3, 0, 5), "step (span)": (81, 122, -41)}
    assert all(r["n"] == 64 for r in rows.values())


def test_chain_floor_moves_the_steps_bytes(runtime_bench, tmp_path):
    """`bench/chain_floor.py` (the step's launch structure with streaming kernels): its layers read the stack's
    weights exactly (bench/runtime.py's floor counts the same bytes), every chain moves the same bytes in its
    launches, and in CPU smoke mode, under the interpreter, each launch wrote what it read (the script checks)."""
    import os
    import subprocess

    sys.modules.pop("chain_floor", None)
    import chain_floor

    from gdn_trt.runtime.budget import weight_bytes

    cfg = runtime_bench.configs(True)["static"]
    layers = len(cfg.gdn_layer_ids)
    assert sum(rd for rd, _ in chain_floor.layer_bytes(cfg, 0).values()) * layers == weight_bytes(cfg, "bfloat16")
    for n in (1, 5):
        sizes = {v: chain_floor.launch_sizes(cfg, n, cuts) for v, cuts in chain_floor.CHAINS.items()}
        assert [len(s) for s in sizes.values()] == [1, layers, 3 * layers, 6 * layers]
        assert sizes["6 a layer"][:6] == [tuple(b // 4 for b in v) for v in chain_floor.layer_bytes(cfg, n).values()]
        for k in (0, 1):
            totals = {sum(s[k] for s in v) for v in sizes.values()}
            assert max(totals) - min(totals) < 6 * layers  # each launch rounds its bytes down to fp32 values
    sys.modules.pop("chain_floor", None)
    proc = subprocess.run([sys.executable, str(BENCH / "chain_floor.py"), "--smoke", "--n", "1,3", "--out",
                           str(tmp_path)], env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
                          text=True, timeout=600, cwd=BENCH)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(next(tmp_path.glob("*-chain-floor.json")).read_text())["rows"]
    assert [(r["n"], r["variant"], r["launches"]) for r in rows] == [
        (n, v, k) for n in (1, 3) for v, k in (("floor", 0), ("1 launch", 1), ("1 a layer", layers),
                                               ("3 a layer", 3 * layers), ("6 a layer", 6 * layers),
                                               ("6 a layer, no PDL", 6 * layers),
                                               *((f"1 a layer, 6 phases, {r}/SM", layers)
                                                 for r in chain_floor.RESIDENT))]


def test_fold_rate_checks_the_kernel_against_torch(runtime_bench, tmp_path):
    """`bench/fold_rate.py` (accept's fold kernel beside torch's gather and scatter): in CPU smoke mode, under the
    interpreter, the kernel's pools equal torch's for the stack's state parts (the script raises otherwise) and the
    bytes it counts are the accepted rows' (2 x n x the 4 layers' conv and SSM rows)."""
    import os
    import subprocess

    proc = subprocess.run([sys.executable, str(BENCH / "fold_rate.py"), "--smoke", "--n", "1,3", "--out",
                           str(tmp_path)], env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
                          text=True, timeout=600, cwd=BENCH)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cfg = runtime_bench.configs(True)["static"]
    per_layer = sum(math.prod(s) * b for s, b in ((cfg.conv_state_shape, 2), (cfg.ssm_state_shape, 4)))  # bf16, fp32
    rows = json.loads(next(tmp_path.glob("*-fold-rate.json")).read_text())["rows"]
    assert [(r["n"], round(r["mib_moved"] * 2**20)) for r in rows] == [
        (n, 2 * n * len(cfg.gdn_layer_ids) * per_layer) for n in (1, 3)]
