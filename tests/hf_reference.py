"""The public Hugging Face implementations of the three families, built from a checkpoint directory, as oracles.

`HfLayer` assembles HF's own modules for one GDN layer with the checkpoint's weights, in float64:
- Qwen3.5 dense and Qwen3-Next dense-MLP layers: HF's whole decoder layer;
- mixer-only layers (the MoE families): HF's input_layernorm + GatedDeltaNet + residual add (Qwen3-Next) or
  PLE + gated residual + GatedDeltaNet + injection (Qwen4-Exp), composed exactly as HF's decoder layer does
  before its MoE.
It runs whole sequences (no cache) or a prefill followed by single-token decode steps through HF's cache.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from gdn_trt.model.checkpoint import Checkpoint, load_table
from gdn_trt.model.config import Family

F64 = torch.float64


def _state_dict(root: Path) -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {}
    for f in sorted(root.glob("*.safetensors")):
        sd.update(load_file(f))
    return sd


def _sub(sd: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


@dataclass
class HfStates:
    """HF cache contents after a run in this project's layout: recurrent [HV, K, V], conv [W-1, conv_dim] (HF
    keeps [conv_dim, W] channel-major; the oldest column is dropped and the rest transposed here), ple_conv
    [carry, n*C] (HF: [n*C, carry], transposed) or None."""

    ssm: torch.Tensor
    conv: torch.Tensor
    ple_conv: torch.Tensor | None


class HfLayer:
    def __init__(self, ck: Checkpoint, layer_idx: int):
        self.ck, self.i, cfg = ck, layer_idx, ck.config
        self.family = cfg.family
        raw = json.loads((ck.path / "config.json").read_text())
        text = raw.get("text_config", raw)
        sd = _state_dict(ck.path)
        pre = next(p for p in ("model.language_model.", "model.") if any(k.startswith(p) for k in sd))
        lsd = _sub(sd, f"{pre}layers.{layer_idx}.")
        self.mods: dict[str, torch.nn.Module] = {}
        if self.family is Family.QWEN3_NEXT:
            from transformers.models.qwen3_next.configuration_qwen3_next import Qwen3NextConfig
            from transformers.models.qwen3_next import modeling_qwen3_next as m
            self.hfc = Qwen3NextConfig(**text)
            if cfg.has_mlp(layer_idx):
                self._add("decoder", m.Qwen3NextDecoderLayer(self.hfc, layer_idx), lsd)
            else:
                self._add("input_layernorm", m.Qwen3NextRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps),
                          _sub(lsd, "input_layernorm."))
                self._add("linear_attn", m.Qwen3NextGatedDeltaNet(self.hfc, layer_idx), _sub(lsd, "linear_attn."))
        elif self.family is Family.QWEN3_5:
            from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
            from transformers.models.qwen3_5 import modeling_qwen3_5 as m
            self.hfc = Qwen3_5TextConfig(**text)
            self._add("decoder", m.Qwen3_5DecoderLayer(self.hfc, layer_idx), lsd)
        else:
            from transformers.models.qwen4_exp.configuration_qwen4_exp import Qwen4ExpTextConfig
            from transformers.models.qwen4_exp import modeling_qwen4_exp as m
            self.hfc = Qwen4ExpTextConfig(**text)
            self._add("attn_hc", m.Qwen4ExpTextGatedResidual(self.hfc), _sub(lsd, "attn_hyper_connection."))
            self._add("linear_attn", m.Qwen4ExpTextGatedDeltaNet(self.hfc, layer_idx), _sub(lsd, "linear_attn."))
            if cfg.has_ple(layer_idx):
                ple = m.Qwen4ExpTextPLELayer(self.hfc, layer_idx, cfg.ple_index(layer_idx))
                psd = _sub(lsd, "ple.")
                psd["ple_embedding.ngram_embedding.weight"] = load_table(ck.ple_tables[layer_idx]).clone()
                self._add("ple", ple, psd)

    def _add(self, name: str, mod: torch.nn.Module, sd: dict) -> None:
        mod.load_state_dict(sd, strict=True)
        self.mods[name] = mod.to(F64).eval()

    def ple_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """HF's n-gram lookup of a whole sequence from a fresh id context, as rows [T, heads, d_h]."""
        cfg = self.ck.config
        with torch.no_grad():
            e = self.mods["ple"].ple_embedding(ids[None], None)[0]
        return e.reshape(ids.shape[0], cfg.ple_heads, cfg.ple_head_dim)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor | None, cache) -> torch.Tensor:
        """x [1, T, width] -> hidden after the layer's last residual add, HF style."""
        m = self.mods
        with torch.no_grad():
            if "decoder" in m:
                return m["decoder"](x, position_embeddings=None, cache=cache)
            if self.family is Family.QWEN3_NEXT:
                return x + m["linear_attn"](m["input_layernorm"](x), cache=cache)
            h = x
            if "ple" in m:
                h = h + m["ple"](h, ids[None], cache)
            y_in, hs, inj = m["attn_hc"](h)
            y = m["linear_attn"](y_in, cache=cache)
            return hs + (y.unsqueeze(-2) * inj.unsqueeze(-1)).flatten(-2)

    def sequence(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        return self(x[None], ids, None)[0]

    def prefill_then_decode(self, x: torch.Tensor, ids: torch.Tensor | None, prefill_len: int
                            ) -> tuple[torch.Tensor, HfStates]:
        """Prefill `prefill_len` tokens through HF's cache, then one token per call; outputs [T, width]."""
        cache = DynamicCache(config=self.hfc)
        T = x.shape[0]
        chunks = [(0, prefill_len)] + [(t, t + 1) for t in range(prefill_len, T)]
        outs = [self(x[None, a:b], None if ids is None else ids[a:b], cache)[0] for a, b in chunks]
        layer = cache.layers[self.i]
        ple = layer.conv_states[1][0].T if "ple" in self.mods else None
        return torch.cat(outs), HfStates(layer.recurrent_states[0][0], layer.conv_states[0][0][:, 1:].T, ple)
