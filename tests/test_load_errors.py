"""Clear errors on load: a bad checkpoint, config or call input is refused with one line naming the file, key or
tensor and what to do (or converted with a logged reason, where that is what users expect: fp16 weights in a bf16
model are cast to the activation dtype), never loaded without a word or failing later with an unrelated exception.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import GdnConfig, preset
from gdn_trt.runtime import Prompt, Session, SessionOptions
from gdn_trt.runtime.session import load_source

from .test_runtime_support import LIMITS, PLAIN, fingerprint, open_session

KEY = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"


@pytest.fixture
def ckpt(tmp_path):
    return make_synthetic_checkpoint(PLAIN, tmp_path / "ck", seed=1)


def _edit_tensor(root, key, fn):
    sd = load_file(root / "model.safetensors")
    sd[key] = fn(sd[key]).contiguous()
    save_file(sd, root / "model.safetensors")


def _edit_config(root, fn):
    cfg = json.loads((root / "config.json").read_text())
    new = fn(cfg)
    (root / "config.json").write_text(new if isinstance(new, str) else json.dumps(new))


def _set(t, where, value):
    t = t.clone()
    t[where] = value
    return t


@pytest.mark.parametrize("value,what", [(float("nan"), "1 NaN"), (float("inf"), "1 infinite"),
                                        (-float("inf"), "1 infinite")])
def test_non_finite_weights_refused_naming_file_and_tensor(ckpt, value, what):
    _edit_tensor(ckpt, KEY, lambda t: _set(t, (3, 2), value))
    with pytest.raises(ValueError, match=rf"model\.safetensors: tensor {KEY} holds {what}.*corrupt"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.uint8, torch.bool])
def test_integer_weights_refused(ckpt, dtype):
    _edit_tensor(ckpt, KEY, lambda t: t.to(dtype))
    with pytest.raises(ValueError, match=rf"{KEY} is {str(dtype).replace('torch.', '')}.*floating point"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_weights_refused_as_quantized(ckpt, dtype):
    """An FP8 checkpoint's weights need their block scales; cast without them they would be silently wrong."""
    _edit_tensor(ckpt, KEY, lambda t: t.to(dtype))
    with pytest.raises(ValueError, match=rf"{KEY} is {str(dtype).replace('torch.', '')}; a quantized .*dequantize"):
        load_checkpoint(ckpt)


def test_fp16_weights_are_converted_with_a_logged_reason(ckpt, caplog):
    sd = load_file(ckpt / "model.safetensors")
    save_file({k: v.half() if v.dtype.is_floating_point else v for k, v in sd.items()}, ckpt / "model.safetensors")
    with caplog.at_level(logging.INFO, logger="gdn_trt.model"):
        ck = load_checkpoint(ckpt)
    assert "stored as float16" in caplog.text and "float32" in caplog.text
    assert ck.layers[0].mixer.in_proj.dtype == torch.float16


@pytest.mark.parametrize("eps", [0.0, -1e-6, float("nan"), float("inf")])
def test_bad_rms_norm_eps_refused(ckpt, eps):
    _edit_config(ckpt, lambda c: {**c, "text_config": {**c["text_config"], "rms_norm_eps": eps}})
    with pytest.raises(ValueError, match=r"config\.json.*rms_norm_eps must be a finite number > 0"):
        load_checkpoint(ckpt)
    with pytest.raises(ValueError, match="rms_norm_eps"):
        preset(PLAIN).replace(rms_norm_eps=eps)


@pytest.mark.parametrize("key,value", [("hidden_size", 40.5), ("hidden_size", "40"), ("hidden_size", True),
                                       ("num_hidden_layers", 4.2), ("linear_num_key_heads", None)])
def test_non_integer_sizes_refused(ckpt, key, value):
    _edit_config(ckpt, lambda c: {**c, "text_config": {**c["text_config"], key: value}})
    with pytest.raises(ValueError, match=rf"config\.json.*{key} must be an integer, got {value!r}"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("key,value,drop_types,match", [
    ("num_hidden_layers", 2 ** 62, True, "num_hidden_layers must be in 1..4096"),  # built a 2**62-entry list
    ("num_hidden_layers", 2 ** 80, False, "num_hidden_layers must be in 1..4096"),
    ("num_hidden_layers", 6, False, "layer_types lists 4 layers, num_hidden_layers says 6"),
    ("full_attention_interval", 0, True, "full_attention_interval must be in 1.."),  # ZeroDivisionError before
])
def test_sizes_out_of_range_refused(ckpt, key, value, drop_types, match):
    def edit(c):
        t = {**c["text_config"], key: value}
        if drop_types:
            del t["layer_types"]
        return {**c, "text_config": t}

    _edit_config(ckpt, edit)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(ckpt)


def test_zero_sparse_step_refused():
    c = preset("tiny-next").to_hf()
    with pytest.raises(ValueError, match="decoder_sparse_step must be in 1.."):
        GdnConfig.from_hf({**c, "decoder_sparse_step": 0})


def test_integral_float_size_accepted(ckpt):
    _edit_config(ckpt, lambda c: {**c, "text_config": {**c["text_config"], "hidden_size": 40.0}})
    assert load_checkpoint(ckpt).config.hidden_size == 40


@pytest.mark.parametrize("edit,match", [
    (lambda c: [c], r"config\.json[^:]*: a JSON list, expected an object"),
    (lambda c: "{not json", r"config\.json[^:]*: not valid JSON"),
    (lambda c: {**c, "text_config": {k: v for k, v in c["text_config"].items() if k != "hidden_size"}},
     r"config\.json[^:]*: missing 'hidden_size'"),
    (lambda c: {**c, "text_config": [1]}, r"config\.json[^:]*: text_config must be a JSON object"),
    (lambda c: {**c, "text_config": {**c["text_config"], "model_type": "llama"}},
     r"config\.json[^:]*: unsupported model_type 'llama'"),
    (lambda c: {**c["text_config"], "model_type": "mistral"}, r"config\.json[^:]*: unsupported model_type 'mistral'"),
    (lambda c: {**c, "text_config": {**c["text_config"], "layer_types": "linear_attention"}},
     r"config\.json[^:]*: layer_types must be a list"),
])
def test_bad_config_json_refused_with_one_line(ckpt, edit, match):
    _edit_config(ckpt, edit)
    with pytest.raises(ValueError, match=match) as e:
        load_checkpoint(ckpt)
    assert "\n" not in str(e.value)


def _with_part(ck, fn):
    lw = ck.layers[0]
    return replace(ck, layers=[replace(lw, mixer=replace(lw.mixer, in_proj=fn(lw.mixer.in_proj)))] + ck.layers[1:])


@pytest.mark.parametrize("how,match", [
    ("meta", "mixer.in_proj is a meta tensor"),
    ("sparse", "mixer.in_proj is a sparse tensor"),
    ("int", "mixer.in_proj is int16"),
])
def test_meta_sparse_or_integer_weights_of_an_in_memory_checkpoint_refused(how, match):
    ck, _ = load_source(PLAIN)
    fn = {"meta": lambda t: torch.empty_like(t, device="meta"), "sparse": lambda t: t.to_sparse(),
          "int": lambda t: t.to(torch.int16)}[how]
    with pytest.raises(ValueError, match=match):
        Session.open(_with_part(ck, fn), backend="torch", device="cpu", options=SessionOptions(limits=LIMITS))


def test_accept_and_steps_with_a_list_instead_of_a_dict_refused():
    s = open_session(PLAIN)
    a = s.add_sequence()
    s.verify({a: torch.randn(2, s.cfg.stream_dim)})
    before = fingerprint(s)
    for call in (lambda: s.accept([a]), lambda: s.accept([(a, 1)]), lambda: s.decode([torch.randn(1, 40)]),
                 lambda: s.step(prefill=[Prompt(torch.randn(2, 40))])):
        with pytest.raises(TypeError, match=r"\{seq: .*\}, got list"):
            call()
        assert fingerprint(s) == before
    s.accept({a: 1})


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("how", ["meta", "sparse", "sparse_csr"])
def test_meta_or_sparse_hidden_refused(how):
    s = open_session(PLAIN)
    a = s.add_sequence()
    dense = torch.randn(1, s.cfg.stream_dim)
    h = {"meta": lambda: torch.empty(1, s.cfg.stream_dim, device="meta"), "sparse": lambda: dense.to_sparse(),
         "sparse_csr": lambda: dense.to_sparse_csr()}[how]()
    before = fingerprint(s)
    with pytest.raises(ValueError, match="dense tensor with data"):
        s.decode({a: h})
    with pytest.raises(ValueError, match="dense tensor with data"):
        s.prefill(a, h)
    assert fingerprint(s) == before
    assert torch.isfinite(s.decode({a: dense})[a]).all()


def test_config_dict_errors_without_a_file():
    good = preset(PLAIN).to_hf()
    bad = {**good, "text_config": {**good["text_config"], "rms_norm_eps": -1.0}}
    with pytest.raises(ValueError, match="rms_norm_eps"):
        GdnConfig.from_hf(bad)
    assert math.isclose(GdnConfig.from_hf(good).rms_norm_eps, preset(PLAIN).rms_norm_eps)
