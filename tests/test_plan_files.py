"""Plan files on disk: the manifest checks `find_plans` runs before any TensorRT call (these tests write manifests
and plan files in a temporary folder; nothing is deserialized or run, so no TensorRT is needed or faked).

- A manifest's `plan` must stay inside engines_dir: `../..` paths, absolute paths and symlinks pointing out are
  refused, naming the manifest.
- The recorded plan sha256 is checked (a changed plan, or a manifest without one, is refused), and so is the ONNX
  sha256 when the graph the plan was built from is where the manifest says (a re-export since the build is refused;
  an engines folder shipped without its ONNX files is accepted and says what it could not check).
- Manifests that are broken JSON, not UTF-8, not a JSON object, or not plan manifests are skipped with one warning
  that lists every one of them and why; the good plans beside them are still found.
- `gdn-trt build`'s manifest (`plan_manifest`) records paths relative to its own folder and both digests, and reads
  back through `find_plans` from a copied engines folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil

import pytest

from gdn_trt.export.spec import Limits, graph_spec
from gdn_trt.model.config import preset
from gdn_trt.model.modes import LayerMode
from gdn_trt.runtime.plans import PlanMismatchError, find_plans

CFG = preset("tiny-3.5")
SPEC = graph_spec(CFG, 0, LayerMode.DECODE, Limits(), "float32")
PLAN_BYTES = b"plan bytes: these tests never deserialize a plan"


def _manifest(root, plan_rel: str | None = None, spec=SPEC, **extra):
    d = root / f"layer{spec.layer_idx}"
    d.mkdir(parents=True, exist_ok=True)
    plan = d / f"{spec.stem}.plan"
    plan.write_bytes(PLAN_BYTES)
    m = {"config_hash": CFG.config_hash(), "graph_spec": spec.to_json(),
         "plan_sha256": hashlib.sha256(PLAN_BYTES).hexdigest(), **extra}
    if plan_rel is not None:
        m["plan"] = plan_rel
    path = d / f"{spec.stem}.json"
    path.write_text(json.dumps(m))
    return path


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink out", "not a string"])
def test_plan_path_leaving_the_engine_folder_refused(tmp_path, how):
    root = tmp_path / "engines"
    outside = tmp_path / "secret.plan"
    outside.write_bytes(PLAN_BYTES)
    rel = {"dotdot": "../../secret.plan", "absolute": str(outside), "symlink out": "link.plan",
           "not a string": ["x.plan"]}[how]
    path = _manifest(root, rel)
    if how == "symlink out":
        os.symlink(outside, path.parent / "link.plan")
    with pytest.raises(PlanMismatchError, match=f"{path}.*(leaves the engine folder|relative path)"):
        find_plans(root, CFG, "float32")


def test_symlink_inside_the_engine_folder_is_fine(tmp_path):
    root = tmp_path / "engines"
    path = _manifest(root, "link.plan")
    os.symlink(path.with_suffix(".plan"), path.parent / "link.plan")
    assert find_plans(root, CFG, "float32")[((0,), LayerMode.DECODE)].plan.name == "link.plan"


def test_changed_plan_refused(tmp_path):
    path = _manifest(tmp_path)
    path.with_suffix(".plan").write_bytes(PLAN_BYTES[:-1] + b"!")
    with pytest.raises(PlanMismatchError, match=f"{path.with_suffix('.plan')}.*sha256.*differs"):
        find_plans(tmp_path, CFG, "float32")


@pytest.mark.parametrize("value", [None, 17, "abc"])
def test_manifest_without_a_plan_digest_refused(tmp_path, value):
    path = _manifest(tmp_path)
    m = json.loads(path.read_text())
    if value is None:
        del m["plan_sha256"]
    else:
        m["plan_sha256"] = value
    path.write_text(json.dumps(m))
    with pytest.raises(PlanMismatchError, match="plan_sha256"):
        find_plans(tmp_path, CFG, "float32")


def test_onnx_digest_checked_when_the_graph_is_there(tmp_path, caplog):
    root = tmp_path / "engines"
    onnx = tmp_path / "onnx" / "layer0" / f"{SPEC.stem}.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"graph")
    onnx.with_name(onnx.name + ".data").write_bytes(b"weights")
    digest = hashlib.sha256(b"graphweights").hexdigest()
    path = _manifest(root, onnx=os.path.relpath(onnx, root / "layer0"), onnx_sha256=digest)
    assert find_plans(root, CFG, "float32")
    onnx.with_name(onnx.name + ".data").write_bytes(b"new weights")  # re-exported since the build
    with pytest.raises(PlanMismatchError, match=f"{path}.*ONNX.*changed since the plan was built"):
        find_plans(root, CFG, "float32")
    shutil.rmtree(tmp_path / "onnx")  # engines shipped alone: accepted, and it says so
    with caplog.at_level(logging.INFO, logger="gdn_trt.runtime"):
        assert find_plans(root, CFG, "float32")
    assert "onnx_sha256 not checked" in caplog.text


def test_unreadable_manifests_listed_in_one_warning(tmp_path, caplog):
    _manifest(tmp_path)
    d = tmp_path / "junk"
    d.mkdir()
    (d / "broken.json").write_text('{"graph_spec": ')
    (d / "latin1.json").write_bytes(b'{"plan": "caf\xe9"}')
    (d / "list.json").write_text("[1, 2]")
    (d / "export.json").write_text(json.dumps({"graphs": []}))
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with caplog.at_level(logging.WARNING, logger="gdn_trt.runtime"):
        assert set(find_plans(tmp_path, CFG, "float32")) == {((0,), LayerMode.DECODE)}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "no config.json" not in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    for name, why in (("broken.json", "not valid JSON"), ("latin1.json", "not UTF-8"), ("list.json", "a JSON list"),
                      ("export.json", "no graph_spec"), ("deep.json", "nested too deeply")):
        assert f"{d / name}: {why}" in text, (name, text)


def test_build_manifest_records_relative_paths_and_digests(tmp_path):
    from gdn_trt.export.artifacts import GraphRecord, Manifest
    from gdn_trt.export.build import BuildOptions, plan_manifest
    from gdn_trt.export.digest import graph_files, sha256_files

    onnx_root = tmp_path / "onnx" / CFG.name
    onnx = onnx_root / "layer0" / f"{SPEC.stem}.onnx"
    onnx.parent.mkdir(parents=True)
    onnx.write_bytes(b"graph bytes")
    rec = GraphRecord(SPEC, f"layer0/{SPEC.stem}.onnx", 1, 0, 11, sha256_files(graph_files(onnx)))
    manifest = Manifest(onnx_root / "manifest.json", {"model": CFG.name, "adapter": None}, (rec,))
    engines = tmp_path / "engines"
    plan = engines / CFG.name / "layer0" / f"{SPEC.stem}.plan"
    plan.parent.mkdir(parents=True)
    plan.write_bytes(PLAN_BYTES)
    built = {"tensorrt": "10.x", "preview_features": {}, "context_memory": [0]}
    meta = plan_manifest(manifest, rec, plan, BuildOptions(engines, plugins="none"), built)
    assert meta["plan"] == plan.name and not os.path.isabs(meta["onnx"])
    assert meta["plan_sha256"] == hashlib.sha256(PLAN_BYTES).hexdigest() and meta["onnx_sha256"] == rec.sha256
    plan.with_suffix(".json").write_text(json.dumps(meta))
    assert find_plans(engines, CFG, "float32")[((0,), LayerMode.DECODE)].plan == plan
    # the engines folder and the export folder moved together: the relative paths still resolve and are checked
    shutil.move(tmp_path, tmp_path.parent / (tmp_path.name + "-moved"))
    moved = tmp_path.parent / (tmp_path.name + "-moved")
    (moved / "onnx" / CFG.name / "layer0" / f"{SPEC.stem}.onnx").write_bytes(b"graph bytes, re-exported")
    with pytest.raises(PlanMismatchError, match="changed since the plan was built"):
        find_plans(moved / "engines", CFG, "float32")
