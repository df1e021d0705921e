"""Helpers shared by the fused-glue tests (no tests here): random inputs of each glue function, poisoned outputs,
and one step of every LayerMode run through a layer with the fused or the torch glue (same inputs, same start
state), so a test can compare outputs and every state buffer the step wrote."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from gdn_trt.model.checkpoint import random_layer
from gdn_trt.model.config import GdnConfig, preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import LoraInput, SlotWeights
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.model.state import BufferSpec, LayerState, StateCapture, StateStash, StepInput
from gdn_trt.plugins.glue import naive
from gdn_trt.plugins.glue.io import PleNorms
from gdn_trt.plugins.packing import Packing

from .tolerances import assert_close

SLOTS = 6
# (lengths, slots, capture_at or None) per mode: padding rows, an empty verify row, a capture inside a chunk
STEPS = {
    LayerMode.DECODE: ([1], [3], None),
    LayerMode.DECODE_MULTI_SEQ: ([1, 1, 1, 1], [3, -1, 0, 5], None),
    LayerMode.DECODE_BATCHED: ([4], [2], None),
    LayerMode.VERIFY_MULTI: ([3, 0, 2], [1, 4, 2], None),
    LayerMode.PREFILL: ([70], [4], [33]),
    LayerMode.PREFILL_VARLEN: ([5, 66, 0, 9], [2, 0, 1, 3], [5, 64, -1, 0]),
}
# (preset, layer index): plain mixer-only, plain + dense MLP, plain Qwen3.5, hc + PLE, hc without PLE
LAYERS = [("tiny-next", 0), ("tiny-next-mlp", 1), ("tiny-3.5", 2), ("tiny-4exp", 1), ("tiny-4exp", 2)]


def make_layer(cfg: GdnConfig | str, i: int, dtype: torch.dtype, device: str = "cpu", seed: int = 0) -> GdnLayer:
    cfg = preset(cfg) if isinstance(cfg, str) else cfg
    return GdnLayer(cfg, random_layer(cfg, i, torch.Generator().manual_seed(seed)), dtype).to(device)


def random_lora(layer: GdnLayer, T: int, dtype: torch.dtype, device: str, slots: int = 3, rank: int = 4
                ) -> LoraInput:
    """Random adapters in every target slot of the layer; each token picks a slot or none (-1)."""
    w = {t: SlotWeights(torch.randn(slots, rank, s.in_dim, dtype=dtype, device=device) * 0.1,
                        torch.randn(slots, rank, s.out_dim, dtype=dtype, device=device) * 0.1)
         for t, s in layer.lora_sites.items()}
    idx = torch.randint(-1, slots, (T,), dtype=torch.int32, device=device)
    return LoraInput(idx, w)


@dataclass
class Ran:
    """What one step returned: the output (x, residual) and every state buffer the mode writes."""

    x: torch.Tensor
    residual: torch.Tensor | None
    buffers: dict[str, torch.Tensor]


def run_step(layer: GdnLayer, mode: LayerMode, fused: bool, seed: int = 0, lora: bool = False) -> Ran:
    """One step of `mode` on random inputs and a random start state (both drawn from `seed`, so the fused and
    the torch glue see the same ones)."""
    cfg, dev, dt = layer.cfg, layer.mixer.in_proj.device, layer.dtype
    lengths, slots, at = STEPS[mode]
    T = sum(lengths)
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dev)  # noqa: E731
    spec = BufferSpec(dt, dev)
    state = LayerState.allocate(cfg, layer.index, SLOTS, spec)
    for t in state.tensors():
        t.copy_(rnd(*t.shape) * 0.5)
    x = rnd(T, cfg.stream_dim).to(dt)
    res = None if cfg.is_hc else rnd(T, cfg.stream_dim).to(dt)
    rows = rnd(T, cfg.ple_heads, cfg.ple_head_dim).to(dt) if layer.ple is not None else None
    step = StepInput(x, Packing.build(lengths, slots, dev), res, rows)
    if lora:
        torch.manual_seed(seed)
        step.lora = random_lora(layer, T, dt, dev)
    layer.fused_glue = fused
    if mode.spec.writes is Writes.STASH:
        extra = StateStash.allocate(cfg, layer.index, T, spec)
        for t in (extra.conv, extra.ssm, extra.ple_conv):
            if t is not None:
                t.fill_(float("nan"))  # every stash row is written
    elif mode.spec.writes is Writes.POOLS_CAPTURE:
        extra = StateCapture.allocate(cfg, layer.index, torch.tensor(at, dtype=torch.int32, device=dev), spec)
        for t in (extra.conv, extra.ssm, extra.ple_conv):
            if t is not None:
                t.copy_(rnd(*t.shape))  # rows with at = -1 stay as they are
    else:
        extra = None
    try:
        out = layer.run(mode, step, state, extra)
    finally:
        layer.fused_glue = None
    bufs = {f"pool.{f.name}": getattr(state, f.name) for f in fields(LayerState) if getattr(state, f.name) is not None}
    if extra is not None:
        kind = "stash" if mode.spec.writes is Writes.STASH else "capture"
        bufs.update({f"{kind}.{f.name}": getattr(extra, f.name) for f in fields(extra)
                     if f.name != "at" and getattr(extra, f.name) is not None})
    return Ran(out[0].x, out[0].residual, bufs)


def assert_same_step(name: str, ref: Ran, got: Ran, bound) -> None:
    assert_close(f"{name} output", ref.x, got.x, bound)
    if ref.residual is not None:
        assert_close(f"{name} residual", ref.residual, got.residual, bound)
    assert ref.buffers.keys() == got.buffers.keys()
    for k in ref.buffers:
        assert_close(f"{name} {k}", ref.buffers[k], got.buffers[k], bound)


# ---- one glue function on random inputs ----
@dataclass(frozen=True)
class Shape:
    """Token count and widths of the glue inputs: n streams of C channels, HV heads of V, I, R."""

    T: int
    C: int
    n: int = 1
    HV: int = 4
    V: int = 12
    I: int = 24
    R: int = 8


def glue_cases(s: Shape, dtype: torch.dtype, device: str, seed: int) -> dict[str, tuple]:
    """name -> the arguments of that glue function (activations in `dtype`, weights in `dtype`, random).
    Row-strided operands (column slices of a wider tensor) stand where the layer passes them."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *sh: torch.randn(*sh, generator=g).to(device, dtype)  # noqa: E731
    D = s.n * s.C
    wide = rnd(s.T, D + 7)[:, 3:3 + D]  # a strided row view
    inj_w = rnd(s.n, D) * D ** -0.5
    proj = rnd(s.T, s.HV * s.V * 2 + 5)
    z = proj[:, 5 + s.HV * s.V:].reshape(s.T, s.HV, s.V)  # as the layer's z: a column slice, row stride > HV*V
    norms = PleNorms(rnd(D) * 0.1, rnd(D) * 0.1, rnd(D) * 0.1, 1e-6)
    return {
        "add_rms_norm": (wide, (rnd(s.T, D),), rnd(D) * 0.1, 1e-6, s.C),
        "add_rms_norm_two": (rnd(s.T, D), (rnd(s.T, D), wide), rnd(D) * 0.1, 1e-6, s.C),
        "rms_norm": (wide, (), rnd(D) * 0.1, 1e-6, s.C),
        "hc_norm": (rnd(s.T, D), (rnd(s.T, D), rnd(s.T, D)), rnd(D) * 0.1, inj_w, 1e-6),
        "hc_norm_plain": (wide, (), rnd(D) * 0.1, inj_w, 1e-6),
        "gated_rms_norm": (rnd(s.T, s.HV, s.V), z, rnd(s.V) * 0.1 + 1, 1e-6, "silu"),
        "gated_rms_norm_sigmoid": (rnd(s.T, s.HV, s.V), z, rnd(s.V) * 0.1 + 1, 1e-6, "sigmoid"),
        "silu_mul": (rnd(s.T, 2 * s.I),),
        "silu_div": (rnd(s.T, s.R + 3)[:, :s.R], s.n),
        "hc_mix": (rnd(s.T, D), wide, s.n),
        "hc_inject": (wide, torch.randn(s.T, s.n, s.n, generator=g).to(device), rnd(s.T, s.C)),  # fp32 logits
        "ple_gate": (rnd(s.T, D), rnd(s.T, s.C), wide, norms),
    }


def entry(name: str) -> str:
    """The glue function a case name exercises."""
    for f in ("add_rms_norm", "hc_norm", "gated_rms_norm", "silu_mul", "silu_div", "hc_mix", "hc_inject",
              "ple_gate"):
        if name.startswith(f):
            return f
    return "add_rms_norm"  # "rms_norm": no adds


def as_f64(args: tuple) -> tuple:
    """The same arguments in float64 on the CPU (tensors, tuples of tensors and PleNorms)."""
    def conv(a):
        if isinstance(a, torch.Tensor):
            return a.detach().double().cpu()
        if isinstance(a, tuple):
            return tuple(conv(t) for t in a)
        if isinstance(a, PleNorms):
            return PleNorms(conv(a.key), conv(a.query), conv(a.conv), a.eps)
        return a
    return tuple(conv(a) for a in args)


def reference(name: str, args: tuple):
    out = getattr(naive, entry(name))(*as_f64(args))
    return out if isinstance(out, tuple) else (out,)


def check_fused_choice(monkeypatch, layer: GdnLayer, gate: str, entry: str, taken) -> None:
    """A layer's choice of a fused entry of `glue.op`: every LayerMode step, with and without LoRA, run with the
    entry's own test (`op.<gate>`) forced false and then true (on the CPU the entry runs its float64 reference).
    The entry `op.<entry>` ran exactly where taken(mode, lora) says, and output and every buffer are bit for bit
    those of the unfused run."""
    from gdn_trt.plugins.glue import op

    calls = []
    fused = getattr(op, entry)
    monkeypatch.setattr(op, entry, lambda *a: calls.append(1) or fused(*a))
    for mode in LayerMode:
        for lora in (False, True):
            monkeypatch.setattr(op, gate, lambda *a: False)
            want = run_step(layer, mode, True, lora=lora)
            monkeypatch.setattr(op, gate, lambda *a: True)
            calls.clear()
            got = run_step(layer, mode, True, lora=lora)
            where = (layer.cfg.name, mode.value, lora)
            assert bool(calls) == taken(mode, lora), where
            assert torch.equal(want.x, got.x) and want.buffers.keys() == got.buffers.keys(), where
            for k in want.buffers:
                assert torch.equal(want.buffers[k], got.buffers[k]), (*where, k)

def decode_eager_and_replayed(layer: GdnLayer, x: torch.Tensor, residual: torch.Tensor | None,
                              ple_rows: torch.Tensor | None) -> tuple:
    """DECODE_MULTI_SEQ of 4 sequences (slots 0, 2, padding, 1 of a 3-slot pool of random state) on CUDA: run eagerly,
    warmed on a side stream, captured in a CUDA graph and replayed from the same start. Asserts that the replay's
    pools equal the eager run's bit for bit; returns (eager output, replayed output)."""
    spec = BufferSpec(x.dtype, "cuda")
    step = StepInput(x, Packing.build([1] * 4, [0, 2, -1, 1], "cuda"), residual, ple_rows)
    start = LayerState.allocate(layer.cfg, layer.index, 3, spec)
    for t in start.tensors():
        t.normal_()

    def copy() -> LayerState:
        return LayerState(*[t.clone() if t is not None else None for t in (start.conv, start.ssm, start.ple_conv)])

    eager, graphed, warm = copy(), copy(), copy()
    want, _ = layer.decode_multi_seq(step, eager)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer.decode_multi_seq(step, warm)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = layer.decode_multi_seq(step, graphed)
    for a, b in zip(graphed.tensors(), start.tensors()):
        a.copy_(b)
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(eager.tensors(), graphed.tensors()))
    return want, out
