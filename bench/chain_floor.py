"""The decode step's launch structure at the copy rate: what separate kernels cost before any of them computes.

    python bench/chain_floor.py [--n 64,256] [--out DIR] [--smoke]

Issue 15's decode target is device time at most 1.25x the floor (the layer weights and every sequence's state read
and written once, at the copy rate) at N >= 64. A layer of the step launches six kernels (the input norm, in_proj,
the conv update, the GDN decode, the gated norm, out_proj). Here each of them is replaced by `probes.stream_kernel`
moving exactly its bytes (weights read; activations read and written; the conv and SSM state read and written), so
a chain's time is what the step's launch structure costs with kernels that do nothing but stream. Rows per N, for
bench/runtime.py's stack (4 Qwen3-Next GDN layers, bf16 activations, fp32 state; each layer on buffers of its own):
- `floor`: bytes over the copy rate, as bench/runtime.py counts them (no launch);
- `1 launch`: every byte of the step in one launch;
- `1 a layer`: one launch a layer (what a persistent layer kernel could reach);
- `3 a layer`: the norm with in_proj, the conv with the GDN decode, the gated norm with out_proj;
- `6 a layer`: the step's six kernels with PDL as the step launches them, and `6 a layer, no PDL`;
- `1 a layer, 6 phases, R/SM`: one persistent launch a layer of R programs per SM whose phases are the six kernels'
  bytes with a grid barrier between each two (`PhasedChain`): the structure of a layer megakernel, in which a phase
  waits for the whole previous phase as a kernel does, but without a launch;
- `ours`: the step itself, its CUDA graphs replayed back to back (bench/runtime.py's `static` stack, `replay_us`).
A chain is timed as back-to-back steps captured in one CUDA graph (`common.time_cuda`). `over_floor` is the row's
time over `floor`; `excess_us` its time less the floor. Writes `<out>/<date>-chain-floor.{json,md,png}`.

Then, per N, where the step loses its time against `6 a layer` (`<out>/<date>-chain-trace.{json,md}`): one step of
each under torch.profiler (`step_trace.trace`), every kernel credited with how far it moves the step on (its start
to the next kernel's start; the last, to the step's end: the credits sum to the step's span), summed per kernel of
the layer over the layers. The step's kernels are told apart by name (`roles_of`): a layer starts at
`norm_kernel`; its GEMMs are the launches between the norm and the conv update (in_proj) and the first launch after
the gated norm (out_proj); launches before the first layer are `head`, any other launch is `other` (the last layer's
residual add).
On the H200 (2026-12-05, bench/results/2026-12-05-chain-{floor,trace}-h200.md) at N = 64: floor 320 us, one
streaming launch 357 (1.12x), six a layer 387 (1.21x), the step 432 (1.35x); of the step's 37 us over the traced
chain, in_proj (cuBLAS) 25 us and the input norm 10.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import probes
import torch
import triton

from common import RESULTS, copy_bandwidth, device_info, bar_figure, time_cuda, write_results

from gdn_trt.model.config import GdnConfig
from gdn_trt.runtime.budget import slot_bytes, weight_bytes

BLOCK, WARPS = 4096, 8  # variants.floors' Triton copy: 16 KB of fp32 a program
KERNELS = ("norm", "in_proj", "conv", "gdn", "gated_norm", "out_proj")
# each chain: the kernels before which a new launch starts (the step's kernels in order, layer after layer)
CHAINS = {"1 launch": frozenset(), "1 a layer": frozenset({"norm"}),
          "3 a layer": frozenset({"norm", "conv", "gated_norm"}), "6 a layer": frozenset(KERNELS)}
RESIDENT = (1, 2, 4)  # programs per SM of the persistent layer chains (PhasedChain)
# (no chain merges across layers: in a model the host's MLP or attention runs between two GDN layers, so only this
# benchmark's stack of GDN layers back to back would have out_proj and the next layer's in_proj adjacent)


def layer_bytes(cfg: GdnConfig, n: int) -> dict[str, tuple[int, int]]:
    """(bytes read, bytes written) of each kernel of one GDN layer's decode step over n sequences (bf16
    activations and weights, fp32 SSM state)."""
    a, C, P, D, Vd, HV = 2, cfg.hidden_size, cfg.in_proj_dim, cfg.conv_dim, cfg.value_dim, cfg.linear_num_value_heads
    conv = math.prod(cfg.conv_state_shape) * a
    ssm = math.prod(cfg.ssm_state_shape) * 4
    return {"norm": (2 * n * C * a + C * a, 2 * n * C * a),
            "in_proj": (P * C * a + n * C * a, n * P * a),
            "conv": (n * D * a + n * conv + D * cfg.linear_conv_kernel_dim * a, n * D * a + n * conv),
            "gdn": (n * ssm + n * (D + 2 * HV) * a + 2 * HV * 4, n * ssm + n * Vd * a),  # A_log, dt_bias fp32
            "gated_norm": (2 * n * Vd * a + cfg.linear_value_head_dim * a, n * Vd * a),
            "out_proj": (C * Vd * a + n * Vd * a, n * C * a)}


def launch_sizes(cfg: GdnConfig, n: int, cuts: frozenset[str]) -> list[tuple[int, int]]:
    """(values read, values written) of each launch of a step over n sequences whose launches start before the
    kernels named in `cuts` (and at the step's first kernel)."""
    per, sizes = layer_bytes(cfg, n), []
    for _ in cfg.gdn_layer_ids:
        for k in KERNELS:
            if k in cuts or not sizes:
                sizes.append([0, 0])
            sizes[-1][0] += per[k][0]
            sizes[-1][1] += per[k][1]
    return [(rd // 4, wr // 4) for rd, wr in sizes]


def _check_copy(src: torch.Tensor, dst: torch.Tensor, rd: int, wr: int, what: str) -> None:
    """dst's first wr values are src's first rd, zeros past them (what a stream launch or phase writes)."""
    k = min(rd, wr)
    if not torch.equal(dst[:k], src[:k]) or (wr > k and bool(dst[k:wr].any())):
        raise AssertionError(f"{what} of {rd} / {wr} values wrote something else")


class Chain:
    """A step as stream launches of the given sizes, each on buffers of its own."""

    def __init__(self, sizes: list[tuple[int, int]], device: str):
        self.launches = [(torch.randn(rd, device=device), torch.empty(wr, device=device), rd, wr) for rd, wr in sizes]
        self.count = len(self.launches)

    def __call__(self, pdl: bool) -> None:
        kw = {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}
        for src, dst, rd, wr in self.launches:
            probes.stream_kernel[(triton.cdiv(max(rd, wr), BLOCK),)](src, dst, rd, wr, BLOCK=BLOCK, num_warps=WARPS,
                                                                     **kw)

    def check(self) -> None:
        """Every launch wrote its first values from its source (zeros past what it read)."""
        for src, dst, rd, wr in self.launches:
            _check_copy(src, dst, rd, wr, "a stream launch")


class PhasedChain:
    """A step as one persistent launch a layer (`probes.phased_stream_kernel`) whose six phases are the layer's six
    kernels' bytes, a grid barrier between each two: what a layer megakernel's structure costs, beside `6 a layer`
    (six launches, PDL) and `1 a layer` (the layer's bytes in one launch, no barrier). `resident` programs per SM, all
    of them resident (the barrier needs every program running: with 8 an SM the H200's run never passed the first
    barrier and was cut, 2026-12-05), each holding 64 KB / `resident` of loads in flight (16 KB at 4 an SM, the
    stream kernel's block)."""

    def __init__(self, sizes: list[tuple[int, int]], device: str, resident: int):
        n_ph = len(KERNELS)
        # every SM's share; the interpreter runs programs one by one, so one program there
        self.programs = (torch.cuda.get_device_properties(device).multi_processor_count * resident
                         if device == "cuda" else 1)
        self.block = BLOCK * 4 // resident  # 64 KB of loads in flight an SM whatever `resident`
        pad = lambda v: -(-v // self.block) * self.block  # noqa: E731 - each phase's buffers at a whole block
        self.layers = []
        for i in range(0, len(sizes), n_ph):
            part = [(r // 16 * 16, w // 16 * 16) for r, w in sizes[i:i + n_ph]]  # the kernel's vectors: < 64 B less
            offs = torch.tensor([[sum(pad(r) for r, _ in part[:k]), sum(pad(w) for _, w in part[:k]), r, w]
                                 for k, (r, w) in enumerate(part)], dtype=torch.int64, device=device)
            rd, wr = sum(pad(r) for r, _ in part), sum(pad(w) for _, w in part)
            self.layers.append((torch.randn(rd, device=device), torch.empty(wr, device=device), offs,
                                torch.zeros(2, dtype=torch.int32, device=device), part))
        self.count = len(self.layers)

    def __call__(self, pdl: bool) -> None:
        kw = {"PDL": True, "launch_pdl": True} if pdl else {"PDL": False}
        for src, dst, offs, bar, _ in self.layers:
            probes.phased_stream_kernel[(self.programs,)](src, dst, offs, bar, PHASES=len(KERNELS), BLOCK=self.block,
                                                          num_warps=WARPS, **kw)

    def check(self) -> None:
        """Every phase wrote its first values from its source (zeros past what it read); the barrier's count is
        back at 0."""
        for src, dst, offs, bar, part in self.layers:
            for (s0, d0, _, _), (rd, wr) in zip(offs.tolist(), part):
                _check_copy(src[s0:], dst[d0:], rd, wr, "a phase")
            if int(bar[0]) != 0:
                raise AssertionError(f"the grid barrier's count was left at {int(bar[0])}")


ROLES = ("head", *KERNELS, "other")


def credits(evs: list[tuple[int, int, str]]) -> list[float]:
    """How far each kernel of one step (start-ordered (start ns, end ns, name)) moves the step on, us: from its
    start to the next kernel's start, the last one's to the step's end. They sum to the step's span."""
    starts = [a for a, _, _ in evs] + [max(b for _, b, _ in evs)]
    return [(b - a) / 1e3 for a, b in zip(starts, starts[1:])]


def roles_of(names: list[str]) -> list[str]:
    """The layer kernel (`KERNELS`) each launch of a step stands for, by name (the module docstring)."""
    out, at = [], "head"
    for name in names:
        if name == "norm_kernel":
            at = "norm"
        elif "conv" in name:
            at = "conv"
        elif "gdn" in name:
            at = "gdn"
        elif name == "gated_norm_kernel":
            at = "gated_norm"
        elif at == "head":  # before the first layer's norm
            pass
        elif at in ("norm", "in_proj"):
            at = "in_proj"
        elif at == "gated_norm":
            at = "out_proj"
        else:
            at = "other"
        out.append(at)
    return out


def split(n: int, ours: list[tuple[int, int, str]], stream: list[tuple[int, int, str]]) -> list[dict]:
    """Per layer kernel, the step's and the streaming chain's credits (summed over the layers) and their
    difference; the stream chain's launches are its layers' six kernels in order."""
    mine, twin = dict.fromkeys(ROLES, 0.0), dict.fromkeys(ROLES, 0.0)
    for role, c in zip(roles_of([name for _, _, name in ours]), credits(ours)):
        mine[role] += c
    for k, c in enumerate(credits(stream)):
        twin[KERNELS[k % len(KERNELS)]] += c
    rows = [{"n": n, "kernel": r, "ours_us": round(mine[r], 2), "stream_us": round(twin[r], 2),
             "diff_us": round(mine[r] - twin[r], 2)} for r in ROLES if mine[r] or twin[r]]
    rows.append({"n": n, "kernel": "step (span)", "ours_us": round(sum(mine.values()), 2),
                 "stream_us": round(sum(twin.values()), 2),
                 "diff_us": round(sum(mine.values()) - sum(twin.values()), 2)})
    return rows


def ours_step(cfg: GdnConfig, n: int, pdl: bool) -> tuple[float, list[dict]]:
    """bench/runtime.py's static step at n sequences: its graphs replayed back to back (us), and the per-kernel split
    of one step of it beside one of the `6 a layer` chain (`split`; the chain with PDL where `pdl`, and from a CUDA
    graph, as it is timed: its eager launches are host-bound at N = 8, where a span of 492 us traced eagerly took 134
    replayed, H200 2026-12-05)."""
    import runtime as rb
    import step_trace

    o = rb.Ours(rb.configs()["static"])
    fn = o.step_fn("decode", [1] * n, "static")
    fn()  # captures and gates the bucket's graphs
    us = rb.replay_us(o.sess.graphs.replayable(n))
    ours = step_trace.trace(fn)
    del o, fn
    torch.cuda.empty_cache()
    chain, g = Chain(launch_sizes(cfg, n, CHAINS["6 a layer"]), "cuda"), torch.cuda.CUDAGraph()
    chain(pdl)  # compiled before the capture (the timing pass ran it too)
    with torch.cuda.graph(g):
        chain(pdl)
    rows = split(n, ours, step_trace.trace(g.replay))
    del chain, g
    torch.cuda.empty_cache()
    return us, rows


def measure(cfg: GdnConfig, ns: list[int], smoke: bool, only: set[str] | None = None) -> tuple[list[dict], list[dict]]:
    """(the chains' rows, the per-kernel split's rows); `only`: those chains and not the step"""
    device = "cpu" if smoke else "cuda"
    bw = None if smoke else copy_bandwidth()["best"]
    capable = not smoke and torch.cuda.get_device_capability()[0] >= 9  # PDL: sm_90+
    rows, splits = [], []
    for n in ns:
        w, s = weight_bytes(cfg, "bfloat16"), 2 * n * slot_bytes(cfg, "bfloat16")
        floor = None if bw is None else (w + s) / bw * 1e6
        row = lambda v, launches, us: {"n": n, "variant": v, "launches": launches, "us": us,  # noqa: E731
                                       "over_floor": us / floor if floor and us else None,
                                       "excess_us": us - floor if floor and us else None}
        rows.append(row("floor", 0, floor))
        six = launch_sizes(cfg, n, CHAINS["6 a layer"])
        cases = [(v, lambda c=cuts: Chain(launch_sizes(cfg, n, c), device), True) for v, cuts in CHAINS.items()]
        cases += [("6 a layer, no PDL", lambda: Chain(six, device), False)]
        cases += [(f"1 a layer, 6 phases, {r}/SM", lambda r=r: PhasedChain(six, device, r), True) for r in RESIDENT]
        for v, make, pdl in [c for c in cases if only is None or c[0] in only]:
            chain = make()
            launches = chain.count
            on = pdl and capable
            chain(on)
            chain.check()  # on the device, its equality waits for the launches
            us = None if smoke else time_cuda(lambda i: chain(on), target_s=20e-3, reps=15).median_s * 1e6
            rows.append(row(v, launches, us))
            print(f"N={n:4d} {v:20s} {launches:3d} launches  {us if us is None else round(us, 1)} us", flush=True)
            del chain
        if not smoke and only is None:
            us, part = ours_step(cfg, n, capable)
            rows.append(row("ours", None, us))
            splits += part
            print(f"N={n:4d} ours: {us:.1f} us, floor {floor:.1f} us", flush=True)
            for r in part:
                print(f"N={n:4d}   {r['kernel']:12s} ours {r['ours_us']:7.1f}  stream {r['stream_us']:7.1f}  "
                      f"diff {r['diff_us']:6.1f} us", flush=True)
    return rows, splits


def plot(rows: list[dict], path: Path) -> None:
    names = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "floor"]
    bar_figure(path, rows, names, lambda r: r["over_floor"] or 0, "step time / floor",
                 (0.9, max([1.5] + [r["over_floor"] or 0 for r in rows]) * 1.05),
                 "decode step, 4 Qwen3-Next GDN layers: launch structures of pure streaming kernels vs ours",
                 ((1.25, "r", "issue 15's target"),))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="64,256")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, each chain run once and checked")
    ap.add_argument("--chains", help="only these chains (names separated by ;), and not the step")
    args = ap.parse_args()
    import runtime as rb

    cfg = rb.configs(args.smoke)["static"]
    rows, splits = measure(cfg, [int(v) for v in args.n.split(",")], args.smoke,
                           set(args.chains.split(";")) if args.chains else None)
    meta = {"device": "cpu (smoke: no timing)"} if args.smoke else device_info()
    paths = write_results("chain-floor", rows, meta, ["n", "variant", "launches", "us", "over_floor", "excess_us"],
                          None if args.smoke else plot, args.out)
    if splits:
        paths += write_results("chain-trace", splits, meta, ["n", "kernel", "ours_us", "stream_us", "diff_us"],
                               out_dir=args.out)
    print("wrote", *paths, flush=True)


if __name__ == "__main__":
    main()
