"""Hugging Face checkpoints of the three families: loading into the internal layout, and synthetic checkpoints.

`load_checkpoint(dir)` reads `config.json` and the safetensors (one file, or shards listed in
`model.safetensors.index.json`), with the `model.` or `model.language_model.` prefix, and returns the GDN layers in
checkpoint order. `make_synthetic_checkpoint(preset, dir, seed)` writes deterministic random weights in the same HF
layout (and the PLE row table as a flat file), so tests and the main job exercise the real loading code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from .config import Family, GdnConfig, Shard, preset
from .dtypes import ACTIVATION_DTYPES, DTYPES
from .ngram import NgramTable
from .tp import qkv_spans, shard_config
from .weights import HcWeights, LayerWeights, MixerWeights, MlpWeights, PleWeights, dtype_problem

log = logging.getLogger("gdn_trt.model")
INDEX_FILE = "model.safetensors.index.json"
PLE_META = "ple_tables.json"
_PREFIXES = ("model.language_model.", "model.", "")
_SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@dataclass(frozen=True)
class TableSegment:
    """`rows` consecutive table rows stored row-major in `path` from byte `offset` on."""

    path: Path
    offset: int
    rows: int


@dataclass(frozen=True)
class PleTable:
    """A PLE layer's n-gram table, `rows x dim` values of `dtype`, row-major: a flat row file (`path`, no header), or
    the HF checkpoint's own safetensors shards read in place (`segments`, in row order; `path` is the first file)."""

    path: Path
    rows: int
    dim: int
    dtype: str
    segments: tuple[TableSegment, ...] = ()

    @property
    def row_bytes(self) -> int:
        return self.dim * DTYPES[self.dtype].itemsize

    def parts(self) -> tuple[TableSegment, ...]:
        return self.segments or (TableSegment(self.path, 0, self.rows),)


@dataclass
class Checkpoint:
    """A loaded checkpoint: its config, its GDN layers in checkpoint order, and the PLE tables by layer index.
    `merged_adapter`: the digest of a LoRA adapter merged into the layers (`peft.merge_checkpoint`), else None."""

    config: GdnConfig
    layers: list[LayerWeights]
    ple_tables: dict[int, PleTable] = field(default_factory=dict)
    path: Path | None = None
    merged_adapter: str | None = None


_DIGEST_CHUNK = 64 << 20


def weights_digest(ck: Checkpoint) -> str:
    """sha256 of everything that decides what a sequence's state means: the config hash, the merged adapter, every
    tensor of every GDN layer (name, dtype, shape and all of its bytes) and the PLE tables' sizes (the tables, up
    to 100 GB and memory-mapped, enter by rows, width and dtype only). A snapshot records it, so a restore onto
    other weights of the same config is refused (`runtime/state.py`).

    Every byte is hashed, in 64 MiB chunks on a thread pool (hashlib releases the GIL), then the chunk digests in
    order. Measured on one idle core of an AMD EPYC (2026-12-03): 38 ms for a Qwen3-Next-80B GDN layer (67 MB
    bf16), 440 ms for a Qwen3.5-27B GDN layer with its dense MLP (767 MB bf16), i.e. 1.75 GB/s per core (0.7-0.8
    GB/s when the machine's 2 cores were shared with other jobs); so about 1.4 s and 21 s of core time for those
    two models' GDN layers, once per session, divided by the cores the pool gets.
    """
    chunks, labels = [], []
    for lw in ck.layers:
        for name, t in lw.named_tensors().items():
            raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
            labels.append((f"{lw.index}.{name}:{str(t.dtype)}:{list(t.shape)}", len(chunks)))
            chunks += [raw[k:k + _DIGEST_CHUNK] for k in range(0, max(len(raw), 1), _DIGEST_CHUNK)]
    with ThreadPoolExecutor(max(1, min(32, os.cpu_count() or 1))) as ex:
        digests = list(ex.map(lambda c: hashlib.sha256(c).digest(), chunks))
    h = hashlib.sha256(f"{ck.config.config_hash()}|{ck.merged_adapter}".encode())
    for k, (label, first) in enumerate(labels):
        end = labels[k + 1][1] if k + 1 < len(labels) else len(chunks)
        h.update(label.encode())
        for d in digests[first:end]:
            h.update(d)
    for i, t in sorted(ck.ple_tables.items()):
        h.update(f"ple{i}:{t.rows}x{t.dim}:{t.dtype}".encode())
    return h.hexdigest()


# ---- Qwen3-Next group interleave (docs/math.md#projections-of-the-three-families) ----
def deinterleave_qkvz(w: Tensor, cfg: GdnConfig) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`in_proj_qkvz` rows, grouped per key head as [q_g | k_g | v_g (G heads) | z_g (G heads)], -> dense Q, K, V, Z."""
    H, K, V, G = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.gva_ratio
    g = w.reshape(H, 2 * K + 2 * G * V, -1)
    q, k, v, z = g.split([K, K, G * V, G * V], dim=1)
    return tuple(t.reshape(-1, w.shape[-1]) for t in (q, k, v, z))


def deinterleave_ba(w: Tensor, cfg: GdnConfig) -> tuple[Tensor, Tensor]:
    """`in_proj_ba` rows, grouped per key head as [b_g (G) | a_g (G)], -> dense B, A."""
    H, G = cfg.linear_num_key_heads, cfg.gva_ratio
    b, a = w.reshape(H, 2 * G, -1).split([G, G], dim=1)
    return b.reshape(-1, w.shape[-1]), a.reshape(-1, w.shape[-1])


def interleave_qkvz_ba(q: Tensor, k: Tensor, v: Tensor, z: Tensor, b: Tensor, a: Tensor, cfg: GdnConfig
                       ) -> tuple[Tensor, Tensor]:
    """Inverse of the two functions above (for writing Qwen3-Next checkpoints)."""
    H, C = cfg.linear_num_key_heads, q.shape[-1]
    per = lambda t: t.reshape(H, -1, C)  # noqa: E731
    qkvz = torch.cat([per(q), per(k), per(v), per(z)], dim=1).reshape(-1, C)
    ba = torch.cat([per(b), per(a)], dim=1).reshape(-1, C)
    return qkvz, ba


# ---- reading ----
class _Tensors:
    """Name -> tensor lookup over one or several safetensors files, prefix-agnostic."""

    def __init__(self, root: Path):
        index = root / INDEX_FILE
        if index.exists():
            wmap = json.loads(index.read_text())["weight_map"]
            self.files = {name: root / f for name, f in wmap.items()}
        else:
            files = sorted(root.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{root}: no *.safetensors and no {INDEX_FILE}")
            self.files = {}
            for f in files:
                with safe_open(f, "pt") as h:
                    self.files.update({name: f for name in h.keys()})
        names = set(self.files)
        self.prefix = next((p for p in _PREFIXES if any(n.startswith(p + "layers.") for n in names)), None)
        if self.prefix is None:
            raise ValueError(f"{root}: no 'layers.' tensors under prefixes {_PREFIXES[:-1]}")

    def has(self, name: str) -> bool:
        return self.prefix + name in self.files

    def header(self, name: str) -> tuple[Path, dict, int]:
        """(file, the tensor's header entry, byte offset of the file's data section), read without loading data."""
        path = self.files[self.prefix + name]
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            return path, json.loads(f.read(n))[self.prefix + name], 8 + n

    def get(self, name: str, integer: bool = False) -> Tensor:
        """The tensor, refused (naming file and tensor) unless it is floating point (`integer`: an integer hash
        constant) and, for floats, finite."""
        path, full = self._where(name)
        with safe_open(path, "pt") as h:
            t = h.get_tensor(full)
        return self._checked(path, full, t, integer)

    def part(self, name: str, spans: list[tuple[int, int]], dim: int = 0) -> Tensor:
        """The rows (`dim` 0) or columns (`dim` 1) [a, b) of each span, concatenated in order: only those bytes are
        read from the file (a tensor-parallel rank's share, `model/tp.py`); checked as `get` checks."""
        path, full = self._where(name)
        with safe_open(path, "pt") as h:
            sl = h.get_slice(full)
            t = torch.cat([sl[a:b] if dim == 0 else sl[:, a:b] for a, b in spans], dim)
        return self._checked(path, full, t, False)

    def _where(self, name: str) -> tuple[Path, str]:
        full = self.prefix + name
        if full not in self.files:
            raise KeyError(f"checkpoint has no tensor {full!r}")
        return self.files[full], full

    @staticmethod
    def _checked(path: Path, full: str, t: Tensor, integer: bool) -> Tensor:
        why = dtype_problem(t, integer)
        if why is not None:
            raise ValueError(f"{path}: tensor {full} is {str(t.dtype).replace('torch.', '')}; {why}")
        if not integer and t.numel() and not bool(torch.isfinite(t.abs().amax())):  # 35 ms per 67 MB on one core
            bad = [f"{n} {what}" for n, what in ((int(torch.isnan(t).sum()), "NaN"),
                                                 (int(torch.isinf(t).sum()), "infinite")) if n]
            raise ValueError(f"{path}: tensor {full} holds {' and '.join(bad)} values: the checkpoint is corrupt "
                             "(re-download or re-convert it)")
        return t


def load_checkpoint(path: str | Path, shard: Shard | None = None) -> Checkpoint:
    """Read an HF checkpoint directory of Qwen3-Next, Qwen3.5 or Qwen4-Exp into internal-layout layer weights.
    With `shard`, only tensor-parallel rank `shard.rank` of `shard.size`: the config is the rank's
    (`tp.shard_config`) and only the rank's rows and columns are read from the files (`model/tp.py`)."""
    root = Path(path)
    if not (root / "config.json").exists():
        raise FileNotFoundError(f"{root}: no config.json (expected an HF checkpoint directory)")
    full = GdnConfig.from_hf(root / "config.json", name=root.name)
    shard = shard or Shard()
    cfg = shard_config(full, shard)
    ts = _Tensors(root)
    layers = [_load_layer(full, ts, i, shard) for i in cfg.gdn_layer_ids]
    stored = sorted({str(t.dtype).replace("torch.", "") for lw in layers for t in lw.named_tensors().values()
                     if t.dtype.is_floating_point} - {cfg.dtype})
    if stored:
        log.info("%s: weights stored as %s while config.json says %s: each layer casts them to the session's "
                 "activation dtype when it is built", root, ", ".join(stored), cfg.dtype)
    tables = _ple_tables(cfg, root, ts)
    return Checkpoint(cfg, layers, tables, root)


def _load_layer(cfg: GdnConfig, ts: _Tensors, i: int, shard: Shard) -> LayerWeights:
    """Layer i of the whole model `cfg`, or rank `shard`'s part of it (only its rows and columns are read)."""
    p = f"layers.{i}."
    la = p + "linear_attn."
    rank = shard_config(cfg, shard)
    whole = shard.size == 1

    def rows(name: str, spans: list[tuple[int, int]]) -> Tensor:
        return ts.get(name) if whole else ts.part(name, spans)

    def cols(name: str, n: int) -> Tensor:
        return ts.get(name) if whole else ts.part(name, [shard.part(n)], dim=1)

    HV, vd = cfg.linear_num_value_heads, cfg.value_dim
    if cfg.family is Family.QWEN3_NEXT:  # a rank's key-head groups are contiguous rows (docs/math.md)
        q, k, v, z = deinterleave_qkvz(rows(la + "in_proj_qkvz.weight", [shard.part(cfg.conv_dim + vd)]), rank)
        b, a = deinterleave_ba(rows(la + "in_proj_ba.weight", [shard.part(2 * HV)]), rank)
        in_proj = torch.cat([q, k, v, z, b, a])
    else:
        in_proj = torch.cat([rows(la + "in_proj_qkv.weight", qkv_spans(cfg, shard)),
                             rows(la + "in_proj_z.weight", [shard.part(vd)]),
                             rows(la + "in_proj_b.weight", [shard.part(HV)]),
                             rows(la + "in_proj_a.weight", [shard.part(HV)])])
    mixer = MixerWeights(in_proj, rows(la + "conv1d.weight", qkv_spans(cfg, shard)).squeeze(1),
                         rows(la + "dt_bias", [shard.part(HV)]), rows(la + "A_log", [shard.part(HV)]),
                         ts.get(la + "norm.weight"), cols(la + "out_proj.weight", vd))
    lw = LayerWeights(i, mixer)
    if cfg.has_mlp(i):
        mlp = [shard.part(cfg.intermediate_size)]
        lw.mlp = MlpWeights(torch.cat([rows(p + "mlp.gate_proj.weight", mlp), rows(p + "mlp.up_proj.weight", mlp)]),
                            cols(p + "mlp.down_proj.weight", cfg.intermediate_size))
    if cfg.is_hc:
        lw.attn_hc = _load_hc(ts, p + "attn_hyper_connection.")
        if cfg.has_mlp(i):
            lw.mlp_hc = _load_hc(ts, p + "mlp_hyper_connection.")
    else:
        lw.input_norm = ts.get(p + "input_layernorm.weight")
        if cfg.has_mlp(i):
            lw.post_norm = ts.get(p + "post_attention_layernorm.weight")
    if cfg.has_ple(i):
        lw.ple = _load_ple(cfg, ts, i)
    lw.check(rank)
    return lw


def _load_hc(ts: _Tensors, p: str) -> HcWeights:
    return HcWeights(*(ts.get(p + n + ".weight") for n in ("hc_norm", "input_mix_weight_down",
                                                            "input_mix_weight_up", "block_inject_weight")))


def _load_ple(cfg: GdnConfig, ts: _Tensors, i: int) -> PleWeights:
    p = f"layers.{i}.ple."
    e = p + "ple_embedding."
    w = PleWeights(*(ts.get(p + n + ".weight") for n in ("key_proj", "value_proj", "norm_key", "norm_query",
                                                          "norm_conv")),
                   ts.get(p + "conv1d.weight").squeeze(1), ts.get(e + "layer_multipliers", integer=True),
                   ts.get(e + "ngram_heads_vocab_sizes", integer=True), ts.get(e + "ngram_heads_offsets", integer=True))
    # the hash constants are read from the checkpoint and re-derived once as a checksum (ple_hc.md §5.2)
    want = NgramTable.for_layer(cfg, i)
    for name, got, exp in (("layer_multipliers", w.multipliers, want.multipliers),
                           ("ngram_heads_vocab_sizes", w.head_sizes, want.head_sizes),
                           ("ngram_heads_offsets", w.head_offsets, want.head_offsets)):
        if tuple(got.tolist()) != tuple(exp):
            raise ValueError(f"layer {i}: checkpoint {name} {got.tolist()} differs from the config's {list(exp)}")
    return w


def _ple_tables(cfg: GdnConfig, root: Path, ts: _Tensors) -> dict[int, PleTable]:
    """Tables from `ple_tables.json` (flat row files), else the checkpoint's own `ngram_embedding` tensors (one, or
    HF's `shard_<k>` split), mapped in place from the safetensors files: 100 GB tables are never copied or loaded."""
    ple_layers = [i for i in cfg.gdn_layer_ids if cfg.has_ple(i)]
    meta_path = root / PLE_META
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    out = {}
    for i in ple_layers:
        if str(i) in meta:
            m = meta[str(i)]
            t = PleTable(root / m["file"], int(m["rows"]), int(m["dim"]), m["dtype"])
            if t.path.stat().st_size != t.rows * t.row_bytes:
                raise ValueError(f"{t.path}: {t.path.stat().st_size} bytes, expected {t.rows * t.row_bytes}")
        else:
            t = _table_in_safetensors(ts, f"layers.{i}.ple.ple_embedding.ngram_embedding.")
            if t is None:
                raise FileNotFoundError(f"{root}: PLE layer {i} has no n-gram table: neither {PLE_META} nor "
                                        "ngram_embedding tensors in the safetensors")
        want = NgramTable.for_layer(cfg, i)
        if (t.rows, t.dim) != (want.rows, want.dim):
            raise ValueError(f"layer {i}: PLE table is {t.rows}x{t.dim}, the config needs {want.rows}x{want.dim}")
        out[i] = t
    return out


def _table_in_safetensors(ts: _Tensors, stem: str) -> PleTable | None:
    names = [stem + "weight"] if ts.has(stem + "weight") else []
    shards = sorted((n for n in ts.files if n.startswith(ts.prefix + stem + "shard_") and n.endswith(".weight")),
                    key=lambda n: int(n[len(ts.prefix + stem + "shard_"):-len(".weight")]))
    names = names or [n[len(ts.prefix):] for n in shards]
    if not names:
        return None
    segs, dims, dtypes = [], set(), set()
    for name in names:
        path, info, data_start = ts.header(name)
        (rows, dim), (a, b) = info["shape"], info["data_offsets"]
        segs.append(TableSegment(path, data_start + a, rows))
        dims.add(dim)
        dtypes.add(_SAFETENSORS_DTYPES.get(info["dtype"], info["dtype"]))
    if len(dims) != 1 or len(dtypes) != 1 or next(iter(dtypes)) not in ACTIVATION_DTYPES:
        raise ValueError(f"{stem}: shards must share one width and a float dtype, got {dims} {dtypes}")
    return PleTable(segs[0].path, sum(s.rows for s in segs), dims.pop(), dtypes.pop(), tuple(segs))


# ---- synthetic checkpoints ----
def random_layer(cfg: GdnConfig, i: int, gen: torch.Generator) -> LayerWeights:
    """Deterministic random internal-layout weights of GDN layer i, scaled so activations stay O(1)."""
    C, HV = cfg.hidden_size, cfg.linear_num_value_heads

    def rnd(*shape: int, std: float = 1.0, mean: float = 0.0) -> Tensor:
        return torch.randn(*shape, generator=gen) * std + mean

    mixer = MixerWeights(
        in_proj=rnd(cfg.in_proj_dim, C, std=C ** -0.5),
        conv=rnd(cfg.conv_dim, cfg.linear_conv_kernel_dim, std=0.5),
        dt_bias=rnd(HV, std=0.5, mean=1.0),
        A_log=torch.empty(HV).uniform_(1.0, 16.0, generator=gen).log(),
        norm=rnd(cfg.linear_value_head_dim, std=0.1, mean=1.0),
        out_proj=rnd(C, cfg.value_dim, std=cfg.value_dim ** -0.5))
    lw = LayerWeights(i, mixer)
    nC, I = cfg.stream_dim, cfg.intermediate_size
    hc = lambda: HcWeights(rnd(nC, std=0.1), rnd(cfg.hc_lowrank, nC, std=nC ** -0.5),  # noqa: E731
                           rnd(nC, cfg.hc_lowrank, std=cfg.hc_lowrank ** -0.5), rnd(cfg.hc_count, nC, std=nC ** -0.5))
    if cfg.has_mlp(i):
        lw.mlp = MlpWeights(rnd(2 * I, C, std=C ** -0.5), rnd(C, I, std=I ** -0.5))
    if cfg.is_hc:
        lw.attn_hc = hc()
        lw.mlp_hc = hc() if cfg.has_mlp(i) else None
    else:
        lw.input_norm = rnd(C, std=0.1)
        lw.post_norm = rnd(C, std=0.1) if cfg.has_mlp(i) else None
    if cfg.has_ple(i):
        E, t = cfg.ple_embed_dim, NgramTable.for_layer(cfg, i)
        lw.ple = PleWeights(rnd(nC, E, std=E ** -0.5), rnd(C, E, std=E ** -0.5), rnd(nC, std=0.1), rnd(nC, std=0.1),
                            rnd(nC, std=0.1), rnd(nC, cfg.ple_conv_kernel_size, std=0.5),
                            torch.tensor(t.multipliers), torch.tensor(t.head_sizes), torch.tensor(t.head_offsets))
    lw.check(cfg)
    return lw


def hf_tensors(cfg: GdnConfig, lw: LayerWeights) -> dict[str, Tensor]:
    """Internal-layout weights of one layer -> HF names (without the model prefix)."""
    p, m = f"layers.{lw.index}.", lw.mixer
    la = p + "linear_attn."
    HV = cfg.linear_num_value_heads
    q, k, v, z, b, a = m.in_proj.split([cfg.key_dim, cfg.key_dim, cfg.value_dim, cfg.value_dim, HV, HV])
    out: dict[str, Tensor] = {}
    if cfg.family is Family.QWEN3_NEXT:
        out[la + "in_proj_qkvz.weight"], out[la + "in_proj_ba.weight"] = interleave_qkvz_ba(q, k, v, z, b, a, cfg)
    else:
        out.update({la + "in_proj_qkv.weight": torch.cat([q, k, v]), la + "in_proj_z.weight": z,
                    la + "in_proj_b.weight": b, la + "in_proj_a.weight": a})
    out.update({la + "conv1d.weight": m.conv[:, None, :], la + "dt_bias": m.dt_bias, la + "A_log": m.A_log,
                la + "norm.weight": m.norm, la + "out_proj.weight": m.out_proj})
    if lw.mlp is not None:
        gate, up = lw.mlp.gate_up.chunk(2)
        out.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": lw.mlp.down})
    for name, hf in (("input_norm", "input_layernorm"), ("post_norm", "post_attention_layernorm")):
        if getattr(lw, name) is not None:
            out[p + hf + ".weight"] = getattr(lw, name)
    for part, hf in (("attn_hc", "attn_hyper_connection"), ("mlp_hc", "mlp_hyper_connection")):
        h = getattr(lw, part)
        if h is not None:
            out.update({f"{p}{hf}.{n}.weight": t for n, t in (("hc_norm", h.norm), ("input_mix_weight_down", h.down),
                        ("input_mix_weight_up", h.up), ("block_inject_weight", h.inject))})
    if lw.ple is not None:
        e, pl = p + "ple.ple_embedding.", lw.ple
        out.update({f"{p}ple.{n}.weight": getattr(pl, n) for n in ("key_proj", "value_proj", "norm_key",
                                                                      "norm_query", "norm_conv")})
        out.update({p + "ple.conv1d.weight": pl.conv[:, None, :], e + "layer_multipliers": pl.multipliers,
                    e + "ngram_heads_vocab_sizes": pl.head_sizes, e + "ngram_heads_offsets": pl.head_offsets})
    return out


def make_synthetic_checkpoint(name_or_cfg: str | GdnConfig, path: str | Path, seed: int = 0,
                              shards: int = 1) -> Path:
    """Write a deterministic random checkpoint in HF layout: config.json, safetensors (sharded with an index when
    shards > 1) and, for PLE layers, the flat n-gram row tables plus `ple_tables.json`."""
    cfg = preset(name_or_cfg) if isinstance(name_or_cfg, str) else name_or_cfg
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[cfg.dtype]
    prefix = "model." if cfg.family is Family.QWEN3_NEXT else "model.language_model."
    tensors: dict[str, Tensor] = {}
    ple_meta = {}
    for i in cfg.gdn_layer_ids:
        lw = random_layer(cfg, i, gen)
        for name, t in hf_tensors(cfg, lw).items():
            tensors[prefix + name] = (t.to(dtype) if t.dtype.is_floating_point else t).contiguous()
        if cfg.has_ple(i):
            t = NgramTable.for_layer(cfg, i)
            table = torch.randn(t.rows, t.dim, generator=gen).to(dtype)
            fname = f"ple_table.layer{i}.bin"
            table.view(torch.uint8).numpy().tofile(root / fname)
            ple_meta[str(i)] = {"file": fname, "rows": t.rows, "dim": t.dim, "dtype": cfg.dtype}
    (root / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    if ple_meta:
        (root / PLE_META).write_text(json.dumps(ple_meta, indent=2))
    _save(tensors, root, shards)
    return root


def _save(tensors: dict[str, Tensor], root: Path, shards: int) -> None:
    names = sorted(tensors)
    if shards <= 1:
        save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
        return
    wmap = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, root / fname, metadata={"format": "pt"})
        wmap.update({n: fname for n in part})
    (root / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": wmap}, indent=2))


def load_table(t: PleTable) -> Tensor:
    """The whole table as a tensor [rows, dim] (tests and small models; the runtime memory-maps it instead)."""
    parts = []
    for seg in t.parts():
        with open(seg.path, "rb") as f:
            f.seek(seg.offset)
            parts.append(torch.frombuffer(bytearray(f.read(seg.rows * t.row_bytes)), dtype=torch.uint8))
    return torch.cat(parts).view(DTYPES[t.dtype]).reshape(t.rows, t.dim)
