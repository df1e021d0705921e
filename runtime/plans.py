"""Plan manifests: which TensorRT plans under `engines_dir` belong to this model, and how a step binds to one.

`gdn-trt build` writes, per graph (one layer, or a stack's run of layers) and mode, a plan and a manifest holding
the config hash and the `GraphSpec` it was built from, and beside them the engine config (`config.json`). The
runtime trusts nothing else: every manifest under `engines_dir` is read, the ones of this model's config are indexed
by (layers, mode), and a plan whose manifest names another config, another activation dtype, layers the model does
not have as one run, or weights inside the plan is an error that names the file and the mismatch (a plan built for
another config must never run silently). No tensorrt import here, so these checks run anywhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from gdn_trt.export.engine_config import CONFIG_NAME, EngineConfigError, check_engine_config, read_engine_configs
from gdn_trt.export.spec import GraphSpec, Role, gdn_runs
from gdn_trt.model.config import GdnConfig
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.modes import LayerMode

from .engine import LayerCall
from .plan_files import PlanMismatchError, check_digests, plan_of, read_manifests

log = logging.getLogger("gdn_trt.runtime")


@dataclass(frozen=True)
class PlanMatch:
    """What a session's plans must have been built for besides config and dtype: the same LoRA adapter slots
    (graph inputs of fixed shape). `merged_adapter` (digest; None = base weights) is what the session's weights
    hold: the plans take the weights as inputs, so any plan of the config serves them (a merged adapter is a
    rebinding of the weights, not a rebuild or a refit); it is logged, not matched."""

    lora: LoraLimits | None = None
    merged_adapter: str | None = None




def _check_engine_configs(root: Path, cfg: GdnConfig, act_dtype: str) -> None:
    """Every engine config under `root` must describe this model (`check_engine_config`); a folder without one
    (plans built before gdn-trt wrote it) is logged."""
    try:
        configs = read_engine_configs(root)
    except EngineConfigError as e:
        raise PlanMismatchError(str(e)) from None
    if not configs:
        log.warning("engines_dir %s: no %s beside the plans (built before gdn-trt wrote one): nothing to "
                    "cross-check the model against; rebuild to get it", root, CONFIG_NAME)
    want_tp = None if cfg.tp_size == 1 else {"size": cfg.tp_size, "rank": cfg.tp_rank, "reduce": "host"}
    for path, d in configs:
        if d.get("tp") != want_tp:
            raise PlanMismatchError(f"{path}: {_holds(d.get('tp'))}; this session holds {_holds(want_tp)}: point "
                                    "engines_dir at the plans of its rank (gdn-trt export --tp N, build: "
                                    "<engines>/rank<r>)")
        if d.get("config_hash") != cfg.config_hash():
            raise PlanMismatchError(f"{path}: engine config of model {d.get('model')!r} (hash "
                                    f"{d.get('config_hash')}); this session runs {cfg.name!r} (hash "
                                    f"{cfg.config_hash()}): point engines_dir at this model's engines")
        try:
            check_engine_config(path, d, cfg, act_dtype)
        except EngineConfigError as e:
            raise PlanMismatchError(str(e)) from None


def _holds(tp: object) -> str:
    if not isinstance(tp, dict):
        return "the whole model (tp=1)"
    return f"rank {tp.get('rank')} of tp={tp.get('size')}"


def rank_dir(root: Path, cfg: GdnConfig) -> Path:
    """The plans folder of `cfg`'s tensor-parallel rank: `root/rank<r>` where `root` holds the ranks' folders
    (`gdn-trt build` of a `gdn-trt export --tp N`), else `root` itself."""
    sub = root / f"rank{cfg.tp_rank}"
    return sub if cfg.tp_size > 1 and sub.is_dir() else root


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
               ) -> dict[tuple[tuple[int, ...], LayerMode], PlanInfo]:
    """Every plan under `engines_dir` for `cfg`, by (layers, mode): `layers` is one layer, or the run of a stack
    plan. Raises `PlanMismatchError` when a manifest there names this model but another config hash or dtype,
    other LoRA slots than `match`, layers that are not one run of `gdn_runs`, a part plan of a rank's dense-MLP layer
    (`GraphSpec.part`: the TensorRT backend does not chain the two plans around the all-reduce yet), weights inside the
    plan (one copy per mode), a plan outside engines_dir, or a plan or graph whose sha256 differs from the recorded one
    (`plan_files.py`), or stack plans whose runs overlap; when the engine config beside the plans (`config.json`)
    describes another model (`engine_config.check_engine_config`) or another tensor-parallel rank (its `tp`, both
    named); and `FileNotFoundError` when none is found. A folder of `rank<r>` folders (`gdn-trt build` of an
    `export --tp N`) gives a rank's session its own. Files that are not plan manifests are listed in one warning,
    with the reason each was skipped."""
    root = Path(engines_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"engines_dir {root} does not exist (run gdn-trt export and gdn-trt build)")
    root = rank_dir(root, cfg)
    want, found, unchecked = cfg.config_hash(), {}, []
    _check_engine_configs(root, cfg, act_dtype)
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
        bad = [i for i in spec.layer_ids if i not in cfg.gdn_layer_ids]
        if bad:
            raise PlanMismatchError(f"{path}: layer {bad[0]} is not a GDN layer of {cfg.name}")
        if spec.is_stack and gdn_runs(cfg, spec.layer_ids) != [spec.layer_ids]:
            raise PlanMismatchError(f"{path}: a stack plan of layers {list(spec.layer_ids)}, which are not one run "
                                    f"of consecutive GDN layers of {cfg.name} (runs: {gdn_runs(cfg)})")
        if spec.limits.lora != match.lora:
            raise PlanMismatchError(f"{path}: built with LoRA slots {spec.limits.lora}; the session has "
                                    f"{match.lora} (re-export with matching --lora-slots/--lora-rank/--lora-targets)")
        if spec.part is not None:
            raise PlanMismatchError(f"{path}: the {spec.part.value} part plan of dense-MLP layer {spec.layer_idx} "
                                    f"(rank {cfg.tp_rank} of tp={cfg.tp_size}): the TensorRT backend does not run a "
                                    "layer as two plans with the all-reduce between them yet (the missing piece: "
                                    "runtime/trt.py's engine running the mixer plan, the group's all-reduce, then the "
                                    "mlp plan); a host engine runs them, and a rank session runs these layers on the "
                                    "torch backend (no engines_dir)")
        if spec.weights_inside:
            raise PlanMismatchError(f"{path}: its weights are inside the plan (exported with --embed-weights, or "
                                    "before weights became graph inputs): every mode's plan would hold its own copy "
                                    "of the layer's weights; export again without --embed-weights and rebuild")
        plan = plan_of(root, path, m)
        why = check_digests(path, m, plan)
        if why is not None:
            unchecked.append(f"{path.name} ({why})")
        key = (spec.layer_ids, spec.mode)
        if key in found:
            raise PlanMismatchError(f"two plans for {spec.where} {key[1].value}: {found[key].plan} and {plan}")
        versions = {k: v for k, v in m.items() if k not in ("graph_spec", "spec")}
        found[key] = PlanInfo(plan, path, spec, versions)
    if not found:
        raise FileNotFoundError(f"no plan manifests under {root} (run gdn-trt build)")
    stacks = sorted({ids for ids, _ in found if len(ids) > 1})
    for a, b in zip(stacks, stacks[1:]):
        if set(a) & set(b):
            raise PlanMismatchError(f"{root}: stack plans of layers {list(a)} and {list(b)} overlap (plans of two "
                                    "exports?): keep the plans of one export")
    if unchecked:
        log.info("engines_dir %s: onnx_sha256 not checked for %d plans whose graphs are not beside them: %s", root,
                 len(unchecked), "; ".join(unchecked[:4]) + (" ..." if len(unchecked) > 4 else ""))
    return found


def check_weights(spec: GraphSpec, weights: dict[int, dict[str, torch.Tensor]], path: Path) -> None:
    """Raise `PlanMismatchError` naming every weight input of `spec` that the layers' one copy does not hold with
    its name, shape and dtype, and every layer weight the plan would not read (a plan of another layout)."""
    problems = []
    for i in spec.layer_ids:
        want = {t.local: t for t in spec.inputs if t.role is Role.WEIGHT and (t.layer if t.layer is not None
                                                                               else spec.layer_idx) == i}
        have = weights.get(i, {})
        problems += [f"layer {i} holds no {n}" for n in want if n not in have]
        problems += [f"layer {i} {n} is {tuple(have[n].shape)} {have[n].dtype}, the plan takes {t.dims} {t.dtype}"
                     for n, t in want.items() if n in have and (tuple(have[n].shape) != t.dims
                                                                or have[n].dtype != t.torch_dtype)]
        problems += [f"layer {i} {n} is not a plan input" for n in have if n not in want]
    if problems:
        raise PlanMismatchError(f"{path}: its weight inputs do not match the layers' weights: "
                                + "; ".join(problems[:6]) + (" ..." if len(problems) > 6 else ""))


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


def planned_context_memory(plans: dict[tuple[tuple[int, ...], LayerMode], PlanInfo]) -> int:
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


def bind_inputs(calls: LayerCall | tuple[LayerCall, ...], spec: GraphSpec,
                weights: dict[int, dict[str, torch.Tensor]] | None = None) -> dict[str, torch.Tensor]:
    """GraphSpec input name -> the runtime tensor bound to it (TensorRT binds by these names). `calls`: one per
    layer of the spec (`spec.layer_ids`): the first carries the activations and packing every layer shares, each
    its layer's PLE rows, adapter slots, pools and step buffers; `weights`: layer -> `GdnLayer.weights()`, the one
    copy of each layer's weights, bound to the weight inputs. Raises ValueError naming the input when the runtime
    has no tensor for it or its dtype (a weight's: or shape) differs from the graph's."""
    calls = (calls,) if isinstance(calls, LayerCall) else tuple(calls)
    if len(calls) != len(spec.layer_ids):
        raise ValueError(f"{spec.stem} runs {spec.where}: {len(calls)} layer calls given")
    by_layer = dict(zip(spec.layer_ids, calls))
    first = calls[0]
    s = first.step
    acts = {"x": s.x, "residual": s.residual, "streams": s.x, "cu_seqlens": s.pack.cu_seqlens,
            "slots": s.pack.slots, "capture_at": getattr(first.extra, "at", None),
            "lora_idx": None if s.lora is None else s.lora.idx}
    out = {}
    for t in spec.inputs:
        call, name = by_layer.get(t.layer, first), t.local  # layer None: a manifest from before stack graphs
        if name == "ple_rows":
            x = call.step.ple_rows
        elif t.role in (Role.ACTIVATION, Role.INDEX):
            x = acts[name]
        elif t.role is Role.ADAPTER:  # lora_<target>_a / lora_<target>_b
            target, _, part = name[len("lora_"):].rpartition("_")
            lora = call.step.lora
            w = None if lora is None else {k.value: v for k, v in lora.slots.items()}.get(target)
            x = None if w is None else getattr(w, part)
        elif t.role is Role.WEIGHT:
            x = (weights or {}).get(t.layer if t.layer is not None else spec.layer_idx, {}).get(name)
            if x is not None and tuple(x.shape) != t.dims:
                raise ValueError(f"{spec.stem} weight {t.name}: the layer holds {tuple(x.shape)}, the plan takes "
                                 f"{t.dims}")
        else:  # <part>_pool from the layer state, <part>_stash / <part>_capture from the step's extra buffers
            part, _, _ = name.rpartition("_")
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
