"""The fused decode launch (`gated_delta_rule.triton.conv_recurrent`: the conv update and the recurrence in one
kernel) against the float64 references run in turn (`naive.conv_recurrent`), and against the two unfused launches
bit for bit: it computes the conv as the conv kernel does, rounds it to the activation dtype as that kernel stores it,
and runs the recurrent kernel's token step.

Each check poisons the kernel's output with NaN and asserts the output, every state row written (SSM and conv pool)
against the reference, that untouched pool rows are bit-identical, that padding rows are zero and that the
counters the last reader of a key head's history uses are zero again afterwards. `test_triton_interpret.py` runs
`check_conv_recurrent` at small shapes under TRITON_INTERPRET=1; the `gpu` tests here at the real shapes.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gdn_trt.export.tolerances import tol
from gdn_trt.plugins.causal_conv1d import naive as conv_naive
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule import naive, op
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Packing
from gdn_trt.plugins.samples import POOL_ROWS, Heads, Step, f64_inputs, make_inputs
from gdn_trt.plugins.spec import Activation

from .kernel_support import poisoned
from .test_triton_gdn import QWEN3_NEXT, QWEN35_27B, assert_pool
from .tolerances import assert_close


def _tri():
    from gdn_trt.plugins.gated_delta_rule import triton as tri

    return tri


def _conv_inputs(x: GdnInputs, width: int, act: int, rows: int, device: str) -> tuple[ConvParams, torch.Tensor]:
    T, H, K = x.q.shape
    D = 2 * H * K + x.v.shape[1] * x.v.shape[2]
    weight = (torch.randn(D, width, device=device) * 0.5).to(x.q.dtype)
    return ConvParams(weight, 1, act), torch.randn(rows, width - 1, D, device=device).to(x.q.dtype)


def _qkv(x: GdnInputs) -> torch.Tensor:
    """The conv's input [T, D] (q | k | v channels) of the fused op's inputs."""
    return torch.cat([x.q.flatten(1), x.k.flatten(1), x.v.flatten(1)], 1)


def _split(y: torch.Tensor, x: GdnInputs) -> GdnInputs:
    """The recurrence's inputs: the conv's output y [T, D] as q, k, v, with x's gates."""
    q, k, v = y.split([x.q[0].numel(), x.k[0].numel(), x.v[0].numel()], 1)
    return GdnInputs(q.unflatten(1, x.q.shape[1:]), k.unflatten(1, x.k.shape[1:]), v.unflatten(1, x.v.shape[1:]),
                     x.a, x.b, x.A_log, x.dt_bias)


def check_conv_recurrent(step: Step, heads: Heads, dtype: torch.dtype, device: str, width: int = 4,
                         act: int = Activation.SILU, **tuning) -> None:
    """One fused decode step (every sequence one token) against the float64 references and the unfused launches."""
    assert all(n == 1 for n in step.lengths), "a decode step: one token per sequence"
    rows = max(POOL_ROWS, max(step.slots) + 1)
    x, pack, pool = make_inputs(step, heads, dtype, device, rows)
    conv, conv_pool = _conv_inputs(x, width, act, rows, device)
    tri = _tri()
    tu = replace(tri.TUNING, **tuning)
    got_pool, got_conv = pool.clone(), conv_pool.clone()
    with poisoned(tri):
        o = tri.launch_conv_recurrent(x, conv, pack, got_conv, got_pool, tu)

    # the references in turn, in float64, the conv's output rounded to the activation dtype between them as the
    # conv op (and the fused kernel) hands it on
    ref_pool, ref_conv = pool.cpu().double(), conv_pool.cpu().double()
    cpu_pack = Packing(pack.cu_seqlens.cpu(), pack.slots.cpu())
    x64 = f64_inputs(x)
    y = conv_naive.update(_qkv(x64), ConvParams(conv.weight.cpu().double(), 1, act), cpu_pack, ref_conv)
    o_ref = naive.recurrent(_split(y.to(dtype).double(), x64), cpu_pack, ref_pool)
    live = [s for s in step.slots if s >= 0]
    bound = tol(dtype, "recurrent")
    assert_close("o", o_ref, o.cpu(), bound)
    assert (o[[i for i, s in enumerate(step.slots) if s < 0]] == 0).all(), "padding rows must be zero"
    assert_pool(pool, ref_pool, got_pool, live, bound)
    for s in range(rows):  # a window is a copy of history rows and x: exact in the activation dtype
        want = ref_conv[s].to(dtype) if s in live else conv_pool[s].cpu()
        assert torch.equal(got_conv[s].cpu(), want), f"conv_pool[{s}]"
    assert not tri._sync_counts(got_conv, heads.H).any(), "the counters must be zero after the launch"

    # the unfused launches on the same inputs: the conv update, then the recurrence on its output
    un_pool, un_conv = pool.clone(), conv_pool.clone()
    from gdn_trt.plugins.causal_conv1d import triton as conv_tri

    o_un = tri.launch_recurrent(_split(conv_tri.update(_qkv(x), conv, pack, un_conv), x), pack, un_pool, None, tu)
    for name, fused, unfused in (("o", o, o_un), ("ssm_pool", got_pool, un_pool), ("conv_pool", got_conv, un_conv)):
        assert torch.equal(fused, unfused), f"{name}: the fused launch differs from the unfused ones"


def test_bad_arguments_raise_before_anything_runs():
    step = Step((1, 1), (0, 1))
    x, pack, pool = make_inputs(step, Heads(2, 2, 8, 8), torch.float32, "cpu")
    conv, conv_pool = _conv_inputs(x, 4, Activation.SILU, POOL_ROWS, "cpu")
    pool0, conv0 = pool.clone(), conv_pool.clone()
    bad = {
        "dilation": (ConvParams(conv.weight, 2, Activation.SILU), conv_pool, pack),
        "weight": (ConvParams(conv.weight[:-1], 1, Activation.SILU), conv_pool, pack),
        "pool slots": (conv, conv_pool[:-1], pack),
        "pool dtype": (conv, conv_pool.double(), pack),
        "tokens": (conv, conv_pool, Packing.build([2], [0], "cpu")),
    }
    for name, (c, cp, pk) in bad.items():
        with pytest.raises(ValueError):
            op.conv_recurrent(x, c, pk, cp, pool)
        assert torch.equal(pool, pool0) and torch.equal(conv_pool, conv0), f"{name}: a refused call wrote state"


def test_cpu_entry_is_the_two_references_in_turn():
    # op.conv_recurrent on the CPU against the conv reference then the recurrence reference, called by hand
    step = Step((1, 1, 1), (2, -1, 0))
    x, pack, pool = make_inputs(step, Heads(2, 2, 8, 8), torch.float64, "cpu")
    conv, conv_pool = _conv_inputs(x, 4, Activation.SILU, POOL_ROWS, "cpu")
    p1, c1, p2, c2 = pool.clone(), conv_pool.clone(), pool.clone(), conv_pool.clone()
    o = op.conv_recurrent(x, conv, pack, c1, p1)
    o2 = naive.recurrent(_split(conv_naive.update(_qkv(x), conv, pack, c2), x), pack, p2)
    assert torch.equal(o, o2) and torch.equal(p1, p2) and torch.equal(c1, c2)
    assert not torch.equal(c1, conv_pool) and not torch.equal(p1, pool), "the step wrote no state"


DECODE_STEPS = [Step((1,), (3,)), Step((1,) * 8, (0, 5, -1, 7, 2, 1, 6, 4)),
                Step((1,) * 64, tuple(range(63, -1, -1)))]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("heads", [QWEN3_NEXT, QWEN35_27B], ids=str)
@pytest.mark.parametrize("step", DECODE_STEPS, ids=lambda s: f"N{len(s.lengths)}")
def test_fused_decode(step, heads, dtype):
    check_conv_recurrent(step, heads, dtype, "cuda")
