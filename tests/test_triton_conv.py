"""Triton kernels of the causal conv with state against the float64 reference (`plugins/causal_conv1d/naive.py`).

Same structure as test_triton_gdn.py: device-agnostic checks (outputs poisoned with NaN; y, every pool row, stash
row and capture row asserted; untouched rows bit-identical or still NaN), called at real shapes on the GPU and at
small shapes on the CPU by test_triton_interpret.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from torch import Tensor

from gdn_trt.export.tolerances import tol
from gdn_trt.plugins.causal_conv1d import naive
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.packing import Capture, Packing
from gdn_trt.plugins.samples import Step
from gdn_trt.plugins.spec import Activation

from .kernel_support import poisoned
from .tolerances import assert_close

POOL_ROWS = 8


@dataclass(frozen=True)
class Conv:
    D: int
    W: int = 4
    dilation: int = 1
    activation: int = Activation.SILU

    def __str__(self) -> str:
        return f"D{self.D}W{self.W}d{self.dilation}{'silu' if self.activation else 'id'}"


GDN_CONV = Conv(8192)  # Qwen3-Next: 2*16*128 + 32*128 channels
PLE_CONV = Conv(4 * 2048, dilation=3)  # Qwen4-Exp PLE conv: n*C channels, dilation = ngram size


def make_inputs(step: Step, conv: Conv, dtype: torch.dtype, device: str
                ) -> tuple[Tensor, ConvParams, Packing, Tensor]:
    """x is a column slice of a wider projection (a strided view), as the layer passes it."""
    T = sum(step.lengths)
    x = torch.randn(T, conv.D + 5, device=device).to(dtype)[:, 2:2 + conv.D]
    params = ConvParams((torch.randn(conv.D, conv.W, device=device) * 0.5).to(dtype), conv.dilation, conv.activation)
    pool = torch.randn(POOL_ROWS, *params.state_shape(), device=device).to(dtype)
    return x, params, Packing.build(list(step.lengths), list(step.slots), device), pool


def _tri():
    from gdn_trt.plugins.causal_conv1d import triton as tri

    return tri


def _cpu(pack: Packing) -> Packing:
    return Packing(pack.cu_seqlens.cpu(), pack.slots.cpu())


def _f64(conv: ConvParams) -> ConvParams:
    return ConvParams(conv.weight.cpu().double(), conv.dilation, conv.activation)


def _dead_rows(step: Step) -> list[int]:
    cu = [0]
    for n in step.lengths:
        cu.append(cu[-1] + n)
    return [t for i, s in enumerate(step.slots) if s < 0 for t in range(cu[i], cu[i + 1])]


def assert_pool(pool0: Tensor, ref: Tensor, got: Tensor, step: Step, bound) -> None:
    written = [s for s, n in zip(step.slots, step.lengths) if s >= 0 and n > 0]
    got = got.cpu()
    for s in range(pool0.shape[0]):
        if s in written:
            # the window holds copied inputs: exact in any dtype
            assert torch.equal(got[s].double(), ref[s]), f"conv_pool[{s}] differs from the reference window"
        else:
            assert torch.equal(got[s], pool0[s].cpu()), f"conv_pool[{s}] was written but belongs to no live sequence"


def check_conv(step: Step, conv: Conv, dtype: torch.dtype, device: str, mode: str) -> None:
    """mode: 'update', 'update_stash' or 'prefill'."""
    x, params, pack, pool = make_inputs(step, conv, dtype, device)
    T, N, n = sum(step.lengths), len(step.lengths), params.state_len
    bound = tol(dtype, "conv")
    pool_ref, got_pool = pool.cpu().double(), pool.clone()
    tri = _tri()
    if mode == "update":
        y_ref = naive.update(x.cpu().double(), _f64(params), _cpu(pack), pool_ref)
        with poisoned(tri):
            y = tri.update(x, params, pack, got_pool)
        assert_pool(pool, pool_ref, got_pool, step, bound)
    elif mode == "update_stash":
        stash_ref = torch.full((T, n, conv.D), float("nan"), dtype=torch.float64)
        stash = torch.full((T, n, conv.D), float("nan"), device=device).to(dtype)
        y_ref = naive.update_stash(x.cpu().double(), _f64(params), _cpu(pack), pool_ref, stash_ref)
        with poisoned(tri):
            y = tri.update_stash(x, params, pack, got_pool, stash)
        assert torch.equal(got_pool, pool), "update_stash wrote the pool"
        assert torch.equal(stash.cpu().double().nan_to_num(7.0), stash_ref.nan_to_num(7.0)), \
            "conv_stash differs from the reference windows (or rows of skipped sequences were written)"
    else:
        at = torch.tensor(step.capture_at, dtype=torch.int32)
        cap_ref = torch.full((N, n, conv.D), float("nan"), dtype=torch.float64)
        cap = torch.full((N, n, conv.D), float("nan"), device=device).to(dtype)
        y_ref = naive.prefill(x.cpu().double(), _f64(params), _cpu(pack), pool_ref, Capture(at, cap_ref))
        with poisoned(tri):
            y = tri.prefill(x, params, pack, got_pool, Capture(at.to(device), cap))
        assert_pool(pool, pool_ref, got_pool, step, bound)
        assert torch.equal(cap.cpu().double().nan_to_num(7.0), cap_ref.nan_to_num(7.0)), \
            "conv_capture differs from the reference windows (or unrequested rows were written)"
    assert y.dtype == dtype and y.shape == (T, conv.D)
    assert (y[_dead_rows(step)] == 0).all(), "output rows of padding sequences must be zero"
    assert_close("y", y_ref, y.cpu(), bound)


# ---- GPU ----

DTYPES = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float32, id="fp32")]
ODD_CONV = [Conv(1000, W=3, dilation=2, activation=Activation.NONE), Conv(96, W=4, dilation=1)]
VARLEN = Step((1, 63, 65, 0, 1000, 130, 2), (0, 3, 6, 5, 1, -1, 2), (1, 10, 64, 0, 640, 7, -1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conv", [GDN_CONV, PLE_CONV, *ODD_CONV], ids=str)
def test_update(conv, dtype):
    slots = tuple(-1 if i == 5 else i for i in range(8))
    check_conv(Step((1,) * 8, slots), conv, dtype, "cuda", "update")


# the one-token update's variants that bench/kernels.py times beside the default (`Tuning`), so whichever the
# defaults take is tested at the same commit
UPDATE_VARIANTS = {"weight-gathers": dict(update_wtile=False), "bd256-w4": dict(update_bd=256, update_warps=4),
                   "bd512-w4": dict(update_bd=512, update_warps=4), "bd128-w2": dict(update_bd=128, update_warps=2)}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conv", [GDN_CONV, ODD_CONV[0]], ids=str)
@pytest.mark.parametrize("variant", list(UPDATE_VARIANTS))
def test_update_variants(variant, conv, dtype, monkeypatch):
    tri = _tri()
    monkeypatch.setattr(tri, "TUNING", replace(tri.TUNING, **UPDATE_VARIANTS[variant]))
    slots = tuple(-1 if i == 5 else i for i in range(8))
    check_conv(Step((1,) * 8, slots), conv, dtype, "cuda", "update")
    check_conv(Step((1, 3, 1, 2), (5, 1, 0, 7)), conv, dtype, "cuda", "update_stash")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conv", [GDN_CONV, PLE_CONV, *ODD_CONV], ids=str)
def test_update_stash(conv, dtype):
    check_conv(Step((4, 0, 3, 1, 4, 2), (5, 1, -1, 0, 7, 2)), conv, dtype, "cuda", "update_stash")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T", [1, 63, 65, 1000])
@pytest.mark.parametrize("conv", [GDN_CONV, PLE_CONV, *ODD_CONV], ids=str)
def test_prefill(conv, T, dtype):
    check_conv(Step((T,), (3,), (T // 2 if T > 1 else 1,)), conv, dtype, "cuda", "prefill")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("conv", [GDN_CONV, PLE_CONV, *ODD_CONV], ids=str)
def test_prefill_varlen(conv, dtype):
    check_conv(VARLEN, conv, dtype, "cuda", "prefill")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["update", "update_stash", "prefill"])
def test_cuda_graph(op):
    """Replay == eager bit for bit, also after cu_seqlens / slots / capture_at changed between replays."""
    from gdn_trt.plugins.causal_conv1d import op as conv_op
    from .test_triton_gdn import _graph_vs_eager

    steps = [Step((5, 0, 130, 64, 1), (2, 4, -1, 0, 6), (1, 0, 100, 64, -1)),
             Step((1, 70, 65, 3, 61), (-1, 3, 1, 5, 2), (-1, 64, 0, 3, 30))]
    x, params, pack, pool = make_inputs(steps[0], PLE_CONV, torch.bfloat16, "cuda")
    T, N, n = sum(steps[0].lengths), len(steps[0].lengths), params.state_len
    stash = torch.full((T, n, PLE_CONV.D), float("nan"), device="cuda").to(torch.bfloat16)
    cap = Capture(torch.tensor(steps[0].capture_at, dtype=torch.int32, device="cuda"),
                  torch.full((N, n, PLE_CONV.D), float("nan"), device="cuda").to(torch.bfloat16))
    run = {"update": lambda: conv_op.update(x, params, pack, pool)[0],
           "update_stash": lambda: conv_op.update_stash(x, params, pack, pool, stash)[0],
           "prefill": lambda: conv_op.prefill(x, params, pack, pool, cap)[0]}[op]
    new_values = []
    for step in steps:
        x2, _, pack2, _ = make_inputs(step, PLE_CONV, torch.bfloat16, "cuda")
        new_values.append([x2, pack2.cu_seqlens, pack2.slots,
                           torch.tensor(step.capture_at, dtype=torch.int32, device="cuda")])
    _graph_vs_eager(run, [x, pack.cu_seqlens, pack.slots, cap.at], [pool, stash, cap.buf], new_values)
