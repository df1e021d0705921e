"""TensorRT's own parser and builder on every exported graph, plugin-free (function bodies inlined), ahead of time
on the CPU with TensorRT-RTX. Skipped, with the reason, where TensorRT-RTX is not installed (it is not in the
default install: cp312 wheels of ~96 MB; see docs/tensorrt.md)."""

from __future__ import annotations

import pytest

from gdn_trt.export import rtx
from gdn_trt.export.spec import Variant

from .test_export import exported  # noqa: F401 (the shared session fixture)

try:
    rtx.import_rtx()
    _MISSING = None
except ImportError as e:
    _MISSING = str(e)

pytestmark = pytest.mark.skipif(_MISSING is not None, reason=_MISSING or "")


@pytest.mark.parametrize("variant", list(Variant), ids=lambda v: v.value)
def test_every_graph_builds_plugin_free(exported, variant):
    m = exported[variant]
    for rec in m.graphs:
        assert rtx.build_plugin_free(m.root / rec.path, rec.spec) > 0, rec.path
