"""The one table of custom ops: names, argument order, attributes and aliasing.

`op.py` (torch.library schemas), `onnx.py` (ONNX node + function), `trt.py` (TensorRT plugin registration) and the
exporter all read these specs, so a plugin name, an argument order or an attribute can only change here.

Every op exists in two torch forms: the functional one (`<name>`, returns the updated buffers as new tensors; used
by export and by the ONNX function bodies) and the in-place one (`<name>_inplace`, writes the aliased buffers and
returns only the activations; used by eager runs and the runtime). TensorRT sees the functional signature with the
buffer outputs declared aliased to their inputs, which is the in-place behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "gdn_trt"  # ONNX domain, TensorRT plugin namespace, torch.library namespace (no dots: QDP rule)
PLUGIN_VERSION = "1"  # TensorRT QDP creators always report "1"


class Activation:
    """Conv activation, an int attribute because TensorRT plugin fields cannot be strings for QDPs."""

    NONE = 0
    SILU = 1


@dataclass(frozen=True)
class OpSpec:
    """One custom op. `aliases` maps each buffer output to the input it updates in place."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[str, ...] = ()  # int attributes (int32 in TensorRT plugin fields)
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def qualified(self) -> str:
        return f"{NAMESPACE}::{self.name}"

    @property
    def activations(self) -> tuple[str, ...]:
        """Outputs that are not buffer updates (returned by the in-place form)."""
        aliased = {o for o, _ in self.aliases}
        return tuple(o for o in self.outputs if o not in aliased)

    @property
    def mutated_inputs(self) -> tuple[str, ...]:
        return tuple(i for _, i in self.aliases)


_GDN_IN = ("q", "k", "v", "a", "b", "A_log", "dt_bias", "cu_seqlens", "slots", "ssm_pool")
_CONV_IN = ("x", "weight", "cu_seqlens", "slots", "conv_pool")
_CONV_ATTRS = ("dilation", "activation")

GDN_RECURRENT = OpSpec(
    "gated_delta_rule_recurrent", _GDN_IN, ("o", "ssm_pool_out"), aliases=(("ssm_pool_out", "ssm_pool"),))
GDN_RECURRENT_STASH = OpSpec(
    "gated_delta_rule_recurrent_stash", _GDN_IN + ("ssm_stash",), ("o", "ssm_stash_out"),
    aliases=(("ssm_stash_out", "ssm_stash"),))
GDN_CHUNKED = OpSpec(
    "gated_delta_rule_chunked", _GDN_IN + ("capture_at", "ssm_capture"), ("o", "ssm_pool_out", "ssm_capture_out"),
    aliases=(("ssm_pool_out", "ssm_pool"), ("ssm_capture_out", "ssm_capture")))
CONV_UPDATE = OpSpec(
    "causal_conv1d_update", _CONV_IN, ("y", "conv_pool_out"), _CONV_ATTRS, (("conv_pool_out", "conv_pool"),))
CONV_UPDATE_STASH = OpSpec(
    "causal_conv1d_update_stash", _CONV_IN + ("conv_stash",), ("y", "conv_stash_out"), _CONV_ATTRS,
    (("conv_stash_out", "conv_stash"),))
CONV_PREFILL = OpSpec(
    "causal_conv1d_prefill", _CONV_IN + ("capture_at", "conv_capture"), ("y", "conv_pool_out", "conv_capture_out"),
    _CONV_ATTRS, (("conv_pool_out", "conv_pool"), ("conv_capture_out", "conv_capture")))

OPS: tuple[OpSpec, ...] = (GDN_RECURRENT, GDN_RECURRENT_STASH, GDN_CHUNKED, CONV_UPDATE, CONV_UPDATE_STASH,
                           CONV_PREFILL)
OPS_BY_NAME = {o.name: o for o in OPS}

# ---- The ahead-of-time form (TensorRT `aot_impl`: one compiled kernel per plugin) ----
# An op that launches several kernels becomes a chain of pass plugins, one per kernel, with the intermediates as
# plugin outputs and inputs (TensorRT tensors in its activation memory). Every pass takes `max_seqs`, the most
# sequences a step may hold (the graph's profiles bound N by it): the kernels locate a chunk by a vector over the
# sequences whose width must be a compile-time constant. Intermediates (docs/math.md#chunked-form-prefill):
# rk [T, H] fp32 1/|k|, gam [T, HV] fp32 chunk-local cumsum of g, t_inv [T, HV, 64] (I + A)^-1 row per token,
# w [T, HV, K], u [T, HV, V], h [C, HV, K, V] state at each chunk start (C = ceil(T / 64) + 2 N chunk slots),
# v_new [T, HV, V] (activation dtype); conv: y_part [T, D], y for the tokens whose taps lie inside x.
_SEQ = ("cu_seqlens", "slots", "capture_at")
GDN_CHUNK_SOLVE = OpSpec(
    "gated_delta_rule_chunk_solve", ("q", "k", "v", "a", "b", "A_log", "dt_bias") + _SEQ, ("rk", "gam", "t_inv"),
    ("max_seqs",))
GDN_CHUNK_WU = OpSpec(
    "gated_delta_rule_chunk_wu", ("k", "v", "b", "t_inv", "gam", "rk") + _SEQ, ("w", "u"), ("max_seqs",))
GDN_CHUNK_STATE = OpSpec(
    "gated_delta_rule_chunk_state", ("k", "rk", "w", "u", "gam") + _SEQ + ("ssm_pool", "ssm_capture"),
    ("h", "v_new", "ssm_pool_out", "ssm_capture_out"), ("max_seqs",),
    (("ssm_pool_out", "ssm_pool"), ("ssm_capture_out", "ssm_capture")))
GDN_CHUNK_OUT = OpSpec(
    "gated_delta_rule_chunk_out", ("q", "k", "rk", "gam", "h", "v_new") + _SEQ, ("o",), ("max_seqs",))
CONV_PREFILL_CHUNK = OpSpec(
    "causal_conv1d_prefill_chunk", ("x", "weight", "cu_seqlens", "slots"), ("y_part",), _CONV_ATTRS + ("max_seqs",))
CONV_PREFILL_STATE = OpSpec(
    "causal_conv1d_prefill_state", ("x", "weight", "y_part") + _SEQ + ("conv_pool", "conv_capture"),
    ("y", "conv_pool_out", "conv_capture_out"), _CONV_ATTRS,
    (("y", "y_part"), ("conv_pool_out", "conv_pool"), ("conv_capture_out", "conv_capture")))

# op -> its passes in launch order (the op's own launches: gated_delta_rule/triton.py, causal_conv1d/triton.py)
AOT_CHAINS: dict[OpSpec, tuple[OpSpec, ...]] = {
    GDN_CHUNKED: (GDN_CHUNK_SOLVE, GDN_CHUNK_WU, GDN_CHUNK_STATE, GDN_CHUNK_OUT),
    CONV_PREFILL: (CONV_PREFILL_CHUNK, CONV_PREFILL_STATE)}
PASSES: tuple[OpSpec, ...] = tuple(p for chain in AOT_CHAINS.values() for p in chain)
PLUGINS: tuple[OpSpec, ...] = OPS + PASSES  # every TensorRT plugin (JIT impl for all)
PLUGINS_BY_NAME = {p.name: p for p in PLUGINS}
AOT_PLUGINS: tuple[OpSpec, ...] = tuple(p for p in PLUGINS if p not in AOT_CHAINS)  # one kernel each: aot_impl

CHUNK_TOKENS = 64  # tokens per chunk of the chunked GDN kernels (triton_chunked.BT; a test checks they agree)

# Dimensions and dtypes of every plugin tensor: the I/O contract of plugins/*/README.md and the intermediates above.
# Symbols: T tokens, N sequences (N+1 for cu_seqlens), S pool slots, C = ceil(T / CHUNK_TOKENS) + 2 N chunk slots,
# H / HV key / value heads, K / V their dims, D conv channels, W conv width, L = (W - 1) * dilation history rows.
# dtype "act": the activation dtype. An updated buffer `<x>_out` is `<x>`.
TENSORS: dict[str, tuple[tuple[str, ...], str]] = {
    "q": (("T", "H", "K"), "act"), "k": (("T", "H", "K"), "act"), "v": (("T", "HV", "V"), "act"),
    "a": (("T", "HV"), "act"), "b": (("T", "HV"), "act"), "A_log": (("HV",), "float32"),
    "dt_bias": (("HV",), "float32"), "cu_seqlens": (("N+1",), "int32"), "slots": (("N",), "int32"),
    "capture_at": (("N",), "int32"), "ssm_pool": (("S", "HV", "K", "V"), "float32"),
    "ssm_stash": (("T", "HV", "K", "V"), "float32"), "ssm_capture": (("N", "HV", "K", "V"), "float32"),
    "o": (("T", "HV", "V"), "act"), "rk": (("T", "H"), "float32"), "gam": (("T", "HV"), "float32"),
    "t_inv": (("T", "HV", str(CHUNK_TOKENS)), "act"), "w": (("T", "HV", "K"), "act"), "u": (("T", "HV", "V"), "act"),
    "h": (("C", "HV", "K", "V"), "act"), "v_new": (("T", "HV", "V"), "act"),
    "x": (("T", "D"), "act"), "weight": (("D", "W"), "act"), "conv_pool": (("S", "L", "D"), "act"),
    "conv_stash": (("T", "L", "D"), "act"), "conv_capture": (("N", "L", "D"), "act"), "y": (("T", "D"), "act"),
    "y_part": (("T", "D"), "act"),
}


def tensor(name: str) -> tuple[tuple[str, ...], str]:
    """(dims, dtype) of a plugin tensor by name (`<x>_out` is `<x>`)."""
    return TENSORS[name if name in TENSORS else name.removesuffix("_out")]
