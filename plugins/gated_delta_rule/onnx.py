"""ONNX emission of the gated delta rule ops: the `gdn_trt` node (translation for the dynamo exporter) and the
model-local function whose body computes the op with standard ONNX ops.

The body is the token recurrence of `naive.recurrent` for all three ops, the chunked one included: the WY form is
an evaluation order of the same math, and the body is a reference (ONNX Runtime on CPU, TensorRT without the
plugin), not a fast path. Arithmetic in fp32, as in the kernels; o is cast back to the dtype of v. One Loop runs
over the T packed tokens (trip count from a shape, no nested loops, nothing shaped by tensor values):

    token t of sequence n:  S = pool[slot] at n's first token, else the carried S
                            S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o[t] = S^T q  (0 for padding)
                            stash[t] = S | pool[slot] = S at n's last token | capture[n] = S after capture_at[n]
    capture_at[n] == 0 (the state before any token) is written before the loop, for empty sequences too.
"""

from __future__ import annotations

from typing import Callable

import onnx

from ..onnx_common import Body, PackingVectors, bcast, function_proto, loop, translation
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


def _token_loop(b: Body, spec: OpSpec, pk: PackingVectors, prep: tuple[str, ...], carried: list[str]) -> list[str]:
    """One Loop over all tokens. carried = [S [HV, K, V], o [T, HV, V], *buffers] (buffers: pool | stash |
    pool + capture); returns their final values."""
    q, k, v, decay, beta = prep
    tb = b.sub()
    t, cond = f"tok_{next(tb._count)}", f"cond_{next(tb._count)}"
    ins = [f"c{j}_{next(tb._count)}" for j in range(len(carried))]
    S, o, bufs = ins[0], ins[1], ins[2:]
    first = tb.op("Equal", tb.item(pk.pos, t), tb.const(0))
    slot, valid, n = tb.item(pk.slot, t), tb.item(pk.valid, t), tb.item(pk.seq, t)
    # a sequence reads its slot before anything writes it (slots are distinct; padding never writes)
    S = tb.op("Where", first, tb.cast(tb.item("ssm_pool", slot)), S)
    qt, kt, vt, dt, bt = (tb.item(x, t) for x in (q, k, v, decay, beta))
    S = tb.op("Mul", S, tb.unsq(dt, 1, 2))
    # S^T k and S^T q as broadcast products summed over K, [HV, V]: a batched MatMul on loop values fails
    # TensorRT-RTX's compiler (MyelinCheckException is_const), the reduction compiles
    kS = tb.op("ReduceSum", tb.op("Mul", tb.unsq(kt, 2), S), tb.const([1]), keepdims=0)
    delta = tb.op("Mul", tb.unsq(bt, 1), tb.op("Sub", vt, kS))
    S = tb.op("Add", S, tb.op("Mul", tb.unsq(kt, 2), tb.unsq(delta, 1)))
    ot = tb.op("ReduceSum", tb.op("Mul", tb.unsq(qt, 2), S), tb.const([1]), keepdims=0)
    new = [S, tb.set_row(o, t, tb.op("Where", valid, ot, tb.op("Sub", ot, ot)))]
    if spec is GDN_RECURRENT_STASH:
        stash = bufs[0]
        new.append(tb.set_row(stash, t, tb.op("Where", valid, tb.op("CastLike", S, stash), tb.item(stash, t))))
    else:
        pool = bufs[0]
        write = tb.op("And", valid, tb.item(pk.last, t))
        new.append(tb.set_row(pool, slot, tb.op("Where", write, tb.op("CastLike", S, pool), tb.item(pool, slot))))
    if spec is GDN_CHUNKED:
        cap = bufs[1]
        hit = tb.op("Equal", tb.op("Add", tb.item(pk.pos, t), tb.const(1)), tb.item(pk.at_n, n))
        hit = tb.op("And", valid, hit)
        new.append(tb.set_row(cap, n, tb.op("Where", hit, tb.op("CastLike", S, cap), tb.item(cap, n))))
    outs = [tb.op("Identity", cond)] + [tb.op("Identity", x) for x in new]
    trip = b.scalar(b.dim("q", 0))
    return loop(b, trip, tb.graph(f"{spec.name}_tokens", [t, cond, *ins], outs), carried)


def body(spec: OpSpec) -> list[onnx.NodeProto]:
    b = Body()
    prep = _prepare(b)
    pk = PackingVectors(b, "q", spec)
    o0 = b.op("ConstantOfShape", b.op("Shape", prep[2]))
    S0 = b.op("ConstantOfShape", b.op("Shape", "ssm_pool", start=1))  # overwritten at every first token
    if spec is GDN_RECURRENT_STASH:
        buffers = ["ssm_stash"]
    else:
        buffers = ["ssm_pool"] + ([_initial_captures(b, pk)] if spec is GDN_CHUNKED else [])
    final = _token_loop(b, spec, pk, prep, [S0, o0, *buffers])
    b.nodes.append(onnx.helper.make_node("CastLike", [final[1], "v"], [spec.outputs[0]]))
    for name, value in zip(spec.outputs[1:], final[2:]):
        b.nodes.append(onnx.helper.make_node("Identity", [value], [name]))
    return b.nodes


def _initial_captures(b: Body, pk: PackingVectors) -> str:
    """ssm_capture with row n = ssm_pool[slot n] where capture_at[n] == 0 (the state before the first token)."""
    at0 = b.op("And", pk.snapshot_n(b), b.op("Equal", pk.at_n, b.const(0)))
    rows = b.op("CastLike", b.op("Gather", "ssm_pool", pk.slot_n, axis=0), "ssm_capture")  # [N, HV, K, V]
    return b.op("Where", bcast(b, at0, 4), rows, "ssm_capture")


def functions() -> list[onnx.FunctionProto]:
    return [function_proto(s, body(s)) for s in SPECS]


def translations() -> dict[object, Callable]:
    from .. import library
    return {library.op(s, inplace=False): translation(s) for s in SPECS}
