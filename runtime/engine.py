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
    """One GDN layer's executable form, or one run of consecutive GDN layers' (a stack engine: `layer_ids` lists
    them, `layer_idx` is the first). `name` says which backend it is (logged with every choice)."""

    name: str
    layer_idx: int
    device: torch.device
    tp_veto: str | None = None  # a tensor-parallel rank's capture veto (`runtime/tp.py`: gloo cannot be captured)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The layers one call runs, in order: (layer_idx,) for a per-layer engine."""
        return (self.layer_idx,)

    def run_layers(self, calls: tuple[LayerCall, ...], stream: torch.cuda.Stream | None) -> StepOutput:
        """One step through all of `layer_ids` in one enqueue: `calls[k]` is layer `layer_ids[k]`'s call, the first
        carries the activations (the others' `step.x` / `residual` are not read), each its layer's state, step
        buffers, PLE rows and adapter slots. Returns the last layer's output. A per-layer engine takes one call."""
        if len(calls) != 1:
            raise ValueError(f"{self.name} runs layer {self.layer_idx} alone, got {len(calls)} layer calls")
        return self.run(calls[0], stream)

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
        return self.tp_veto or mode.spec.capture_veto
