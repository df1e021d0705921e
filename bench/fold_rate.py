"""Accept's fold kernel alone (`runtime/fold.py`) beside torch's gather and scatter and the copy rate.

    python bench/fold_rate.py [--n 8,64] [--out DIR] [--smoke]

bench/runtime.py's stack (4 Qwen3-Next GDN layers: per layer a bf16 conv window and an fp32 SSM state, 2 MiB a
sequence): a verify step's stash of n x 4 token rows, n sequences accepted (one stash row each into a distinct pool
slot). Per n: the fold kernel's device time, torch's `pool.index_copy_(0, slots, stash.index_select(0, rows))` per
layer and state part (what the session does without the kernel), the bytes read and written over the copy rate
(`floor_us`, bench/common.copy_bandwidth), and each as TB/s. Each output is checked against torch's bit for bit.
Writes `<out>/<date>-fold-rate.{json,md}`. --smoke: CPU (the kernel under TRITON_INTERPRET=1), tiny shapes, each
path run once and checked, nothing timed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import RESULTS, copy_bandwidth, device_info, time_cuda, write_results

from gdn_trt.runtime import fold

DRAFTS = 4  # stash rows per sequence (a verify of 4 tokens)


def measure(n: int, bw: float | None) -> dict:
    """One n's row; bw None: --smoke (CPU, checked, not timed)."""
    import runtime as rb

    dev = "cpu" if bw is None else "cuda"
    cfg = rb.configs(bw is None)["static"]
    slots = n + 8
    pairs = []
    for _ in cfg.gdn_layer_ids:
        for shape, dt in ((cfg.conv_state_shape, torch.bfloat16), (cfg.ssm_state_shape, torch.float32)):
            pairs.append((torch.randn(n * DRAFTS, *shape, device=dev).to(dt),
                          torch.zeros(slots, *shape, device=dev, dtype=dt)))
    g = torch.Generator().manual_seed(n)
    rows = (torch.arange(n) * DRAFTS + torch.randint(0, DRAFTS, (n,), generator=g)).to(dev)
    dest = torch.randperm(slots, generator=g)[:n].to(dev)
    idx = torch.stack([rows, dest])
    table = fold.Table.of(pairs)
    moved = 2 * n * sum(src[0].numel() * src.element_size() for src, _ in pairs)

    def by_torch(i):
        for src, dst in pairs:
            dst.index_copy_(0, dest, src.index_select(0, rows))

    by_torch(0)
    want = [dst.clone() for _, dst in pairs]
    for _, dst in pairs:
        dst.zero_()
    fold.fold(table, idx)
    if not all(torch.equal(dst, w) for (_, dst), w in zip(pairs, want)):
        raise AssertionError(f"the fold kernel's pools differ from torch's at n = {n}")
    if bw is None:
        return {"n": n, "mib_moved": moved / 2**20}
    kern = time_cuda(lambda i: fold.fold(table, idx), target_s=20e-3, reps=15).median_s * 1e6
    ref = time_cuda(by_torch, target_s=20e-3, reps=15).median_s * 1e6
    floor = moved / bw * 1e6
    return {"n": n, "mib_moved": moved / 2**20, "kernel_us": kern, "torch_us": ref, "floor_us": floor,
            "kernel_TBps": moved / kern / 1e6, "torch_TBps": moved / ref / 1e6, "kernel_over_floor": kern / floor,
            "torch_over_kernel": ref / kern}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="8,64")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes: checks the script, times nothing")
    args = ap.parse_args()
    bw = None if args.smoke else copy_bandwidth()["best"]
    rows = []
    for n in (int(v) for v in args.n.split(",")):
        rows.append(measure(n, bw))
        print(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in rows[-1].items()),
              flush=True)
    meta = {"device": "cpu (smoke: no timing)"} if bw is None else {**device_info(), "copy_TBps": bw / 1e12}
    print("wrote", *write_results("fold-rate", rows, meta, list(rows[0]), out_dir=args.out), flush=True)


if __name__ == "__main__":
    main()
