"""GraphSpec: the one I/O contract of every graph (names, order, dtypes, dims, aliasing, profiles)."""

from __future__ import annotations

import json

import pytest
import torch

from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.export.spec import GraphSpec, Limits, Role, Variant, gdn_runs, graph_spec
from gdn_trt.model.config import preset
from gdn_trt.model.checkpoint import random_layer
from gdn_trt.model.layer import GdnLayer, weight_shapes
from gdn_trt.model.lora import LoraLimits

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
    weights = list(weight_shapes(cfg, layer))
    assert list(s.input_names) == want_in + weights
    assert [(t.dims, t.dtype) for t in s.inputs if t.role is Role.WEIGHT] == [
        (shape, "float32" if gate else cfg.dtype) for shape, gate in weight_shapes(cfg, layer).values()]
    assert all(t.layer == layer and t.local == t.name for t in s.inputs if t.name not in acts + [
        "cu_seqlens", "slots", "capture_at"]), "per-layer tensors record their layer"
    assert s.layer_ids == (layer,) and not s.is_stack and s.folder == f"layer{layer}" and not s.weights_inside
    inside = graph_spec(cfg, layer, mode, Limits(), weights=False)
    assert inside.weights_inside and list(inside.input_names) == want_in
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
@pytest.mark.parametrize("name,layer", LAYERS + [pytest.param("tiny-3.5", (0, 1, 2), id="plain-stack"),
                                                 pytest.param("hc-dense", (0, 1, 2), id="hc+ple-stack")])
@pytest.mark.parametrize("weights", [True, False], ids=["weight-inputs", "weights-inside"])
def test_json_round_trip(name, layer, mode, weights):
    cfg = HC_DENSE if name == "hc-dense" else preset(name)
    s = graph_spec(cfg, layer, mode, Limits(seq_buckets=(4, 8), lora=LoraLimits(2, 4)), "bfloat16", weights)
    back = GraphSpec.from_json(json.loads(json.dumps(s.to_json())))
    assert back == s and back.layer_ids == s.layer_ids and back.weights_inside is (not weights)
    assert [t.layer for t in back.inputs] == [t.layer for t in s.inputs]


def test_json_of_a_manifest_before_stacks_reads_as_one_layer():
    """Manifests written before `layer_ids` and `TensorSpec.layer` existed still read (as per-layer graphs)."""
    d = graph_spec(preset("tiny-3.5"), 1, LayerMode.DECODE, Limits()).to_json()
    del d["layer_ids"]
    for t in (*d["inputs"], *d["outputs"]):
        del t["layer"]
    s = GraphSpec.from_json(d)
    assert s.layer_ids == (1,) and all(t.layer is None for t in s.inputs) and s.input("ssm_pool").local == "ssm_pool"


# tiny-4exp with a dense MLP in every GDN layer: no FFN of the host between them, so its three GDN layers (hc, hc+PLE,
# hc) form one run; the preset itself (MoE outside, no dense MLP) has runs of one layer
HC_DENSE = preset("tiny-4exp").replace(intermediate_size=16, dense_mlp_layers=(0, 1, 2), name="tiny-4exp-dense")


@pytest.mark.parametrize("cfg,runs", [
    (preset("tiny-3.5"), [(0, 1, 2)]),
    (preset("tiny-next"), [(0,), (1,), (2,)]),  # an MoE after every mixer (no dense MLP): nothing to fuse
    (preset("tiny-next-mlp"), [(0,), (1, 2)]),  # layer 1 has a dense MLP: layers 1 and 2 are adjacent
    (HC_DENSE, [(0, 1, 2)]),
    (preset("tiny-3.5").replace(layer_types=("linear_attention", "full_attention") + ("linear_attention",) * 3
                                + ("full_attention", "linear_attention"), dense_mlp_layers=tuple(range(7))),
     [(0,), (2, 3, 4), (6,)]),  # attention layers split the runs
    (preset("qwen3.5-27b"), [(4 * k, 4 * k + 1, 4 * k + 2) for k in range(16)]),
    (preset("qwen3-next-80b-a3b"), [(i,) for i in preset("qwen3-next-80b-a3b").gdn_layer_ids]),
], ids=["plain", "moe", "one-dense", "hc-dense", "hybrid", "qwen3.5-27b", "qwen3-next"])
def test_gdn_runs_split_at_whatever_the_host_runs_between_layers(cfg, runs):
    assert gdn_runs(cfg) == runs
    assert gdn_runs(cfg, (0, 2)) == [(0,), (2,)], "a layer left out splits a run"


@MODES
def test_stack_spec_prefixes_each_layer_and_shares_the_rest(mode):
    cfg, ids = HC_DENSE, (0, 1, 2)
    lim = Limits(lora=LoraLimits(2, 4))
    s = graph_spec(cfg, ids, mode, lim)
    per = {i: graph_spec(cfg, i, mode, lim) for i in ids}
    assert s.is_stack and s.layer_ids == ids and s.layer_idx == 0 and s.folder == "stack0-2"
    assert s.where == "layers 0-2" and s.stem == mode.value + "+hc+ple+lora"
    shared = ["streams", "cu_seqlens", "slots", "capture_at", "lora_idx"]
    assert [t.name for t in s.inputs if t.layer is None] == [n for n in shared if n in per[0].input_names]
    for i in ids:  # each layer's tensors: its per-layer graph's, prefixed, same dtype, dims, role and order
        mine = [t for t in s.inputs if t.layer == i]
        want = [t for t in per[i].inputs if t.name not in shared]
        assert [(t.name, t.dtype, t.dims, t.role) for t in mine] == [
            (f"l{i}." + t.name, t.dtype, t.dims, t.role) for t in want]
        assert all(t.local == w.name for t, w in zip(mine, want))
    order = [t.role for t in s.inputs]
    assert order.index(Role.WEIGHT) > max(k for k, r in enumerate(order) if r is not Role.WEIGHT), "weights last"
    assert s.aliases == {f"l{i}.{o}": f"l{i}.{a}" for i in ids for o, a in per[i].aliases.items()}
    assert [t.name for t in s.outputs][:1] == ["streams_out"]
    assert s.buckets == per[0].buckets


def test_stack_spec_refuses_what_is_not_one_run():
    with pytest.raises(ValueError, match="not one run"):
        graph_spec(preset("tiny-next"), (0, 1), LayerMode.DECODE, Limits())  # an MoE between them
    with pytest.raises(ValueError, match="not one run"):
        graph_spec(preset("tiny-3.5"), (0, 2), LayerMode.DECODE, Limits())
    with pytest.raises(ValueError, match="not a GDN layer"):
        graph_spec(preset("tiny-3.5"), (2, 3), LayerMode.DECODE, Limits())
    assert graph_spec(preset("tiny-3.5"), (1,), LayerMode.DECODE, Limits()) == graph_spec(
        preset("tiny-3.5"), 1, LayerMode.DECODE, Limits()), "a run of one layer is its per-layer graph"


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


@pytest.mark.parametrize("cfg", [preset("tiny-3.5"), preset("tiny-4exp"), preset("tiny-next"),
                                 preset("tiny-next-mlp"), HC_DENSE], ids=lambda c: c.name)
def test_weight_shapes_are_what_the_layer_holds(cfg):
    """The weight inputs come from the config alone (`weight_shapes`); a layer built from real weights holds exactly
    these floating-point buffers, in this order, with these shapes and dtypes (gate parameters stay fp32)."""
    gen = torch.Generator().manual_seed(0)
    for i in cfg.gdn_layer_ids:
        layer = GdnLayer(cfg, random_layer(cfg, i, gen), torch.bfloat16)
        got = {n: (tuple(t.shape), t.dtype) for n, t in layer.weights().items()}
        want = {n: (shape, torch.float32 if gate else torch.bfloat16) for n, (shape, gate) in
                weight_shapes(cfg, i).items()}
        assert list(got) == list(want) and got == want
        assert {n for n, b in layer.named_buffers()} - set(got) == (
            {f"ple.{n}" for n in ("multipliers", "head_sizes", "head_offsets")} if cfg.has_ple(i) else set())
