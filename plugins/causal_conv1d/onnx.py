"""ONNX emission of the causal conv ops: the `gdn_trt` node (translation for the dynamo exporter) and the
model-local function whose body computes the op with standard ONNX ops.

Per sequence the body needs no token loop: with L = (W-1)*dilation history columns,
    buf = [conv_pool[slot] | x[seq]^T]            [D, L + len]
    y[i] = act( sum_j weight[:, j] * buf[:, i + j*dilation] )       (a Gather of [len, W] tap columns)
    window after token i = buf[:, i+1 : i+1+L]    (pool: i = len-1, stash: every i, capture: i = at-1)
Arithmetic in fp32; y is cast back to the dtype of x and the windows to the buffers' dtype.
"""

from __future__ import annotations

from typing import Callable

import onnx

from ..onnx_common import Body, Sequence, for_each_sequence, function_proto, translation
from ..spec import CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, Activation, OpSpec

SPECS = (CONV_UPDATE, CONV_UPDATE_STASH, CONV_PREFILL)


class _Conv:
    """Values computed once, outside the loop over sequences."""

    def __init__(self, b: Body):
        self.x, self.w = b.cast("x"), b.cast("weight")
        dilation = b.attr_int("dilation")
        self.silu = b.op("Equal", b.attr_int("activation"), b.const(Activation.SILU))
        width = b.scalar(b.dim("weight", 1))
        self.taps = b.op("Mul", b.op("Range", b.const(0), width, b.const(1)), dilation)  # [W]
        self.hist_len = b.scalar(b.dim("conv_pool", 2))  # L
        self.hist_cols = b.op("Range", b.const(0), self.hist_len, b.const(1))  # [L]


def _window(b: Body, buf: str, c: str, cv: _Conv) -> str:
    """buf[:, c : c+L], the history after c tokens, [D, L]."""
    lo = b.unsq(c, 0)
    return b.op("Slice", buf, lo, b.op("Add", lo, b.unsq(cv.hist_len, 0)), b.const([1]))


def _step(b: Body, spec: OpSpec, seq: Sequence, cv: _Conv, carried: list[str]) -> list[str]:
    y, bufs = carried[0], carried[1:]
    pool = bufs[0] if spec is not CONV_UPDATE_STASH else "conv_pool"  # the stash op only reads the pool
    hist = b.cast(b.item(pool, seq.slot))  # [D, L]
    end = b.op("Add", seq.start, seq.trip)
    xs = b.op("Slice", cv.x, b.unsq(seq.start, 0), b.unsq(end, 0), b.const([0]))  # [len, D]
    buf = b.op("Concat", hist, b.op("Transpose", xs, perm=[1, 0]), axis=1)  # [D, L + len]
    i = b.op("Range", b.const(0), seq.trip, b.const(1))  # [len]
    taps = b.op("Gather", buf, b.op("Add", b.unsq(i, 1), b.unsq(cv.taps, 0)), axis=1)  # [D, len, W]
    acc = b.op("ReduceSum", b.op("Mul", taps, b.unsq(cv.w, 1)), b.const([2]), keepdims=0)
    acc = b.op("Transpose", acc, perm=[1, 0])  # [len, D]
    acc = b.op("Where", cv.silu, b.op("Mul", acc, b.op("Sigmoid", acc)), acc)
    rows = b.unsq(b.op("Add", i, seq.start), 1)  # [len, 1]
    new = [b.op("ScatterND", y, rows, acc)]
    if spec is CONV_UPDATE_STASH:
        cols = b.op("Add", b.unsq(b.op("Add", i, b.const(1)), 1), b.unsq(cv.hist_cols, 0))  # [len, L]
        wins = b.op("Transpose", b.op("Gather", buf, cols, axis=1), perm=[1, 0, 2])  # [len, D, L]
        return new + [b.op("ScatterND", bufs[0], rows, b.op("CastLike", wins, bufs[0]))]
    new.append(b.set_row(pool, seq.slot, _window(b, buf, seq.trip, cv)))
    if spec is CONV_PREFILL:
        cap = bufs[1]
        # a sequence that writes no snapshot (padding, or capture_at -1) reads a window that surely exists
        snap = _window(b, buf, b.op("Where", seq.capture, seq.at, b.const(0)), cv)
        row = b.op("Where", seq.capture, b.op("CastLike", snap, cap), b.item(cap, seq.n))
        new.append(b.set_row(cap, seq.n, row))
    return new


def body(spec: OpSpec) -> list[onnx.NodeProto]:
    b = Body()
    cv = _Conv(b)
    y0 = b.op("ConstantOfShape", b.op("Shape", cv.x))
    buffers = {CONV_UPDATE: ["conv_pool"], CONV_UPDATE_STASH: ["conv_stash"],
               CONV_PREFILL: ["conv_pool", "conv_capture"]}[spec]
    final = for_each_sequence(b, spec, [y0, *buffers], lambda nb, seq, c: _step(nb, spec, seq, cv, c))
    b.nodes.append(onnx.helper.make_node("CastLike", [final[0], "x"], [spec.outputs[0]]))
    for name, value in zip(spec.outputs[1:], final[1:]):
        b.nodes.append(onnx.helper.make_node("Identity", [value], [name]))
    return b.nodes


def functions() -> list[onnx.FunctionProto]:
    return [function_proto(s, body(s)) for s in SPECS]


def translations() -> dict[object, Callable]:
    from .. import library
    return {library.op(s, inplace=False): translation(s) for s in SPECS}

