"""`LayerMode` for the export side: the one enum lives in `gdn_trt.model.modes`; this module only re-exports it."""

from __future__ import annotations

from ..model.modes import LayerMode

__all__ = ["LayerMode"]
