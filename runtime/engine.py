"""The engine interface: an engine runs one GDN layer in one `LayerMode` on the packed layout.

`run(call, stream)` takes the step's activations, the layer's pools and the stash or capture buffers (`LayerCall`),
writes the buffers in place and returns the activations (`StepOutput`). The runtime owns every buffer; engines own
none. `LayerCall.part` says how much of the layer: "layer" (the checkpoint's whole GDN decoder layer as the layer
modes define it: norms, mixer, dense MLP, hc, PLE) or "mixer" (the token mixer alone, for a host that owns the
norms and residuals around it; `parts()` lists what an engine can run). Implementations: `backends.TorchEngine`
(the PyTorch layer, both parts) and `trt.TrtEngine` (TensorRT plans of whole layers).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from gdn_trt.model.modes import LayerMode
from gdn_trt.model.state import LayerState, StateCapture, StateStash, StepInput, StepOutput


@dataclass
class LayerCall:
    """One layer, one step: `extra` is the stash (verify modes), the capture (prefill modes) or None (decode)."""

    mode: LayerMode
    step: StepInput
    state: LayerState
    extra: StateStash | StateCapture | None = None
    part: str = "layer"  # "layer" or "mixer" (Engine.parts)


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

    def parts(self) -> tuple[str, ...]:
        """What of the layer `run` can do: "layer" (always) and "mixer" where the engine runs the mixer alone
        (then `run` returns `StepOutput(mixer output)`)."""
        return ("layer",)

    def capture_veto(self, mode: LayerMode) -> str | None:
        """Why a step of this engine in `mode` cannot be captured in a CUDA graph (None = it can)."""
        if self.device.type != "cuda":
            return f"{self.name} runs on {self.device.type}: CUDA graphs need a CUDA device"
        return mode.spec.capture_veto
