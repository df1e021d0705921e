"""The engine config: `config.json` beside the plans of one model, the facts a loader (ours, or a C++ one that never
reads a GraphSpec) needs to allocate the recurrent state and bind the plans.

`gdn-trt export` computes it into the export manifest (`engine_config`), `gdn-trt build` writes it to
`<engines>/<model>/config.json` with the TensorRT version it built with, and the runtime checks it against the model
it serves before loading a plan (`check_engine_config`): every model field must equal what the session computes
from its own config and activation dtype, or the load is refused naming each field. Where TensorRT Edge-LLM's
runtime config has the concept, the field has its name (`num_linear_attn_layers`, `recurrent_state_*`, `conv_dim`,
`conv_kernel`, `conv_state_dtype`, `recurrent_spec_verify_mode`); the value of the last is `stash`: verify steps
write the state after every draft token to runtime-owned stash buffers and `accept` folds the accepted row into the
pools (Edge-LLM's GDN uses `snapshot`, per-token states as graph outputs).

Shapes are per GDN layer and exclude the slot dimension: a pool is `[pool_slots, *shape]`, a stash `[tokens,
*shape]`, a capture `[sequences, *shape]`.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

from gdn_trt.model.config import GdnConfig
from gdn_trt.model.errors import GdnTrtError

from .spec import GraphSpec, Limits, gdn_runs

FORMAT, FORMAT_VERSION, CONFIG_NAME = "gdn-trt-engines", 1, "config.json"
VERIFY_MODE = "stash"


class EngineConfigError(GdnTrtError, ValueError):
    """An engine config that does not describe the model a session serves, or that cannot be read."""


def package_version() -> str:
    try:
        return importlib.metadata.version("gdn-trt")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def model_fields(cfg: GdnConfig, act_dtype: str) -> dict:
    """The fields that follow from the model and the activation dtype alone: what the runtime cross-checks."""
    ple = [i for i in cfg.gdn_layer_ids if cfg.has_ple(i)]
    out = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "model": cfg.name, "config_hash": cfg.config_hash(), "family": cfg.family.value,
        "num_hidden_layers": cfg.num_layers, "layer_types": list(cfg.layer_types),
        "num_linear_attn_layers": len(cfg.gdn_layer_ids), "linear_attn_layer_ids": list(cfg.gdn_layer_ids),
        "hidden_size": cfg.hidden_size, "hc_count": cfg.hc_count, "stream_dim": cfg.stream_dim,
        "activation_dtype": act_dtype,
        "recurrent_state_num_heads": cfg.linear_num_value_heads, "recurrent_state_key_heads":
            cfg.linear_num_key_heads, "recurrent_state_key_dim": cfg.linear_key_head_dim,
        "recurrent_state_value_dim": cfg.linear_value_head_dim, "recurrent_state_shape": list(cfg.ssm_state_shape),
        "recurrent_state_dtype": "float32",
        "conv_dim": cfg.conv_dim, "conv_kernel": cfg.linear_conv_kernel_dim, "conv_dilation": 1,
        "conv_state_shape": list(cfg.conv_state_shape), "conv_state_dtype": act_dtype,
        "ple_layer_ids": ple,
        "recurrent_spec_verify_mode": VERIFY_MODE,
        "stack_runs": [list(r) for r in gdn_runs(cfg)],
    }
    if cfg.tp_size > 1:  # a rank's plans: absent for a whole model, so its config.json is what it was
        out["tp"] = {"size": cfg.tp_size, "rank": cfg.tp_rank, "reduce": "host"}
    if ple:
        out.update({"ple_conv_dim": cfg.stream_dim, "ple_conv_kernel": cfg.ple_conv_kernel_size,
                    "ple_conv_dilation": cfg.ple_dilation, "ple_conv_state_shape": list(cfg.ple_conv_state_shape),
                    "ple_conv_state_dtype": act_dtype, "ple_rows_shape": [cfg.ple_heads, cfg.ple_head_dim]})
    return out


def engine_config(cfg: GdnConfig, act_dtype: str, limits: Limits, specs: list[GraphSpec], weights: bool) -> dict:
    """The whole config of an export: the model fields, the package, how weights reach the plans, the limits, and
    the graphs by layers (a stack's run or one layer) with their modes; a tensor-parallel rank's dense-MLP layer
    also with `parts` ["mixer", "mlp"]: each mode is those two plans, the host's all-reduce between them."""
    graphs: dict[tuple[int, ...], list[str]] = {}
    parts: dict[tuple[int, ...], list[str]] = {}
    for s in specs:
        if s.part is None or s.mode.value not in graphs.get(s.layer_ids, []):
            graphs.setdefault(s.layer_ids, []).append(s.mode.value)
        if s.part is not None and s.part.value not in parts.get(s.layer_ids, []):
            parts.setdefault(s.layer_ids, []).append(s.part.value)
    lim = GraphSpec.to_json(specs[0])["limits"] if specs else None
    return {**model_fields(cfg, act_dtype), "package": "gdn-trt", "package_version": package_version(),
            "weights": "inputs" if weights else "inside", "pool_slots": limits.pool_slots, "limits": lim,
            "graphs": [{"layers": list(ids), "modes": modes, **({"parts": parts[ids]} if ids in parts else {})}
                       for ids, modes in graphs.items()]}


def write_engine_config(config: dict, folder: Path, built: dict) -> Path:
    """`<folder>/config.json`: the export's engine config with what the build reports (`built`: TensorRT version,
    plugin kind)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CONFIG_NAME
    path.write_text(json.dumps({**config, **built}, indent=2))
    return path


def read_engine_configs(root: Path) -> list[tuple[Path, dict]]:
    """Every engine config under `root` (files named `config.json` whose object has our `format`)."""
    found = []
    for path in sorted(root.rglob(CONFIG_NAME)):
        try:
            d = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError, OSError) as e:
            raise EngineConfigError(f"{path}: unreadable engine config ({type(e).__name__}: {str(e)[:120]}); "
                                    "rebuild with gdn-trt build") from None
        if isinstance(d, dict) and d.get("format") == FORMAT:
            found.append((path, d))
    return found


def check_engine_config(path: Path, d: dict, cfg: GdnConfig, act_dtype: str) -> None:
    """Raise `EngineConfigError` naming every model field of `d` that differs from `cfg` at `act_dtype`, and a
    format version this runtime does not read."""
    if d.get("format_version") != FORMAT_VERSION:
        raise EngineConfigError(f"{path}: engine config format_version {d.get('format_version')!r}; this gdn-trt "
                                f"({package_version()}) reads version {FORMAT_VERSION}: rebuild the engines")
    want = model_fields(cfg, act_dtype)
    bad = [f"{k}: config.json has {d.get(k, '<missing>')!r}, the session's model has {v!r}"
           for k, v in want.items() if d.get(k, "<missing>") != v]
    if bad:
        raise EngineConfigError(f"{path} does not describe the model this session serves ({cfg.name}, {act_dtype} "
                                "activations): " + "; ".join(bad[:8]) + (f"; and {len(bad) - 8} more" if len(bad) > 8
                                                                          else ""))
    if d.get("weights") != "inputs":
        raise EngineConfigError(f"{path}: the plans hold their weights inside (weights {d.get('weights')!r}): every "
                                "mode's plan would hold its own copy; export again without --embed-weights")
