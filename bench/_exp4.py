"""EXPERIMENT: cuBLAS against cuBLASLt (torch's preferred_blas_library) on the decode projections."""
import torch
import torch.nn.functional as F
from common import time_cuda

from gdn_trt.plugins.glue import gemm

shapes = {"in_proj": (12352, 2048), "out_proj": (2048, 4096)}
for m in (1, 8, 64, 256):
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        sets = 4
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
        ws = [w.clone() for _ in range(sets)]
        zb = torch.zeros(n, device="cuda", dtype=torch.bfloat16)
        out = {}
        for lib in ("cublas", "cublaslt"):
            torch.backends.cuda.preferred_blas_library(lib)
            out[lib] = time_cuda(lambda i: F.linear(xs[i % sets], ws[i % sets]), sets).median_us
            out[lib + "+bias"] = time_cuda(lambda i: F.linear(xs[i % sets], ws[i % sets], zb), sets).median_us
        torch.backends.cuda.preferred_blas_library("cublas")
        try:
            out["ours"] = time_cuda(lambda i: gemm.launch(xs[i % sets], ws[i % sets], gemm.config_for(m, n)), sets).median_us
        except Exception as e:  # noqa: BLE001
            out["ours"] = float("nan")
        floor = n * k * 2 / 4.25e6
        print(f"GEMM M={m:3d} {name:8s} floor {floor:5.1f} " + "  ".join(f"{a} {b:6.2f}" for a, b in out.items()), flush=True)
