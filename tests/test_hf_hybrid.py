"""The runtime inside real models: tiny random Hugging Face `Qwen3NextForCausalLM` (MoE blocks) and
`Qwen3_5ForCausalLM` (dense MLP) models with full-attention layers between their GDN layers, saved as sharded bf16
checkpoints, run end to end with Hugging Face's own embeddings, attention, MoE / MLP, norms and lm_head and the
runtime for every GDN layer (`examples/hf_hybrid.py`: HF's `linear_attn` modules call the open step's `mixer`; HF's
cache no longer holds their state): a prefill of three prompts of different lengths in one step, 32 greedy decode
steps, a verify with partial acceptance inside a mixed decode + verify step, a snapshot restored mid-sequence.

Bound: float32 on the CPU, `tol(float32)` (relative RMS 2e-5 per sequence's logits): the same float32 computation
reordered. Our GDN ops (`naive.py`, float32 here) and HF's torch fallbacks compute the same recurrence and conv in
different summation orders (chunked WY against HF's chunked form, and the token recurrence in decode), the host
packs several sequences into one attention call where the reference runs each alone, and the MoE runs
`batched_mm` in the host against the reference's per-expert loop; measured 1.0e-6 to 2.4e-6 (max-abs 3.4e-5 on
logits of RMS 1). The greedy tokens must be identical to Hugging Face's (its argmax over every history, and its
own `generate` on one prompt).
The GPU test captures the whole decode step (HF attention on a static cache, MoE, the runtime's layer calls) in one
CUDA graph and checks replay == eager bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.runtime import RuntimeLimits, Session, SessionOptions

from .tolerances import assert_close

pytest.importorskip("transformers")
_PATH = Path(__file__).resolve().parents[1] / "examples" / "hf_hybrid.py"
_spec = importlib.util.spec_from_file_location("hf_hybrid", _PATH)
hfx = importlib.util.module_from_spec(_spec)
sys.modules["hf_hybrid"] = hfx  # dataclasses resolve their module by name
_spec.loader.exec_module(hfx)

TOL = tol(torch.float32)
NEW = 32


@pytest.fixture(scope="module", params=hfx.FAMILIES)
def demo(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    rep = hfx.run_demo(request.param, root, "cpu", NEW)
    ckpt = root / request.param
    return rep, ckpt, hfx.reference_logits(rep, ckpt)


def test_checkpoint_is_sharded_bf16_and_the_host_holds_no_gdn_state(demo):
    rep, ckpt, _ = demo
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    for shard in shards:
        raw = (ckpt / shard).read_bytes()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}
    model = hfx.load_hf(rep.family, ckpt, "cpu")
    sess = Session.open(ckpt, backend="torch", device="cpu")
    host = hfx.HybridHost(model, sess, rows=2, max_len=8)
    gdn = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
    assert list(sess.cfg.gdn_layer_ids) == gdn and len(gdn) < model.config.num_hidden_layers
    assert all(isinstance(model.model.layers[i].linear_attn, hfx.RuntimeMixer) for i in gdn)
    assert sorted(host.kv.k) == [i for i in range(model.config.num_hidden_layers) if i not in gdn]


def test_logits_match_hugging_face(demo):
    rep, ckpt, ref = demo
    rows = 0
    for q, by_pos in rep.logits.items():
        pos = sorted(by_pos)
        assert pos == list(range(pos[0], pos[-1] + 1))  # every position of the sequence's history, once
        assert_close(f"{rep.family} sequence {q} logits", ref[q][pos], torch.stack([by_pos[p] for p in pos]), TOL)
        rows += len(pos)
    assert rows >= 3 * NEW
    v = rep.verify  # the verify's logits, rejected draft included, against HF over the history and the fed tokens
    history = rep.tokens[v["seq"]][:v["position"]]
    with torch.no_grad():
        want = hfx.model_ref(rep.family, ckpt)(input_ids=torch.tensor([history + v["fed"]])).logits[0]
    assert_close("verify logits", want[v["position"]:], v["logits"], TOL)


def test_greedy_tokens_equal_hugging_face(demo):
    """Each generated token is the unmodified model's argmax over the same history (so, by induction from the
    prompt, the whole continuation is HF's greedy one); for the first prompt HF's own `generate` (its cached path)
    says so too."""
    rep, ckpt, ref = demo
    for q, prompt in rep.prompts.items():
        new = rep.tokens[q][len(prompt):]
        assert len(new) >= NEW
        hf_next = ref[q][len(prompt) - 1:].argmax(-1).tolist()  # HF's logits at positions len(prompt)-1 ..
        assert new == hf_next, f"sequence {q}: greedy tokens differ from HF's argmax"
    q, prompt = next(iter(rep.prompts.items()))
    new = rep.tokens[q][len(prompt):]
    assert new == hfx._greedy(hfx.model_ref(rep.family, ckpt), prompt, len(new))


def test_verify_partially_accepted(demo):
    rep, _, _ = demo
    v = rep.verify
    assert len(v["fed"]) == 4 and v["accepted"] == 3  # the pending token and two drafts; the third draft rejected


def test_snapshot_restored_mid_sequence_continues(demo):
    rep, _, _ = demo
    src, dst, at = rep.restored
    assert 0 < at < len(rep.tokens[src]) - 1
    got = rep.tokens[dst]
    assert len(got) > at + 4 and got == rep.tokens[src][:len(got)]
    for p, row in rep.logits[dst].items():
        assert p >= at
        assert_close(f"restored logits at {p}", rep.logits[src][p], row, TOL)


@pytest.mark.gpu
def test_whole_decode_step_in_one_cuda_graph(tmp_path):
    """Two hosts of the same checkpoint decode the same three sequences (bucket 4: the host pads one row); one
    replays one CUDA graph of its whole model step (captured once, HF attention on the static cache and the MoE
    included), the other runs the same code eagerly. Logits and every GDN state agree bit for bit."""
    fam = "qwen3_next"
    ckpt = hfx.make_checkpoint(fam, tmp_path / fam)
    limits = RuntimeLimits(max_seqs=4, max_prefill_tokens=64, max_draft=4)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (4, 7, 11)]
    hosts, statics = [], []
    for _ in range(2):
        model = hfx.load_hf(fam, ckpt, "cuda", experts="batched_mm")
        sess = Session.open(ckpt, backend="torch", device="cuda",
                            options=SessionOptions(limits=limits, dtype=torch.float32))
        host = hfx.HybridHost(model, sess, rows=4, max_len=64)
        seqs = [sess.add_sequence() for _ in prompts]
        for q in seqs:
            host.add(q)
        out = host.forward(dict(zip(seqs, prompts)), {q: "prefill" for q in seqs})
        for q in seqs:
            host.tracks[q].pending = int(out[q][-1].argmax())
        hosts.append(host)
        statics.append(hfx.StaticDecode(host, 4))
    graph = torch.cuda.CUDAGraph()
    for t in range(8):
        logits = []
        for k, (host, sd) in enumerate(zip(hosts, statics)):
            seqs = list(host.tracks)
            sd.fill([host.tracks[q].pending for q in seqs], [host.sess.position(q) for q in seqs])
            with host.sess.begin_step(np.array(seqs), "decode") as host.step:
                assert host.step.bucket == 4
                if k == 1:  # the eager twin
                    sd.run()
                elif t == 0:  # a real step on a side stream warms up every kernel and library before the capture
                    side = torch.cuda.Stream()
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        sd.run()
                    torch.cuda.current_stream().wait_stream(side)
                elif t == 1:  # the layer calls are recorded, not run: the replay runs this step
                    with torch.cuda.graph(graph):
                        sd.run()
                    graph.replay()
                else:
                    host.step.replayed()
                    graph.replay()
            logits.append(sd.logits[:3].clone())
            for q, row in zip(seqs, logits[-1]):
                host.tracks[q].tokens.append(host.tracks[q].pending)
                host.tracks[q].pending = int(row.argmax())
        assert torch.equal(logits[0], logits[1]), f"step {t}: replay != eager"
    assert hosts[0].sess.stats().graphs.host_captures == ["decode_multi_seq rows 4"]
    states = [[t.clone() for st in h.sess.pool.layers.values() for t in st.tensors()] for h in hosts]
    assert all(torch.equal(a, b) for a, b in zip(*states))
    assert [hosts[0].tracks[q].tokens for q in hosts[0].tracks] == [hosts[1].tracks[q].tokens
                                                                    for q in hosts[1].tracks]
