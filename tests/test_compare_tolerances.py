"""The one tolerance table: its metric on numpy and torch inputs alike, and the compare command's per-output kinds."""

from __future__ import annotations

import numpy as np
import torch

from gdn_trt.export import tolerances as T
from gdn_trt.export.spec import Limits, graph_spec
from gdn_trt.model.config import preset
from gdn_trt.model.modes import LayerMode


def test_metric_is_relative_rms_with_max_abs_beside_it():
    gen = torch.Generator().manual_seed(1)
    ref = torch.randn(50, 7, generator=gen, dtype=torch.float64)
    noise = torch.randn(50, 7, generator=gen, dtype=torch.float64) * 1e-3
    want = ((noise.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item(), noise.abs().max().item())
    assert np.allclose(T.errors(ref, ref + noise), want, rtol=1e-12)
    assert np.allclose(T.errors(ref.numpy(), (ref + noise).numpy()), want, rtol=1e-12)
    assert np.allclose(T.errors(ref.to(torch.bfloat16), (ref + noise).to(torch.bfloat16)),
                       T.errors(ref.to(torch.bfloat16).double(), (ref + noise).to(torch.bfloat16).double()))
    assert T.errors(np.zeros(3), np.zeros(3)) == (0.0, 0.0)
    assert T.errors(np.zeros(3), np.ones(3))[0] == float("inf")
    assert not T.within(T.Tol(1.0, 1.0), *T.errors(np.zeros(3), np.full(3, np.nan)))


def test_tol_falls_back_to_the_dtype_entry():
    assert T.tol(torch.float32, "chunked") == T.TOL[("float32", "chunked")]
    assert T.tol("float64", "no such output") == T.TOL[("float64", "")]


def test_outputs_are_bounded_by_the_recurrence_of_their_mode():
    cfg = preset("tiny-4exp")
    dec = graph_spec(cfg, 1, LayerMode.VERIFY_MULTI, Limits())
    pre = graph_spec(cfg, 1, LayerMode.PREFILL_VARLEN, Limits())
    assert T.output_kind(dec, "streams_out") == "recurrent"
    assert T.output_kind(dec, "ssm_stash_out") == "recurrent"
    assert T.output_kind(pre, "ssm_capture_out") == "chunked"
    assert T.output_kind(pre, "ple_conv_pool_out") == "conv"
    assert T.bound(pre, "conv_capture_out") == T.TOL[("float32", "conv")]
