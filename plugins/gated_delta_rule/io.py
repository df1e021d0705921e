"""Inputs of the GDN recurrence ops, shared by the reference, the Triton kernels and the torch ops, and `dispatch`:
how an op's named inputs map onto the entry points of a backend (the torch ops and the TensorRT plugins share it)."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from torch import Tensor

from ..packing import Capture, Packing, check_buffer
from ..spec import GDN_RECURRENT, GDN_RECURRENT_STASH, OpSpec


@dataclass(frozen=True)
class GdnInputs:
    """One packed step of the gated delta rule, before gating and normalisation (both happen inside the op).

    Args:
        q, k: [T, H, K] conv outputs (not yet L2-normalised).
        v: [T, HV, V]; value head j reads key head j // (HV / H).
        a, b: [T, HV] raw decay input and beta logit.
        A_log, dt_bias: [HV] (fp32 or wider): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    a: Tensor
    b: Tensor
    A_log: Tensor
    dt_bias: Tensor

    @property
    def num_tokens(self) -> int:
        return self.q.shape[0]

    @property
    def state_shape(self) -> tuple[int, int, int]:
        """[HV, K, V] of one state slot."""
        return (self.v.shape[1], self.q.shape[2], self.v.shape[2])

    def check(self, pack: Packing, ssm_pool: Tensor) -> None:
        """Shape and dtype checks; they read no tensor data, so they are safe under CUDA-graph capture."""
        if self.q.dim() != 3 or self.k.shape != self.q.shape:
            raise ValueError(f"q and k must both be [T, H, K], got {tuple(self.q.shape)}, {tuple(self.k.shape)}")
        T, H, K = self.q.shape
        if self.v.dim() != 3 or self.v.shape[0] != T:
            raise ValueError(f"v must be [T={T}, HV, V], got {tuple(self.v.shape)}")
        HV = self.v.shape[1]
        if HV % H:
            raise ValueError(f"value heads ({HV}) must be a multiple of key heads ({H})")
        for name, t in (("a", self.a), ("b", self.b)):
            check_buffer(name, t, (T, HV))
        for name, t in (("A_log", self.A_log), ("dt_bias", self.dt_bias)):
            check_buffer(name, t, (HV,))
        dt = self.q.dtype
        if any(t.dtype != dt for t in (self.k, self.v, self.a, self.b)):
            raise ValueError("q, k, v, a, b must share one dtype")
        pack.check_shapes(T)
        if ssm_pool.dim() != 4 or tuple(ssm_pool.shape[1:]) != self.state_shape:
            raise ValueError(f"ssm_pool must be [S, {HV}, {K}, {self.v.shape[2]}], got {tuple(ssm_pool.shape)}")
        if not ssm_pool.dtype.is_floating_point or ssm_pool.element_size() < 4:
            raise ValueError(f"ssm_pool must be fp32 (or fp64 in references), got {ssm_pool.dtype}")
        devs = {t.device for t in (self.q, self.k, self.v, self.a, self.b, self.A_log, self.dt_bias,
                                   pack.cu_seqlens, pack.slots, ssm_pool)}
        if len(devs) != 1:
            raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devs))}")


def dispatch(spec: OpSpec, m: ModuleType, t: dict[str, Tensor]) -> Tensor:
    """Run op `spec` with backend `m` (`naive` or `triton`) on its inputs by name (`spec.inputs`): the entry point
    writes the buffers in place and returns o `[T, HV, V]`."""
    x = GdnInputs(t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"])
    pack = Packing(t["cu_seqlens"], t["slots"])
    if spec is GDN_RECURRENT:
        return m.recurrent(x, pack, t["ssm_pool"])
    if spec is GDN_RECURRENT_STASH:
        return m.recurrent_stash(x, pack, t["ssm_pool"], t["ssm_stash"])
    return m.chunked(x, pack, t["ssm_pool"], Capture(t["capture_at"], t["ssm_capture"]))
