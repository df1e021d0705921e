"""ONNX emission of the gated delta rule ops: the `gdn_trt` node (translation for the dynamo exporter) and the
model-local function whose body computes the op with standard ONNX ops.

The body is the token recurrence of `naive.recurrent` for all three ops, the chunked one included: the WY form is
an evaluation order of the same math, and the body is a reference (ONNX Runtime on CPU, TensorRT without the
plugin), not a fast path. Arithmetic in fp32, as in the kernels; o is cast back to the dtype of v.

    outer Loop over sequences n:   S = pool[slot]
        inner Loop over its tokens:  S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o[t] = S^T q
                                     (stash[t] = S | capture state when t+1 == capture_at[n])
        pool[slot] = S  (recurrent, chunked);  capture[n] = captured state (chunked, capture_at[n] >= 0)
"""

from __future__ import annotations

from typing import Callable

import onnx

from ..onnx_common import Body, Sequence, for_each_sequence, function_proto, loop, translation
from ..spec import GDN_CHUNKED, GDN_RECURRENT, GDN_RECURRENT_STASH, OpSpec
from .naive import L2_EPS

SPECS = (GDN_RECURRENT, GDN_RECURRENT_STASH, GDN_CHUNKED)


def _prepare(b: Body) -> tuple[str, ...]:
    """q, k L2-normalised (q also scaled by K^-1/2) and expanded to value heads [T, HV, K]; v [T, HV, V];
    decay exp(g) and beta [T, HV]; all fp32."""
    q, k, v, a, beta_logit, A_log, dt_bias = (b.cast(n) for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias"))
    eps, last = b.const(L2_EPS, "float32"), b.const([-1])

    def l2(x: str) -> str:
        ss = b.op("ReduceSum", b.op("Mul", x, x), last, keepdims=1)
        return b.op("Div", x, b.op("Sqrt", b.op("Add", ss, eps)))

    T, H, K, HV = b.dim("q", 0), b.dim("q", 1), b.dim("q", 2), b.dim("v", 1)
    scale = b.op("Reciprocal", b.op("Sqrt", b.cast(K)))
    grouped = b.op("Concat", T, H, b.op("Div", HV, H), K, axis=0)  # value head j reads key head j // G
    flat = b.op("Concat", T, HV, K, axis=0)

    def expand(x: str) -> str:
        return b.op("Reshape", b.op("Expand", b.unsq(x, 2), grouped), flat)

    g = b.op("Mul", b.op("Neg", b.op("Exp", A_log)), b.op("Softplus", b.op("Add", a, dt_bias)))
    return expand(b.op("Mul", l2(q), scale)), expand(l2(k)), v, b.op("Exp", g), b.op("Sigmoid", beta_logit)


def _token_loop(b: Body, spec: OpSpec, seq: Sequence, prep: tuple[str, ...], carried: list[str]) -> list[str]:
    """The recurrence over one sequence's tokens. carried = [S [HV, K, V] fp32, o [T, HV, V], extra] where extra
    is the stash (stash op), the captured state (chunked op) or absent; returns their final values."""
    q, k, v, decay, beta = prep
    tb = b.sub()
    i, cond = f"tok_{next(tb._count)}", f"cond_{next(tb._count)}"
    ins = [f"t{j}_{next(tb._count)}" for j in range(len(carried))]
    S, o = ins[0], ins[1]
    t = tb.op("Add", seq.start, i)
    qt, kt, vt, dt, bt = (tb.item(x, t) for x in (q, k, v, decay, beta))
    S = tb.op("Mul", S, tb.unsq(dt, 1, 2))
    kS = tb.op("Squeeze", tb.op("MatMul", tb.unsq(kt, 1), S), tb.const([1]))  # S^T k, [HV, V]
    delta = tb.op("Mul", tb.unsq(bt, 1), tb.op("Sub", vt, kS))
    S = tb.op("Add", S, tb.op("Mul", tb.unsq(kt, 2), tb.unsq(delta, 1)))
    ot = tb.op("Squeeze", tb.op("MatMul", tb.unsq(qt, 1), S), tb.const([1]))
    new = [S, tb.set_row(o, t, ot)]
    if spec is GDN_RECURRENT_STASH:
        new.append(tb.set_row(ins[2], t, S))
    elif spec is GDN_CHUNKED:
        hit = tb.op("Equal", tb.op("Add", i, tb.const(1)), seq.at)
        new.append(tb.op("Where", hit, S, ins[2]))
    outs = [tb.op("Identity", cond)] + [tb.op("Identity", x) for x in new]
    return loop(b, seq.trip, tb.graph(f"{spec.name}_tokens", [i, cond, *ins], outs), carried)


def body(spec: OpSpec) -> list[onnx.NodeProto]:
    b = Body()
    prep = _prepare(b)
    o0 = b.op("ConstantOfShape", b.op("Shape", prep[2]))
    buffers = {GDN_RECURRENT: ["ssm_pool"], GDN_RECURRENT_STASH: ["ssm_stash"],
               GDN_CHUNKED: ["ssm_pool", "ssm_capture"]}[spec]

    def step(nb: Body, seq: Sequence, carried: list[str]) -> list[str]:
        o, bufs = carried[0], dict(zip(buffers, carried[1:]))
        pool = bufs.get("ssm_pool", "ssm_pool")  # the stash op only reads the pool
        S0 = nb.cast(nb.item(pool, seq.slot))
        if spec is GDN_RECURRENT:
            S, o = _token_loop(nb, spec, seq, prep, [S0, o])
            return [o, nb.set_row(pool, seq.slot, S)]
        if spec is GDN_RECURRENT_STASH:
            _, o, stash = _token_loop(nb, spec, seq, prep, [S0, o, bufs["ssm_stash"]])
            return [o, stash]
        S, o, captured = _token_loop(nb, spec, seq, prep, [S0, o, S0])
        cap = bufs["ssm_capture"]
        row = nb.op("Where", seq.capture, nb.op("CastLike", captured, cap), nb.item(cap, seq.n))
        return [o, nb.set_row(pool, seq.slot, S), nb.set_row(cap, seq.n, row)]

    final = for_each_sequence(b, spec, [o0, *buffers], step)
    b.nodes.append(onnx.helper.make_node("CastLike", [final[0], "v"], [spec.outputs[0]]))
    for name, value in zip(spec.outputs[1:], final[1:]):
        b.nodes.append(onnx.helper.make_node("Identity", [value], [name]))
    return b.nodes


def functions() -> list[onnx.FunctionProto]:
    return [function_proto(s, body(s)) for s in SPECS]


def translations() -> dict[object, Callable]:
    from .. import library
    return {library.op(s, inplace=False): translation(s) for s in SPECS}
