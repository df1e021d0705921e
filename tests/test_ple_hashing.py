"""PLE n-gram hashing: the vectors of docs/math.md#hash (and more, from a reimplementation of HF's functions), HF's
`Qwen4ExpTextNGramEmbedding`, chunking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gdn_trt.model.config import GdnConfig, preset
from gdn_trt.model.ngram import half_bound, layer_multipliers
from gdn_trt.runtime.ple.hashing import NgramHasher

hf = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
from transformers import DynamicCache  # noqa: E402
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig  # noqa: E402

EOS = 248044  # Qwen4-Exp eos_token_id (§2.4)


@pytest.fixture(scope="module")
def real() -> NgramHasher:
    return NgramHasher.for_layer(preset("qwen4-exp"), 1)  # PLE sits on zero-indexed layer 1


# ---- §5.4: constants of the real config ----
def test_real_constants(real: NgramHasher) -> None:
    assert real.eos == EOS and real.heads == 16 and real.context == 2
    assert half_bound(248320) == 18571544855136
    assert real.table.multipliers == (23703573157769, 20109073645365, 8052911324071)
    assert layer_multipliers(248320, 3, 0, 0) == [4788054244585, 5075510189727, 24189832309785]
    assert real.table.head_sizes == (20000003, 20000023, 20000033, 20000047, 20000059, 20000063, 20000069,
                                     20000077, 20000081, 20000093, 20000107, 20000147, 20000153, 20000159,
                                     20000161, 20000171)
    assert real.table.head_offsets == (0, 20000003, 40000026, 60000059, 80000106, 100000165, 120000228, 140000297,
                                       160000374, 180000455, 200000548, 220000655, 240000802, 260000955, 280001114,
                                       300001275)
    assert sum(real.table.head_sizes) == 320_001_446
    assert real.table.rows == 320_001_536 == 128 * 2_500_012


# ---- §5.5: rows ----
def test_real_rows_prefill(real: NgramHasher) -> None:
    rows, carry = real.hash_sequence([1000, 2000, 3000])
    assert rows.shape == (3, 16) and rows.dtype == np.int64
    assert rows[2].tolist() == [17238551, 37786998, 58085363, 66530061, 90936363, 119077008, 131292711,
                                147589323, 163669071, 180711380, 217289238, 227679745, 246259980, 264845837,
                                284375812, 302034413]
    assert rows[0, :3].tolist() == [1876085, 31308566, 59776718]
    assert carry.tolist() == [2000, 3000]


def test_real_decode_equals_prefill_position(real: NgramHasher) -> None:
    dec, carry = real.hash_sequence([4000], [2000, 3000])
    assert dec[0, :2].tolist() == [19826806, 32646537]
    full, _ = real.hash_sequence([1000, 2000, 3000, 4000])
    assert np.array_equal(dec[0], full[3])
    assert carry.tolist() == [3000, 4000]


def test_real_token_after_eos(real: NgramHasher) -> None:
    after, carry = real.hash_sequence([7], [500, EOS])
    assert after[0, 0] == 2927653
    fresh, _ = real.hash_sequence([7])
    assert np.array_equal(after, fresh)
    assert carry.tolist() == [EOS, 7]
    # the EOS itself still sees its predecessors: it differs from an EOS at sequence start
    eos_mid, _ = real.hash_sequence([1000, 2000, EOS])
    eos_start, _ = real.hash_sequence([EOS])
    assert not np.array_equal(eos_mid[2], eos_start[0])


# ---- against Hugging Face ----
def _small_cfg(ngram_size: int = 3, heads_per_ngram: int = 2, ple_ids: tuple[int, ...] = (2,)) -> GdnConfig:
    heads = (ngram_size - 1) * heads_per_ngram
    # base 20011: rows stay < 2^24, exact through HF's float32 embedding used as an identity table
    return preset("tiny-4exp").replace(ngram_size=ngram_size, heads_per_ngram=heads_per_ngram,
                                       ple_embed_dim=heads * 4, ngram_vocab_size_base=20011,
                                       ple_layer_ids=ple_ids, name="small")


def _hf_ids_module(cfg: GdnConfig, layer_idx: int) -> tuple[torch.nn.Module, Qwen4ExpTextConfig]:
    """HF's n-gram embedding with head width 1 and weight[r] = r: its output is the row index itself."""
    hc = Qwen4ExpTextConfig(**cfg.to_hf()["text_config"])
    m = hf.Qwen4ExpTextNGramEmbedding(hc, embedding_dim=cfg.ple_heads, layer_idx=layer_idx,
                                      ple_layer_index=cfg.ple_index(layer_idx))
    with torch.no_grad():
        m.ngram_embedding.weight.copy_(torch.arange(m.ngram_embedding.weight.shape[0])[:, None])
    return m, hc


def _hf_rows(m: torch.nn.Module, ids: np.ndarray, cache=None) -> np.ndarray:
    with torch.no_grad():
        out = m(torch.as_tensor(ids).reshape(1, -1), cache)[0]
    return out.to(torch.int64).numpy()


def _random_ids(rng: np.random.Generator, n: int, vocab: int, eos: int) -> np.ndarray:
    ids = rng.integers(0, vocab, n)
    ids[rng.random(n) < 0.2] = eos  # EOS inside the sequence, sometimes twice in a row
    return ids


@pytest.mark.parametrize("ngram_size,heads_per_ngram,ple_ids,layer_idx",
                         [(3, 2, (2,), 1), (3, 3, (2, 3), 2), (4, 2, (2,), 1)])
def test_matches_hf_prefill(ngram_size: int, heads_per_ngram: int, ple_ids: tuple[int, ...], layer_idx: int) -> None:
    cfg = _small_cfg(ngram_size, heads_per_ngram, ple_ids)
    h = NgramHasher.for_layer(cfg, layer_idx)
    m, _ = _hf_ids_module(cfg, layer_idx)
    assert h.table.head_sizes == tuple(m.head_vocab_sizes)  # same constants from both sides
    rng = np.random.default_rng(1)
    for n in (1, 2, 3, 17, 64):
        ids = _random_ids(rng, n, cfg.vocab_size, cfg.eos_token_id)
        rows, _ = h.hash_sequence(ids)
        assert np.array_equal(rows, _hf_rows(m, ids)), ids


def test_matches_hf_with_cache_chunks() -> None:
    """Chunked calls through HF's own cache (id context in conv_states[2]) == ours with the carry."""
    cfg = _small_cfg()
    h = NgramHasher.for_layer(cfg, 1)
    m, hc = _hf_ids_module(cfg, 1)
    rng = np.random.default_rng(2)
    ids = _random_ids(rng, 40, cfg.vocab_size, cfg.eos_token_id)
    cache, carry = DynamicCache(config=hc), None
    for a, b in ((0, 1), (1, 9), (9, 10), (10, 11), (11, 30), (30, 40)):
        rows, carry = h.hash_sequence(ids[a:b], carry)
        assert np.array_equal(rows, _hf_rows(m, ids[a:b], cache))
        assert carry.tolist() == cache.get_conv_state(1, 2)[0].tolist()


def test_chunked_prefill_equals_one_prefill() -> None:
    cfg = _small_cfg()
    h = NgramHasher.for_layer(cfg, 1)
    rng = np.random.default_rng(3)
    ids = _random_ids(rng, 50, cfg.vocab_size, cfg.eos_token_id)
    full, full_carry = h.hash_sequence(ids)
    for _ in range(20):
        cuts = np.sort(rng.choice(np.arange(1, 50), rng.integers(1, 8), replace=False))
        parts, carry = [], None
        for chunk in np.split(ids, cuts):
            r, carry = h.hash_sequence(chunk, carry)
            parts.append(r)
        assert np.array_equal(np.concatenate(parts), full)
        assert np.array_equal(carry, full_carry)


def test_packed_equals_per_sequence_and_hf() -> None:
    """Varlen packing (including an empty sequence and mid-stream carries) == each sequence alone == HF."""
    cfg = _small_cfg()
    h = NgramHasher.for_layer(cfg, 1)
    m, _ = _hf_ids_module(cfg, 1)
    rng = np.random.default_rng(4)
    hist = [_random_ids(rng, k, cfg.vocab_size, cfg.eos_token_id) for k in (5, 0, 1, 12, 3)]
    new = [_random_ids(rng, k, cfg.vocab_size, cfg.eos_token_id) for k in (4, 0, 1, 0, 9)]
    carries = np.stack([h.hash_sequence(x)[1] for x in hist])
    carries_before = carries.copy()
    cu = np.concatenate([[0], np.cumsum([len(x) for x in new])])
    rows, new_carries = h.hash_packed(np.concatenate(new), cu, carries)
    assert np.array_equal(carries, carries_before)  # inputs untouched
    for k in range(len(new)):
        full = np.concatenate([hist[k], new[k]]).astype(np.int64)
        got = rows[cu[k]:cu[k + 1]]
        if full.size:
            assert np.array_equal(got, _hf_rows(m, full)[len(hist[k]):])
        want_carry = np.concatenate([[cfg.eos_token_id] * 2, full])[-2:]
        assert new_carries[k].tolist() == want_carry.tolist()


@pytest.mark.parametrize("ngram_size", [2, 3, 4])
def test_decode_step_equals_packed_path_and_hf(ngram_size: int) -> None:
    """A decode step (one id per sequence: its history is its carry) takes a shortcut; it gives the packed path's
    rows and carries (forced by an empty sequence at the end) and HF's rows, EOS histories included."""
    cfg = _small_cfg(ngram_size=ngram_size)
    h = NgramHasher.for_layer(cfg, 1)
    m, _ = _hf_ids_module(cfg, 1)
    rng = np.random.default_rng(ngram_size)
    hist = [_random_ids(rng, k, cfg.vocab_size, cfg.eos_token_id) for k in (0, 1, 2, 7, 9, 12)]
    hist[3][-1] = cfg.eos_token_id  # the token before the new one is EOS
    carries = np.stack([h.hash_sequence(x)[1] for x in hist])
    ids = rng.integers(0, cfg.vocab_size, len(hist))
    ids[4] = cfg.eos_token_id
    fast = h.hash_packed(ids, np.arange(len(hist) + 1), carries)
    slow = h.hash_packed(ids, np.concatenate([np.arange(len(hist) + 1), [len(hist)]]),
                         np.concatenate([carries, h.initial_carry(1)]))
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1][:-1])
    for k, x in enumerate(hist):
        full = np.concatenate([x, ids[k:k + 1]]).astype(np.int64)
        assert np.array_equal(fast[0][k], _hf_rows(m, full)[-1])


def test_bad_input_raises() -> None:
    h = NgramHasher.for_layer(_small_cfg(), 1)
    V = h.vocab_size
    with pytest.raises(ValueError, match="vocabulary"):
        h.hash_sequence([1, V])
    with pytest.raises(ValueError, match="vocabulary"):
        h.hash_sequence([-1])
    with pytest.raises(ValueError, match="vocabulary"):
        h.hash_sequence([1], [0, V + 5])
    with pytest.raises(TypeError, match="integers"):
        h.hash_sequence(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        h.hash_sequence(np.ones((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="carries"):
        h.hash_packed([1, 2], [0, 2], np.zeros((1, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="cu_seqlens"):
        h.hash_packed([1, 2], [0, 3], h.initial_carry(1))
    with pytest.raises(ValueError, match="cu_seqlens"):
        h.hash_packed([1, 2], [0, 2, 1, 2], h.initial_carry(3))
    with pytest.raises(ValueError, match="no PLE"):
        NgramHasher.for_layer(_small_cfg(), 0)
