"""Engine backends: `TorchEngine` (the PyTorch layer modes) and the factory that lines up, per layer, the candidate
engines of a session (`build_engines`): the PyTorch modes, the TensorRT plans of `engines_dir` (`trt.TrtEngine`,
imported only when TensorRT can serve), or both.
"""

from __future__ import annotations

import logging

import torch

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.state import StepOutput

from .engine import Engine, LayerCall
from .plans import PlanMatch, find_plans, planned_context_memory

log = logging.getLogger("gdn_trt.runtime")


class TorchEngine(Engine):
    """The PyTorch layer (`GdnLayer.run_impl`) on the CPU (reference ops) or CUDA (Triton kernels)."""

    def __init__(self, layer: GdnLayer, device: torch.device):
        self.layer, self.layer_idx, self.device = layer, layer.index, torch.device(device)
        self.name = f"torch-{self.device.type}"

    def modes(self) -> tuple[LayerMode, ...]:
        return tuple(LayerMode)

    def refuse(self, mode: LayerMode, seqs: int, tokens: int) -> str | None:
        return mode.refuse(seqs, tokens)

    def parts(self) -> tuple[str, ...]:
        return ("layer", "mixer")

    def run(self, call: LayerCall, stream: torch.cuda.Stream | None) -> StepOutput:
        # checked where the step opened (Session.begin_step); the session steps on the current stream
        with torch.no_grad():
            if stream is not None and stream != torch.cuda.current_stream(stream.device):
                with torch.cuda.stream(stream):
                    return self._run(call)
            return self._run(call)

    def _run(self, call: LayerCall) -> StepOutput:
        if call.part == "mixer":
            return StepOutput(self.layer.run_mixer(call.mode, call.step, call.state, call.extra))
        return self.layer.run_impl(call.mode, call.step, call.state, call.extra)[0]


BACKENDS = ("auto", "torch", "trt")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


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
    `engines_dir` only (an error when TensorRT cannot serve): a stack engine over the layer's run first where
    stack plans exist, then the layer's own plans; 'auto': the plans when TensorRT can serve, with the PyTorch
    modes behind them for what the plans' profiles do not cover (each such choice is logged). Every TensorRT plan
    binds the weights of `layers` (one copy per layer, shared with the PyTorch modes)."""
    _check_backend(backend)
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

    trt_engines = load_trt_engines(layers, engines_dir, pool_rows, match)
    if backend == "trt":
        return trt_engines
    log.info("backend auto -> trt from %s (torch-%s behind it for steps the profiles do not cover)",
             engines_dir, device.type)
    return [[*t, *te] for t, te in zip(trt_engines, torch_engines)]


def trt_context_budget(backend: str, engines_dir: str | None, device: torch.device, cfg: GdnConfig, act_dtype: str,
                       match: PlanMatch = PlanMatch()) -> int:
    """Bytes of TensorRT context memory a session will allocate (0 when its plans will not serve it): the row the
    memory budget adds for them (`budget(..., trt_context=...)`)."""
    _check_backend(backend)
    if backend == "torch" or trt_unavailable(device, engines_dir) is not None:
        return 0
    return planned_context_memory(find_plans(engines_dir, cfg, act_dtype, match))
