"""LoRA on the layer, float64 on the CPU: every target of every family mapped right, merged == unmerged == the
reference, and a batch mixing adapters equal to each sequence alone in every mode.

- For every target (Qwen3-Next's interleaved in_proj_qkvz / in_proj_ba included) the float64 reference
  `x W^T + scale (x A^T) B^T` is computed from the raw HF tensors of the checkpoint and the adapter files, moved to
  the internal row order by a permutation built here by hand, and compared with the merged weights and with the
  slot update (slot 1 = the adapter, slot 0 = another one, -1 = none, which must leave the base output bit-equal).
  PEFT's scaling options are exercised: rsLoRA (alpha / sqrt(r)), rank_pattern and alpha_pattern.
- Mixed batches: sequences bound to adapter 1, no adapter and adapter 0 in one DECODE_MULTI_SEQ / VERIFY_MULTI /
  PREFILL_VARLEN step of the unmerged layer == each sequence alone in DECODE / DECODE_BATCHED / PREFILL on the layer
  with its adapter merged (base layer for none): outputs, pools, stashes and captures; and each sequence alone
  through the slots in those single-sequence modes == merged. Pools start random.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gdn_trt.export.tolerances import tol
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import (LoraInput, LoraLimits, LoraTarget, Proj, SlotWeights, apply_sites, build_slots,
                                merge_layer, one_hot)
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.model.peft import SyntheticAdapter, load_adapter, make_synthetic_adapter, merge_checkpoint
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput
from gdn_trt.plugins.packing import Packing

from .lora_support import checkpoint_with_adapters, hf_tensor, internal_index, to_f64, token_slots
from .tolerances import assert_close

F64 = torch.float64
EXACT = tol(F64)
# rsLoRA with per-module ranks and alphas: a wrong scale or rank shows in the reference comparison
PATTERNED = SyntheticAdapter(r=4, alpha=8.0, use_rslora=True, alpha_pattern=(("out_proj", 3.0),),
                             rank_pattern=(("in_proj_z", 2), ("down_proj", 6), ("in_proj_ba", 3)), attention=True)
OTHER = SyntheticAdapter(r=3, alpha=5.0)
LIMITS = LoraLimits(max_adapters=2, max_rank=6)


def _proj(lw, p: Proj) -> torch.Tensor:
    mlp = lw.mlp
    return {Proj.IN_PROJ: lw.mixer.in_proj, Proj.OUT_PROJ: lw.mixer.out_proj,
            Proj.GATE_UP: None if mlp is None else mlp.gate_up, Proj.DOWN: None if mlp is None else mlp.down}[p]


@pytest.mark.parametrize("preset", ["tiny-next", "tiny-next-mlp", "tiny-3.5", "tiny-4exp"])
def test_every_target_merged_equals_unmerged_equals_reference(preset, tmp_path):
    ck, (ad, other) = checkpoint_with_adapters(preset, tmp_path, [PATTERNED, OTHER])
    cfg = ck.config
    assert len(ad.skipped) == 4 and all("self_attn" in k for k in ad.skipped)  # q/o_proj of the attention layer
    merged = merge_checkpoint(ck, ad)
    merged64 = {lw.index: merge_layer(cfg, to_f64(lw), ad) for lw in ck.layers}
    checked = set()
    g = torch.Generator().manual_seed(0)
    for lw in ck.layers:
        i = lw.index
        slots = build_slots(cfg, i, LIMITS, [other, ad], F64)
        idx = torch.tensor([1, 1, 0, -1, 1], dtype=torch.int32)
        lora = LoraInput(idx, slots)
        lw64 = to_f64(lw)
        for t, site in GdnLayer(cfg, lw).lora_sites.items():
            assert t in ad.layers[i], f"the adapter covers every target of layer {i}"
            stem = f"layers.{i}.{t.module}"
            W = hf_tensor(ck.path / "model.safetensors", stem + ".weight").double()
            A = hf_tensor(tmp_path / "adapter0/adapter_model.safetensors", stem + ".lora_A.weight").double()
            B = hf_tensor(tmp_path / "adapter0/adapter_model.safetensors", stem + ".lora_B.weight").double()
            module = t.value
            r = dict(PATTERNED.rank_pattern).get(module, PATTERNED.r)
            scale = dict(PATTERNED.alpha_pattern).get(module, PATTERNED.alpha) / math.sqrt(r)
            assert A.shape[0] == r and ad.layers[i][t].scale == pytest.approx(scale, rel=1e-15)
            x = torch.randn(5, site.in_dim, generator=g, dtype=F64)
            ref = torch.empty(5, site.out_dim, dtype=F64)
            ref[:, internal_index(cfg, t)] = x @ W.T + scale * (x @ A.T) @ B.T  # HF rows -> internal rows
            base = F.linear(x, _proj(lw64, site.proj))
            got_merged = F.linear(x, _proj(merged64[i], site.proj))[:, site.lo:site.hi]
            unmerged = apply_sites(base, x, one_hot(lora), lora, [site])
            rows = idx == 1
            assert_close(f"{preset} layer {i} {t.value}: merged vs reference", ref[rows], got_merged[rows], EXACT)
            assert_close(f"{preset} layer {i} {t.value}: slots vs reference", ref[rows],
                         unmerged[rows, site.lo:site.hi], EXACT)
            other_ref = F.linear(x[2:3], _proj(merge_layer(cfg, lw64, other), site.proj))[:, site.lo:site.hi]
            assert_close(f"{preset} layer {i} {t.value}: slot 0 (another adapter)", other_ref,
                         unmerged[2:3, site.lo:site.hi], EXACT)
            assert torch.equal(unmerged[3], base[3]), "slot -1 must leave the base projection bit-equal"
            # the merged checkpoint (weights in the checkpoint's fp32) agrees to fp32 rounding
            got32 = F.linear(x.float(), _proj(next(m for m in merged.layers if m.index == i), site.proj).float())
            assert_close(f"{preset} layer {i} {t.value}: merged fp32", ref[rows].float(),
                         got32[rows, site.lo:site.hi], tol(torch.float32))
            checked.add(t)
    assert checked == set(ad.targets)


def test_prefix_with_or_without_language_model(tmp_path):
    ck, (ad,) = checkpoint_with_adapters("tiny-3.5", tmp_path, [SyntheticAdapter()])
    other = load_adapter(make_synthetic_adapter("tiny-3.5", tmp_path / "flat", SyntheticAdapter(language_model=False),
                                                seed=10), ck.config)
    assert other.digest() == ad.digest()


def test_merge_leaves_the_checkpoint_unchanged(tmp_path):
    ck, (ad,) = checkpoint_with_adapters("tiny-next-mlp", tmp_path, [SyntheticAdapter()])
    before = [{k: v.clone() for k, v in lw.named_tensors().items()} for lw in ck.layers]
    merged = merge_checkpoint(ck, ad)
    assert merged.merged_adapter == ad.digest() and ck.merged_adapter is None
    for lw, b in zip(ck.layers, before):
        assert all(torch.equal(v, b[k]) for k, v in lw.named_tensors().items())
    changed = {k for lw, m in zip(ck.layers, merged.layers) for k, v in m.named_tensors().items()
               if not torch.equal(v, lw.named_tensors()[k])}
    assert changed == {"mixer.in_proj", "mixer.out_proj", "mlp.gate_up", "mlp.down"}


# ---- a batch mixing adapters == each sequence alone, in every mode ----
MIXED = [(LayerMode.DECODE_MULTI_SEQ, LayerMode.DECODE, [1, 1, 1]),
         (LayerMode.VERIFY_MULTI, LayerMode.DECODE_BATCHED, [3, 2, 4]),
         (LayerMode.PREFILL_VARLEN, LayerMode.PREFILL, [9, 5, 66])]
LAYERS = [("tiny-next-mlp", 1), ("tiny-3.5", 0), ("tiny-4exp", 1)]
ADAPTER_OF = [1, -1, 0]  # slot per sequence: adapter 1, none, adapter 0
POOL_ROWS = [4, 1, 2]
CAPTURE = [3, -1, 64]


@pytest.fixture(scope="module", params=[pytest.param(c, id=f"{c[0]}-layer{c[1]}") for c in LAYERS])
def layers(request, tmp_path_factory):
    name, i = request.param
    ck, ads = checkpoint_with_adapters(name, tmp_path_factory.mktemp(name), [OTHER, SyntheticAdapter(r=6)])
    cfg, lw = ck.config, to_f64(next(lw for lw in ck.layers if lw.index == i))
    merged = [GdnLayer(cfg, merge_layer(cfg, lw, ad), F64) for ad in ads]
    return cfg, GdnLayer(cfg, lw, F64), merged, build_slots(cfg, i, LIMITS, ads, F64)


def _extra(cfg, i, mode, lengths, capture):
    spec = BufferSpec(F64)
    if mode.spec.writes is Writes.STASH:
        return StateStash.allocate(cfg, i, sum(lengths), spec)
    if mode.spec.writes is Writes.POOLS_CAPTURE:
        return StateCapture.allocate(cfg, i, torch.tensor(capture, dtype=torch.int32), spec)
    return None


def _run(layer, mode, data, lengths, where):
    """`data` = (x, residual, ple_rows); `where` = (pool rows, capture points, pools, LoRA input)."""
    cfg, i = layer.cfg, layer.index
    pool_rows, capture, state, lora = where
    x, res, ple = data
    step = StepInput(x, Packing.build(lengths, pool_rows), res, ple, lora)
    extra = _extra(cfg, i, mode, lengths, capture)
    return layer.run(mode, step, state, extra)


@pytest.mark.parametrize("mixed_mode,alone_mode,lengths", [pytest.param(*m, id=m[0].value) for m in MIXED])
def test_mixed_adapters_equal_each_sequence_alone(layers, mixed_mode, alone_mode, lengths):
    cfg, base, merged, slots = layers
    i, T = base.index, sum(lengths)
    g = torch.Generator().manual_seed(sum(lengths))
    x = torch.randn(T, cfg.stream_dim, generator=g, dtype=F64)
    res = None if cfg.is_hc else torch.randn(T, cfg.stream_dim, generator=g, dtype=F64)
    ple = torch.randn(T, cfg.ple_heads, cfg.ple_head_dim, generator=g, dtype=F64) if base.ple is not None else None
    pool = LayerState.allocate(cfg, i, 6, BufferSpec(F64))
    for t in pool.tensors():
        t.copy_(torch.randn(t.shape, generator=g, dtype=F64) * 0.5)
    start = [t.clone() for t in pool.tensors()]
    lora = LoraInput(token_slots(lengths, ADAPTER_OF), slots)
    caps = [min(c, n) for c, n in zip(CAPTURE, lengths)]
    res_mixed = _run(base, mixed_mode, (x, res, ple), lengths, (POOL_ROWS, caps, pool, lora))
    off = [0]
    for n in lengths:
        off.append(off[-1] + n)
    for k, (n, s, row) in enumerate(zip(lengths, ADAPTER_OF, POOL_ROWS)):
        a, b = off[k], off[k + 1]
        alone_pool = LayerState(*(t.clone() if t is not None else None for t in _like(pool, start)))
        layer = base if s < 0 else merged[s]
        part = (x[a:b], None if res is None else res[a:b], None if ple is None else ple[a:b])
        got = _run(layer, alone_mode, part, [n], ([row], [caps[k]], alone_pool, None))
        what = f"{mixed_mode.value} seq {k} (adapter {s})"
        # the same sequence alone through the slots (unmerged) in the single-sequence mode
        slot_pool = LayerState(*(t.clone() if t is not None else None for t in _like(pool, start)))
        alone_lora = LoraInput(token_slots([n], [s]), slots)
        unmerged = _run(base, alone_mode, part, [n], ([row], [caps[k]], slot_pool, alone_lora))
        assert_close(f"{alone_mode.value} seq {k}: unmerged vs merged", got[0].x, unmerged[0].x, EXACT)
        for part_m, part_u in zip(got[1:], unmerged[1:]):  # pools, stash or capture buffers
            for name in ("conv", "ssm", "ple_conv"):
                if getattr(part_m, name) is not None:
                    assert_close(f"{alone_mode.value} seq {k}: unmerged vs merged {name}", getattr(part_m, name),
                                 getattr(part_u, name), EXACT)
        assert_close(f"{what}: output", got[0].x, res_mixed[0].x[a:b], EXACT)
        if got[0].residual is not None:
            assert_close(f"{what}: residual", got[0].residual, res_mixed[0].residual[a:b], EXACT)
        for name in ("conv", "ssm", "ple_conv"):
            if getattr(pool, name) is None:
                continue
            if mixed_mode.spec.writes is not Writes.STASH:
                assert_close(f"{what}: {name} pool row", getattr(alone_pool, name)[row], getattr(pool, name)[row],
                             EXACT)
            if mixed_mode.spec.writes is Writes.STASH:
                assert_close(f"{what}: {name} stash", getattr(got[1], name), getattr(res_mixed[1], name)[a:b], EXACT)
            if mixed_mode.spec.writes is Writes.POOLS_CAPTURE and caps[k] >= 0:
                assert_close(f"{what}: {name} capture", getattr(got[2], name)[0], getattr(res_mixed[2], name)[k],
                             EXACT)
    untouched = [r for r in range(6) if r not in POOL_ROWS or mixed_mode.spec.writes is Writes.STASH]
    for t, t0 in zip(pool.tensors(), start):
        assert torch.equal(t[untouched], t0[untouched]), "rows of other slots must not change"


def _like(pool: LayerState, start: list[torch.Tensor]) -> list[torch.Tensor | None]:
    it = iter(start)
    return [next(it) if getattr(pool, n) is not None else None for n in ("conv", "ssm", "ple_conv")]


def test_lora_input_checked_before_anything_runs(layers):
    cfg, base, _, slots = layers
    pool = LayerState.allocate(cfg, base.index, 2, BufferSpec(F64))
    x = torch.randn(2, cfg.stream_dim, dtype=F64)
    res = None if cfg.is_hc else torch.zeros_like(x)
    ple = torch.zeros(2, cfg.ple_heads, cfg.ple_head_dim, dtype=F64) if base.ple is not None else None
    step = lambda lora: StepInput(x, Packing.build([1, 1], [0, 1]), res, ple, lora)  # noqa: E731
    t0 = next(iter(slots))
    idx = torch.tensor([0, 1], dtype=torch.int32)
    fp32 = {t0: SlotWeights(slots[t0].a.float(), slots[t0].b)}
    foreign = LoraTarget.IN_PROJ_QKVZ if cfg.family.value != "qwen3_next" else LoraTarget.IN_PROJ_QKV
    cases = [(LoraInput(torch.tensor([0, 2], dtype=torch.int32), slots), "lora_idx values must be -1"),
             (LoraInput(torch.tensor([0], dtype=torch.int32), slots), "1 entries for 2 tokens"),
             (LoraInput(torch.tensor([0, 1]), slots), "must be a 1-D int32"),
             (LoraInput(idx, fp32), "must be torch.float64"),
             (LoraInput(idx, {foreign: slots[t0]}), "this layer's targets")]
    before = [t.clone() for t in pool.tensors()]
    for lora, msg in cases:
        with pytest.raises(ValueError, match=msg):
            base.decode_multi_seq(step(lora), pool)
        assert all(torch.equal(a, b) for a, b in zip(pool.tensors(), before))
