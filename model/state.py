"""Typed per-layer state buffers: pools (one row per slot), verify stashes and prefill captures.

Their shapes come from `GdnConfig` (the one shape authority); the runtime allocates them, the layer reads and
writes them. The recurrent state is fp32 (fp64 in float64 reference runs); conv windows keep the activation dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gdn_trt.plugins.packing import Packing, compute_dtype

from .config import GdnConfig
from .lora import LoraInput


@dataclass(frozen=True)
class BufferSpec:
    """Dtype and device of a layer's buffers, from the activation dtype."""

    act_dtype: torch.dtype
    device: torch.device | str = "cpu"

    @property
    def ssm_dtype(self) -> torch.dtype:
        return compute_dtype(self.act_dtype)

    def new(self, rows: int, shape: tuple[int, ...], ssm: bool = False) -> Tensor:
        dtype = self.ssm_dtype if ssm else self.act_dtype
        return torch.zeros((rows, *shape), dtype=dtype, device=self.device)


@dataclass
class LayerState:
    """Pools of one layer: conv [S, W-1, conv_dim], ssm [S, HV, K, V], ple_conv [S, carry, n*C] (PLE layers)."""

    conv: Tensor
    ssm: Tensor
    ple_conv: Tensor | None = None

    @staticmethod
    def allocate(cfg: GdnConfig, layer_idx: int, slots: int, spec: BufferSpec) -> "LayerState":
        ple = spec.new(slots, cfg.ple_conv_state_shape) if cfg.has_ple(layer_idx) else None
        return LayerState(spec.new(slots, cfg.conv_state_shape), spec.new(slots, cfg.ssm_state_shape, ssm=True), ple)

    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(t for t in (self.conv, self.ssm, self.ple_conv) if t is not None)


@dataclass
class StateStash:
    """State after every token of a verify step, row t = token t: conv [T, ...], ssm [T, ...], ple_conv."""

    conv: Tensor
    ssm: Tensor
    ple_conv: Tensor | None = None

    @staticmethod
    def allocate(cfg: GdnConfig, layer_idx: int, tokens: int, spec: BufferSpec) -> "StateStash":
        s = LayerState.allocate(cfg, layer_idx, tokens, spec)
        return StateStash(s.conv, s.ssm, s.ple_conv)


@dataclass
class StateCapture:
    """Prefix snapshots of a prefill step: `at [N] int32` (tokens consumed, -1 = none) and, per sequence,
    the state as it stood after that many tokens: conv [N, ...], ssm [N, ...], ple_conv."""

    at: Tensor
    conv: Tensor
    ssm: Tensor
    ple_conv: Tensor | None = None

    @staticmethod
    def allocate(cfg: GdnConfig, layer_idx: int, at: Tensor, spec: BufferSpec) -> "StateCapture":
        s = LayerState.allocate(cfg, layer_idx, at.shape[0], spec)
        return StateCapture(at, s.conv, s.ssm, s.ple_conv)

    @staticmethod
    def none(cfg: GdnConfig, layer_idx: int, num_seqs: int, spec: BufferSpec) -> "StateCapture":
        at = torch.full((num_seqs,), -1, dtype=torch.int32, device=spec.device)
        return StateCapture.allocate(cfg, layer_idx, at, spec)


@dataclass
class StepInput:
    """Activations and packing of one step.

    Args:
        x: plain residual: the hidden delta [T, C] (the previous layer's output); hc: the streams [T, n*C].
        residual: plain residual only: the running residual [T, C] (zeros before the first layer).
        pack: cu_seqlens / slots of the T packed tokens.
        ple_rows: [T, heads, d_h] gathered n-gram table rows, on PLE layers only.
        lora: per-sequence LoRA adapters: a slot index per token and the slot weights (`model.lora.LoraInput`).
    """

    x: Tensor
    pack: Packing
    residual: Tensor | None = None
    ple_rows: Tensor | None = None
    lora: LoraInput | None = None


@dataclass
class StepOutput:
    """plain: (x = the sublayer output [T, C], residual [T, C]), HF hidden = x + residual; hc: x = streams."""

    x: Tensor
    residual: Tensor | None = None

    def hidden(self) -> Tensor:
        """The hidden state after the layer's last residual add (HF convention)."""
        return self.x if self.residual is None else self.x + self.residual
