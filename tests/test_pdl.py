"""Programmatic dependent launch (`plugins/pdl.py`): decode steps whose kernels overlap equal plain launches bit
for bit.

A PDL kernel starts while the previous one runs, and the GDN decode loads its state tile before it waits. A race
(a tile read before the previous step wrote it, a store before the previous kernel finished reading) would show
as outputs or states that differ from the same steps launched one after the other, so the steps below chain
several decode steps on the same pools, eagerly and as CUDA-graph replays, and compare every output and the final
pools bit for bit.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from gdn_trt.model.state import BufferSpec, LayerState, StepInput
from gdn_trt.plugins import pdl
from gdn_trt.plugins.packing import Packing

from .glue_support import make_layer

STEPS = 6


def _steps(layer, dtype, plain: bool, graph: bool) -> tuple[list[torch.Tensor], LayerState]:
    cfg = layer.cfg
    g = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randn(4, cfg.stream_dim, device="cuda", generator=g).to(dtype) for _ in range(STEPS)]
    res = None if cfg.is_hc else torch.randn(4, cfg.stream_dim, device="cuda", generator=g).to(dtype)
    rows = (torch.randn(4, cfg.ple_heads, cfg.ple_head_dim, device="cuda", generator=g).to(dtype)
            if layer.ple is not None else None)
    state = LayerState.allocate(cfg, layer.index, 3, BufferSpec(dtype, "cuda"))
    gen = torch.Generator(device="cuda").manual_seed(2)
    for t in state.tensors():
        t.copy_(torch.randn(t.shape, device="cuda", generator=gen).to(t.dtype))
    pack = Packing.build([1] * 4, [0, 2, -1, 1], "cuda")
    x = xs[0].clone()
    scope = contextlib.nullcontext if plain else pdl.scope
    with scope():
        if graph:
            # warm on a side stream (compiles, the GEMM workspace) with every slot -1, then capture
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                layer.decode_multi_seq(StepInput(x, Packing.build([1] * 4, [-1] * 4, "cuda"), res, rows), state)
            torch.cuda.current_stream().wait_stream(side)
            cg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cg):
                out, _ = layer.decode_multi_seq(StepInput(x, pack, res, rows), state)
        outs = []
        for t in range(STEPS):
            if graph:
                x.copy_(xs[t])
                cg.replay()
            else:
                out, _ = layer.decode_multi_seq(StepInput(xs[t], pack, res, rows), state)
            outs.append(out.x.clone())
    torch.cuda.synchronize()
    return outs, state


@pytest.mark.gpu
@pytest.mark.parametrize("late", [False, True], ids=["gemm-trigger-at-start", "gemm-trigger-late"])
@pytest.mark.parametrize("case", [("qwen3-next-80b-a3b", 0), ("tiny-4exp", 1)], ids=lambda c: c[0])
def test_pdl_decode_steps_equal_plain_launches_bit_for_bit(case, late, monkeypatch):
    """late: every skinny-GEMM launch with `Config.late` (the next kernel launches after the GEMM's K loop), as the
    table has it only for some rows."""
    if late:
        from dataclasses import replace

        from gdn_trt.plugins.glue import gemm

        monkeypatch.setattr(gemm, "TABLE", tuple(replace(r, cfg=replace(r.cfg, late=True)) for r in gemm.TABLE))
    dev = torch.device("cuda")
    assert not pdl.enabled(dev), "PDL is on only inside pdl.scope()"
    with pdl.scope():
        assert pdl.enabled(dev) == (torch.cuda.get_device_capability()[0] >= 9)
    layer = make_layer(*case, torch.bfloat16, "cuda")
    want, want_state = _steps(layer, torch.bfloat16, plain=True, graph=False)
    for graph in (False, True):
        got, got_state = _steps(layer, torch.bfloat16, plain=False, graph=graph)
        for t, (a, b) in enumerate(zip(want, got)):
            assert torch.equal(a, b), f"step {t} output differs with PDL (graph={graph})"
        for name, a, b in zip(("conv", "ssm", "ple_conv"), want_state.tensors(), got_state.tensors()):
            assert torch.equal(a, b), f"{name} pool differs with PDL after {STEPS} steps (graph={graph})"


def test_pdl_is_off_outside_its_scope_and_on_cpus(monkeypatch):
    """CPU-side rules of `pdl.options`: nothing outside `scope()`, nothing for a CPU tensor inside it, and the scope
    restores the thread's state on exit, also when the body raises."""
    cpu = torch.device("cpu")
    assert pdl.options(cpu) == {}
    with pytest.raises(RuntimeError):
        with pdl.scope():
            assert pdl.options(cpu) == {}
            with pdl.scope():
                pass
            assert pdl._LOCAL.on  # an inner scope leaves the outer one on
            raise RuntimeError("body fails")
    assert not pdl._LOCAL.on
    monkeypatch.setenv("GDN_TRT_PDL", "0")
    with pdl.scope():
        assert not pdl.enabled(torch.device("cuda", 0))  # the A/B switch wins before any CUDA query


def test_late_gemm_trigger_compiles_for_sm90_after_the_k_loop():
    """The table's late-trigger launch (`gemm.Config.late`) with PDL on, compiled for sm_90 as the H200 would
    (plugins/triton_aot.py): one wait at the start, and the trigger after the K loop's last product, not before."""
    from dataclasses import replace

    from gdn_trt.plugins import triton_aot
    from gdn_trt.plugins.glue import gemm

    M, (N, K) = 8, (12352, 2048)
    cfg = gemm.config_for(M, N)
    assert cfg.late, "the test expects the table's in_proj row at M = 8 to trigger late"
    x, w = torch.empty(M, K, dtype=torch.bfloat16), torch.empty(N, K, dtype=torch.bfloat16)
    (launch,) = triton_aot.record(gemm, lambda: gemm.launch(x, w, cfg))
    launch = replace(launch, args={**launch.args, "PDL": True})
    k = triton_aot.compile_kernel(launch)
    assert k.metadata.shared <= triton_aot.SMEM_LIMIT
    ptx = k.asm["ptx"]
    wait, trigger = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    last_mma = max(ptx.rfind("wgmma.mma_async"), ptx.rfind("mma.sync"))
    assert 0 <= wait < last_mma < trigger, (wait, last_mma, trigger)
