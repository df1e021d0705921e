"""The exported `gdn_trt` nodes carry exactly the plugin identity TensorRT's ONNX parser resolves, with attribute
types that survive its conversion to plugin fields, and the TensorRT plugin signatures come from the same specs.

TensorRT's parser (FallbackPluginImporter) takes the plugin name from `op_type`, the version and namespace from the
string attributes `plugin_version` / `plugin_namespace`, and turns every other attribute the creator declares into
a plugin field: INT -> INT32 (truncated), FLOAT -> FLOAT32, STRING -> CHAR with a trailing NUL (which a QDP `str`
attribute would keep). So: no string attributes but those two, only INT attributes, values inside int32.
"""

from __future__ import annotations

import inspect
import typing

import numpy as np
import onnx
import pytest

from gdn_trt.export.spec import Variant
from gdn_trt.plugins import trt_common
from gdn_trt.plugins.onnx_common import PLUGIN_STRING_ATTRS
from gdn_trt.plugins.spec import NAMESPACE, OPS, OPS_BY_NAME, PLUGIN_VERSION

from .test_export import exported  # noqa: F401 (the shared session fixture)

INT32 = (-(2 ** 31), 2 ** 31 - 1)


@pytest.mark.parametrize("variant", list(Variant), ids=lambda v: v.value)
def test_exported_nodes_carry_the_plugin_identity(exported, variant):
    m = exported[variant]
    seen = set()
    for rec in m.graphs:
        model = onnx.load(str(m.root / rec.path), load_external_data=False)
        for node in model.graph.node:
            if node.domain != NAMESPACE:
                assert node.domain in ("", "ai.onnx"), f"unexpected domain {node.domain}"
                continue
            spec = OPS_BY_NAME[node.op_type]
            seen.add(spec.name)
            attrs = {a.name: a for a in node.attribute}
            assert set(attrs) == {*spec.attrs, *PLUGIN_STRING_ATTRS}, node.op_type
            assert attrs["plugin_namespace"].s.decode() == NAMESPACE
            assert attrs["plugin_version"].s.decode() == PLUGIN_VERSION
            strings = {n for n, a in attrs.items() if a.type == onnx.AttributeProto.STRING}
            assert strings == set(PLUGIN_STRING_ATTRS), f"{node.op_type}: string plugin fields {strings}"
            for name in spec.attrs:
                a = attrs[name]
                assert a.type == onnx.AttributeProto.INT, f"{node.op_type}.{name} must be INT (-> INT32 field)"
                assert INT32[0] <= a.i <= INT32[1]
            assert len(node.input) == len(spec.inputs) and all(node.input), node.op_type
            assert len(node.output) == len(spec.outputs), node.op_type
    mode_ops = {"recurrent", "recurrent_stash", "chunked"}
    assert {n.removeprefix("gated_delta_rule_") for n in seen if n.startswith("gated")} == mode_ops
    conv_attrs = {n for n in seen if n.startswith("causal_conv1d")}
    assert len(conv_attrs) == 3


def test_ple_conv_node_has_the_ple_dilation(exported):
    m = exported[Variant.HC_PLE]
    cfg_dilation = 3  # tiny-4exp ngram_size
    model = onnx.load(str(m.root / m.graphs[0].path), load_external_data=False)
    dilations = sorted(a.i for n in model.graph.node if n.domain == NAMESPACE for a in n.attribute
                       if a.name == "dilation")
    assert dilations == [1, cfg_dilation]


class _Desc:
    """Stands in for tensorrt.plugin.TensorDesc: the signature builders only need a class to annotate with."""


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_plugin_signatures_follow_the_spec(spec):
    reg = trt_common.register_signature(spec, _Desc)
    params = list(reg.parameters.values())
    assert [p.name for p in params] == [*spec.inputs, *spec.attrs]
    assert all(p.annotation is _Desc for p in params[:len(spec.inputs)])
    for p in params[len(spec.inputs):]:  # one-element int32 arrays: `int` breaks TensorRT < 11.2 on numpy >= 2.4
        assert typing.get_origin(p.annotation) is np.ndarray, p.name
        assert typing.get_args(typing.get_args(p.annotation)[1]) == (np.int32,), p.name
    assert all(p.default is inspect.Parameter.empty for p in params)
    assert typing.get_origin(reg.return_annotation) is tuple
    assert typing.get_args(reg.return_annotation) == (_Desc,) * len(spec.outputs)
    assert not {"outputs", "stream", "tactic"} & set(spec.attrs)
    impl = trt_common.impl_signature(spec)
    assert list(impl.parameters) == [*spec.inputs, *spec.attrs, "outputs", "stream"]
    assert "." not in spec.name and "." not in NAMESPACE and spec.qualified == f"{NAMESPACE}::{spec.name}"
    outputs = dict(spec.aliases)
    assert list(spec.outputs[1:]) == list(outputs), "buffer outputs follow the activation, in aliased order"


def test_bf16_array_interface_uses_int16_with_byte_strides():
    iface = trt_common.array_interface(1234, (3, 4), (4, 1), "BF16")
    assert iface == {"shape": (3, 4), "typestr": "<i2", "data": (1234, False), "version": 3, "strides": (8, 2)}
    assert trt_common.array_interface(8, (2,), (1,), "FLOAT")["strides"] == (4,)


def test_attr_int_reads_the_one_element_array_tensorrt_hands_over():
    assert trt_common.attr_int(np.array([3], np.int32)) == 3
    assert type(trt_common.attr_int(np.array([3], np.int32))) is int and trt_common.attr_int(1) == 1
    with pytest.raises(ValueError, match="one int"):
        trt_common.attr_int(np.array([1, 2], np.int32))
