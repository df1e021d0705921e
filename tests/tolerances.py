"""`assert_close`: the test suite's comparison over the one tolerance table (`gdn_trt.export.tolerances`)."""

from __future__ import annotations

import torch

from gdn_trt.export.tolerances import Tol, errors


def assert_close(name: str, ref: torch.Tensor, got: torch.Tensor, bound: Tol) -> None:
    assert ref.shape == got.shape, f"{name}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    assert torch.isfinite(got).all(), f"{name}: non-finite values (unwritten output rows?)"
    rel, mx = errors(ref, got)
    assert rel <= bound.rel_rms or mx <= bound.floor, (
        f"{name}: relative RMS error {rel:.3e} > {bound.rel_rms:.1e} (max-abs {mx:.3e})")
