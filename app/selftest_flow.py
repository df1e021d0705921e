"""The whole flow of the TensorRT selftest (`gdn-trt selftest`, after its plugin, aliasing and pool-copy checks):
what a user accepts on a machine with TensorRT, on the tiny models, every result obtained, none assumed.

Per model of `MODELS` (tiny-3.5 per layer and as one stack of its three GDN layers, tiny-4exp per layer: hc and
hc+PLE, a tiny-4exp with a dense MLP in each GDN layer as one hc / hc+PLE stack, and tiny-3.5 per layer in the AOT
form), with per-sequence LoRA slots:
1. export every mode (float32: the comparison feeds numpy), weights as graph inputs (`--aot` for the AOT model);
2. build every graph with the `gdn_trt` plugins (`gdn-trt build`; JIT, or `--plugins aot` for the AOT model: the
   kernels in the plans), which also writes `config.json`;
3. compare torch (CUDA, Triton kernels) against ONNX Runtime and TensorRT on every graph (`gdn-trt compare`);
4. run the continuous-batching scenario (`app/scenario.py`: joins, leaves, verify with partial acceptance, prefix
   restore, snapshot fork, three LoRA adapters) on backend="trt" over those plans, every output checked against the
   float64 reference; the engines the session chose (`trt-stack` for a stack model) and its CUDA-graph captures and
   gate failures (JIT plugins under capture: open item 4 of docs/tensorrt.md) are reported;
5. for the AOT model only: every plan loaded and run in a fresh Python process with no gdn_trt import (only
   tensorrt, numpy and torch for buffers: no Python plugin exists there), its outputs against torch's
   (`selftest_aot.py`). TensorRT < 10.9 has no AOT plugins: the AOT model is then reported as skipped.
Then the cost of weights as graph inputs at Qwen3-Next's layer size (`weights_cost`): one decode_multi_seq layer in
bf16 exported twice (weights as inputs, weights inside), both built, the device memory each plan takes when
deserialized and the device time per step of each, with the two outputs compared.

Each stage adds one row to the report; `table(report)` prints them as one table.
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gdn_trt.export.artifacts import ExportPlan, Manifest, export_checkpoint
from gdn_trt.export.spec import Limits, Role, graph_spec
from gdn_trt.export.tolerances import errors
from gdn_trt.model.checkpoint import Checkpoint, random_layer
from gdn_trt.model.config import GdnConfig, preset
from gdn_trt.model.layer import GdnLayer
from gdn_trt.model.modes import LayerMode
from gdn_trt.model.peft import load_adapter, make_synthetic_adapter

from .main import ADAPTERS, LIMITS

log = logging.getLogger("gdn_trt.app")
EXPORT = Limits(max_seqs=LIMITS.max_seqs, max_tokens=LIMITS.max_prefill_tokens, max_draft=LIMITS.max_draft,
                pool_slots=LIMITS.max_seqs, seq_buckets=(2, LIMITS.max_seqs), lora=LIMITS.lora)
COST_MODEL, COST_SEQS = "qwen3-next-80b-a3b", 8


def hc_dense() -> GdnConfig:
    """tiny-4exp with a dense MLP in each GDN layer: its three layers (hc, hc+PLE, hc) are one run (the released
    hc family runs an MoE after every mixer, so its runs have one layer)."""
    return preset("tiny-4exp").replace(intermediate_size=16, dense_mlp_layers=(0, 1, 2), name="tiny-4exp-dense")


@dataclass(frozen=True)
class FlowModel:
    label: str
    cfg: GdnConfig
    stack: bool
    aot: bool = False  # exported --aot and built --plugins aot


MODELS = (FlowModel("tiny-3.5", preset("tiny-3.5"), False), FlowModel("tiny-3.5 stack", preset("tiny-3.5"), True),
          FlowModel("tiny-4exp", preset("tiny-4exp"), False), FlowModel("tiny-4exp-dense stack", hc_dense(), True),
          FlowModel("tiny-3.5 aot", preset("tiny-3.5"), False, aot=True))


def run_flow(out: Path, rep, models: tuple[FlowModel, ...] = MODELS) -> None:
    """Every stage of every model into `rep` (a `selftest.Report`); a stage that raises is a FAIL with its error
    and the model's later stages are skipped (said in the report)."""
    from gdn_trt.runtime.session import synthetic

    for fm in models:
        root = out / "flow" / fm.label.replace(" ", "-")
        ck, tmp = synthetic(fm.cfg, seed=0)
        try:
            _model(fm, ck, root, rep)
        finally:
            if tmp is not None:
                tmp.cleanup()


def _stage(rep, name: str, fn) -> object | None:
    t0 = time.perf_counter()
    try:
        ok, value, facts = fn()
    except Exception as e:  # noqa: BLE001 - reported as a failed check with its reason; the next model still runs
        log.exception("selftest %s", name)
        rep.add(name, False, error=f"{type(e).__name__}: {str(e)[:400]}", seconds=round(time.perf_counter() - t0, 1))
        return None
    rep.add(name, ok, **facts, seconds=round(time.perf_counter() - t0, 1))
    return value if ok else None


def _model(fm: FlowModel, ck: Checkpoint, root: Path, rep) -> None:
    import tensorrt as trt

    from gdn_trt.export.build import MIN_TRT_AOT

    if fm.aot and tuple(int(x) for x in trt.__version__.split(".")[:2]) < MIN_TRT_AOT:
        rep.add(f"{fm.label}: AOT plugins", None, skipped=f"TensorRT {trt.__version__} has no aot_impl (>= 10.9)")
        return
    layers = {lw.index: GdnLayer(ck.config, lw, torch.float32).eval() for lw in ck.layers}
    m = _stage(rep, f"{fm.label}: export", lambda: _export(fm, ck, root))
    engines = root / "engines"
    built = m is not None and _stage(rep, f"{fm.label}: build", lambda: _build(m, engines, "aot" if fm.aot else "jit"))
    if not built:
        rep.add(f"{fm.label}: compare, scenario", None, skipped="no plans (see the rows above)")
        return
    _stage(rep, f"{fm.label}: compare torch vs onnxrt vs trt", lambda: _compare(m, layers, engines, root))
    _stage(rep, f"{fm.label}: scenario on the TensorRT engines", lambda: _scenario(fm, ck, engines, root))
    if fm.aot:
        _stage(rep, f"{fm.label}: plans run in a process without gdn_trt", lambda: _no_python(m, layers, engines, root))


def _no_python(m: Manifest, layers: dict, engines: Path, root: Path):
    from .selftest_aot import run_without_python_plugins

    ok, facts = run_without_python_plugins(m, engines, layers, root / "no-python")
    return ok, None, facts


def _export(fm: FlowModel, ck: Checkpoint, root: Path):
    plan = ExportPlan(layers="all", limits=EXPORT, stack=fm.stack, aot=fm.aot)
    m = Manifest.load(export_checkpoint(ck, root / "onnx", plan))
    runs = sorted({g.spec.layer_ids for g in m.graphs})
    return True, m, {"graphs": len(m.graphs), "layer_sets": [list(r) for r in runs]}


def _build(m: Manifest, engines: Path, plugins: str = "jit"):
    from gdn_trt.export.build import BuildOptions, build_graph

    sizes, failed = [], []
    for rec in m.graphs:
        try:
            sizes.append(build_graph(m, rec, BuildOptions(engines, plugins=plugins)).stat().st_size)
        except Exception as e:  # noqa: BLE001 - every graph is tried; the row names the failures
            failed.append(f"{rec.path}: {type(e).__name__}: {str(e)[:200]}")
    config = engines / "config.json"
    facts = {"plans": f"{len(sizes)}/{len(m.graphs)}", "plugins": plugins, "plan_mb": round(sum(sizes) / 1e6, 2),
             "config_json": config.exists(), "failed": failed[:3]}
    return not failed and config.exists(), True, facts


def _compare(m: Manifest, layers: dict, engines: Path, root: Path):
    from gdn_trt.export.compare import CompareOptions, compare_graph
    from gdn_trt.export.report import write_report

    opts = CompareOptions(("torch", "onnxrt", "trt"), "cuda", 2, engines)
    res = [compare_graph(m, rec, layers, opts) for rec in m.graphs]
    write_report(res, root / "compare", {"device": "cuda", "iterations": 2, "exports": [str(m.root)]})
    bad = [r.summary() for r in res if not r.passed]
    worst = max((r.worst() for r in res), key=lambda w: w["rel_rms"] / w["bound_rel_rms"])
    return not bad, None, {"passed": f"{len(res) - len(bad)}/{len(res)}", "worst": f"{worst['output']} "
                           f"{worst['rel_rms']:.1e} (bound {worst['bound_rel_rms']:.0e})", "failed": bad[:3]}


def _scenario(fm: FlowModel, ck: Checkpoint, engines: Path, root: Path):
    from gdn_trt.runtime.session import Session, SessionOptions

    from .scenario import run_scenario

    sess = Session.open(ck, engines_dir=str(engines), backend="trt", device="cuda",
                        options=SessionOptions(limits=LIMITS))
    cfg = ck.config
    with tempfile.TemporaryDirectory(prefix="gdn-trt-selftest-") as d:
        adapters = {f"lora{k}": load_adapter(make_synthetic_adapter(cfg, Path(d) / f"lora{k}", spec, seed=k),
                                             cfg, f"lora{k}") for k, spec in enumerate(ADAPTERS)}
        _, checks = run_scenario(sess, ck, 0, adapters)
    chosen = sorted({e.name for c in sess.selector.engines for e in c})
    stats = sess.stats()
    used = sorted({n for k in stats.kinds.values() for names in k.engines for n in names.split("/")})
    bad = [f"{c.name}: {c.rel_rms:.1e} > {c.bound:.0e}" for c in checks if not c.ok]
    want = "trt-stack" if fm.stack else "trt"
    ok = not bad and want in used and all(n.startswith("trt") for n in used)
    g = stats.graphs
    return ok, None, {"checks": f"{len(checks) - len(bad)}/{len(checks)}", "engines_used": used,
                      "engines_loaded": chosen, "cuda_graphs": len(g.captured), "gate_failures": g.gate_failures[:2],
                      "failed": bad[:3]}


def weights_cost(out: Path, steps: int, rep, device_us) -> None:
    """Weights as graph inputs against weights inside the plan, one Qwen3-Next layer, decode of COST_SEQS sequences,
    bf16: device memory each deserialized plan takes, device time per step (`device_us(fn, steps, stream)`, the
    selftest's sleep-kernel timer), and the two outputs compared."""
    _stage(rep, f"weights as inputs vs inside ({COST_MODEL} layer, decode x{COST_SEQS}, bf16)",
           lambda: _cost(out / "cost", steps, device_us))


def _cost(root: Path, steps: int, device_us):
    import tensorrt as trt

    from gdn_trt.export.build import engine_loader, load_plugins
    from gdn_trt.export.onnx_export import export_mode

    cfg, mode = preset(COST_MODEL), LayerMode.DECODE_MULTI_SEQ
    i = cfg.gdn_layer_ids[0]
    layer = GdnLayer(cfg, random_layer(cfg, i, torch.Generator().manual_seed(0)), torch.bfloat16).eval()
    limits = Limits(max_seqs=COST_SEQS, pool_slots=COST_SEQS + 1)
    paths = {kind: export_mode(layer, mode, root / kind, limits, weights) for kind, weights in (("inputs", True),
                                                                                                ("inside", False))}
    layer.to(torch.device("cuda"))
    load_plugins()
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    runs, facts = {}, {}
    for kind, path in paths.items():
        spec = graph_spec(cfg, i, mode, limits, "bfloat16", kind == "inputs")
        plan = bytes(engine_loader(spec, path)().serialize())
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        engine = runtime.deserialize_cuda_engine(plan)
        torch.cuda.synchronize()
        facts[f"{kind}_plan_mb"] = round(len(plan) / 1e6, 1)
        facts[f"{kind}_deserialized_device_mb"] = round((free0 - torch.cuda.mem_get_info()[0]) / 1e6, 1)
        runs[kind] = _SpecStep(engine, spec, layer)
    stream = torch.cuda.Stream()
    for kind, r in runs.items():
        facts[f"{kind}_us_per_step"] = round(device_us(lambda r=r: r.run(stream), steps, stream), 1)
    facts["weights_mb"] = round(sum(t.numel() * t.element_size() for t in layer.weights().values()) / 1e6, 1)
    facts["time_ratio_inputs_over_inside"] = round(facts["inputs_us_per_step"] / facts["inside_us_per_step"], 3)
    a, b = (runs[k].output(stream) for k in ("inputs", "inside"))
    rel = errors(b, a)[0]
    facts["outputs_rel_rms"] = f"{rel:.1e}"
    return rel < 1e-2, None, facts  # the same bf16 layer: only tactic choices may differ


class _SpecStep:
    """One context of `engine` bound to fixed inputs of its GraphSpec (N = COST_SEQS sequences of one token, distinct
    slots) and the weight inputs to `layer`'s tensors. Every output has a buffer of its own (never the input's
    address, which only a plan that confirms the alias may take), so the pools stay as made and every step computes
    the same thing: both plans are timed on identical work."""

    def __init__(self, engine, spec, layer: GdnLayer):
        import tensorrt as trt

        from gdn_trt.plugins.trt_common import context_memory
        from gdn_trt.runtime.trt import ContextMemory

        dev, g = torch.device("cuda"), torch.Generator(device="cpu").manual_seed(1)
        sizes = {"N": COST_SEQS, "T": COST_SEQS, "S": spec.limits.pool_slots}
        weights = layer.weights()
        self.inputs = {}
        for t in spec.inputs:
            if t.role is Role.WEIGHT:
                x = weights[t.local]
            elif t.name == "cu_seqlens":
                x = torch.arange(COST_SEQS + 1, dtype=torch.int32)
            elif t.name == "slots":
                x = torch.randperm(sizes["S"], generator=g)[:COST_SEQS].to(torch.int32)
            else:
                scale = 1.0 if t.role is Role.ACTIVATION else 0.1
                x = (torch.randn(t.shape(sizes), generator=g) * scale).to(t.torch_dtype)
            self.inputs[t.name] = x.to(dev)
        self.ctx = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        self.memory = ContextMemory(max(context_memory(engine)), dev)
        self.memory.attach(self.ctx)
        if not self.ctx.set_optimization_profile_async(0, torch.cuda.current_stream().cuda_stream):
            raise RuntimeError("TensorRT refused optimization profile 0")
        for t in spec.inputs:
            x = self.inputs[t.name]
            if t.role is not Role.WEIGHT and not self.ctx.set_input_shape(t.name, tuple(x.shape)):
                raise RuntimeError(f"TensorRT refused the shape of {t.name}")
            self.ctx.set_tensor_address(t.name, x.data_ptr())
        self.outputs = {t.name: torch.empty(tuple(self.ctx.get_tensor_shape(t.name)), dtype=t.torch_dtype,
                                            device=dev) for t in spec.outputs}
        for name, buf in self.outputs.items():
            self.ctx.set_tensor_address(name, buf.data_ptr())
        torch.cuda.synchronize()

    def run(self, stream: torch.cuda.Stream) -> None:
        if not self.ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("execute_async_v3 failed")

    def output(self, stream: torch.cuda.Stream) -> torch.Tensor:
        """x_out of one step."""
        self.run(stream)
        stream.synchronize()
        return self.outputs["x_out"].clone()


def table(checks: dict[str, dict]) -> str:
    """The report as one table: check, result, and its facts (a failed row's error first)."""
    rows = [(name, {True: "PASS", False: "FAIL", None: "INFO"}[c["ok"]],
             ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=lambda kv: kv[0] != "error") if k != "ok"))
            for name, c in checks.items()]
    w = max([len(r[0]) for r in rows] + [5])
    lines = [f"{'check':<{w}}  result  facts", f"{'-' * w}  ------  -----"]
    lines += [f"{n:<{w}}  {s:<6}  {f}" for n, s, f in rows]
    return "\n".join(lines)
