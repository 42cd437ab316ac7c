"""Cohere Command-R as ``CohereForCausalLM`` (transformers 5.24 ``models/cohere/modeling_cohere.py``).

One norm per block feeds attention and the MLP side by side: ``out = x + attn(n) + mlp(n)``, ``n =
input_layernorm(x)``. Parameter tensors, per layer ``model.layers.*.``:

- ``self_attn.q_proj.weight`` [a*d, h], ``k_proj.weight`` / ``v_proj.weight`` [kv*d, h], ``o_proj.weight``
  [h, a*d] (each with a bias when ``attention_bias``);
- with ``use_qk_norm``: ``self_attn.q_norm.weight`` [a, d] and ``self_attn.k_norm.weight`` [kv, d] (a
  CohereLayerNorm per head, one weight row per head);
- ``mlp.gate_proj.weight`` / ``mlp.up_proj.weight`` [I, h], ``mlp.down_proj.weight`` [h, I];
- ``input_layernorm.weight`` [h] (CohereLayerNorm: mean-centred, no bias);

plus ``model.embed_tokens.weight`` [V, h], ``model.norm.weight`` [h] and ``lm_head.weight`` [V, h] unless
``tie_word_embeddings`` (default true: Command-R ties). The logits are multiplied by ``logit_scale``.

CohereLayerNorm is a LayerNorm without bias computed in fp32: it saves two fp32 centred copies of its input
(``x - mean`` is computed twice), one rsqrt per row and (its weight trained) the fp32 normalised tensor -- the
engine's RMSNorm rule with ``facts.norm.weight_fp32`` and ``facts.norm.centred_copy``, so the
Architecture says ``norm="rmsnorm"`` for the activation rules and ``extra["norm_class"]`` names the module. RoPE runs in fp32 and casts q, k back
(``facts.position.rope_keeps_dtype``); ``facts.mlp.parallel_attn_mlp``: the MLP reads the attention's norm output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool, read_positive
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``CohereConfig`` defaults (``layer_norm_eps``; no head_dim key: hidden_size / heads).
COHERE_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,  # None -> num_attention_heads
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,  # build_decoder's key; Cohere's is layer_norm_eps (read below)
    "layer_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "logit_scale": 0.0625,
    "use_qk_norm": False,
}


@register_family("cohere")
def build_cohere(cfg: Mapping[str, Any]) -> Architecture:
    """Command-R as ``CohereForCausalLM``: one bias-free LayerNorm per block, parallel attention + MLP."""
    d = COHERE_DEFAULTS
    bias = read_bool(cfg, "attention_bias", d["attention_bias"])
    qk = read_bool(cfg, "use_qk_norm", d["use_qk_norm"])
    scale = cfg.get("logit_scale", d["logit_scale"])
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, int | float)):
        raise ScenarioError("model.logit_scale", f"must be a number, got {scale!r:.60}")
    arch = build_decoder(
        cfg,
        family="cohere",
        hf_class="CohereForCausalLM",
        defaults=d,
        qkv_bias=bias,
        o_bias=bias,
        layer_norms=("input_layernorm",),
        extra={
            "norm_class": "CohereLayerNorm (mean-centred, no bias, fp32)",
            "layer_norm_eps": read_positive(cfg, "layer_norm_eps", d["layer_norm_eps"]),
            "logit_scale": scale,
            "use_qk_norm": qk,
            "parallel_attn_mlp": True,
            "norm_weight_fp32": True,
            "norm_centred_copy": True,
            "rope_keeps_dtype": True,
            **({"qk_norm": "head"} if qk else {}),
        },
    )
    extra = arch.extra_with(drop=("rms_norm_eps",))
    groups = arch.params
    if qk:
        p, L, hd = "model.layers.*.self_attn.", arch.num_layers, arch.head_dim
        groups += (
            ParamGroup(name=p + "q_norm.weight", kind="norm", shape=(arch.num_heads, hd), count=L),
            ParamGroup(name=p + "k_norm.weight", kind="norm", shape=(arch.num_kv_heads, hd), count=L),
        )
    return dataclasses.replace(arch, params=groups, extra=extra)
