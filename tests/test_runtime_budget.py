"""Memory budget: its sizes agree with what a session really allocates, the check names the knob, and the
`gdn-trt budget` command (and its first name, `plan`) prints the table and exits 1 when the budget does not fit."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gdn_trt.model.config import preset
from gdn_trt.model.lora import LoraLimits
from gdn_trt.app import cli
from gdn_trt.runtime import budget as P

from .test_runtime_support import HC_PLE, LIMITS, PLAIN, open_session


def _bytes(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def held_tensors(root) -> dict[tuple[int, str], int]:
    """Bytes of every tensor storage reachable from `root` through gdn_trt objects, containers and modules (each
    storage once, however many views and owners it has): what a session holds."""
    seen, out, todo = set(), {}, [root]
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            out[(st.data_ptr(), o.device.type)] = st.nbytes()
        elif isinstance(o, torch.nn.Module):
            todo += [*o.buffers(), *o.parameters()]
        elif isinstance(o, dict):
            todo += [*o.keys(), *o.values()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo += list(o)
        elif type(o).__module__.startswith("gdn_trt") and hasattr(o, "__dict__"):
            todo += list(vars(o).values())
    return out


@pytest.mark.parametrize("name", [PLAIN, HC_PLE])
def test_budget_matches_what_a_session_allocates(name):
    """Row by row, the budget equals the bytes of the tensors a session holds (pools, stashes, captures, weights, LoRA
    slots, the step's index buffers, PLE staging and host row cache), and those rows add up to every tensor reachable
    from the session: nothing it allocates is left out. The weights row is the layers' one copy, which TensorRT plans
    bind as inputs (docs/tensorrt.md, weights held once); prefill activations are transient (an upper estimate, not
    held)."""
    limits = replace(LIMITS, lora=LoraLimits(max_adapters=2, max_rank=4))
    s = open_session(name, limits)
    b = P.budget(s.cfg, limits, "float32", graphs=False)
    rows = {r.item.split(" (")[0]: r for r in b.rows}
    pools = _bytes(t for st in s.pool.layers.values() for t in st.tensors())
    stash = _bytes(t for st in s.stack.buffers.stash.values() for t in (st.conv, st.ssm, st.ple_conv))
    capture = _bytes(t for st in s.stack.buffers.capture.values() for t in st.tensors())
    weights = _bytes(t for c in s.selector.engines for t in c[0].layer.buffers())
    lora = _bytes(t for per in s.adapters.weights.values() for w in per.values() for t in (w.a, w.b))
    assert rows["state pools"].device == pools
    assert rows["verify stash"].device == stash
    assert rows["prefill capture"].device == capture
    assert rows["weights"].device == weights
    assert rows["LoRA slots"].device == lora
    pk = s._steps.pack
    step_bufs = _bytes([pk.dev, pk.cu_decode, s.stack._zeros])
    step_host = _bytes(pk._host)
    assert rows["step buffers"].device == step_bufs and rows["step buffers"].host == step_host
    held = pools + stash + capture + weights + lora + step_bufs + step_host
    if s.feeds is not None:
        staged = _bytes(p.ple_rows for p in s.feeds.stages.values())
        host = _bytes(t for p in s.feeds.stages.values() for t in p._staging)
        cache = _bytes(p.store._cache for p in s.feeds.stages.values())
        assert rows["PLE staging"].device == staged and rows["PLE staging"].host == host
        assert rows["PLE host row cache"].host == cache
        held += staged + host + cache
    transient = rows["prefill activations"]
    assert sum(held_tensors(s).values()) == held == b.device_total - transient.device + b.host_total


def test_limits_validate_and_buckets():
    assert P.RuntimeLimits(max_seqs=6).buckets() == (1, 2, 4, 6)
    assert P.RuntimeLimits(max_seqs=8, graph_buckets=(8, 2)).buckets() == (2, 8)
    with pytest.raises(ValueError, match="max_draft"):
        P.RuntimeLimits(max_draft=0)
    with pytest.raises(ValueError, match="outside 1..max_seqs"):
        P.RuntimeLimits(max_seqs=4, graph_buckets=(8,))


def test_check_names_the_knob():
    b = P.budget(preset("qwen3-next-80b-a3b"), P.RuntimeLimits(max_seqs=256, max_prefill_tokens=1024), "bfloat16",
               graphs=True)
    b.check(b.device_total, "exact")
    with pytest.raises(P.BudgetError, match=r"lower max_seqs \(it scales"):
        b.check(80 * P.GiB, "an 80 GiB device")
    b = P.budget(preset("qwen3-next-80b-a3b"), P.RuntimeLimits(max_seqs=1, max_prefill_tokens=1 << 20), "bfloat16",
               graphs=False)
    with pytest.raises(P.BudgetError, match="lower max_prefill_tokens"):
        b.check(80 * P.GiB, "an 80 GiB device")


def test_parse_bytes():
    assert P.parse_bytes("80GiB") == 80 * P.GiB
    assert P.parse_bytes("1.5e9") == 1_500_000_000
    assert P.parse_bytes("512 MiB") == 512 << 20


@pytest.mark.parametrize("command", ["budget", "plan"])
def test_budget_command(command, capsys):
    assert cli.main([command, "--preset", "qwen4-exp", "--max-seqs", "32", "--device-memory", "141GiB"]) == 0
    out = capsys.readouterr().out
    for item in ("state pools (32 slots)", "verify stash (128 tokens)", "PLE staging", "decode graphs", "fits in",
                 "verify graphs (buckets x 4 drafts)"):  # verify graphs follow the graphs, as SessionOptions' do
        assert item in out
    for flags in (["--no-verify-graphs"], ["--no-graphs"]):
        assert cli.main([command, "--preset", "qwen4-exp", "--max-seqs", "32", *flags]) == 0
        assert "verify graphs" not in capsys.readouterr().out
    assert cli.main([command, "--preset", "qwen4-exp", "--max-seqs", "32", "--verify-graphs"]) == 0
    assert "verify graphs (buckets x 4 drafts)" in capsys.readouterr().out
    assert cli.main([command, "--preset", "qwen4-exp", "--no-graphs", "--verify-graphs"]) == 2
    assert "--verify-graphs needs the graphs" in capsys.readouterr().err
    assert cli.main([command, "--preset", "qwen3-next-80b-a3b", "--max-seqs", "1024", "--device-memory", "80GiB"]) == 1
    assert "lower max_seqs" in capsys.readouterr().out


def test_act_dtype_halves_the_conv_state():
    cfg = preset("qwen3-next-80b-a3b")
    f32, bf16 = P.slot_bytes(cfg, "float32"), P.slot_bytes(cfg, "bfloat16")
    conv = len(cfg.gdn_layer_ids) * cfg.conv_state_shape[0] * cfg.conv_state_shape[1]
    assert f32 - bf16 == conv * 2  # the recurrent state stays fp32 whatever the activations
    assert torch.float32.itemsize == 4


def test_trt_context_memory_is_a_row_of_the_budget():
    cfg, limits = preset("tiny-3.5"), P.RuntimeLimits(max_seqs=4)
    base = P.budget(cfg, limits, "float32", graphs=False)
    with_trt = P.budget(cfg, limits, "float32", graphs=False, trt_context=7 << 20)
    assert with_trt.device_total - base.device_total == 7 << 20
    assert [r.item for r in with_trt.rows if r.item.startswith("TensorRT")] == [
        "TensorRT context memory (one scratch, every plan)"]



def test_verify_graphs_are_a_row_scaled_by_the_drafts():
    """Verify graphs add one row, only with graphs on, proportional to max_draft (a bucket's graph holds its
    sequences' drafts), and larger than the decode graphs' row by about that factor."""
    cfg = preset("tiny-3.5")

    def rows(draft: int, graphs: bool = True) -> dict[str, int]:
        b = P.budget(cfg, P.RuntimeLimits(max_seqs=4, max_draft=draft), "float32", graphs=graphs, verify_graphs=True)
        return {r.item.split(" (")[0]: r.device for r in b.rows}

    three, six = rows(3), rows(6)
    assert six["verify graphs"] == 2 * three["verify graphs"]
    assert 2 < three["verify graphs"] / three["decode graphs"] <= 3  # no graph_io words; three rows a sequence
    assert "verify graphs" not in rows(3, graphs=False)
    plain = P.budget(cfg, P.RuntimeLimits(max_seqs=4, max_draft=3), "float32", graphs=True)
    assert sum(three.values()) - three["verify graphs"] == plain.device_total

