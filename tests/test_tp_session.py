"""Tensor-parallel sessions on the CPU: every rank's process opens `Session.open(preset, options=SessionOptions(
tp=TpSpec(group)))` over its shard, in gloo processes at tp = 4 (four processes) and tp = 2 (the groups {0, 1} and
{2, 3}), for the three families (Qwen3-Next with a dense-MLP layer, Qwen3.5 dense, Qwen4-Exp with hc and PLE). The
multi-step scenario (`tp_session_support.scenario`: prefill with a capture point, decode, verify + accept, snapshot
and restore, a host-driven step) gives every rank the tp = 1 session's outputs, and the ranks' pools gathered are
the tp = 1 pools; a session opened with `host_reduce=True` returns partial sums that add up to the tp = 1 outputs.
One spawn of four processes serves both sizes.

Tolerance: `tol(float64)` (relative RMS 1e-11), as in `test_tp.py`: a rank's projections sum over its share of the
rows and the all-reduce adds the tp partial sums, a different order of float64 additions than the whole layer's.
"""

from __future__ import annotations

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.config import Shard, preset
from gdn_trt.model.tp import TpError, TpSpec
from gdn_trt.runtime.backends import TorchEngine
from gdn_trt.runtime.session import Session

from .tolerances import assert_close
from .tp_session_support import PRESETS, F64, host_scenario, inputs, options, run_world, scenario
from .tp_support import gather_part

EXACT = tol(F64)


@pytest.fixture(scope="module")
def data():
    return {n: inputs(n, seed=40 + k) for k, n in enumerate(PRESETS)}


@pytest.fixture(scope="module")
def whole(data):
    """The tp = 1 sessions' results (the reference)."""
    ident = lambda t: t  # noqa: E731
    out = {}
    for n in PRESETS:
        out[n] = {"run": scenario(Session.open(n, device="cpu", options=options(None)), data[n]),
                  "host": host_scenario(Session.open(n, device="cpu", options=options(None)), data[n], ident)}
    return out


@pytest.fixture(scope="module")
def ranks(data, tmp_path_factory):
    return run_world(tmp_path_factory.mktemp("tp-session"), data)


def _same_state(what: str, cfg, ref: dict, ranks: list[dict]) -> None:
    for i, parts in ref.items():
        for p, t in parts.items():
            assert_close(f"{what}: layer {i} {p}", t, gather_part(cfg, p, [r[i][p] for r in ranks]), EXACT)


CASES = [pytest.param(n, p, id=f"tp{n}-{p}") for n in (2, 4) for p in PRESETS]


@pytest.mark.parametrize("size,name", CASES)
def test_rank_sessions_equal_the_whole_session(whole, ranks, size, name):
    cfg, ref, got = preset(name), whole[name]["run"], [r["run"] for r in ranks[size][name]]
    what = f"tp={size} {name}"
    for k, r in enumerate(got):
        for key in ("prefill", "decode", "verify", "decode4"):
            for j, (a, b) in enumerate(zip(ref[key], r[key])):
                assert_close(f"{what} rank {k}: {key} output {j}", a, b, EXACT)
                assert torch.equal(b, got[0][key][j]), f"{what}: the ranks' {key} outputs differ"
        assert_close(f"{what} rank {k}: host-driven step.layer", ref["host_layers"], r["host_layers"], EXACT)
        assert r["positions"] == ref["positions"] == [12, 7, 12, 4]
        assert r["stats"] == {"size": size, "rank": k, "backend": "gloo", "reduce": "runtime"}
        assert r["table"].startswith(f"tensor parallel: rank {k} of tp={size} over gloo")
    for k, r in enumerate(got):  # the restored snapshot continued as its original, given the same input
        assert_close(f"{what} rank {k}: restored sequence", r["decode4"][0], r["decode4"][2], EXACT)
    _same_state(what, cfg, ref["state"], [r["state"] for r in got])


@pytest.mark.parametrize("size,name", CASES)
def test_host_reduced_rank_sessions_return_partial_sums(whole, ranks, size, name):
    cfg, ref, got = preset(name), whole[name]["host"], [r["host"] for r in ranks[size][name]]
    what = f"tp={size} {name} host-reduced"
    for i, (y, streams) in ref["mixer"].items():
        parts = [r["mixer"][i][0] for r in got]
        if streams is None:  # step.mixer: the ranks' partial outputs sum to the whole mixer output
            assert_close(f"{what}: layer {i} mixer", y, torch.stack(parts).sum(0), EXACT)
            assert not torch.allclose(parts[0], y), f"{what}: layer {i} mixer output is not partial"
        else:  # a PLE layer through step.layer: (partial delta, streams)
            assert y is None
            assert_close(f"{what}: layer {i} streams", streams, got[0]["mixer"][i][1] + torch.stack(parts).sum(0),
                         EXACT)
    for k, r in enumerate(got):
        assert_close(f"{what} rank {k}: hidden rebuilt by the host", ref["hidden"], r["hidden"], EXACT)
    _same_state(what, cfg, ref["state"], [r["state"] for r in got])


def test_rank_sessions_hold_their_heads_and_veto_capture_over_gloo(ranks):
    for size in (2, 4):
        for name in PRESETS:
            for k, r in enumerate(ranks[size][name]):
                assert r["cfg"] == (size, k, preset(name).linear_num_value_heads // size)
                assert all(v is not None and "gloo" in v and "CUDA graph" in v for v in r["veto"]), r["veto"]


def test_a_gloo_rank_engine_on_cuda_names_the_backend_in_its_veto():
    from gdn_trt.model.layer import GdnLayer
    from gdn_trt.model.modes import LayerMode
    from gdn_trt.runtime.session import load_source
    from gdn_trt.runtime.tp import RankTp

    ck, _ = load_source("tiny-next-tp")
    eng = TorchEngine(GdnLayer(ck.config, ck.layers[0]), torch.device("cuda"))  # no CUDA needed to ask
    assert eng.capture_veto(LayerMode.DECODE) is None
    gloo = RankTp(ck.config, Shard(2, 0), TpSpec(), "gloo")
    gloo.mark([[eng]])
    assert "gloo" in eng.capture_veto(LayerMode.DECODE)
    RankTp(ck.config, Shard(2, 0), TpSpec(), "nccl").mark([[eng]])
    assert eng.capture_veto(LayerMode.DECODE) is None  # NCCL's all-reduce can be captured


def test_a_tp_spec_without_torch_distributed_is_refused():
    assert not torch.distributed.is_initialized()
    with pytest.raises(TpError, match="init_process_group"):
        Session.open("tiny-next-tp", device="cpu", options=options(TpSpec()))
