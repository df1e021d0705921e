"""TensorRT Python plugins (`tensorrt.plugin`, "QDP") for the ops of `spec.py`: the parts both op families share.

The QDP decorators validate functions by their signatures (`inspect.signature`): register functions take every input
as a `TensorDesc` and then the int attributes; impl functions take the inputs, the attributes, `outputs` and
`stream`. Both are generated here from the `OpSpec`, so the plugin id, the input order and the attribute names can
only be those of `spec.py` (the exporter reads the same table). This module imports without TensorRT (the
signature builders are tested on CPU); `register_op` and `torch_view` need it and are called by `<op>/trt.py`,
which is imported only where `tensorrt` imports.

Int attributes are declared `numpy.typing.NDArray[np.int32]`, not `int`. TensorRT's creator turns a field into an
`int` attribute with `int(field.data)`, and `field.data` is a one-element array: numpy >= 2.4 raises TypeError
there ("only 0-dimensional arrays can be converted"), so on every TensorRT before 11.2 (10.x, 11.0, 11.1) a conv
plugin could be neither created by the ONNX parser nor re-created from a plan. An int32 array attribute takes the
creator's array path (`field.data.astype(np.int32)`) on every TensorRT with `tensorrt.plugin` (>= 10.6), matches
the INT32 field the parser makes of an ONNX INT attribute, and is serialised into the plan as INT32. The generated
functions hand the op's own `outputs` / `launch` plain ints (`attr_int`). `tests/test_trt_plugin_layer.py` drives
the six ops through TensorRT's own `tensorrt.plugin` files of the versions we claim.
"""

from __future__ import annotations

import inspect
from typing import Callable, Tuple, Union

import numpy as np
import numpy.typing as npt

from .spec import CHUNK_TOKENS, OpSpec, tensor

# the modules whose import registers the `gdn_trt` creators (JIT and AOT impls) with TensorRT
PLUGIN_MODULES = ("gdn_trt.plugins.gated_delta_rule.trt", "gdn_trt.plugins.causal_conv1d.trt")

# TensorRT DataType name -> (torch dtype name, __cuda_array_interface__ typestr of the same width); bf16 travels as
# int16 because `tensorrt.plugin.Tensor.__cuda_array_interface__` refuses bf16 (its `_tensor.py`, 10.8 to 11.4)
_TYPES = {"FLOAT": ("float32", "<f4"), "HALF": ("float16", "<f2"), "BF16": ("bfloat16", "<i2"),
          "INT32": ("int32", "<i4"), "INT64": ("int64", "<i8")}
# every attribute is an int, declared as a one-element int32 array (see the module docstring for why not `int`)
ATTR_TYPE = npt.NDArray[np.int32]


def attr_int(value) -> int:
    """The int of a plugin attribute: a one-element int32 array (what TensorRT's creator hands over) or an int."""
    a = np.asarray(value)
    if a.size != 1:
        raise ValueError(f"a gdn_trt plugin attribute holds one int, got {a.size} values: {a!r}")
    return int(a.reshape(-1)[0])


def register_signature(spec: OpSpec, desc_type: type) -> inspect.Signature:
    """(inputs: desc_type..., attrs: NDArray[int32]...) -> Tuple[desc_type, ...] (one per output), no defaults."""
    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_OR_KEYWORD, annotation=desc_type) for n in spec.inputs]
    params += [P(a, P.POSITIONAL_OR_KEYWORD, annotation=ATTR_TYPE) for a in spec.attrs]
    return inspect.Signature(params, return_annotation=Tuple[(desc_type,) * len(spec.outputs)])


def impl_signature(spec: OpSpec) -> inspect.Signature:
    """(inputs..., attrs..., outputs, stream): the schema `tensorrt.plugin.impl` checks by parameter names."""
    P = inspect.Parameter
    names = (*spec.inputs, *spec.attrs, "outputs", "stream")
    return inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in names])


def aot_impl_signature(spec: OpSpec, trtp) -> inspect.Signature:
    """(inputs..., attrs..., outputs, tactic) -> (name, PTX, launch, scalars): the schema `tensorrt.plugin.aot_impl`
    checks (`_validate_aot_impl`: by parameter names; the return annotation is mandatory). Inputs and attributes
    stay unannotated: 10.x's check calls issubclass() on an attribute's annotation, which an NDArray alias fails."""
    P = inspect.Parameter
    names = (*spec.inputs, *spec.attrs, "outputs", "tactic")
    ret = Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymExprs]
    return inspect.Signature([P(n, P.POSITIONAL_OR_KEYWORD) for n in names], return_annotation=ret)


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
        outputs: (descs: dict input name -> TensorDesc, attrs: dict name -> int) -> the activation output's
            TensorDesc; the buffer outputs are the aliased inputs, in the spec's order.
        launch: (tensors: dict input name -> torch tensor, attrs: dict name -> int, out: torch tensor) -> None;
            writes the activation output into `out` and the aliased buffers in place (their outputs share the
            address).
    """
    import tensorrt.plugin as trtp
    import torch

    def describe(*args, **kwargs):
        bound = register_signature(spec, trtp.TensorDesc).bind(*args, **kwargs)
        descs = {n: bound.arguments[n] for n in spec.inputs}
        attrs = {a: attr_int(bound.arguments[a]) for a in spec.attrs}
        return (outputs(descs, attrs), *(descs[i].aliased() for i in spec.mutated_inputs))

    def enqueue(*args, **kwargs):
        bound = impl_signature(spec).bind(*args, **kwargs)
        outs, stream = bound.arguments["outputs"], bound.arguments["stream"]
        # launch on TensorRT's stream: anything else breaks ordering and CUDA-graph capture
        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            tensors = {n: torch_view(bound.arguments[n]) for n in spec.inputs}
            launch(tensors, {a: attr_int(bound.arguments[a]) for a in spec.attrs}, torch_view(outs[0]))

    trtp.register(spec.qualified)(
        _with_signature(describe, register_signature(spec, trtp.TensorDesc), f"{spec.name}_register"))
    trtp.impl(spec.qualified)(_with_signature(enqueue, impl_signature(spec), f"{spec.name}_impl"))


def register_pass(spec: OpSpec) -> None:
    """Register the pass plugin `gdn_trt::<name>` (`spec.PASSES`): outputs shaped and typed by `spec.TENSORS` (an
    aliased output is its input), and a JIT impl that launches the wrapper kernel the AOT impl compiles
    (`aot.KernelPlan.launch_jit`, tiled for this step's shapes) on TensorRT's stream."""
    import tensorrt as trt
    import tensorrt.plugin as trtp
    import torch

    def describe(*args, **kwargs):
        bound = register_signature(spec, trtp.TensorDesc).bind(*args, **kwargs)
        descs = {n: bound.arguments[n] for n in spec.inputs}
        return _pass_outputs(spec, descs, trt, trtp)

    def enqueue(*args, **kwargs):
        from .aot import family

        bound = impl_signature(spec).bind(*args, **kwargs)
        with torch.cuda.stream(torch.cuda.ExternalStream(bound.arguments["stream"])):
            t = {n: torch_view(bound.arguments[n]) for n in spec.inputs}
            t.update((o, torch_view(x)) for o, x in zip(spec.outputs, bound.arguments["outputs"]))
            shapes = {n: tuple(x.shape) for n, x in t.items()}
            dtypes = {n: str(x.dtype).removeprefix("torch.") for n, x in t.items()}
            attrs = {a: attr_int(bound.arguments[a]) for a in spec.attrs}
            family(spec)(spec, shapes, dtypes, attrs).launch_jit(t)

    trtp.register(spec.qualified)(
        _with_signature(describe, register_signature(spec, trtp.TensorDesc), f"{spec.name}_register"))
    trtp.impl(spec.qualified)(_with_signature(enqueue, impl_signature(spec), f"{spec.name}_impl"))


def _pass_outputs(spec: OpSpec, descs: dict, trt, trtp) -> tuple:
    """The output TensorDescs of a pass plugin from its inputs' (`spec.TENSORS`): every output dimension is an
    input's dimension of the same symbol, or the chunk count C = ceil(T / 64) + 2 N."""

    def dim(s: str):
        if s.isdigit():
            return int(s)
        if s == "C":
            return trtp.cdiv(dim("T"), CHUNK_TOKENS) + dim("N") * 2
        for n in spec.inputs:
            dims = tensor(n)[0]
            if s in dims:
                return descs[n].shape_expr[dims.index(s)]
        raise KeyError(f"{spec.name}: no input carries dimension {s}")

    act = next(descs[n].dtype for n in spec.inputs if tensor(n)[1] == "act")
    aliases = dict(spec.aliases)
    out = []
    for o in spec.outputs:
        if o in aliases:
            out.append(descs[aliases[o]].aliased())
            continue
        dims, dt = tensor(o)
        out.append(trtp.from_shape_expr(tuple(dim(s) for s in dims), dtype=act if dt == "act" else getattr(trt, dt)))
    return tuple(out)


def register_aot(spec: OpSpec) -> bool:
    """Add `@trtp.aot_impl` to the registered plugin `spec` where this TensorRT has it (>= 10.9): the kernel,
    launch and scalars of `aot.aot_kernel` for the descriptors TensorRT passes (static dims as constants, dynamic
    ones as shape expressions). Returns whether it was added."""
    import tensorrt.plugin as trtp

    if not hasattr(trtp, "aot_impl"):
        return False

    def compiled(*args, **kwargs):
        from .aot import aot_kernel

        bound = aot_impl_signature(spec, trtp).bind(*args, **kwargs)
        descs = {n: bound.arguments[n] for n in spec.inputs}
        descs.update(zip(spec.outputs, bound.arguments["outputs"]))
        shapes = {n: tuple(d.shape_expr[j] for j in range(len(d.shape_expr))) for n, d in descs.items()}
        dtypes = {n: _TYPES[d.dtype.name][0] for n, d in descs.items()}
        k = aot_kernel(spec, shapes, dtypes, {a: attr_int(bound.arguments[a]) for a in spec.attrs})
        launch = trtp.KernelLaunchParams()
        launch.grid_x, launch.grid_y, launch.grid_z = k.grid
        launch.block_x, launch.shared_mem = k.block, k.shared
        scalars = trtp.SymIntExprs.from_tuple([trtp.SymInt32(s) for s in k.scalars])
        return k.name.encode(), k.ptx.encode(), launch, scalars

    trtp.aot_impl(spec.qualified)(_with_signature(compiled, aot_impl_signature(spec, trtp), f"{spec.name}_aot_impl"))
    return True


def context_memory(engine) -> list[int]:
    """Bytes of activation (context) memory per optimization profile: what a USER_MANAGED execution context
    needs. `get_device_memory_size_for_profile_v2` exists from TensorRT 10.1 (every version we claim); before it,
    `get_device_memory_size_for_profile`, and where neither exists the engine-wide size for every profile."""
    n = engine.num_optimization_profiles
    for name in ("get_device_memory_size_for_profile_v2", "get_device_memory_size_for_profile"):
        if hasattr(engine, name):
            return [int(getattr(engine, name)(k)) for k in range(n)]
    total = getattr(engine, "device_memory_size_v2", None)
    return [int(engine.device_memory_size if total is None else total)] * n
