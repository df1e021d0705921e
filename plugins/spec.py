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
