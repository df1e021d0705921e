"""Engine selection: mode per step kind and size, mixed steps split by kind, graph buckets, capture vetoes (CPU,
PLE not hoisted, failed gate), engine refusals falling through to the next candidate, each said once."""

from __future__ import annotations

import logging

import pytest
import torch

from gdn_trt.model.modes import LayerMode, StepKind
from gdn_trt.runtime.backends import TorchEngine
from gdn_trt.runtime.select import GraphPolicy, NoEngineError, Selector, Work

from .test_runtime_support import HC_PLE, PLAIN, open_session

CUDA = torch.device("cuda")  # selection only reads the device type; nothing runs


def work(kind: StepKind, tokens: list[int]) -> list[Work]:
    return [Work(k, k, t, kind) for k, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def layers():
    return {name: [c[0].layer for c in open_session(name).selector.engines] for name in (PLAIN, HC_PLE)}


def selector(layers, device=CUDA, hoisted=True, buckets=(1, 2, 4, 8), name=PLAIN, draft=0) -> Selector:
    engines = [[TorchEngine(la, device)] for la in layers[name]]
    ple = frozenset(la.index for la in layers[name] if la.ple is not None)
    return Selector(engines, GraphPolicy(True, buckets, hoisted, draft), ple)


@pytest.mark.parametrize("kind,tokens,mode", [
    (StepKind.DECODE, [1], LayerMode.DECODE),
    (StepKind.DECODE, [1, 1, 1], LayerMode.DECODE_MULTI_SEQ),
    (StepKind.VERIFY, [3], LayerMode.DECODE_BATCHED),
    (StepKind.VERIFY, [3, 0, 2], LayerMode.VERIFY_MULTI),
    (StepKind.PREFILL, [17], LayerMode.PREFILL),
    (StepKind.PREFILL, [17, 5], LayerMode.PREFILL_VARLEN),
])
def test_mode_per_kind_and_size(layers, kind, tokens, mode):
    (g,) = selector(layers).select(work(kind, tokens))
    assert g.mode is mode and g.kind is kind and g.tokens == sum(tokens)


def test_mixed_step_splits_into_groups(layers):
    w = work(StepKind.PREFILL, [9]) + [Work(5, 5, 1, StepKind.DECODE), Work(6, 6, 1, StepKind.DECODE),
                                       Work(7, 7, 2, StepKind.VERIFY)]
    groups = selector(layers).select(w)
    assert [g.kind for g in groups] == [StepKind.DECODE, StepKind.VERIFY, StepKind.PREFILL]
    assert [tuple(x.seq for x in g.work) for g in groups] == [(5, 6), (7,), (0,)]
    assert [g.path for g in groups] == ["graph", "eager", "eager"]
    assert groups[1].veto and "verify_graphs is off" in groups[1].veto
    assert groups[2].veto and "prefill token counts" in groups[2].veto


@pytest.mark.parametrize("tokens,bucket", [
    ([3], 1), ([2], 2),  # one sequence missing drafts: verify_multi with a padding sequence (decode_batched has none)
    ([3, 3], 2), ([3, 0], 4), ([3, 3, 3], 4), ([1, 2, 3], 4), ([3] * 8, 8), ([3] * 7 + [1], None), ([3] * 9, None),
])
def test_verify_bucket_holds_the_drafts_and_a_padding_sequence_for_missing_ones(layers, tokens, bucket):
    """With verify graphs (max_draft 3), a verify group pads to a bucket of sequences x 3 rows; when some drafts are
    missing, a padding sequence must own the padding rows, so the bucket holds one sequence more."""
    (g,) = selector(layers, draft=3).select(work(StepKind.VERIFY, tokens))
    assert g.bucket == bucket and g.rows == (None if bucket is None else 3 * bucket)
    assert g.mode is (LayerMode.DECODE_BATCHED if tokens == [3] else LayerMode.VERIFY_MULTI)
    assert g.path == ("graph" if bucket else "eager")
    if bucket is None:
        assert "pads no tokens" in g.veto or "exceeds the largest graph bucket" in g.veto


def test_verify_padded_shape_refused_runs_unpadded(layers):
    """An engine that refuses the padded verify (here beyond 2 sequences) leaves the group eager and unpadded, with
    the refusal as its veto; decode keeps its bucket."""
    engines = [[_Small(la, CUDA)] for la in layers[PLAIN]]
    sel = Selector(engines, GraphPolicy(True, (1, 2, 4), True, 2), frozenset())
    (g,) = sel.select(work(StepKind.VERIFY, [2, 1]))  # bucket 4: refused
    assert g.bucket is None and g.rows is None and g.path == "eager"
    assert "refuses the padded verify (bucket 4)" in g.veto and "profile max N=2" in g.veto
    (g,) = sel.select(work(StepKind.VERIFY, [2, 2]))  # every draft: bucket 2, 4 rows
    assert (g.bucket, g.rows, g.path) == (2, 4, "graph")


@pytest.mark.parametrize("n,bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, None)])
def test_decode_bucket_is_the_smallest_that_holds_the_step(layers, n, bucket):
    (g,) = selector(layers).select(work(StepKind.DECODE, [1] * n))
    assert g.bucket == bucket
    assert g.path == ("graph" if bucket else "eager")


def test_cpu_vetoes_capture(layers):
    (g,) = selector(layers, device=torch.device("cpu")).select(work(StepKind.DECODE, [1, 1]))
    assert g.path == "eager" and "CUDA graphs need a CUDA device" in g.veto


def test_ple_vetoes_decode_capture_unless_hoisted(layers):
    (g,) = selector(layers, hoisted=False, name=HC_PLE).select(work(StepKind.DECODE, [1, 1, 1]))
    assert g.path == "graph+eager" and g.bucket == 4
    assert g.vetoes == (None, g.vetoes[1], None) and "PLE prestage" in g.vetoes[1]
    (g,) = selector(layers, hoisted=True, name=HC_PLE).select(work(StepKind.DECODE, [1, 1, 1]))
    assert g.path == "graph" and g.veto is None


def test_failed_gate_vetoes_that_bucket_only(layers):
    sel = selector(layers)
    (g,) = sel.select(work(StepKind.DECODE, [1, 1, 1]))
    assert g.path == "graph"
    sel.fail_bucket(LayerMode.DECODE_MULTI_SEQ, 4, "replay differs")
    (g,) = sel.select(work(StepKind.DECODE, [1, 1, 1]))
    assert g.path == "eager" and "failed its acceptance gate" in g.veto
    (g,) = sel.select(work(StepKind.DECODE, [1] * 6))
    assert g.path == "graph" and g.bucket == 8


class _Small(TorchEngine):
    """A real engine whose (profile-like) coverage stops at 2 sequences."""

    def __init__(self, layer, device):
        super().__init__(layer, device)
        self.name = "small"

    def refuse(self, mode, seqs, tokens):
        return f"profile max N=2, got {seqs}" if seqs > 2 else super().refuse(mode, seqs, tokens)


def test_refusal_falls_through_to_the_next_engine_and_is_said_once(layers, caplog):
    engines = [[_Small(la, CUDA), TorchEngine(la, CUDA)] for la in layers[PLAIN]]
    sel = Selector(engines, GraphPolicy(True, (1, 2, 4), True), frozenset())
    with caplog.at_level(logging.INFO, logger="gdn_trt.runtime"):
        for _ in range(3):
            (g,) = sel.select(work(StepKind.DECODE, [1, 1, 1]))
            assert {e.name for e in g.engines} == {"torch-cuda"}
        (g,) = sel.select(work(StepKind.DECODE, [1, 1]))
        assert {e.name for e in g.engines} == {"small"}
    refusals = [r for r in caplog.messages if "refuses" in r]
    assert len(refusals) == len(layers[PLAIN])  # once per layer, not once per step
    assert all("profile max N=2" in r for r in refusals)
    assert sum("decode x3" in m for m in caplog.messages) == 1


def test_no_engine_lists_every_refusal(layers):
    engines = [[_Small(la, CUDA)] for la in layers[PLAIN]]
    sel = Selector(engines, GraphPolicy(False, (1,), True), frozenset())
    with pytest.raises(NoEngineError, match="no engine covers a prefill step of 3 sequences"):
        sel.select(work(StepKind.PREFILL, [4, 4, 4]))
