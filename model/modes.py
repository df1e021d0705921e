"""The layer modes and the one table of what each mode is (`MODES`), as `plugins/spec.py` is for the ops.

A `LayerMode` names every graph, engine file, comparison and test id. Its `ModeSpec` holds every fact about it: the
step kind it serves, its dims (tokens and sequences, fixed 1 or symbolic), the two ops its recurrent parts call, the
state buffers it writes, how its optimization profiles are split, and whether a step in it may be captured in a CUDA
graph. The layer (`model/layer.py`), the GraphSpec (`export/spec.py`), the exporter, the engine selector and the
engines read this table; `docs/architecture.md` prints it (`markdown()`, checked by `tests/test_mode_table.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gdn_trt.plugins.spec import (CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, GDN_CHUNKED, GDN_RECURRENT,
                                  GDN_RECURRENT_STASH, OpSpec)

SEQS, TOKENS = "N", "T"  # the symbolic dims of a step (the GraphSpec adds S, the pool slots)


class LayerMode(str, enum.Enum):
    DECODE = "decode"
    DECODE_MULTI_SEQ = "decode_multi_seq"
    DECODE_BATCHED = "decode_batched"
    VERIFY_MULTI = "verify_multi"
    PREFILL = "prefill"
    PREFILL_VARLEN = "prefill_varlen"

    @property
    def spec(self) -> "ModeSpec":
        return MODES[self]

    def refuse(self, seqs: int, tokens: int) -> str | None:
        """The shape rules of the mode: None when a step of `seqs` sequences and `tokens` tokens fits its dims, else
        the reason. The layer raises it, the engines return it to the selector."""
        m = self.spec
        if m.single_sequence and seqs != 1:
            return f"{self.value} takes one sequence, the step has {seqs}"
        if m.one_token_per_sequence and tokens != seqs:
            return f"{self.value} takes one token per sequence ({tokens} tokens, {seqs} sequences)"
        return None


class StepKind(str, enum.Enum):
    """What a sequence does in a runtime step; each kind is served by the modes whose `ModeSpec.kind` it is."""

    PREFILL = "prefill"
    DECODE = "decode"
    VERIFY = "verify"


class Writes(str, enum.Enum):
    """The state buffers a mode writes (every mode reads the pools of its sequences' slots)."""

    POOLS = "pools"  # the pool rows, in place
    STASH = "stash"  # the state after every token to stash row t; the pools are only read (accept commits)
    POOLS_CAPTURE = "pools+capture"  # the pool rows, and the state after capture_at[n] tokens to capture row n


class Split(str, enum.Enum):
    """How the mode's optimization profiles (GraphSpec buckets) split its dims."""

    NONE = "one profile"
    SEQS = "N at seq_buckets"
    TOKENS = "T at token_buckets"


@dataclass(frozen=True)
class ModeSpec:
    """One mode. `tokens` / `seqs`: the step's token and sequence dims (1, or the symbols T / N: a mode whose tokens
    are N takes one token per sequence). `token_limit`: the `Limits` field bounding T when it is free (`max_draft`:
    per sequence; `max_tokens`: the whole step). `capture_veto`: why a step cannot be captured in a CUDA graph
    (None = it can: the kernels read the step's offsets and slots from the device, so a captured step of the same
    sequences and token rows replays for any lengths; a verify step's draft counts vary, so the runtime pads it to a
    fixed shape, `runtime/select.py`'s `GraphPolicy`)."""

    kind: StepKind
    tokens: int | str
    seqs: int | str
    gdn: OpSpec
    conv: OpSpec
    writes: Writes
    split: Split
    token_limit: str | None
    capture_veto: str | None

    @property
    def single_sequence(self) -> bool:
        return self.seqs == 1

    @property
    def one_token_per_sequence(self) -> bool:
        return self.tokens == self.seqs


_PROMPTS = "prefill token counts change every step: no static shape to capture"

MODES: dict[LayerMode, ModeSpec] = {
    LayerMode.DECODE: ModeSpec(StepKind.DECODE, 1, 1, GDN_RECURRENT, CONV_UPDATE, Writes.POOLS, Split.NONE,
                               None, None),
    LayerMode.DECODE_MULTI_SEQ: ModeSpec(StepKind.DECODE, SEQS, SEQS, GDN_RECURRENT, CONV_UPDATE, Writes.POOLS,
                                         Split.SEQS, None, None),
    LayerMode.DECODE_BATCHED: ModeSpec(StepKind.VERIFY, TOKENS, 1, GDN_RECURRENT_STASH, CONV_UPDATE_STASH,
                                       Writes.STASH, Split.NONE, "max_draft", None),
    LayerMode.VERIFY_MULTI: ModeSpec(StepKind.VERIFY, TOKENS, SEQS, GDN_RECURRENT_STASH, CONV_UPDATE_STASH,
                                     Writes.STASH, Split.SEQS, "max_draft", None),
    LayerMode.PREFILL: ModeSpec(StepKind.PREFILL, TOKENS, 1, GDN_CHUNKED, CONV_PREFILL, Writes.POOLS_CAPTURE,
                                Split.TOKENS, "max_tokens", _PROMPTS),
    LayerMode.PREFILL_VARLEN: ModeSpec(StepKind.PREFILL, TOKENS, SEQS, GDN_CHUNKED, CONV_PREFILL,
                                       Writes.POOLS_CAPTURE, Split.SEQS, "max_tokens", _PROMPTS),
}


def candidates(kind: StepKind, single: bool) -> tuple[LayerMode, ...]:
    """The modes that can serve a step group of `kind`, best first: the single-sequence mode (when the group has one
    sequence) before the multi-sequence one."""
    return tuple(m for m in LayerMode if m.spec.kind is kind and (single or not m.spec.single_sequence))


def markdown() -> str:
    """The table as `docs/architecture.md` prints it."""
    rows = ["| mode | step kind | tokens × seqs | GDN op | conv op | writes | profiles | CUDA graph |",
            "|---|---|---|---|---|---|---|---|"]
    for mode, m in MODES.items():
        tokens = f"{m.tokens} (≤ {m.token_limit}{' per sequence' if m.token_limit == 'max_draft' else ''})" \
            if m.token_limit else str(m.tokens)
        graph = "captured" if m.capture_veto is None else f"eager: {m.capture_veto}"
        if m.kind is StepKind.VERIFY:  # the draft counts vary: a fixed shape needs padding (runtime/select.py)
            graph += " when padded to a bucket of max_draft token rows a sequence"
        rows.append(f"| `{mode.value}` | {m.kind.value} | {tokens} × {m.seqs} | `{m.gdn.name}` | `{m.conv.name}` | "
                    f"{m.writes.value} | {m.split.value} | {graph} |")
    return "\n".join(rows)
