"""`TrtEngine`: one GDN layer's TensorRT plans (one per mode), bound by name to the runtime's buffers.

Imports tensorrt, so it is imported only where TensorRT exists (`backends.build_engines` decides). Per plan:
- the engine's I/O names and dtypes are checked against the `GraphSpec` of its manifest (missing and extra named);
- one execution context per optimization profile (profile k = GraphSpec bucket k), so shapes inside a bucket never
  switch profiles and a CUDA-graph capture of a bucket keeps its context;
- at run time every input is bound to the runtime's tensor (activations, packing, pools, stash or capture, LoRA
  slot index and adapter slots; `plans.bind_inputs`), the activation outputs to fresh tensors, and every
  aliased output (`<buffer>_out`) to the address of the input it updates, so the pools are written in place;
  then `execute_async_v3` on the step's stream.
"""

from __future__ import annotations

import logging

import tensorrt as trt
import torch
from torch import Tensor

from gdn_trt.export.spec import GraphSpec
from gdn_trt.model.config import GdnConfig
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.state import StepOutput

from .engine import Engine, LayerCall
from .plans import PlanInfo, PlanMatch, bind_inputs, find_plans

log = logging.getLogger("gdn_trt.runtime")
_LOGGER = trt.Logger(trt.Logger.WARNING)
_TRT_DTYPES = {trt.float32: "float32", trt.float16: "float16", trt.bfloat16: "bfloat16", trt.int32: "int32"}


class TrtEngine(Engine):
    """Plans of one layer, by mode. `pool_rows` is the session's slot count (the S of every pool binding)."""

    def __init__(self, layer_idx: int, plans: dict[LayerMode, PlanInfo], device: torch.device, pool_rows: int):
        self.layer_idx, self.device, self.pool_rows, self.name = layer_idx, torch.device(device), pool_rows, "trt"
        runtime = trt.Runtime(_LOGGER)
        self.specs: dict[LayerMode, GraphSpec] = {}
        self.contexts: dict[LayerMode, list] = {}
        self._engines = {}
        for mode, info in plans.items():
            engine = runtime.deserialize_cuda_engine(info.plan.read_bytes())
            if engine is None:
                raise RuntimeError(f"{info.plan}: TensorRT could not deserialize the plan (TensorRT or plugin "
                                   f"version mismatch? manifest: {info.versions})")
            _check_bindings(engine, info.spec, info.plan)
            self._engines[mode], self.specs[mode] = engine, info.spec
            self.contexts[mode] = [self._context(engine, k) for k in range(engine.num_optimization_profiles)]

    @staticmethod
    def _context(engine, profile: int):
        ctx = engine.create_execution_context()
        ctx.set_optimization_profile_async(profile, torch.cuda.current_stream().cuda_stream)
        return ctx

    def modes(self) -> tuple[LayerMode, ...]:
        return tuple(self.specs)

    def _sizes(self, mode: LayerMode, seqs: int, tokens: int) -> dict[str, int]:
        return {"N": seqs, "T": tokens, "S": self.pool_rows}

    def refuse(self, mode: LayerMode, seqs: int, tokens: int) -> str | None:
        spec = self.specs.get(mode)
        if spec is None:
            return f"no {mode.value} plan"
        try:
            spec.bucket_for(self._sizes(mode, seqs, tokens))
        except ValueError as e:
            return str(e)
        return None

    def run(self, call: LayerCall, stream: torch.cuda.Stream | None) -> StepOutput:
        spec = self.specs[call.mode]
        T, N = call.step.x.shape[0], call.step.pack.num_seqs
        ctx = self.contexts[call.mode][spec.bucket_for(self._sizes(call.mode, N, T))]
        inputs = bind_inputs(call, spec)
        for t in spec.inputs:
            x = inputs[t.name]
            ctx.set_input_shape(t.name, tuple(x.shape))
            ctx.set_tensor_address(t.name, x.data_ptr())
        outs: dict[str, Tensor] = {}
        for t in spec.outputs:
            if t.aliases:
                outs[t.name] = inputs[t.aliases]  # updated in place: same address as the input
            else:
                shape = tuple(ctx.get_tensor_shape(t.name))
                outs[t.name] = torch.empty(shape, dtype=t.torch_dtype, device=self.device)
            ctx.set_tensor_address(t.name, outs[t.name].data_ptr())
        s = stream or torch.cuda.current_stream(self.device)
        if not ctx.execute_async_v3(s.cuda_stream):
            raise RuntimeError(f"TensorRT execute_async_v3 failed: layer {self.layer_idx} {call.mode.value}")
        if "streams_out" in outs:
            return StepOutput(outs["streams_out"])
        return StepOutput(outs["x_out"], outs["residual_out"])


def _check_bindings(engine, spec: GraphSpec, path) -> None:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    ins = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    spec.check_names(ins, outs)
    for t in (*spec.inputs, *spec.outputs):
        got = _TRT_DTYPES.get(engine.get_tensor_dtype(t.name), str(engine.get_tensor_dtype(t.name)))
        if got != t.dtype:
            raise ValueError(f"{path}: tensor {t.name} is {got} in the plan, {t.dtype} in its GraphSpec")


def load_trt_engines(cfg: GdnConfig, engines_dir: str, device: torch.device, act_dtype: str, pool_rows: int,
                     match: PlanMatch = PlanMatch()) -> list[TrtEngine]:
    """One `TrtEngine` per GDN layer of `cfg`, from the plans under `engines_dir` (all checked)."""
    plans = find_plans(engines_dir, cfg, act_dtype, match)
    engines = []
    for i in cfg.gdn_layer_ids:
        mine = {mode: p for (layer, mode), p in plans.items() if layer == i}
        if not mine:
            raise FileNotFoundError(f"{engines_dir}: no plan for GDN layer {i} of {cfg.name}")
        engines.append(TrtEngine(i, mine, device, pool_rows))
        log.info("layer %d: TensorRT plans for %s", i, ", ".join(m.value for m in mine))
    return engines
