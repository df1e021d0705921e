"""The selftest's proof that AOT plans run without Python plugins: each plan of an `--aot` export built with
`--plugins aot` is loaded and run in a fresh Python process that imports `tensorrt`, numpy and torch (for device
buffers) and nothing of gdn_trt, so no `gdn_trt` plugin creator exists there (the child checks both: no gdn_trt
module, no `gdn_trt` creator in TensorRT's registry). Its outputs, on inputs the parent made from the plan's
GraphSpec, must match the torch layer's on the same inputs within the compare bounds. The C++-free condition is as
close as this Python selftest gets to `trtexec --loadEngine`; the runbook gives that command for the same plans.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

CHILD = r"""
import json, sys
import numpy as np
import tensorrt as trt
import torch

plan, feeds_path, out_path, profile = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
TYPES = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16, trt.DataType.BF16: torch.bfloat16,
         trt.DataType.INT32: torch.int32}
logger = trt.Logger(trt.Logger.WARNING)
engine = trt.Runtime(logger).deserialize_cuda_engine(open(plan, "rb").read())
if engine is None:
    raise SystemExit(f"{plan}: TensorRT could not deserialize the plan in a process without gdn_trt")
ctx = engine.create_execution_context()
stream = torch.cuda.Stream()
if not ctx.set_optimization_profile_async(profile, stream.cuda_stream):
    raise SystemExit(f"profile {profile} refused")
feeds, bufs, outs = np.load(feeds_path), {}, []
for i in range(engine.num_io_tensors):
    name = engine.get_tensor_name(i)
    if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
        bufs[name] = torch.from_numpy(feeds[name]).cuda()
        if not ctx.set_input_shape(name, tuple(bufs[name].shape)):
            raise SystemExit(f"shape of {name} refused")
for i in range(engine.num_io_tensors):
    name = engine.get_tensor_name(i)
    if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:  # each output on a NaN-filled buffer of its own
        dt = TYPES[engine.get_tensor_dtype(name)]
        bufs[name] = torch.full(tuple(ctx.get_tensor_shape(name)), float("nan"), dtype=dt, device="cuda")
        outs.append(name)
for name, t in bufs.items():
    ctx.set_tensor_address(name, t.data_ptr())
torch.cuda.synchronize()
if not ctx.execute_async_v3(stream.cuda_stream):
    raise SystemExit("execute_async_v3 failed")
stream.synchronize()
np.savez(out_path, **{n: bufs[n].float().cpu().numpy() for n in outs})
creators = getattr(trt.get_plugin_registry(), "all_creators", [])
ours = sorted(c.name for c in creators if getattr(c, "plugin_namespace", "") == "gdn_trt")
print(json.dumps({"gdn_trt_modules": sorted(m for m in sys.modules if m.split(".")[0] == "gdn_trt"),
                  "gdn_trt_creators": ours}))
"""


def run_without_python_plugins(manifest, engines: Path, layers: dict, work: Path) -> tuple[bool, dict]:
    """Every plan of the AOT export `manifest` under `engines` run by `CHILD` and compared with the torch layers
    (CUDA) on the same inputs. Returns (all passed, facts)."""
    from gdn_trt.export.compare import weight_feed
    from gdn_trt.export.data import GraphData
    from gdn_trt.export.runners import TorchRunner
    from gdn_trt.export.tolerances import bound, errors, within

    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    failed, worst, ran = [], (0.0, ""), 0
    for rec in manifest.graphs:
        spec = rec.spec
        run = [layers[i] for i in spec.layer_ids]
        data = GraphData(spec, 1, weights=weight_feed(spec, run))
        feed = next(iter(data))
        profile = spec.bucket_for({**data.cases[0].sizes(), "S": spec.limits.pool_slots})
        torch_runner = TorchRunner(run, spec, "cuda")
        with torch_runner:
            ref = torch_runner.infer(feed)
        stem = f"{spec.folder}-{spec.stem}"
        feeds_path, out_path = work / f"{stem}.in.npz", work / f"{stem}.out.npz"
        np.savez(feeds_path, **feed)
        plan = engines / Path(rec.path).with_suffix(".plan")
        proc = subprocess.run([sys.executable, "-c", CHILD, str(plan), str(feeds_path), str(out_path), str(profile)],
                              capture_output=True, text=True, env=env, timeout=600, cwd=work)
        if proc.returncode != 0:
            failed.append(f"{stem}: exit {proc.returncode}: {(proc.stderr or proc.stdout)[-300:]}")
            continue
        seen = json.loads(proc.stdout.strip().splitlines()[-1])
        if seen["gdn_trt_modules"] or seen["gdn_trt_creators"]:
            failed.append(f"{stem}: the child had gdn_trt loaded: {seen}")
            continue
        got = np.load(out_path)
        ran += 1
        for name in spec.output_names:
            rel, mx = errors(ref[name], got[name])
            if not within(bound(spec, name), rel, mx):
                failed.append(f"{stem}: {name} rel RMS {rel:.1e} > {bound(spec, name).rel_rms:.0e}")
            worst = max(worst, (rel, f"{stem}.{name}"))
    facts = {"plans_run_without_gdn_trt": f"{ran}/{len(manifest.graphs)}", "worst": f"{worst[1]} {worst[0]:.1e}",
             "failed": failed[:3]}
    return not failed and ran == len(manifest.graphs), facts
