"""PLE (Qwen4-Exp hashed n-gram memory), host side: id hashing, the memory-mapped row store, the per-step prestage,
and a session's feeds over them (`feeds`: one prestage per PLE layer, the rows of each step group).

The math is in docs/math.md#qwen4-exp-ple-hashed-n-gram-memory. The device side (the PLE sublayer consuming
`ple_rows [T, heads, d_h]`) is in `model/layer.py`.
"""

from .hashing import NgramHasher
from .prestage import Prestage, PrestageCounters
from .store import RowStore, StoreCounters

__all__ = ["NgramHasher", "Prestage", "PrestageCounters", "RowStore", "StoreCounters"]
