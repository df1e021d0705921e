"""ONNX emission shared by both op families: the custom node, its translation for the dynamo exporter, and the
model-local function that carries the node's reference body.

Every `gdn_trt` op becomes one node `gdn_trt::<name>` whose inputs, outputs and int attributes follow
`plugins/spec.py`, plus the two string attributes TensorRT's ONNX parser reads itself (`plugin_namespace`,
`plugin_version`). Nothing else is a string: the parser turns every other attribute into a plugin field, and a
QDP creator cannot take string fields from ONNX safely (a trailing NUL arrives with them).

The recipe is the one verified with torch 2.13 / onnxscript 0.7.2 (on the CPU, end to end): a plain traced
translation function calling an `onnxscript.values.Op` built from an explicit `OpSchema` (a scripted translation
or a schema-less op fails the export), then a FunctionProto of the same (domain, name) appended to the model.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Callable, Iterator

import numpy as np
import onnx
import onnxscript
from onnx import TensorProto, defs, helper, numpy_helper

from .spec import NAMESPACE, PLUGIN_VERSION, OpSpec

OPSET = onnxscript.values.Opset(domain=NAMESPACE, version=1)
# ONNX standard opset of the function bodies (Loop, ScatterND with reduction, CastLike, ...)
BODY_OPSET = 18
PLUGIN_STRING_ATTRS = ("plugin_namespace", "plugin_version")

_ANY = ["tensor(float)", "tensor(double)", "tensor(float16)", "tensor(bfloat16)", "tensor(int32)",
        "tensor(int64)"]


def op_schema(spec: OpSpec) -> defs.OpSchema:
    """An `OpSchema` for the custom node: one type variable per input and output (the node is polymorphic; the
    types come from the graph), int attributes from the spec, and the two parser-read string attributes."""
    FP = defs.OpSchema.FormalParameter
    inputs = [FP(n, f"T_{n}") for n in spec.inputs]
    outputs = [FP(n, f"T_{n}") for n in spec.outputs]
    constraints = [(f"T_{n}", _ANY, "") for n in (*spec.inputs, *spec.outputs)]
    attrs = [defs.OpSchema.Attribute(a, defs.OpSchema.AttrType.INT, "") for a in spec.attrs]
    attrs += [defs.OpSchema.Attribute(a, defs.OpSchema.AttrType.STRING, "") for a in PLUGIN_STRING_ATTRS]
    return defs.OpSchema(spec.name, NAMESPACE, 1, inputs=inputs, outputs=outputs, type_constraints=constraints,
                         attributes=attrs)


def custom_op(spec: OpSpec) -> onnxscript.values.Op:
    return onnxscript.values.Op(OPSET, spec.name, op_schema(spec))


def translation(spec: OpSpec) -> Callable:
    """The translation of `torch.ops.gdn_trt.<name>.default` for `custom_translation_table`.

    The exporter matches a translation to the torch schema by parameter names and reads attributes from the
    annotations, so the function gets the spec's exact signature (inputs unannotated, int attributes `int`)."""
    op = custom_op(spec)

    def translate(*args, **kwargs):
        bound = translate.__signature__.bind(*args, **kwargs)
        vals = [bound.arguments[n] for n in spec.inputs]
        attrs = {a: int(bound.arguments[a]) for a in spec.attrs}
        return op(*vals, **attrs, plugin_namespace=NAMESPACE, plugin_version=PLUGIN_VERSION)

    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_OR_KEYWORD) for n in spec.inputs]
    params += [P(a, P.POSITIONAL_OR_KEYWORD, annotation=int) for a in spec.attrs]
    translate.__signature__ = inspect.Signature(params)
    translate.__annotations__ = {a: int for a in spec.attrs}
    translate.__name__ = translate.__qualname__ = f"{spec.name}_translation"
    return translate


def function_proto(spec: OpSpec, nodes: list[onnx.NodeProto]) -> onnx.FunctionProto:
    """The model-local function `gdn_trt::<name>` with the spec's inputs, outputs and attributes and `nodes` as
    its body. ONNX Runtime and `onnx.reference` run it; TensorRT inlines it when no plugin is registered."""
    return onnx.helper.make_function(
        NAMESPACE, spec.name, list(spec.inputs), list(spec.outputs), nodes,
        [onnx.helper.make_opsetid("", BODY_OPSET)], attributes=[*spec.attrs, *PLUGIN_STRING_ATTRS])


class Body:
    """Builds the nodes of a function body or of a Loop body subgraph, with value names unique across nesting
    (ONNX forbids a subgraph name shadowing an outer one). `b.op("Add", x, y)` returns the output name."""

    def __init__(self, counter: Iterator[int] | None = None):
        self.nodes: list[onnx.NodeProto] = []
        self._count = counter if counter is not None else itertools.count()

    def sub(self) -> "Body":
        return Body(self._count)

    def op(self, op_type: str, *inputs: str, n_out: int = 1, **attrs):
        outs = [f"{op_type.lower()}_{next(self._count)}" for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, value, dtype=np.int64) -> str:
        return self.op("Constant", value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))

    def attr_int(self, name: str) -> str:
        """The int64 scalar value of the enclosing function's attribute `name`."""
        out = f"attr_{name}_{next(self._count)}"
        node = helper.make_node("Constant", [], [out])
        node.attribute.append(helper.make_attribute_ref("value_int", onnx.AttributeProto.INT, ref_attr_name=name))
        self.nodes.append(node)
        return out

    def cast(self, x: str, to: int = TensorProto.FLOAT) -> str:
        return self.op("Cast", x, to=to)

    def dim(self, x: str, axis: int) -> str:
        """Size of axis `axis` of `x` as an int64 [1] tensor."""
        return self.op("Shape", x, start=axis, end=axis + 1)

    def scalar(self, x: str) -> str:
        """[1] -> scalar."""
        return self.op("Squeeze", x, self.const([0]))

    def item(self, x: str, i: str) -> str:
        """x[i] for a scalar index tensor i (removes axis 0)."""
        return self.op("Gather", x, i, axis=0)

    def unsq(self, x: str, *axes: int) -> str:
        return self.op("Unsqueeze", x, self.const(list(axes)))

    def row_index(self, i: str) -> str:
        """A scalar index -> ScatterND indices [1, 1]."""
        return self.op("Reshape", i, self.const([1, 1]))

    def set_row(self, buf: str, i: str, row: str) -> str:
        """buf with buf[i] = row (row cast to buf's dtype); functional, as ScatterND is."""
        return self.op("ScatterND", buf, self.row_index(i), self.unsq(self.op("CastLike", row, buf), 0))

    def graph(self, name: str, inputs: list[str], outputs: list[str]) -> onnx.GraphProto:
        """This builder's nodes as a Loop body: inputs = (iteration, cond, *carried). The carried values are left
        untyped (inference takes them from the Loop's inputs, which keeps the body polymorphic)."""
        untyped = onnx.TypeProto()
        vi = [helper.make_tensor_value_info(inputs[0], TensorProto.INT64, []),
              helper.make_tensor_value_info(inputs[1], TensorProto.BOOL, [])]
        vi += [helper.make_value_info(n, untyped) for n in inputs[2:]]
        vo = [helper.make_tensor_value_info(outputs[0], TensorProto.BOOL, [])]
        vo += [helper.make_value_info(n, untyped) for n in outputs[1:]]
        return helper.make_graph(self.nodes, name, vi, vo)


def loop(b: Body, trip: str, body: onnx.GraphProto, carried: list[str]) -> list[str]:
    """Run `body` `trip` times (int64 scalar) over the loop-carried values; returns their final values."""
    outs = b.op("Loop", trip, b.const(True, np.bool_), *carried, n_out=len(carried), body=body)
    return [outs] if len(carried) == 1 else outs


class PackingVectors:
    """The packing as per-token and per-sequence vectors, computed from values only (never as shapes: TensorRT
    would then need cu_seqlens as a shape input with value ranges in every profile). Index tensors are int64.

    Per token t [T]: `seq` (its sequence n: the number of sequences ending at or before t), `pos` (t - start of
    n), `slot` (slots[n] clamped to >= 0), `valid` (slots[n] >= 0), `last` (t is the last token of n).
    Per sequence n [N]: `start`, `length`, `slot_n`, `valid_n`, and `at_n` (capture_at, when the op has one).
    A padding sequence (slot -1) reads slot 0 and writes nothing.
    """

    def __init__(self, b: Body, tokens_of: str, spec: OpSpec):
        zero, one = b.const(0), b.const(1)
        cu, slots = b.cast("cu_seqlens", TensorProto.INT64), b.cast("slots", TensorProto.INT64)
        big = b.const([np.iinfo(np.int64).max])
        self.start = b.op("Slice", cu, b.const([0]), b.const([-1]), b.const([0]))  # [N]
        ends = b.op("Slice", cu, b.const([1]), big, b.const([0]))  # [N]
        self.length = b.op("Sub", ends, self.start)
        self.valid_n = b.op("GreaterOrEqual", slots, zero)
        self.slot_n = b.op("Max", slots, zero)
        self.t = b.op("Range", zero, b.scalar(b.dim(tokens_of, 0)), one)  # [T]
        ended = b.op("LessOrEqual", b.unsq(ends, 0), b.unsq(self.t, 1))  # [T, N]
        self.seq = b.op("ReduceSum", b.cast(ended, TensorProto.INT64), b.const([1]), keepdims=0)
        self.pos = b.op("Sub", self.t, b.item(self.start, self.seq))
        self.slot = b.item(self.slot_n, self.seq)
        self.valid = b.item(self.valid_n, self.seq)
        self.last = b.op("Equal", b.op("Add", self.t, one), b.item(ends, self.seq))
        self.at_n = b.cast("capture_at", TensorProto.INT64) if "capture_at" in spec.inputs else None

    def snapshot_n(self, b: Body) -> str:
        """[N] bool: the sequence writes a capture (live slot and capture_at >= 0)."""
        return b.op("And", self.valid_n, b.op("GreaterOrEqual", self.at_n, b.const(0)))


def bcast(b: Body, mask: str, rank: int) -> str:
    """A [X] mask unsqueezed to broadcast over a [X, ...] tensor of `rank` dims."""
    return b.unsq(mask, *range(1, rank)) if rank > 1 else mask
