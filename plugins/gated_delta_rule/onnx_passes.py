"""ONNX function bodies of the chunked GDN op's pass plugins (`spec.AOT_CHAINS`: solve, w/u, state, output).

Each body computes what its kernel computes (docs/math.md#chunked-form-prefill), on the same chunking: chunks of 64
tokens counted from each sequence's start, restarting at a capture point 0 < c < len, numbered globally in sequence
order over C = ceil(T / 64) + 2 N chunk slots (`triton_chunked.locate_chunk`). `Chunks` lays the tokens out as a
[C, 64] grid (token index and row mask per chunk slot) and gives each token its (chunk, row): a pass gathers its
operands onto the grid, computes per chunk with batched MatMuls in fp32, and gathers its token-major outputs back.

- solve: r_k = 1 / |k| [T, H]; gamma [T, HV] = chunk-local cumsum of g; t_inv [T, HV, 64]: row of (I + A)^-1 of each
  token, A = beta_i (k_i . k_j) r_k,i r_k,j exp(gamma_i - gamma_j) strictly lower, inverted by forward substitution
  (a Loop over the 64 rows, as the kernel's);
- w/u: w = T diag(beta exp(gamma) r_k) k, u = T diag(beta) v with T the lower triangle of t_inv;
- state: a Loop over the chunk slots carrying the fp32 state: h[c] = S at the chunk start (S read from the pool at a
  sequence's first chunk), v_new = u - w S, S <- exp(gamma_C) S + k^T (v_new r_k exp(gamma_C - gamma)); the final
  state to the pool, the state at the capture point to the capture buffer (capture_at = 0: the pool row);
- output: o = exp(gamma) r_q (q h[c]) + tril((q k^T) r_q r_k exp(gamma_i - gamma_j)) v_new, r_q = K^-1/2 / |q|.

Operands the kernels round to the activation dtype (h, v_new, the scaled rows of the dots) are rounded here too.
Rows the kernels leave unwritten (padding sequences, unused chunk slots) are zero here; no later pass reads them.
A reference, run by ONNX Runtime on the AOT-form graphs (and by TensorRT only without the plugins), not a fast path.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ..onnx_common import Body, PackingVectors, bcast, function_proto, loop
from ..spec import CHUNK_TOKENS, GDN_CHUNK_OUT, GDN_CHUNK_SOLVE, GDN_CHUNK_STATE, GDN_CHUNK_WU, OpSpec
from .naive import L2_EPS

SPECS = (GDN_CHUNK_SOLVE, GDN_CHUNK_WU, GDN_CHUNK_STATE, GDN_CHUNK_OUT)
BT = CHUNK_TOKENS
I64 = TensorProto.INT64


class Chunks:
    """The chunk slots of a step. Per slot c [C]: `seq`, `valid`, `live` (valid, slot >= 0), `j` (chunk within its
    sequence), `ntok`; grid [C, 64]: `tok` (token index clamped into [0, T)), `rv` (row holds a token). Per token
    [T]: `flat` = c * 64 + row (the token's grid position). `C` the slot count (int64 [1])."""

    def __init__(self, b: Body, tokens_of: str, spec: OpSpec):
        self.pk = pk = PackingVectors(b, tokens_of, spec)
        zero, one, bt = b.const(0), b.const(1), b.const(BT)
        cap = b.cast("capture_at", I64)
        self.cut = cut = b.op("Where", b.op("And", b.op("Greater", cap, zero), b.op("Less", cap, pk.length)), cap,
                              zero)
        self.nc1 = nc1 = b.op("Div", b.op("Add", cut, b.const(BT - 1)), bt)  # chunks before the cut
        self.cnt = cnt = b.op("Add", nc1, b.op("Div", b.op("Add", b.op("Sub", pk.length, cut), b.const(BT - 1)), bt))
        cend = b.op("CumSum", cnt, b.const(0))
        self.c0 = c0 = b.op("Sub", cend, cnt)  # first chunk slot of each sequence [N]
        T, N = b.dim(tokens_of, 0), b.dim("slots", 0)
        chunks = b.op("Div", b.op("Add", T, b.const([BT - 1])), b.const([BT]))
        self.C = b.op("Add", chunks, b.op("Mul", N, b.const([2])))
        c = b.op("Range", zero, b.scalar(self.C), one)  # [C]
        self.seq = b.op("ReduceSum", b.cast(b.op("LessOrEqual", b.unsq(cend, 0), b.unsq(c, 1)), I64), b.const([1]),
                        keepdims=0)
        self.valid = b.op("Less", self.seq, b.scalar(N))
        seq = b.op("Min", self.seq, b.op("Sub", b.scalar(N), one))
        self.j = j = b.op("Sub", c, b.item(c0, seq))
        s, cut_c, nc1_c = b.item(pk.start, seq), b.item(cut, seq), b.item(nc1, seq)
        first = b.op("Less", j, nc1_c)
        start = b.op("Where", first, b.op("Add", s, b.op("Mul", j, bt)),
                     b.op("Add", b.op("Add", s, cut_c), b.op("Mul", b.op("Sub", j, nc1_c), bt)))
        stop = b.op("Min", b.op("Add", start, bt), b.op("Where", first, b.op("Add", s, cut_c),
                                                         b.op("Add", s, b.item(pk.length, seq))))
        self.ntok = b.op("Where", self.valid, b.op("Max", b.op("Sub", stop, start), zero), zero)
        self.live = b.op("And", self.valid, b.item(pk.valid_n, seq))
        rows = b.op("Range", zero, bt, one)  # [64]
        tok = b.op("Add", b.unsq(start, 1), b.unsq(rows, 0))  # [C, 64]
        self.rv = b.op("Less", b.unsq(rows, 0), b.unsq(self.ntok, 1))
        self.tok = b.op("Min", b.op("Max", tok, zero), b.op("Sub", b.scalar(T), one))
        # each token's slot and row: before the cut, pos; after it, pos - cut, in chunks after the first nc1
        cut_t, nc1_t = b.item(cut, pk.seq), b.item(nc1, pk.seq)
        in_first = b.op("And", b.op("Greater", cut_t, zero), b.op("Less", pk.pos, cut_t))
        rel = b.op("Where", in_first, pk.pos, b.op("Sub", pk.pos, cut_t))
        jt = b.op("Add", b.op("Where", in_first, zero, nc1_t), b.op("Div", rel, bt))
        self.flat = b.op("Add", b.op("Mul", b.op("Add", b.item(c0, pk.seq), jt), bt), b.op("Mod", rel, bt))
        self.seq_cl = seq

    def grid(self, b: Body, x: str, rank: int) -> str:
        """x [T, HV] or [T, HV, D] (`rank` 2 or 3, fp32) on the grid, rows without a token zero: [C, HV, 64(, D)]."""
        g = b.op("Gather", x, self.tok, axis=0)  # [C, 64, HV(, D)]
        rank += 1
        g = b.op("Where", b.unsq(self.rv, 2, 3) if rank == 4 else b.unsq(self.rv, 2), g, b.const(0.0, "float32"))
        return b.op("Transpose", g, perm=[0, 2, 1, 3] if rank == 4 else [0, 2, 1])

    def tokens(self, b: Body, g: str, rank: int) -> str:
        """[C, HV, 64(, D)] -> [T, HV(, D)] at each token's slot and row."""
        t = b.op("Transpose", g, perm=[0, 2, 1, 3] if rank == 4 else [0, 2, 1])
        shape = b.op("Concat", b.const([-1]), b.op("Shape", t, start=2), axis=0)
        return b.op("Gather", b.op("Reshape", t, shape), self.flat, axis=0)


def heads(b: Body, x: str, hv_of: str) -> str:
    """x [T, H, ...] -> [T, HV, ...]: value head j reads key head j // G (HV from axis 1 of `hv_of`)."""
    H, HV = b.dim(x, 1), b.dim(hv_of, 1)
    grouped = b.op("Concat", b.dim(x, 0), H, b.op("Div", HV, H), b.op("Shape", x, start=2), axis=0)
    flat = b.op("Concat", b.dim(x, 0), HV, b.op("Shape", x, start=2), axis=0)
    return b.op("Reshape", b.op("Expand", b.unsq(x, 2), grouped), flat)


def _rdt(b: Body, x: str, like: str) -> str:
    """x rounded to the dtype of `like` and back to fp32 (what a kernel's `.to(DT)` does)."""
    return b.cast(b.op("CastLike", x, like))


def _inv_norm(b: Body, x: str) -> str:
    """1 / sqrt(sum x^2 + eps) over the last axis of x (fp32), keepdims=0."""
    ss = b.op("ReduceSum", b.op("Mul", x, x), b.const([-1]), keepdims=0)
    return b.op("Reciprocal", b.op("Sqrt", b.op("Add", ss, b.const(L2_EPS, "float32"))))


def solve_body() -> list[onnx.NodeProto]:
    b = Body()
    ch = Chunks(b, "k", GDN_CHUNK_SOLVE)
    k = b.cast("k")
    rk = _inv_norm(b, k)  # [T, H]
    b.nodes.append(onnx.helper.make_node("Identity", [rk], ["rk"]))
    g = b.op("Mul", b.op("Neg", b.op("Exp", b.cast("A_log"))),
             b.op("Softplus", b.op("Add", b.cast("a"), b.cast("dt_bias"))))  # [T, HV]
    gam_g = b.op("CumSum", ch.grid(b, g, 2), b.const(2))  # [C, HV, 64]
    gam = ch.tokens(b, gam_g, 3)
    b.nodes.append(onnx.helper.make_node("Identity", [gam], ["gam"]))
    kn = ch.grid(b, heads(b, b.op("Mul", k, b.unsq(rk, 2)), "v"), 3)  # [C, HV, 64, K]
    kk = b.op("MatMul", kn, b.op("Transpose", kn, perm=[0, 1, 3, 2]))  # [C, HV, 64, 64]
    beta = ch.grid(b, b.op("Sigmoid", b.cast("b")), 2)  # [C, HV, 64]
    lower = b.const(np.tril(np.ones((BT, BT), bool), -1), np.bool_)
    diff = b.op("Sub", b.unsq(gam_g, 3), b.unsq(gam_g, 2))
    A = b.op("Mul", b.op("Mul", b.unsq(beta, 3), kk), b.op("Exp", b.op("Where", lower, diff, b.const(0.0, "float32"))))
    A = b.op("Where", lower, A, b.const(0.0, "float32"))
    tinv = _forward_substitution(b, A)
    b.nodes.append(onnx.helper.make_node("CastLike", [ch.tokens(b, tinv, 4), "k"], ["t_inv"]))
    return b.nodes


def _forward_substitution(b: Body, A: str) -> str:
    """(I + A)^-1 of strictly lower triangular [..., 64, 64] blocks: row r = e_r - A[r, :] T (rows >= r of T still
    zero), a Loop over the 64 rows."""
    eye = b.const(np.eye(BT, dtype=np.float32), np.float32)
    rows = b.op("Range", b.const(0), b.const(BT), b.const(1))
    tb = b.sub()
    r, cond, T = f"row_{next(tb._count)}", f"cond_{next(tb._count)}", f"tinv_{next(tb._count)}"
    a_r = tb.op("Unsqueeze", tb.op("Gather", A, r, axis=-2), tb.const([-2]))  # [..., 1, 64]
    new = tb.op("Sub", tb.op("Gather", eye, tb.op("Reshape", r, tb.const([1])), axis=0), tb.op("MatMul", a_r, T))
    sel = tb.unsq(tb.op("Equal", rows, r), 1)  # [64, 1]
    outs = [tb.op("Identity", cond), tb.op("Where", sel, new, T)]
    zeros = b.op("ConstantOfShape", b.op("Shape", A))
    return loop(b, b.const(BT), tb.graph("forward_substitution", [r, cond, T], outs), [zeros])[0]


def wu_body() -> list[onnx.NodeProto]:
    b = Body()
    ch = Chunks(b, "k", GDN_CHUNK_WU)
    beta, gam = b.op("Sigmoid", b.cast("b")), b.cast("gam")  # [T, HV]
    rk = heads(b, b.cast("rk"), "v")  # [T, HV]
    tri = b.const(np.tril(np.ones((BT, BT), bool)), np.bool_)
    Tm = ch.grid(b, b.cast("t_inv"), 3)  # [C, HV, 64, 64]: row i of the chunk's T
    Tm = b.op("Where", tri, Tm, b.const(0.0, "float32"))
    sk = b.op("Mul", b.op("Mul", beta, b.op("Exp", gam)), rk)
    xk = ch.grid(b, b.op("Mul", heads(b, b.cast("k"), "v"), b.unsq(sk, 2)), 3)
    xv = ch.grid(b, b.op("Mul", b.cast("v"), b.unsq(beta, 2)), 3)
    for x, name in ((xk, "w"), (xv, "u")):
        y = b.op("MatMul", _rdt(b, Tm, "k"), _rdt(b, x, "k"))
        b.nodes.append(onnx.helper.make_node("CastLike", [ch.tokens(b, y, 4), "k"], [name]))
    return b.nodes


def state_body() -> list[onnx.NodeProto]:
    b = Body()
    ch = Chunks(b, "k", GDN_CHUNK_STATE)
    pk, f0 = ch.pk, b.const(0.0, "float32")
    W, U = ch.grid(b, b.cast("w"), 3), ch.grid(b, b.cast("u"), 3)  # [C, HV, 64, K | V]
    Kr = ch.grid(b, heads(b, b.cast("k"), "u"), 3)  # raw k at the value heads, [C, HV, 64, K]
    gam = ch.grid(b, b.cast("gam"), 2)  # [C, HV, 64]
    rk = ch.grid(b, heads(b, b.cast("rk"), "u"), 2)
    last_row = b.op("Max", b.op("Sub", ch.ntok, b.const(1)), b.const(0))  # [C]
    idx = b.op("Expand", b.unsq(last_row, 1, 2), b.op("Concat", b.dim(gam, 0), b.dim(gam, 1), b.const([1]), axis=0))
    last = b.op("Squeeze", b.op("GatherElements", gam, idx, axis=2), b.const([2]))  # [C, HV]
    fac = b.op("Where", b.unsq(ch.rv, 1), b.op("Mul", b.op("Exp", b.op("Sub", b.unsq(last, 2), gam)), rk), f0)
    # per sequence: where its capture is written (before the loop for capture_at = 0, for empty sequences too)
    at = pk.at_n
    at0 = b.op("And", pk.snapshot_n(b), b.op("Equal", at, b.const(0)))
    cap0 = b.op("Where", bcast(b, at0, 4), b.op("CastLike", b.op("Gather", "ssm_pool", pk.slot_n, axis=0),
                                                 "ssm_capture"), "ssm_capture")
    at_end = b.op("And", b.op("Equal", at, pk.length), b.op("Greater", pk.length, b.const(0)))
    h0 = b.op("ConstantOfShape", b.op("Concat", ch.C, b.op("Shape", "ssm_pool", start=1), axis=0))
    vn0 = b.op("ConstantOfShape", b.op("Shape", U))
    tb = b.sub()
    c, cond = f"chunk_{next(tb._count)}", f"cond_{next(tb._count)}"
    S, h, vn, pool, cap = (f"{n}_{next(tb._count)}" for n in ("S", "h", "vn", "pool", "cap"))
    n = tb.item(ch.seq_cl, c)
    slot, j, live = tb.item(pk.slot_n, n), tb.item(ch.j, c), tb.item(ch.live, c)
    S_in = tb.op("Where", tb.op("Equal", j, tb.const(0)), tb.cast(tb.item("ssm_pool", slot)), S)
    h_new = tb.set_row(h, c, tb.op("Where", live, S_in, tb.item(h, c)))
    v = tb.op("Sub", tb.item(U, c), tb.op("MatMul", _rdt(tb, tb.item(W, c), "w"), _rdt(tb, S_in, "w")))
    vn_new = tb.set_row(vn, c, tb.op("Where", live, v, tb.item(vn, c)))
    vs = _rdt(tb, tb.op("Mul", v, tb.unsq(tb.item(fac, c), 2)), "w")  # [HV, 64, V]
    S_out = tb.op("Add", tb.op("Mul", S_in, tb.unsq(tb.op("Exp", tb.item(last, c)), 1, 2)),
                  tb.op("MatMul", tb.op("Transpose", tb.item(Kr, c), perm=[0, 2, 1]), vs))
    S_new = tb.op("Where", live, S_out, S)
    j_last = tb.op("Equal", j, tb.op("Sub", tb.item(ch.cnt, n), tb.const(1)))
    pool_new = tb.set_row(pool, slot, tb.op("Where", tb.op("And", live, j_last), tb.op("CastLike", S_out, pool),
                                            tb.item(pool, slot)))
    at_cut = tb.op("And", tb.op("Greater", tb.item(ch.nc1, n), tb.const(0)),
                   tb.op("Equal", j, tb.op("Sub", tb.item(ch.nc1, n), tb.const(1))))
    want = tb.op("And", live, tb.op("GreaterOrEqual", tb.item(at, n), tb.const(0)))
    hit = tb.op("And", want, tb.op("Or", at_cut, tb.op("And", j_last, tb.item(at_end, n))))
    cap_new = tb.set_row(cap, n, tb.op("Where", hit, tb.op("CastLike", S_out, cap), tb.item(cap, n)))
    outs = [tb.op("Identity", cond)] + [tb.op("Identity", x) for x in (S_new, h_new, vn_new, pool_new, cap_new)]
    S0 = b.op("ConstantOfShape", b.op("Shape", "ssm_pool", start=1))
    final = loop(b, b.scalar(ch.C), tb.graph("chunks", [c, cond, S, h, vn, pool, cap], outs),
                 [S0, h0, vn0, "ssm_pool", cap0])
    b.nodes.append(onnx.helper.make_node("CastLike", [final[1], "w"], ["h"]))
    b.nodes.append(onnx.helper.make_node("CastLike", [ch.tokens(b, final[2], 4), "w"], ["v_new"]))
    b.nodes.append(onnx.helper.make_node("Identity", [final[3]], ["ssm_pool_out"]))
    b.nodes.append(onnx.helper.make_node("Identity", [final[4]], ["ssm_capture_out"]))
    return b.nodes


def out_body() -> list[onnx.NodeProto]:
    b = Body()
    ch = Chunks(b, "q", GDN_CHUNK_OUT)
    f0 = b.const(0.0, "float32")
    q, k = b.cast("q"), b.cast("k")
    scale = b.op("Reciprocal", b.op("Sqrt", b.cast(b.dim("q", 2))))
    rq = heads(b, b.op("Mul", _inv_norm(b, q), scale), "gam")  # [T, HV]
    Q = ch.grid(b, heads(b, q, "gam"), 3)  # [C, HV, 64, K]
    Kg = ch.grid(b, heads(b, k, "gam"), 3)
    rqg, rkg = ch.grid(b, rq, 2), ch.grid(b, heads(b, b.cast("rk"), "gam"), 2)  # [C, HV, 64]
    gam = ch.grid(b, b.cast("gam"), 2)
    inc = b.op("And", b.const(np.tril(np.ones((BT, BT), bool)), np.bool_),
               b.op("And", b.unsq(ch.rv, 1, 3), b.unsq(ch.rv, 1, 2)))  # [C, 1, 64, 64]
    s = b.op("Mul", b.op("Mul", b.op("MatMul", Q, b.op("Transpose", Kg, perm=[0, 1, 3, 2])), b.unsq(rqg, 3)),
             b.unsq(rkg, 2))
    diff = b.op("Sub", b.unsq(gam, 3), b.unsq(gam, 2))
    p = b.op("Where", inc, b.op("Mul", s, b.op("Exp", b.op("Where", inc, diff, f0))), f0)
    inter = b.op("Mul", b.op("MatMul", Q, b.cast("h")), b.unsq(b.op("Mul", rqg, b.op("Exp", gam)), 3))
    vn = ch.grid(b, b.cast("v_new"), 3)  # [C, HV, 64, V]
    o = ch.tokens(b, b.op("Add", inter, b.op("MatMul", _rdt(b, p, "v_new"), vn)), 4)  # [T, HV, V]
    o = b.op("Where", bcast(b, ch.pk.valid, 3), o, f0)  # padding sequences: zero rows
    b.nodes.append(onnx.helper.make_node("CastLike", [o, "q"], ["o"]))
    return b.nodes


_BODIES = {GDN_CHUNK_SOLVE: solve_body, GDN_CHUNK_WU: wu_body, GDN_CHUNK_STATE: state_body, GDN_CHUNK_OUT: out_body}


def functions() -> list[onnx.FunctionProto]:
    return [function_proto(s, _BODIES[s]()) for s in SPECS]
