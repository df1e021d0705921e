"""Parameters of the causal conv ops, shared by the reference, the Triton kernels and the torch ops, and `dispatch`:
how an op's named inputs and attributes map onto the entry points of a backend (the torch ops and the TensorRT
plugins share it)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from torch import Tensor

from ..packing import Capture, Packing
from ..spec import CONV_UPDATE, CONV_UPDATE_STASH, Activation, OpSpec


@dataclass(frozen=True)
class ConvParams:
    """Depthwise causal conv: `weight [D, W]` (column W-1 multiplies the current token), `dilation`, `activation`
    (`Activation.NONE` or `Activation.SILU`). A slot of state holds the last n = (W-1)*dilation pre-conv inputs
    as [n, D], oldest first (token-major: one row of D channels per history token)."""

    weight: Tensor
    dilation: int = 1
    activation: int = Activation.SILU

    @property
    def width(self) -> int:
        return self.weight.shape[1]

    @property
    def state_len(self) -> int:
        return (self.width - 1) * self.dilation

    def state_shape(self) -> tuple[int, int]:
        return (self.state_len, self.weight.shape[0])

    def check(self, x: Tensor, conv_pool: Tensor) -> None:
        """Shape and dtype checks (no tensor data read)."""
        if self.weight.dim() != 2:
            raise ValueError(f"conv weight must be [D, W], got {tuple(self.weight.shape)}")
        if self.dilation < 1 or self.width < 1:
            raise ValueError(f"dilation and kernel width must be >= 1, got {self.dilation}, {self.width}")
        if self.activation not in (Activation.NONE, Activation.SILU):
            raise ValueError(f"activation must be {Activation.NONE} (none) or {Activation.SILU} (silu)")
        if x.dim() != 2 or x.shape[1] != self.weight.shape[0]:
            raise ValueError(f"x must be [T, D={self.weight.shape[0]}], got {tuple(x.shape)}")
        if conv_pool.dim() != 3 or tuple(conv_pool.shape[1:]) != self.state_shape():
            raise ValueError(f"conv_pool must be [S, {self.state_len}, {self.weight.shape[0]}], "
                             f"got {tuple(conv_pool.shape)}")
        if conv_pool.dtype != x.dtype:
            raise ValueError(f"conv_pool ({conv_pool.dtype}) must have the activation dtype ({x.dtype})")


def dispatch(spec: OpSpec, m: ModuleType, t: dict[str, Tensor], attrs: dict) -> Tensor:
    """Run op `spec` with backend `m` (`naive` or `triton`) on its inputs by name (`spec.inputs`) and its int
    attributes (`spec.attrs`): the entry point writes the buffers in place and returns y `[T, D]`."""
    conv = ConvParams(t["weight"], int(attrs["dilation"]), int(attrs["activation"]))
    pack = Packing(t["cu_seqlens"], t["slots"])
    if spec is CONV_UPDATE:
        return m.update(t["x"], conv, pack, t["conv_pool"])
    if spec is CONV_UPDATE_STASH:
        return m.update_stash(t["x"], conv, pack, t["conv_pool"], t["conv_stash"])
    return m.prefill(t["x"], conv, pack, t["conv_pool"], Capture(t["capture_at"], t["conv_capture"]))
