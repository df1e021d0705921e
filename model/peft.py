"""PEFT LoRA adapters on disk: reading them onto a model's GDN layers, merging them into a checkpoint, writing
synthetic ones.

An adapter directory holds `adapter_config.json` (`r`, `lora_alpha`, `target_modules`, `use_rslora`,
`rank_pattern`, `alpha_pattern`, ...) and `adapter_model.safetensors` with keys
`base_model.model.model[.language_model].layers.{i}.<module>.lora_A.weight` `[r, in]` and `.lora_B.weight`
`[out, r]`. `load_adapter(dir, cfg)` maps every tensor of a GDN layer onto the internal layout (`lora.py`) and
lists, without loading them, the tensors of modules that run outside gdn-trt (full-attention layers, MoE experts,
the LM head, a vision tower). Everything else is an error that names the tensor: a module that is not a LoRA
target we support, a target of another family, a shape that does not match the model, a missing half of a pair,
and the PEFT features the layer does not implement (DoRA, LoRA biases, fan_in_fan_out).

rank_pattern / alpha_pattern follow PEFT: a key matches a module name when the name ends with `.<key>` or equals
it (a regex; a leading `^` anchors it at the start of the name); the first matching key wins.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from .checkpoint import Checkpoint
from .config import Family, GdnConfig, preset
from .errors import GdnTrtError
from .lora import (MLP_TARGETS, Adapter, LoraTarget, LoraWeights, family_targets, internal_rows, merge_layer,
                   non_finite, rank_scale, sites)

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.(?P<part>lora_[AB])\.weight$")
_LAYER = re.compile(r"^(?:model\.language_model\.|model\.)?layers\.(?P<i>\d+)\.(?P<rest>.+)$")
# module names of Qwen checkpoints that exist but run outside gdn-trt (target_modules may name them)
_FOREIGN_NAMES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate", "shared_expert_gate", "lm_head", "embed_tokens"}
log = logging.getLogger("gdn_trt.model")


class AdapterError(GdnTrtError, ValueError):
    """An adapter that cannot be applied to this model (the message names the tensor or field and why), or, in the
    runtime, one that cannot be registered, bound or unregistered."""


@dataclass(frozen=True)
class PeftConfig:
    """The fields of `adapter_config.json` the mapping reads."""

    r: int
    lora_alpha: float
    target_modules: tuple[str, ...] | str
    use_rslora: bool = False
    rank_pattern: tuple[tuple[str, int], ...] = ()
    alpha_pattern: tuple[tuple[str, float], ...] = ()

    @staticmethod
    def read(path: Path) -> "PeftConfig":
        if not path.exists():
            raise AdapterError(f"{path.parent}: no {CONFIG} (expected a PEFT LoRA adapter directory)")
        d = json.loads(path.read_text())
        if d.get("peft_type", "LORA").upper() != "LORA":
            raise AdapterError(f"{path}: peft_type {d['peft_type']!r}; only LORA adapters are supported")
        for flag, what in (("use_dora", "DoRA (magnitude vectors)"), ("fan_in_fan_out", "fan_in_fan_out weights")):
            if d.get(flag):
                raise AdapterError(f"{path}: {flag} is set; {what} are not supported")
        if d.get("bias", "none") != "none":
            raise AdapterError(f"{path}: bias={d['bias']!r}; LoRA bias terms are not supported (bias='none')")
        missing = [k for k in ("r", "lora_alpha") if k not in d]
        if missing:
            raise AdapterError(f"{path}: missing {missing}")
        tm = d.get("target_modules") or ()
        return PeftConfig(int(d["r"]), float(d["lora_alpha"]), tm if isinstance(tm, str) else tuple(tm),
                          bool(d.get("use_rslora", False)), tuple((d.get("rank_pattern") or {}).items()),
                          tuple((d.get("alpha_pattern") or {}).items()))

    def rank(self, module: str) -> int:
        return int(_pattern(self.rank_pattern, module, self.r))

    def alpha(self, module: str) -> float:
        return float(_pattern(self.alpha_pattern, module, self.lora_alpha))


def _pattern(pattern: tuple[tuple[str, object], ...], module: str, default):
    for key, value in pattern:
        rx = key[1:] if key.startswith("^") else rf"(?:.*\.)?{key}"
        if re.fullmatch(rx, module):
            return value
    return default


def _check_targets(cfg: GdnConfig, pc: PeftConfig, where: Path) -> None:
    """target_modules (a list) names only modules a Qwen model has, and no GDN target of another family."""
    if isinstance(pc.target_modules, str):
        return  # a regex (or "all-linear"): the tensors decide, each checked below
    mine = {t.value for t in family_targets(cfg)}
    gdn = {t.value for t in LoraTarget}
    for full in pc.target_modules:
        name = full.rsplit(".", 1)[-1]  # PEFT matches list entries as module-name suffixes: "mlp.down_proj" too
        # MLP names are fine on any model: on MoE layers they name the experts' projections (run elsewhere)
        if name in mine or name in _FOREIGN_NAMES or name in {t.value for t in MLP_TARGETS}:
            continue
        if name in gdn:
            raise AdapterError(f"{where}: target {name!r} is not a projection of {cfg.family.value} GDN layers "
                               f"(they have {sorted(mine)})")
        raise AdapterError(f"{where}: unknown target module {name!r}; GDN targets of {cfg.family.value}: "
                           f"{sorted(mine)}")


def _classify(cfg: GdnConfig, module: str) -> tuple[int, LoraTarget] | str:
    """(layer, target) for a GDN-layer target, or the reason the module runs outside gdn-trt; AdapterError for a
    module of a GDN layer that is not a supported target."""
    m = _LAYER.match(module)
    if m is None:
        return "not a decoder layer (runs outside gdn-trt)"
    i, rest = int(m["i"]), m["rest"]
    if i >= cfg.num_layers:
        raise AdapterError(f"{module}: layer {i} does not exist ({cfg.name} has {cfg.num_layers} layers)")
    if i not in cfg.gdn_layer_ids:
        return f"layer {i} is {cfg.layer_types[i]} (runs outside gdn-trt)"
    where = sites(cfg, i)
    head, _, name = rest.partition(".")
    dense = name in {t.value for t in MLP_TARGETS}
    if head == "mlp" and not cfg.has_mlp(i):
        if dense:  # a MoE layer has mlp.experts.<e>.gate_proj, never mlp.gate_proj: another model's adapter
            raise AdapterError(f"{module}: a dense MLP projection, but layer {i} of {cfg.name} has no dense MLP")
        return f"layer {i} MLP is a MoE (runs outside gdn-trt)"
    if head in ("linear_attn", "mlp") and name in {t.value for t in LoraTarget}:
        t = LoraTarget(name)
        if t not in where:
            raise AdapterError(f"{module}: {cfg.family.value} GDN layer {i} has no {name}; its targets are "
                               f"{[s.value for s in where]}")
        return i, t
    raise AdapterError(f"{module}: not a LoRA target gdn-trt supports on GDN layer {i} (supported: "
                       f"{[t.module for t in where]})")


def load_adapter(path: str | Path, cfg: GdnConfig, name: str | None = None) -> Adapter:
    """Read a PEFT LoRA adapter directory and map it onto the GDN layers of `cfg` (module docstring)."""
    root = Path(path)
    pc = PeftConfig.read(root / CONFIG)
    _check_targets(cfg, pc, root / CONFIG)
    if not (root / WEIGHTS).exists():
        raise AdapterError(f"{root}: no {WEIGHTS}")
    pairs: dict[str, dict[str, str]] = {}
    skipped, layers = [], {}
    with safe_open(root / WEIGHTS, "pt") as f:
        for key in sorted(f.keys()):
            m = _KEY.match(key)
            module = m["module"] if m else key.removeprefix("base_model.model.")
            where = _classify(cfg, module) if m else _classify_other(cfg, module, key)
            if isinstance(where, str):
                skipped.append(key)
                continue
            pairs.setdefault(module, {})[m["part"]] = key
        for module, parts in pairs.items():
            i, t = _classify(cfg, module)
            w = _pair(cfg, pc, module, parts, f)
            layers.setdefault(i, {})[t] = LoraWeights(w[0], internal_rows(cfg, t, w[1]), w[2])
    if not layers:
        raise AdapterError(f"{root}: no LoRA tensor targets a GDN layer of {cfg.name}")
    if skipped:
        log.info("adapter %s: %d tensors of modules outside the GDN layers are not ours (e.g. %s)", root.name,
                 len(skipped), skipped[0])
    return Adapter(name or root.name, cfg.config_hash(), layers, tuple(skipped), str(root))


def _classify_other(cfg: GdnConfig, module: str, key: str) -> str:
    """A tensor that is not a lora_A/lora_B weight: skipped on modules outside gdn-trt, an error on a GDN layer."""
    m = _LAYER.match(module)
    if m is None or int(m["i"]) not in cfg.gdn_layer_ids:
        return "not a GDN layer (runs outside gdn-trt)"
    if m["rest"].startswith("mlp.") and not cfg.has_mlp(int(m["i"])):
        return "MoE (runs outside gdn-trt)"
    raise AdapterError(f"{key}: not a lora_A/lora_B weight; on a GDN layer only those are supported (no LoRA "
                       "biases, DoRA magnitudes or modules_to_save copies)")


def _pair(cfg: GdnConfig, pc: PeftConfig, module: str, parts: dict[str, str], f) -> tuple[Tensor, Tensor, float]:
    missing = [p for p in ("lora_A", "lora_B") if p not in parts]
    if missing:
        raise AdapterError(f"{module}: {missing[0]}.weight is missing (a LoRA target needs both lora_A and lora_B)")
    a, b = f.get_tensor(parts["lora_A"]), f.get_tensor(parts["lora_B"])
    i, t = _classify(cfg, module)
    s = sites(cfg, i)[t]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != s.in_dim or b.shape[0] != s.out_dim or a.shape[0] != b.shape[1]:
        raise AdapterError(f"{module}: lora_A {tuple(a.shape)} / lora_B {tuple(b.shape)} do not fit {cfg.name}: "
                           f"expected [r, {s.in_dim}] and [{s.out_dim}, r]")
    if not a.dtype.is_floating_point or not b.dtype.is_floating_point:
        raise AdapterError(f"{module}: LoRA weights must be floating point, got {a.dtype} / {b.dtype}")
    for part, x in (("lora_A", a), ("lora_B", b)):
        bad = non_finite(x)
        if bad is not None:
            raise AdapterError(f"{module}.{part}.weight is not finite ({bad}): a LoRA adapter with NaN or Inf "
                               "weights would turn every output of its sequences into NaN; fix the adapter")
    r = a.shape[0]
    if r < 1 or r != pc.rank(module):
        raise AdapterError(f"{module}: rank {r} in the tensors, {pc.rank(module)} in {CONFIG} (r / rank_pattern)")
    return a, b, rank_scale(pc.alpha(module), r, pc.use_rslora)


def merge_checkpoint(ck: Checkpoint, adapter: Adapter) -> Checkpoint:
    """The checkpoint with `adapter` merged into its GDN layers (W' = W + scale * B A); `ck` is not modified."""
    cfg = ck.config
    if adapter.config_hash != cfg.config_hash():
        raise AdapterError(f"adapter {adapter.name} was mapped onto config {adapter.config_hash}, the checkpoint is "
                           f"{cfg.name} ({cfg.config_hash()})")
    if ck.merged_adapter is not None:
        raise AdapterError(f"{ck.path}: adapter {ck.merged_adapter} is already merged; merge onto the base weights")
    missing = sorted(set(adapter.layers) - {lw.index for lw in ck.layers})
    if missing:
        raise AdapterError(f"adapter {adapter.name} targets layers {missing} the checkpoint does not hold")
    layers = [merge_layer(cfg, lw, adapter) for lw in ck.layers]
    return replace(ck, layers=layers, merged_adapter=adapter.digest())


# ---- synthetic adapters (tests, the demo, the benchmark) ----
@dataclass(frozen=True)
class SyntheticAdapter:
    """What `make_synthetic_adapter` writes.

    Args:
        targets: HF target names; () = every target of the family.
        r / alpha / use_rslora / rank_pattern / alpha_pattern: as in `adapter_config.json`.
        attention: also write q_proj / o_proj pairs on full-attention layers (modules outside gdn-trt).
        language_model: key prefix `model.language_model.` (True) or `model.` (False); None = the family's.
        std: scale of the random B (A is scaled by in^-1/2); B is not zero, unlike PEFT's initialisation.
    """

    targets: tuple[str, ...] = ()
    r: int = 4
    alpha: float = 8.0
    use_rslora: bool = False
    rank_pattern: tuple[tuple[str, int], ...] = ()
    alpha_pattern: tuple[tuple[str, float], ...] = ()
    attention: bool = False
    language_model: bool | None = None
    std: float = 0.25


def make_synthetic_adapter(name_or_cfg: str | GdnConfig, path: str | Path, spec: SyntheticAdapter = SyntheticAdapter(),
                           seed: int = 0) -> Path:
    """Write a deterministic random PEFT LoRA adapter for the GDN layers of a preset or config, in PEFT's layout
    (the family's key prefix: `model.` for Qwen3-Next, `model.language_model.` for the others)."""
    cfg = preset(name_or_cfg) if isinstance(name_or_cfg, str) else name_or_cfg
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    pc = PeftConfig(spec.r, spec.alpha, spec.targets or tuple(t.value for t in family_targets(cfg)), spec.use_rslora,
                    spec.rank_pattern, spec.alpha_pattern)
    lm = spec.language_model if spec.language_model is not None else cfg.family is not Family.QWEN3_NEXT
    prefix = "base_model.model." + ("model.language_model." if lm else "model.")
    tensors: dict[str, Tensor] = {}
    for i in cfg.gdn_layer_ids:
        for t, s in sites(cfg, i).items():
            if t.value in pc.target_modules:
                module = f"{prefix[len('base_model.model.'):]}layers.{i}.{t.module}"
                _pair_tensors(tensors, prefix + f"layers.{i}.{t.module}", (pc.rank(module), s.in_dim, s.out_dim),
                              spec.std, gen)
    if spec.attention:
        C = cfg.hidden_size
        for i in (i for i, lt in enumerate(cfg.layer_types) if lt != "linear_attention"):
            for proj in ("q_proj", "o_proj"):
                _pair_tensors(tensors, prefix + f"layers.{i}.self_attn.{proj}", (spec.r, C, C), spec.std, gen)
    targets = list(pc.target_modules) + (["q_proj", "o_proj"] if spec.attention else [])
    (root / CONFIG).write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": cfg.name, "r": spec.r,
        "lora_alpha": spec.alpha, "target_modules": targets, "use_rslora": spec.use_rslora,
        "rank_pattern": dict(spec.rank_pattern), "alpha_pattern": dict(spec.alpha_pattern), "bias": "none",
        "use_dora": False, "fan_in_fan_out": False, "lora_dropout": 0.0}, indent=2))
    save_file(tensors, root / WEIGHTS, metadata={"format": "pt"})
    return root


def _pair_tensors(out: dict[str, Tensor], stem: str, dims: tuple[int, int, int], std: float,
                  gen: torch.Generator) -> None:
    r, n_in, n_out = dims
    out[stem + ".lora_A.weight"] = (torch.randn(r, n_in, generator=gen) * n_in ** -0.5).contiguous()
    out[stem + ".lora_B.weight"] = (torch.randn(n_out, r, generator=gen) * std).contiguous()

