"""Shapes, inputs and the FLA 0.6.0 calls shared by bench/kernels.py and bench/variants.py.

Qwen3-Next GDN shapes (H=16, HV=32, K=V=128), bf16 activations, fp32 state; FLA gets the same raw inputs in its
[B, T, ...] layout with the gates, beta sigmoid and q/k L2 norm done in its kernels.
"""

from __future__ import annotations

import torch

from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Packing

H, HV, K, V = 16, 32, 128, 128
D_CONV, W_CONV = 2 * H * K + HV * V, 4
STATE_BYTES = HV * K * V * 4  # one sequence's fp32 state, 2 MiB
DT = torch.bfloat16
FLA = "FLA 0.6.0"
# nominal FLOPs per token and value head of the chunked WY algorithm (dense count, C = 64): K K^T, w, u, W S,
# K^T v_new, Q S, Q K^T, P v_new
C = 64
CHUNK_FLOP_PER_TOKEN = HV * (6 * K * V + 6 * C * K + 4 * C * V)


def gdn_inputs(T: int, seed: int) -> GdnInputs:
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)  # noqa: E731
    return GdnInputs(r(T, H, K).to(DT), r(T, H, K).to(DT), r(T, HV, V).to(DT), r(T, HV).to(DT), r(T, HV).to(DT),
                     torch.empty(HV, device="cuda").uniform_(-4, 1, generator=g), r(HV))


def packing(lengths: list[int]) -> Packing:
    return Packing.build(lengths, list(range(len(lengths))), "cuda")


def rel_rms(ref: torch.Tensor, got: torch.Tensor) -> float:
    r, d = ref.double(), got.double() - ref.double()
    return (d.pow(2).mean().sqrt() / r.pow(2).mean().sqrt()).item()


# ---- FLA calls (same inputs, FLA's layouts: [B, T, ...]) ----

def fla_recurrent(x: GdnInputs, B: int, h0: torch.Tensor):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    f = lambda t: t.reshape(B, t.shape[0] // B, *t.shape[1:])  # noqa: E731
    return fused_recurrent_gated_delta_rule(
        f(x.q), f(x.k), f(x.v), g=f(x.a), beta=f(x.b), scale=K ** -0.5, initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=x.A_log, dt_bias=x.dt_bias,
        use_beta_sigmoid_in_kernel=True)


def fla_chunk(x: GdnInputs, cu: torch.Tensor | None, h0: torch.Tensor):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule(
        x.q[None], x.k[None], x.v[None], g=x.a[None], beta=x.b[None], scale=K ** -0.5, initial_state=h0,
        output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True, cu_seqlens=cu,
        use_gate_in_kernel=True, A_log=x.A_log, dt_bias=x.dt_bias)
