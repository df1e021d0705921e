"""The step context (`Session.begin_step`) on the CPU.

Two sessions with the same weights run the same scenario (a varlen prefill with a capture, decodes, a verify with
partial acceptance, a mixed decode + verify + prefill step, a decode of a subset), one through the dict API, one
through the batched API in each granularity: `run` (the whole stack), `layer` with the hidden state, `layer` with
the running residual, and, on mixer-only layers, `mixer` with the host doing the input norm and the residual add.
Every output and the whole state (pools, stashes, captures, PLE id carries, positions, pending verifies) agree bit
for bit, for the plain, hc+PLE and LoRA presets and with decode steps padded to a bucket (padding rows poisoned with
NaN; there within the fp32 bound, see `test_padded_layer_calls`). Every refusal of the step context changes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import StepKind
from gdn_trt.model.norms import rms_norm_1p
from gdn_trt.model.peft import SyntheticAdapter, load_adapter, make_synthetic_adapter
from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.seqs import Prompt, SequenceError
from gdn_trt.runtime.session import Session, SessionOptions
from gdn_trt.runtime.steps import StepError

from .test_runtime_support import HC_PLE, LIMITS, PLAIN, fingerprint, inputs, open_session, pad_to_buckets
from .tolerances import assert_close

TOL = tol(torch.float32)

LORA = RuntimeLimits(max_seqs=6, max_prefill_tokens=96, max_draft=4, ple_cache_rows=64,
                     lora=LoraLimits(max_adapters=2, max_rank=4))
MIXER_ONLY = "tiny-next"  # Qwen3-Next without dense MLPs: every GDN layer is norm + mixer (its MoE is the host's)


def _twins(name: str, limits: RuntimeLimits, tmp_path, pad: bool):
    """Two sessions of the same weights (and adapters), the second padded to decode buckets if `pad`."""
    out = []
    for _ in range(2):
        s = open_session(name, limits)
        if limits.lora is not None:
            for k in range(2):
                d = make_synthetic_adapter(name, tmp_path / f"ad{k}", SyntheticAdapter(r=4, alpha=8.0), seed=k)
                s.register_adapter(f"ad{k}", load_adapter(d, s.cfg, f"ad{k}"))
        out.append(s)
    if pad:  # decode and verify groups get a bucket; the CPU engines veto capture: the layers run eagerly, padded
        pad_to_buckets(out[1])
    return out


class Batched:
    """The batched API in one granularity, with the dict API's arguments."""

    def __init__(self, sess, how: str, fill: float = float("nan")):
        self.s, self.how, self.fill = sess, how, fill
        self.padded = 0  # layer chains that ran on bucket-padded rows

    def step(self, decode=None, verify=None, prefill=None, token_ids=None):
        token_ids = token_ids or {}
        seqs, kinds, hs, ids, caps = [], [], [], [], []
        for kind, part in (("decode", decode), ("verify", verify), ("prefill", prefill)):
            for q, v in (part or {}).items():
                p = v if isinstance(v, Prompt) else Prompt(v, token_ids.get(q))
                seqs.append(q)
                kinds.append(kind)
                hs.append(p.hidden)
                ids.append(p.token_ids)
                caps.append(-1 if p.capture_at is None else p.capture_at)
        lengths = np.array([h.shape[0] for h in hs])
        tid = None if self.s.feeds is None else np.concatenate([np.asarray(i) for i in ids])
        cap = np.array(caps) if any(c >= 0 for c in caps) else None
        x = torch.cat(hs).to(self.s.device)
        with self.s.begin_step(np.array(seqs), kinds if len(set(kinds)) > 1 else kinds[0], lengths, tid, cap) as st:
            out = self._layers(st, x)
        return dict(zip(seqs, torch.split(out, lengths.tolist()))), st.captures

    def _layers(self, st, x):
        if st.bucket is not None and st.bucket > x.shape[0] and self.how not in ("run", "static"):
            # the host pads to the bucket (run takes the step's rows only); its NaN padding never leaks
            self.padded += 1
            xp = torch.full((st.bucket, x.shape[1]), self.fill, dtype=x.dtype, device=x.device)
            xp[:x.shape[0]] = x
            return self._chain(st, xp)[:x.shape[0]]
        return self._chain(st, x)

    def _chain(self, st, x):
        cfg = self.s.cfg
        if self.how == "run":
            return st.run(x)
        if self.how == "static":  # the host writes into the step's input rows and reads the fixed output in place
            buf = st.input()
            assert buf.shape == x.shape and buf.dtype == x.dtype and buf.device == x.device
            buf.copy_(x)
            return st.run(buf, copy=False).clone()
        if self.how == "residual" and not cfg.is_hc:
            res = torch.zeros_like(x)
            for i in cfg.gdn_layer_ids:
                x, res = st.layer(i, x, res)
            return x + res
        if self.how == "mixer":
            for cands, i in zip(self.s.selector.engines, cfg.gdn_layer_ids):
                h = rms_norm_1p(x, cands[0].layer.norms.input_norm, cfg.rms_norm_eps)
                x = x + st.mixer(i, h)
            return x
        for i in cfg.gdn_layer_ids:
            x = st.layer(i, x)
        return x


def _scenario(step, accept, add, release, sess, tmp_adapters: bool):
    """The same calls on either API; returns every output and capture in order."""
    h, ids = inputs(sess, 40, seed=7)
    h = h.to(sess.device, sess.dtype)
    sub = (lambda a, b: None) if ids is None else (lambda a, b: ids[a:b])
    ad = (lambda k: f"ad{k % 2}" if k % 3 else None) if tmp_adapters else (lambda k: None)
    a, b, c, d = (add(ad(k)) for k in range(4))
    got = []
    outs, caps = step(prefill={a: Prompt(h[:5], sub(0, 5), 3), b: Prompt(h[5:12], sub(5, 12)),
                               c: Prompt(h[12:13], sub(12, 13)), d: Prompt(h[13:17], sub(13, 17), 4)})
    got += [outs[q] for q in (a, b, c, d)] + [torch.tensor(list(caps[a])), torch.tensor(list(caps[d]))]
    for t in range(17, 20):
        outs, _ = step(decode={q: h[t:t + 1] for q in (a, b, c, d)},
                       token_ids=None if ids is None else {q: ids[t:t + 1] for q in (a, b, c, d)})
        got += [outs[q] for q in (a, b, c, d)]
    outs, _ = step(verify={a: h[20:23], b: h[20:20], c: h[20:24]},
                   token_ids=None if ids is None else {a: ids[20:23], b: ids[20:20], c: ids[20:24]})
    got += [outs[q] for q in (a, b, c)]
    accept({a: 2, b: 0, c: 4})
    e = add(ad(5))
    outs, caps = step(decode={b: h[24:25], d: h[24:25]}, verify={a: h[25:27]},
                      prefill={e: Prompt(h[27:33], sub(27, 33))},
                      token_ids=None if ids is None else {b: ids[24:25], d: ids[24:25], a: ids[25:27]})
    got += [outs[q] for q in (b, d, a, e)]
    accept({a: 1})
    release(c)
    outs, _ = step(decode={e: h[33:34], a: h[34:35]},
                   token_ids=None if ids is None else {e: ids[33:34], a: ids[34:35]})
    got += [outs[e], outs[a]]
    return got


CASES = [pytest.param(n, lim, how, id=f"{tag}-{how}")
         for n, lim, tag, hows in ((PLAIN, LIMITS, "plain", ("run", "static", "hidden", "residual")),
                                   (HC_PLE, LIMITS, "hc+ple", ("run", "static", "hidden")),
                                   (PLAIN, LORA, "lora", ("run", "hidden")),
                                   (MIXER_ONLY, LIMITS, "next", ("run", "mixer")))
         for how in hows]


def _dict_run(sess, lora: bool) -> list[torch.Tensor]:
    def dict_step(**kw):
        r = sess.step(**kw)
        return r.outputs, r.captures

    return _scenario(dict_step, sess.accept, sess.add_sequence, sess.release, sess, lora)


def _batched_run(api: Batched, lora: bool) -> list[torch.Tensor]:
    s = api.s
    return _scenario(api.step, lambda c: s.accept_batch(np.array(list(c)), np.array(list(c.values()))),
                     s.add_sequence, s.release, s, lora)


@pytest.mark.parametrize("name,limits,how", CASES)
def test_batched_equals_dict_bit_for_bit(name, limits, how, tmp_path):
    ref, bat = _twins(name, limits, tmp_path, pad=False)
    want, got = _dict_run(ref, limits.lora is not None), _batched_run(Batched(bat, how), limits.lora is not None)
    assert len(want) == len(got)
    for k, (w, g) in enumerate(zip(want, got)):
        assert w.shape == g.shape and torch.equal(w, g), f"output {k} differs"
    assert fingerprint(ref) == fingerprint(bat)


@pytest.mark.parametrize("name,limits,how", [c for c in CASES if c.values[2] not in ("run", "static")])
def test_padded_layer_calls(name, limits, how, tmp_path):
    """Decode steps padded to a bucket (the host pads its rows as a captured graph would): padding content never
    reaches a real row or any state (NaN padding and zero padding agree bit for bit), and the result equals the
    unpadded dict API within the fp32 bound: not bit for bit, because the CPU's GEMM picks its kernel by the row
    count, so a row can round differently in a 6-row product than in a 4-row one (measured: rows of a 1..3-row
    F.linear differ from the same rows in a 4-row one). On the GPU both paths pad (tests/test_graphs.py)."""
    ref, nan_pad = _twins(name, limits, tmp_path, pad=True)
    zero_pad = _twins(name, limits, tmp_path, pad=True)[1]
    a, b = Batched(nan_pad, how), Batched(zero_pad, how, fill=0.0)
    got, got0 = _batched_run(a, limits.lora is not None), _batched_run(b, limits.lora is not None)
    # the three decodes of 4 (bucket 6), the verify of 3 with 7 of 12 drafts (bucket 6, 24 rows: 3 padding
    # sequences sharing 17 rows) and the last decode (2 in bucket 3)
    assert a.padded == b.padded == 5
    assert all(torch.equal(x, y) for x, y in zip(got, got0)) and fingerprint(nan_pad) == fingerprint(zero_pad)
    want = _dict_run(ref, limits.lora is not None)
    for k, (w, g) in enumerate(zip(want, got)):
        if w.dtype == torch.int64:  # capture blobs: their state may round differently too; restored elsewhere
            continue
        assert_close(f"output {k}", w, g, TOL)


def test_run_under_a_host_capture_records_the_padded_layers(tmp_path, monkeypatch):
    """`step.run` while the host captures its own CUDA graph (stood in for on the CPU by `steps._capturing`, the
    engines' device veto lifted): the runtime's graph is never used (neither its replay nor its io words belong in
    the host's graph), the layers run on the rows padded to the bucket, as a host's padded layer calls do (equal to
    them bit for bit, zero padding), the step counts as a host capture of its bucket, and a layer with a capture
    veto refuses the call before anything runs. A captured mixed step is not recorded (`replayed()` serves steps of
    one group only)."""
    from gdn_trt.runtime import steps

    sessions = [_twins(PLAIN, LIMITS, tmp_path, pad=True)[1] for _ in range(2)]
    h, _ = inputs(sessions[0], 8, seed=5)
    seqs = []
    for s in sessions:
        seqs = np.array([s.add_sequence(), s.add_sequence()])
        s.prefill_batch({int(seqs[0]): Prompt(h[:3]), int(seqs[1]): Prompt(h[3:5])})
    cap, ref = sessions
    capturing = [False]
    monkeypatch.setattr(steps, "_capturing", lambda x: capturing[0])

    def no_graph(*a, **k):
        raise AssertionError("the runtime's graph ran under a host capture")

    monkeypatch.setattr(cap.graphs, "run", no_graph)
    vetoes = [(e, e.capture_veto) for c in cap.selector.engines for e in c]
    for e, _ in vetoes:
        e.capture_veto = lambda mode: None
    for t in range(5, 8):
        x = h[t:t + 1].expand(2, -1).contiguous()
        with cap.begin_step(seqs, "decode") as st:
            assert st.bucket == 3
            capturing[0] = True
            got = st.run(x)
            capturing[0] = False
        with ref.begin_step(seqs, "decode") as st:
            y = torch.cat([x, torch.zeros(1, x.shape[1])])
            for i in ref.cfg.gdn_layer_ids:
                y = st.layer(i, y)
        assert got.shape == x.shape and torch.equal(got, y[:2]), t
    assert fingerprint(cap) == fingerprint(ref)
    assert cap.stats().graphs.host_captures == ["decode_multi_seq rows 3"]
    vetoes[1][0].capture_veto = vetoes[1][1]  # the CPU engine's own veto on one layer
    before = fingerprint(cap)
    st = cap.begin_step(seqs, "decode")
    capturing[0] = True
    with pytest.raises(StepError, match=f"layer {vetoes[1][0].layer_idx} cannot be captured in a CUDA graph"):
        st.run(h[:2])
    capturing[0] = False
    st.abort()
    assert fingerprint(cap) == before and cap.position(int(seqs[0])) == ref.position(int(seqs[0]))
    vetoes[1][0].capture_veto = lambda mode: None
    with cap.begin_step(seqs, ["decode", "verify"], np.array([1, 2])) as st:  # a mixed step: not a host capture
        capturing[0] = True
        st.run(h[:3])
        capturing[0] = False
    assert cap.stats().graphs.host_captures == ["decode_multi_seq rows 3"]  # `replayed()` serves one group only


def test_verify_under_a_host_capture_takes_the_padded_rows(tmp_path, monkeypatch):
    """A verify step with verify graphs (bucket 3 of max_draft 4: 12 rows for 2 sequences drafting 2 and 4) under a
    host's capture (stood in for as above): layer calls of the unpadded rows are refused, changing nothing (a graph of
    them would serve only steps of those very lengths); the padded calls equal a twin's eager padded calls bit for
    bit, and the step counts as a host capture of its padded shape. While another sequence's verify holds stash rows
    a verify step is not padded (its window is not row 0), so `replayed()` of the captured shape is refused."""
    from gdn_trt.runtime import steps

    cap, ref = (_twins(PLAIN, LIMITS, tmp_path, pad=True)[1] for _ in range(2))
    h, _ = inputs(cap, 16, seed=6)
    for s in (cap, ref):
        seqs = np.array([s.add_sequence() for _ in range(4)])
        s.prefill_batch({int(q): Prompt(h[2 * k:2 * k + 2]) for k, q in enumerate(seqs)})
    capturing = [False]
    monkeypatch.setattr(steps, "_capturing", lambda x: capturing[0])
    for e in (e for c in cap.selector.engines for e in c):
        e.capture_veto = lambda mode: None
    x = h[8:14]
    lengths = np.array([2, 4])
    before = fingerprint(cap)
    st = cap.begin_step(seqs[:2], "verify", lengths)
    assert st.bucket == 12
    capturing[0] = True
    with pytest.raises(StepError, match="take its 12 padded rows"):
        st.layer(cap.cfg.gdn_layer_ids[0], x)
    capturing[0] = False
    st.abort()
    assert fingerprint(cap) == before
    outs = []
    for s, cap_on in ((cap, True), (ref, False)):
        with s.begin_step(seqs[:2], "verify", lengths) as st:
            y = torch.cat([x, torch.zeros(12 - 6, x.shape[1])])
            capturing[0] = cap_on
            for i in s.cfg.gdn_layer_ids:
                y = st.layer(i, y)
            capturing[0] = False
        outs.append(y[:6])
        s.accept_batch(seqs[:2], np.array([1, 3]))
    assert torch.equal(*outs) and fingerprint(cap) == fingerprint(ref)
    assert cap.stats().graphs.host_captures == ["verify_multi rows 12"]
    cap.verify({int(seqs[2]): h[14:15]})  # a draft of another sequence, left pending
    st = cap.begin_step(seqs[:2], "verify", lengths)
    assert st.bucket is None
    with pytest.raises(StepError, match="no step of verify_multi with 6 rows had its layer calls captured"):
        st.replayed()
    st.abort()


def test_mixed_step_with_a_verify_runs_unpadded(tmp_path):
    """With verify graphs, a verify group pads only in a step of its own: in a mixed step (3 sequences verifying 1
    draft each, whose bucket would be 6 of max_seqs 6, beside a prefill of 2 more) the index regions could not hold
    the padded sequences beside the prefill's. The mixed step runs unpadded and equals the dict API of a session
    without graph buckets bit for bit, state included."""
    ref, bat = _twins(PLAIN, LIMITS, tmp_path, pad=True)
    h, _ = inputs(ref, 24, seed=9)
    got = []
    for s in (ref, bat):
        seqs = [s.add_sequence() for _ in range(5)]
        s.prefill_batch({q: Prompt(h[2 * k:2 * k + 2]) for k, q in enumerate(seqs)})
        verify = {q: h[10 + k:11 + k] for k, q in enumerate(seqs[:3])}
        prefill = {seqs[3]: Prompt(h[13:16]), seqs[4]: Prompt(h[16:18])}
        if s is ref:
            out = s.step(verify=verify, prefill=prefill).outputs
        else:
            out, _ = Batched(s, "hidden").step(verify=verify, prefill=prefill)
        s.accept({q: 1 for q in seqs[:3]})
        got.append([out[q] for q in seqs])
    assert all(torch.equal(a, b) for a, b in zip(*got)) and fingerprint(ref) == fingerprint(bat)


# ---- refusals: each raises and changes nothing ----

@pytest.fixture
def world():
    s = open_session(HC_PLE)
    h, ids = inputs(s, 12, seed=3)
    a, b = s.add_sequence(), s.add_sequence()
    s.prefill_batch({a: Prompt(h[:4], ids[:4]), b: Prompt(h[4:9], ids[4:9])})
    return s, np.array([a, b]), h[9:11], ids[9:11]


def test_layer_calls_out_of_turn_are_refused(world):
    s, seqs, x, ids = world
    L = s.cfg.gdn_layer_ids
    before = fingerprint(s)
    st = s.begin_step(seqs, "decode", token_ids=ids)
    with pytest.raises(StepError, match=f"GDN layer {L[0]} is next"):
        st.layer(L[1], x)
    with pytest.raises(StepError, match="a step is open"):
        s.begin_step(seqs, "decode", token_ids=ids)
    for call in (lambda: s.release(int(seqs[0])), lambda: s.snapshot(int(seqs[0])), lambda: s.accept({}),
                 lambda: s.decode({int(seqs[0]): x[:1]}, {int(seqs[0]): ids[:1]})):
        with pytest.raises(StepError, match="a step is open"):
            call()
    with pytest.raises(StepError, match=r"closed before GDN layers \[0, 1, 2\]"):
        st.close()
    assert fingerprint(s) == before
    y = st.layer(L[0], x)
    with pytest.raises(StepError, match=f"GDN layer {L[1]} is next"):
        st.layer(L[0], y)
    with pytest.raises(StepError, match="GDN layer 1 is next"):
        st.run(x)
    for i in L[1:]:
        y = st.layer(i, y)
    with pytest.raises(StepError, match="every GDN layer of this step was called"):
        st.layer(L[-1], y)
    st.close()
    with pytest.raises(StepError, match="closed"):
        st.layer(L[0], x)
    assert s.position(int(seqs[0])) == 5


BAD_INPUTS = {
    "rows": (lambda st, x: st.layer(0, x[:1]), ValueError, "must be [2, 128]"),
    "width": (lambda st, x: st.layer(0, x[:, :7]), ValueError, "must be [2, 128]"),
    "dtype": (lambda st, x: st.layer(0, x.double()), ValueError, "torch.float32"),
    "not a tensor": (lambda st, x: st.layer(0, x.tolist()), TypeError, "tensor"),
    "sparse": (lambda st, x: st.layer(0, x.to_sparse()), ValueError, "dense tensor with data"),
    "mixer of a PLE layer": (lambda st, x: st.mixer(1, x[:, :32]) if st.layer(0, x) is not None else None,
                             ValueError, "layer 1 has PLE"),
    "residual on hc": (lambda st, x: st.layer(0, x, x), ValueError, "no residual"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_layer_inputs_are_refused(world, name):
    s, seqs, x, ids = world
    call, exc, frag = BAD_INPUTS[name]
    st = s.begin_step(seqs, "decode", token_ids=ids)
    before = fingerprint(s)
    with pytest.raises(exc) as info:
        call(st, x)
    assert frag in str(info.value), str(info.value)
    if name != "mixer of a PLE layer":  # that one ran layer 0 first: a pool was written, as a real call would
        assert fingerprint(s) == before
    st.abort()


BAD_REQUESTS = {
    "no sequence": (dict(seqs=[]), ValueError, "at least one"),
    "float ids": (dict(seqs=[0.0, 1.0]), TypeError, "integer"),
    "unknown": (dict(seqs=[0, 77]), SequenceError, "sequence 77 is unknown"),
    "twice": (dict(seqs=[0, 0], token_ids=[1, 2]), ValueError, "twice"),
    "kind": (dict(kind="sample"), ValueError, "kind"),
    "mixed out of order": (dict(kind=["verify", "decode"], lengths=[1, 1]), ValueError, "grouped by kind"),
    "verify without lengths": (dict(kind="verify"), ValueError, "lengths"),
    "decode of two": (dict(lengths=[1, 2], token_ids=[1, 2, 3]), ValueError, "one token per sequence"),
    "verify too long": (dict(kind="verify", lengths=[5, 1], token_ids=[1] * 6), ValueError, "max_draft"),
    "prefill empty": (dict(kind="prefill", lengths=[0, 1], token_ids=[1]), ValueError, "no tokens"),
    "negative count": (dict(kind="verify", lengths=[-1, 1], token_ids=[1]), ValueError, "must be >= 0, got -1"),
    "mixed decode of two": (dict(kind=["decode", "prefill"], lengths=[2, 1], token_ids=[1] * 3), ValueError,
                            "one token per sequence"),
    "mixed verify too long": (dict(kind=["decode", "verify"], lengths=[1, 5], token_ids=[1] * 6), ValueError,
                              "brings 5 draft tokens, more than max_draft=4"),
    "prefill over the limit": (dict(kind="prefill", lengths=[60, 60], token_ids=[1] * 120), ValueError,
                               "prefill step of 120 tokens exceeds max_prefill_tokens=96"),
    "mixed prefill over the limit": (dict(kind=["decode", "prefill"], lengths=[1, 97], token_ids=[1] * 98),
                                     ValueError, "prefill step of 97 tokens exceeds"),
    "token ids short": (dict(token_ids=[1]), ValueError, "token_ids must be [2]"),
    "token ids outside": (dict(token_ids=[1, 10 ** 6]), ValueError, "vocabulary"),
    "no token ids": (dict(token_ids=None), ValueError, "need the token ids"),
    "capture on decode": (dict(capture_at=[0, -1]), ValueError, "does not prefill"),
    "capture past the end": (dict(kind="prefill", lengths=[2, 1], token_ids=[1, 2, 3], capture_at=[3, -1]),
                             ValueError, "0..2"),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_requests_are_refused_naming_the_sequence(world, name):
    s, seqs, _, ids = world
    kw, exc, frag = BAD_REQUESTS[name]
    args = dict(seqs=seqs, kind="decode", lengths=None, token_ids=ids, capture_at=None) | kw
    before = fingerprint(s)
    with pytest.raises(exc) as info:
        s.begin_step(**args)
    assert frag in str(info.value), str(info.value)
    assert fingerprint(s) == before
    with s.begin_step(seqs, "decode", token_ids=ids) as st:  # the session is not left with an open step
        st.run(torch.zeros(2, s.cfg.stream_dim))


def test_abandoned_steps(world):
    s, seqs, x, ids = world
    before = fingerprint(s)
    with pytest.raises(RuntimeError, match="host failed"):
        with s.begin_step(seqs, "decode", token_ids=ids):
            raise RuntimeError("the host failed before any layer")
    assert fingerprint(s) == before  # nothing ran: nothing changed, the sequences step on
    blob = s.snapshot(int(seqs[1]))
    with pytest.raises(StepError, match="closed before"):
        with s.begin_step(seqs, "decode", token_ids=ids) as st:
            st.layer(0, x)  # the host forgot layers 1..3: layer 0 wrote its pools
    with pytest.raises(SequenceError, match=f"sequence {seqs[0]} failed in an earlier step"):
        s.begin_step(seqs, "decode", token_ids=ids)
    with pytest.raises(SequenceError, match="closed before.*half-written"):  # a failed state is no snapshot
        s.snapshot(int(seqs[1]))
    s.release(int(seqs[0]))  # release and restore (a new sequence) stay open
    r = s.restore(blob)
    with s.begin_step(np.array([r]), "decode", token_ids=ids[:1]) as st:
        st.run(x[:1])


# ---- on the GPU: CUDA graphs, Triton kernels, fused glue ----

GPU_LIMITS = RuntimeLimits(max_seqs=6, max_prefill_tokens=96, max_draft=4, ple_cache_rows=64, graph_buckets=(1, 3, 6))


def _gpu(name: str, dtype: torch.dtype):
    return Session.open(name, backend="torch", device="cuda", options=SessionOptions(limits=GPU_LIMITS, dtype=dtype))


def _state(sess) -> list:
    """Every piece of state a step may change, on the host (pools, stashes, captures, carries, positions)."""
    out = [t.cpu() for st in [*sess.pool.layers.values(), *sess.stack.buffers.stash.values(),
                              *sess.stack.buffers.capture.values()] for t in (st.conv, st.ssm, st.ple_conv)
           if t is not None]
    if sess.feeds is not None:
        out += [torch.from_numpy(c.copy()) for c in sess.feeds.carry.values()]
    t = sess._seqs
    return out + [torch.from_numpy(a.copy()) for a in (t.live_id, t.position, t.pend_epoch, t.pend_row, t.pend_count)]


GPU_CASES = [pytest.param(n, d, id=f"{tag}-{str(d)[6:]}") for n, tag in ((PLAIN, "plain"), (HC_PLE, "hc+ple"))
             for d in (torch.float32, torch.bfloat16)]


@pytest.mark.gpu
@pytest.mark.parametrize("io", [False, True], ids=["torch-io", "graph-io"])
@pytest.mark.parametrize("how", ["run", "static"])
@pytest.mark.parametrize("name,dtype", GPU_CASES)
def test_batched_equals_dict_on_the_gpu(name, dtype, how, io):
    """The whole scenario (every kind, a mixed step, decode groups replayed from CUDA graphs at buckets 3 and 6);
    `static`: the input written into the graph's fixed rows (`step.input()`), the output read in place; `graph-io`:
    the batched session's graphs read x and write the output by address (runtime/graph_io.py)."""
    ref, bat = _gpu(name, dtype), _gpu(name, dtype)
    bat.graphs.io = io
    want, got = _dict_run(ref, False), _batched_run(Batched(bat, how), False)
    for k, (w, g) in enumerate(zip(want, got)):
        assert torch.equal(w.cpu(), g.cpu()), f"output {k} differs"
    assert all(torch.equal(a, b) for a, b in zip(_state(ref), _state(bat)))
    assert ref.stats().graphs.captured and not ref.stats().graphs.gate_failures


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", GPU_CASES)
def test_padded_layer_calls_equal_the_graph_replay(name, dtype):
    """Decode steps of 4 sequences in bucket 6: the dict API replays its captured graph, the batched API calls each
    layer eagerly on the host's padded rows (NaN padding): outputs and state bit for bit."""
    ref, bat = _gpu(name, dtype), _gpu(name, dtype)
    h, ids = inputs(ref, 12, seed=5)
    h = h.to("cuda", dtype)
    api = Batched(bat, "hidden")
    for sess in (ref, bat):
        qs = [sess.add_sequence() for _ in range(4)]
        sess.prefill_batch({q: Prompt(h[k:k + 4], None if ids is None else ids[k:k + 4]) for k, q in enumerate(qs)})
    for t in range(8, 12):
        tok = None if ids is None else {q: ids[t:t + 1] for q in range(4)}
        want = ref.decode({q: h[t:t + 1] for q in range(4)}, tok)
        got, _ = api.step(decode={q: h[t:t + 1] for q in range(4)}, token_ids=tok)
        for q in range(4):
            assert torch.equal(want[q], got[q]), f"step {t} sequence {q}"
    assert api.padded == 4
    assert all(torch.equal(a, b) for a, b in zip(_state(ref), _state(bat)))
    assert ref.stats().graphs.captured == ["decode_multi_seq bucket 6"]


def test_an_engine_covering_consecutive_layers_runs_once():
    """The stack's loop takes an engine that covers several consecutive layers (`layer_ids`, what a TensorRT stack
    plan is): it stands for each of its layers and runs once; a per-layer call on one of them finds no engine."""
    from gdn_trt.model.state import StepInput
    from gdn_trt.runtime.backends import TorchEngine
    from gdn_trt.runtime.engine import LayerCall
    from gdn_trt.runtime.select import NoEngineError

    ref, s = open_session(PLAIN), open_session(PLAIN)
    first, second = (c[0] for c in s.selector.engines[:2])
    calls_made = []

    class Pair(TorchEngine):
        layer_ids = (first.layer_idx, second.layer_idx)

        def run_layers(self, calls, stream):  # both layers' calls: the first carries the activations
            calls_made.append(calls[0].mode)
            out = first.run(calls[0], stream)
            c = calls[1]
            return second.run(LayerCall(c.mode, StepInput(out.x, c.step.pack, out.residual, None, c.step.lora),
                                        c.state, c.extra), stream)

        def run(self, call, stream):  # a loop that hands a stack engine its first layer's call only
            extra = s.stack.extra(call.mode, second.layer_idx, call.step.x.shape[0], getattr(call.extra, "at", None))
            return self.run_layers((call, LayerCall(call.mode, call.step, s.pool.layers[second.layer_idx], extra)),
                                   stream)

    pair = Pair(first.layer, first.device)
    s.selector.engines = [[pair], [pair], *s.selector.engines[2:]]
    h, _ = inputs(s, 6, seed=9)
    for sess in (ref, s):
        q = [sess.add_sequence() for _ in range(2)]
        sess.prefill_batch({q[0]: Prompt(h[:3]), q[1]: Prompt(h[3:5])})
    want = ref.decode({0: h[5:6], 1: h[5:6]})
    got = s.decode({0: h[5:6], 1: h[5:6]})
    assert len(calls_made) == 2 and all(torch.equal(want[q], got[q]) for q in (0, 1))  # once per step
    with s.begin_step(np.array([0, 1]), "decode") as st:
        with pytest.raises(NoEngineError, match="runs its layer alone"):
            st.layer(0, h[:2])
        st.run(h[:2])


@pytest.mark.gpu
@pytest.mark.parametrize("io", [False, True], ids=["torch-io", "graph-io"])
def test_fixed_input_and_output_rows_of_a_graph_step(io):
    """`step.input()` of a decode step with a bucket is the graph's fixed input (run copies nothing in: the rows
    hold the step's x); `run(copy=False)` returns rows of the graph's fixed output, equal to the copied result of a
    twin session and overwritten by the next step; a step without a bucket gets a fresh input tensor. `graph-io`:
    the same with the graph's own kernels reading x and writing the output (runtime/graph_io.py)."""
    ref, bat = _gpu(PLAIN, torch.float32), _gpu(PLAIN, torch.float32)
    bat.graphs.io = io
    h, _ = inputs(ref, 8, seed=11)
    h = h.to("cuda")
    for sess in (ref, bat):
        qs = np.array([sess.add_sequence() for _ in range(3)])
        sess.prefill_batch({int(q): Prompt(h[k:k + 2]) for k, q in enumerate(qs)})
    views = []
    for t in range(3, 6):
        x = h[t:t + 3]
        with ref.begin_step(qs, "decode") as st:
            want = st.run(x)
        with bat.begin_step(qs, "decode") as st:
            buf = st.input()
            buf.copy_(x)
            got = st.run(buf, copy=False)
            assert torch.equal(buf, x), "run wrote into the step's input rows"
        assert torch.equal(got, want), f"step {t}"
        views.append((got, want))
    # the first step of the bucket captured it and returned the acceptance gate's copy; the later ones the fixed rows
    assert views[1][0].data_ptr() == views[2][0].data_ptr()
    assert torch.equal(views[1][0], views[2][1]) and not torch.equal(views[1][1], views[2][1])
    assert all(torch.equal(a, b) for a, b in zip(_state(ref), _state(bat)))
    with bat.begin_step(qs[:1], "prefill", np.array([3])) as st:
        fresh = st.input()
        assert fresh.shape == (3, bat.cfg.stream_dim) and fresh.data_ptr() != buf.data_ptr()
        st.run(fresh.copy_(h[:3]))


def test_a_steady_decode_loop_sends_its_index_data_once():
    """The step's index data goes to the device only when it differs from what the device holds: a loop of the same
    sequences copies once, a different set copies again (a prefix of the entries the device holds does not), and
    the device's slots are the step's every time (the
    results equal the dict API's bit for bit: `test_batched_equals_dict_bit_for_bit`)."""
    s = open_session(PLAIN)
    h, _ = inputs(s, 8, seed=2)
    qs = np.array([s.add_sequence() for _ in range(3)])
    pk = s._steps.pack
    for t, sub in enumerate((qs, qs, qs, qs[1:], qs[1:], qs, qs[:2])):
        before = pk.copies
        with s.begin_step(sub, "decode") as st:
            st.run(h[t:t + sub.size])
            slots = pk.dev[:sub.size].tolist()
        assert slots == [s._seqs.slot(int(q)) for q in sub], f"step {t}"
        assert pk.copies - before == (1 if t in (0, 3, 5) else 0), f"step {t}"


def test_a_repeated_decode_request_is_checked_again_after_any_change():
    """The steady loop reuses its checked request (`request._repeat`) only while nothing that decides who may step
    changed: a pending verify, a release, a failure, or the caller's array rewritten in place are each refused or
    seen, with nothing changed."""
    s = open_session(PLAIN)
    h, _ = inputs(s, 12, seed=4)
    qs = np.array([s.add_sequence() for _ in range(3)])

    def decode(ids, t):
        with s.begin_step(ids, "decode") as st:
            st.run(h[t:t + ids.size])
        return st

    assert decode(qs, 0)._spec is decode(qs, 1)._spec  # the second step reused the first one's checked request
    with s.begin_step(qs[1:2], "verify", np.array([2])) as st:
        st.run(h[2:4])
    before = fingerprint(s)
    with pytest.raises(SequenceError, match=f"sequence {qs[1]} has an unaccepted verify"):
        s.begin_step(qs, "decode")
    assert fingerprint(s) == before
    s.accept({int(qs[1]): 0})
    decode(qs, 4)
    s.release(int(qs[2]))
    with pytest.raises(SequenceError, match=f"sequence {qs[2]}"):
        s.begin_step(qs, "decode")
    ids = qs[:2].copy()
    decode(ids, 5)
    ids[1] = ids[0]  # the same array object, rewritten: a repeat no more
    with pytest.raises(ValueError, match="appears twice"):
        s.begin_step(ids, "decode")
    with pytest.raises(RuntimeError):
        with s.begin_step(qs[:2], "decode") as st:
            st.run(h[6:8])
            raise RuntimeError("the host's model failed after the layers ran")
    with pytest.raises(SequenceError, match="failed in an earlier step"):
        s.begin_step(qs[:2], "decode")


def test_a_steady_decode_step_commits_exactly_its_sequences():
    """A decode step of the same checked request opens from what the last one bound and commits through a basic
    index where the slots allow (`steps._Steady`: an int for one slot, a slice for consecutive slots, the index
    array for scattered ones); a prefill between (the index buffer then holds its data), a new sequence and a
    cleared selector memo (a new request each) leave positions, fences and step counts exactly those of the steps
    that ran."""
    s = open_session(PLAIN)
    h, _ = inputs(s, 8, seed=3)
    q = np.array([s.add_sequence() for _ in range(5)])
    assert [s._seqs.slot(int(x)) for x in q] == list(range(5))
    want, steps, specs = dict.fromkeys(q.tolist(), 0), 0, []
    odd = q[[3, 0, 2]]
    plan = [q[4:], q[4:], q[2:4], q[2:4], "prefill", q[2:4], q[2:4], odd, odd, "add", odd, "memo", odd, odd]
    for t, sub in enumerate(plan):
        if isinstance(sub, str):
            if sub == "prefill":
                s.prefill(int(q[1]), h[:2])
                want[int(q[1])] += 2
            elif sub == "add":
                want[s.add_sequence()] = 0
            else:
                s.selector.fail_bucket(next(iter(s.selector._memo.values())).mode, 1, "a test clears the memo")
            specs.append(None)
            continue
        with s.begin_step(sub, "decode") as st:
            st.run(h[t % 4:t % 4 + sub.size])
            assert s._steps.pack.dev[:sub.size].tolist() == [s._seqs.slot(x) for x in sub.tolist()], f"step {t}"
        steps += 1
        for x in sub.tolist():
            want[x] += 1
        at = st._steady.at
        assert isinstance(at, int if sub.size == 1 else slice if (np.diff(sub) == 1).all() else np.ndarray), t
        specs.append(st._spec)
        assert {x: s.position(x) for x in want} == want, f"step {t}"
        stepped = {s._seqs.slot(x) for x, n in want.items() if n}
        assert [int(f) for f in s.pool._fence_of[:6]] == [0 if k in stepped else -1 for k in range(6)], f"step {t}"
    assert specs[1] is specs[0] and specs[3] is specs[2] and specs[5] is specs[3] and specs[6] is specs[5]
    assert specs[8] is specs[7] and specs[10] is not specs[8] and specs[12] is not specs[10] and specs[13] is specs[12]
    assert s.stats().kinds[StepKind.DECODE].steps == steps


def test_basic_index_is_a_slice_only_for_consecutive_ascending_slots():
    """`seqs.basic_index`: an int for one slot, a slice for consecutive ascending slots (past the run it compares
    with as well: the run grows), the array itself for any other order or gap."""
    from gdn_trt.runtime import seqs

    assert seqs.basic_index(np.array([5])) == 5
    assert seqs.basic_index(np.arange(3, 67)) == slice(3, 67)
    far = np.arange(seqs._RUN.size + 5, seqs._RUN.size + 300)
    assert seqs.basic_index(far) == slice(int(far[0]), int(far[-1]) + 1)
    for other in ([0, 2, 1, 3], [4, 5, 7], [3, 2], [1, 2, 4, 4]):
        a = np.array(other)
        assert seqs.basic_index(a) is a, other


def test_a_repeated_mixed_step_reuses_its_layout():
    """A mixed step of the same layout binds the same device views: the layout memos do not grow step by step."""
    s = open_session(PLAIN)
    h, _ = inputs(s, 40, seed=6)
    a, b, c = (s.add_sequence() for _ in range(3))
    s.prefill_batch({a: Prompt(h[:2]), b: Prompt(h[2:4])})
    sizes = []
    for t in range(4):
        with s.begin_step(np.array([a, b, c]), ["decode", "decode", "prefill"], np.array([1, 1, 2])) as st:
            st.run(h[4 + 4 * t:8 + 4 * t])
        sizes.append((len(s._steps.pack.memo), len(s._steps.part_memo)))
    assert sizes[1:] == sizes[:1] * 3, sizes


def test_fences_are_one_per_stream_and_cost_no_call():
    """A pool marks a step's slots with its stream's fence (no CUDA call per step); on the CPU the one fence is the
    device's, whose wait returns at once; past FENCES streams every further stream shares the device's fence."""
    from gdn_trt.runtime import state as st

    s = open_session(PLAIN)
    pool = s.pool
    f = pool.fence(None)
    assert f.index == 0 and f.stream is None and pool.fence(None) is f
    q = s.add_sequence()
    h, _ = inputs(s, 2, seed=1)
    s.prefill(q, h[:2])
    slot = s._seqs.slot(q)
    assert pool._fence_of[slot] == 0
    f.wait()  # the CPU's ops are synchronous: nothing to wait for
    fake = [object() for _ in range(st.FENCES + 2)]  # stand-ins: only their identity is kept, nothing is called
    got = [pool.fence(o) for o in fake]
    assert [g.index for g in got[:st.FENCES]] == list(range(1, st.FENCES + 1))
    assert all(g is pool._fences[0] for g in got[st.FENCES:])
    assert pool.fence(fake[3]) is got[3]


@pytest.mark.gpu
def test_a_snapshot_waits_for_a_step_on_another_stream():
    """A decode step enqueued on a side stream behind ~50 ms of GPU spin, then a snapshot from the default stream
    with no synchronization: it holds the state after the step (its fence synchronizes the side stream). The first
    decode step of each session captures and gates the bucket's graph (which synchronizes), on the default stream."""
    ref, s = _gpu(PLAIN, torch.float32), _gpu(PLAIN, torch.float32)
    h, _ = inputs(ref, 6, seed=3)
    h = h.cuda()
    for sess in (ref, s):
        sess.prefill(sess.add_sequence(), h[:4])
        sess.decode({0: h[4:5]})
    ref.decode({0: h[5:6]})
    want = ref.snapshot(0)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # cycles: tens of ms at the H200's clock
        with s.begin_step(np.array([0]), "decode") as step:
            step.run(h[5:6])
    assert not side.query(), "the side stream finished before the snapshot: the test shows nothing"
    assert s.snapshot(0) == want
