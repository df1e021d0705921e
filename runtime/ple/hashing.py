"""Token-id hashing of one Qwen4-Exp PLE layer on the host (docs/math.md#hash, #state-per-sequence).

For a sequence with id carry `carry` (the last `ngram_size - 1` ids seen, EOS-initialised) and new ids `x[0..T)`:
`rows = hash(carry ++ x)[-T:]` and the new carry is the last `ngram_size - 1` ids of `carry ++ x`. Because the hash
of a position reads at most `ngram_size - 1` predecessors, prefill, chunked prefill and decode give the same rows.

EOS-segment rule (HF `_shift_right_ignore_eos`): a shift never crosses an EOS. The id `s` positions back from
position p is replaced by EOS when an EOS lies at p-s .. p-1. So the token right after an EOS hashes as
(EOS, EOS, tok), and the EOS itself still sees its predecessors. With `ngram_size - 1` carried ids the rule stays
exact across steps, since no shift reaches further back than the carry.

Arithmetic is int64: multipliers are odd and below `half_bound(V)`, so `id * m < 2^63` for ids in [0, V); the XOR
of non-negatives stays non-negative and plain `%` is unambiguous. That is why ids outside [0, V) are refused: they
would overflow silently and hash to rows no other implementation agrees on.

The constants (multipliers, prime head sizes, offsets) come from `model/ngram.py`; nothing is re-derived here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.ngram import NgramTable

IdArray = np.ndarray  # int64


def as_ids(x: object, name: str) -> np.ndarray:
    """Any integer array-like (list, numpy, CPU torch tensor) -> int64 numpy, refusing floats and bools."""
    if hasattr(x, "detach"):  # torch tensor: no torch import needed for the check
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.size and (a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer)):
        raise TypeError(f"{name} must hold integers, got dtype {a.dtype}")
    return a.astype(np.int64, copy=False)


@dataclass(frozen=True)
class NgramHasher:
    """Hashes token ids of one PLE layer into global rows of its table.

    `heads = (ngram_size - 1) * heads_per_ngram`, head-major: order-2 heads first, then order 3, ... (HF layout).
    """

    table: NgramTable
    ngram_size: int
    heads_per_ngram: int
    vocab_size: int
    eos: int
    # int64 views of the constants, built once (not part of equality or repr)
    _mult: np.ndarray = field(init=False, repr=False, compare=False)
    _sizes: np.ndarray = field(init=False, repr=False, compare=False)
    _offsets: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        heads = (self.ngram_size - 1) * self.heads_per_ngram
        if len(self.table.multipliers) != self.ngram_size or len(self.table.head_sizes) != heads:
            raise ValueError(f"NgramTable has {len(self.table.multipliers)} multipliers and "
                             f"{len(self.table.head_sizes)} heads; ngram_size {self.ngram_size} needs "
                             f"{self.ngram_size} and {heads}")
        if not 0 <= self.eos < self.vocab_size:
            raise ValueError(f"eos {self.eos} outside the vocabulary [0, {self.vocab_size})")
        for name, vals in (("_mult", self.table.multipliers), ("_sizes", self.table.head_sizes),
                           ("_offsets", self.table.head_offsets)):
            arr = np.array(vals, dtype=np.int64)
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)

    @staticmethod
    def for_layer(cfg: GdnConfig, layer_idx: int) -> "NgramHasher":
        if not cfg.has_ple(layer_idx):
            raise ValueError(f"layer {layer_idx} of {cfg.name} has no PLE (ple_layer_ids {cfg.ple_layer_ids}, "
                             f"one-indexed)")
        return NgramHasher(NgramTable.for_layer(cfg, layer_idx), cfg.ngram_size, cfg.heads_per_ngram,
                           cfg.vocab_size, cfg.eos_token_id)

    @property
    def heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def context(self) -> int:
        """Ids carried between steps: ngram_size - 1."""
        return self.ngram_size - 1

    def initial_carry(self, n: int = 1) -> IdArray:
        """Fresh id carries [n, context], all EOS (HF initialises the id context with EOS)."""
        return np.full((n, self.context), self.eos, dtype=np.int64)

    def hash_sequence(self, ids: object, carry: object = None) -> tuple[IdArray, IdArray]:
        """One sequence: ids [T], carry [context] or None (fresh) -> (rows [T, heads], new carry [context])."""
        ids = as_ids(ids, "ids")
        if ids.ndim != 1:
            raise ValueError(f"ids must be 1-D [T], got shape {ids.shape}")
        carries = self.initial_carry() if carry is None else as_ids(carry, "carry").reshape(1, -1)
        rows, new = self.hash_packed(ids, np.array([0, ids.size]), carries)
        return rows, new[0]

    def hash_packed(self, ids: object, cu_seqlens: object, carries: object) -> tuple[IdArray, IdArray]:
        """Many sequences packed back to back (the layout of `plugins/packing.py`).

        ids [T] int, cu_seqlens [N+1] (0 = cu[0] <= ... <= cu[N] = T; empty sequences allowed), carries [N, context].
        Returns (rows [T, heads] int64 global rows, new carries [N, context]); the inputs are not modified.
        """
        ids, cu, carries = self._check(ids, cu_seqlens, carries)
        return self.hash_checked(ids, cu, carries, ids.size == carries.shape[0] and bool((np.diff(cu) == 1).all()))

    def hash_checked(self, ids: IdArray, cu: IdArray, carries: IdArray, one_each: bool) -> tuple[IdArray, IdArray]:
        """`hash_packed` for inputs the caller checked (int64 arrays, ids in the vocabulary, cu rising from 0 to T,
        carries [N, context] of the vocabulary: the session checks them once per step); `one_each`: every sequence
        brings exactly one id (a decode step), whose history is its carry alone."""
        n, c = carries.shape
        if one_each and c:
            # a decode step (one id per sequence, its history is its carry): the same shifts without packing
            shifts = [carries[:, c - s] for s in range(1, self.ngram_size)]
            new_carries = np.concatenate([carries[:, 1:], ids[:, None]], axis=1)
        else:
            lens = np.diff(cu)
            # per-sequence history = carry ++ ids, packed: sequence k occupies [cu[k] + c*k, cu[k+1] + c*(k+1))
            seq_of_token = np.repeat(np.arange(n), lens)
            tok_pos = np.arange(ids.size) + c * (seq_of_token + 1)
            hist = np.empty(ids.size + n * c, dtype=np.int64)
            hist[tok_pos] = ids
            carry_pos = (cu[:-1] + c * np.arange(n))[:, None] + np.arange(c)[None, :]
            hist[carry_pos] = carries
            shifts = [hist[tok_pos - s] for s in range(1, self.ngram_size)]
            # new carry = the last c ids of each history (the old carry itself when the sequence brought no ids)
            ends = cu[1:] + c * np.arange(1, n + 1)
            new_carries = hist[ends[:, None] - c + np.arange(c)[None, :]]
        # shifted[s] = id s positions back, EOS once a shift would cross an EOS (s <= c keeps it in the history)
        shifted = [ids]
        cut = np.zeros(ids.size, dtype=bool)
        for raw in shifts:
            shifted.append(np.where(cut, self.eos, raw))
            cut |= raw == self.eos
        rows = np.empty((ids.size, self.heads), dtype=np.int64)
        mix = shifted[0] * self._mult[0]
        for order in range(2, self.ngram_size + 1):
            # one mix per n-gram order; its K heads differ only by their prime modulus
            mix = mix ^ (shifted[order - 1] * self._mult[order - 1])
            h = slice((order - 2) * self.heads_per_ngram, (order - 1) * self.heads_per_ngram)
            np.remainder(mix[:, None], self._sizes[None, h], out=rows[:, h])
        rows += self._offsets
        return rows, new_carries

    def _check(self, ids: object, cu_seqlens: object, carries: object) -> tuple[IdArray, IdArray, IdArray]:
        ids, cu, carries = as_ids(ids, "ids"), as_ids(cu_seqlens, "cu_seqlens"), as_ids(carries, "carries")
        if ids.ndim != 1:
            raise ValueError(f"ids must be 1-D [T], got shape {ids.shape}")
        if cu.ndim != 1 or cu.size < 1 or cu[0] != 0 or cu[-1] != ids.size or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T={ids.size}, got {cu.tolist()}")
        n = cu.size - 1
        if carries.shape != (n, self.context):
            raise ValueError(f"carries must be [N={n}, {self.context}], got shape {carries.shape}")
        for name, a in (("ids", ids), ("carries", carries)):
            bad = (a < 0) | (a >= self.vocab_size)
            if bad.any():
                raise ValueError(f"{name} hold {a[bad][:4].tolist()} outside the vocabulary [0, {self.vocab_size})")
        return ids, cu, carries
