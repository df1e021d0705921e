"""Random op inputs shared by the kernel tests and the benchmarks: a packed step (`Step`), GDN head shapes
(`Heads`), GDN inputs as the layer passes them (`make_inputs`) and their float64 copy for the references
(`f64_inputs`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .gated_delta_rule.io import GdnInputs
from .packing import Packing

POOL_ROWS = 8


@dataclass(frozen=True)
class Step:
    """One packed step of a kernel test: token count and pool slot per sequence, optional capture points."""

    lengths: tuple[int, ...]
    slots: tuple[int, ...]
    capture_at: tuple[int, ...] = ()

    def __str__(self) -> str:
        return "L" + "-".join(map(str, self.lengths))


# lengths 1..1000 with capture points, an empty sequence and a padding one (slot -1): the varlen step of the GPU tests
VARLEN_STEP = Step((1, 63, 65, 0, 1000, 130, 64), (0, 3, 6, 5, 1, -1, 2), (1, 10, 64, 0, 640, 7, -1))


@dataclass(frozen=True)
class Heads:
    """H key heads of dim K, HV = G*H value heads of dim V."""

    H: int
    G: int
    K: int
    V: int

    @property
    def HV(self) -> int:
        return self.H * self.G

    def __str__(self) -> str:
        return f"H{self.H}G{self.G}K{self.K}V{self.V}"


def make_inputs(step: Step, heads: Heads, dtype: torch.dtype, device: str, pool_rows: int = POOL_ROWS,
                aligned: bool = False) -> tuple[GdnInputs, Packing, Tensor]:
    """Random inputs as the layer passes them: q, k, v, a, b are column slices of one projection (strided views).
    Decay rates span slow and fast heads (A_log in [-4, 1]) so both long memory and underflowing decays occur.
    The slices start 3 columns in (so no kernel may assume aligned rows), or with `aligned` 8 columns in and the
    projection's rows padded to 8 columns: 16-byte aligned 2-byte views, as a real layer's are and TMA needs.
    Returns (inputs, packing, ssm_pool [pool_rows, HV, K, V] fp32)."""
    T, (H, HV, K, V) = sum(step.lengths), (heads.H, heads.HV, heads.K, heads.V)
    widths = [H * K, H * K, HV * V, HV, HV]
    lead, width = (8, -(-(sum(widths) + 8) // 8) * 8) if aligned else (3, sum(widths) + 3)
    proj = torch.randn(T, width, device=device).to(dtype)
    q, k, v, a, b = torch.split(proj[:, lead:lead + sum(widths)], widths, dim=1)
    x = GdnInputs(q.unflatten(1, (H, K)), k.unflatten(1, (H, K)), v.unflatten(1, (HV, V)), a, b,
                  torch.empty(HV, device=device).uniform_(-4, 1), torch.randn(HV, device=device))
    pool = torch.randn(pool_rows, HV, K, V, device=device) * 0.5
    return x, Packing.build(list(step.lengths), list(step.slots), device), pool


def f64_inputs(x: GdnInputs) -> GdnInputs:
    """The inputs in float64 on the CPU (what the references take)."""
    return GdnInputs(*(t.detach().cpu().double() for t in (x.q, x.k, x.v, x.a, x.b, x.A_log, x.dt_bias)))
