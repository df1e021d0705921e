"""The GDN decoder layer: plain or hyper-connection residual, optional dense MLP, optional PLE, every LayerMode.

One module computes every mode; a mode only decides which op variant the two recurrent parts (the causal convs and
the gated delta rule) use and which buffers they write: pools (decode, prefill), stashes (verify) or captures
(prefill). Everything else is per token. The recurrent parts go through the `gdn_trt` ops, so eager runs, tests
and ONNX export share one code path.
"""

from __future__ import annotations

from dataclasses import fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gdn_trt.plugins.causal_conv1d import op as conv_op
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule import op as gdn_op
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.glue import op as glue
from gdn_trt.plugins.glue.io import PleNorms
from gdn_trt.plugins.packing import Capture, Packing, compute_dtype
from gdn_trt.plugins.spec import Activation

from .config import GdnConfig
from .lora import LoraInput, Proj, Site, apply_sites, check_idx_values, check_input, one_hot, sites
from .modes import LayerMode, Writes
from .norms import gated_rms_norm, rms_norm_1p
from .state import BufferSpec, LayerState, StateCapture, StateStash, StepInput, StepOutput
from .tp import Part, TpError, TpSpec
from .weights import INTEGER_WEIGHTS, LayerWeights

_GATE_PARAMS = ("dt_bias", "A_log")  # kept at fp32 or wider whatever the activation dtype


def weight_shapes(cfg: GdnConfig, layer_idx: int) -> dict[str, tuple[tuple[int, ...], bool]]:
    """`GdnLayer.weights()` name -> (shape, gate) for GDN layer `layer_idx` of `cfg`, from the config alone, in the
    layer's buffer order; gate: kept at fp32 or wider whatever the activation dtype (A_log, dt_bias)."""
    shapes = LayerWeights.shapes(cfg, layer_idx)
    out = {name: (shape, name.rpartition(".")[2] in _GATE_PARAMS) for name, shape in shapes.items()
           if "." in name and name not in INTEGER_WEIGHTS}
    out.update({f"norms.{name}": (shape, False) for name, shape in shapes.items() if "." not in name})
    return out


def _linear(x: Tensor, w: Tensor, fused: bool) -> Tensor:
    """x w^T: on the fused path `glue.linear` (the skinny Triton GEMM for decode-sized calls on CUDA, F.linear
    otherwise), else F.linear, the op torch.export and torch.compile trace."""
    return glue.linear(x, w) if fused else F.linear(x, w)


class _Part(nn.Module):
    """Buffers of one weights dataclass, registered under the dataclass field names."""

    def __init__(self, part, dtype: torch.dtype):
        super().__init__()
        for f in fields(part):
            t = getattr(part, f.name)
            if t.dtype.is_floating_point:
                t = t.to(compute_dtype(dtype) if f.name in _GATE_PARAMS else dtype)
            self.register_buffer(f.name, t.contiguous())


class _Io:
    """Routes the recurrent parts of one step to the op variant of the mode and collects what they wrote."""

    def __init__(self, mode: LayerMode, pack: Packing, state: LayerState, extra: StateStash | StateCapture | None):
        self.mode, self.pack, self.state, self.extra = mode, pack, state, extra
        self.pools: dict[str, Tensor] = {}
        self.outs: dict[str, Tensor] = {}
        self.lora: LoraInput | None = None
        self._onehot: Tensor | None = None

    def adapt(self, y: Tensor, x: Tensor, where: list[Site]) -> Tensor:
        """y = x W^T of one projection, plus the per-sequence LoRA updates of its sites (none without LoRA)."""
        if self.lora is None:
            return y
        if self._onehot is None:
            self._onehot = one_hot(self.lora)  # once per step and layer: every projection shares it
        return apply_sites(y, x, self._onehot, self.lora, where)

    def conv_in_gemm(self, x: Tensor, w: Tensor, adapted: bool) -> bool:
        """Whether the in-projection x w^T and the conv update run as one kernel (`glue.linear_conv`): a mode with
        one token per sequence that writes the pools (decode), no LoRA update on the projection (`adapted`: the
        layer has in_proj sites), and a call the fused kernel takes (`glue.conv_in_gemm`). On the H200 at N = 64
        the two took 19.8 and 8.1 us of a layer's step (bench/results/2026-12-04-gemm-step-late.md)."""
        spec = self.mode.spec
        return (spec.writes is Writes.POOLS and spec.one_token_per_sequence
                and not (adapted and self.lora is not None) and glue.conv_in_gemm(x, w))

    def linear_conv(self, x: Tensor, w: Tensor, conv: ConvParams) -> Tensor:
        """The in-projection with the conv update in its epilogue (where `conv_in_gemm` holds); the conv pool is
        written in place."""
        self.pools["conv"] = self.state.conv
        return glue.linear_conv(x, w, conv, self.pack, self.state.conv)

    def norm_in_decode(self, x: GdnInputs) -> bool:
        """Whether the GDN decode and the output's gated norm run as one kernel (`glue.recurrent_norm`): a mode with
        one token per sequence that writes the pools (decode) and a call the fused kernel takes
        (`glue.norm_in_decode`). On the H200 at N = 64 the gated norm took 7.4 us of interval a layer, 4.6 of it
        beside the GDN decode (bench/results/2026-12-04-gemm-step-late.md)."""
        spec = self.mode.spec
        return spec.writes is Writes.POOLS and spec.one_token_per_sequence and glue.norm_in_decode(x, self.pack)

    def gdn_norm(self, x: GdnInputs, z: Tensor, w: Tensor, eps: float, act: str) -> Tensor:
        """The GDN decode with the output's gated norm in its epilogue (where `norm_in_decode` holds); the SSM pool
        is written in place."""
        self.pools["ssm"] = self.state.ssm
        return glue.recurrent_norm(x, self.pack, self.state.ssm, z, w, eps, act)

    def conv(self, name: str, x: Tensor, conv: ConvParams) -> Tensor:
        """The mode's conv op (`ModeSpec.conv`) on state part `name` (conv, ple_conv)."""
        pool, writes = getattr(self.state, name), self.mode.spec.writes
        if writes is Writes.STASH:
            y, self.outs[name] = conv_op.update_stash(x, conv, self.pack, pool, getattr(self.extra, name))
        elif writes is Writes.POOLS_CAPTURE:
            cap = Capture(self.extra.at, getattr(self.extra, name))
            y, self.pools[name], self.outs[name] = conv_op.prefill(x, conv, self.pack, pool, cap)
        else:
            y, self.pools[name] = conv_op.update(x, conv, self.pack, pool)
        return y

    def gdn(self, x: GdnInputs) -> Tensor:
        """The mode's gated delta rule op (`ModeSpec.gdn`)."""
        pool, writes = self.state.ssm, self.mode.spec.writes
        if writes is Writes.STASH:
            o, self.outs["ssm"] = gdn_op.recurrent_stash(x, self.pack, pool, self.extra.ssm)
        elif writes is Writes.POOLS_CAPTURE:
            o, self.pools["ssm"], self.outs["ssm"] = gdn_op.chunked(x, self.pack, pool,
                                                                    Capture(self.extra.at, self.extra.ssm))
        else:
            o, self.pools["ssm"] = gdn_op.recurrent(x, self.pack, pool)
        return o

    def new_state(self) -> LayerState:
        return LayerState(**{f.name: self.pools.get(f.name, getattr(self.state, f.name)) for f in fields(LayerState)})

    def new_extra(self):
        if isinstance(self.extra, StateCapture):
            return StateCapture(self.extra.at, self.outs["conv"], self.outs["ssm"], self.outs.get("ple_conv"))
        return StateStash(self.outs["conv"], self.outs["ssm"], self.outs.get("ple_conv"))


class GdnLayer(nn.Module):
    """One GDN decoder layer of `cfg`, from `weights`, computing in `dtype` (fp32 or fp64 on CPU, bf16 on GPU).

    A tensor-parallel rank's layer is this layer over the rank's config and weights (`model/tp.py`: `shard_config`,
    `load_checkpoint(dir, shard)`): `tp` names its process group, and the partial sums of `out_proj` (and of the
    dense MLP's `down_proj`) are all-reduced over it, the last one left to the host when `tp.host_reduce`."""

    def __init__(self, cfg: GdnConfig, weights: LayerWeights, dtype: torch.dtype = torch.float32,
                 tp: TpSpec | None = None):
        super().__init__()
        weights.check(cfg)
        self.cfg, self.index, self.dtype = cfg, weights.index, dtype
        self.tp = tp or TpSpec()
        if cfg.tp_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            self.tp.check(cfg)
        self.mixer = _Part(weights.mixer, dtype)
        for name in ("mlp", "attn_hc", "mlp_hc", "ple"):
            part = getattr(weights, name)
            setattr(self, name, _Part(part, dtype) if part is not None else None)
        self.norms = nn.Module()
        for name in ("input_norm", "post_norm"):
            t = getattr(weights, name)
            self.norms.register_buffer(name, t.to(dtype) if t is not None else None)
        self.lora_sites = sites(cfg, self.index)
        self._by_proj = {p: [s for s in self.lora_sites.values() if s.proj is p] for p in Proj}
        # the glue around the kernels (norms, gates, residual adds): None = the fused kernels of plugins/glue on
        # CUDA and the torch code elsewhere; True / False force one (tests compare the two on one device)
        self.fused_glue: bool | None = None

    def weights(self) -> dict[str, Tensor]:
        """Buffer name -> tensor of every floating-point weight the layer computes with (`weight_shapes`): what a
        graph exported with weights as inputs takes, bound from this one copy by every engine of the layer."""
        return {n: b for n, b in self.named_buffers() if b.is_floating_point()}

    # ---- entry points, one per LayerMode ----
    def decode(self, step: StepInput, state: LayerState) -> tuple[StepOutput, LayerState]:
        """One token of one sequence."""
        return self.run(LayerMode.DECODE, step, state)

    def decode_multi_seq(self, step: StepInput, state: LayerState) -> tuple[StepOutput, LayerState]:
        """One token for each of N sequences (slot -1 = padding)."""
        return self.run(LayerMode.DECODE_MULTI_SEQ, step, state)

    def decode_batched(self, step: StepInput, state: LayerState, stash: StateStash
                       ) -> tuple[StepOutput, StateStash]:
        """K tokens of one sequence, recurrent; state after each token to the stash, pool untouched."""
        return self.run(LayerMode.DECODE_BATCHED, step, state, stash)

    def verify_multi(self, step: StepInput, state: LayerState, stash: StateStash) -> tuple[StepOutput, StateStash]:
        """0..K draft tokens for each of N sequences; state after each token to the stash, pools untouched."""
        return self.run(LayerMode.VERIFY_MULTI, step, state, stash)

    def prefill(self, step: StepInput, state: LayerState, capture: StateCapture
                ) -> tuple[StepOutput, LayerState, StateCapture]:
        """T tokens of one sequence, chunked; final state to the pool, the capture point to `capture`."""
        return self.run(LayerMode.PREFILL, step, state, capture)

    def prefill_varlen(self, step: StepInput, state: LayerState, capture: StateCapture
                       ) -> tuple[StepOutput, LayerState, StateCapture]:
        """N sequences of any lengths, chunked, each from its own slot."""
        return self.run(LayerMode.PREFILL_VARLEN, step, state, capture)

    def run(self, mode: LayerMode, step: StepInput, state: LayerState,
            extra: StateStash | StateCapture | None = None):
        """Any mode: returns (output, state) for decode modes, (output, stash) for verify modes and
        (output, state, capture) for prefill modes. In eager runs the returned buffers are the given ones,
        written in place; under export they are new tensors. Every input and buffer is checked first, so a
        rejected step writes nothing."""
        self._check(mode, step, state, extra)
        return self.run_impl(mode, step, state, extra)

    def run_impl(self, mode: LayerMode, step: StepInput, state: LayerState,
                 extra: StateStash | StateCapture | None = None):
        """`run` without its checks, for a caller that validated the step at its own boundary and owns the buffers
        (the runtime: `Session.step` checks every input, the engine selector the mode's shape rules)."""
        io = _Io(mode, step.pack, state, extra)
        io.lora = step.lora
        out = self._forward(step, io)
        writes = mode.spec.writes
        if writes is Writes.STASH:
            return out, io.new_extra()
        if writes is Writes.POOLS_CAPTURE:
            return out, io.new_state(), io.new_extra()
        return out, io.new_state()

    def run_mixer(self, mode: LayerMode, step: StepInput, state: LayerState,
                  extra: StateStash | StateCapture | None = None) -> Tensor:
        """The token mixer alone (Hugging Face's `linear_attn` module): `step.x` = the normed hidden [T, C] (what the
        host's input norm, or on hc models its stream mix, produced) -> the mixer output [T, C], before any residual
        add. The conv and GDN state are read and written as `run_impl` does in `mode`; the norms, the MLP, the
        hyper-connections and PLE are the host's (a PLE layer's PLE part is not run: call the whole layer there).
        Unchecked, like `run_impl`: the runtime validates the step at its boundary. On a tensor-parallel rank the
        `out_proj` all-reduce is the call's last one (left to the host with `host_reduce`), even on a dense-MLP
        layer, whose MLP the host runs here."""
        io = _Io(mode, step.pack, state, extra)
        io.lora = step.lora
        return self._mixer(step.x, io, self._fused(step.x), last=True)

    def run_part_mixer(self, mode: LayerMode, step: StepInput, state: LayerState,
                       extra: StateStash | StateCapture | None = None):
        """The MIXER graph of a tensor-parallel rank's dense-MLP layer (`model/tp.Part`): `run` up to the mixer, its
        `out_proj` sum left partial and the MLP not run. Returns what `run` returns in `mode`, its output
        `StepOutput(the rank's partial mixer output [T, C], x + residual)`; no collective is called. Checked as
        `run` checks."""
        self._check_part()
        self._check(mode, step, state, extra, part=Part.MIXER)
        io = _Io(mode, step.pack, state, extra)
        io.lora = step.lora
        fused = self._fused(step.x)
        h, residual = self._add_norm(step.x, step.residual, self.norms.input_norm, fused)
        out = StepOutput(self._mixer(h, io, fused, last=True), residual)
        if mode.spec.writes is Writes.STASH:
            return out, io.new_extra()
        if mode.spec.writes is Writes.POOLS_CAPTURE:
            return out, io.new_state(), io.new_extra()
        return out, io.new_state()

    def run_part_mlp(self, x: Tensor, residual: Tensor) -> StepOutput:
        """The MLP graph of a tensor-parallel rank's dense-MLP layer: `x` [T, C] = the all-reduced mixer output (the
        ranks' MIXER `x` summed), `residual` [T, C] = the MIXER output's residual -> `StepOutput(the rank's partial
        down_proj sum, residual + x)`: the post-attention add and RMSNorm, the rank's gate/up columns and down rows,
        as `run` computes them; the layer's hidden state is `all_reduce(out.x) + out.residual`. Per token: no state,
        no packing, no LoRA (part graphs take no adapter slots)."""
        self._check_part()
        if x.dim() != 2 or x.shape[1] != self.cfg.hidden_size or residual.shape != x.shape:
            raise ValueError(f"x and residual must both be [T, {self.cfg.hidden_size}], got {tuple(x.shape)} and "
                             f"{tuple(residual.shape)}")
        if x.dtype != self.dtype or residual.dtype != self.dtype:
            raise ValueError(f"x is {x.dtype} and residual {residual.dtype}, the layer computes in {self.dtype}")
        fused = self._fused(x)
        h, residual = self._add_norm(residual, x, self.norms.post_norm, fused)
        return StepOutput(self._mlp(h, _Io(LayerMode.DECODE, None, None, None), fused), residual)

    def _check_part(self) -> None:
        """The two part graphs are those of a rank's plain dense-MLP layer whose host reduces (no family has hc
        layers with a dense MLP)."""
        cfg = self.cfg
        if self.mlp is None or cfg.is_hc or cfg.tp_size == 1 or not self.tp.host_reduce:
            raise TpError(f"layer {self.index} of {cfg.name}: parts are the two graphs of a tensor-parallel rank's "
                          "plain dense-MLP layer with TpSpec(host_reduce=True); this one "
                          + ("has no dense MLP" if self.mlp is None else "is an hc layer" if cfg.is_hc else
                             "is a whole model's (tp=1)" if cfg.tp_size == 1 else "reduces inside (host_reduce off)"))

    def forward_sequence(self, x: Tensor, ple_rows: Tensor | None = None) -> Tensor:
        """One whole sequence from a fresh state, HF convention: x is the hidden state entering the layer
        (plain [T, C]; hc: the streams [T, n*C]); returns the hidden state after the layer's last residual add."""
        spec = BufferSpec(x.dtype, x.device)
        state = LayerState.allocate(self.cfg, self.index, 1, spec)
        step = StepInput(x, Packing.build([x.shape[0]], [0], x.device),
                         None if self.cfg.is_hc else torch.zeros_like(x), ple_rows)
        out, _, _ = self.prefill(step, state, StateCapture.none(self.cfg, self.index, 1, spec))
        return out.hidden()

    # ---- computation ----
    def _fused(self, x: Tensor) -> bool:
        """Whether this call runs the fused glue kernels (plugins/glue) or the torch code. The torch code is what
        torch.export (the ONNX graphs) and torch.compile trace, and the CPU reference; the fused kernels compute
        the same functions with one read of each input. One Qwen3-Next layer on the H200 (2026-12-03,
        bench/results/2026-12-03-glue.md): decode N = 1 80.4 -> 43.7 us (29 -> 7 kernels), prefill 4096
        1275 -> 722 us; the Qwen4-Exp PLE layer 250 -> 112 us and 4681 -> 1759 us."""
        if torch.compiler.is_exporting() or torch.compiler.is_compiling():
            return False
        return x.is_cuda if self.fused_glue is None else self.fused_glue

    def _forward(self, step: StepInput, io: _Io) -> StepOutput:
        cfg, fused = self.cfg, self._fused(step.x)
        host = self._host_reduces()  # the host does the layer's last reduction: the output is this rank's share
        if not cfg.is_hc:
            h, residual = self._add_norm(step.x, step.residual, self.norms.input_norm, fused)
            y = self._mixer(h, io, fused)
            if self.mlp is None:
                return StepOutput(y, residual)
            h, residual = self._add_norm(residual, y, self.norms.post_norm, fused)
            return StepOutput(self._mlp(h, io, fused), residual)
        streams, adds = step.x, ()
        if self.ple is not None:
            adds = self._ple(streams, step.ple_rows, io, fused)
        mixer = lambda h: self._mixer(h, io, fused)  # noqa: E731
        out = self._hc_sublayer(streams, adds, self.attn_hc, mixer, fused, host and self.mlp is None)
        if self.mlp is not None:
            out = self._hc_sublayer(out.x, (), self.mlp_hc, lambda h: self._mlp(h, io, fused), fused, host)
        return out

    def _collective(self) -> bool:
        """Whether a run of this layer calls an all-reduce (and so needs its process group)."""
        return self.cfg.tp_size > 1 and (not self.tp.host_reduce or self.mlp is not None)

    def _host_reduces(self) -> bool:
        return self.cfg.tp_size > 1 and self.tp.host_reduce

    def _reduce(self, y: Tensor, last: bool) -> Tensor:
        """The ranks' partial sums of a row-parallel projection, all-reduced (model/tp.py); the layer's last one
        stays partial when the host reduces it. A whole model (tp_size 1) has nothing to reduce, so its code and
        exported graphs are those of a layer without tensor parallelism."""
        if self.cfg.tp_size == 1 or (last and self.tp.host_reduce):
            return y
        return self.tp.all_reduce(y)

    def _add_norm(self, x: Tensor, delta: Tensor, w: Tensor, fused: bool) -> tuple[Tensor, Tensor]:
        """Plain residual: (RMSNorm(1 + w) of x + delta, x + delta)."""
        if fused:
            return glue.add_rms_norm(x, (delta,), w, self.cfg.rms_norm_eps, self.cfg.hidden_size)
        residual = x + delta
        return rms_norm_1p(residual, w, self.cfg.rms_norm_eps), residual

    def _mixer(self, h: Tensor, io: _Io, fused: bool, last: bool | None = None) -> Tensor:
        """GDN token mixer: [T, C] -> [T, C]. q, k, v, z, a, b stay column views of the projection: the conv and
        GDN kernels and the fused gated norm take their row strides, so the split copies nothing."""
        cfg, m = self.cfg, self.mixer
        T, H, HV = h.shape[0], cfg.linear_num_key_heads, cfg.linear_num_value_heads
        K, V = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        conv = ConvParams(m.conv, 1, Activation.SILU)
        if fused and io.conv_in_gemm(h, m.in_proj, bool(self._by_proj[Proj.IN_PROJ])):
            proj = io.linear_conv(h, m.in_proj, conv)
            qkv, z, b, a = proj.split([cfg.conv_dim, cfg.value_dim, HV, HV], dim=-1)
        else:
            proj = io.adapt(_linear(h, m.in_proj, fused), h, self._by_proj[Proj.IN_PROJ])
            qkv, z, b, a = proj.split([cfg.conv_dim, cfg.value_dim, HV, HV], dim=-1)
            qkv = io.conv("conv", qkv, conv)
        q, k, v = qkv.split([cfg.key_dim, cfg.key_dim, cfg.value_dim], dim=-1)
        x = GdnInputs(q.reshape(T, H, K), k.reshape(T, H, K), v.reshape(T, HV, V), a, b, m.A_log, m.dt_bias)
        if fused and io.norm_in_decode(x):
            o = io.gdn_norm(x, z.reshape(T, HV, V), m.norm, cfg.rms_norm_eps, cfg.output_gate_type)
        else:
            o = io.gdn(x)
            norm = glue.gated_rms_norm if fused else gated_rms_norm
            o = norm(o, z.reshape(T, HV, V), m.norm, cfg.rms_norm_eps, cfg.output_gate_type)
        o = o.reshape(T, cfg.value_dim)
        last = self.mlp is None if last is None else last
        return self._reduce(io.adapt(_linear(o, m.out_proj, fused), o, self._by_proj[Proj.OUT_PROJ]), last)

    def _mlp(self, h: Tensor, io: _Io, fused: bool) -> Tensor:
        gate_up = io.adapt(_linear(h, self.mlp.gate_up, fused), h, self._by_proj[Proj.GATE_UP])
        if fused:
            act = glue.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return self._reduce(io.adapt(_linear(act, self.mlp.down, fused), act, self._by_proj[Proj.DOWN]), True)

    def _hc_sublayer(self, streams: Tensor, adds: tuple[Tensor, ...], hc: _Part, sublayer, fused: bool,
                     partial: bool = False) -> StepOutput:
        """Qwen4-Exp gated residual around one sublayer (docs/math.md#qwen4-exp-gated-residual-hc), after adding
        `adds` (the PLE output) to the streams: `StepOutput(streams)`; `partial` (a tp rank whose host reduces the
        sublayer's output): `StepOutput(this rank's write-gated delta, the streams)`, whose delta summed over the
        ranks plus the streams is the output. Fused: four kernels (norm with the adds and the inject logits, the
        low-rank silu, the mix, the inject) around the two low-rank GEMMs."""
        n, C, eps = self.cfg.hc_count, self.cfg.hidden_size, self.cfg.rms_norm_eps
        if fused:
            hn, streams, logits = glue.hc_norm(streams, adds, hc.norm, hc.inject, eps)
            x = glue.hc_mix(hn, glue.linear(glue.silu_div(glue.linear(hn, hc.down), n), hc.up), n)
            if partial:  # 0 + inj * y: the inject kernel's own rounding of the delta
                return StepOutput(glue.hc_inject(torch.zeros_like(streams), logits, sublayer(x)), streams)
            return StepOutput(glue.hc_inject(streams, logits, sublayer(x)))
        if adds:
            streams = streams + adds[0]
        T = streams.shape[0]
        hn = rms_norm_1p(streams, hc.norm, eps, group=C)
        w = torch.sigmoid(F.linear(F.silu(F.linear(hn, hc.down) / n), hc.up)).reshape(T, n, C)
        x = (w * hn.reshape(T, n, C)).mean(dim=1)
        inj = 2 * torch.sigmoid(F.linear(hn, hc.inject) / n)  # [T, n]
        y = sublayer(x)
        delta = (inj[:, :, None] * y[:, None, :]).reshape(T, n * C)
        return StepOutput(delta, streams) if partial else StepOutput(streams + delta)

    def _ple(self, streams: Tensor, rows: Tensor, io: _Io, fused: bool) -> tuple[Tensor, ...]:
        """Qwen4-Exp PLE (docs/math.md#qwen4-exp-ple-hashed-n-gram-memory) on gathered rows [T, heads, d_h]: the
        stream delta, as one tensor (torch code) or as its two terms (gv, conv output), which the fused hc norm
        adds."""
        cfg, p = self.cfg, self.ple
        n, C, eps = cfg.hc_count, cfg.hidden_size, cfg.rms_norm_eps
        T = streams.shape[0]
        e = rows.reshape(T, cfg.ple_embed_dim).to(streams.dtype)
        conv = ConvParams(p.conv, cfg.ple_dilation, Activation.SILU)
        if fused:
            gv, u = glue.ple_gate(glue.linear(e, p.key_proj), glue.linear(e, p.value_proj), streams,
                                  PleNorms(p.norm_key, p.norm_query, p.norm_conv, eps))
            return gv, io.conv("ple_conv", u, conv)
        key = rms_norm_1p(F.linear(e, p.key_proj), p.norm_key, eps, group=C).reshape(T, n, C)
        query = rms_norm_1p(streams, p.norm_query, eps, group=C).reshape(T, n, C)
        gate = (key * query).sum(-1, keepdim=True) / C ** 0.5
        gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
        gv = (torch.sigmoid(gate) * F.linear(e, p.value_proj)[:, None, :]).reshape(T, n * C)
        u = rms_norm_1p(gv, p.norm_conv, eps, group=C)
        return (gv + io.conv("ple_conv", u, conv),)

    # ---- checks ----
    def _check(self, mode: LayerMode, step: StepInput, state: LayerState, extra, part: Part | None = None) -> None:
        cfg = self.cfg
        collective = self._collective() and part is None
        want_extra = {Writes.STASH: StateStash, Writes.POOLS_CAPTURE: StateCapture}.get(mode.spec.writes, type(None))
        if not isinstance(extra, want_extra):
            raise TypeError(f"{mode.value} needs {want_extra.__name__}, got {type(extra).__name__}")
        if step.x.dim() != 2 or step.x.shape[1] != cfg.stream_dim:
            raise ValueError(f"x must be [T, {cfg.stream_dim}], got {tuple(step.x.shape)}")
        if step.x.dtype != self.dtype:
            raise ValueError(f"x is {step.x.dtype}, the layer computes in {self.dtype}")
        if cfg.is_hc != (step.residual is None):
            raise ValueError("plain layers take (x, residual); hc layers take the streams and no residual")
        if step.residual is not None and step.residual.shape != step.x.shape:
            raise ValueError(f"residual {tuple(step.residual.shape)} must match x {tuple(step.x.shape)}")
        if (self.ple is not None) != (step.ple_rows is not None):
            raise ValueError(f"layer {self.index} {'needs' if self.ple is not None else 'takes no'} ple_rows")
        if step.ple_rows is not None and tuple(step.ple_rows.shape) != (step.x.shape[0], cfg.ple_heads,
                                                                         cfg.ple_head_dim):
            raise ValueError(f"ple_rows must be [T, {cfg.ple_heads}, {cfg.ple_head_dim}], "
                             f"got {tuple(step.ple_rows.shape)}")
        if (state.ple_conv is None) != (self.ple is None):
            raise ValueError(f"layer {self.index}: ple_conv pool {'missing' if self.ple is not None else 'unexpected'}")
        if step.lora is not None:
            check_input(step.lora, self.lora_sites, step.x.shape[0], self.dtype)
        if torch.compiler.is_exporting():
            if collective:
                raise TpError(f"layer {self.index} is rank {cfg.tp_rank} of tp={cfg.tp_size}: its graph would hold "
                              "an all-reduce; export a rank's layer with TpSpec(host_reduce=True), which leaves its "
                              "one reduction to the host (a dense-MLP layer has two: export it as its two part "
                              "graphs, run_part_mixer and run_part_mlp)")
            return  # token counts are symbolic while tracing; the GraphSpec profiles bound them
        if collective:
            self.tp.check(cfg)
        why = mode.refuse(step.pack.num_seqs, step.x.shape[0])
        if why is not None:
            raise ValueError(why)
        self._check_buffers(step, state, extra)

    def _check_buffers(self, step: StepInput, state: LayerState, extra) -> None:
        """Every buffer and the packing are checked before anything runs, so a rejected step writes nothing."""
        cfg, T, N = self.cfg, step.x.shape[0], step.pack.num_seqs
        S = state.ssm.shape[0]
        shapes = {"conv": cfg.conv_state_shape, "ssm": cfg.ssm_state_shape, "ple_conv": cfg.ple_conv_state_shape}
        want_dtype = {"conv": self.dtype, "ssm": compute_dtype(self.dtype), "ple_conv": self.dtype}
        rows = {"stash": T, "capture": N}
        for kind, buffers in (("pool", state), ("stash", extra if isinstance(extra, StateStash) else None),
                              ("capture", extra if isinstance(extra, StateCapture) else None)):
            if buffers is None:
                continue
            for name, shape in shapes.items():
                t = getattr(buffers, name)
                if t is None:
                    continue
                lead = S if kind == "pool" else rows[kind]
                if tuple(t.shape) != (lead, *shape) or t.dtype != want_dtype[name]:
                    raise ValueError(f"{name} {kind} must be {want_dtype[name]} {(lead, *shape)}, "
                                     f"got {t.dtype} {tuple(t.shape)}")
        if isinstance(extra, StateCapture) and (extra.ple_conv is None) != (self.ple is None):
            raise ValueError("ple_conv capture buffer must be given exactly on PLE layers")
        if isinstance(extra, StateStash) and (extra.ple_conv is None) != (self.ple is None):
            raise ValueError("ple_conv stash buffer must be given exactly on PLE layers")
        step.pack.check_shapes(T)
        if step.pack.cu_seqlens.device.type == "cpu":  # value checks would force a host sync on a GPU
            step.pack.check_values(T, S)
            if step.lora is not None:
                check_idx_values(step.lora)
            if isinstance(extra, StateCapture):
                Capture(extra.at, extra.ssm).check(N, cfg.ssm_state_shape)
                Capture(extra.at, extra.ssm).check_values(step.pack.lengths())
