"""`GdnTrtError`: the base of every gdn-trt domain error, so a caller can catch them all at once.

Each domain error also subclasses the builtin it always was (`ValueError`, `KeyError` or `RuntimeError`), so code
that catches those keeps working: `AdapterError` (model.peft), `DeviceError` (model.devices), `TrtUnavailable`
(export.build), `PlanMismatchError` (runtime.plans), `NoEngineError` (runtime.select), `BudgetError` (runtime.budget),
`SnapshotError` and `PoolFullError` (runtime.state), `SequenceError` (runtime.seqs), `StepError` (runtime.steps),
`ConcurrentUseError` (runtime.guard).
"""

from __future__ import annotations


class GdnTrtError(Exception):
    """Base of the gdn-trt domain errors."""
