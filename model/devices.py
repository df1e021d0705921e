"""Device names, checked once where a user gives one (`Session.open`, `gdn-trt compare --device`, `make run`), so a
machine without CUDA gets `DeviceError` naming what it has instead of torch's "Torch not compiled with CUDA
enabled" AssertionError from deep inside the first allocation."""

from __future__ import annotations

import torch

from .errors import GdnTrtError


class DeviceError(GdnTrtError, RuntimeError):
    """The device asked for does not exist on this machine."""


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """None or "auto" -> cuda when torch sees a GPU, else cpu; otherwise the device named, checked to exist."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise DeviceError(f"device {device!r} is not a device name: use cpu, cuda or cuda:<index>") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(f"device {device!r}: this machine has no CUDA device visible to torch "
                              f"(torch {torch.__version__}); use device='cpu' (or --device cpu)")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise DeviceError(f"device {device!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    elif dev.type != "cpu":
        raise DeviceError(f"device {device!r}: gdn-trt runs on cpu or cuda, not {dev.type}")
    return dev
