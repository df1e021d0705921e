"""Plan files on disk, checked before any TensorRT call: which manifests under engines_dir can be read, where a
manifest's plan is, and whether the plan and the graph it was built from are still the bytes the manifest recorded.

- `read_manifests(root)`: every `*.json` under engines_dir that is a plan manifest (a JSON object with a
  `graph_spec`), and every other one with the reason it was skipped (not UTF-8, not valid JSON, nested too deeply,
  not an object, no `graph_spec`); `find_plans` logs the skipped ones in one warning, never silently.
- `plan_of(root, manifest, m)`: the manifest's `plan`, a path relative to the manifest's folder (default: the
  manifest's name with `.plan`), must resolve, symlinks followed, to a non-empty file inside engines_dir: a forged
  manifest cannot make the runtime read `../../etc/passwd` or an absolute path.
- `check_digests(manifest, m, plan)`: the plan's sha256 must equal the recorded `plan_sha256` (hashing a multi-GB
  plan is I/O done once at open); when the graph named by `onnx` (relative to the manifest's folder) exists, its
  sha256 (`export/digest.py`) must equal `onnx_sha256`, else the export changed since the build. An engines folder
  deployed without its ONNX files cannot be checked against them, which `find_plans` logs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gdn_trt.export.digest import graph_files, sha256_files
from gdn_trt.export.engine_config import CONFIG_NAME
from gdn_trt.model.errors import GdnTrtError

_HEX64 = re.compile(r"[0-9a-f]{64}")


class PlanMismatchError(GdnTrtError, ValueError):
    """A plan under engines_dir that must not run: built for another config, dtype or layer set, changed since it
    was built, or named by a manifest outside engines_dir. Rebuild it."""


def read_manifests(root: Path) -> tuple[list[tuple[Path, dict]], list[str]]:
    """(plan manifests as (path, dict), skipped files as 'path: reason') under `root`, in path order."""
    found, skipped = [], []
    for path in sorted(root.rglob("*.json")):
        if path.name == CONFIG_NAME:  # the engine config beside the plans: `engine_config.read_engine_configs`
            continue
        try:
            m = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            skipped.append(f"{path}: not UTF-8 ({e.reason} at byte {e.start})")
            continue
        except RecursionError:
            skipped.append(f"{path}: nested too deeply to be a manifest")
            continue
        except ValueError as e:
            skipped.append(f"{path}: not valid JSON ({e})")
            continue
        except OSError as e:
            skipped.append(f"{path}: unreadable ({e.strerror})")
            continue
        if not isinstance(m, dict):
            skipped.append(f"{path}: a JSON {_json_kind(m)}, not an object")
        elif "graph_spec" not in m and "spec" not in m:
            skipped.append(f"{path}: no graph_spec, not a plan manifest")
        else:
            found.append((path, m))
    return found, skipped


def _json_kind(x: object) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(x), "null")


def plan_of(root: Path, manifest: Path, m: dict) -> Path:
    """The manifest's plan file, which must lie inside `root` (symlinks followed) and hold bytes."""
    rel = m.get("plan", manifest.with_suffix(".plan").name)
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute():
        raise PlanMismatchError(f"{manifest}: 'plan' must be a relative path inside the engine folder, got {rel!r} "
                                "(rebuild with gdn-trt build)")
    plan = manifest.parent / rel
    try:
        inside = plan.resolve().is_relative_to(root.resolve())
        usable = inside and plan.is_file() and plan.stat().st_size > 0
    except (OSError, RuntimeError) as e:  # a name too long, a symlink loop
        raise PlanMismatchError(f"{manifest}: its plan {rel[:80]!r} cannot be resolved ({e})") from None
    if not inside:
        raise PlanMismatchError(f"{manifest}: its plan {rel!r} leaves the engine folder {root} (resolves to "
                                f"{plan.resolve()}); refusing to read it")
    if not usable:
        raise PlanMismatchError(f"{manifest}: its plan {plan} is missing or empty (a failed build?)")
    return plan


def check_digests(manifest: Path, m: dict, plan: Path) -> str | None:
    """Raise unless the plan's bytes are the recorded `plan_sha256`, and the graph's the recorded `onnx_sha256`
    when the graph is present; returns why the graph could not be checked (None when it was)."""
    want = m.get("plan_sha256")
    if not isinstance(want, str) or not _HEX64.fullmatch(want):
        raise PlanMismatchError(f"{manifest}: no valid plan_sha256 recorded (got {want!r}), so the plan cannot be "
                                "checked; rebuild with gdn-trt build")
    got = sha256_files([plan])
    if got != want:
        raise PlanMismatchError(f"{plan}: sha256 {got[:16]}... differs from the {want[:16]}... its manifest "
                                f"{manifest} recorded: the plan changed since it was built; rebuild it")
    if "onnx" not in m:
        return "the manifest records no onnx path"
    onnx, want = m["onnx"], m.get("onnx_sha256")
    if not isinstance(onnx, str) or not onnx or not isinstance(want, str) or not _HEX64.fullmatch(want):
        raise PlanMismatchError(f"{manifest}: 'onnx' must be a path with a valid onnx_sha256, got {str(onnx)[:80]!r} "
                                f"and {str(want)[:80]!r} (rebuild with gdn-trt build)")
    graph = manifest.parent / onnx
    try:
        if not graph.is_file():
            return f"{graph} is not there"
        got = sha256_files(graph_files(graph))
    except (OSError, RuntimeError) as e:
        raise PlanMismatchError(f"{manifest}: its ONNX graph {onnx[:80]!r} cannot be read ({e})") from None
    if got != want:
        raise PlanMismatchError(f"{manifest}: its ONNX graph {graph} changed since the plan was built (sha256 "
                                f"{got[:16]}..., recorded {want[:16]}...): rebuild the plan from the new export")
    return None
