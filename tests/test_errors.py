"""Every domain error is a `GdnTrtError` and still the builtin it always was (callers catching either keep working)."""

from __future__ import annotations

import pytest

from gdn_trt.export.build import TrtUnavailable
from gdn_trt.model.devices import DeviceError
from gdn_trt.model.errors import GdnTrtError
from gdn_trt.model.peft import AdapterError
from gdn_trt.runtime.budget import BudgetError
from gdn_trt.runtime.guard import ConcurrentUseError
from gdn_trt.runtime.plans import PlanMismatchError
from gdn_trt.runtime.select import NoEngineError
from gdn_trt.runtime.seqs import SequenceError
from gdn_trt.runtime.state import PoolFullError, SnapshotError


@pytest.mark.parametrize("error, builtin", [
    (AdapterError, ValueError), (TrtUnavailable, RuntimeError), (PlanMismatchError, ValueError),
    (NoEngineError, ValueError), (BudgetError, RuntimeError), (SnapshotError, ValueError),
    (PoolFullError, RuntimeError), (SequenceError, KeyError), (DeviceError, RuntimeError),
    (ConcurrentUseError, RuntimeError)], ids=lambda x: x.__name__)
def test_domain_errors_share_one_base(error, builtin):
    for catch in (GdnTrtError, builtin):
        with pytest.raises(catch, match="the message"):
            raise error("the message")
