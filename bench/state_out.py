"""The output pass beside the state chain (`Tuning.state_out`): the two launches of one prefill, alone and as a pair.

    python bench/state_out.py [--T 4096,16384] [--group 1,4,8,16] [--out DIR]

Per single-sequence length (one window): the state pass and the output pass as the default launches them, each
alone, and the pair as `Tuning.state_out` launches it (the state pass raising a count per chunk and key head, the
output pass launched programmatically dependent on it and waiting on the counts), from zeroed counts. Each launch
is taken from one `launch_chunked` call and replayed on that call's own buffers (`common.time_cuda`). Rows: time_us.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from dataclasses import replace

import torch
from cases import HV, K, V, gdn_inputs, packing
from common import RESULTS, device_info, time_cuda, write_results

from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.packing import Capture

COLUMNS = ["case", "launch", "time_us"]


def captured(names: list[str], call) -> dict[str, tuple]:
    """{kernel name: (grid, args, kwargs)} of the launches `call()` makes through the named kernels (run as well)."""
    seen, saved = {}, {n: getattr(gdn_tri, n) for n in names}

    class Spy:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen[self.name] = (grid, args, kwargs)
                return saved[self.name][grid](*args, **kwargs)
            return launch

    try:
        for n in names:
            setattr(gdn_tri, n, Spy(n))
        call()
    finally:
        for n, fn in saved.items():
            setattr(gdn_tri, n, fn)
    torch.cuda.synchronize()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", default="4096,16384")
    ap.add_argument("--group", default="1,4,8,16", help="Tuning.state_out values (chunks counted at a time)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = []
    for T in map(int, args.T.split(",")):
        x, pack = gdn_inputs(T, 2), packing([T])
        pool = torch.randn(1, HV, K, V, device="cuda") * 0.5
        cap = Capture(torch.full((1,), -1, dtype=torch.int32, device="cuda"), torch.empty_like(pool))
        one = replace(gdn_tri.TUNING, state_pipe=1)
        names = ["gdn_chunk_state_kernel", "gdn_chunk_out_kernel"]
        plain = captured(names, lambda: gdn_tri.launch_chunked(x, pack, pool, cap, one))

        def launch(seen, name):
            grid, a, kw = seen[name]
            return lambda: getattr(gdn_tri, name)[grid](*a, **kw)

        state, out = launch(plain, names[0]), launch(plain, names[1])
        timed = [("state pass (one launch)", lambda i: state()), ("output pass (one launch)", lambda i: out()),
                 ("state then output", lambda i: (state(), out()))]
        for g in map(int, args.group.split(",")):
            flagged = captured(names, lambda: gdn_tri.launch_chunked(x, pack, pool, cap, replace(one, state_out=g)))
            f_state, f_out = launch(flagged, names[0]), launch(flagged, names[1])
            cnt = flagged[names[0]][2]["cnt"]
            timed += [(f"state_out={g}: the pair, counts zeroed",
                       lambda i, c=cnt, s=f_state, o=f_out: (c.zero_(), s(), o())),
                      (f"state_out={g}: state pass alone", lambda i, c=cnt, s=f_state: (c.zero_(), s()))]
        timed.append(("zeroing the counts", lambda i: cnt.zero_()))
        for label, fn in timed:
            t = time_cuda(fn, target_s=10e-3)
            rows.append(dict(case=f"prefill {T}", launch=label, time_us=round(t.median_us, 1)))
            print(f"prefill {T:6d}  {label:38s} {t.median_us:9.1f} us", flush=True)
    write_results("state-out", rows, device_info(), COLUMNS, None, args.out)


if __name__ == "__main__":
    main()
