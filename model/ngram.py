"""Constants of Qwen4-Exp's hashed n-gram tables (docs/math.md#hash): multipliers, prime head sizes, offsets.

Pure functions of the config, re-derived here so a checkpoint's int64 buffers can be checked against them (and
written into synthetic checkpoints). Hashing token ids with these constants lives in `runtime/ple/hashing.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import GdnConfig

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_LAYER_PRIME = 10007


def splitmix64(v: int) -> int:
    v = (v + _GAMMA) & _MASK64
    v = ((v ^ (v >> 30)) * _M1) & _MASK64
    v = ((v ^ (v >> 27)) * _M2) & _MASK64
    return (v ^ (v >> 31)) & _MASK64


def half_bound(vocab_size: int) -> int:
    """Multipliers stay below this so that id * m < 2^63 for every id < vocab_size (no int64 overflow)."""
    return max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)


def layer_multipliers(vocab_size: int, ngram_size: int, ple_index: int, seed: int) -> list[int]:
    """Odd 63-bit multipliers, one per n-gram position (HF `_build_layer_multipliers`)."""
    base, hb = seed + _LAYER_PRIME * ple_index, half_bound(vocab_size)
    return [2 * (splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % hb) + 1 for i in range(ngram_size)]


def _is_prime(v: int) -> bool:
    if v < 2:
        return False
    if v % 2 == 0:
        return v == 2
    return all(v % d for d in range(3, math.isqrt(v) + 1, 2))


def primes_after(start: int, count: int) -> list[int]:
    """The first `count` primes greater than `start`."""
    out, p = [], start
    while len(out) < count:
        p += 1
        if _is_prime(p):
            out.append(p)
    return out


@dataclass(frozen=True)
class NgramTable:
    """Layout of one PLE layer's table: per-head prime sizes and offsets into the concatenated table."""

    multipliers: tuple[int, ...]
    head_sizes: tuple[int, ...]
    head_offsets: tuple[int, ...]
    rows: int  # padded to make_ngram_vocab_size_divisible_by
    dim: int  # d_h, width of one row

    @staticmethod
    def for_layer(cfg: GdnConfig, layer_idx: int) -> "NgramTable":
        idx = cfg.ple_index(layer_idx)
        heads = cfg.ple_heads
        # head h of PLE layer idx takes the (idx*heads + h + 1)-th prime above base - 1
        sizes = primes_after(cfg.ngram_vocab_size_base - 1, (idx + 1) * heads)[idx * heads:]
        offsets = [sum(sizes[:h]) for h in range(heads)]
        div = cfg.make_ngram_vocab_size_divisible_by
        rows = -(-sum(sizes) // div) * div
        mult = layer_multipliers(cfg.vocab_size, cfg.ngram_size, idx, cfg.seed)
        return NgramTable(tuple(mult), tuple(sizes), tuple(offsets), rows, cfg.ple_head_dim)
