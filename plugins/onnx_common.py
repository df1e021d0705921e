"""ONNX emission shared by both op families: the custom node, its translation for the dynamo exporter, and the
model-local function that carries the node's reference body.

Every `gdn_trt` op becomes one node `gdn_trt::<name>` whose inputs, outputs and int attributes follow
`plugins/spec.py`, plus the two string attributes TensorRT's ONNX parser reads itself (`plugin_namespace`,
`plugin_version`). Nothing else is a string: the parser turns every other attribute into a plugin field, and a
QDP creator cannot take string fields from ONNX safely (a trailing NUL arrives with them).

The recipe is the one verified with torch 2.13 / onnxscript 0.7.2 (reference/tensorrt.md §4.2a): a plain traced
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
    n_in = len(spec.inputs)

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
    assert len(params) == n_in + len(spec.attrs)
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


class Sequence:
    """Per-sequence scalars inside the loop over sequences: token range, slot, whether the slot is live."""

    def __init__(self, b: Body, n: str, cu: str, slots: str, capture_at: str | None):
        zero = b.const(0)
        self.n = n
        self.start = b.item(cu, n)
        end = b.item(cu, b.op("Add", n, b.const(1)))
        slot = b.item(slots, n)
        self.valid = b.op("GreaterOrEqual", slot, zero)
        # a padding sequence (slot -1) reads and rewrites slot 0 unchanged and runs zero tokens
        self.slot = b.op("Max", slot, zero)
        self.trip = b.op("Where", self.valid, b.op("Sub", end, self.start), zero)
        # prefill ops: tokens consumed before the snapshot (-1 = none), and whether a snapshot is written
        self.at = b.item(capture_at, n) if capture_at else None
        self.capture = b.op("And", self.valid, b.op("GreaterOrEqual", self.at, zero)) if capture_at else None


def for_each_sequence(b: Body, spec: OpSpec, carried: list[str], step) -> list[str]:
    """Loop over the N sequences of `cu_seqlens` / `slots` with `carried` values; `step(nb, seq, carried)` builds
    one iteration in `nb` and returns the new carried values."""
    cu, slots = b.cast("cu_seqlens", TensorProto.INT64), b.cast("slots", TensorProto.INT64)
    at = b.cast("capture_at", TensorProto.INT64) if "capture_at" in spec.inputs else None
    N = b.scalar(b.dim("slots", 0))
    nb = b.sub()
    n, cond = f"seq_{next(nb._count)}", f"cond_{next(nb._count)}"
    ins = [f"c{i}_{next(nb._count)}" for i in range(len(carried))]
    new = step(nb, Sequence(nb, n, cu, slots, at), ins)
    outs = [nb.op("Identity", cond)] + [nb.op("Identity", x) for x in new]
    return loop(b, N, nb.graph(f"{spec.name}_sequences", [n, cond, *ins], outs), carried)
