"""The main job (`make run`): export, compare, build when TensorRT is there, then serve a continuous-batching scenario.

On the built-in defaults, a synthetic Qwen3.5-like plain stack (`tiny-3.5`) and a Qwen4-Exp-like hc+PLE stack
(`tiny-4exp`), written as real HF checkpoints under `artifacts/checkpoints/` and loaded back:
1. export every layer mode of each layer variant to ONNX (`export.artifacts.export_checkpoint`);
2. compare torch against ONNX Runtime on every exported graph through Polygraphy (`export.compare`);
3. build TensorRT plans when tensorrt imports (else the stage is reported as skipped, with the reason);
4. run `app.scenario` on the best available backend, with per-sequence LoRA adapters (three synthetic PEFT
   adapters under `artifacts/adapters/`, rotated through two adapter slots), and check every result against the
   float64 sequential reference; print a summary table and write `artifacts/run-report.json`. Exit status 1 when
   anything failed.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gdn_trt.export import cliargs
from gdn_trt.model.checkpoint import load_checkpoint, make_synthetic_checkpoint
from gdn_trt.model.config import DEFAULT_HC_PRESET, DEFAULT_PRESET
from gdn_trt.model.lora import LoraLimits
from gdn_trt.model.peft import SyntheticAdapter, load_adapter, make_synthetic_adapter
from gdn_trt.runtime.budget import RuntimeLimits
from gdn_trt.runtime.session import Session, SessionOptions

from .scenario import run_scenario

log = logging.getLogger("gdn_trt.app")
LIMITS = RuntimeLimits(max_seqs=8, max_prefill_tokens=256, max_draft=4, ple_cache_rows=256,
                       lora=LoraLimits(max_adapters=2, max_rank=8))
ADAPTERS = (SyntheticAdapter(r=4, alpha=8.0), SyntheticAdapter(r=8, alpha=4.0, use_rslora=True),
            SyntheticAdapter(r=2, alpha=2.0, targets=("out_proj",)))


@dataclass
class Stage:
    model: str
    name: str
    ok: bool
    seconds: float
    detail: str
    items: list = field(default_factory=list)
    skipped: bool = False  # did not run (ok stays True: a skip does not fail the job); `detail` says why

    @property
    def result(self) -> str:
        return "skipped" if self.skipped else ("ok" if self.ok else "FAILED")


def _timed(model: str, name: str, fn) -> Stage:
    t0 = time.perf_counter()
    try:
        ok, detail, items = fn()
    except Exception as e:  # a stage that crashes is reported as failed with its reason; the run goes on
        log.exception("%s: %s failed", model, name)
        ok, detail, items = False, f"{type(e).__name__}: {e}", []
    return Stage(model, name, ok, time.perf_counter() - t0, detail, items)


def export_and_compare(ckpt_dir: Path, out: Path) -> tuple[Stage, Stage]:
    """Every mode of every layer variant to ONNX, then torch vs ONNX Runtime on each graph."""
    from gdn_trt.export.artifacts import ExportPlan, Manifest, export_checkpoint
    from gdn_trt.export.compare import CompareOptions, compare_graph, layers_of
    from gdn_trt.export.report import write_report

    ck = load_checkpoint(ckpt_dir)
    name = ck.config.name
    holder = {}

    def export():
        holder["manifest"] = path = export_checkpoint(ck, out / "onnx" / name, ExportPlan(layers="variants"))
        m = Manifest.load(path)
        holder["m"] = m
        return True, f"{len(m.graphs)} graphs -> {m.root}", [r.summary() for r in m.graphs]

    def compare():
        from polygraphy.logger import G_LOGGER

        G_LOGGER.module_severity = G_LOGGER.WARNING  # per-iteration tensor statistics: the JSON files keep them
        m = holder["m"]
        layers = layers_of(m, m.data["dtype"])
        opts = CompareOptions(("torch", "onnxrt"), "cpu", 1)
        res = [compare_graph(m, rec, layers, opts) for rec in m.graphs]
        bad = [r for r in res if not r.passed]
        path, _ = write_report(res, out / "compare" / name, {"device": "cpu", "iterations": 1})
        return not bad, f"{len(res) - len(bad)}/{len(res)} graphs torch == onnxrt ({path})", \
            [r.summary() for r in res]

    e = _timed(name, "export", export)
    c = _timed(name, "compare torch vs onnxrt", compare) if e.ok else Stage(name, "compare", False, 0, "no export")
    return e, c


def build_plans(ckpt_dir: Path, out: Path) -> tuple[Stage, Path | None]:
    """TensorRT plans of every layer and mode, or one line saying why there are none. (The compare stage exports
    one layer per variant; a stack needs a plan for every layer, so the rest are exported here first.)"""
    name = load_checkpoint(ckpt_dir).config.name
    try:
        import tensorrt  # noqa: F401
    except ImportError as e:
        return Stage(name, "build TensorRT engines", True, 0.0, f"TensorRT is not installed ({e})",
                     skipped=True), None
    from gdn_trt.export.artifacts import ExportPlan, Manifest, export_checkpoint
    from gdn_trt.export.build import BuildOptions, build_graph
    from gdn_trt.export.spec import Limits

    engines = out / "engines" / name  # one model's plans: another model's would be refused

    def build():
        plan = ExportPlan(layers="all", limits=Limits(lora=LIMITS.lora))  # the session's adapter slots
        m = Manifest.load(export_checkpoint(load_checkpoint(ckpt_dir), out / "onnx-all" / name, plan))
        plans = [build_graph(m, rec, BuildOptions(engines)) for rec in m.graphs]
        return True, f"{len(plans)} plans -> {engines}", [str(p) for p in plans]

    st = _timed(name, "build TensorRT engines", build)
    return st, (engines if st.ok else None)


def serve(ckpt_dir: Path, engines: Path | None, device: str, seed: int) -> tuple[Stage, dict]:
    """The scenario on the best available backend, with per-sequence adapters, every result checked."""
    ck = load_checkpoint(ckpt_dir)
    report = {}

    def run():
        backend = "auto" if engines is not None else "torch"
        sess = Session.open(ck, engines_dir=str(engines) if engines else None, backend=backend, device=device,
                            options=SessionOptions(limits=LIMITS))
        root = ckpt_dir.parent.parent / "adapters" / ck.config.name
        adapters = {f"lora{k}": load_adapter(make_synthetic_adapter(ck.config, root / f"lora{k}", spec, seed=seed + k),
                                             ck.config, f"lora{k}") for k, spec in enumerate(ADAPTERS)}
        sc, checks = run_scenario(sess, ck, seed, adapters)
        stats = sess.stats()
        report.update(backend=sorted({e.name for c in sess.selector.engines for e in c}), device=str(sess.device),
                      dtype=str(sess.dtype), checks=[{**asdict(c), "ok": c.ok} for c in checks],
                      stats=stats.table().splitlines())
        lines = [f"{'ok ' if c.ok else 'BAD'} {c.name}: rel RMS {c.rel_rms:.2e} (bound {c.bound:.0e}), "
                 f"max-abs {c.max_abs:.2e}" for c in checks] + stats.table().splitlines()
        bad = [c for c in checks if not c.ok]
        return not bad, f"{len(checks) - len(bad)}/{len(checks)} checks pass on {report['backend']} " \
                        f"{report['device']} {report['dtype']}", lines

    return _timed(ck.config.name, "continuous-batching scenario", run), report


def main(argv: list[str] | None = None) -> int:
    p = cliargs.Parser(prog="python -m gdn_trt.app.main", description=__doc__)
    p.add_argument("--out", type=Path, default=Path("artifacts"), help="folder of everything the job writes")
    p.add_argument("--presets", default=f"{DEFAULT_PRESET},{DEFAULT_HC_PRESET}", help="comma-separated presets")
    p.add_argument("--device", type=cliargs.device, default="auto", help="cpu, cuda or auto")
    p.add_argument("--no-export", action="store_true", help="skip export / compare / build (scenario only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic checkpoints and inputs")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    device = args.device
    t0 = time.perf_counter()
    stages, reports = [], {}
    for name in args.presets.split(","):
        ckpt = make_synthetic_checkpoint(name, args.out / "checkpoints" / name, seed=args.seed)
        print(f"== {name}: synthetic checkpoint {ckpt}", flush=True)
        engines = None
        if not args.no_export:
            stages += export_and_compare(ckpt, args.out)
            st, engines = build_plans(ckpt, args.out)
            stages.append(st)
        st, reports[name] = serve(ckpt, engines, device, args.seed)
        stages.append(st)
        for s in stages:
            if s.model == name:
                print(f"   {s.name}: {s.result} ({s.seconds:.1f} s) {s.detail}", flush=True)
                for item in s.items:
                    print(f"      {item}")
    total = time.perf_counter() - t0
    _summary(stages, total)
    report = {"device": device, "seconds": total, "passed": all(s.ok for s in stages),
              "stages": [{**asdict(s), "result": s.result} for s in stages], "scenarios": reports}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run-report.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"report: {args.out / 'run-report.json'}")
    return 0 if report["passed"] else 1


def _summary(stages: list[Stage], total: float) -> None:
    w = max(len(s.name) for s in stages)
    print(f"\n{'model':<10} {'stage':<{w}} {'result':<7} {'time':>7}  detail")
    for s in stages:
        print(f"{s.model:<10} {s.name:<{w}} {s.result:<7} {s.seconds:>6.1f}s  {s.detail}")
    skipped = sum(s.skipped for s in stages)
    print(f"{'total':<10} {'':<{w}} {'ok' if all(s.ok for s in stages) else 'FAILED':<7} {total:>6.1f}s"
          + (f"  ({skipped} stage{'s' if skipped != 1 else ''} skipped)" if skipped else ""))


if __name__ == "__main__":
    sys.exit(main())
