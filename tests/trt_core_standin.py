"""The smallest stand-in for TensorRT's compiled core (`tensorrt.so`) under which TensorRT's own pure-Python
`tensorrt.plugin` package imports and runs: the enums, the plugin field types, the interface base classes, a
dict-backed plugin registry and a symbolic dimension-expression builder. It builds nothing and runs no kernel; it
exists so that the real `tensorrt/plugin/*.py` files of a bindings wheel can be driven the way the ONNX parser,
the builder and the runtime drive a Python plugin (`tests/test_trt_plugin_layer.py`).

Names are those of the bindings (checked against the 10.8, 10.13, 10.16, 11.1 and 11.4 wheels); the AOT names
(`QuickPluginCreationRequest`, ...) exist from 10.9 on, as in the real core, because `tensorrt.plugin` switches its
AOT support on by `hasattr(trt, "QuickPluginCreationRequest")`.
"""

from __future__ import annotations

import enum
import types
from pathlib import Path

import numpy as np

_FIELD_DTYPES = {"FLOAT16": np.float16, "FLOAT32": np.float32, "FLOAT64": np.float64, "INT8": np.int8,
                 "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "CHAR": np.int8, "UNKNOWN": np.uint8}
_OPS = {"SUM": lambda a, b: a + b, "PROD": lambda a, b: a * b, "MAX": max, "MIN": min, "SUB": lambda a, b: a - b,
        "EQUAL": lambda a, b: int(a == b), "LESS": lambda a, b: int(a < b), "FLOOR_DIV": lambda a, b: a // b,
        "CEIL_DIV": lambda a, b: -(-a // b)}


class _Base:
    def __init__(self, *args, **kwargs):
        pass


class PluginField:
    """`data` comes back as an array of the field's type, reinterpreted from the bytes given, as the C++ field
    does (a plan stores the bytes and the type, nothing else)."""

    def __init__(self, name: str = "", data=b"", type=None):
        self.name, self.type = name, type
        raw = data if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data).tobytes()
        self.data = np.frombuffer(bytes(raw), dtype=_FIELD_DTYPES[type.name]).copy()
        self.size = self.data.size


class Dims(tuple):
    MAX_DIMS = 8

    def __new__(cls, shape=()):
        return super().__new__(cls, [0] * shape if isinstance(shape, int) else shape)


class DimsExprs(list):
    def __init__(self, n):
        super().__init__([None] * n if isinstance(n, int) else n)


class IDimensionExpr:
    """A dimension with a value (to evaluate what the plugin computes) and whether TensorRT would see it as a
    build-time constant (dynamic dims are not)."""

    def __init__(self, value: int, constant: bool):
        self.value, self._constant = int(value), constant

    def is_constant(self) -> bool:
        return self._constant

    def get_constant_value(self) -> int:
        if not self._constant:
            raise RuntimeError("not a constant expression")
        return self.value


class IExprBuilder:
    def constant(self, value: int) -> IDimensionExpr:
        return IDimensionExpr(value, True)

    def operation(self, op, a: IDimensionExpr, b: IDimensionExpr) -> IDimensionExpr:
        return IDimensionExpr(_OPS[op.name](a.value, b.value), a.is_constant() and b.is_constant())


class PluginTensorDesc:
    def __init__(self, type=None, dims=(), format=None, scale=1.0):
        self.type, self.dims, self.format, self.scale = type, Dims(dims), format, scale


class DynamicPluginTensorDesc:
    def __init__(self, desc: PluginTensorDesc):
        self.desc, self.min, self.opt, self.max = desc, desc.dims, desc.dims, desc.dims


class _Registry:
    def __init__(self):
        self.creators: dict[tuple[str, str, str], object] = {}

    def register_creator(self, creator, plugin_namespace: str = "") -> bool:
        self.creators[(creator.name, creator.plugin_version, plugin_namespace)] = creator
        return True

    def get_creator(self, name: str, version: str, plugin_namespace: str = ""):
        return self.creators.get((name, version, plugin_namespace))


class Logger:
    WARNING = 2

    def __init__(self, min_severity=None):
        self.messages: list[str] = []

    def log(self, severity, msg: str) -> None:
        self.messages.append(msg)


def core(version: str, package_dir: Path) -> types.ModuleType:
    """A module to install as `tensorrt` whose subpackage `plugin` is read from `package_dir / "plugin"`."""
    m = types.ModuleType("tensorrt")
    m.__path__, m.__version__ = [str(package_dir)], version

    def enum_(name, members):
        e = enum.Enum(name, members)
        setattr(m, name, e)
        return e

    dt = enum_("DataType", "FLOAT HALF BF16 INT8 INT32 INT64 BOOL UINT8 FP8 INT4")
    for alias, member in (("float32", "FLOAT"), ("float16", "HALF"), ("int32", "INT32")):
        setattr(m, alias, dt[member])
    enum_("TensorFormat", "LINEAR")
    enum_("TensorRTPhase", "BUILD RUNTIME")
    enum_("PluginFieldType", list(_FIELD_DTYPES))
    enum_("DimensionOperation", list(_OPS))
    names = ["IPluginV3", "IPluginV3QuickCore", "IPluginV3QuickBuild", "IPluginV3QuickRuntime",
             "IPluginCreatorV3Quick", "ITensor"]
    if tuple(int(x) for x in version.split(".")[:2]) >= (10, 9):
        enum_("QuickPluginCreationRequest", "UNKNOWN PREFER_JIT PREFER_AOT STRICT_JIT STRICT_AOT")
        enum_("PluginArgType", "INT")
        enum_("PluginArgDataType", "INT8 INT16 INT32")
        names += ["IPluginV3QuickAOTBuild", "ISymExpr"]
    for name in names:
        setattr(m, name, type(name, (_Base,), {}))
    registry = _Registry()
    m.get_plugin_registry = lambda: registry
    for cls in (PluginField, Dims, DimsExprs, IDimensionExpr, IExprBuilder, PluginTensorDesc,
                DynamicPluginTensorDesc, Logger):
        setattr(m, cls.__name__, cls)
    m.PluginFieldCollection = list
    return m
