"""`gdn-trt build` without TensorRT stops with a non-zero exit and says how to install it; with TensorRT the
plugin modules must register every op of the spec table (run on a TensorRT machine: docs/tensorrt.md)."""

from __future__ import annotations

import importlib

import pytest

from gdn_trt.export import cli
from gdn_trt.export.build import PLUGIN_MODULES
from gdn_trt.plugins.spec import NAMESPACE, OPS, PLUGIN_VERSION

from .conftest import has_tensorrt


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed: builds are exercised instead")
def test_build_without_tensorrt_says_how_to_install(tmp_path, capsys):
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
