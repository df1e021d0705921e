"""gdn-trt runtime: `Session` (state pools, engine selection, CUDA graphs, PLE prestage, speculative write-on-accept,
prefix snapshots) over a stack of GDN layers. `from gdn_trt.runtime import Session, SessionOptions, RuntimeLimits`."""

_EXPORTS = {"Session": "session", "SessionOptions": "session", "Prompt": "seqs", "PrefillResult": "session",
            "SequenceError": "seqs", "RuntimeLimits": "budget", "BudgetError": "budget", "SnapshotError": "state",
            "DeviceError": "session", "ConcurrentUseError": "guard",
            "WrongDeviceError": "guard"}


def __getattr__(name: str):
    # lazy, so that `gdn-trt budget` and the PLE helpers do not import the whole runtime
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
