"""The mode table (`model/modes.py`) is what the layer does and what the docs print: per mode, the ops the layer
really calls (recorded at dispatch), the buffers it returns, its shape rules, and the table in docs/architecture.md."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gdn_trt.model.checkpoint import random_layer
from gdn_trt.model.config import preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.modes import MODES, LayerMode, StepKind, Writes, candidates, markdown
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput
from gdn_trt.plugins.packing import Packing

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


class _Ops(TorchDispatchMode):
    """Records the gdn_trt operators dispatched while active."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name.startswith("gdn_trt::"):
            self.seen.add(name.split("::")[1].split(".")[0])
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def ple_layer():
    cfg = preset("tiny-4exp")  # hc + PLE layer 1: both convs (conv, ple_conv) and the GDN op run
    return cfg, GdnLayer(cfg, random_layer(cfg, 1, torch.Generator().manual_seed(0)), torch.float32)


def _step(cfg, layer: GdnLayer, mode: LayerMode):
    """A valid step of the mode: 2 sequences unless it takes one, 1 token each unless it takes several."""
    m, spec = mode.spec, BufferSpec(torch.float32)
    N = 1 if m.single_sequence else 2
    lengths = [1] * N if m.one_token_per_sequence else [3] * N
    T = sum(lengths)
    x = torch.randn(T, cfg.stream_dim)
    rows = torch.randn(T, cfg.ple_heads, cfg.ple_head_dim)
    step = StepInput(x, Packing.build(lengths, list(range(N))), None, rows)
    state = LayerState.allocate(cfg, layer.index, 4, spec)
    extra = {Writes.STASH: lambda: StateStash.allocate(cfg, layer.index, T, spec),
             Writes.POOLS_CAPTURE: lambda: StateCapture.none(cfg, layer.index, N, spec)}.get(m.writes, lambda: None)()
    return step, state, extra


@pytest.mark.parametrize("mode", list(LayerMode), ids=lambda m: m.value)
def test_the_layer_calls_the_ops_of_the_table_and_returns_what_it_writes(ple_layer, mode):
    cfg, layer = ple_layer
    step, state, extra = _step(cfg, layer, mode)
    with torch.no_grad(), _Ops() as ops:
        out = layer.run(mode, step, state, extra)
    m = MODES[mode]
    assert ops.seen == {f"{m.gdn.name}_inplace", f"{m.conv.name}_inplace"}
    want = {Writes.POOLS: (LayerState,), Writes.STASH: (StateStash,), Writes.POOLS_CAPTURE: (LayerState, StateCapture)}
    assert tuple(type(r) for r in out[1:]) == want[m.writes]


@pytest.mark.parametrize("mode", list(LayerMode), ids=lambda m: m.value)
def test_one_shape_rule_for_the_layer_and_the_engines(ple_layer, mode):
    cfg, layer = ple_layer
    step, state, extra = _step(cfg, layer, mode)
    assert mode.refuse(step.pack.num_seqs, step.x.shape[0]) is None
    for seqs, tokens in ((2, 2), (2, 4), (1, 3)):
        why = mode.refuse(seqs, tokens)
        single, one_each = mode.spec.single_sequence, mode.spec.one_token_per_sequence
        assert (why is None) == ((seqs == 1 or not single) and (tokens == seqs or not one_each))
        if why is None:
            continue
        lengths = [tokens // seqs] * seqs
        bad = StepInput(torch.randn(tokens, cfg.stream_dim), Packing.build(lengths, list(range(seqs))), None,
                        torch.randn(tokens, cfg.ple_heads, cfg.ple_head_dim))
        bad_extra = {Writes.STASH: StateStash.allocate(cfg, 1, tokens, BufferSpec(torch.float32)),
                     Writes.POOLS_CAPTURE: StateCapture.none(cfg, 1, seqs, BufferSpec(torch.float32))
                     }.get(mode.spec.writes)
        with pytest.raises(ValueError) as e:
            layer.run(mode, bad, state, bad_extra)
        assert str(e.value) == why


def test_every_step_kind_has_its_candidates_single_sequence_first():
    for kind in StepKind:
        single, multi = candidates(kind, True), candidates(kind, False)
        assert len(multi) == 1 and not multi[0].spec.single_sequence
        assert single == (next(m for m in LayerMode if m.spec.kind is kind and m.spec.single_sequence), *multi)


def test_the_docs_print_the_table():
    assert markdown() in DOC.read_text(), "docs/architecture.md: paste gdn_trt.model.modes.markdown() into it"
