"""Per-output tolerances of `gdn-trt compare`, from one table, and the metric they bound.

The metric and the values are those of the test suite's table (`tests/tolerances.py`, checked equal by
`tests/test_compare_tolerances.py`): relative RMS error rms(got - ref) / rms(ref), with the max-abs error reported
beside it; an output passes when its relative RMS error is within the bound or every element is within `floor`
(outputs that are ~0 everywhere). Keys: (activation dtype of the graph, output kind), where the kind is `conv` for
conv windows (`conv_*`, `ple_conv_*` buffers) and otherwise the GDN algorithm of the mode (`recurrent` for decode
and verify graphs, `chunked` for prefill graphs): layer activations and ssm buffers carry that recurrence's error.
Never loosen an entry without writing the reason next to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gdn_trt.plugins.spec import GDN_CHUNKED

from .spec import GraphSpec


@dataclass(frozen=True)
class Tol:
    rel_rms: float
    floor: float = 1e-6


TOL: dict[tuple[str, str], Tol] = {
    # fp32 activations: the kernels' bounds against float64 (the compared backends are each within them)
    ("float32", "recurrent"): Tol(1e-5),
    ("float32", "chunked"): Tol(1e-4),  # the WY solve reorders sums over 64-token chunks
    ("float32", "conv"): Tol(1e-6),
    # bf16 activations, fp32 state: FLA's published bounds (reference/gdn.md §5.5)
    ("bfloat16", "recurrent"): Tol(2e-3),
    ("bfloat16", "chunked"): Tol(5e-3),
    ("bfloat16", "conv"): Tol(5e-3),
}


def output_kind(spec: GraphSpec, output: str) -> str:
    if output.startswith(("conv_", "ple_conv_")):
        return "conv"
    return "chunked" if spec.mode.spec.gdn is GDN_CHUNKED else "recurrent"


def bound(spec: GraphSpec, output: str) -> Tol:
    key = (spec.act_dtype, output_kind(spec, output))
    if key not in TOL:
        raise KeyError(f"no compare tolerance for {key}; the table has {sorted(TOL)}")
    return TOL[key]


def errors(ref: np.ndarray, got: np.ndarray) -> tuple[float, float]:
    """(relative RMS error, max-abs error), in float64."""
    r, g = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
    if r.size == 0:
        return 0.0, 0.0
    diff = g - r
    rms_ref = float(np.sqrt(np.mean(r * r)))
    rms_diff = float(np.sqrt(np.mean(diff * diff)))
    rel = rms_diff / rms_ref if rms_ref > 0 else (0.0 if rms_diff == 0 else float("inf"))
    return rel, float(np.max(np.abs(diff)))


def within(tol: Tol, rel: float, max_abs: float) -> bool:
    return rel <= tol.rel_rms or max_abs <= tol.floor
