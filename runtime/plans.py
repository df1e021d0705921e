"""Plan manifests: which TensorRT plans under `engines_dir` belong to this model, and how a step binds to one.

`gdn-trt build` writes, per (layer, mode), a plan and a manifest holding the config hash and the `GraphSpec` it was
built from. The runtime trusts nothing else: every manifest under `engines_dir` is read, the ones of this model's
config are indexed by (layer, mode), and a plan whose manifest names another config, another activation dtype or a
layer the model does not have is an error that names the file and the mismatch (a plan built for another config must
never run silently). No tensorrt import here, so these checks run anywhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from gdn_trt.export.spec import GraphSpec, Role
from gdn_trt.model.config import GdnConfig
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import LayerMode

from .engine import LayerCall
from .plan_files import PlanMismatchError, check_digests, plan_of, read_manifests

log = logging.getLogger("gdn_trt.runtime")


@dataclass(frozen=True)
class PlanMatch:
    """What a session's plans must have been built for besides config and dtype: the same LoRA adapter slots
    (graph inputs of fixed shape) and the same merged adapter (digest; None = base weights)."""

    lora: LoraLimits | None = None
    merged_adapter: str | None = None




@dataclass(frozen=True)
class PlanInfo:
    """One engine file: its plan path, the GraphSpec it was built from, and the manifest's other fields."""

    plan: Path
    manifest: Path
    spec: GraphSpec
    versions: dict  # TensorRT, plugin, GPU as the manifest records them (logged, not interpreted)


def _spec_of(m: dict, path: Path) -> GraphSpec:
    raw = m.get("graph_spec") or m.get("spec")
    if not isinstance(raw, dict):
        raise PlanMismatchError(f"{path}: manifest has no GraphSpec ('graph_spec'); rebuild with gdn-trt build")
    try:
        return GraphSpec.from_json(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise PlanMismatchError(f"{path}: unreadable GraphSpec ({e}); rebuild with gdn-trt build") from None


def find_plans(engines_dir: str | Path, cfg: GdnConfig, act_dtype: str, match: PlanMatch = PlanMatch()
               ) -> dict[tuple[int, LayerMode], PlanInfo]:
    """Every plan under `engines_dir` for `cfg`, by (layer, mode). Raises `PlanMismatchError` when a manifest
    there names this model but another config hash or dtype, other LoRA slots or another merged adapter than
    `match`, a plan outside engines_dir, or a plan or graph whose sha256 differs from the recorded one
    (`plan_files.py`), and `FileNotFoundError` when none is found. Files that are not plan manifests are listed
    in one warning, with the reason each was skipped."""
    root = Path(engines_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"engines_dir {root} does not exist (run gdn-trt export and gdn-trt build)")
    want, found, unchecked = cfg.config_hash(), {}, []
    manifests, skipped = read_manifests(root)
    if skipped:
        log.warning("engines_dir %s: %d JSON files skipped as plan manifests: %s", root, len(skipped),
                    "; ".join(skipped))
    for path, m in manifests:
        spec = _spec_of(m, path)
        got = m.get("config_hash", spec.config_hash)
        if got != want or spec.config_hash != want:
            raise PlanMismatchError(f"{path}: built for config {spec.model!r} (hash {got}); this session runs "
                                    f"{cfg.name!r} (hash {want}): rebuild the engines or point engines_dir elsewhere")
        if spec.act_dtype != act_dtype:
            raise PlanMismatchError(f"{path}: built for {spec.act_dtype} activations; the session computes in "
                                    f"{act_dtype}")
        if spec.layer_idx not in cfg.gdn_layer_ids:
            raise PlanMismatchError(f"{path}: layer {spec.layer_idx} is not a GDN layer of {cfg.name}")
        if spec.limits.lora != match.lora:
            raise PlanMismatchError(f"{path}: built with LoRA slots {spec.limits.lora}; the session has "
                                    f"{match.lora} (re-export with matching --lora-slots/--lora-rank/--lora-targets)")
        if m.get("merged_adapter") != match.merged_adapter:
            raise PlanMismatchError(f"{path}: holds merged adapter {m.get('merged_adapter')}; the session's weights "
                                    f"have {match.merged_adapter} (export and build, or refit, the same weights)")
        plan = plan_of(root, path, m)
        why = check_digests(path, m, plan)
        if why is not None:
            unchecked.append(f"{path.name} ({why})")
        key = (spec.layer_idx, spec.mode)
        if key in found:
            raise PlanMismatchError(f"two plans for layer {key[0]} {key[1].value}: {found[key].plan} and {plan}")
        versions = {k: v for k, v in m.items() if k not in ("graph_spec", "spec")}
        found[key] = PlanInfo(plan, path, spec, versions)
    if not found:
        raise FileNotFoundError(f"no plan manifests under {root} (run gdn-trt build)")
    if unchecked:
        log.info("engines_dir %s: onnx_sha256 not checked for %d plans whose graphs are not beside them: %s", root,
                 len(unchecked), "; ".join(unchecked[:4]) + (" ..." if len(unchecked) > 4 else ""))
    return found

def in_place_outputs(engine, spec: GraphSpec) -> frozenset[str]:
    """The aliased outputs (`<x>_out`) a TensorRT engine confirms share their input's memory, which the runtime
    may therefore bind to the input's address. `ICudaEngine.get_aliased_input_tensor` (TensorRT >= 10.15; absent
    from 10.14 and older) names the input an output aliases, or None. Without that call nothing can confirm an
    alias, so none is bound in place: TensorRT's header allows it to insert copies for aliased plugin I/O, and
    one pointer bound as both an engine input and output has given wrong results (NVIDIA/TensorRT #4681)."""
    ask = getattr(engine, "get_aliased_input_tensor", None)
    if ask is None:
        return frozenset()
    return frozenset(n for n, i in spec.aliases.items() if ask(n) == i)


def planned_context_memory(plans: dict[tuple[int, LayerMode], PlanInfo]) -> int:
    """Bytes of the one context scratch a session allocates for `plans` (`runtime/trt.py: ContextMemory`): the
    largest per-profile context memory their manifests record (`gdn-trt build` writes "context_memory"). Plans
    built before that field existed count 0 here and are named in the log; loading still sizes the scratch from
    the engines themselves."""
    sizes, unknown = [0], []
    for info in plans.values():
        recorded = info.versions.get("context_memory")
        if isinstance(recorded, list) and all(isinstance(x, int) for x in recorded):
            sizes += recorded
        else:
            unknown.append(str(info.manifest))
    if unknown:
        log.warning("%d plan manifests record no context memory (built before gdn-trt recorded it; rebuild to "
                    "count it in the memory plan): %s", len(unknown), ", ".join(unknown[:3]))
    return max(sizes)


def bind_inputs(call: LayerCall, spec: GraphSpec) -> dict[str, torch.Tensor]:
    """GraphSpec input name -> the runtime tensor bound to it (TensorRT binds by these names). Raises ValueError
    naming the input when the runtime has no tensor for it or its dtype differs from the graph's."""
    s = call.step
    acts = {"x": s.x, "residual": s.residual, "streams": s.x, "ple_rows": s.ple_rows,
            "cu_seqlens": s.pack.cu_seqlens, "slots": s.pack.slots,
            "capture_at": getattr(call.extra, "at", None), "lora_idx": None if s.lora is None else s.lora.idx}
    out = {}
    for t in spec.inputs:
        if t.role in (Role.ACTIVATION, Role.INDEX):
            x = acts[t.name]
        elif t.role is Role.ADAPTER:  # lora_<target>_a / lora_<target>_b
            target, _, part = t.name[len("lora_"):].rpartition("_")
            w = None if s.lora is None else {k.value: v for k, v in s.lora.slots.items()}.get(target)
            x = None if w is None else getattr(w, part)
        else:  # <part>_pool from the layer state, <part>_stash / <part>_capture from the step's extra buffers
            part, _, _ = t.name.rpartition("_")
            x = getattr(call.state if t.role is Role.POOL else call.extra, part)
        if x is None or x.dtype != t.torch_dtype:
            raise ValueError(f"{spec.stem} input {t.name}: runtime tensor is "
                             f"{None if x is None else x.dtype}, the plan takes {t.dtype}")
        if t.role in (Role.ACTIVATION, Role.INDEX):
            x = x.contiguous()
        elif not x.is_contiguous():  # a copy would take the writes: buffers must be bound where they live
            raise ValueError(f"{spec.stem} buffer {t.name} is not contiguous")
        out[t.name] = x
    return out
