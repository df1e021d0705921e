"""The packages import one way (app -> runtime -> export's GraphSpec -> model -> plugins) and no module imports
itself back through others; read from the sources' ASTs (`gdn_trt.app.imports`, the command that prints the graph)."""

from __future__ import annotations

from gdn_trt.app import imports
from gdn_trt.app.imports import Graph


def test_no_circles_and_no_upward_imports():
    g = imports.build()
    assert {imports.package_of(m) for m in g.edges} == set(imports.LAYERS)
    assert "gdn_trt.runtime.engine" in g.edges["gdn_trt.runtime.trt"]  # lazy and relative imports are read too
    assert "gdn_trt.runtime.trt" in g.edges["gdn_trt.runtime.backends"]  # (this one sits inside a function)
    assert g.cycles() == []
    assert g.upward() == []


def test_the_check_sees_circles_and_upward_arrows():
    g = Graph({"gdn_trt.runtime.a": frozenset({"gdn_trt.runtime.b", "gdn_trt.export.build"}),
               "gdn_trt.runtime.b": frozenset({"gdn_trt.runtime.a", "gdn_trt.export.spec"}),
               "gdn_trt.model.c": frozenset({"gdn_trt.runtime.b"}),
               "gdn_trt.plugins.d": frozenset({"gdn_trt.plugins.d"})})
    assert g.cycles() == [["gdn_trt.plugins.d"], ["gdn_trt.runtime.a", "gdn_trt.runtime.b"]]
    assert g.upward() == [("gdn_trt.model.c", "gdn_trt.runtime.b"), ("gdn_trt.runtime.a", "gdn_trt.export.build")]


def test_the_command_prints_the_graph(capsys):
    assert imports.main([]) == 0
    out = capsys.readouterr().out
    assert "circles: 0" in out and "upward or forbidden arrows: 0" in out and "runtime -> export" in out
