"""GraphSpec-aware inputs for comparisons: valid packings, distinct slots, random states.

Each mode gets a fixed list of cases that exercise what its graph must get right: distinct pool slots drawn at
random, a padding sequence (slot -1) where the mode has several sequences, a sequence with zero tokens (verify
with no drafts, an empty prefill), capture points at 0, at a 64-token chunk boundary and none (-1), and prefills
that cross a chunk boundary. Activations, pools, stashes and captures are random, so rows a graph must leave
untouched are compared too. Graphs with LoRA slots get random slot weights and, per sequence, an adapter slot
(the last slot first, then the others, then -1 = none), so single-sequence modes use an adapter and multi-sequence
modes mix adapters with none. Every case must fit one of the spec's profile buckets.

Feeds are numpy arrays, or torch tensors for a graph with a dtype numpy lacks (bfloat16 activations): values are
drawn in float32 and rounded once to the input's dtype. Polygraphy's comparator and runners take either. Weight
inputs (role weight) get the layers' real weights, given by the caller (`compare.weight_feed`).

Beside every exported graph, `write_loader_script` writes a Polygraphy data-loader script `<stem>_data.py` whose
`load_data` yields these feeds (`compare.polygraphy_loader`: the GraphSpec from the manifest, the weight inputs
from the export's checkpoint), so `polygraphy run <graph> --onnxrt --data-loader-script <stem>_data.py` runs the
graph on valid inputs and the layers' own weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from gdn_trt.model.modes import LayerMode

from .spec import GraphSpec, Role

NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32}


@dataclass(frozen=True)
class Case:
    """Token counts and pool slots of the sequences of one step (slot -1 = padding), and the capture points."""

    lengths: tuple[int, ...]
    slots: tuple[int, ...]
    capture_at: tuple[int, ...] | None = None
    adapters: tuple[int, ...] | None = None  # LoRA slot per sequence (-1 = none); None = no LoRA inputs

    def sizes(self) -> dict[str, int]:
        return {"N": len(self.lengths), "T": sum(self.lengths)}


def _fit(lengths: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """Shrink the longest sequences until all tokens (a padding sequence, -1, holds one) fit in `budget`."""
    lens = list(lengths)
    while sum(max(L, 1) if L < 0 else L for L in lens) > budget:
        i = max(range(len(lens)), key=lambda j: lens[j])
        lens[i] -= 1
    return tuple(lens)


def _cases(spec: GraphSpec) -> list[tuple[tuple[int, ...], tuple[int, ...] | None]]:
    """(lengths, capture_at) per case; -1 in `lengths` marks a padding sequence (slot -1) of one token."""
    lim, mode = spec.limits, spec.mode
    n, K = min(3, lim.max_seqs), lim.max_draft
    if mode is LayerMode.DECODE:
        return [((1,), None)]
    if mode is LayerMode.DECODE_MULTI_SEQ:
        return [((1,) * n, None), ((1, -1, 1)[:n], None)]
    if mode is LayerMode.DECODE_BATCHED:
        return [((K,), None), ((max(1, K - 1),), None)]
    if mode is LayerMode.VERIFY_MULTI:
        return [((K, 0, min(2, K))[:n], None), ((min(2, K), -1, K)[:n], None)]
    if mode is LayerMode.PREFILL:
        long, short = min(70, lim.max_tokens), min(33, lim.max_tokens)
        return [((long,), (min(64, long),)), ((short,), (-1,)), ((short,), (0,))]
    out = []
    for lengths, caps in (((67, 5, 0), (64, 0, -1)), ((9, -1, 3), (2, -1, 3))):
        lens = _fit(lengths[:n], lim.max_tokens)
        out.append((lens, tuple(min(c, max(L, 0)) for c, L in zip(caps, lens))))
    return out


class GraphData:
    """Iterable of feed dicts (spec input names; numpy, or torch for a bf16 graph) for `iterations` cases; `cases`
    lists what each holds. `weights`: the value of every weight input (role weight) by input name, numpy or torch,
    the same in every case (the layers' real weights: every runner then computes with them); required when the spec
    has weight inputs."""

    def __init__(self, spec: GraphSpec, iterations: int = 2, seed: int = 0, weights: dict | None = None):
        need = [t.name for t in spec.inputs if t.role is Role.WEIGHT]
        missing = [n for n in need if n not in (weights or {})]
        if missing:
            raise ValueError(f"{spec.stem}: no value for weight inputs {missing[:4]}"
                             f"{' ...' if len(missing) > 4 else ''} (pass the layers' weights)")
        self.spec, self.seed, self.weights = spec, seed, {n: weights[n] for n in need}
        rng = np.random.default_rng(seed)
        base = _cases(spec)
        self.cases = [self._case(base[i % len(base)], rng) for i in range(iterations)]

    def _case(self, c: tuple, rng: np.random.Generator) -> Case:
        lengths, caps = c
        free = rng.permutation(self.spec.limits.pool_slots)
        slots = tuple(-1 if L < 0 else int(free[i]) for i, L in enumerate(lengths))
        lora = self.spec.limits.lora
        adapters = None if lora is None else tuple(lora.max_adapters - 1 - k % (lora.max_adapters + 1)
                                                   for k in range(len(lengths)))
        case = Case(tuple(1 if L < 0 else L for L in lengths), slots, caps, adapters)
        self.spec.bucket_for({**case.sizes(), "S": self.spec.limits.pool_slots})  # raises if no profile holds it
        return case

    def feed(self, case: Case, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed * 1000 + index + 1)
        sizes = {**case.sizes(), "S": self.spec.limits.pool_slots}
        cu = np.concatenate([[0], np.cumsum(case.lengths)]).astype(np.int32)
        adapters = case.adapters or ()
        fixed = {"cu_seqlens": cu, "slots": np.asarray(case.slots, np.int32),
                 "capture_at": np.asarray(case.capture_at or (), np.int32),
                 "lora_idx": np.repeat(np.asarray(adapters, np.int32), case.lengths[:len(adapters)])}
        feed = {}
        for t in self.spec.inputs:
            shape = t.shape(sizes)
            if t.role is Role.INDEX:
                feed[t.name] = fixed[t.name].reshape(shape)
            elif t.role is Role.WEIGHT:
                feed[t.name] = self.weights[t.name]
            else:
                scale = 0.5 if t.role is not Role.ACTIVATION else 1.0
                feed[t.name] = (rng.standard_normal(shape) * scale).astype(NUMPY_DTYPES.get(t.dtype, np.float32))
        if all(t.dtype in NUMPY_DTYPES for t in self.spec.inputs):
            return feed
        return {t.name: (x if isinstance(x, torch.Tensor) else torch.from_numpy(x)).to(t.torch_dtype)
                for t, x in ((t, feed[t.name]) for t in self.spec.inputs)}

    def __iter__(self):
        for i, case in enumerate(self.cases):
            yield self.feed(case, i)

    def __len__(self) -> int:
        return len(self.cases)


LOADER_SUFFIX = "_data.py"
_LOADER = '''"""Polygraphy data loader of {graph} ({model}, {where}, {mode}), written by `gdn-trt export`.

From the export folder:
    polygraphy run {graph} --onnxrt --data-loader-script {script}
    polygraphy run {graph} --trt --data-loader-script {script} \\
        --strongly-typed --preview-features aliased_plugin_io_10_03 \\
        --trt-min-shapes {mins} \\
        --trt-opt-shapes {opts} \\
        --trt-max-shapes {maxs}

`load_data` yields what `gdn-trt compare` feeds this graph: valid packings (cu_seqlens), distinct pool slots (a
padding sequence, slot -1, where the mode takes several), capture points and random states, made from the graph's
GraphSpec in manifest.json (gdn_trt.export.data){weights}. Where TensorRT is installed, importing this file also
registers the gdn_trt plugins, so that `--trt` parses the custom nodes as plugins.
"""
from gdn_trt.export.compare import polygraphy_loader

load_data = polygraphy_loader(__file__)
try:
    import tensorrt  # noqa: F401
except ImportError:
    pass
else:
    from gdn_trt.export.build import load_plugins

    load_plugins()
'''
_WEIGHTS = (", and the weight inputs the layers' real weights, read from the export's checkpoint (manifest.json "
            "records it relative to this folder, with any merged adapter)")


def loader_script(onnx_path: Path) -> Path:
    """`layer0/decode.onnx` -> `layer0/decode_data.py` (a module name Polygraphy can import: no dot in the stem)."""
    return onnx_path.with_name(onnx_path.name.removesuffix(".onnx") + LOADER_SUFFIX)


def _shapes(spec: GraphSpec, point: int, bucket: int) -> str:
    prof = spec.profile(bucket)
    return " ".join(f"{t.name}:[{','.join(map(str, prof[t.name][point]))}]" for t in spec.inputs
                    if not all(isinstance(d, int) for d in t.dims))


def write_loader_script(onnx_path: Path, spec: GraphSpec) -> Path:
    """Write the Polygraphy data-loader script beside an exported graph (the TensorRT shapes of the profile that
    holds the loader's first case go into its docstring; weight inputs are static and need none)."""
    script = loader_script(onnx_path)
    lengths, _ = _cases(spec)[0]
    bucket = spec.bucket_for({"N": len(lengths), "T": sum(max(L, 1) if L < 0 else L for L in lengths),
                              "S": spec.limits.pool_slots})
    rel = lambda p: f"{p.parent.name}/{p.name}"  # noqa: E731 (relative to the export folder)
    script.write_text(_LOADER.format(graph=rel(onnx_path), model=spec.model, where=spec.where, mode=spec.stem,
                                     script=rel(script), mins=_shapes(spec, 0, bucket), opts=_shapes(spec, 1, bucket),
                                     maxs=_shapes(spec, 2, bucket),
                                     weights="" if spec.weights_inside else _WEIGHTS))
    return script


def loader_graph(script: str | Path) -> tuple[Path, str]:
    """The export folder and the graph path (relative to it, as the manifest lists it) of a loader script."""
    path = Path(script).resolve()
    return path.parent.parent, f"{path.parent.name}/{path.name.removesuffix(LOADER_SUFFIX)}.onnx"
