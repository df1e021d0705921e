"""What `Session.open` accepts as a model: an HF checkpoint directory, a loaded `Checkpoint`, a preset name or a
`GdnConfig` (the last two get deterministic synthetic weights made in memory, and PLE row tables written to a
temporary directory, since the prestage memory-maps its table from a file)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from ..model.checkpoint import PLE_META, Checkpoint, PleTable, load_checkpoint, random_layer
from ..model.config import PRESETS, GdnConfig
from ..model.ngram import NgramTable

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Source = str | Path | Checkpoint | GdnConfig


def act_dtype(cfg: GdnConfig, device: torch.device) -> torch.dtype:
    """The activation dtype a session computes in: fp32 on the CPU (the reference ops), the config's on CUDA."""
    return torch.float32 if device.type == "cpu" else _DTYPES[cfg.dtype]


def load_source(src: Source, seed: int = 0) -> tuple[Checkpoint, tempfile.TemporaryDirectory | None]:
    """The checkpoint of `src` and, for synthetic models with PLE, the temporary directory holding their tables
    (keep it alive as long as the checkpoint is used)."""
    if isinstance(src, Checkpoint):
        return src, None
    if isinstance(src, str) and src in PRESETS:
        src = PRESETS[src]
    if isinstance(src, GdnConfig):
        return synthetic(src, seed)
    path = Path(src)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{src!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a checkpoint "
                                "directory with a config.json")
    return load_checkpoint(path), None


def synthetic(cfg: GdnConfig, seed: int) -> tuple[Checkpoint, tempfile.TemporaryDirectory | None]:
    """Deterministic random weights of `cfg` in memory (the same generator as `make_synthetic_checkpoint`)."""
    gen = torch.Generator().manual_seed(seed)
    dtype = _DTYPES[cfg.dtype]
    layers, tables, tmp = [], {}, None
    for i in cfg.gdn_layer_ids:
        lw = random_layer(cfg, i, gen)
        for part in lw.named_tensors().values():
            if part.dtype.is_floating_point:
                part.data = part.data.to(dtype)
        layers.append(lw)
        if cfg.has_ple(i):
            tmp = tmp or tempfile.TemporaryDirectory(prefix="gdn-trt-ple-")
            t = NgramTable.for_layer(cfg, i)
            path = Path(tmp.name) / f"ple_table.layer{i}.bin"
            torch.randn(t.rows, t.dim, generator=gen).to(dtype).view(torch.uint8).numpy().tofile(path)
            tables[i] = PleTable(path, t.rows, t.dim, cfg.dtype)
    if tmp is not None:
        meta = {str(i): {"file": t.path.name, "rows": t.rows, "dim": t.dim, "dtype": t.dtype}
                for i, t in tables.items()}
        (Path(tmp.name) / PLE_META).write_text(json.dumps(meta))
    return Checkpoint(cfg, layers, tables, None), tmp
