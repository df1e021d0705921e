"""The six `gdn_trt` plugins through TensorRT's own plugin layer: the real `tensorrt/plugin/*.py` files of the
TensorRT bindings wheels we claim (10.8 to 11.4), run on CPU over `trt_core_standin` (the compiled core is not
needed to import or run them). This is not a build: no libnvinfer, no kernel, no engine.

Per version and op, the way the ONNX parser, the builder and the runtime drive a Python plugin:
- registration passes `tensorrt.plugin`'s signature checks and the creator is found as (name, "1", "gdn_trt");
- the parser's call: `create_plugin(name, "gdn_trt", fields, BUILD[, request])` with every INT attribute as a
  one-element INT32 field (onnx-tensorrt `loadFields`);
- output dtypes, output shapes (evaluated on the I/O contract of the plugin READMEs), the aliasing map
  (`<x>_out` -> `<x>`), the format combinations, the tactics;
- the fields serialised into the plan, read back as the runtime does (bytes and type only) and the plugin
  re-created from them in the RUNTIME phase;
- `enqueue` of the re-created plugin, with the kernels and the CUDA views replaced by recorders (CPU): every input
  reaches the op's entry point, the attributes arrive as ints, the output buffer is `outputs[0]`;
- the AOT form (10.9+; 10.8 has no `aot_impl`): the pass plugins' intermediates (shapes, dtypes, aliasing) and JIT
  launch, the network flag choosing between the JIT and the AOT plugin, and the AOT path through
  `get_launch_params` / `get_kernel`: what our `aot_impl` returns is exactly `aot.aot_kernel` for the shapes
  TensorRT passes (compiled here for sm_90), scalars int32, PTX parameters in TensorRT's order.

The wheels (about 1.2 MB each) are downloaded once with pip into `~/.cache/gdn-trt/tensorrt-plugin/` (or
`$GDN_TRT_CACHE`); only `tensorrt_bindings/plugin/*.py` is kept. Without network access the tests skip saying so;
a failing op fails. This check found that `int` attributes break on TensorRT < 11.2 with numpy >= 2.4
(`test_int_attribute_reproduces_the_numpy_2_4_failure` keeps the evidence).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Tuple

import numpy as np
import pytest

from gdn_trt.export.build import PLUGIN_MODULES
from gdn_trt.plugins import aot, trt_common
from gdn_trt.plugins.spec import (AOT_CHAINS, AOT_PLUGINS, CONV_PREFILL, CONV_UPDATE, CONV_UPDATE_STASH, GDN_CHUNKED,
                                  GDN_RECURRENT, GDN_RECURRENT_STASH, NAMESPACE, OPS, PASSES, PLUGIN_VERSION, PLUGINS,
                                  OpSpec)

from . import trt_core_standin

# (wheel, version): the oldest we claim (JIT), the oldest with `aot_impl` (AOT), the last 10.13 and 10.x, the last
# 11.x without TensorRT's own fix of the int attribute (11.1), the newest
WHEELS = (("tensorrt-cu12-bindings", "10.8.0.43"), ("tensorrt-cu12-bindings", "10.9.0.34"),
          ("tensorrt-cu12-bindings", "10.13.3.9.post1"),
          ("tensorrt-cu12-bindings", "10.16.1.11"), ("tensorrt-cu13-bindings", "11.1.0.106"),
          ("tensorrt-cu13-bindings", "11.4.0.106"))

# the I/O contract of plugins/*/README.md: dims (dynamic ones marked) and per tensor its dims and dtype
DIMS = {"T": 7, "N": 3, "S": 5, "H": 2, "K": 16, "HV": 4, "V": 8, "D": 12, "W": 4, "n": 9, "64": 64, "C": 7}
DYNAMIC = {"T", "N", "S", "C"}  # C = ceil(T / 64) + 2 N chunk slots of the AOT passes' intermediates
ACT, F32, I32 = "BF16", "FLOAT", "INT32"
TENSORS = {
    "q": ("T H K", ACT), "k": ("T H K", ACT), "v": ("T HV V", ACT), "a": ("T HV", ACT), "b": ("T HV", ACT),
    "A_log": ("HV", F32), "dt_bias": ("HV", F32), "cu_seqlens": ("N+1", I32), "slots": ("N", I32),
    "capture_at": ("N", I32), "ssm_pool": ("S HV K V", F32), "ssm_stash": ("T HV K V", F32),
    "ssm_capture": ("N HV K V", F32), "o": ("T HV V", ACT),
    "x": ("T D", ACT), "weight": ("D W", ACT), "conv_pool": ("S n D", ACT), "conv_stash": ("T n D", ACT),
    "conv_capture": ("N n D", ACT), "y": ("T D", ACT),
    # the AOT passes' intermediates (plugins/spec.py)
    "rk": ("T H", F32), "gam": ("T HV", F32), "t_inv": ("T HV 64", ACT), "w": ("T HV K", ACT), "u": ("T HV V", ACT),
    "h": ("C HV K V", ACT), "v_new": ("T HV V", ACT), "y_part": ("T D", ACT),
}
ATTRS = {"dilation": 3, "activation": 1, "max_seqs": 4}  # n = (W - 1) * dilation; N <= max_seqs
ENTRY = {GDN_RECURRENT: "recurrent", GDN_RECURRENT_STASH: "recurrent_stash", GDN_CHUNKED: "chunked",
         CONV_UPDATE: "update", CONV_UPDATE_STASH: "update_stash", CONV_PREFILL: "prefill"}
KERNELS = {"gated_delta_rule": ("recurrent", "recurrent_stash", "chunked"),
           "causal_conv1d": ("update", "update_stash", "prefill")}
STREAM = 0x5EED


def _cache_dir() -> Path:
    root = os.environ.get("GDN_TRT_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gdn-trt"
    return Path(root) / "tensorrt-plugin"


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def plugin_files(wheel: str, version: str) -> Path:
    """A folder whose `plugin/` holds the wheel's `tensorrt_bindings/plugin/*.py` (downloaded once, cached)."""
    final = _cache_dir() / f"{wheel}-{version}"
    if (final / "plugin" / "_lib.py").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent) as tmp:
        # the .py files are the same in every platform's wheel: pin one so any CI host resolves it
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.11", "--platform", "manylinux_2_28_x86_64", "--retries", "0", "--timeout", "30", "-d", tmp,
               f"{wheel}=={version}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            if not _pypi_reachable():
                pytest.skip(f"no network: cannot download {wheel}=={version} from PyPI (pip: "
                            f"{r.stderr.strip().splitlines()[-1:]})")
            raise RuntimeError(f"pip download {wheel}=={version} failed with PyPI reachable:\n{r.stderr}")
        (whl,) = Path(tmp).glob("*.whl")
        out = Path(tmp) / "extracted"
        with zipfile.ZipFile(whl) as z:
            for name in z.namelist():
                if name.startswith("tensorrt_bindings/plugin/") and name.endswith(".py"):
                    (out / "plugin").mkdir(parents=True, exist_ok=True)
                    (out / "plugin" / Path(name).name).write_bytes(z.read(name))
        if not (out / "plugin" / "_lib.py").is_file():
            raise RuntimeError(f"{whl.name} has no tensorrt_bindings/plugin/_lib.py")
        with contextlib.suppress(OSError):  # another worker may have put it there first
            os.replace(out, final)
    return final


@contextlib.contextmanager
def tensorrt_standin(version: str, package_dir: Path):
    """`tensorrt` = the stand-in core with the wheel's `plugin` package; the project's plugin modules imported
    over it. Every module involved is removed again on exit, so nothing else in the session sees the stand-in."""
    ours = ("tensorrt", *PLUGIN_MODULES)
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] == "tensorrt" or k in ours}
    for k in saved:
        del sys.modules[k]
    sys.modules["tensorrt"] = trt_core_standin.core(version, package_dir)
    try:
        trtp = importlib.import_module("tensorrt.plugin")
        for m in PLUGIN_MODULES:
            importlib.import_module(m)
        yield sys.modules["tensorrt"], trtp
    finally:
        for k in [k for k in sys.modules if k.split(".")[0] == "tensorrt" or k in ours]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture(scope="module", params=WHEELS, ids=lambda w: w[1])
def layer(request):
    wheel, version = request.param
    with tensorrt_standin(version, plugin_files(wheel, version)) as (trt, trtp):
        yield trt, trtp, tuple(int(x) for x in version.split(".")[:2])


def _io(name: str) -> str:
    """The contract entry of an input or output: `<x>_out` is the updated `<x>`."""
    return name if name in TENSORS else name.removesuffix("_out")


def _dims(name: str) -> list[tuple[int, bool]]:
    """(size, dynamic) per dim of a contract entry."""
    return [(DIMS["N"] + 1, True) if d == "N+1" else (DIMS[d], d in DYNAMIC) for d in TENSORS[_io(name)][0].split()]


def _shape(name: str) -> tuple[int, ...]:
    return tuple(size for size, _ in _dims(name))


def _exprs(trt, name: str):
    return trt.DimsExprs([trt.IDimensionExpr(size, not dynamic) for size, dynamic in _dims(name)])


def _dtype(trt, name: str):
    return trt.DataType[TENSORS[_io(name)][1]]


def _request(trt, version, flag: str = "PREFER_JIT"):
    """What the parser passes for a node without an `aot` attribute: the network's PREFER_<flag>_PYTHON_PLUGINS
    (`gdn-trt build --plugins jit|aot` sets one; a plugin with both impls cannot be created without it)."""
    return (trt.QuickPluginCreationRequest[flag],) if version >= (10, 9) else ()


def _create(trt, creator, spec: OpSpec, fields, phase, version):
    return creator.create_plugin(spec.name, NAMESPACE, trt.PluginFieldCollection(fields), phase,
                                 *_request(trt, version))


def _parser_fields(trt, spec: OpSpec):
    return [trt.PluginField(a, np.array([ATTRS[a]], dtype=np.int32), trt.PluginFieldType.INT32) for a in spec.attrs]


def test_creators_are_registered_with_the_spec_fields(layer):
    trt, _, _ = layer
    for spec in PLUGINS:
        creator = trt.get_plugin_registry().get_creator(spec.name, PLUGIN_VERSION, NAMESPACE)
        assert creator is not None, f"{spec.qualified}: no creator"
        assert [f.name for f in creator.field_names] == list(spec.attrs)
        assert {f.type.name for f in creator.field_names} <= {"INT32"}, "fields other than INT32"


@pytest.mark.parametrize("spec", OPS, ids=lambda s: s.name)
def test_op_through_parser_builder_and_runtime(layer, spec, monkeypatch):
    trt, trtp, version = layer
    creator = trt.get_plugin_registry().get_creator(spec.name, PLUGIN_VERSION, NAMESPACE)
    plugin = _create(trt, creator, spec, _parser_fields(trt, spec), trt.TensorRTPhase.BUILD, version)

    in_types = [_dtype(trt, n) for n in spec.inputs]
    out_types = plugin.get_output_data_types(in_types, [len(_shape(n)) for n in spec.inputs])
    assert [t.name for t in out_types] == [TENSORS[_io(o)][1] for o in spec.outputs]

    exprs = plugin.get_output_shapes([_exprs(trt, n) for n in spec.inputs], [], trt.IExprBuilder())
    shapes = [tuple(e.value for e in d) for d in exprs]
    assert shapes == [_shape(o) for o in spec.outputs]
    dynamic = [[not e.is_constant() for e in d] for d in exprs]
    assert dynamic[0][0], "the token dim of the activation output stays dynamic"

    aliased = [plugin.get_aliased_input(i) for i in range(len(spec.outputs))]
    assert aliased == [-1, *(spec.inputs.index(_io(o)) for o in spec.outputs[1:])]

    io = [trt.DynamicPluginTensorDesc(trt.PluginTensorDesc(t, _shape(n), trt.TensorFormat.LINEAR))
          for n, t in zip((*spec.inputs, *spec.outputs), (*in_types, *out_types))]
    combos = plugin.get_supported_format_combinations(io, len(spec.inputs))
    assert [(c.type, c.format) for c in combos] == [(d.desc.type, trt.TensorFormat.LINEAR) for d in io]
    plugin.configure_plugin(io[:len(spec.inputs)], io[len(spec.inputs):])
    assert plugin.get_valid_tactics() == []

    stored = [(f.name, f.type, f.data.tobytes()) for f in plugin.get_fields_to_serialize()]  # what a plan keeps
    assert [s[0] for s in stored] == list(spec.attrs)
    runtime = _create(trt, creator, spec, [trt.PluginField(n, b, t) for n, t, b in stored],
                      trt.TensorRTPhase.RUNTIME, version).clone()
    calls = _enqueue(trt, runtime, spec, monkeypatch)

    (entry, args, kwargs), [(copied, src)] = calls["kernel"], calls["copy"]
    assert entry == ENTRY[spec]
    ptrs = _ptrs(spec)
    seen = _views(args)
    assert sorted(v.ptr for _, v in seen) == sorted(ptrs[n] for n in spec.inputs), "every input once, nothing else"
    assert all(ptrs[name] == v.ptr for name, v in seen if name in ptrs), "an input bound to another argument"
    assert all(v.dtype == TENSORS[n][1] and v.shape == _shape(n) for n in spec.inputs for _, v in seen
               if v.ptr == ptrs[n])
    conv = [a for a in args if hasattr(a, "dilation")]
    assert [(type(c.dilation), c.dilation, type(c.activation), c.activation) for c in conv] == (
        [(int, ATTRS["dilation"], int, ATTRS["activation"])] if spec.attrs else [])
    assert copied.ptr == ptrs[spec.outputs[0]] and src is RESULT, "the activation goes to outputs[0]"
    assert calls["stream"] == [STREAM], "the kernels launch on TensorRT's stream"


@dataclasses.dataclass(frozen=True)
class _View:
    """What `torch_view` would return for one TensorRT tensor, kept as (pointer, shape, dtype)."""

    ptr: int
    shape: tuple
    dtype: str

    def copy_(self, src):
        _View.calls["copy"].append((self, src))


RESULT = _View(0, (), "the kernel's activation output")


def _ptrs(spec: OpSpec) -> dict[str, int]:
    return {n: 0x10000 * (i + 1) for i, n in enumerate((*spec.inputs, *spec.outputs))}


def _views(args) -> list[tuple[str, _View]]:
    """Every _View among the kernel's arguments, with the dataclass field it sits in ('' for a positional one)."""
    out = []
    for a in args:
        if isinstance(a, _View):
            out.append(("", a))
        elif dataclasses.is_dataclass(a):
            out += [(f.name, getattr(a, f.name)) for f in dataclasses.fields(a)
                    if isinstance(getattr(a, f.name), _View)]
    return out


def _enqueue(trt, plugin, spec: OpSpec, monkeypatch) -> dict:
    """Call the runtime plugin's enqueue as TensorRT does, with recorders for the kernels, the CUDA views and
    the stream (this machine has no GPU)."""
    import torch

    calls = {"copy": [], "stream": [], "kernel": None}
    _View.calls = calls
    pkg = "gated_delta_rule" if spec.name.startswith("gated") else "causal_conv1d"
    fake = type(sys)(f"gdn_trt.plugins.{pkg}.triton")
    for name in KERNELS[pkg]:
        def kernel(*args, _name=name, **kwargs):
            calls["kernel"] = (_name, args, kwargs)
            return RESULT
        setattr(fake, name, kernel)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setattr(trt_common, "torch_view", lambda t: _View(t.data_ptr, tuple(t.shape), t.dtype.name))
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda s: calls["stream"].append(s) or s)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())

    ptrs = _ptrs(spec)
    descs = [trt.PluginTensorDesc(_dtype(trt, n), _shape(n), trt.TensorFormat.LINEAR)
             for n in (*spec.inputs, *spec.outputs)]
    strides = [tuple(int(np.prod(d.dims[i + 1:])) for i in range(len(d.dims))) for d in descs]
    n_in = len(spec.inputs)
    plugin.enqueue(descs[:n_in], descs[n_in:], [ptrs[n] for n in spec.inputs], [ptrs[n] for n in spec.outputs],
                   strides[:n_in], strides[n_in:], STREAM)
    assert calls["kernel"] is not None, "enqueue launched nothing"
    return calls


def test_int_attribute_reproduces_the_numpy_2_4_failure(layer):
    """The failure this check found, on TensorRT's own files: an `int` attribute created from the parser's INT32
    field fails on TensorRT < 11.2 with numpy >= 2.4 and works on 11.2+ (or with older numpy)."""
    trt, trtp, version = layer

    def desc(x, width):
        return (x.like(),)

    P = inspect.Parameter  # an explicit signature: this module's annotations are strings (__future__)
    desc.__signature__ = inspect.Signature(
        [P("x", P.POSITIONAL_OR_KEYWORD, annotation=trtp.TensorDesc), P("width", P.POSITIONAL_OR_KEYWORD,
                                                                        annotation=int)],
        return_annotation=Tuple[trtp.TensorDesc])
    trtp.register("gdn_trt_probe::int_attr")(desc)
    trtp.impl("gdn_trt_probe::int_attr")(lambda x, width, outputs, stream: None)
    creator = trt.get_plugin_registry().get_creator("int_attr", "1", "gdn_trt_probe")
    fields = trt.PluginFieldCollection([trt.PluginField("width", np.array([4], np.int32), trt.PluginFieldType.INT32)])
    broken = version < (11, 2) and np.lib.NumpyVersion(np.__version__) >= "2.4.0"
    args = ("int_attr", "gdn_trt_probe", fields, trt.TensorRTPhase.BUILD, *_request(trt, version))
    if broken:
        with pytest.raises(TypeError, match="0-dimensional"):
            creator.create_plugin(*args)
    else:
        assert creator.create_plugin(*args).attrs == {"width": 4}



# ---- the AOT form (TensorRT >= 10.9): pass plugins and `@trtp.aot_impl` ----

def _sm90():
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", 90, 32)


def _plugin_io(trt, plugin, spec: OpSpec):
    """Types, shape expressions and the configured I/O of a plugin, as the builder gets them."""
    in_types = [_dtype(trt, n) for n in spec.inputs]
    out_types = plugin.get_output_data_types(in_types, [len(_shape(n)) for n in spec.inputs])
    exprs = plugin.get_output_shapes([_exprs(trt, n) for n in spec.inputs], [], trt.IExprBuilder())
    io = [trt.DynamicPluginTensorDesc(trt.PluginTensorDesc(t, _shape(n), trt.TensorFormat.LINEAR))
          for n, t in zip((*spec.inputs, *spec.outputs), (*in_types, *out_types))]
    plugin.get_supported_format_combinations(io, len(spec.inputs))
    plugin.configure_plugin(io[:len(spec.inputs)], io[len(spec.inputs):])
    return out_types, exprs, io


@pytest.mark.parametrize("spec", PASSES, ids=lambda s: s.name)
def test_pass_plugin_describes_its_intermediates_and_launches_the_aot_kernel(layer, spec, monkeypatch):
    """A pass plugin's outputs (the intermediates TensorRT allocates) have the shapes and dtypes of
    `spec.TENSORS`, C = ceil(T / 64) + 2 N dynamic, aliased outputs their inputs; its JIT impl launches the wrapper
    kernel of its AOT impl with every tensor by name."""
    trt, trtp, version = layer
    creator = trt.get_plugin_registry().get_creator(spec.name, PLUGIN_VERSION, NAMESPACE)
    plugin = _create(trt, creator, spec, _parser_fields(trt, spec), trt.TensorRTPhase.BUILD, version)
    out_types, exprs, io = _plugin_io(trt, plugin, spec)
    assert [t.name for t in out_types] == [TENSORS[_io(o)][1] for o in spec.outputs]
    assert [tuple(e.value for e in d) for d in exprs] == [_shape(o) for o in spec.outputs]
    assert [[not e.is_constant() for e in d] for d in exprs] == [[dyn for _, dyn in _dims(o)] for o in spec.outputs]
    aliases = dict(spec.aliases)
    assert [plugin.get_aliased_input(i) for i in range(len(spec.outputs))] == [
        spec.inputs.index(aliases[o]) if o in aliases else -1 for o in spec.outputs]

    import torch

    launched = []
    monkeypatch.setattr(aot.KernelPlan, "launch_jit", lambda self, t: launched.append((self, t)))
    torch_names = {"BF16": "bfloat16", "FLOAT": "float32", "INT32": "int32"}
    monkeypatch.setattr(trt_common, "torch_view", lambda t: _TorchView(t.data_ptr, tuple(t.shape),
                                                                      torch_names[t.dtype.name]))
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda s: s)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    runtime = plugin.clone()
    ptrs = _ptrs(spec)
    descs = [trt.PluginTensorDesc(_dtype(trt, n), _shape(n), trt.TensorFormat.LINEAR)
             for n in (*spec.inputs, *spec.outputs)]
    n_in = len(spec.inputs)
    runtime.enqueue(descs[:n_in], descs[n_in:], [ptrs[n] for n in spec.inputs], [ptrs[n] for n in spec.outputs],
                    [()] * n_in, [()] * len(spec.outputs), STREAM)
    [(plan, tensors)] = launched
    assert plan.fn is aot.family(spec).__globals__["_WRAPPERS"][spec]
    assert {n: t.ptr for n, t in tensors.items()} == ptrs


@dataclasses.dataclass(frozen=True)
class _TorchView:
    ptr: int
    shape: tuple
    dtype: str


class _LaunchParams:
    """What TensorRT hands `get_launch_params` to fill: grid, block, shared memory."""


class _SymExprSetter:
    """What TensorRT hands `get_launch_params` for the extra scalars."""

    def __init__(self):
        self.items, self.nbSymExprs = {}, None

    def __setitem__(self, i, expr):
        self.items[i] = expr


@pytest.mark.parametrize("spec", AOT_PLUGINS, ids=lambda s: s.name)
def test_aot_impl_returns_the_aot_kernel_in_tensorrts_parameter_order(layer, spec, monkeypatch):
    """The builder's AOT path through TensorRT's own files: the network flag PREFER_AOT makes the creator build
    the AOT plugin, `get_launch_params` calls our `aot_impl` with the symbolic shapes, and what it returns (entry
    name, PTX, grid / block / shared memory, int32 scalars) is exactly `aot.aot_kernel` for those shapes, whose PTX
    declares the input pointers, the scalars, the output pointers and at most Triton's two scratch pointers."""
    trt, trtp, version = layer
    if version < (10, 9):
        assert not hasattr(trtp, "aot_impl") and not hasattr(trt, "QuickPluginCreationRequest")
        return
    monkeypatch.setattr(aot, "default_target", _sm90)
    creator = trt.get_plugin_registry().get_creator(spec.name, PLUGIN_VERSION, NAMESPACE)
    plugin = _create(trt, creator, spec, _parser_fields(trt, spec), trt.TensorRTPhase.BUILD, version)
    assert not isinstance(plugin, trt.IPluginV3QuickAOTBuild), "PREFER_JIT must give the JIT plugin"
    plugin = creator.create_plugin(spec.name, NAMESPACE, trt.PluginFieldCollection(_parser_fields(trt, spec)),
                                   trt.TensorRTPhase.BUILD, *_request(trt, version, "PREFER_AOT"))
    assert isinstance(plugin, trt.IPluginV3QuickAOTBuild)
    _, _, io = _plugin_io(trt, plugin, spec)
    plugin.set_tactic(0)
    n_in = len(spec.inputs)
    launch, scalars = _LaunchParams(), _SymExprSetter()
    plugin.get_launch_params([_exprs(trt, n) for n in spec.inputs], io, n_in, launch, scalars, trt.IExprBuilder())
    name, ptx = plugin.get_kernel([d.desc for d in io[:n_in]], [d.desc for d in io[n_in:]])

    sizes = {d: v for d, v in DIMS.items() if d not in ("n", "64", "C")} | {"L": DIMS["n"]}
    names = (*spec.inputs, *spec.outputs)
    want = aot.aot_kernel(spec, aot.spec_shapes(spec, sizes, ("T", "N", "S")),
                          {n: {"BF16": "bfloat16", "FLOAT": "float32", "INT32": "int32"}[TENSORS[_io(n)][1]]
                           for n in names}, {a: ATTRS[a] for a in spec.attrs}, _sm90())
    assert (name, ptx) == (want.name.encode(), want.ptx.encode())
    grid = [getattr(launch, f"grid_{a}").expr for a in "xyz"]
    assert [g.value for g in grid] == [aot.value(g) for g in want.grid]
    assert [not g.is_constant() for g in grid] == [not isinstance(g, int) for g in want.grid], "dynamic grid dims"
    assert (launch.block_x.expr.value, launch.block_y.expr.value, launch.block_z.expr.value) == (want.block, 1, 1)
    assert launch.shared_mem.expr.value == want.shared <= aot.AOT_SMEM_LIMIT
    assert scalars.nbSymExprs == len(want.scalars) == len(scalars.items)
    for i, s in enumerate(want.scalars):
        e = scalars.items[i]
        assert (e.type, e.dtype) == (trt.PluginArgType.INT, trt.PluginArgDataType.INT32)
        assert (e.expr.value, e.expr.is_constant()) == (aot.value(s), isinstance(s, int))
    declared = aot.ptx_params(ptx.decode(), name.decode())
    given = ["u64"] * n_in + ["u32"] * len(want.scalars) + ["u64"] * len(spec.outputs)
    assert declared[:len(given)] == given and declared[len(given):] in ([], ["u64"], ["u64", "u64"]), declared


def test_a_plugin_with_both_impls_needs_the_network_flag(layer):
    """TensorRT refuses to create a plugin with both impls unless told which (the parser's request: the node's
    `aot` attribute or the network's PREFER_* flag); an op with only a JIT impl (the chunked GDN op, the conv
    prefill) is created JIT even under PREFER_AOT, which is why `gdn-trt build --plugins aot` checks every node."""
    trt, trtp, version = layer
    if version < (10, 9):
        return
    reg, req = trt.get_plugin_registry(), trt.QuickPluginCreationRequest
    for spec in AOT_PLUGINS:
        fields = trt.PluginFieldCollection(_parser_fields(trt, spec))
        with pytest.raises(ValueError, match="both AOT and JIT"):
            reg.get_creator(spec.name, PLUGIN_VERSION, NAMESPACE).create_plugin(
                spec.name, NAMESPACE, fields, trt.TensorRTPhase.BUILD, req.UNKNOWN)
    for op in AOT_CHAINS:
        plugin = reg.get_creator(op.name, PLUGIN_VERSION, NAMESPACE).create_plugin(
            op.name, NAMESPACE, trt.PluginFieldCollection(_parser_fields(trt, op)), trt.TensorRTPhase.BUILD,
            req.PREFER_AOT)
        assert not isinstance(plugin, trt.IPluginV3QuickAOTBuild)
