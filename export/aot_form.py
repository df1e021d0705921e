"""The AOT form of an exported graph (`gdn-trt export --aot`): every op that launches several kernels is replaced by
its chain of pass plugins (`plugins/spec.py: AOT_CHAINS`), so each `gdn_trt` node is one kernel and can take
TensorRT's `@trtp.aot_impl` (engines that run without Python).

A rewrite of the traced graph, not a second trace: the node `gated_delta_rule_chunked(q, ..., ssm_pool, capture_at,
ssm_capture) -> (o, ssm_pool_out, ssm_capture_out)` becomes solve -> w/u -> state -> output, and
`causal_conv1d_prefill(...) -> (y, conv_pool_out, conv_capture_out)` becomes chunk -> state, with the op's own
inputs and outputs where the passes take or give them and the intermediates named `<pool stem>.<name>` (`ssm.h`,
`l1.ple_conv.y_part`): exactly the GraphSpec's `scratch` tensors, typed and shaped in the graph's value_info. Each
pass node carries the op's attributes it declares and `max_seqs` (1 where the mode fixes N = 1, else the export's
`Limits.max_seqs`, which bounds N in every profile). The decode and verify graphs have no multi-kernel op and are
unchanged.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from gdn_trt.plugins.onnx_common import PLUGIN_STRING_ATTRS
from gdn_trt.plugins.spec import AOT_CHAINS, NAMESPACE, OPS_BY_NAME, PLUGIN_VERSION

from .spec import GraphSpec

_ONNX = {"float32": TensorProto.FLOAT, "bfloat16": TensorProto.BFLOAT16, "float16": TensorProto.FLOAT16}


def max_seqs(spec: GraphSpec) -> int:
    """The most sequences a step of this graph holds (the pass nodes' `max_seqs`)."""
    return 1 if spec.mode.spec.seqs == 1 else spec.limits.max_seqs


def to_aot(model: onnx.ModelProto, spec: GraphSpec) -> onnx.ModelProto:
    """`model` (the traced graph of `spec`) with its multi-kernel op nodes replaced by their pass chains, in place;
    raises when an intermediate it makes is not one of `spec.scratch` (or one of those is left unmade)."""
    scratch = {t.name: t for t in spec.scratch}
    made: set[str] = set()
    nodes = []
    for node in model.graph.node:
        op = OPS_BY_NAME.get(node.op_type) if node.domain == NAMESPACE else None
        if op not in AOT_CHAINS:
            nodes.append(node)
            continue
        names = {**dict(zip(op.inputs, node.input)), **dict(zip(op.outputs, node.output))}
        stem = names[op.mutated_inputs[0]].removesuffix("_pool")
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in PLUGIN_STRING_ATTRS}
        attrs["max_seqs"] = max_seqs(spec)
        for i, p in enumerate(AOT_CHAINS[op]):
            for o in p.outputs:
                if o not in names:
                    names[o] = f"{stem}.{o}"
                    if names[o] not in scratch:
                        raise ValueError(f"{spec.stem}: {node.name} makes {names[o]}, not a scratch tensor of its "
                                         f"GraphSpec ({sorted(scratch)})")
                    made.add(names[o])
            nodes.append(helper.make_node(
                p.name, [names[n] for n in p.inputs], [names[n] for n in p.outputs], name=f"{node.name}.{i}",
                domain=NAMESPACE, plugin_namespace=NAMESPACE, plugin_version=PLUGIN_VERSION,
                **{a: attrs[a] for a in p.attrs}))
    if made != set(scratch):
        raise ValueError(f"{spec.stem}: scratch tensors {sorted(set(scratch) - made)} of its GraphSpec were not made")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.value_info.extend(helper.make_tensor_value_info(t.name, _ONNX[t.dtype], list(t.dims))
                                  for t in spec.scratch)
    return model
