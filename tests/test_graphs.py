"""CUDA-graph decode (marked gpu): replay == eager bit for bit at every bucket, outputs and every pool row, for the
plain stack and the hc+PLE stack (PLE hoisted: one graph; PLE vetoed: graph segments around an eager PLE layer);
a padded replay writes no pool row outside the step; a decode past the largest bucket runs eagerly, said once.
Verify steps with `verify_graphs`: the same at every bucket where every sequence drafts max_draft tokens (no padding
rows), the accepted state included; with missing drafts (padding rows owned by padding sequences) within the fp32
bound of an unpadded eager twin, and the other sequences' state untouched. Both sessions of a comparison hold the
same weights and run the same eager prefill first."""

from __future__ import annotations

import pytest
import torch

from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.session import Session, SessionOptions

pytestmark = pytest.mark.gpu

LIMITS = RuntimeLimits(max_seqs=8, max_prefill_tokens=128, max_draft=4, ple_cache_rows=64)


def _open(name: str, graphs: bool, hoisted: bool = True, dtype=torch.float32, verify: bool = False) -> Session:
    return Session.open(name, backend="torch", device="cuda",
                        options=SessionOptions(limits=LIMITS, graphs=graphs, ple_hoisted=hoisted, dtype=dtype,
                                               verify_graphs=verify))


def _state(sess: Session) -> list[torch.Tensor]:
    return [t.clone() for st in sess.pool.layers.values() for t in st.tensors()]


def _inputs(sess: Session, n: int, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, steps, sess.cfg.stream_dim, generator=g).to(sess.dtype)
    ids = torch.randint(0, sess.cfg.vocab_size, (n, steps), generator=g).numpy() if sess.feeds else None
    return h, ids


CASES = [pytest.param("tiny-3.5", True, torch.float32, id="plain-fp32"),
         pytest.param("tiny-3.5", True, torch.bfloat16, id="plain-bf16"),
         pytest.param("tiny-4exp", True, torch.float32, id="hc+ple-hoisted"),
         pytest.param("tiny-4exp", False, torch.float32, id="hc+ple-vetoed")]


def _every_bucket(graph: Session, eager: Session, rounds: int, width: int, step) -> None:
    """At every bucket: that many sequences in both sessions after the same eager 4-token prefill, then `rounds`
    steps of `step(sess, seqs, h, ids, t)` (outputs by sequence; h, ids: `width` tokens a round after the prefill's),
    whose outputs, and then the pools, must agree bit for bit."""
    for bucket in LIMITS.buckets():
        h, ids = _inputs(graph, bucket, 4 + rounds * width, seed=bucket)
        seqs = {}
        for sess in (graph, eager):
            s = [sess.add_sequence() for _ in range(bucket)]
            sess.prefill_batch({q: Prompt(h[k, :4], None if ids is None else ids[k, :4]) for k, q in enumerate(s)})
            seqs[sess] = s
        for t in range(rounds):
            outs = [step(sess, seqs[sess], h[:, 4 + t * width:4 + (t + 1) * width],
                         None if ids is None else ids[:, 4 + t * width:4 + (t + 1) * width], t)
                    for sess in (graph, eager)]
            for qg, qe in zip(seqs[graph], seqs[eager]):
                assert torch.equal(outs[0][qg], outs[1][qe]), f"bucket {bucket} step {t}: outputs differ"
        for a, b in zip(_state(graph), _state(eager)):
            assert torch.equal(a, b), f"bucket {bucket}: pool state differs"
        for sess in (graph, eager):
            for q in seqs[sess]:
                sess.release(q)


@pytest.mark.parametrize("io", [False, True], ids=["torch-io", "graph-io"])
@pytest.mark.parametrize("name,hoisted,dtype", CASES)
def test_graph_decode_equals_eager_bit_for_bit_at_every_bucket(name, hoisted, dtype, io):
    """`graph-io`: the captured graphs read x and write the output by address (runtime/graph_io.py)."""
    graph, eager = _open(name, True, hoisted, dtype), _open(name, False, hoisted, dtype)
    graph.graphs.io = io

    def decode_step(sess, seqs, h, ids, t):
        return sess.decode({q: h[k] for k, q in enumerate(seqs)}, None if ids is None else
                           {q: ids[k] for k, q in enumerate(seqs)})

    _every_bucket(graph, eager, 4, 1, decode_step)
    st = graph.stats()
    decode = next(k for k in st.kinds.values() if k.modes.get("decode_multi_seq") or k.modes.get("decode"))
    want = "graph" if hoisted or name == "tiny-3.5" else "graph+eager"
    assert decode.paths[want] == decode.steps, decode.paths
    assert len(st.graphs.captured) == len(LIMITS.buckets()) and not st.graphs.gate_failures


def test_padded_replay_writes_only_the_step_slots():
    """3 sequences decode in bucket 4 while 2 more sit idle: the idle ones stay bit for bit."""
    sess = _open("tiny-4exp", True)
    h, ids = _inputs(sess, 5, 6, seed=3)
    seqs = [sess.add_sequence() for _ in range(5)]
    sess.prefill_batch({q: Prompt(h[k, :4], ids[k, :4]) for k, q in enumerate(seqs)})
    idle = [sess.pool.read_slot(sess._seqs[q].slot, 0).tensors for q in seqs[3:]]
    for t in (4, 5):
        sess.decode({q: h[k, t:t + 1] for k, q in enumerate(seqs[:3])}, {q: ids[k, t:t + 1]
                                                                         for k, q in enumerate(seqs[:3])})
    for q, before in zip(seqs[3:], idle):
        after = sess.pool.read_slot(sess._seqs[q].slot, 0).tensors
        assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert sess.stats().graphs.captured == ["decode_multi_seq bucket 4"]


def test_decode_past_the_largest_bucket_runs_eagerly():
    limits = RuntimeLimits(max_seqs=8, max_prefill_tokens=64, graph_buckets=(1, 2))
    sess = Session.open("tiny-3.5", backend="torch", device="cuda", options=SessionOptions(limits=limits))
    seqs = [sess.add_sequence() for _ in range(3)]
    h = torch.randn(3, sess.cfg.stream_dim, device="cuda")
    out = sess.decode({q: h[k:k + 1] for k, q in enumerate(seqs)})
    assert all(torch.isfinite(o).all() for o in out.values())
    (decode,) = [k for k in sess.stats().kinds.values() if k.steps]
    assert decode.paths == {"eager": 1} and "largest graph bucket" in next(iter(decode.vetoes))


def _verify_kind(sess: Session):
    return next(k for k in sess.stats().kinds.values() if k.modes.get("verify_multi") or k.modes.get("decode_batched"))


@pytest.mark.parametrize("name,hoisted,dtype", CASES)
def test_graph_verify_equals_eager_bit_for_bit_at_every_bucket(name, hoisted, dtype):
    """Every sequence drafts max_draft tokens, so each bucket's graph has no padding rows: its outputs, and the pool
    after accepting a different count of each sequence's drafts, equal an eager twin's bit for bit."""
    K = LIMITS.max_draft
    graph, eager = _open(name, True, hoisted, dtype, verify=True), _open(name, False, hoisted, dtype)

    def verify_step(sess, seqs, h, ids, t):
        out = sess.verify({q: h[k] for k, q in enumerate(seqs)}, None if ids is None else
                          {q: ids[k] for k, q in enumerate(seqs)})
        sess.accept({q: (k + t) % (K + 1) for k, q in enumerate(seqs)})
        return out

    _every_bucket(graph, eager, 3, K, verify_step)
    verify = _verify_kind(graph)
    want = "graph" if hoisted or name == "tiny-3.5" else "graph+eager"
    assert verify.paths[want] == verify.steps, verify.paths
    st = graph.stats().graphs
    assert len(st.captured) == len(LIMITS.buckets()) and not st.gate_failures, (st.captured, st.gate_failures)


def test_padded_verify_replay_matches_eager_and_leaves_other_sequences():
    """3 sequences drafting 1, 4 and 2 of 4 tokens: bucket 4, 16 rows, the fourth sequence a padding one owning the
    9 padding rows, while 2 more sequences sit idle. The outputs and the accepted state are those of an eager twin
    within the fp32 bound (the padded GEMMs take more rows, so the bits may differ); the idle sequences' pool rows
    stay bit for bit."""
    from gdn_trt.export.tolerances import tol

    from .tolerances import assert_close

    graph, eager = _open("tiny-4exp", True, verify=True), _open("tiny-4exp", False)
    h, ids = _inputs(graph, 5, 12, seed=4)
    lengths = (1, 4, 2)
    seqs = {}
    for sess in (graph, eager):
        s = seqs[sess] = [sess.add_sequence() for _ in range(5)]
        sess.prefill_batch({q: Prompt(h[k, :4], ids[k, :4]) for k, q in enumerate(s)})
    idle = [graph.pool.read_slot(graph._seqs[q].slot, 0).tensors for q in seqs[graph][3:]]
    for t in range(2):
        outs = []
        for sess in (graph, eager):
            qs = seqs[sess][:3]
            outs.append(sess.verify({q: h[k, 4 + 4 * t:4 + 4 * t + n] for k, (q, n) in enumerate(zip(qs, lengths))},
                                    {q: ids[k, 4 + 4 * t:4 + 4 * t + n] for k, (q, n) in enumerate(zip(qs, lengths))}))
            sess.accept({q: n - t % 2 for q, n in zip(qs, lengths)})
        for qg, qe in zip(seqs[graph][:3], seqs[eager][:3]):
            assert_close(f"verify {t}", outs[1][qe], outs[0][qg], tol(torch.float32))
    for a, b in zip(_state(graph), _state(eager)):
        assert_close("pool", b, a, tol(torch.float32))
    for q, before in zip(seqs[graph][3:], idle):
        after = graph.pool.read_slot(graph._seqs[q].slot, 0).tensors
        assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert graph.stats().graphs.captured == ["verify_multi bucket 4"] and _verify_kind(graph).paths == {"graph": 2}
