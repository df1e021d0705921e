"""`gdn-trt build` without TensorRT stops with a non-zero exit and says how to install it; with TensorRT the
plugin modules must register every op of the spec table (run on a TensorRT machine: docs/tensorrt.md)."""

from __future__ import annotations

import enum
import importlib
import types

import pytest

from gdn_trt.export import cli
from gdn_trt.export.build import PLUGIN_MODULES, PREVIEW_FEATURES, preview_feature_set
from gdn_trt.plugins.trt_common import context_memory
from gdn_trt.plugins.spec import NAMESPACE, OPS, PLUGIN_VERSION

from .conftest import has_tensorrt


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed: builds are exercised instead")
def test_build_without_tensorrt_says_how_to_install(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text('{"model": "m", "limits": {}, "graphs": []}')  # an export, checked first
    rc = cli.main(["build", "--onnx", str(tmp_path), "--out", str(tmp_path / "engines")])
    err = capsys.readouterr().err
    assert rc == 2
    assert "import tensorrt" in err and "TensorRT >= 10.8" in err and "pip install" in err
    assert "docs/tensorrt.md" in err
    assert not (tmp_path / "engines").exists(), "nothing may look built"


@pytest.mark.skipif(not has_tensorrt(), reason="needs TensorRT >= 10.8 (pip install 'gdn-trt[trt]'): "
                    "see docs/tensorrt.md")
def test_plugin_modules_register_every_op():
    import tensorrt as trt

    for m in PLUGIN_MODULES:
        importlib.import_module(m)
    reg = trt.get_plugin_registry()
    missing = [s.name for s in OPS if reg.get_creator(s.name, PLUGIN_VERSION, NAMESPACE) is None]
    assert not missing, f"no creators for {missing}"


class _Profiles:
    """An engine of two profiles answering the context-memory queries of one TensorRT generation."""

    num_optimization_profiles = 2

    def __init__(self, call: str | None, sizes=(1000, 3000), total: int = 5000):
        if call is not None:
            setattr(self, call, lambda k: sizes[k])
        self.device_memory_size_v2 = total


def test_context_memory_per_profile_with_fallbacks():
    assert context_memory(_Profiles("get_device_memory_size_for_profile_v2")) == [1000, 3000]
    assert context_memory(_Profiles("get_device_memory_size_for_profile")) == [1000, 3000]
    assert context_memory(_Profiles(None)) == [5000, 5000]


def test_manifest_records_every_preview_feature():
    """Polygraphy turns every preview feature it is not given off: the manifest lists them all, on and off."""
    trt = types.SimpleNamespace(PreviewFeature=enum.Enum("PreviewFeature", PREVIEW_FEATURES + (
        "PROFILE_SHARING_0806", "RUNTIME_ACTIVATION_RESIZE_10_10")))
    assert preview_feature_set(trt) == {"ALIASED_PLUGIN_IO_10_03": True, "PROFILE_SHARING_0806": False,
                                        "RUNTIME_ACTIVATION_RESIZE_10_10": False}
