"""One adapter's numbers reach only the sequences bound to it (torch backend, CPU, plain and hc+PLE stacks).

- An adapter slot whose B holds NaN and Inf and whose A holds Inf (a corruption after registration, written into
  the device slot): in prefill, decode and verify steps that mix sequences of that adapter, of another adapter and
  of none, every other sequence's outputs and state are bit-equal to the same steps in a session whose slot holds
  finite weights, and the poisoned adapter's own sequences come out non-finite (it is not silently repaired).
- Unregistering an adapter zeroes its slot, so new sequences (with no adapter or another one) are finite and equal
  to the clean session's.
- A non-finite adapter (NaN or Inf in A or B, a non-finite scale, or finite weights whose scaled rows overflow the
  activation dtype) is refused at registration with an `AdapterError` naming the layer and target; nothing is
  registered and no slot changes. A PEFT directory holding NaN is refused by `load_adapter`, naming the tensor.
- The slot update itself (`model.lora.apply_sites`, which every mode and every exported graph runs): tokens of
  other slots and of none are bit-equal to the update with the poisoned slot zeroed.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from gdn_trt.model.lora import (LoraInput, LoraLimits, LoraWeights, SlotWeights, apply_sites, build_slots,
                                one_hot)
from gdn_trt.model.peft import WEIGHTS, AdapterError, SyntheticAdapter, load_adapter, make_synthetic_adapter
from gdn_trt.runtime import Prompt, RuntimeLimits

from .test_runtime_support import HC_PLE, PLAIN, inputs, open_session, slot_state, sub

LORA = LoraLimits(max_adapters=2, max_rank=6)
SLOTTED = RuntimeLimits(max_seqs=6, max_prefill_tokens=96, max_draft=4, ple_cache_rows=64, lora=LORA)
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module", params=[pytest.param(PLAIN, id="plain"), pytest.param(HC_PLE, id="hc+ple")])
def world(request, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    probe = open_session(name, SLOTTED)
    ads = {f"ad{k}": load_adapter(make_synthetic_adapter(name, root / f"ad{k}", SyntheticAdapter(r=4), seed=40 + k),
                                  probe.cfg, f"ad{k}") for k in range(2)}
    return dict(name=name, root=root, ads=ads)


def _slots_hash(sess) -> str:
    h = hashlib.sha256()
    for ts in sess.adapters.weights.values():
        for w in ts.values():
            h.update(w.a.numpy().tobytes() + w.b.numpy().tobytes())
    return h.hexdigest()


def _poison_slot(sess, slot: int) -> None:
    """NaN and Inf into `slot`'s B of every target and Inf into one A row, in every layer (as a device fault would)."""
    for ts in sess.adapters.weights.values():
        for k, w in enumerate(ts.values()):
            w.b[slot, 0, 0] = NAN
            w.b[slot, 1, -1] = INF if k % 2 else -INF
            if k == 0:
                w.a[slot, 2, 1] = INF


class _Run:
    """The same script of steps on one session: sequences by name, inputs by name, outputs collected."""

    def __init__(self, sess, data):
        self.sess, self.data, self.seqs, self.fed, self.out = sess, data, {}, {}, {}

    def add(self, k, adapter):
        self.seqs[k], self.fed[k], self.out[k] = self.sess.add_sequence(adapter=adapter), 0, []

    def take(self, k, n):
        h, ids = self.data[k]
        a = self.fed[k]
        return h[a:a + n], sub(ids, a, a + n)

    def prefill(self, lens):
        res = self.sess.prefill_batch({self.seqs[k]: Prompt(*self.take(k, n)) for k, n in lens.items()})
        for k, n in lens.items():
            self.out[k].append(res[self.seqs[k]].hidden)
            self.fed[k] += n

    def decode(self, ks):
        step = {k: self.take(k, 1) for k in ks}
        ids = None if step[ks[0]][1] is None else {self.seqs[k]: v[1] for k, v in step.items()}
        res = self.sess.decode({self.seqs[k]: v[0] for k, v in step.items()}, ids)
        for k in ks:
            self.out[k].append(res[self.seqs[k]])
            self.fed[k] += 1

    def verify_accept(self, drafts, accept):
        step = {k: self.take(k, n) for k, n in drafts.items()}
        first = next(iter(step.values()))
        ids = None if first[1] is None else {self.seqs[k]: v[1] for k, v in step.items()}
        res = self.sess.verify({self.seqs[k]: v[0] for k, v in step.items()}, ids)
        self.sess.accept({self.seqs[k]: accept[k] for k in drafts})
        for k in drafts:
            self.out[k].append(res[self.seqs[k]][:accept[k]])
            self.fed[k] += accept[k]


def _script(run: _Run, poison) -> None:
    for n in ("ad0", "ad1"):
        run.sess.register_adapter(n, run.ads[n])
    for k, a in (("good", "ad0"), ("none", None), ("bad", "ad1")):
        run.add(k, a)
    run.prefill({"good": 7, "none": 5, "bad": 6})  # uploads ad0 and ad1
    poison(run.sess)
    run.decode(["good", "none", "bad"])
    run.verify_accept({"good": 3, "bad": 3, "none": 2}, {"good": 2, "bad": 1, "none": 0})
    run.add("late", "ad0")
    run.prefill({"late": 9, "bad": 4})
    run.decode(["late", "good", "none", "bad"])
    run.sess.release(run.seqs["bad"])
    run.sess.unregister_adapter("ad1")
    for k, a in (("fresh", None), ("fresh0", "ad0")):
        run.add(k, a)
    run.prefill({"fresh": 6, "fresh0": 5, "none": 3})
    run.decode(["fresh", "fresh0", "good"])


def test_poisoned_slot_reaches_only_its_own_sequences(world):
    names = ("good", "none", "bad", "late", "fresh", "fresh0")
    runs = []
    for poisoned in (False, True):
        sess = open_session(world["name"], SLOTTED)
        data = {k: inputs(sess, 24, seed=50 + j) for j, k in enumerate(names)}
        run = _Run(sess, data)
        run.ads = world["ads"]
        seen = {}

        def poison(s, poisoned=poisoned, seen=seen):
            slot = s.adapters.resident["ad1"]
            seen["slot"] = slot
            if poisoned:
                _poison_slot(s, slot)

        _script(run, poison)
        runs.append((run, seen["slot"]))
    (clean, _), (bad, slot) = runs
    for k in ("good", "none", "late", "fresh", "fresh0"):
        got, want = torch.cat(bad.out[k]), torch.cat(clean.out[k])
        assert torch.isfinite(got).all(), f"{k}: another adapter's NaN reached this sequence"
        assert torch.equal(got, want), f"{k}: outputs differ from the session with a finite slot"
        for x, y in zip(slot_state(bad.sess, bad.seqs[k]), slot_state(clean.sess, clean.seqs[k])):
            assert torch.equal(x, y), f"{k}: state differs from the session with a finite slot"
    assert not torch.isfinite(torch.cat(bad.out["bad"])).all(), "the poisoned adapter's own outputs were repaired"
    # the freed slot holds zeros again (and ad0's slot is untouched)
    for ts in bad.sess.adapters.weights.values():
        for w in ts.values():
            assert not w.a[slot].any() and not w.b[slot].any(), "unregister left the adapter's numbers in its slot"


def _with(adapter, fn):
    """A copy of `adapter` whose first layer's first target is `fn(LoraWeights)`."""
    i = min(adapter.layers)
    t = sorted(adapter.layers[i], key=lambda t: t.value)[0]
    layers = {j: dict(ts) for j, ts in adapter.layers.items()}
    layers[i][t] = fn(layers[i][t])
    return replace(adapter, layers=layers), i, t


def _set(x, where, value):
    x = x.clone()
    x[where] = value
    return x


BAD_ADAPTERS = {
    "nan in B": lambda w: LoraWeights(w.a, _set(w.b, (0, 0), NAN), w.scale),
    "inf in B": lambda w: LoraWeights(w.a, _set(w.b, (1, 1), -INF), w.scale),
    "inf in A": lambda w: LoraWeights(_set(w.a, (0, 2), INF), w.b, w.scale),
    "nan scale": lambda w: LoraWeights(w.a, w.b, NAN),
    "overflow after scaling": lambda w: LoraWeights(w.a, _set(w.b, (0, 0), 3e38), 4.0),
}


@pytest.mark.parametrize("case", list(BAD_ADAPTERS))
def test_non_finite_adapter_refused_at_registration(world, case):
    sess = open_session(world["name"], SLOTTED)
    sess.register_adapter("ad0", world["ads"]["ad0"])
    a = sess.add_sequence(adapter="ad0")
    h, ids = inputs(sess, 4, seed=3)
    sess.prefill(a, h, token_ids=ids)
    bad, i, t = _with(world["ads"]["ad1"], BAD_ADAPTERS[case])
    before = (sess.adapters.registered, sess.adapters.host_bytes(), _slots_hash(sess), sess.adapters.resident)
    with pytest.raises(AdapterError, match=rf"not finite.*layer {i} {t.value}"):
        sess.register_adapter("bad", bad)
    assert before == (sess.adapters.registered, sess.adapters.host_bytes(), _slots_hash(sess),
                      sess.adapters.resident)
    sess.register_adapter("bad", world["ads"]["ad1"])  # the name is still free


def test_peft_directory_with_nan_refused_naming_the_tensor(world, tmp_path):
    src = make_synthetic_adapter(world["name"], tmp_path / "ad", SyntheticAdapter(r=4), seed=7)
    tensors = load_file(src / WEIGHTS)
    key = sorted(k for k in tensors if k.endswith("lora_B.weight"))[0]
    tensors[key][0, 0] = NAN
    save_file(tensors, src / WEIGHTS)
    sess = open_session(world["name"], SLOTTED)
    with pytest.raises(AdapterError, match=rf"{key.removeprefix('base_model.model.').rsplit('.', 1)[0]}.*not finite"):
        sess.register_adapter("x", src)
    assert sess.adapters.registered == []


@pytest.mark.parametrize("preset", ["tiny-next", "tiny-3.5"])
def test_slot_update_of_other_tokens_is_bit_equal_with_a_poisoned_slot(preset, tmp_path):
    from gdn_trt.model.config import preset as get

    cfg = get(preset)
    ads = [load_adapter(make_synthetic_adapter(preset, tmp_path / f"a{k}", SyntheticAdapter(r=3), seed=k), cfg)
           for k in range(2)]
    i = cfg.gdn_layer_ids[0]
    limits = LoraLimits(max_adapters=3, max_rank=4)
    where = limits.layer_sites(cfg, i)
    clean = build_slots(cfg, i, limits, [ads[0], ads[1], None], torch.float32)
    poisoned = {t: SlotWeights(w.a.clone(), w.b.clone()) for t, w in clean.items()}
    for w in poisoned.values():
        w.b[1, 0, :3] = torch.tensor([NAN, INF, -INF])
        w.a[1, 1, 0] = INF
    idx = torch.tensor([0, -1, 1, 1, 0, -1, 2], dtype=torch.int32)  # slot 2 is empty (zeros)
    for proj in {s.proj for s in where}:
        mine = [s for s in where if s.proj is proj]
        x = torch.randn(idx.shape[0], mine[0].in_dim)
        y = torch.randn(idx.shape[0], max(s.hi for s in mine))
        outs = []
        for slots in (clean, poisoned):
            lora = LoraInput(idx, slots)
            outs.append(apply_sites(y, x, one_hot(lora), lora, mine))
        others = idx != 1
        assert torch.equal(outs[0][others], outs[1][others]), f"{proj.value}: other slots' tokens changed"
        assert not torch.isfinite(outs[1][~others]).all()


def test_exported_slot_graphs_keep_a_poisoned_slot_to_its_own_sequences(tmp_path):
    """The exported graphs (ONNX Runtime, standard ops for the LoRA part): NaN and Inf in slot 1's B and A leave
    every output row of the other sequences (slot 0 and none) and their pool and capture rows bit-equal to the run
    with finite slot 1, and the sequence of slot 1 non-finite."""
    import numpy as np
    import onnxruntime as ort

    from gdn_trt.export import cli
    from gdn_trt.export.artifacts import Manifest
    from gdn_trt.export.compare import layers_of, weight_feed
    from gdn_trt.export.data import GraphData
    from gdn_trt.export.spec import Role
    from gdn_trt.model.checkpoint import make_synthetic_checkpoint

    ck = make_synthetic_checkpoint("tiny-3.5", tmp_path / "ckpt", seed=0)
    assert cli.main(["export", "--checkpoint", str(ck), "--out", str(tmp_path / "onnx"), "--modes",
                     "decode_multi_seq,prefill_varlen", "--max-seqs", "4", "--max-tokens", "96", "--pool-slots", "6",
                     "--layers", "0", "--lora-slots", "2", "--lora-rank", "4"]) == 0
    (m,) = Manifest.find(tmp_path / "onnx")
    layer = layers_of(m, "float32")[0]
    for rec in m.graphs:
        spec, data = rec.spec, GraphData(rec.spec, iterations=2, weights=weight_feed(rec.spec, [layer]))
        run = ort.InferenceSession(str(m.root / rec.path), providers=["CPUExecutionProvider"])
        for case, feed in zip(data.cases, data):
            assert 1 in case.adapters and 0 in case.adapters and -1 in case.adapters
            bad = dict(feed)
            for t in spec.inputs:
                if t.role is Role.ADAPTER:
                    x = feed[t.name].copy()
                    x[1, 0, 0] = np.inf if t.name.endswith("_a") else np.nan
                    x[1, -1, -1] = -np.inf
                    bad[t.name] = x
            clean_out, bad_out = (dict(zip(spec.output_names, run.run(None, f))) for f in (feed, bad))
            mine = [k for k, a in enumerate(case.adapters) if a == 1]
            tok = np.repeat(np.asarray(case.adapters), case.lengths) == 1
            for t in spec.outputs:
                c, b = clean_out[t.name], bad_out[t.name]
                if t.role is Role.ACTIVATION:
                    keep = ~tok
                    assert not np.isfinite(b[tok]).all(), f"{spec.stem} {t.name}: slot 1's tokens were repaired"
                elif t.role is Role.POOL:
                    keep = ~np.isin(np.arange(c.shape[0]), [case.slots[k] for k in mine])
                else:  # capture rows, one per sequence
                    keep = ~np.isin(np.arange(c.shape[0]), mine)
                assert np.isfinite(b[keep]).all() and np.array_equal(c[keep], b[keep]), \
                    f"{spec.stem} {t.name}: slot 1's NaN reached another sequence"


@pytest.mark.gpu
def test_poisoned_slot_stays_in_its_sequences_under_cuda_graphs(world):
    """CUDA-graph decode (the slot update captured in the graph, the slot buffers read in place): after a slot is
    poisoned between two replays, the other sequences' outputs are bit-equal to a clean twin session's and the
    poisoned adapter's own are not finite. Marked gpu: not run yet (no device time in the session that wrote it)."""
    from gdn_trt.runtime import Session, SessionOptions

    limits = RuntimeLimits(max_seqs=4, max_prefill_tokens=64, max_draft=4, ple_cache_rows=64, graph_buckets=(4,),
                           lora=LORA)
    runs = []
    for poisoned in (False, True):
        sess = Session.open(world["name"], backend="torch", device="cuda", options=SessionOptions(limits=limits))
        for n in ("ad0", "ad1"):
            sess.register_adapter(n, world["ads"][n])
        seqs = [sess.add_sequence(adapter=a) for a in ("ad0", None, "ad1")]
        h, ids = inputs(sess, 8, seed=12)
        h = h.cuda()
        got = []
        for t in range(8):
            out = sess.decode({q: h[t:t + 1] for q in seqs}, None if ids is None else {q: ids[t:t + 1] for q in seqs})
            got.append([out[q] for q in seqs])
            if t == 1 and poisoned:
                _poison_slot(sess, sess.adapters.resident["ad1"])
        assert sess.stats().graphs.replays > 0
        runs.append(got)
    for t, (clean, bad) in enumerate(zip(*runs)):
        assert torch.equal(clean[0], bad[0]) and torch.equal(clean[1], bad[1]), f"step {t}: the NaN reached another"
        if t >= 2:
            assert not torch.isfinite(bad[2]).all(), f"step {t}: the poisoned adapter's own output was repaired"
