"""ONNX export of one GDN layer, or of a run of them (a stack graph), in one `LayerMode`: a pure function of
(config, mode, limits), and of the weights when they stay inside the graph.

`export_mode(layer, mode, out_dir, limits)` / `export_graph(layers, spec, path)` trace a small wrapper module whose
forward takes and returns exactly the tensors of the mode's `GraphSpec` (the layers chained in order for a stack),
with `torch.onnx.export(dynamo=True)` and the `gdn_trt` translation table (each functional custom op -> one
`gdn_trt::<op>` node). The weights are graph inputs: each layer runs under `torch.func.functional_call` with its
buffers replaced by the weight inputs, so the trace reads them from the inputs and no weight becomes an initializer
(a GraphSpec with `weights_inside` traces the buffers instead: initializers in an external data file). Then
ONNX-GraphSurgeon cleans the graph (dead values, topological order, I/O dims renamed to the GraphSpec symbols,
exporter metadata such as source paths dropped so that the file depends on nothing but its inputs), the model-local
functions of the custom ops are attached, and `onnx.checker` checks the saved file. A GraphSpec of the AOT form
(`aot`) has its multi-kernel ops replaced by their pass chains before the functions are attached (`aot_form.py`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
import torch
from torch import Tensor, nn

from gdn_trt.model.dtypes import dtype_name
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.lora import LoraInput, SlotWeights
from gdn_trt.model.modes import LayerMode, Writes
from gdn_trt.model.state import LayerState, StateCapture, StateStash, StepInput
from gdn_trt.model.tp import Part
from gdn_trt.plugins.causal_conv1d import onnx as conv_onnx
from gdn_trt.plugins.gated_delta_rule import onnx as gdn_onnx
from gdn_trt.plugins.gated_delta_rule import onnx_passes as gdn_passes
from gdn_trt.plugins.onnx_common import BODY_OPSET
from gdn_trt.plugins.packing import Packing
from gdn_trt.plugins.spec import NAMESPACE

from .aot_form import to_aot
from .spec import GraphSpec, Limits, graph_spec

OPSET = BODY_OPSET
_EXAMPLE = {"T": 5, "N": 2, "S": 3}  # trace sizes; >= 2 so that torch.export does not specialise a symbol to 1
_log = logging.getLogger(__name__)


class _Run(nn.Module):
    """One layer in one mode (or one part graph of it, `part`) as a module call, so `functional_call` can bind its
    weights to graph inputs."""

    def __init__(self, layer: GdnLayer, mode: LayerMode, part: Part | None = None):
        super().__init__()
        self.layer, self.mode, self.part = layer, mode, part

    def forward(self, *args):
        if self.part is Part.MLP:  # (x, residual)
            return (self.layer.run_part_mlp(*args),)
        if self.part is Part.MIXER:
            return self.layer.run_part_mixer(self.mode, *args)
        return self.layer.run(self.mode, *args)


class ModeGraph(nn.Module):
    """The layers of a GraphSpec (one layer, or the run of a stack graph) in its mode with the spec's flat I/O:
    forward(*inputs) -> outputs, both in spec order. Each layer's weights are graph inputs (bound to its buffers
    with `torch.func.functional_call`, so tracing turns them into inputs, not initializers) unless the spec keeps
    them inside (`weights_inside`)."""

    def __init__(self, layers: GdnLayer | list[GdnLayer], spec: GraphSpec):
        super().__init__()
        layers = [layers] if isinstance(layers, GdnLayer) else list(layers)
        if tuple(la.index for la in layers) != spec.layer_ids:
            raise ValueError(f"{spec.stem} runs layers {spec.layer_ids}, got {[la.index for la in layers]}")
        self.runs = nn.ModuleList(_Run(la, spec.mode, spec.part) for la in layers)
        self.spec = spec

    def forward(self, *args: Tensor) -> tuple[Tensor, ...]:
        shared: dict[str, Tensor] = {}
        local: dict[int, dict[str, Tensor]] = {i: {} for i in self.spec.layer_ids}
        for ts, a in zip(self.spec.inputs, args):
            (shared if ts.layer is None else local[ts.layer])[ts.local] = a
        x = shared["streams"] if "streams" in shared else shared["x"]
        residual, buffers = shared.get("residual"), []
        for run in self.runs:
            t = {**shared, **local[run.layer.index]}
            res = self._layer(run, t, x, residual)
            x, residual = res[0].x, res[0].residual
            buffers += [b for part in res[1:] for b in (part.conv, part.ssm, part.ple_conv) if b is not None]
        return (x, *([] if residual is None else [residual]), *buffers)

    def _layer(self, run: _Run, t: dict[str, Tensor], x: Tensor, residual: Tensor | None):
        """One layer on its inputs `t` (local names): the result of `GdnLayer.run` (a part graph's: of its part)."""
        weights = {f"layer.{n}": t[n] for n in run.layer.weights() if n in t}  # a part graph takes its part's
        if self.spec.part is Part.MLP:
            return torch.func.functional_call(run, weights, (x, residual))
        lora = None
        if "lora_idx" in t:
            slots = {s.target: SlotWeights(t[f"lora_{s.target.value}_a"], t[f"lora_{s.target.value}_b"])
                     for s in self.spec.limits.lora.layer_sites(run.layer.cfg, run.layer.index)}
            lora = LoraInput(t["lora_idx"], slots)
        step = StepInput(x, Packing(t["cu_seqlens"], t["slots"]), residual, t.get("ple_rows"), lora)
        state = LayerState(t["conv_pool"], t["ssm_pool"], t.get("ple_conv_pool"))
        extra, writes = None, self.spec.mode.spec.writes
        if writes is Writes.STASH:
            extra = StateStash(t["conv_stash"], t["ssm_stash"], t.get("ple_conv_stash"))
        elif writes is Writes.POOLS_CAPTURE:
            extra = StateCapture(t["capture_at"], t["conv_capture"], t["ssm_capture"], t.get("ple_conv_capture"))
        if self.spec.weights_inside:
            return run(step, state, extra)
        return torch.func.functional_call(run, weights, (step, state, extra))


def translation_table() -> dict:
    return {**gdn_onnx.translations(), **conv_onnx.translations()}


def _functions() -> dict[str, onnx.FunctionProto]:
    return {f.name: f for f in (*gdn_onnx.functions(), *conv_onnx.functions(), *gdn_passes.functions(),
                                *conv_onnx.pass_functions())}


def example_inputs(spec: GraphSpec, sizes: dict[str, int] | None = None) -> tuple[Tensor, ...]:
    """Zero tensors of the spec's shapes at symbol values `sizes`: enough for tracing (values are not read)."""
    sizes = sizes or _EXAMPLE
    return tuple(torch.zeros(t.shape(sizes), dtype=t.torch_dtype) for t in spec.inputs)


def _dynamic_shapes(spec: GraphSpec) -> tuple[dict, ...]:
    dims = {s: torch.export.Dim(f"dim_{s}", min=1) for s in ("T", "N", "S")}

    def dim(d: str):
        sym, _, add = d.partition("+")
        return dims[sym] + int(add) if add else dims[sym]

    return tuple({i: dim(d) for i, d in enumerate(t.dims) if isinstance(d, str)} for t in spec.inputs)


def _clean(model: onnx.ModelProto, spec: GraphSpec) -> onnx.ModelProto:
    """GraphSurgeon pass: I/O named, typed and shaped from the spec, dead nodes removed, nodes sorted."""
    graph = gs.import_onnx(model)
    got_in, got_out = [t.name for t in graph.inputs], [t.name for t in graph.outputs]
    spec.check_names(got_in, got_out)
    for var, ts in zip(graph.inputs, spec.inputs):
        var.shape = list(ts.dims)
    for var in graph.outputs:
        var.shape = list(spec.output(var.name).dims)
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    for i, node in enumerate(graph.nodes):
        node.name = f"{node.domain + '::' if node.domain else ''}{node.op}_{i}"
    graph.name = f"{spec.model}.{spec.folder}.{spec.stem}"
    out = gs.export_onnx(graph)
    for n in out.graph.node:
        del n.metadata_props[:]  # exporter stack traces: absolute paths, not a function of the inputs
    del out.metadata_props[:]
    for vi in (*out.graph.input, *out.graph.output, *out.graph.value_info):
        del vi.metadata_props[:]
    return out


def _attach_functions(model: onnx.ModelProto) -> None:
    """Append the model-local function of every custom op used, and the `gdn_trt` opset import."""
    fns = _functions()
    used = sorted({n.op_type for n in model.graph.node if n.domain == NAMESPACE})
    missing = [u for u in used if u not in fns]
    if missing:
        raise RuntimeError(f"no ONNX function body for custom ops {missing}")
    del model.functions[:]
    model.functions.extend(fns[u] for u in used)
    if NAMESPACE not in {o.domain for o in model.opset_import}:
        model.opset_import.append(onnx.helper.make_opsetid(NAMESPACE, 1))


def export_graph(layers: GdnLayer | list[GdnLayer], spec: GraphSpec, path: Path) -> Path:
    """Export `layers` (the spec's one layer, or its stack run) under `spec` to `path` (+ `path.data` for weights
    inside the graph, `--embed-weights`) and check the saved file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper = ModeGraph(layers, spec).eval()
    chatter = io.StringIO()
    # the exporter prints its phases and warns about dims it renames; failures still raise with the full story
    registry_log = logging.getLogger("torch.onnx._internal.exporter._registration")
    registry_log.setLevel(logging.ERROR)  # "torchvision is not installed" for ops we never use
    with contextlib.redirect_stdout(chatter), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            wrapper, example_inputs(spec), dynamo=True, opset_version=OPSET,
            dynamic_shapes=(_dynamic_shapes(spec),), custom_translation_table=translation_table(),
            input_names=list(spec.input_names), output_names=list(spec.output_names), optimize=True, verbose=False)
    _log.debug("torch.onnx.export of %s:\n%s", path, chatter.getvalue())
    model = _clean(prog.model_proto, spec)
    if spec.aot:
        to_aot(model, spec)
    _attach_functions(model)
    model.producer_name, model.producer_version = "gdn-trt", "1"
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location=data.name,
                    size_threshold=1024)
    onnx.checker.check_model(str(path), full_check=True)
    return path


def export_mode(layer: GdnLayer, mode: LayerMode, out_dir: str | Path, limits: Limits = Limits(),
                weights: bool = True, aot: bool = False) -> Path:
    """Export one mode of `layer` to `<out_dir>/<mode>[+hc][+ple].onnx` (weights as inputs unless `weights` is
    False; the AOT form with `aot`); returns the path."""
    spec = graph_spec(layer.cfg, layer.index, mode, limits, dtype_name(layer.dtype), weights, aot)
    return export_graph(layer, spec, Path(out_dir) / f"{spec.stem}.onnx")
