"""The one `LayerMode` enum: it names every graph, engine file, comparison and test id (DESIGN §3)."""

from __future__ import annotations

import enum


class LayerMode(str, enum.Enum):
    DECODE = "decode"
    DECODE_MULTI_SEQ = "decode_multi_seq"
    DECODE_BATCHED = "decode_batched"
    VERIFY_MULTI = "verify_multi"
    PREFILL = "prefill"
    PREFILL_VARLEN = "prefill_varlen"

    @property
    def chunked(self) -> bool:
        """Chunked WY algorithm (prefill) rather than the token recurrence."""
        return self in (LayerMode.PREFILL, LayerMode.PREFILL_VARLEN)

    @property
    def uses_stash(self) -> bool:
        """Writes the state after every token into stash buffers and leaves the pools untouched."""
        return self in (LayerMode.DECODE_BATCHED, LayerMode.VERIFY_MULTI)

    @property
    def uses_capture(self) -> bool:
        return self.chunked

    @property
    def single_sequence(self) -> bool:
        return self in (LayerMode.DECODE, LayerMode.DECODE_BATCHED, LayerMode.PREFILL)

    @property
    def one_token_per_sequence(self) -> bool:
        return self in (LayerMode.DECODE, LayerMode.DECODE_MULTI_SEQ)

    @property
    def updates_pools(self) -> bool:
        return not self.uses_stash
