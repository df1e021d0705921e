"""PLE prestage on the CPU: staged rows == HF's n-gram embedding lookup, carries, decode after prefill, failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gdn_trt.model.checkpoint import PleTable, load_checkpoint, load_table, make_synthetic_checkpoint
from gdn_trt.model.config import GdnConfig, preset
from gdn_trt.runtime.ple.prestage import Prestage, PrestageCounters

hf = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")
from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig  # noqa: E402

LAYER = 1  # tiny-4exp: PLE on one-indexed layer 2


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[GdnConfig, PleTable, torch.nn.Module]:
    """bf16 tiny-4exp checkpoint, and HF's n-gram embedding holding the same table (the oracle)."""
    cfg = preset("tiny-4exp").replace(dtype="bfloat16")
    ckpt = load_checkpoint(make_synthetic_checkpoint(cfg, tmp_path_factory.mktemp("ckpt"), seed=3))
    table = ckpt.ple_tables[LAYER]
    m = hf.Qwen4ExpTextNGramEmbedding(Qwen4ExpTextConfig(**cfg.to_hf()["text_config"]), cfg.ple_embed_dim,
                                      LAYER, cfg.ple_index(LAYER)).to(torch.bfloat16)
    with torch.no_grad():
        m.ngram_embedding.weight.copy_(load_table(table))
    return ckpt.config, table, m


def _hf(m: torch.nn.Module, ids: np.ndarray) -> torch.Tensor:
    """HF lookup of one whole sequence from a fresh state: [T, heads * d_h]."""
    with torch.no_grad():
        return m(torch.as_tensor(ids, dtype=torch.int64)[None], None)[0]


def _ids(rng: np.random.Generator, n: int, cfg: GdnConfig) -> np.ndarray:
    x = rng.integers(0, cfg.vocab_size, n)
    x[rng.random(n) < 0.2] = cfg.eos_token_id
    return x


def _prestage(cfg: GdnConfig, table: PleTable, max_tokens: int = 64, cache_rows: int = 32) -> Prestage:
    return Prestage(cfg, LAYER, table, max_tokens, "cpu", cache_rows)


def test_multi_sequence_steps_match_hf(model) -> None:
    """Mixed steps (prefill chunks and decodes of several sequences at once) == HF on each whole sequence."""
    cfg, table, m = model
    p = _prestage(cfg, table)
    rng = np.random.default_rng(0)
    full = {k: _ids(rng, n, cfg) for k, n in (("a", 23), ("b", 9), ("c", 14))}
    for k in full:
        p.add_carry(k)
    schedule = [  # (key, start, end) per step
        [("a", 0, 10), ("b", 0, 1), ("c", 0, 6)],
        [("a", 10, 11), ("b", 1, 2), ("c", 6, 7)],
        [("b", 2, 9), ("a", 11, 12)],
        [("c", 7, 14), ("a", 12, 23)],
    ]
    got = {k: [] for k in full}
    for step in schedule:
        out = p.stage([(k, full[k][a:b]) for k, a, b in step])
        assert out.shape == (sum(b - a for _, a, b in step), cfg.ple_heads, cfg.ple_head_dim)
        off = 0
        for k, a, b in step:
            got[k].append(out[off:off + b - a].clone())
            off += b - a
    for k, ids in full.items():
        staged = torch.cat(got[k]).reshape(len(ids), -1)
        assert torch.equal(staged, _hf(m, ids)), k
    c = p.counters()
    T = sum(len(x) for x in full.values())
    assert (c.uploads, c.tokens) == (len(schedule), T)
    assert c.hits + c.misses == T * cfg.ple_heads
    assert c.bytes_uploaded == T * cfg.ple_embed_dim * 2  # bf16


def test_carries_advance_like_full_prefill(model) -> None:
    cfg, table, _ = model
    eos = cfg.eos_token_id
    p = _prestage(cfg, table)
    rng = np.random.default_rng(1)
    ids = _ids(rng, 17, cfg)
    p.add_carry("one")
    p.add_carry("chunks")
    assert p.get_carry("one").tolist() == [eos, eos]
    one = p.stage([("one", ids)]).clone()
    chunks = [p.stage([("chunks", x)]).clone() for x in np.split(ids, [1, 2, 7, 16])]
    assert torch.equal(torch.cat(chunks), one)
    assert p.get_carry("one").tolist() == p.get_carry("chunks").tolist() == ids[-2:].tolist()
    p.add_carry("short")
    p.stage([("short", [5])])
    assert p.get_carry("short").tolist() == [eos, 5]
    p.stage([("short", [])])  # zero tokens (verify with no drafts): no upload, carry kept
    assert p.get_carry("short").tolist() == [eos, 5]


def test_decode_after_prefill_equals_prefill_rows(model) -> None:
    cfg, table, m = model
    p = _prestage(cfg, table)
    ids = np.array([11, 22, cfg.eos_token_id, 33, 44, 55, 66])
    ref = _hf(m, ids)
    p.add_carry(0)
    p.stage([(0, ids[:3])])
    for t in range(3, len(ids)):
        dec = p.stage([(0, ids[t:t + 1])])
        assert torch.equal(dec.reshape(1, -1), ref[t:t + 1]), t


def test_snapshot_restore_carry(model) -> None:
    cfg, table, _ = model
    p = _prestage(cfg, table)
    p.add_carry("s")
    p.stage([("s", [1, 2, 3])])
    snap = p.get_carry("s")
    first = p.stage([("s", [4, 5])]).clone()
    snap[0] = 999  # the copy is the caller's: mutating it must not reach the prestage
    p.set_carry("s", [2, 3])
    again = p.stage([("s", [4, 5])]).clone()
    assert torch.equal(first, again)
    p.add_carry("t", [2, 3])  # a restored sequence may start from a carry
    assert torch.equal(p.stage([("t", [4, 5])]), first)


def test_fixed_device_buffer(model) -> None:
    """Every stage lands at the same address (what a captured graph or an engine binding reads)."""
    cfg, table, _ = model
    p = _prestage(cfg, table, max_tokens=8)
    p.add_carry("s")
    a = p.stage([("s", [1, 2, 3])])
    p.rearm()
    b = p.stage([("s", [4])])
    assert a.data_ptr() == b.data_ptr() == p.ple_rows.data_ptr()
    assert p.ple_rows.shape == (8, cfg.ple_heads, cfg.ple_head_dim) and not p.staging.is_pinned()


def test_failed_stage_changes_nothing(model) -> None:
    cfg, table, _ = model
    p = _prestage(cfg, table, max_tokens=8)
    p.add_carry("a")
    p.add_carry("b")
    p.stage([("a", [1, 2]), ("b", [3])])
    carries = {k: p.get_carry(k) for k in ("a", "b")}
    counters, rows = p.counters(), p.ple_rows.clone()
    V = cfg.vocab_size
    bad = [
        (KeyError, "no PLE id carry", [("a", [1]), ("zz", [2])]),
        (ValueError, "twice", [("a", [1]), ("a", [2])]),
        (ValueError, "max_tokens", [("a", list(range(5))), ("b", list(range(4)))]),
        (ValueError, "vocabulary", [("a", [1]), ("b", [2, V])]),
        (ValueError, "vocabulary", [("a", [-1])]),
        (TypeError, "integers", [("a", [1.5])]),
        (ValueError, "1-D", [("a", [[1, 2]])]),
    ]
    for exc, msg, seqs in bad:
        with pytest.raises(exc, match=msg):
            p.stage(seqs)
        assert {k: p.get_carry(k).tolist() for k in carries} == {k: v.tolist() for k, v in carries.items()}
        assert p.counters() == counters and torch.equal(p.ple_rows, rows)


def test_carry_api_errors(model) -> None:
    cfg, table, _ = model
    p = _prestage(cfg, table)
    p.add_carry("a")
    with pytest.raises(KeyError, match="already"):
        p.add_carry("a")
    with pytest.raises(KeyError, match="no PLE id carry"):
        p.drop_carry("x")
    with pytest.raises(KeyError, match="no PLE id carry"):
        p.set_carry("x", [1, 2])
    with pytest.raises(ValueError, match=r"carry must be \[2\]"):
        p.set_carry("a", [1, 2, 3])
    with pytest.raises(ValueError, match="vocabulary"):
        p.set_carry("a", [1, cfg.vocab_size])
    assert p.get_carry("a").tolist() == [cfg.eos_token_id] * 2
    p.drop_carry("a")
    assert "a" not in p
    with pytest.raises(KeyError):
        p.stage([("a", [1])])
    assert p.counters() == PrestageCounters()


def test_table_must_match_config(model, tmp_path: Path) -> None:
    cfg, table, _ = model
    with pytest.raises(ValueError, match="the config needs"):
        Prestage(cfg, LAYER, PleTable(table.path, table.rows - 8, table.dim, table.dtype), 4, "cpu", 4)
    with pytest.raises(ValueError, match="no PLE"):
        Prestage(cfg, 0, table, 4, "cpu", 4)
