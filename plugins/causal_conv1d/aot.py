"""The causal conv's kernels in TensorRT's AOT parameter order, and their selection (`plan`).

Wrappers as in `gated_delta_rule/aot.py`: inputs, int32 scalars, outputs, constexprs; each calls the kernel of
`triton.py` with x's and the weight's dense row strides (D and W) as constants and an aliased buffer through its
output pointer. The attributes `dilation` and `activation` are constexprs: one compiled kernel per value (TensorRT
does not serialise an AOT plugin's attributes; they are read when the engine is built). The prefill op is two
plugins (`spec.AOT_CHAINS`): `conv_chunk_kernel` writes y for the tokens whose taps lie inside x (`y_part`), then
`conv_state_kernel` writes the first (W-1)*dilation tokens of each sequence into the same buffer (`y`, aliased to
`y_part`), the capture and the final window.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..aot_plan import KernelPlan, add, cdiv, pointer_signature, static
from ..spec import CONV_PREFILL_CHUNK, CONV_PREFILL_STATE, CONV_UPDATE, CONV_UPDATE_STASH, Activation, OpSpec
from .triton import TUNING, conv_chunk_kernel, conv_state_kernel, conv_update_kernel


@triton.jit
def conv_update_aot(x, weight, cu_seqlens, slots, conv_pool, y, conv_pool_out,
                    D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr, STATE_LEN: tl.constexpr, ACT: tl.constexpr,
                    BD: tl.constexpr, BS: tl.constexpr, BW: tl.constexpr, WTILE: tl.constexpr):
    conv_update_kernel(x, weight, y, conv_pool_out, conv_pool_out, cu_seqlens, slots, D, W, D, W, DIL, STATE_LEN, ACT,
                       BD, BS, BW, False, WTILE)


@triton.jit
def conv_update_stash_aot(x, weight, cu_seqlens, slots, conv_pool, conv_stash, y, conv_stash_out,
                          D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr, STATE_LEN: tl.constexpr,
                          ACT: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr, BW: tl.constexpr,
                          WTILE: tl.constexpr):
    conv_update_kernel(x, weight, y, conv_pool, conv_stash_out, cu_seqlens, slots, D, W, D, W, DIL, STATE_LEN, ACT,
                       BD, BS, BW, True, WTILE)


@triton.jit
def conv_prefill_chunk_aot(x, weight, cu_seqlens, slots, N, y_part,
                           D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr, STATE_LEN: tl.constexpr,
                           ACT: tl.constexpr, BD: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr):
    conv_chunk_kernel(x, weight, y_part, cu_seqlens, slots, N, D, W, D, W, DIL, STATE_LEN, ACT, BD, BT, BN)


@triton.jit
def conv_prefill_state_aot(x, weight, y_part, cu_seqlens, slots, capture_at, conv_pool, conv_capture, y,
                           conv_pool_out, conv_capture_out, D: tl.constexpr, W: tl.constexpr, DIL: tl.constexpr,
                           STATE_LEN: tl.constexpr, ACT: tl.constexpr, BD: tl.constexpr, BS: tl.constexpr):
    conv_state_kernel(x, weight, y, conv_pool_out, conv_capture_out, cu_seqlens, slots, capture_at, D, W, D, W, DIL,
                      STATE_LEN, ACT, BD, BS)


_WRAPPERS = {CONV_UPDATE: conv_update_aot, CONV_UPDATE_STASH: conv_update_stash_aot,
             CONV_PREFILL_CHUNK: conv_prefill_chunk_aot, CONV_PREFILL_STATE: conv_prefill_state_aot}


def plan(spec: OpSpec, shapes: dict, dtypes: dict[str, str], attrs: dict[str, int]) -> KernelPlan:
    """The launch of plugin `spec` (see `aot.aot_kernel` for the arguments)."""
    T, N = shapes["x"][0], shapes["slots"][0]
    D, W = static(shapes["weight"][0]), static(shapes["weight"][1])
    if D is None or W is None:
        raise ValueError(f"{spec.name}: the conv weight must have a static shape, got {shapes['weight']}")
    dil, act = attrs["dilation"], attrs["activation"]
    if dil < 1 or act not in (Activation.NONE, Activation.SILU):
        raise ValueError(f"{spec.name}: dilation must be >= 1 and activation {Activation.NONE} or {Activation.SILU}, "
                         f"got {dil}, {act}")
    meta = dict(D=D, W=W, DIL=dil, STATE_LEN=(W - 1) * dil, ACT=int(act == Activation.SILU))
    sig = pointer_signature(spec.inputs, dtypes)
    outs = pointer_signature(spec.outputs, dtypes)
    fn = _WRAPPERS[spec]
    BS = triton.next_power_of_2((W - 1) * dil)
    if spec in (CONV_UPDATE, CONV_UPDATE_STASH):
        BD = min(TUNING.update_bd, triton.next_power_of_2(D))
        meta.update(BD=BD, BS=BS, BW=triton.next_power_of_2(W), WTILE=TUNING.update_wtile)
        return KernelPlan(fn, tuple(sig + outs), tuple(meta.items()), TUNING.update_warps, 3, (cdiv(D, BD), N, 1))
    if spec is CONV_PREFILL_CHUNK:
        BD, BT, n = min(TUNING.chunk_bd, triton.next_power_of_2(D)), TUNING.chunk_bt, static(N)
        if n is not None and n > attrs["max_seqs"]:
            raise ValueError(f"{spec.name}: N = {n} exceeds the node's max_seqs = {attrs['max_seqs']}")
        meta.update(BD=BD, BT=BT, BN=max(2, triton.next_power_of_2(n if n is not None else attrs["max_seqs"])))
        return KernelPlan(fn, tuple(sig + [("N", "i32")] + outs), tuple(meta.items()), TUNING.chunk_warps, 3,
                          (cdiv(D, BD), add(cdiv(T, BT), N), 1), (N,))
    BD = min(TUNING.state_bd, triton.next_power_of_2(D))
    meta.update(BD=BD, BS=BS)
    return KernelPlan(fn, tuple(sig + outs), tuple(meta.items()), TUNING.state_warps, 3, (cdiv(D, BD), N, 1))
