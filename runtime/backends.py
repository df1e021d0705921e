"""Engines: one interface over the PyTorch layer modes (`TorchEngine`) and TensorRT plans (`TrtEngine`).

An engine runs one GDN layer in one `LayerMode` on the packed layout: `run(call, stream)` takes the step's
activations, the layer's pools and the stash or capture buffers (`LayerCall`), writes the buffers in place and
returns the activations (`StepOutput`). The runtime owns every buffer; engines own none.

Plan manifests (`find_plans`): `gdn-trt build` writes, per (layer, mode), a plan and a manifest holding the config
hash and the `GraphSpec` it was built from (DESIGN §5). The runtime trusts nothing else: every manifest under
`engines_dir` is read, the ones of this model's config are indexed by (layer, mode), and a plan whose manifest
names another config, another activation dtype or a layer the model does not have is an error that names the file
and the mismatch (a plan built for another config must never run silently). No tensorrt import here, so these
checks run anywhere.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from ..export.spec import GraphSpec, Role
from ..model.config import GdnConfig
from ..model.layer import GdnLayer
from ..model.lora import LoraLimits
from ..model.modes import LayerMode
from ..model.state import LayerState, StateCapture, StateStash, StepInput, StepOutput
from .plan_files import PlanMismatchError, check_digests, plan_of, read_manifests

log = logging.getLogger("gdn_trt.runtime")


@dataclass
class LayerCall:
    """One layer, one step: `extra` is the stash (verify modes), the capture (prefill modes) or None (decode)."""

    mode: LayerMode
    step: StepInput
    state: LayerState
    extra: StateStash | StateCapture | None = None


class Engine(abc.ABC):
    """One GDN layer's executable form. `name` says which backend it is (logged with every choice)."""

    name: str
    layer_idx: int
    device: torch.device

    @abc.abstractmethod
    def modes(self) -> tuple[LayerMode, ...]:
        """The modes this engine can run."""

    @abc.abstractmethod
    def refuse(self, mode: LayerMode, seqs: int, tokens: int) -> str | None:
        """None when a step of `seqs` sequences and `tokens` tokens in `mode` is covered, else the reason."""

    @abc.abstractmethod
    def run(self, call: LayerCall, stream: torch.cuda.Stream | None) -> StepOutput:
        """Enqueue the step on `stream` (None on the CPU); buffers are written in place."""

    def capture_veto(self, mode: LayerMode) -> str | None:
        """Why a step of this engine in `mode` cannot be captured in a CUDA graph (None = it can)."""
        if self.device.type != "cuda":
            return f"{self.name} runs on {self.device.type}: CUDA graphs need a CUDA device"
        if mode.chunked:
            return "prefill token counts change every step: no static shape to capture"
        if mode.uses_stash:
            return "verify draft counts (0..K per sequence) change every step: no static shape to capture"
        return None


class TorchEngine(Engine):
    """The PyTorch layer (`GdnLayer.run`) on the CPU (reference ops) or CUDA (Triton kernels)."""

    def __init__(self, layer: GdnLayer, device: torch.device):
        self.layer, self.layer_idx, self.device = layer, layer.index, torch.device(device)
        self.name = f"torch-{self.device.type}"

    def modes(self) -> tuple[LayerMode, ...]:
        return tuple(LayerMode)

    def refuse(self, mode: LayerMode, seqs: int, tokens: int) -> str | None:
        if mode.single_sequence and seqs != 1:
            return f"{mode.value} takes one sequence, the step has {seqs}"
        if mode.one_token_per_sequence and tokens != seqs:
            return f"{mode.value} takes one token per sequence ({tokens} tokens, {seqs} sequences)"
        return None

    def run(self, call: LayerCall, stream: torch.cuda.Stream | None) -> StepOutput:
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx, torch.no_grad():
            return self.layer.run(call.mode, call.step, call.state, call.extra)[0]


BACKENDS = ("auto", "torch", "trt")


@dataclass(frozen=True)
class PlanMatch:
    """What a session's plans must have been built for besides config and dtype: the same LoRA adapter slots
    (graph inputs of fixed shape) and the same merged adapter (digest; None = base weights)."""

    lora: LoraLimits | None = None
    merged_adapter: str | None = None


def trt_unavailable(device: torch.device, engines_dir: str | None) -> str | None:
    """Why TensorRT engines cannot serve this session (None = they can)."""
    if device.type != "cuda":
        return f"TensorRT needs a CUDA device, the session runs on {device.type}"
    if engines_dir is None:
        return "no engines_dir given"
    try:
        import tensorrt  # noqa: F401
    except ImportError as e:
        return f"tensorrt does not import ({e}); install it with pip install 'gdn-trt[trt]'"
    return None


def build_engines(backend: str, layers: list[GdnLayer], engines_dir: str | None, device: torch.device,
                  pool_rows: int, match: PlanMatch = PlanMatch()) -> list[list[Engine]]:
    """Per layer, the candidate engines in preference order. 'torch': the PyTorch modes; 'trt': the plans of
    `engines_dir` only (an error when TensorRT cannot serve); 'auto': the plans when TensorRT can serve, with the
    PyTorch modes behind them for what the plans' profiles do not cover (each such choice is logged)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    torch_engines: list[list[Engine]] = [[TorchEngine(layer, device)] for layer in layers]
    if backend == "torch":
        return torch_engines
    why = trt_unavailable(device, engines_dir)
    if why is not None:
        if backend == "trt":
            raise RuntimeError(f"backend='trt' cannot run: {why}")
        log.info("backend auto -> torch-%s: %s", device.type, why)
        return torch_engines
    from .trt import load_trt_engines  # imports tensorrt

    act = str(layers[0].dtype).replace("torch.", "")
    trt_engines = load_trt_engines(layers[0].cfg, engines_dir, device, act, pool_rows, match)
    if backend == "trt":
        return [[e] for e in trt_engines]
    log.info("backend auto -> trt from %s (torch-%s behind it for steps the profiles do not cover)",
             engines_dir, device.type)
    return [[t, *te] for t, te in zip(trt_engines, torch_engines)]


# ---- plan manifests (no tensorrt import: these checks run anywhere) ----
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
