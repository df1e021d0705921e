"""A Hugging Face hybrid model served the way an engine serves it: its own embeddings, attention, MoE / MLP, norms
and lm_head, and gdn-trt's runtime for every Gated-DeltaNet layer (their conv and recurrent state live in the
runtime's pools, not in Hugging Face's cache).

    python examples/hf_hybrid.py [--family qwen3_next|qwen3_5] [--device cpu|cuda] [--tokens 32]

It builds a tiny random `Qwen3NextForCausalLM` (MoE blocks) or `Qwen3_5ForCausalLM` (dense MLP) with full-attention
layers between its GDN layers, saves it as a sharded bf16 checkpoint (what real users have), and runs, in float32:
a prefill of three prompts of different lengths in one step, greedy decoding of every sequence, a verify of draft
tokens with partial acceptance inside a mixed decode + verify step, and a snapshot taken mid-sequence and restored
into a new sequence that continues where the first one was. It compares every logit with the unmodified Hugging
Face model and the generated tokens with Hugging Face's own `generate`.

The integration is three pieces (`HybridHost`):
- each decoder layer's `linear_attn` module is replaced by `RuntimeMixer`, which hands its input (the normed hidden
  state of the step's tokens, HF's `linear_attn` input) to the open step's `mixer(layer_idx, h)`;
- the full-attention layers keep HF's module; their KV cache is `KvCache`, the host's own (one row per sequence),
  which HF's attention calls through the `Cache.update` protocol;
- a step of the host (`HybridHost.forward`) opens `Session.begin_step` for its sequences, runs HF's model forward
  over the packed tokens (positions and a block-causal mask per sequence), and closes the step.
For a CUDA graph of the whole decode step, `StaticDecode` runs the same forward on fixed buffers (the runtime's
layer calls do no host work once the step is open): capture it once under an open step, then per step open a step,
fill the buffers, `step.replayed()`, replay.
"""

from __future__ import annotations

import argparse
import inspect
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from gdn_trt.runtime import RuntimeLimits, Session, SessionOptions

FAMILIES = ("qwen3_next", "qwen3_5")
_COMMON = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=12,
               linear_conv_kernel_dim=4, num_hidden_layers=6, max_position_embeddings=512, rms_norm_eps=1e-6,
               layer_types=["linear_attention", "linear_attention", "full_attention"] * 2, tie_word_embeddings=False,
               intermediate_size=96)


def model_class(family: str):
    if family == "qwen3_next":
        from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextForCausalLM

        cfg = Qwen3NextConfig(**_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                              shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[])
        return Qwen3NextForCausalLM, cfg
    if family == "qwen3_5":
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

        return Qwen3_5ForCausalLM, Qwen3_5TextConfig(**_COMMON)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def make_checkpoint(family: str, path: Path, seed: int = 0) -> Path:
    """A tiny random model of `family` saved as a sharded bf16 checkpoint. The weights are drawn at scale 1/sqrt(fan
    in) (HF's 0.02 init gives near-uniform logits, where a greedy argmax would hinge on the last bits)."""
    cls, cfg = model_class(family)
    torch.manual_seed(seed)
    model = cls(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias")):
                continue  # HF's gate init: decay rates and time steps of a trained-like range
            if p.dim() == 1:  # norms: (1 + w) around 1
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    model.to(torch.bfloat16).save_pretrained(path, max_shard_size="100KB")
    return path


def load_hf(family: str, path: Path, device: str, experts: str | None = None) -> nn.Module:
    """The checkpoint as HF loads it, computing in float32 (bf16 weights, exactly representable)."""
    cls, _ = model_class(family)
    kw = {"experts_implementation": experts} if experts else {}
    return cls.from_pretrained(path, dtype=torch.float32, **kw).to(device).eval()


class KvCache:
    """The host's attention cache, per full-attention layer K and V `[rows, kv_heads, max_len, head_dim]`, one row per
    sequence. HF's attention calls `update(k, v, layer_idx)`; what it writes and returns is set per step:
    `packed(...)`: the step's tokens packed in one batch row ([1, kv_heads, T, d]), each sequence's written at its
    positions and all of its keys returned, concatenated (the mask makes them block-causal); `static(pos)`: one token
    per batch row b = cache row b, written at `pos[b]`, the whole rows returned (fixed shapes, for a CUDA graph)."""

    def __init__(self, cfg, rows: int, max_len: int, device: str):
        shape = (rows, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = {i: torch.zeros(shape, device=device) for i, t in enumerate(cfg.layer_types) if t == "full_attention"}
        self.v = {i: torch.zeros_like(t) for i, t in self.k.items()}
        self._layout: list[tuple[int, int, int, int]] = []  # (row, position, length, token offset) per sequence
        self._pos: Tensor | None = None

    def packed(self, layout: list[tuple[int, int, int, int]]) -> "KvCache":
        self._layout, self._pos = layout, None
        return self

    def static(self, pos: Tensor) -> "KvCache":
        self._layout, self._pos = [], pos
        return self

    def update(self, key: Tensor, value: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        K, V = self.k[layer_idx], self.v[layer_idx]
        if self._pos is not None:
            rows = torch.arange(key.shape[0], device=key.device)
            K[rows, :, self._pos] = key[:, :, 0]
            V[rows, :, self._pos] = value[:, :, 0]
            return K[:key.shape[0]], V[:key.shape[0]]
        ks, vs = [], []
        for row, pos, n, t in self._layout:
            K[row, :, pos:pos + n] = key[0, :, t:t + n]
            V[row, :, pos:pos + n] = value[0, :, t:t + n]
            ks.append(K[row, :, :pos + n])
            vs.append(V[row, :, :pos + n])
        return torch.cat(ks, dim=1)[None], torch.cat(vs, dim=1)[None]


class RuntimeMixer(nn.Module):
    """Stands in for HF's `linear_attn` of GDN layer `layer_idx`: the open step's mixer (state in the runtime)."""

    def __init__(self, host: "HybridHost", layer_idx: int):
        super().__init__()
        self.host, self.layer_idx = host, layer_idx

    def forward(self, hidden_states: Tensor, cache=None, attention_mask=None, **kwargs) -> Tensor:
        h = hidden_states.reshape(-1, hidden_states.shape[-1])  # [1, T, C] packed or [B, 1, C]: the step's rows
        return self.host.step.mixer(self.layer_idx, h).reshape(hidden_states.shape)


def block_causal_mask(layout: list[tuple[int, int, int, int]], device: str) -> Tensor:
    """[1, 1, T, K] additive mask: token i of a sequence at position p sees that sequence's keys 0..p+i."""
    T = sum(n for _, _, n, _ in layout)
    K = sum(p + n for _, p, n, _ in layout)
    mask = torch.full((T, K), float("-inf"), device=device)
    k0 = 0
    for _, p, n, t in layout:
        q = torch.arange(n, device=device)[:, None] + p
        k = torch.arange(p + n, device=device)[None, :]
        mask[t:t + n, k0:k0 + p + n] = torch.where(k <= q, 0.0, float("-inf"))
        k0 += p + n
    return mask[None, None]


@dataclass
class Track:
    """One sequence of the host: its cache row, the tokens fed so far, and the next token (sampled, not fed)."""

    row: int
    tokens: list[int] = field(default_factory=list)
    pending: int = -1


class HybridHost:
    """A model runner: HF's model with every `linear_attn` replaced by the runtime (see the module docstring)."""

    def __init__(self, model: nn.Module, sess: Session, rows: int, max_len: int):
        self.model, self.sess, self.cfg = model, sess, model.config
        for i, layer in enumerate(model.model.layers):
            if self.cfg.layer_types[i] == "linear_attention":
                layer.linear_attn = RuntimeMixer(self, i)  # HF's GDN weights leave the host model
        self.kv = KvCache(self.cfg, rows, max_len, sess.device.type)
        # the model's name for its cache argument: `cache` from transformers 5.2x on (`past_key_values` deprecated
        # there), `past_key_values` before (5.17 drops an unknown `cache` into **kwargs: the attention then sees only
        # the step's own keys)
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.tracks: dict[int, Track] = {}
        self._free = list(range(rows - 1, -1, -1))
        self.step = None

    def add(self, seq: int, tokens: list[int] | None = None, pending: int = -1) -> None:
        self.tracks[seq] = Track(self._free.pop(), list(tokens or []), pending)

    def release(self, seq: int) -> None:
        self._free.append(self.tracks.pop(seq).row)
        self.sess.release(seq)

    def forward(self, feed: dict[int, list[int]], kinds: dict[int, str]) -> dict[int, Tensor]:
        """One step: feed[seq] = the tokens to run (kinds[seq]: decode, verify or prefill; grouped in that order)
        -> logits [len, vocab] per sequence. Decode and prefill tokens are committed; verify tokens wait for
        `accept`."""
        order = sorted(feed, key=lambda q: ("decode", "verify", "prefill").index(kinds[q]))
        layout, ids, pos, t = [], [], [], 0
        for q in order:
            tr, toks = self.tracks[q], feed[q]
            p = self.sess.position(q)
            layout.append((tr.row, p, len(toks), t))
            ids += toks
            pos += range(p, p + len(toks))
            t += len(toks)
        dev = self.sess.device.type
        ids_t, pos_t = torch.tensor([ids], device=dev), torch.tensor([pos], device=dev)
        mask = {"full_attention": block_causal_mask(layout, dev), "linear_attention": None}
        kind = [kinds[q] for q in order]
        with torch.no_grad(), self.sess.begin_step(np.array(order), kind if len(set(kind)) > 1 else kind[0],
                                                   np.array([len(feed[q]) for q in order])) as self.step:
            logits = self.model(input_ids=ids_t, position_ids=pos_t, attention_mask=mask, use_cache=True,
                                **{self.cache_arg: self.kv.packed(layout)}).logits[0]
        self.step = None
        out = {}
        for q, (_, _, n, t) in zip(order, layout):
            out[q] = logits[t:t + n]
            if kinds[q] != "verify":
                self.tracks[q].tokens += feed[q]
        return out

    def accept(self, seq: int, fed: list[int], j: int) -> None:
        """Keep the first j tokens of a verify: the runtime folds its state, the host keeps its cache rows."""
        self.sess.accept({seq: j})
        self.tracks[seq].tokens += fed[:j]


class StaticDecode:
    """The decode step of `B` sequences (cache rows 0..B-1, in step order) on fixed buffers: capturable whole."""

    def __init__(self, host: HybridHost, B: int):
        self.host, self.B = host, B
        dev = host.sess.device
        self.ids = torch.zeros((B, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)
        self.keys = torch.arange(next(iter(host.kv.k.values())).shape[2], device=dev)
        self.logits: Tensor | None = None

    def fill(self, ids: list[int], pos: list[int]) -> None:
        """Host values into the fixed buffers (padding rows past the real sequences: token 0 at position 0)."""
        pad = self.B - len(ids)
        self.ids.copy_(torch.tensor([[i] for i in ids] + [[0]] * pad))
        self.pos.copy_(torch.tensor(pos + [0] * pad))

    def run(self) -> Tensor:
        """The whole model step on the fixed buffers (the host's step must be open); logits [B, vocab]."""
        mask = torch.where(self.keys[None, :] <= self.pos[:, None], 0.0, float("-inf"))[:, None, None, :]
        with torch.no_grad():
            self.logits = self.host.model(input_ids=self.ids, position_ids=self.pos[:, None],
                                          attention_mask={"full_attention": mask, "linear_attention": None},
                                          use_cache=True, **{self.host.cache_arg: self.host.kv.static(self.pos)}
                                          ).logits[:, 0]
        return self.logits


@dataclass
class Report:
    """What `run_demo` saw: per sequence, our logits at each fed position (by position) and the tokens; the verify."""

    family: str
    logits: dict[int, dict[int, Tensor]]
    tokens: dict[int, list[int]]
    prompts: dict[int, list[int]]
    verify: dict = field(default_factory=dict)
    restored: tuple[int, int, int] | None = None  # (source seq, restored seq, position of the snapshot)


def run_demo(family: str, root: Path, device: str = "cpu", new_tokens: int = 32, seed: int = 0) -> Report:
    """The scenario of the module docstring on a fresh tiny checkpoint under `root`; returns what it saw."""
    ckpt = make_checkpoint(family, root / family, seed)
    model = load_hf(family, ckpt, device, experts="batched_mm" if family == "qwen3_next" else None)
    limits = RuntimeLimits(max_seqs=8, max_prefill_tokens=64, max_draft=4)
    sess = Session.open(ckpt, backend="torch", device=device, options=SessionOptions(limits=limits,
                                                                                     dtype=torch.float32))
    host = HybridHost(model, sess, rows=8, max_len=128)
    gen = torch.Generator().manual_seed(seed + 1)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (5, 9, 13)]
    seqs = [sess.add_sequence() for _ in prompts]
    rep = Report(family, {q: {} for q in seqs}, {}, dict(zip(seqs, prompts)))
    for q in seqs:
        host.add(q)
    out = host.forward(dict(zip(seqs, prompts)), {q: "prefill" for q in seqs})
    for q, p in zip(seqs, prompts):
        _record(rep, host, q, out[q], 0)
        host.tracks[q].pending = int(out[q][-1].argmax())
    a, b, c = seqs
    snap = None
    for step in range(new_tokens):
        live = [q for q in host.tracks]
        feed = {q: [host.tracks[q].pending] for q in live}
        kinds = {q: "decode" for q in live}
        if step == 12:  # b verifies 4 tokens: its pending token and 3 drafts, the third of them wrong
            want = _greedy(model_ref(family, ckpt), host.tracks[b].tokens + feed[b], 3)
            feed[b] = feed[b] + want[:2] + [(want[2] + 1) % 512]
            kinds[b] = "verify"
        before = {q: sess.position(q) for q in live}
        out = host.forward(feed, kinds)
        for q in live:
            _record(rep, host, q, out[q], before[q])
            if kinds[q] == "verify":
                pred = out[q].argmax(-1).tolist()
                j = 1 + next((k for k, d in enumerate(feed[q][1:]) if d != pred[k]), len(feed[q]) - 1)
                host.accept(q, feed[q], j)
                rep.verify = dict(seq=q, fed=feed[q], accepted=j, logits=out[q], position=before[q])
                host.tracks[q].pending = pred[j - 1]
            else:
                host.tracks[q].pending = int(out[q][-1].argmax())
        if step == 8:  # a mid-sequence snapshot of a: the runtime's state, and the host's cache rows and tokens
            snap = (sess.snapshot(a), list(host.tracks[a].tokens), host.tracks[a].pending, _rows(host, a))
        if step == 20:
            r = sess.restore(snap[0])
            host.add(r, snap[1], snap[2])
            _put_rows(host, r, snap[3])
            rep.logits[r] = {}
            rep.restored = (a, r, len(snap[1]))
    for q, tr in host.tracks.items():
        rep.tokens[q] = tr.tokens + [tr.pending]
    return rep


_REF: dict = {}


def model_ref(family: str, ckpt: Path) -> nn.Module:
    """The unmodified HF model of the checkpoint (float32, CPU), loaded once per checkpoint."""
    key = (family, str(ckpt))
    if key not in _REF:
        _REF.clear()
        _REF[key] = load_hf(family, ckpt, "cpu")
    return _REF[key]


def _greedy(model: nn.Module, tokens: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([tokens]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(tokens):].tolist()


def _record(rep: Report, host: HybridHost, q: int, logits: Tensor, start: int) -> None:
    for k in range(logits.shape[0]):
        rep.logits[q][start + k] = logits[k].detach().cpu()


def _rows(host: HybridHost, q: int) -> dict:
    row, n = host.tracks[q].row, host.sess.position(q)
    return {i: (host.kv.k[i][row, :, :n].clone(), host.kv.v[i][row, :, :n].clone()) for i in host.kv.k}


def _put_rows(host: HybridHost, q: int, rows: dict) -> None:
    row = host.tracks[q].row
    for i, (k, v) in rows.items():
        host.kv.k[i][row, :, :k.shape[1]] = k
        host.kv.v[i][row, :, :v.shape[1]] = v


def reference_logits(rep: Report, ckpt: Path) -> dict[int, Tensor]:
    """The unmodified HF model over each sequence's whole history at once: logits [len, vocab]."""
    ref = model_ref(rep.family, ckpt)
    with torch.no_grad():
        return {q: ref(input_ids=torch.tensor([toks[:-1]])).logits[0] for q, toks in rep.tokens.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=FAMILIES, default="qwen3_next")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rep = run_demo(args.family, Path(tmp), args.device, args.tokens)
        ckpt = Path(tmp) / args.family
        ref = reference_logits(rep, ckpt)
        worst = max((got - ref[q][p]).abs().max().item() for q, by in rep.logits.items() for p, got in by.items())
        same = all(rep.tokens[q][len(p):] == ref[q][len(p) - 1:].argmax(-1).tolist() for q, p in rep.prompts.items())
        src, dst, at = rep.restored
        print(f"{args.family} on {args.device}: {len(rep.tokens)} sequences, "
              f"{sum(len(v) for v in rep.logits.values())} logit rows against Hugging Face: max |diff| {worst:.2e}; "
              f"greedy tokens equal to Hugging Face's: {same}; verify accepted {rep.verify['accepted']} of "
              f"{len(rep.verify['fed'])}; the snapshot of sequence {src} at {at} tokens, restored as sequence {dst}, "
              f"continued with the same tokens: {rep.tokens[dst] == rep.tokens[src][:len(rep.tokens[dst])]}")


if __name__ == "__main__":
    main()
