"""Memory bounded by the limits, not by the history: 100,000 add/release cycles (with snapshots,
restores and steps among them) leave every tensor, numpy array and Python container reachable from a session the
same size; released and never-issued ids are still told apart, each with its own clear error."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from gdn_trt.runtime.seqs import SequenceError

from .test_runtime_support import HC_PLE, LIMITS, PLAIN, inputs, open_session


def footprint(root, caps: tuple = ()) -> dict[str, int]:
    """Everything reachable from `root` through gdn_trt objects, containers, modules and bound methods: tensor
    storage bytes (each storage once), numpy bytes, container entries, objects. `caps`: memo dicts bounded by a
    fixed size (checked apart), not followed."""
    seen, todo = {id(c) for c in caps}, [root]
    out = dict(tensor_bytes=0, numpy_bytes=0, entries=0, objects=0)
    storages = set()
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, (int, float, str, bytes, type(None))):
            continue  # scalars: a counter's value is a new object, not growth (bytes: snapshots are not kept)
        out["objects"] += 1
        if isinstance(o, torch.Tensor):
            st = o.untyped_storage()
            if (st.data_ptr(), o.device.type) not in storages:
                storages.add((st.data_ptr(), o.device.type))
                out["tensor_bytes"] += st.nbytes()
        elif isinstance(o, np.ndarray):
            out["numpy_bytes"] += o.nbytes
            if o.dtype == object:
                todo += list(o.ravel())
        elif isinstance(o, torch.nn.Module):
            todo += [*o.buffers(), *o.parameters()]
        elif isinstance(o, dict):
            out["entries"] += len(o)
            todo += [*o.keys(), *o.values()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            out["entries"] += len(o)
            todo += list(o)
        elif hasattr(o, "__self__") and not isinstance(o, type):  # bound methods (e.g. a dict's __getitem__)
            todo.append(o.__self__)
        elif type(o).__module__.startswith("gdn_trt") and hasattr(o, "__dict__"):
            todo += list(vars(o).values())
    return out


def _churn(s, h, ids, cycles: int) -> tuple[list[int], int]:
    """`cycles` add/release cycles; every 1000th also prefills, decodes, verifies, snapshots and restores. Returns
    some released ids and the highest id issued."""
    released, top = [], 0
    keep = s.add_sequence()  # a long-lived sequence across the churn
    for k in range(cycles):
        q = s.add_sequence()
        top = max(top, q)
        if k % 1000 == 0:
            tok = None if ids is None else ids[:3]
            s.prefill(q, h[:3], tok)
            s.step(decode={keep: h[3:4]}, verify={q: h[3:5]},
                   token_ids=None if ids is None else {keep: ids[3:4], q: ids[3:5]})
            s.accept({q: k % 3})
            r = s.restore(s.snapshot(q))
            top = max(top, r)
            s.release(r)
            released.append(r)
        s.release(q)
        if k % 9973 == 0:
            released.append(q)
    s.release(keep)
    return released, top


@pytest.mark.parametrize("name,cycles", [(PLAIN, 100_000), (HC_PLE, 20_000)])
def test_add_release_cycles_hold_constant_memory(name, cycles):
    s = open_session(name)
    h, ids = inputs(s, 8, seed=1)
    _churn(s, h, ids, 2000)  # warm: caches and counters reach their steady sizes
    # step-layout memos are capped at 4096 entries (cleared past it), not by the limits: prefill token counts vary
    # without bound, so new layouts are added until the cap; checked below, not compared
    caps = (s._steps.pack.memo, s.selector._memo, s._steps.part_memo)
    before = footprint(s, caps)
    released, top = _churn(s, h, ids, cycles)
    after = footprint(s, caps)
    assert after == before
    assert all(len(c) <= 4097 for c in caps)
    assert s.sequences == [] and s.pool.free_slots == LIMITS.max_seqs
    for q in released:
        with pytest.raises(SequenceError, match=f"sequence {q} was released"):
            s.position(q)
    for q in (top + 1, top + LIMITS.max_seqs * 7 + 3, 2 ** 62):
        with pytest.raises(SequenceError, match=f"sequence {q} is unknown"):
            s.snapshot(q)
    with pytest.raises(SequenceError, match="is unknown"):
        s.snapshot(-1)


def test_a_closed_session_is_not_kept_alive_by_its_steps():
    """Nothing module-level keeps a session's step layouts (and through them its engines and weights) once the
    caller drops the session."""
    s = open_session(PLAIN)
    h, ids = inputs(s, 8, seed=1)
    _churn(s, h, ids, 50)
    ref = weakref.ref(s.selector.engines[0][0])
    del s
    gc.collect()
    assert ref() is None, "the session's engine (and its layer's weights) outlived the session"
