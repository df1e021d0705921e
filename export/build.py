"""`gdn-trt build`: TensorRT plans from the exported graphs, through Polygraphy's loaders.

Per graph of an export manifest: the network parsed from ONNX (`network_loader`: strongly typed, so precision
comes from the ONNX dtypes, and with the network flag PREFER_JIT_PYTHON_PLUGINS or PREFER_AOT_PYTHON_PLUGINS:
`--plugins jit|aot`), `CreateConfig` with one optimization profile per GraphSpec bucket and the
`ALIASED_PLUGIN_IO_10_03` preview feature (pool, stash and capture outputs are aliased plugin outputs),
`EngineFromNetwork`, `SaveEngine`. Before parsing, the plugin modules are imported (they register the `gdn_trt`
creators) and a pre-flight check names every custom node whose creator is missing (TensorRT would otherwise inline
the function body silently) and, for `--plugins aot`, every node without an ahead-of-time kernel (an op that
launches several kernels: export with `--aot`): TensorRT would quietly build that one JIT. Plugins with both impls
need the flag (TensorRT refuses to choose); our graphs carry no `aot` node attribute, so the choice is the build's.
`--plugins aot` (TensorRT >= 10.9) gives plans that run without Python (`trtexec`, a C++ runtime): the kernels are in
the plan. `--plugins none` (`--no-plugins`) asks for the plugin-free build instead. Output per graph (`<out>`: this
export's plans folder, `gdn-trt build --out`): `<out>/<layer<i>|stack<a>-<b>>/<stem>.plan` and a JSON manifest
beside it (config hash, layers, GraphSpec, TensorRT and plugin versions, the plugin implementation and network
flags, for AOT plans the Triton version, GPU target and PTX ISA cap, the GPU, the exact preview-feature set, the
context memory per profile, the plan's and the graph's paths relative to the manifest and their sha256, which the
runtime checks, and the builder settings, `BuilderTuning`: memory pool limits, timing cache, optimization level);
per export the engine config `<out>/config.json` (`engine_config.py`). Without TensorRT it raises `TrtUnavailable`
with the install instructions; nothing pretends to build.

Polygraphy's `CreateConfig(preview_features=[...])` sets every member of `trt.PreviewFeature`: the ones listed on,
all others off, TensorRT's defaults included (on 10.x `PROFILE_SHARING_0806` and `RUNTIME_ACTIVATION_RESIZE_10_10`
are on by default). Neither matters here (one context per profile, no runtime resizing), and the manifest records
the whole set (`preview_feature_set`) so a plan says exactly what it was built with.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import onnx

from gdn_trt.model.errors import GdnTrtError
from gdn_trt.plugins.spec import AOT_PLUGINS, NAMESPACE, PLUGIN_VERSION, PLUGINS_BY_NAME
from gdn_trt.plugins.trt_common import PLUGIN_MODULES, context_memory

from .artifacts import GraphRecord, Manifest
from .digest import graph_files, sha256_files
from .engine_config import write_engine_config
from .spec import GraphSpec

MIN_TRT = (10, 8)  # the oldest TensorRT whose plugin layer tests/test_trt_plugin_layer.py drives our six ops through
MIN_TRT_AOT = (10, 9)  # `tensorrt.plugin.aot_impl` and PREFER_*_PYTHON_PLUGINS first in the 10.9 bindings
PLUGIN_IMPLS = ("jit", "aot", "none")
PREVIEW_FEATURES = ("ALIASED_PLUGIN_IO_10_03",)  # on; every other trt.PreviewFeature off (Polygraphy's semantics)
INSTALL = ("TensorRT >= 10.8 with its Python bindings is needed (a Linux machine with an NVIDIA GPU and driver): "
           "pip install 'gdn-trt[trt]' (or pip install 'tensorrt>=10.8' from NVIDIA's package index); the exact "
           "steps are in docs/tensorrt.md")


class TrtUnavailable(GdnTrtError, RuntimeError):
    """TensorRT (or a new enough one) cannot be imported here."""


def import_tensorrt():
    try:
        import tensorrt as trt
    except ImportError as e:
        raise TrtUnavailable(f"`import tensorrt` failed ({e}). {INSTALL}") from e
    version = tuple(int(x) for x in trt.__version__.split(".")[:2])
    if version < MIN_TRT:
        raise TrtUnavailable(f"TensorRT {trt.__version__} is too old: aliased plugin I/O and the plugin-over-"
                             f"local-function rule need >= {'.'.join(map(str, MIN_TRT))}. {INSTALL}")
    return trt


def load_plugins() -> list:
    """Import the plugin modules: their `tensorrt.plugin` decorators register the `gdn_trt` creators."""
    return [importlib.import_module(m) for m in PLUGIN_MODULES]


def custom_nodes(onnx_path: Path) -> list[str]:
    model = onnx.load(str(onnx_path), load_external_data=False)
    return sorted({n.op_type for n in model.graph.node if n.domain == NAMESPACE})


def preflight(onnx_path: Path, plugins: str = "jit") -> dict[str, bool]:
    """op -> whether TensorRT's registry resolves it (name, version, namespace) to a creator; raises naming the
    unresolved ones, which the parser would replace by their function bodies without a word, and for `plugins`
    "aot" the ops without an AOT kernel (the creator would build them JIT under PREFER_AOT without a word)."""
    trt = import_tensorrt()
    reg = trt.get_plugin_registry()
    found = {op: reg.get_creator(op, PLUGIN_VERSION, NAMESPACE) is not None for op in custom_nodes(onnx_path)}
    missing = [op for op, ok in found.items() if not ok or op not in PLUGINS_BY_NAME]
    if missing:
        raise RuntimeError(f"{onnx_path}: no TensorRT plugin creator for {missing} in namespace {NAMESPACE!r} "
                           f"version {PLUGIN_VERSION!r}; were {PLUGIN_MODULES} imported? (--no-plugins builds the "
                           "function bodies instead)")
    multi = [op for op in found if PLUGINS_BY_NAME[op] not in AOT_PLUGINS]
    if plugins == "aot" and multi:
        raise RuntimeError(f"{onnx_path}: {multi} launch several kernels and have no AOT implementation; export "
                           "with `gdn-trt export --aot` (their pass chains) or build with --plugins jit")
    return found


def network_flags(trt, plugins: str) -> list[str]:
    """The network creation flags of a build: STRONGLY_TYPED, and PREFER_<JIT|AOT>_PYTHON_PLUGINS for a plugin
    build where this TensorRT has the flag (10.9+; 10.8 has JIT plugins only, so needs none)."""
    flags = ["STRONGLY_TYPED"]
    prefer = f"PREFER_{plugins.upper()}_PYTHON_PLUGINS"
    if plugins != "none" and hasattr(trt.NetworkDefinitionCreationFlag, prefer):
        flags.append(prefer)
    elif plugins == "aot":
        raise TrtUnavailable(f"TensorRT {trt.__version__} has no AOT plugins (PREFER_AOT_PYTHON_PLUGINS): "
                             f"--plugins aot needs >= {'.'.join(map(str, MIN_TRT_AOT))}; --plugins jit works here")
    return flags


def network_loader(trt, onnx_path: Path, flags: list[str]):
    """A callable returning (builder, network, parser) for Polygraphy's `EngineFromNetwork`, the network created
    with `flags` (Polygraphy's `NetworkFromOnnxPath` sets only STRONGLY_TYPED) and parsed from `onnx_path`."""
    from polygraphy.backend.trt import util as trt_util

    def load():
        logger = trt_util.get_trt_logger()
        builder = trt.Builder(logger)
        bits = 0
        for f in flags:
            bits |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, f))
        network = builder.create_network(bits)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"{onnx_path}: the ONNX parser failed: {errors}")
        return builder, network, parser

    return load


def preview_feature_set(trt) -> dict[str, bool]:
    """Every `trt.PreviewFeature` of this TensorRT -> whether a build with `create_config` enables it."""
    return {name: name in PREVIEW_FEATURES for name in trt.PreviewFeature.__members__}


@dataclass(frozen=True)
class BuilderTuning:
    """The builder settings TensorRT users pass to trtexec and Polygraphy (None = TensorRT's default).

    Args:
        pool_limits: (pool, bytes) per `trt.MemoryPoolType` member, lower case (`workspace`: trtexec
            `--memPoolSize=workspace:...`, Polygraphy `--pool-limit workspace:...`).
        timing_cache: a tactic timing cache file, loaded before each build when it exists and saved (merged) after
            it, so the second build of the same graphs skips the tactic timing.
        optimization_level: builder optimization level 0..5 (TensorRT's default is 3).
    """

    pool_limits: tuple[tuple[str, int], ...] = ()
    timing_cache: Path | None = None
    optimization_level: int | None = None

    def config_args(self, trt) -> dict:
        """Keyword arguments of Polygraphy's `CreateConfig` for these settings."""
        pools = {}
        for name, size in self.pool_limits:
            pool = getattr(trt.MemoryPoolType, name.upper(), None)
            if pool is None:
                raise ValueError(f"memory pool {name!r} is not a trt.MemoryPoolType of TensorRT {trt.__version__}; "
                                 f"pools: {', '.join(n.lower() for n in trt.MemoryPoolType.__members__)}")
            pools[pool] = size
        return {"memory_pool_limits": pools or None, "builder_optimization_level": self.optimization_level,
                "load_timing_cache": None if self.timing_cache is None else str(self.timing_cache)}

    def engine_args(self) -> dict:
        """Keyword arguments of Polygraphy's `EngineFromNetwork` (where the timing cache is saved)."""
        return {"save_timing_cache": None if self.timing_cache is None else str(self.timing_cache)}

    def to_json(self) -> dict:
        return {"pool_limits": dict(self.pool_limits), "optimization_level": self.optimization_level,
                "timing_cache": None if self.timing_cache is None else str(self.timing_cache)}


def create_config(trt, profiles: list, refittable: bool = False, tuning: BuilderTuning = BuilderTuning()):
    """Polygraphy `CreateConfig`: the profiles, `PREVIEW_FEATURES` (and only those), REFIT when asked, `tuning`."""
    from polygraphy.backend.trt import CreateConfig

    return CreateConfig(profiles=profiles, preview_features=[getattr(trt.PreviewFeature, n) for n in PREVIEW_FEATURES],
                        refittable=refittable, **tuning.config_args(trt))


def profiles(spec: GraphSpec) -> list:
    from polygraphy.backend.trt import Profile

    out = []
    for i in range(len(spec.buckets)):
        p = Profile()
        for name, (mn, opt, mx) in spec.profile(i).items():
            p.add(name, min=mn, opt=opt, max=mx)
        out.append(p)
    return out


def engine_loader(spec: GraphSpec, onnx_path: Path, plugins: str = "jit", refittable: bool = False,
                  tuning: BuilderTuning = BuilderTuning()):
    """A Polygraphy engine loader for one graph (nothing runs until it is called). `plugins`: "jit", "aot" or
    "none" (`PLUGIN_IMPLS`); `refittable` sets BuilderFlag.REFIT, so `gdn-trt refit` can later replace the weights
    (e.g. a merged LoRA adapter)."""
    trt = import_tensorrt()
    from polygraphy.backend.trt import EngineFromNetwork

    if plugins not in PLUGIN_IMPLS:
        raise ValueError(f"plugins must be one of {PLUGIN_IMPLS}, got {plugins!r}")
    flags = network_flags(trt, plugins)
    if plugins != "none":
        load_plugins()
        preflight(onnx_path, plugins)
    config = create_config(trt, profiles(spec), refittable, tuning)
    return EngineFromNetwork(network_loader(trt, onnx_path, flags), config=config, **tuning.engine_args())


@dataclass(frozen=True)
class BuildOptions:
    """out: the folder of this export's plans (`<out>/<layer<i>|stack<a>-<b>>/<stem>.plan`, `<out>/config.json`)."""

    out: Path
    plugins: str = "jit"  # "jit", "aot" or "none" (PLUGIN_IMPLS)
    refittable: bool = False
    tuning: BuilderTuning = BuilderTuning()


def _gpu() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"name": None, "compute_capability": None}
    return {"name": torch.cuda.get_device_name(0), "compute_capability": list(torch.cuda.get_device_capability(0))}


def build_graph(manifest: Manifest, rec: GraphRecord, opts: BuildOptions) -> Path:
    """Build and save one plan and its JSON manifest; returns the plan path. Refuses a graph whose bytes differ
    from its export manifest's sha256 (changed since the export) before building."""
    trt = import_tensorrt()
    from polygraphy.backend.trt import SaveEngine

    onnx_path = manifest.root / rec.path
    got = sha256_files(graph_files(onnx_path))
    if got != rec.sha256:
        raise ValueError(f"{onnx_path}: sha256 {got[:16]}... differs from the export manifest's {rec.sha256[:16]}...: "
                         "the graph changed since the export; export again")
    plan = opts.out / Path(rec.path).with_suffix(".plan")
    plan.parent.mkdir(parents=True, exist_ok=True)
    engine = SaveEngine(engine_loader(rec.spec, onnx_path, opts.plugins, opts.refittable, opts.tuning),
                        path=str(plan))()
    built = {"tensorrt": trt.__version__, "preview_features": preview_feature_set(trt),
             "context_memory": context_memory(engine), "network_flags": network_flags(trt, opts.plugins)}
    meta = plan_manifest(manifest, rec, plan, opts, built)
    plan.with_suffix(".json").write_text(json.dumps(meta, indent=2))
    config = manifest.data.get("engine_config")
    if config is not None:  # exports made before the engine config existed have none (and weights inside)
        write_engine_config(config, opts.out, {"tensorrt": built["tensorrt"], "plugins": plugin_label(opts.plugins)})
    return plan


def plugin_label(plugins: str) -> str:
    """How the plans run their custom nodes, for config.json and the build's first line."""
    return {"jit": "gdn_trt JIT QDP (Python and Triton at run time)",
            "aot": "gdn_trt AOT QDP (kernels in the plan, no Python at run time)"}.get(plugins, "none (bodies inlined)")


def _aot_facts(plugins: str) -> dict | None:
    """What an AOT plan's kernels were compiled with: Triton, the GPU target, the PTX ISA cap (the driver of the
    building machine: the plans load on that driver or newer)."""
    if plugins != "aot":
        return None
    import triton

    from gdn_trt.plugins import aot

    t = aot.default_target()
    return {"triton": triton.__version__, "target": f"sm_{t.arch}", "ptx_isa_cap": aot.ptx_cap(),
            "smem_limit": aot.AOT_SMEM_LIMIT}


def plan_manifest(manifest: Manifest, rec: GraphRecord, plan: Path, opts: BuildOptions, built: dict) -> dict:
    """The JSON manifest of a built plan. Paths are relative to the manifest's own folder (the plan beside it, the
    graph it was built from), so an engines folder moved together with its export keeps resolving them; the
    runtime checks both sha256 before deserializing (`runtime/plan_files.py`). `built`: what the build itself
    reports (TensorRT version, preview-feature set, context memory per profile)."""
    onnx_path = manifest.root / rec.path
    merged = manifest.data.get("adapter")
    return {
        "model": manifest.data["model"], "config_hash": rec.spec.config_hash, "layers": list(rec.spec.layer_ids),
        "graph_spec": rec.spec.to_json(),
        "plan": plan.name, "onnx": os.path.relpath(onnx_path, plan.parent), "onnx_sha256": rec.sha256,
        "tensorrt": built["tensorrt"],
        "plugins": ({op: {"namespace": NAMESPACE, "version": PLUGIN_VERSION} for op in custom_nodes(onnx_path)}
                    if opts.plugins != "none" else "none (function bodies inlined)"),
        "plugin_impl": opts.plugins, "network_flags": built.get("network_flags", []), "aot": _aot_facts(opts.plugins),
        "preview_features": built["preview_features"], "context_memory": built["context_memory"], "gpu": _gpu(),
        "refittable": opts.refittable, "builder": opts.tuning.to_json(),
        "merged_adapter": None if merged is None else merged["digest"],
        "plan_sha256": sha256_files([plan]), "plan_bytes": plan.stat().st_size,
    }
