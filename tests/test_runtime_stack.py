"""Stack engines and weights as graph inputs on the runtime side, without TensorRT (nothing here builds or runs a
TensorRT engine; `tests/test_runtime_trt.py` does that where TensorRT exists):

- `bind_inputs` binds every input of a stack GraphSpec (every mode, hc and hc+PLE layers, LoRA slots) to the
  runtime's own tensors: each layer's pools, stash or capture rows, PLE rows and adapter slots, the shared packing,
  and each layer's weights from the one copy the PyTorch engine computes with (same storage, no copy);
- `check_weights` refuses a plan whose weight inputs differ from the layers' weights;
- `find_plans` indexes stack plans by their run, refuses runs that are not runs, overlapping stacks and plans with
  their weights inside;
- the stack loop runs an engine covering several layers once per step (an honest PyTorch stack engine over the
  session's layers), with results bit-identical to the per-layer engines, on a plain and on a hybrid layout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import torch

from gdn_trt.export.spec import Limits, Role, gdn_runs, graph_spec
from gdn_trt.model.config import preset
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.state import StepInput, StepOutput
from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.engine import Engine, LayerCall
from gdn_trt.runtime.plans import PlanMismatchError, bind_inputs, check_weights, find_plans
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.session import Session, SessionOptions
from gdn_trt.runtime.stack import Packed, StepContext

LIN, ATT = "linear_attention", "full_attention"
# three GDN layers with a dense MLP each (hc, hc+PLE, hc): one run
HC_DENSE = preset("tiny-4exp").replace(intermediate_size=16, dense_mlp_layers=(0, 1, 2), name="tiny-4exp-dense")
# attention layers split the GDN layers into the runs (0), (2, 3), (5)
HYBRID = preset("tiny-3.5").replace(layer_types=(LIN, ATT, LIN, LIN, ATT, LIN), dense_mlp_layers=tuple(range(6)),
                                    name="tiny-3.5-hybrid")
LORA = LoraLimits(max_adapters=2, max_rank=4)
MODES = pytest.mark.parametrize("mode", list(LayerMode), ids=lambda m: m.value)


def _session(cfg, lora: LoraLimits | None = None, max_seqs: int = 4) -> Session:
    limits = RuntimeLimits(max_seqs=max_seqs, max_prefill_tokens=96, max_draft=4, ple_cache_rows=64, lora=lora)
    return Session.open(cfg, backend="torch", device="cpu", options=SessionOptions(limits=limits, graphs=False))


def _weights(sess: Session) -> dict[int, dict[str, torch.Tensor]]:
    return {c[0].layer_idx: c[0].layer.weights() for c in sess.selector.engines}


def _calls(sess: Session, mode: LayerMode, ids: tuple[int, ...]) -> tuple[LayerCall, ...]:
    cfg = sess.cfg
    lengths = [3] if mode.spec.single_sequence else [1, 1] if mode.spec.one_token_per_sequence else [2, 1]
    if mode.spec.single_sequence and mode.spec.one_token_per_sequence:
        lengths = [1]
    T = sum(lengths)
    packed = sess.stack.packed(torch.zeros(T, cfg.stream_dim), lengths, list(range(len(lengths))),
                               [0, -1][:len(lengths)])
    at = torch.full((len(lengths),), -1, dtype=torch.int32)
    out = []
    for i in ids:
        rows = torch.randn(T, cfg.ple_heads, cfg.ple_head_dim) if cfg.has_ple(i) else None
        step = StepInput(packed.x, packed.pack, packed.residual, rows, sess.adapters.layer_input(i, packed.lora_idx))
        out.append(LayerCall(mode, step, sess.pool.layers[i], sess.stack.extra(mode, i, T, at)))
    return tuple(out)


@MODES
def test_stack_inputs_bind_to_the_runtime_tensors_and_the_one_weight_copy(mode):
    sess = _session(HC_DENSE, LORA)
    ids = gdn_runs(HC_DENSE)[0]
    spec = graph_spec(HC_DENSE, ids, mode, Limits(4, 96, 4, 4, lora=LORA), "float32")
    calls, weights = _calls(sess, mode, ids), _weights(sess)
    bound = bind_inputs(calls, spec, weights)
    assert list(bound) == list(spec.input_names)
    by_layer = dict(zip(ids, calls))
    for t in spec.inputs:
        got = bound[t.name]
        call = by_layer.get(t.layer)
        if t.role is Role.WEIGHT:
            want = dict(sess.selector.engines[ids.index(t.layer)][0].layer.named_buffers())[t.local]
        elif t.role is Role.POOL:
            want = getattr(call.state, t.local.rpartition("_")[0])
        elif t.role in (Role.STASH, Role.CAPTURE):
            want = getattr(call.extra, t.local.rpartition("_")[0])
        elif t.role is Role.ADAPTER:
            target, _, part = t.local[len("lora_"):].rpartition("_")
            want = getattr({k.value: v for k, v in call.step.lora.slots.items()}[target], part)
        elif t.local == "ple_rows":
            want = call.step.ple_rows
        else:  # shared: the first layer's activations and packing
            assert t.layer is None
            continue
        assert got.data_ptr() == want.data_ptr() and got.shape == want.shape, f"{t.name} is not bound in place"
    assert bound["cu_seqlens"].data_ptr() == calls[0].step.pack.cu_seqlens.data_ptr()
    with pytest.raises(ValueError, match=r"input l0\.mixer\.in_proj: runtime tensor is None"):
        bind_inputs(calls, spec)
    with pytest.raises(ValueError, match="3 layer calls given"):
        bind_inputs(calls, graph_spec(HC_DENSE, 0, mode, Limits(4, 96, 4, 4, lora=LORA), "float32"), weights)


def test_weight_inputs_must_match_the_layers_weights(tmp_path):
    sess = _session(HC_DENSE)
    spec = graph_spec(HC_DENSE, (0, 1, 2), LayerMode.DECODE, Limits(), "float32")
    weights = _weights(sess)
    check_weights(spec, weights, tmp_path / "p.plan")
    bad = {i: dict(w) for i, w in weights.items()}
    bad[1]["mixer.A_log"] = bad[1]["mixer.A_log"].double()
    del bad[2]["mixer.norm"]
    with pytest.raises(PlanMismatchError, match=r"layer 1 mixer\.A_log is \(6,\) torch\.float64.*layer 2 holds no "
                                                r"mixer\.norm"):
        check_weights(spec, bad, tmp_path / "p.plan")
    other = graph_spec(preset("tiny-4exp"), 1, LayerMode.DECODE, Limits(), "float32")  # no dense MLP
    with pytest.raises(PlanMismatchError, match=r"layer 1 mlp\.gate_up is not a plan input"):
        check_weights(other, {1: weights[1]}, tmp_path / "p.plan")


def _plan(root, spec, **meta):
    d = root / spec.folder
    d.mkdir(parents=True, exist_ok=True)
    raw = f"placeholder bytes of {spec.folder}/{spec.stem}: never deserialized".encode()
    (d / f"{spec.stem}.plan").write_bytes(raw)
    (d / f"{spec.stem}.json").write_text(json.dumps({"config_hash": spec.config_hash, "graph_spec": spec.to_json(),
                                                     "plan_sha256": hashlib.sha256(raw).hexdigest(), **meta}))


def test_find_plans_indexes_stack_plans_by_their_run(tmp_path):
    for ids in gdn_runs(HYBRID):
        for mode in (LayerMode.DECODE, LayerMode.PREFILL):
            _plan(tmp_path, graph_spec(HYBRID, ids if len(ids) > 1 else ids[0], mode, Limits(), "float32"))
    plans = find_plans(tmp_path, HYBRID, "float32")
    assert set(plans) == {(ids, m) for ids in [(0,), (2, 3), (5,)] for m in (LayerMode.DECODE, LayerMode.PREFILL)}
    p = plans[((2, 3), LayerMode.PREFILL)]
    assert p.plan.parent.name == "stack2-3" and p.spec.layer_ids == (2, 3) and p.spec.is_stack


def test_find_plans_refuses_false_runs_and_overlaps(tmp_path):
    good = graph_spec(HC_DENSE, (0, 1, 2), LayerMode.DECODE, Limits(), "float32")
    _plan(tmp_path / "moe", dataclasses.replace(good, config_hash=preset("tiny-4exp").config_hash(),
                                                model="tiny-4exp"))
    with pytest.raises(PlanMismatchError, match=r"layers \[0, 1, 2\], which are not one run"):
        find_plans(tmp_path / "moe", preset("tiny-4exp"), "float32")  # an MoE after every mixer: no run
    _plan(tmp_path / "overlap", good)
    _plan(tmp_path / "overlap", graph_spec(HC_DENSE, (1, 2), LayerMode.DECODE, Limits(), "float32"))
    with pytest.raises(PlanMismatchError, match=r"stack plans of layers \[0, 1, 2\] and \[1, 2\] overlap"):
        find_plans(tmp_path / "overlap", HC_DENSE, "float32")


class TorchStack(Engine):
    """A PyTorch engine over several consecutive layers, one `run_layers` call per step: what the stack loop must
    drive for a TensorRT stack plan, with the session's own PyTorch layers doing the work (no TensorRT involved)."""

    def __init__(self, parts: list[Engine]):
        self.parts, self.layer_idx, self.device = parts, parts[0].layer_idx, parts[0].device
        self.name, self.calls = "torch-stack", 0

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(p.layer_idx for p in self.parts)

    def modes(self):
        return tuple(LayerMode)

    def refuse(self, mode, seqs, tokens):
        return mode.refuse(seqs, tokens)

    def run(self, call, stream):
        raise AssertionError("a stack engine is driven through run_layers")

    def run_layers(self, calls, stream) -> StepOutput:
        assert len(calls) == len(self.parts)
        self.calls += 1
        x, residual = calls[0].step.x, calls[0].step.residual
        for eng, c in zip(self.parts, calls):
            out = eng.run(LayerCall(c.mode, dataclasses.replace(c.step, x=x, residual=residual), c.state, c.extra),
                          stream)
            x, residual = out.x, out.residual
        return out


def _drive(sess: Session, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(2, 12, sess.cfg.stream_dim, generator=g)
    a, b = sess.add_sequence(), sess.add_sequence()
    o = sess.prefill_batch({a: Prompt(h[0, :7]), b: Prompt(h[1, :5])})
    d = sess.decode({a: h[0, 7:8], b: h[1, 5:6]})
    d1 = sess.decode({a: h[0, 8:9]})
    v = sess.verify({a: h[0, 9:12], b: h[1, 6:6]})
    sess.accept({a: 2, b: 0})
    return [o[a].hidden, o[b].hidden, d[a], d[b], d1[a], v[a],
            *(t for st in sess.pool.layers.values() for t in st.tensors())]


@pytest.mark.parametrize("cfg", [preset("tiny-3.5"), HYBRID], ids=["plain", "hybrid"])
def test_stack_loop_runs_a_multi_layer_engine_once_per_step(cfg):
    ref, sess = _session(cfg), _session(cfg)
    stacks = []
    for ids in gdn_runs(cfg):
        if len(ids) > 1:
            pos = [cfg.gdn_layer_ids.index(i) for i in ids]
            stacks.append(TorchStack([sess.selector.engines[k][0] for k in pos]))
    sess.selector.engines = [[*(s for s in stacks if i in s.layer_ids), *c]
                             for i, c in zip(cfg.gdn_layer_ids, sess.selector.engines)]
    got, want = _drive(sess, 0), _drive(ref, 0)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert [s.calls for s in stacks] == [4], "one call per step group: prefill, two decodes, verify"
    groups = sess.stats().table()
    assert "torch-stack" in groups


def test_a_stack_engine_chosen_for_part_of_its_run_is_an_error():
    sess = _session(preset("tiny-3.5"))
    stack = TorchStack([c[0] for c in sess.selector.engines])
    inp = sess.stack.packed(torch.zeros(1, sess.cfg.stream_dim), [1], [sess.pool.allocate()])
    with pytest.raises(ValueError, match=r"runs layers \[0, 1, 2\] in one call but was chosen for 2 consecutive"):
        sess.stack.run(LayerMode.DECODE, (stack, stack), Packed(inp.x, inp.residual, inp.pack),
                       StepContext(lambda i: None, None, None))
