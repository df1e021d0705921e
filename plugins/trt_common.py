"""TensorRT Python plugins (`tensorrt.plugin`, "QDP") for the ops of `spec.py`: the parts both op families share.

The QDP decorators validate functions by their signatures (`inspect.signature`): register functions take every input
as a `TensorDesc` and then the int attributes; impl functions take the inputs, the attributes, `outputs` and
`stream`. Both are generated here from the `OpSpec`, so the plugin id, the input order and the attribute names can
only be those of `spec.py` (the exporter reads the same table). This module imports without TensorRT (the
signature builders are tested on CPU); `register_op` and `torch_view` need it and are called by `<op>/trt.py`,
which is imported only where `tensorrt` imports.
"""

from __future__ import annotations

import inspect
from typing import Callable, Tuple

from .spec import OpSpec

# TensorRT DataType name -> (torch dtype name, __cuda_array_interface__ typestr of the same width); bf16 travels as
# int16 because `tensorrt.plugin.Tensor.__cuda_array_interface__` raises for bf16 (tensorrt/plugin/_tensor.py)
_TYPES = {"FLOAT": ("float32", "<f4"), "HALF": ("float16", "<f2"), "BF16": ("bfloat16", "<i2"),
          "INT32": ("int32", "<i4"), "INT64": ("int64", "<i8")}
ATTR_TYPE = int  # every attribute is an int: the ONNX parser turns INT attributes into INT32 plugin fields


def register_signature(spec: OpSpec, desc_type: type) -> inspect.Signature:
    """(inputs: desc_type..., attrs: int...) -> Tuple[desc_type, ...] (one per output), no defaults."""
    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_OR_KEYWORD, annotation=desc_type) for n in spec.inputs]
    params += [P(a, P.POSITIONAL_OR_KEYWORD, annotation=ATTR_TYPE) for a in spec.attrs]
    return inspect.Signature(params, return_annotation=Tuple[(desc_type,) * len(spec.outputs)])


def impl_signature(spec: OpSpec) -> inspect.Signature:
    """(inputs..., attrs..., outputs, stream): the schema `tensorrt.plugin.impl` checks by parameter names."""
    P = inspect.Parameter
    names = (*spec.inputs, *spec.attrs, "outputs", "stream")
    return inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in names])


def _with_signature(fn: Callable, sig: inspect.Signature, name: str) -> Callable:
    fn.__signature__ = sig
    fn.__name__ = fn.__qualname__ = name
    return fn


def array_interface(ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], trt_type: str) -> dict:
    """`__cuda_array_interface__` (v3) of a TensorRT tensor; `strides` in elements, as TensorRT gives them."""
    _, typestr = _TYPES[trt_type]
    item = int(typestr[2:])
    return {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False), "version": 3,
            "strides": tuple(s * item for s in strides)}


class _CudaArray:
    def __init__(self, iface: dict):
        self.__cuda_array_interface__ = iface


def torch_view(t):
    """A torch tensor on the memory of a `tensorrt.plugin.Tensor` (no copy), bf16 included."""
    import torch

    trt_type = t.dtype.name
    if trt_type not in _TYPES:
        raise TypeError(f"gdn_trt plugins take {sorted(_TYPES)} tensors, got {trt_type}")
    iface = array_interface(t.data_ptr, tuple(t.shape), tuple(t.strides), trt_type)
    view = torch.as_tensor(_CudaArray(iface), device="cuda")
    torch_name, _ = _TYPES[trt_type]
    return view.view(getattr(torch, torch_name)) if torch_name == "bfloat16" else view


def register_op(spec: OpSpec, outputs: Callable, launch: Callable) -> None:
    """Register the QDP `gdn_trt::<name>`.

    Args:
        outputs: (descs: dict input name -> TensorDesc, attrs: dict) -> the activation output's TensorDesc; the
            buffer outputs are the aliased inputs, in the spec's order.
        launch: (tensors: dict input name -> torch tensor, attrs: dict, out: torch tensor) -> None; writes the
            activation output into `out` and the aliased buffers in place (their outputs share the address).
    """
    import tensorrt.plugin as trtp
    import torch

    def describe(*args, **kwargs):
        bound = register_signature(spec, trtp.TensorDesc).bind(*args, **kwargs)
        descs = {n: bound.arguments[n] for n in spec.inputs}
        attrs = {a: bound.arguments[a] for a in spec.attrs}
        return (outputs(descs, attrs), *(descs[i].aliased() for i in spec.mutated_inputs))

    def enqueue(*args, **kwargs):
        bound = impl_signature(spec).bind(*args, **kwargs)
        outs, stream = bound.arguments["outputs"], bound.arguments["stream"]
        # launch on TensorRT's stream: anything else breaks ordering and CUDA-graph capture
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            tensors = {n: torch_view(bound.arguments[n]) for n in spec.inputs}
            launch(tensors, {a: bound.arguments[a] for a in spec.attrs}, torch_view(outs[0]))

    trtp.register(spec.qualified)(
        _with_signature(describe, register_signature(spec, trtp.TensorDesc), f"{spec.name}_register"))
    trtp.impl(spec.qualified)(_with_signature(enqueue, impl_signature(spec), f"{spec.name}_impl"))
