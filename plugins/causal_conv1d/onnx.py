"""ONNX emission of the causal conv ops: the `gdn_trt` node (translation for the dynamo exporter) and the
model-local function whose body computes the op with standard ONNX ops.

No loop: with L = (W-1)*dilation history rows (conv_pool [S, L, D], oldest first), the input `back` tokens before
token t of sequence n is x[t - back] while that stays inside n, else row L - (back - pos) of conv_pool[slot n]; so
every tap of every token is one Gather from x and one GatherElements from the slot rows, selected by
`pos >= back`:
    y[t] = act( sum_j weight[:, j] * input(t, back = (W-1-j)*dilation) )
    window after t = [input(t, back = L-1), ..., input(t, back = 0)]         ([L, D], oldest first)
stash[t] = window after t; pool[slot n] = window after n's last token (rows gathered per slot, so no scatter with
repeated indices); capture[n] = window after capture_at[n] tokens (the slot row itself at 0). Arithmetic in fp32;
y is cast back to the dtype of x, the windows to the buffers' dtype.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto

from ..onnx_common import Body, PackingVectors, bcast, function_proto, translation
from ..spec import (CONV_PREFILL, CONV_PREFILL_CHUNK, CONV_PREFILL_STATE, CONV_UPDATE, CONV_UPDATE_STASH, Activation,
                    OpSpec)

SPECS = (CONV_UPDATE, CONV_UPDATE_STASH, CONV_PREFILL)
PASS_SPECS = (CONV_PREFILL_CHUNK, CONV_PREFILL_STATE)  # the prefill's AOT passes (spec.AOT_CHAINS)


def _inputs_before(b: Body, pk: PackingVectors, x: str, hist: str, back: str) -> str:
    """input(t, back) for every token t and offset in `back` [K] (hist: each token's slot rows [T, L, D]):
    [T, K, D]."""
    rel = b.op("Sub", b.unsq(pk.pos, 1), b.unsq(back, 0))  # position inside the sequence, [T, K]
    from_x = b.op("Gather", x, b.op("Max", b.op("Add", b.unsq(b.op("Sub", pk.t, pk.pos), 1), rel), b.const(0)),
                  axis=0)  # [T, K, D]
    L = b.dim(hist, 1)
    row = b.op("Min", b.op("Max", b.op("Add", rel, L), b.const(0)), b.op("Sub", L, b.const(1)))  # [T, K]
    shape = b.op("Concat", b.dim(hist, 0), b.dim(back, 0), b.dim(hist, 2), axis=0)
    from_h = b.op("GatherElements", hist, b.op("Expand", b.unsq(row, 2), shape), axis=1)  # [T, K, D]
    inside = b.unsq(b.op("GreaterOrEqual", rel, b.const(0)), 2)
    return b.op("Where", inside, from_x, from_h)


def body(spec: OpSpec) -> list[onnx.NodeProto]:
    b = Body()
    pk = PackingVectors(b, "x", spec)
    x, w = b.cast("x"), b.cast("weight")
    dilation, one = b.attr_int("dilation"), b.const(1)
    W, L = b.scalar(b.dim("weight", 1)), b.scalar(b.dim("conv_pool", 1))
    hist = b.cast(b.op("Gather", "conv_pool", pk.slot, axis=0))  # each token's slot rows, [T, L, D]
    taps = b.op("Mul", b.op("Sub", b.op("Sub", W, one), b.op("Range", b.const(0), W, one)), dilation)  # [W]
    vals = _inputs_before(b, pk, x, hist, taps)  # [T, W, D]
    y = b.op("ReduceSum", b.op("Mul", vals, b.unsq(b.op("Transpose", w, perm=[1, 0]), 0)), b.const([1]),
             keepdims=0)  # [T, D]
    silu = b.op("Equal", b.attr_int("activation"), b.const(Activation.SILU))
    y = b.op("Where", silu, b.op("Mul", y, b.op("Sigmoid", y)), y)
    y = b.op("Where", b.unsq(pk.valid, 1), y, b.op("Sub", y, y))  # padding sequences: zero rows
    if spec is CONV_PREFILL_STATE:  # the first L tokens of each sequence here, the rest from the chunk pass
        y = b.op("Where", b.unsq(b.op("Less", pk.pos, L), 1), y, b.cast("y_part"))
    b.nodes.append(onnx.helper.make_node("CastLike", [y, "x"], [spec.outputs[0]]))
    back = b.op("Sub", b.op("Sub", L, one), b.op("Range", b.const(0), L, one))  # L-1 .. 0
    win = _inputs_before(b, pk, x, hist, back)  # window after t, [T, L, D]
    if spec is CONV_UPDATE_STASH:
        stash = b.op("Where", bcast(b, pk.valid, 3), b.op("CastLike", win, "conv_stash"), "conv_stash")
        b.nodes.append(onnx.helper.make_node("Identity", [stash], [spec.outputs[1]]))
        return b.nodes
    last = b.op("Gather", win, b.op("Max", b.op("Sub", b.op("Add", pk.start, pk.length), one), b.const(0)),
                axis=0)  # window after each sequence's last token, [N, L, D]
    writes = b.op("And", pk.valid_n, b.op("Greater", pk.length, b.const(0)))
    b.nodes.append(onnx.helper.make_node("Identity", [_rows_by_slot(b, pk, last, writes)], [spec.outputs[1]]))
    if spec in (CONV_PREFILL, CONV_PREFILL_STATE):
        at = b.op("Max", pk.at_n, b.const(0))
        after = b.op("Gather", win, b.op("Max", b.op("Sub", b.op("Add", pk.start, at), one), b.const(0)), axis=0)
        before = b.cast(b.op("Gather", "conv_pool", pk.slot_n, axis=0))
        snap = b.op("Where", bcast(b, b.op("Equal", at, b.const(0)), 3), before, after)  # [N, L, D]
        cap = b.op("Where", bcast(b, pk.snapshot_n(b), 3), b.op("CastLike", snap, "conv_capture"), "conv_capture")
        b.nodes.append(onnx.helper.make_node("Identity", [cap], [spec.outputs[2]]))
    return b.nodes


def chunk_body() -> list[onnx.NodeProto]:
    """`causal_conv1d_prefill_chunk`: y of the tokens whose W taps all lie in x (position >= L = (W-1) dilation in
    their sequence), zero elsewhere (rows the kernel leaves to the state pass)."""
    b = Body()
    pk = PackingVectors(b, "x", CONV_PREFILL_CHUNK)
    x, w, one = b.cast("x"), b.cast("weight"), b.const(1)
    dilation, W = b.attr_int("dilation"), b.scalar(b.dim("weight", 1))
    taps = b.op("Mul", b.op("Sub", b.op("Sub", W, one), b.op("Range", b.const(0), W, one)), dilation)  # [W]
    src = b.op("Max", b.op("Sub", b.unsq(pk.t, 1), b.unsq(taps, 0)), b.const(0))  # [T, W]
    y = b.op("ReduceSum", b.op("Mul", b.op("Gather", x, src, axis=0), b.unsq(b.op("Transpose", w, perm=[1, 0]), 0)),
             b.const([1]), keepdims=0)
    silu = b.op("Equal", b.attr_int("activation"), b.const(Activation.SILU))
    y = b.op("Where", silu, b.op("Mul", y, b.op("Sigmoid", y)), y)
    inside = b.op("And", pk.valid, b.op("GreaterOrEqual", pk.pos, b.op("Mul", b.op("Sub", W, one), dilation)))
    y = b.op("Where", b.unsq(inside, 1), y, b.const(0.0, "float32"))
    b.nodes.append(onnx.helper.make_node("CastLike", [y, "x"], ["y_part"]))
    return b.nodes


def pass_functions() -> list[onnx.FunctionProto]:
    return [function_proto(CONV_PREFILL_CHUNK, chunk_body()),
            function_proto(CONV_PREFILL_STATE, body(CONV_PREFILL_STATE))]


def _rows_by_slot(b: Body, pk: PackingVectors, rows: str, writes: str) -> str:
    """conv_pool with row s replaced by rows[n] for the sequence n that writes slot s (at most one: slots are
    distinct); a gather per slot instead of a scatter, which would be undefined for the repeated slot 0 of padding."""
    s = b.op("Range", b.const(0), b.scalar(b.dim("conv_pool", 0)), b.const(1))
    match = b.op("And", b.op("Equal", b.unsq(s, 1), b.unsq(pk.slot_n, 0)), b.unsq(writes, 0))  # [S, N]
    m = b.cast(match, TensorProto.INT32)
    has = b.op("Greater", b.op("ReduceMax", m, b.const([1]), keepdims=0), b.const(0, np.int32))
    picked = b.op("Gather", rows, b.op("ArgMax", m, axis=1, keepdims=0), axis=0)  # [S, L, D]
    return b.op("Where", bcast(b, has, 3), b.op("CastLike", picked, "conv_pool"), "conv_pool")


def functions() -> list[onnx.FunctionProto]:
    return [function_proto(s, body(s)) for s in SPECS]


def translations() -> dict[object, Callable]:
    from .. import library
    return {library.op(s, inplace=False): translation(s) for s in SPECS}

