"""The L2 warm-up of the next projection's weight in the GDN decode kernel (`plugins/l2.py`).

CPU: the hint is seen only inside `warm` on a CUDA device, nested blocks restore the outer one, and the recurrent
launch hands the weight's bytes to its last programs in 16-byte chunks that cover it exactly once (the launch is
recorded, not run). GPU: a prefetch moves data into L2 and nothing else, so decode steps with the warm-up equal the
same steps without it bit for bit (outputs and pools), at N = 1 (the few-sequence tiling) and N = 64, eagerly and
as a CUDA-graph replay.
"""

from __future__ import annotations

import pytest
import torch

from gdn_trt.plugins import l2
from gdn_trt.plugins.gated_delta_rule import triton as gdn_tri
from gdn_trt.plugins.gated_delta_rule.io import GdnInputs
from gdn_trt.plugins.packing import Packing

H, HV, K, V = 16, 32, 128, 128  # Qwen3-Next


def _inputs(n: int, device: str, dtype=torch.bfloat16, empty: bool = False) -> tuple[GdnInputs, Packing, torch.Tensor]:
    new = torch.empty if empty else torch.randn
    g = {} if empty else {"generator": torch.Generator(device).manual_seed(n)}
    qkv = new(n, 2 * H * K + HV * V, device=device, **g).to(dtype)
    ab = new(n, 2 * HV, device=device, **g).to(dtype)
    x = GdnInputs(qkv[:, :H * K].view(n, H, K), qkv[:, H * K:2 * H * K].view(n, H, K),
                  qkv[:, 2 * H * K:].view(n, HV, V), ab[:, :HV], ab[:, HV:],
                  new(HV, device=device, **g), new(HV, device=device, **g))
    pool = new(n + 1, HV, K, V, device=device, **g)
    if not empty:
        pool *= 0.1
    return x, Packing.build([1] * n, list(range(n, 0, -1)), device), pool


def test_target_only_inside_warm_and_on_cuda():
    a, b = torch.zeros(64), torch.zeros(32)
    assert l2.target(torch.device("cpu")) is None and getattr(l2._LOCAL, "weight", None) is None
    with l2.warm(a):
        assert l2._LOCAL.weight is a and l2.target(torch.device("cpu")) is None  # a CPU tensor: no prefetch
        with l2.warm(b):
            assert l2._LOCAL.weight is b
        assert l2._LOCAL.weight is a
    assert l2._LOCAL.weight is None


@pytest.mark.parametrize("n", [1, 64])
def test_launch_covers_the_weight_once_in_the_last_programs(n, monkeypatch):
    from gdn_trt.plugins import triton_aot

    w = torch.empty(2048, 4096, dtype=torch.bfloat16)
    monkeypatch.setattr(gdn_tri.l2, "target", lambda device: w)
    x, pack, pool = _inputs(n, "cpu", empty=True)
    (launch,) = triton_aot.record(gdn_tri, lambda: gdn_tri.recurrent(x, pack, pool))
    args = launch.args
    programs = (V // args["BV"]) * HV * n
    share = programs - args["l2_from"]
    nbytes, chunk = args["l2_bytes"], args["l2_chunk"]
    assert args["L2"] and args["l2"] is w and nbytes == w.numel() * 2
    assert 0 < share <= programs and share == max(1, round(programs * gdn_tri.TUNING.rec_l2_tail))
    assert chunk % 16 == 0 and chunk * (share - 1) < nbytes <= chunk * share, (chunk, share, nbytes)
    monkeypatch.setattr(gdn_tri.l2, "target", lambda device: None)
    (launch,) = triton_aot.record(gdn_tri, lambda: gdn_tri.recurrent(x, pack, pool))
    assert not launch.args["L2"], "no warm-up asked, none launched"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 64])
def test_warm_steps_equal_plain_steps_bit_for_bit(n):
    w = torch.randn(2048, 4096, device="cuda").bfloat16()
    x, pack, start = _inputs(n, "cuda")
    runs = []
    for warm in (False, True):
        pool, outs = start.clone(), []
        with l2.warm(w) if warm else l2.warm(None):
            assert (l2.target(pool.device) is w) == warm
            for _ in range(3):
                outs.append(gdn_tri.recurrent(x, pack, pool))
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                o = gdn_tri.recurrent(x, pack, pool)
        g.replay()
        torch.cuda.synchronize()
        runs.append((outs + [o.clone()], pool))
    (plain, p0), (warmed, p1) = runs
    assert all(torch.equal(a, b) for a, b in zip(plain, warmed)) and torch.equal(p0, p1)
    assert not torch.equal(p0, start), "the steps changed no state: the test would not see a difference"
