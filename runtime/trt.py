"""`TrtEngine`: one GDN layer's TensorRT plans (one per mode), or one run of layers' stack plans, bound by name to the
runtime's buffers and to the layers' one copy of their weights.

Imports tensorrt, so it is imported only where TensorRT exists (`backends.build_engines` decides). Per plan:
- the engine's I/O names and dtypes are checked against the `GraphSpec` of its manifest (missing and extra named);
- one execution context per optimization profile (profile k = GraphSpec bucket k), so shapes inside a bucket never
  switch profiles and a CUDA-graph capture of a bucket keeps its context. The contexts hold no memory of their own
  (`ExecutionContextAllocationStrategy.USER_MANAGED`, TensorRT >= 10.0): every context of every layer and mode runs
  on one device scratch (`ContextMemory`) sized by the largest `get_device_memory_size_for_profile_v2` over all
  plans. The layers run in turn on one stream, so no two contexts use it at once; the default (STATIC) would give
  each of the hundreds of contexts of a real model (36 GDN layers x 6 modes x buckets) the memory of its engine's
  largest profile;
- the weight inputs (role weight) are bound once per context at load to the layers' tensors (`GdnLayer.weights()`,
  the copy the PyTorch engine computes with), so a layer's weights sit on the device once whatever the number of
  plans, modes and profiles; `plans.check_weights` refuses a plan whose weight inputs differ from them by name,
  shape or dtype;
- each profile is set once at load with `set_optimization_profile_async` on the stream the session steps on (the
  current stream of the device), whose return value is checked, and that stream is synchronised once (CUDA-graph
  warm-ups run on a side stream);
- at run time every input is bound to the runtime's tensor (`plans.bind_inputs`) after `set_input_shape`
  (checked: a shape outside the profile is an error naming the tensor), the activation outputs to fresh tensors,
  and each aliased output (`<buffer>_out`) either to the address of the input it updates (in place) or, where the
  plan does not confirm the alias, to a buffer of its own that is copied into the runtime's buffer after the step
  (`plans.in_place_outputs`: TensorRT >= 10.15 answers through `get_aliased_input_tensor`; older TensorRT has no
  way to confirm it, so the copy is taken there); then `execute_async_v3` on the step's stream.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from pathlib import Path

import tensorrt as trt
import torch
from torch import Tensor

from gdn_trt.export.spec import GraphSpec, Role
from gdn_trt.model.dtypes import dtype_name
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.state import StepOutput
from gdn_trt.plugins.trt_common import PLUGIN_MODULES, context_memory

from .engine import Engine, LayerCall
from .plans import PlanMatch, bind_inputs, check_weights, find_plans, in_place_outputs

log = logging.getLogger("gdn_trt.runtime")
_LOGGER = trt.Logger(trt.Logger.WARNING)
_TRT_DTYPES = {trt.float32: "float32", trt.float16: "float16", trt.bfloat16: "bfloat16", trt.int32: "int32"}


class ContextMemory:
    """One device scratch for the execution contexts of every plan of a session. `nbytes` = the largest context
    memory of any plan's profile (torch's allocations are 512-byte aligned; TensorRT needs 256)."""

    def __init__(self, nbytes: int, device: torch.device):
        self.nbytes = int(nbytes)
        self.buf = torch.empty(max(self.nbytes, 1), dtype=torch.uint8, device=device)

    def attach(self, ctx) -> None:
        if hasattr(ctx, "set_device_memory"):  # (ptr, size): TensorRT >= 10.1
            ctx.set_device_memory(self.buf.data_ptr(), self.nbytes)
        else:
            ctx.device_memory = self.buf.data_ptr()


@dataclass(frozen=True)
class LoadedPlan:
    """A deserialised plan: the engine (kept with its runtime), its GraphSpec, and the aliased outputs the plan
    confirms (bound in place; the others are copied back)."""

    engine: object
    runtime: object
    spec: GraphSpec
    path: Path
    in_place: frozenset[str]


def load_plan(runtime, path: Path, spec: GraphSpec, versions: dict) -> LoadedPlan:
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise RuntimeError(f"{path}: TensorRT could not deserialize the plan (TensorRT or plugin version mismatch? "
                           f"manifest: {versions})")
    _check_bindings(engine, spec, path)
    return LoadedPlan(engine, runtime, spec, path, in_place_outputs(engine, spec))


class TrtEngine(Engine):
    """Plans of one layer, or of one run of layers (stack plans: one enqueue per step for the run), by mode.
    `pool_rows` is the session's slot count (the S of every pool binding); `weights`: layer -> the layer's one
    copy of its weights (`GdnLayer.weights()`, shared with the PyTorch engine), bound to every plan's weight
    inputs once per context (their addresses never change)."""

    def __init__(self, layer_ids: tuple[int, ...], plans: dict[LayerMode, LoadedPlan], memory: ContextMemory,
                 pool_rows: int, weights: dict[int, dict[str, Tensor]]):
        self._ids, self.layer_idx, self.device, self.pool_rows = layer_ids, layer_ids[0], memory.buf.device, pool_rows
        self.name = "trt-stack" if len(layer_ids) > 1 else "trt"
        self.plans, self.weights = plans, {i: weights[i] for i in layer_ids}
        self.specs: dict[LayerMode, GraphSpec] = {mode: p.spec for mode, p in plans.items()}
        for p in plans.values():
            check_weights(p.spec, self.weights, p.path)
        stream = torch.cuda.current_stream(self.device)
        self.contexts = {mode: [_context(p, k, memory, stream, self.weights)
                                for k in range(p.engine.num_optimization_profiles)] for mode, p in plans.items()}
        stream.synchronize()

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return self._ids

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
        return self.run_layers((call,), stream)

    def run_layers(self, calls: tuple[LayerCall, ...], stream: torch.cuda.Stream | None) -> StepOutput:
        mode = calls[0].mode
        plan, spec = self.plans[mode], self.specs[mode]
        T, N = calls[0].step.x.shape[0], calls[0].step.pack.num_seqs
        bucket = spec.bucket_for(self._sizes(mode, N, T))
        ctx = self.contexts[mode][bucket]
        inputs = bind_inputs(calls, spec, self.weights)
        for t in spec.inputs:
            if t.role is Role.WEIGHT:
                continue  # static, bound once per context
            x = inputs[t.name]
            if not ctx.set_input_shape(t.name, tuple(x.shape)):
                raise ValueError(f"{plan.path}: input {t.name} shape {tuple(x.shape)} is outside profile {bucket}")
            _address(ctx, t.name, x)
        s = stream or torch.cuda.current_stream(self.device)
        outs: dict[str, Tensor] = {}
        copies: list[tuple[Tensor, Tensor]] = []
        with torch.cuda.stream(s):  # buffers allocated here belong to the step's stream
            for t in spec.outputs:
                if t.name in plan.in_place:
                    outs[t.name] = inputs[t.aliases]  # updated in place: same address as the input
                else:
                    shape = tuple(ctx.get_tensor_shape(t.name))
                    outs[t.name] = torch.empty(shape, dtype=t.torch_dtype, device=self.device)
                    if t.aliases:
                        copies.append((inputs[t.aliases], outs[t.name]))
                _address(ctx, t.name, outs[t.name])
            if not ctx.execute_async_v3(s.cuda_stream):
                raise RuntimeError(f"TensorRT execute_async_v3 failed: {spec.where} {mode.value}")
            for dst, src in copies:
                dst.copy_(src)
        if "streams_out" in outs:
            return StepOutput(outs["streams_out"])
        return StepOutput(outs["x_out"], outs["residual_out"])


def _context(plan: LoadedPlan, profile: int, memory: ContextMemory, stream: torch.cuda.Stream,
             weights: dict[int, dict[str, Tensor]]):
    ctx = plan.engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
    if ctx is None:
        raise RuntimeError(f"{plan.path}: TensorRT could not create an execution context")
    memory.attach(ctx)
    if not ctx.set_optimization_profile_async(profile, stream.cuda_stream):
        raise RuntimeError(f"{plan.path}: TensorRT refused optimization profile {profile}")
    for t in plan.spec.inputs:
        if t.role is Role.WEIGHT:
            _address(ctx, t.name, weights[t.layer if t.layer is not None else plan.spec.layer_idx][t.local])
    return ctx


def _address(ctx, name: str, t: Tensor) -> None:
    if not ctx.set_tensor_address(name, t.data_ptr()):
        raise RuntimeError(f"TensorRT refused the address of {name} ({tuple(t.shape)} {t.dtype})")


def _check_bindings(engine, spec: GraphSpec, path) -> None:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    ins = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    spec.check_names(ins, outs)
    for t in (*spec.inputs, *spec.outputs):
        got = _TRT_DTYPES.get(engine.get_tensor_dtype(t.name), str(engine.get_tensor_dtype(t.name)))
        if got != t.dtype:
            raise ValueError(f"{path}: tensor {t.name} is {got} in the plan, {t.dtype} in its GraphSpec")


def load_trt_engines(layers: list[GdnLayer], engines_dir: str, pool_rows: int, match: PlanMatch = PlanMatch()
                     ) -> list[list[TrtEngine]]:
    """Per GDN layer of the model (`layers`, on the session's device, in stack order), its TensorRT engines best
    first: the stack engine whose run holds the layer (one enqueue per step for the run), then the layer's own
    plans; every plan checked (`find_plans`), every context on one `ContextMemory`, every plan's weight inputs
    bound to the layers' one copy of their weights."""
    cfg, device = layers[0].cfg, layers[0].mixer.in_proj.device
    runtime = trt.Runtime(_LOGGER)
    infos = find_plans(engines_dir, cfg, dtype_name(layers[0].dtype), match)
    if any(p.versions.get("plugin_impl", "jit") == "jit" for p in infos.values()):
        # a JIT plugin's creator must be registered in the deserialising process; AOT plans carry their kernels
        for m in PLUGIN_MODULES:
            importlib.import_module(m)
    plans = {key: load_plan(runtime, p.plan, p.spec, p.versions) for key, p in infos.items()}
    need = max(max(context_memory(p.engine), default=0) for p in plans.values())
    memory = ContextMemory(need, device)
    log.info("TensorRT %s: %d plans, one context memory of %.1f MiB for all their contexts; weights bound from "
             "the layers' one copy (%s)", trt.__version__, len(plans), need / 2**20,
             f"merged adapter {match.merged_adapter}" if match.merged_adapter else "the checkpoint's weights")
    _log_copies(plans)
    weights = {la.index: la.weights() for la in layers}
    by_ids: dict[tuple[int, ...], dict[LayerMode, LoadedPlan]] = {}
    for (ids, mode), p in plans.items():
        by_ids.setdefault(ids, {})[mode] = p
    stacks = sorted(ids for ids in by_ids if len(ids) > 1)  # disjoint: find_plans refuses overlapping runs
    engines = {ids: TrtEngine(ids, mine, memory, pool_rows, weights) for ids, mine in by_ids.items()}
    out = []
    for i in cfg.gdn_layer_ids:
        mine = [engines[ids] for ids in stacks if i in ids] + ([engines[(i,)]] if (i,) in engines else [])
        if not mine:
            raise FileNotFoundError(f"{engines_dir}: no plan for GDN layer {i} of {cfg.name}")
        out.append(mine)
    for ids in stacks:
        behind = [i for i in ids if (i,) in engines]
        log.info("layers %s: TensorRT stack plans for %s (one enqueue per step for the run)%s", ids,
                 ", ".join(m.value for m in by_ids[ids]),
                 f"; the per-layer plans of layers {behind} behind them" if behind else "")
    for ids in by_ids:
        if len(ids) == 1:
            log.info("layer %d: TensorRT plans for %s", ids[0], ", ".join(m.value for m in by_ids[ids]))
    return out


def _log_copies(plans: dict) -> None:
    copied = [(key, sorted(set(p.spec.aliases) - p.in_place)) for key, p in plans.items()]
    copied = [(key, names) for key, names in copied if names]
    if copied:
        (ids, mode), names = copied[0]
        log.warning("TensorRT %s: %d of %d plans do not confirm their aliased outputs (get_aliased_input_tensor: "
                    "TensorRT >= 10.15): those outputs get buffers of their own, copied back after each step "
                    "(e.g. layers %s %s: %s)", trt.__version__, len(copied), len(plans), list(ids), mode.value,
                    ", ".join(names))
