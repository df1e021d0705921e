"""The compare command's tolerance table is the test suite's: same metric, same bounds."""

from __future__ import annotations

import numpy as np
import torch

from gdn_trt.export import tolerances as compare_tol
from gdn_trt.model.modes import LayerMode
from gdn_trt.export.spec import Limits, graph_spec
from gdn_trt.model.config import preset

from . import tolerances as test_tol


def test_every_compare_bound_equals_the_test_table():
    for key, bound in compare_tol.TOL.items():
        assert key in test_tol.TOL, f"{key} is in the compare table but not in tests/tolerances.py"
        ref = test_tol.TOL[key]
        assert (bound.rel_rms, bound.floor) == (ref.rel_rms, ref.floor), key


def test_metric_is_the_test_metric():
    gen = torch.Generator().manual_seed(1)
    ref, got = torch.randn(50, 7, generator=gen), torch.randn(50, 7, generator=gen) * 1e-3
    got = ref + got
    assert np.allclose(compare_tol.errors(ref.numpy(), got.numpy()), test_tol.errors(ref, got), rtol=1e-12)
    assert compare_tol.errors(np.zeros(3), np.full(3, np.nan))[0] != 0.0


def test_outputs_are_bounded_by_the_recurrence_of_their_mode():
    cfg = preset("tiny-4exp")
    dec = graph_spec(cfg, 1, LayerMode.VERIFY_MULTI, Limits())
    pre = graph_spec(cfg, 1, LayerMode.PREFILL_VARLEN, Limits())
    assert compare_tol.output_kind(dec, "streams_out") == "recurrent"
    assert compare_tol.output_kind(dec, "ssm_stash_out") == "recurrent"
    assert compare_tol.output_kind(pre, "ssm_capture_out") == "chunked"
    assert compare_tol.output_kind(pre, "ple_conv_pool_out") == "conv"
    assert compare_tol.bound(pre, "conv_capture_out") == compare_tol.TOL[("float32", "conv")]
