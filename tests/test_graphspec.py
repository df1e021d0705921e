"""GraphSpec: the one I/O contract of every graph (names, order, dtypes, dims, aliasing, profiles)."""

from __future__ import annotations

import pytest

from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.export.spec import GraphSpec, Limits, Role, Variant, graph_spec
from gdn_trt.model.config import preset

LAYERS = [pytest.param("tiny-3.5", 0, id="plain"), pytest.param("tiny-4exp", 0, id="hc"),
          pytest.param("tiny-4exp", 1, id="hc+ple")]
MODES = pytest.mark.parametrize("mode", list(LayerMode), ids=lambda m: m.value)


def test_layer_mode_is_the_model_enum():
    from gdn_trt.model.modes import LayerMode as ModelMode

    assert LayerMode is ModelMode


@MODES
@pytest.mark.parametrize("name,layer", LAYERS)
def test_io_names_order_and_aliases(name, layer, mode):
    cfg = preset(name)
    s = graph_spec(cfg, layer, mode, Limits())
    acts = ["streams"] if cfg.is_hc else ["x", "residual"]
    ple = ["ple_rows"] if s.variant is Variant.HC_PLE else []
    parts = ["conv", "ssm"] + (["ple_conv"] if ple else [])
    capture = mode.spec.writes is Writes.POOLS_CAPTURE
    want_in = acts + ple + ["cu_seqlens", "slots"] + (["capture_at"] if capture else [])
    want_in += [f"{p}_pool" for p in parts]
    updated = [f"{p}_stash" for p in parts] if mode.spec.writes is Writes.STASH else [f"{p}_pool" for p in parts]
    if capture:
        updated += [f"{p}_capture" for p in parts]
    want_in += [u for u in updated if not u.endswith("_pool")]
    assert list(s.input_names) == want_in
    assert list(s.output_names) == [a + "_out" for a in acts] + [u + "_out" for u in updated]
    assert s.aliases == {u + "_out": u for u in updated}
    for out, inp in s.aliases.items():
        o, i = s.output(out), s.input(inp)
        assert (o.dtype, o.dims, o.role) == (i.dtype, i.dims, i.role)
    assert s.input("ssm_pool").dtype == "float32" and s.input("conv_pool").dtype == cfg.dtype
    assert s.input("ssm_pool").dims == ("S", *cfg.ssm_state_shape)
    assert all(t.dtype == "int32" and t.role is Role.INDEX for t in s.inputs if t.name in
               ("cu_seqlens", "slots", "capture_at"))
    assert s.stem == mode.value + {"plain": "", "hc": "+hc", "hc+ple": "+hc+ple"}[s.variant.value]


@MODES
def test_profiles_follow_the_limits(mode):
    lim = Limits(max_seqs=8, max_tokens=300, max_draft=3, pool_slots=10, seq_buckets=(2, 8), token_buckets=(64, 300))
    s = graph_spec(preset("tiny-next"), 0, mode, lim)
    for b in range(len(s.buckets)):
        prof = s.profile(b)
        assert list(prof) == list(s.input_names)
        for name, (mn, opt, mx) in prof.items():
            assert all(a <= o <= c for a, o, c in zip(mn, opt, mx)), name
        assert prof["ssm_pool"][2][0] == 10 and prof["x"][2][1] == s.input("x").dims[1]
    n_buckets = {LayerMode.DECODE: 1, LayerMode.DECODE_BATCHED: 1, LayerMode.PREFILL: 2}.get(mode, 2)
    assert len(s.buckets) == n_buckets
    top = s.profile(len(s.buckets) - 1)
    T_max = {LayerMode.DECODE: 1, LayerMode.DECODE_MULTI_SEQ: 8, LayerMode.DECODE_BATCHED: 3,
             LayerMode.VERIFY_MULTI: 24, LayerMode.PREFILL: 300, LayerMode.PREFILL_VARLEN: 300}[mode]
    assert top["x"][2][0] == T_max
    N_max = 1 if mode.spec.single_sequence else 8
    assert top["slots"][2] == (N_max,) and top["cu_seqlens"][2] == (N_max + 1,)


def test_bucket_for_picks_a_profile_or_names_the_ranges():
    s = graph_spec(preset("tiny-next"), 0, LayerMode.DECODE_MULTI_SEQ, Limits(max_seqs=8, seq_buckets=(2, 8)))
    assert s.bucket_for({"N": 1, "S": 16}) == 0 and s.bucket_for({"N": 5, "S": 16}) == 1
    with pytest.raises(ValueError, match="outside every profile"):
        s.bucket_for({"N": 9, "S": 16})


def test_check_names_lists_missing_and_extra():
    s = graph_spec(preset("tiny-next"), 0, LayerMode.DECODE, Limits())
    s.check_names(list(s.input_names), list(s.output_names))
    with pytest.raises(ValueError, match=r"inputs: missing \['slots'\], extra \['slot'\]"):
        s.check_names([n if n != "slots" else "slot" for n in s.input_names], list(s.output_names))


@MODES
@pytest.mark.parametrize("name,layer", LAYERS)
def test_json_round_trip(name, layer, mode):
    s = graph_spec(preset(name), layer, mode, Limits(seq_buckets=(4, 8)), "bfloat16")
    assert GraphSpec.from_json(s.to_json()) == s


@pytest.mark.parametrize("kwargs,msg", [
    (dict(max_seqs=0), "max_seqs must be >= 1"),
    (dict(max_seqs=8, pool_slots=4), "must hold max_seqs"),
    (dict(max_seqs=8, seq_buckets=(4, 6)), "seq_buckets must rise strictly from >= 1 to 8"),
    (dict(max_tokens=64, token_buckets=(32, 16, 64)), "token_buckets"),
])
def test_limits_are_validated(kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        Limits(**kwargs)


def test_graph_spec_refuses_non_gdn_layers_and_bad_dtypes():
    cfg = preset("tiny-3.5")
    with pytest.raises(ValueError, match="not a GDN layer"):
        graph_spec(cfg, 3, LayerMode.DECODE, Limits())
    with pytest.raises(ValueError, match="activation dtype"):
        graph_spec(cfg, 0, LayerMode.DECODE, Limits(), "int32")
