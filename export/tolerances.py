"""The one tolerance table, keyed by (dtype of the computation under test, output kind), and its metric.

`gdn-trt compare` bounds each graph output with it (`bound`), and the test suite bounds every kernel, mode and
reference comparison with it (`tol`). Metric (FLA's `assert_close`): relative RMS error rms(got - ref) / rms(ref),
with the max-abs error reported beside it; a comparison passes when the relative RMS error is within the bound or
every element is within `floor` (outputs that are ~0 everywhere, where a relative metric is meaningless).
Output kinds of a graph: `conv` for conv windows (`conv_*`, `ple_conv_*` buffers) and otherwise the GDN algorithm of
the mode (`recurrent` for decode and verify graphs, `chunked` for prefill graphs): layer activations and ssm
buffers carry that recurrence's error. A bf16 or fp16 export is compared in its own dtype, with the `compare:*`
entries (activations, ssm state, conv buffers): two evaluations in that dtype, not one against float64.
Never loosen an entry without writing the reason next to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gdn_trt.model.dtypes import dtype_name
from gdn_trt.plugins.spec import GDN_CHUNKED

from .spec import GraphSpec, Role


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
    # fp32 activations against float64 (Triton kernels; compared backends are each within these)
    ("float32", "recurrent"): Tol(1e-5),
    # 3xTF32 / IEEE dots (Tuning.fp32_dot); the WY solve reorders sums over 64-token chunks
    ("float32", "chunked"): Tol(1e-4),
    ("float32", "conv"): Tol(1e-6),
    # bf16 activations, fp32 state, against float64: FLA's own test bounds (tests/ops/test_gdn.py: fused recurrent
    # vs naive recurrent < 0.002, chunk vs naive recurrent < 0.005, same metric)
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
    # `gdn-trt compare` of a bf16 or fp16 export: torch's layer and the exported graph (ONNX's reference evaluator
    # for bf16, which ONNX Runtime's CPU provider cannot run; ONNX Runtime for fp16), both in that dtype. They round
    # at different points (the reference evaluator also rounds inside composite ops such as Sigmoid and Softplus,
    # torch's CPU kernels once per op; sums are ordered differently), so they differ about as much as each differs
    # from float64, and a whole layer compounds the roundings of its GEMMs and glue. Measured on the CPU
    # (2026-12-03; synthetic tiny-3.5, tiny-4exp and tiny-next checkpoints, every mode of each layer variant,
    # 6 iterations, torch-cpu against the graph), worst relative RMS error: bf16 activations 1.65e-2 (median
    # 3.1e-3; each side against float64 up to 5.5e-2), ssm state 1.03e-2, conv buffers 6.6e-3; fp16 5.2e-3, 9.3e-4,
    # 6.2e-4. Each bound is about 2.4x its worst measurement (bf16: 10, 6 and 4 rounding steps of 2^-8); a
    # wrong weight scale of 10 % fails it (tests/test_compare_dtypes.py)
    ("bfloat16", "compare:activation"): Tol(4e-2),
    ("bfloat16", "compare:state"): Tol(2.5e-2),
    ("bfloat16", "compare:conv"): Tol(1.5e-2),
    ("float16", "compare:activation"): Tol(1.2e-2),
    ("float16", "compare:state"): Tol(2.5e-3),
    ("float16", "compare:conv"): Tol(1.5e-3),
}
HALF = ("bfloat16", "float16")


def tol(dtype: torch.dtype | str, output: str = "") -> Tol:
    """The bound of `output` computed in `dtype` (the dtype's general entry when the output has none)."""
    d = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return TOL.get((d, output)) or TOL[(d, "")]


def output_kind(spec: GraphSpec, output: str) -> str:
    """The conv bound holds for conv buffers written from the graph's own input; in a stack, the conv buffers of every
    layer after the first hold projections of an input that already went through the earlier layers' recurrence, so
    they carry that recurrence's error (measured: a tiny-3.5 3-layer fp32 prefill stack's third conv capture at
    1.39e-6 against the 1e-6 conv bound, CPU, 2026-12-03) and take the mode's GDN bound."""
    t = spec.output(output)
    if t.local.startswith(("conv_", "ple_conv_")) and t.layer in (None, spec.layer_ids[0]):
        return "conv"
    return "chunked" if spec.mode.spec.gdn is GDN_CHUNKED else "recurrent"


def compare_kind(spec: GraphSpec, output: str) -> str:
    """The `compare:*` entry of a half-precision graph's output: its activations, ssm state or conv buffers (in a
    stack, the conv buffers after the first layer take the state entry, as `output_kind` gives them the GDN bound)."""
    if spec.output(output).role is Role.ACTIVATION:
        return "compare:activation"
    return "compare:conv" if output_kind(spec, output) == "conv" else "compare:state"


def bound(spec: GraphSpec, output: str) -> Tol:
    """The bound `gdn-trt compare` holds `output` of `spec`'s graph to (module docstring)."""
    kind = compare_kind(spec, output) if spec.act_dtype in HALF else output_kind(spec, output)
    key = (spec.act_dtype, kind)
    if key not in TOL:
        raise KeyError(f"no compare tolerance for {key}; the table has {sorted(TOL)}")
    return TOL[key]


def _f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):  # bf16 has no numpy form: widen on the torch side
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def errors(ref, got) -> tuple[float, float]:
    """(relative RMS error, max-abs error) of numpy arrays or torch tensors, in float64."""
    r, g = _f64(ref), _f64(got)
    if r.size == 0:
        return 0.0, 0.0
    diff = g - r
    rms_ref = float(np.sqrt(np.mean(r * r)))
    rms_diff = float(np.sqrt(np.mean(diff * diff)))
    rel = rms_diff / rms_ref if rms_ref > 0 else (0.0 if rms_diff == 0 else float("inf"))
    return rel, float(np.max(np.abs(diff)))


def within(tol: Tol, rel: float, max_abs: float) -> bool:
    return rel <= tol.rel_rms or max_abs <= tol.floor
