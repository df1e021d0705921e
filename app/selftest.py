"""TensorRT selftest: the questions only a machine with TensorRT and a GPU can answer, answered in one run.

    gdn-trt selftest [--out artifacts/selftest] [--steps 50] [--no-nsys] [--no-flow] [--no-cost]

1. Environment: TensorRT >= `MIN_TRT`, a CUDA device, Triton. Without any of them it exits 2 and names everything
   missing; it never reports a result it did not obtain.
2. Plugins: the plugin modules import and TensorRT's registry resolves all twelve creators (name, "1", "gdn_trt"):
   the six ops and the six pass plugins of their AOT form.
3. Parse and build, at Qwen3-Next's layer shapes: a one-node graph of `gated_delta_rule_recurrent` (decode, a
   65-slot fp32 pool of 136 MB) and one of `causal_conv1d_update` (dilation 2: the int attributes reach the real
   parser and creator).
4. Aliasing: what `ICudaEngine.get_aliased_input_tensor` says of each `<x>_out` ("absent" before TensorRT 10.15).
5. One step of each engine against the same Triton kernels called directly on the same inputs (the plugin runs
   exactly them, so results must be bit-identical): (a) the aliased output bound to the input's address, (b) bound
   to a buffer of its own (NaN-poisoned), as the runtime does where the plan does not confirm the alias. (b) must
   pass; (a) must pass where the plan confirms the alias (the runtime then binds in place), else it is reported.
6. Pool copies: per-step device time of the GDN engine in place, with its own buffer plus the copy back, of the
   Triton kernel alone and of one plain pool copy. The GPU is held by a sleep kernel while the host enqueues the
   steps, so the CUDA events around them time device work only (a JIT Python plugin costs more host time per
   step than this step's kernels). "copies per step" = (in-place step - kernel) / pool copy: about 1 means
   TensorRT copies the pool every step despite the aliasing. With `nsys` on PATH the in-place loop is also
   profiled and the device-to-device memcpys and kernels per step are listed.
7. The whole flow (`selftest_flow.py`, `--no-flow` skips it): export, build every mode per layer and as stacks,
   compare torch vs ONNX Runtime vs TensorRT, the continuous-batching scenario on the TensorRT engines; and one
   model in the AOT form (`--aot`, `--plugins aot`), whose plans also run in a fresh process without gdn_trt.
8. The cost of weights as graph inputs (`--no-cost` skips it): one Qwen3-Next layer's plan with weights as inputs
   against one with the weights inside: device memory when deserialized, device time per step, outputs compared.

Exit 0: every check passed; 1: a check failed; 2: TensorRT, CUDA or Triton missing. It ends with one table of every
check; the figures and verdicts also go to `<out>/selftest.json`.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from onnx import TensorProto, helper

from gdn_trt.model.config import preset
from gdn_trt.plugins.causal_conv1d.io import ConvParams
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Packing
from gdn_trt.plugins.spec import CONV_UPDATE, GDN_RECURRENT, NAMESPACE, PLUGIN_VERSION, PLUGINS, OpSpec

MODEL = "qwen3-next-80b-a3b"
SLOTS, SEQ_SLOTS, DILATION = 65, (3, 17, 40, 64), 2
_ONNX = {torch.float32: TensorProto.FLOAT, torch.bfloat16: TensorProto.BFLOAT16, torch.int32: TensorProto.INT32,
         torch.float16: TensorProto.FLOAT16}


@dataclass
class Report:
    checks: dict[str, dict] = field(default_factory=dict)

    def add(self, name: str, ok: bool | None, **facts) -> None:
        """ok None = a measurement or an observation, not a pass/fail check."""
        self.checks[name] = {"ok": ok, **facts}
        status = {True: "PASS", False: "FAIL", None: "INFO"}[ok]
        print(f"{status} {name}: " + ", ".join(f"{k}={v}" for k, v in facts.items()), flush=True)

    @property
    def failed(self) -> list[str]:
        return [n for n, c in self.checks.items() if c["ok"] is False]


def missing() -> str | None:
    """Everything this machine lacks for the selftest, '; '-joined (None = nothing)."""
    from gdn_trt.export.build import TrtUnavailable, import_tensorrt

    lacks = []
    try:
        import_tensorrt()
    except TrtUnavailable as e:
        lacks.append(str(e))
    if not torch.cuda.is_available():
        lacks.append("no CUDA device: the selftest runs TensorRT engines on a GPU")
    if importlib.util.find_spec("triton") is None:
        lacks.append("triton is not installed (pip install 'gdn-trt[gpu]'): the JIT plugins launch Triton kernels")
    return "; ".join(lacks) or None


def one_op_model(spec: OpSpec, feeds: dict[str, torch.Tensor], attrs: dict[str, int]):
    """A one-node ONNX model of `spec` (the `gdn_trt` node and its function body) with static shapes: the
    activation output like `v` / `x`, each buffer output like its input."""
    from gdn_trt.plugins.causal_conv1d import onnx as conv_onnx
    from gdn_trt.plugins.gated_delta_rule import onnx as gdn_onnx

    fn = {f.name: f for f in (*gdn_onnx.functions(), *conv_onnx.functions())}[spec.name]
    node = helper.make_node(spec.name, list(spec.inputs), list(spec.outputs), domain=NAMESPACE,
                            plugin_namespace=NAMESPACE, plugin_version=PLUGIN_VERSION, **attrs)
    like = {spec.outputs[0]: "v" if "v" in feeds else "x", **{o: i for o, i in spec.aliases}}
    act = feeds["q" if "q" in feeds else "x"].dtype
    ins = [helper.make_tensor_value_info(n, _ONNX[t.dtype], list(t.shape)) for n, t in feeds.items()]
    outs = [helper.make_tensor_value_info(o, _ONNX[act if o == spec.outputs[0] else feeds[like[o]].dtype],
                                          list(feeds[like[o]].shape)) for o in spec.outputs]
    return helper.make_model(helper.make_graph([node], spec.name, ins, outs), functions=[fn],
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(NAMESPACE, 1)])


def gdn_feeds(dtype: torch.dtype, dev: torch.device) -> dict[str, torch.Tensor]:
    """Decode at Qwen3-Next's shapes: len(SEQ_SLOTS) sequences of one token, a SLOTS-row fp32 pool."""
    c, g = preset(MODEL), torch.Generator(device="cpu").manual_seed(0)
    H, K, HV, V, N = (c.linear_num_key_heads, c.linear_key_head_dim, c.linear_num_value_heads,
                      c.linear_value_head_dim, len(SEQ_SLOTS))
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    f = {"q": r(N, H, K), "k": r(N, H, K), "v": r(N, HV, V), "a": r(N, HV), "b": r(N, HV)}
    f = {k: t.to(dtype) for k, t in f.items()}
    f |= {"A_log": torch.rand(HV, generator=g).mul(2.7).log1p(), "dt_bias": r(HV),
          "cu_seqlens": torch.arange(N + 1, dtype=torch.int32), "slots": torch.tensor(SEQ_SLOTS, dtype=torch.int32),
          "ssm_pool": r(SLOTS, HV, K, V) * 0.1}
    return {k: t.to(dev) for k, t in f.items()}


def conv_feeds(dtype: torch.dtype, dev: torch.device) -> dict[str, torch.Tensor]:
    c, g, N = preset(MODEL), torch.Generator(device="cpu").manual_seed(1), len(SEQ_SLOTS)
    D, W = c.conv_dim, c.linear_conv_kernel_dim
    f = {"x": torch.randn(N, D, generator=g).to(dtype), "weight": torch.randn(D, W, generator=g).to(dtype),
         "cu_seqlens": torch.arange(N + 1, dtype=torch.int32), "slots": torch.tensor(SEQ_SLOTS, dtype=torch.int32),
         "conv_pool": torch.randn(SLOTS, (W - 1) * DILATION, D, generator=g).to(dtype)}
    return {k: t.to(dev) for k, t in f.items()}


def reference(spec: OpSpec, feeds: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton entry point the plugin launches, on copies: (activation output, updated pool)."""
    pack = Packing(feeds["cu_seqlens"], feeds["slots"])
    if spec is GDN_RECURRENT:
        from gdn_trt.plugins.gated_delta_rule import triton as kernels

        pool = feeds["ssm_pool"].clone()
        x = GdnInputs(*(feeds[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")))
        return kernels.recurrent(x, pack, pool), pool
    from gdn_trt.plugins.causal_conv1d import triton as kernels

    pool = feeds["conv_pool"].clone()
    return kernels.update(feeds["x"], ConvParams(feeds["weight"], DILATION, 1), pack, pool), pool


class Step:
    """One engine, one USER_MANAGED context on its own scratch, bound to `feeds`; `own_buffer` binds the aliased
    output to a buffer of its own (copied back by `run`, as the runtime does) instead of the pool's address."""

    def __init__(self, engine, spec: OpSpec, feeds: dict[str, torch.Tensor], stream: torch.cuda.Stream):
        import tensorrt as trt

        from gdn_trt.export.build import context_memory
        from gdn_trt.runtime.trt import ContextMemory

        self.spec, self.feeds, self.stream = spec, feeds, stream
        self.ctx = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        self.memory = ContextMemory(max(context_memory(engine)), feeds["slots"].device)
        self.memory.attach(self.ctx)
        if not self.ctx.set_optimization_profile_async(0, stream.cuda_stream):
            raise RuntimeError("set_optimization_profile_async refused profile 0")
        [(self.out_name, self.pool_name)] = spec.aliases
        self.pool = feeds[self.pool_name]
        like, act = ("v", "q") if "v" in feeds else ("x", "x")
        self.act = torch.empty_like(feeds[like], dtype=feeds[act].dtype)
        self.own = torch.full_like(self.pool, float("nan"))
        for n, t in feeds.items():
            if not (self.ctx.set_input_shape(n, tuple(t.shape)) and self.ctx.set_tensor_address(n, t.data_ptr())):
                raise RuntimeError(f"TensorRT refused input {n} {tuple(t.shape)}")
        self.ctx.set_tensor_address(spec.outputs[0], self.act.data_ptr())
        self.bind(own_buffer=False)
        stream.wait_stream(torch.cuda.current_stream())  # the feeds and buffers were written on the current stream

    def bind(self, own_buffer: bool) -> None:
        self.own_buffer = own_buffer
        if not self.ctx.set_tensor_address(self.out_name, (self.own if own_buffer else self.pool).data_ptr()):
            raise RuntimeError(f"TensorRT refused the address of {self.out_name}")

    def run(self) -> None:
        if not self.ctx.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError(f"execute_async_v3 failed ({self.spec.name})")
        if self.own_buffer:
            with torch.cuda.stream(self.stream):
                self.pool.copy_(self.own)


def device_us(fn, steps: int, stream: torch.cuda.Stream) -> float:
    """Device microseconds per call of `fn` (which enqueues on `stream`), events around `steps` calls queued
    behind a sleep kernel long enough to cover the host's enqueueing."""
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        host_s = time.perf_counter() - t0
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2 * host_s * 2e9) + 1_000_000)  # ~2x the host time at <= 2 GHz
        start.record(stream)
        for _ in range(steps):
            fn()
        end.record(stream)
        end.synchronize()
    return start.elapsed_time(end) * 1e3 / steps


def copies_per_step(in_place_us: float, kernel_us: float, copy_us: float) -> float:
    """Pool copies TensorRT adds to a step: its device time beyond the kernel's, in units of one pool copy."""
    return round(max(in_place_us - kernel_us, 0.0) / copy_us, 2)


def build(trt, spec: OpSpec, feeds: dict, attrs: dict, out: Path):
    """The one-node graph built with the JIT plugin (the Triton kernel it launches is what the checks compare
    against; PREFER_JIT_PYTHON_PLUGINS where the op also has an AOT impl)."""
    from polygraphy.backend.trt import EngineFromNetwork

    from gdn_trt.export.build import create_config, network_flags, network_loader

    path = out / f"{spec.name}.onnx"
    path.write_bytes(one_op_model(spec, {k: v.cpu() for k, v in feeds.items()}, attrs).SerializeToString())
    t0 = time.perf_counter()
    network = network_loader(trt, path, network_flags(trt, "jit"))
    engine = EngineFromNetwork(network, config=create_config(trt, []))()
    (out / f"{spec.name}.plan").write_bytes(bytes(engine.serialize()))
    return engine, time.perf_counter() - t0


def check_op(trt, spec: OpSpec, feeds: dict, attrs: dict, rep: Report, out: Path) -> Step | None:
    try:
        engine, secs = build(trt, spec, feeds, attrs, out)
    except Exception as e:  # noqa: BLE001 - the report names it; the other op still runs
        rep.add(f"{spec.name}: parse and build", False, error=f"{type(e).__name__}: {e}")
        return None
    rep.add(f"{spec.name}: parse and build", True, seconds=round(secs, 1), attrs=attrs)
    [(out_name, pool_name)] = spec.aliases
    api = getattr(engine, "get_aliased_input_tensor", None)
    answer = "absent (TensorRT < 10.15)" if api is None else api(out_name)
    confirmed = api is not None and answer == pool_name
    rep.add(f"{spec.name}: get_aliased_input_tensor({out_name})", None, answer=answer, confirmed=confirmed)
    try:
        return _steps(engine, spec, feeds, confirmed, rep)
    except Exception as e:  # noqa: BLE001
        rep.add(f"{spec.name}: step", False, error=f"{type(e).__name__}: {e}")
        return None


def _steps(engine, spec: OpSpec, feeds: dict, confirmed: bool, rep: Report) -> Step:
    """One step bound in place and one on an own (NaN) buffer, each against the Triton reference."""
    [(out_name, pool_name)] = spec.aliases
    act_ref, pool_ref = reference(spec, feeds)
    stream = torch.cuda.Stream()
    original = feeds[pool_name].clone()
    step = Step(engine, spec, feeds, stream)
    for own in (False, True):
        feeds[pool_name].copy_(original)
        step.own.fill_(float("nan"))
        step.bind(own)
        stream.wait_stream(torch.cuda.current_stream())
        if not step.ctx.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("execute_async_v3 returned False")
        stream.synchronize()
        got = step.own if own else step.pool
        ok = torch.equal(step.act, act_ref) and torch.equal(got, pool_ref)
        facts = {"output_equal": torch.equal(step.act, act_ref), "pool_equal": torch.equal(got, pool_ref),
                 "untouched_rows_equal": _untouched_equal(got, original, feeds["slots"])}
        if own:
            facts["input_buffer_changed"] = not torch.equal(feeds[pool_name], original)
            rep.add(f"{spec.name}: step, {out_name} on its own buffer", ok, **facts)
        else:
            rep.add(f"{spec.name}: step, {out_name} on {pool_name}'s address", ok if confirmed else None, **facts)
    feeds[pool_name].copy_(original)
    step.bind(False)
    stream.wait_stream(torch.cuda.current_stream())
    return step


def _untouched_equal(got: torch.Tensor, original: torch.Tensor, slots: torch.Tensor) -> bool:
    keep = torch.ones(got.shape[0], dtype=torch.bool, device=got.device)
    keep[slots.long()] = False
    return torch.equal(got[keep], original[keep])


def measure_copies(step: Step, steps: int, rep: Report) -> None:
    feeds, spec = step.feeds, step.spec
    from gdn_trt.plugins.gated_delta_rule import triton as kernels

    x = GdnInputs(*(feeds[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias")))
    pack = Packing(feeds["cu_seqlens"], feeds["slots"])
    spare = torch.empty_like(step.pool)
    step.stream.wait_stream(torch.cuda.current_stream())
    step.bind(False)
    in_place = device_us(step.run, steps, step.stream)
    step.bind(True)
    own = device_us(step.run, steps, step.stream)
    step.bind(False)
    kernel = device_us(lambda: kernels.recurrent(x, pack, step.pool), steps, step.stream)
    copy = device_us(lambda: spare.copy_(step.pool), steps, step.stream)
    n = copies_per_step(in_place, kernel, copy)
    rep.add(f"{spec.name}: pool copies per step", None, pool_mb=round(step.pool.numel() * 4 / 1e6, 1),
            trt_in_place_us=round(in_place, 1), trt_own_buffer_and_copy_back_us=round(own, 1),
            triton_kernel_us=round(kernel, 1), pool_copy_us=round(copy, 1), copies_per_step=n,
            verdict="TensorRT copies the pool each step" if n >= 0.5 else "no pool copy: the plugin updates in place")


def nsys_profile(out: Path, steps: int, rep: Report) -> None:
    """The in-place GDN loop under nsys (`--inner`): device-to-device memcpys and kernels per step."""
    nsys = shutil.which("nsys")
    if nsys is None:
        rep.add("nsys profile", None, skipped="nsys is not on PATH")
        return
    prof = out / "selftest_inner"
    cmd = [nsys, "profile", "--trace=cuda", "--capture-range=cudaProfilerApi", "--force-overwrite=true",
           "-o", str(prof), sys.executable, "-m", "gdn_trt.app.selftest", "--inner", str(steps), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        rep.add("nsys profile", None, error=r.stderr.strip()[-500:])
        return
    facts = {}
    for report in ("cuda_gpu_mem_size_sum", "cuda_gpu_kern_sum"):
        s = subprocess.run([nsys, "stats", "--report", report, "--format", "csv", "--output", "-",
                            f"{prof}.nsys-rep"], capture_output=True, text=True, timeout=600)
        for row in _csv_rows(s.stdout):
            name = row.get("Operation") or row.get("Name") or "?"
            count = row.get("Count") or row.get("Instances") or "0"
            facts[name[:80]] = round(float(count) / steps, 2)
    rep.add("nsys profile: per step", None, **facts)


def _csv_rows(text: str) -> list[dict]:
    """The rows of an `nsys stats --format csv` table (whatever lines nsys prints before its header)."""
    lines = text.splitlines()
    head = next((i for i, ln in enumerate(lines) if ("Operation" in ln or "Name" in ln) and "," in ln), None)
    return [] if head is None else list(csv.DictReader(io.StringIO("\n".join(lines[head:]))))


def inner(steps: int, out: Path) -> int:
    """Run `steps` in-place GDN steps from the saved plan between cudaProfilerStart/Stop (for nsys)."""
    import tensorrt as trt

    from gdn_trt.export.build import load_plugins

    load_plugins()
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
        (out / f"{GDN_RECURRENT.name}.plan").read_bytes())
    feeds, stream = gdn_feeds(torch.bfloat16, torch.device("cuda")), torch.cuda.Stream()
    step = Step(engine, GDN_RECURRENT, feeds, stream)
    for _ in range(3):
        step.run()
    stream.synchronize()
    torch.cuda.profiler.start()
    for _ in range(steps):
        step.run()
    stream.synchronize()
    torch.cuda.profiler.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    from gdn_trt.export.cliargs import Parser, positive_int

    p = Parser(prog="gdn-trt selftest", description=__doc__.split("\n\n")[0],
               epilog="examples:\n  gdn-trt selftest\n  gdn-trt selftest --out /tmp/selftest --steps 200 --no-nsys\n"
                      "Exit 0 when every check passed, 1 when one failed, 2 without TensorRT, CUDA or Triton.")
    p.add_argument("--out", type=Path, default=Path("artifacts/selftest"), help="plans, ONNX files, selftest.json")
    p.add_argument("--steps", type=positive_int, default=50, help="steps per timing")
    p.add_argument("--no-nsys", action="store_true", help="skip the nsys profile even where nsys exists")
    p.add_argument("--no-flow", action="store_true", default=False,
                   help="skip the whole flow (export, build every mode and stack, compare, scenario on TensorRT)")
    p.add_argument("--no-cost", action="store_true", default=False,
                   help="skip the cost of weights as graph inputs (a Qwen3-Next layer built both ways)")
    p.add_argument("--inner", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    why = missing()
    if why is not None:
        print(f"gdn-trt selftest: cannot run: {why}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.inner:
        return inner(args.inner, args.out)
    import tensorrt as trt

    from gdn_trt.export.build import load_plugins

    rep = Report()
    rep.add("environment", True, tensorrt=trt.__version__, torch=torch.__version__,
            gpu=torch.cuda.get_device_name(0), python=sys.version.split()[0])
    load_plugins()
    reg = trt.get_plugin_registry()
    found = {s.name: reg.get_creator(s.name, PLUGIN_VERSION, NAMESPACE) is not None for s in PLUGINS}
    rep.add("plugin creators registered", all(found.values()), missing=[n for n, ok in found.items() if not ok],
            creators=len(found))
    dev = torch.device("cuda")
    gdn = check_op(trt, GDN_RECURRENT, gdn_feeds(torch.bfloat16, dev), {}, rep, args.out)
    check_op(trt, CONV_UPDATE, conv_feeds(torch.bfloat16, dev), {"dilation": DILATION, "activation": 1}, rep,
             args.out)
    if gdn is not None:
        measure_copies(gdn, args.steps, rep)
        if not args.no_nsys:
            nsys_profile(args.out, args.steps, rep)
    from . import selftest_flow as flow

    if not args.no_flow:
        flow.run_flow(args.out, rep)
    if not args.no_cost:
        flow.weights_cost(args.out, args.steps, rep, device_us)
    (args.out / "selftest.json").write_text(json.dumps(rep.checks, indent=2, default=str))
    print("\n" + flow.table(rep.checks))
    print(f"{len(rep.checks) - len(rep.failed)}/{len(rep.checks)} checks passed or reported, failed: "
          f"{rep.failed or 'none'}; report: {args.out / 'selftest.json'}")
    return 1 if rep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
