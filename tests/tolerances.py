"""The one tolerance table, keyed by (dtype of the computation under test, output), and the comparison helper.

Metric (FLA's `assert_close`): relative RMS error rms(got - ref) / rms(ref); the max-abs error is reported beside it.
A comparison passes when the relative RMS error is within the bound, or when every element is within `floor`
(for outputs that are ~0 everywhere, where a relative metric is meaningless). Never loosen an entry without
writing the reason next to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tol:
    rel_rms: float
    floor: float = 1e-6


TOL: dict[tuple[str, str], Tol] = {
    # two float64 formulations of the same math (token loop vs chunked WY, mode vs mode): rounding only
    ("float64", ""): Tol(1e-11, 1e-12),
    # the same fp32 computation reordered (mode equivalences in fp32, CUDA graph vs eager uses exact equality)
    ("float32", ""): Tol(2e-5, 1e-6),
    # HF reference in float64: HF computes the recurrence and the gated norm in float32 internally (the bound)
    ("float64", "hf"): Tol(1e-5, 1e-7),
    # Triton kernels, fp32 inputs, against the float64 reference
    ("float32", "recurrent"): Tol(1e-5),
    ("float32", "chunked"): Tol(1e-4),  # 3xTF32 / IEEE dots (Tuning.fp32_dot); the WY solve reorders sums over 64-token chunks
    ("float32", "conv"): Tol(1e-6),
    # bf16 activations, fp32 state, against float64: FLA's published bounds (reference/gdn.md §5.5)
    ("bfloat16", "recurrent"): Tol(2e-3),
    ("bfloat16", "chunked"): Tol(5e-3),
    ("bfloat16", "conv"): Tol(5e-3),  # one bf16 rounding of the output (2^-8 relative, RMS well below)
    # fused glue kernels (plugins/glue) against float64. fp32: approximate rsqrt/exp/sqrt on the GPU (a few ulp)
    # and tree sums over up to 10^4 channels; the interpreter measured <= 1.1e-7 (CPU, 2026-12-03)
    ("float32", "glue"): Tol(5e-6),
    # bf16: the kernels round where the layer's torch code rounds, up to three roundings in a chain; the torch code
    # itself measured 1.7e-3 (one rounding) to 3.0e-3 (PLE gate, gated norm, hc mix) against float64
    ("bfloat16", "glue"): Tol(5e-3),
    # the whole layer with the fused glue against the same layer with the torch glue, bf16 activations: the same
    # roundings at the same points; an element differs where a sum order or an approximate rsqrt flips one bf16
    # ulp (2^-8), which the layer carries on. The bf16 bound of the chunked GDN kernels
    ("bfloat16", "layer"): Tol(5e-3),
}


def tol(dtype: torch.dtype | str, output: str = "") -> Tol:
    d = str(dtype).replace("torch.", "")
    return TOL.get((d, output)) or TOL[(d, "")]


def errors(ref: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """(relative RMS error, max-abs error), computed in float64."""
    r, g = ref.detach().double().cpu(), got.detach().double().cpu()
    if r.numel() == 0:
        return 0.0, 0.0
    diff = g - r
    rms_ref, rms_diff = r.pow(2).mean().sqrt().item(), diff.pow(2).mean().sqrt().item()
    if rms_ref == 0:
        return (0.0 if rms_diff == 0 else float("inf")), diff.abs().max().item()
    return rms_diff / rms_ref, diff.abs().max().item()


def assert_close(name: str, ref: torch.Tensor, got: torch.Tensor, bound: Tol) -> None:
    assert ref.shape == got.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values (unwritten output rows?)"
    rel, mx = errors(ref, got)
    assert rel <= bound.rel_rms or mx <= bound.floor, (
        f"{name}: relative RMS error {rel:.3e} > {bound.rel_rms:.1e} (max-abs {mx:.3e})")
