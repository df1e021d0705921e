"""Each family's layer agrees with the public Hugging Face implementation (the definition of correct here).

Both sides run in float64; HF computes the recurrence and the gated norm in float32 internally, hence the bound of
`tol(float64, "hf")` (relative RMS 1e-5). Checked on whole sequences (T not a multiple of 64, several chunks) and on
a prefill followed by single-token decode steps through HF's cache, outputs and every final state.
"""

from __future__ import annotations

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StepInput
from gdn_trt.plugins.packing import Packing

from .hf_reference import F64, HfLayer
from .tolerances import assert_close

PRESETS = ["tiny-next", "tiny-next-mlp", "tiny-3.5", "tiny-4exp"]
HF = tol(F64, "hf")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {p: load_checkpoint(make_synthetic_checkpoint(p, root / p, seed=11)) for p in PRESETS}


def _inputs(ck, layer_idx: int, T: int, gen: torch.Generator):
    cfg = ck.config
    x = torch.randn(T, cfg.stream_dim, generator=gen, dtype=F64)
    ids = None
    if cfg.has_ple(layer_idx):
        ids = torch.randint(0, cfg.vocab_size, (T,), generator=gen)
        ids[T // 3] = cfg.eos_token_id  # a segment boundary inside the sequence
    return x, ids


def _cases():
    from gdn_trt.model.config import preset
    return [pytest.param(p, i, id=f"{p}-layer{i}") for p in PRESETS for i in preset(p).gdn_layer_ids]


@pytest.mark.parametrize("name,layer_idx", _cases())
def test_whole_sequence_matches_hf(checkpoints, name, layer_idx):
    ck = checkpoints[name]
    lw = next(lw for lw in ck.layers if lw.index == layer_idx)
    hf = HfLayer(ck, layer_idx)
    x, ids = _inputs(ck, layer_idx, 130, torch.Generator().manual_seed(layer_idx))
    rows = hf.ple_rows(ids) if ids is not None else None
    ours = GdnLayer(ck.config, lw, F64).forward_sequence(x, rows)
    assert_close(f"{name} layer {layer_idx} hidden", hf.sequence(x, ids), ours, HF)


@pytest.mark.parametrize("name", PRESETS)
def test_prefill_then_decode_matches_hf(checkpoints, name):
    ck = checkpoints[name]
    cfg = ck.config
    lw = next((lw for lw in ck.layers if cfg.has_ple(lw.index)), ck.layers[-1])
    i = lw.index
    hf = HfLayer(ck, i)
    T, P = 78, 67
    x, ids = _inputs(ck, i, T, torch.Generator().manual_seed(5))
    rows = hf.ple_rows(ids) if ids is not None else None
    ref, hf_states = hf.prefill_then_decode(x, ids, P)

    layer = GdnLayer(cfg, lw, F64)
    spec = BufferSpec(F64)
    state = LayerState.allocate(cfg, i, 4, spec)
    slot = 2  # not slot 0: the slot index must be honoured

    def step(a: int, b: int) -> StepInput:
        res = None if cfg.is_hc else torch.zeros(b - a, cfg.stream_dim, dtype=F64)
        return StepInput(x[a:b], Packing.build([b - a], [slot]), res, None if rows is None else rows[a:b])

    out, state, _ = layer.prefill(step(0, P), state, StateCapture.none(cfg, i, 1, spec))
    outs = [out.hidden()]
    for t in range(P, T):
        out, state = layer.decode(step(t, t + 1), state)
        outs.append(out.hidden())
    assert_close(f"{name} outputs", ref, torch.cat(outs), HF)
    assert_close(f"{name} recurrent state", hf_states.ssm, state.ssm[slot], HF)
    # the conv window holds pre-conv projections of normed inputs (HF norms in float32, hence the HF bound)
    assert_close(f"{name} conv window", hf_states.conv, state.conv[slot], HF)
    if hf_states.ple_conv is not None:
        assert_close(f"{name} PLE conv carry", hf_states.ple_conv, state.ple_conv[slot], HF)
    others = [s for s in range(4) if s != slot]
    assert not state.ssm[others].any() and not state.conv[others].any(), "other slots must stay untouched"
