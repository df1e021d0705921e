"""Bad input to the layer gets a clear error naming the problem, and no buffer changes."""

from __future__ import annotations

import pytest
import torch

from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput
from gdn_trt.model.weights import LayerWeights
from gdn_trt.plugins.packing import Packing

F32 = torch.float32


@pytest.fixture(scope="module")
def layers(tmp_path_factory):
    out = {}
    for name in ("tiny-3.5", "tiny-4exp"):
        ck = load_checkpoint(make_synthetic_checkpoint(name, tmp_path_factory.mktemp(name), seed=1))
        out[name] = (ck.config, {lw.index: GdnLayer(ck.config, lw, F32) for lw in ck.layers}, ck)
    return out


def _state(cfg, i):
    s = LayerState.allocate(cfg, i, 3, BufferSpec(F32))
    for t in s.tensors():
        t.normal_()
    return s


def _snap(s: LayerState):
    return [t.clone() for t in s.tensors()]


def _unchanged(s: LayerState, before) -> bool:
    return all(torch.equal(a, b) for a, b in zip(s.tensors(), before))


def test_plain_layer_bad_inputs(layers):
    cfg, ls, _ = layers["tiny-3.5"]
    layer = ls[0]
    st = _state(cfg, 0)
    before = _snap(st)
    C = cfg.hidden_size
    one = Packing.build([1], [0])
    two = Packing.build([1, 1], [0, 1])
    cases = [
        (lambda: layer.decode(StepInput(torch.zeros(1, C + 1), one, torch.zeros(1, C + 1)), st), ValueError,
         "x must be"),
        (lambda: layer.decode(StepInput(torch.zeros(1, C, dtype=torch.float64), one, torch.zeros(1, C)), st),
         ValueError, "computes in"),
        (lambda: layer.decode(StepInput(torch.zeros(1, C), one), st), ValueError, "residual"),
        (lambda: layer.decode(StepInput(torch.zeros(2, C), two, torch.zeros(2, C)), st), ValueError, "one sequence"),
        (lambda: layer.decode_multi_seq(StepInput(torch.zeros(3, C), two, torch.zeros(3, C)), st), ValueError,
         "one token per sequence"),
        (lambda: layer.decode(StepInput(torch.zeros(1, C), one, torch.zeros(1, C), torch.zeros(1, 4, 8)), st),
         ValueError, "takes no ple_rows"),
        (lambda: layer.verify_multi(StepInput(torch.zeros(2, C), two, torch.zeros(2, C)), st, None), TypeError,
         "needs StateStash"),
        (lambda: layer.verify_multi(StepInput(torch.zeros(2, C), two, torch.zeros(2, C)), st,
                                    StateStash.allocate(cfg, 0, 1, BufferSpec(F32))), ValueError, "stash"),
        (lambda: layer.decode(StepInput(torch.zeros(1, C), Packing.build([1], [5]), torch.zeros(1, C)), st),
         ValueError, "out of range"),
        (lambda: layer.prefill(StepInput(torch.zeros(4, C), one, torch.zeros(4, C)), st,
                               StateCapture.none(cfg, 0, 1, BufferSpec(F32))), ValueError, "rise from 0 to T"),
        # a wrong recurrent capture buffer must be caught before the conv writes its pool row
        (lambda: layer.prefill(StepInput(torch.zeros(1, C), one, torch.zeros(1, C)), st,
                               StateCapture(torch.tensor([1], dtype=torch.int32), torch.zeros(1, *cfg.conv_state_shape),
                                            torch.zeros(2, *cfg.ssm_state_shape))), ValueError, "ssm capture"),
        (lambda: layer.prefill(StepInput(torch.zeros(1, C), one, torch.zeros(1, C)), st,
                               StateCapture(torch.tensor([2], dtype=torch.int32), torch.zeros(1, *cfg.conv_state_shape),
                                            torch.zeros(1, *cfg.ssm_state_shape))), ValueError, "capture_at"),
        (lambda: layer.decode(StepInput(torch.zeros(1, C), one, torch.zeros(1, C)),
                              LayerState(st.conv, st.ssm.to(torch.bfloat16))), ValueError, "ssm pool"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
        assert _unchanged(st, before), f"state changed by a rejected call ({match})"


def test_hc_ple_layer_bad_inputs(layers):
    cfg, ls, _ = layers["tiny-4exp"]
    layer = ls[1]  # PLE layer
    st = _state(cfg, 1)
    before = _snap(st)
    one = Packing.build([1], [0])
    x = torch.zeros(1, cfg.stream_dim)
    rows = torch.zeros(1, cfg.ple_heads, cfg.ple_head_dim)
    cases = [
        (lambda: layer.decode(StepInput(x, one), st), "needs ple_rows"),
        (lambda: layer.decode(StepInput(x, one, None, rows[:, :1]), st), "ple_rows must be"),
        (lambda: layer.decode(StepInput(x, one, torch.zeros_like(x), rows), st), "no residual"),
        (lambda: layer.decode(StepInput(x, one, None, rows), LayerState(st.conv, st.ssm)), "ple_conv pool missing"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
        assert _unchanged(st, before)


def test_weights_must_match_the_config(layers):
    cfg, _, ck = layers["tiny-4exp"]
    lw = ck.layers[0]
    with pytest.raises(ValueError, match="ple is missing"):
        LayerWeights(1, lw.mixer, attn_hc=lw.attn_hc).check(cfg)
    with pytest.raises(ValueError, match="input_norm is unexpected"):
        LayerWeights(0, lw.mixer, input_norm=torch.zeros(cfg.hidden_size), attn_hc=lw.attn_hc).check(cfg)
    with pytest.raises(ValueError, match="not a GDN layer"):
        LayerWeights(3, lw.mixer, attn_hc=lw.attn_hc).check(cfg)
    other = preset("tiny-3.5")
    with pytest.raises(ValueError, match="mixer.in_proj"):
        GdnLayer(other, LayerWeights(0, lw.mixer, input_norm=torch.zeros(other.hidden_size),
                                     mlp=layers["tiny-3.5"][2].layers[0].mlp,
                                     post_norm=torch.zeros(other.hidden_size)))
