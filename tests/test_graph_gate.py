"""The runtime's own graph path for verify steps on the CPU, over a stand-in for the CUDA graph: replaying it runs
the entry's layers eagerly on the entry's fixed buffers into its fixed output, as the captured kernels would (CUDA
graphs themselves run in tests/test_graphs.py, on a GPU). What this checks is the runtime's side: the padded verify
group reaches `graphs.py`, its entry covers the bucket's rows, the step's output is its rows of the fixed output, and
the acceptance gate compares the stash window: a replay that leaves one stash row wrong fails the gate, the eager
result stands (state included) and the bucket runs eagerly from then on."""

from __future__ import annotations

import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.runtime import graphs
from gdn_trt.runtime.seqs import Prompt
from gdn_trt.runtime.stack import Packed, Stack, StepContext

from .test_runtime_support import PLAIN, fingerprint, inputs, open_session, pad_to_buckets
from .tolerances import assert_close

TOL = tol(torch.float32)


class _Replay:
    """Stands in for a captured segment: `replay` runs it, then `fault` (a test's change to what it wrote)."""

    def __init__(self, run, fault):
        self.run, self.fault = run, fault

    def replay(self) -> None:
        self.run()
        if self.fault is not None:
            self.fault()


def _stand_in(sess, fault=None) -> list:
    """Give `sess` a verify bucket policy, lift its CPU engines' capture veto and build its graph entries from
    `_Replay`; returns the entries built."""
    pad_to_buckets(sess)
    for e in (e for c in sess.selector.engines for e in c):
        e.capture_veto = lambda mode: None
    gc, cfg, built = sess.graphs, sess.cfg, []

    def build(g, inp, ctx):
        fixed = gc._input(g.rows)
        residual = torch.zeros((g.rows, cfg.hidden_size), dtype=fixed.x.dtype)
        entry = graphs._Entry(g.mode, g.bucket, fixed, residual, inp.pack, inp.lora_idx)
        seg_in = Packed(fixed.x, residual, entry.pack, entry.lora_idx)
        fixed_ctx = StepContext(ctx.rows, None, None, ctx.stash_at)  # what a capture fixes
        hidden = torch.full((g.rows, cfg.stream_dim), float("nan"))

        def run():
            hidden.copy_(Stack.hidden(gc.stack.run(g.mode, g.engines, seg_in, fixed_ctx)))

        entry.segments.append(graphs._Segment(g.engines, True, seg_in, seg_in, _Replay(run, fault), hidden))
        built.append(entry)
        return entry

    gc._build = build
    return built


def _loop(sess, h, drafts: list[list[int]]) -> list[torch.Tensor]:
    """3 sequences after a 2-token prefill each, then a verify of each round's draft counts and an accept of one
    fewer (or none); returns every output."""
    seqs = [sess.add_sequence() for _ in range(3)]
    sess.prefill_batch({q: Prompt(h[2 * k:2 * k + 2]) for k, q in enumerate(seqs)})
    outs, at = [], 6
    for counts in drafts:
        out = sess.verify({q: h[at + 4 * k:at + 4 * k + n] for k, (q, n) in enumerate(zip(seqs, counts))})
        sess.accept({q: max(n - 1, 0) for q, n in zip(seqs, counts)})
        outs += [out[q] for q in seqs]
        at += 12
    return outs


def test_verify_steps_run_from_their_graph_entry():
    """Every sequence drafts max_draft tokens (bucket 3, 12 rows, no padding): the steps replay the entry after its
    gate, and every output and the whole state equal a session without graph buckets bit for bit."""
    twin, sess = open_session(PLAIN), open_session(PLAIN)
    built = _stand_in(sess)
    h, _ = inputs(sess, 6 + 3 * 12, seed=11)
    want, got = _loop(twin, h, [[4, 4, 4]] * 3), _loop(sess, h, [[4, 4, 4]] * 3)
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and fingerprint(twin) == fingerprint(sess)
    st = sess.stats().graphs
    assert st.captured == ["verify_multi bucket 3"] and not st.gate_failures and st.replays == 3
    assert [e.x.shape[0] for e in built] == [12]
    last = sess._steps.last  # the dict API's verify-accept loop: its later rounds opened from the bound step
    assert last["verify"].stage == "ready" and last["steady"].spec is last["verify"].spec


def test_gate_compares_the_stash_window():
    """A replay that leaves one stash row of its window wrong (the second draft of the first sequence, in the first
    layer) fails the gate although its outputs are right: the eager result stands and the state equals the twin's
    bit for bit; the bucket then runs eagerly. A gate that compared the pool rows, as decode's does, would pass it."""
    twin, sess = open_session(PLAIN), open_session(PLAIN)
    first = sess.cfg.gdn_layer_ids[0]
    _stand_in(sess, fault=lambda: sess.stack.buffers.stash[first].ssm[1].add_(1.0))
    h, _ = inputs(sess, 6 + 2 * 12, seed=12)
    want, got = _loop(twin, h, [[4, 4, 4]] * 2), _loop(sess, h, [[4, 4, 4]] * 2)
    assert all(torch.equal(a, b) for a, b in zip(want, got)) and fingerprint(twin) == fingerprint(sess)
    st = sess.stats().graphs
    assert len(st.gate_failures) == 1 and st.gate_failures[0].startswith("verify_multi bucket 3: replay differs")
    assert st.replays == 1 and not st.captured  # the gate's replay only: the second round ran eagerly
    kinds = [k for k in sess.stats().kinds.values() if k.modes.get("verify_multi")]
    assert kinds[0].paths == {"graph": 1, "eager": 1} and not sess._seqs.stash_held()


def test_padded_verify_from_its_graph_entry():
    """Drafts missing (2, 4 and 1 of 4: bucket 6, 24 rows, 3 padding sequences sharing the 17 padding rows): the
    output is the step's rows of the entry's fixed output, within the fp32 bound of the unpadded twin (the CPU's GEMM
    rounds a row by the row count), and so is the state after the accept."""
    twin, sess = open_session(PLAIN), open_session(PLAIN)
    built = _stand_in(sess)
    h, _ = inputs(sess, 6 + 2 * 12, seed=13)
    want, got = _loop(twin, h, [[2, 4, 1]] * 2), _loop(sess, h, [[2, 4, 1]] * 2)
    for k, (a, b) in enumerate(zip(want, got)):
        assert_close(f"output {k}", a, b, TOL)
    for a, b in zip(twin.pool.layers.values(), sess.pool.layers.values()):
        for ta, tb in zip(a.tensors(), b.tensors()):
            assert_close("pool", ta, tb, TOL)
    st = sess.stats().graphs
    assert st.captured == ["verify_multi bucket 6"] and st.replays == 2 and [e.x.shape[0] for e in built] == [24]
