"""OLMo 2 as ``Olmo2ForCausalLM`` (transformers 5.24 ``models/olmo2/modeling_olmo2.py``).

Each block normalises *after* attention and after the MLP, never before: ``h = x + post_attention_layernorm(
attn(x))``, ``out = h + post_feedforward_layernorm(mlp(h))``. Parameter tensors, per layer ``model.layers.*.``:

- ``self_attn.q_proj.weight`` [a*d, h], ``k_proj.weight`` / ``v_proj.weight`` [kv*d, h], ``o_proj.weight``
  [h, a*d] (each with a bias when ``attention_bias``);
- ``self_attn.q_norm.weight`` [a*d] and ``self_attn.k_norm.weight`` [kv*d]: RMSNorm over the whole projection
  (not per head, unlike Qwen3);
- ``mlp.gate_proj.weight`` / ``mlp.up_proj.weight`` [I, h], ``mlp.down_proj.weight`` [h, I];
- ``post_attention_layernorm.weight`` / ``post_feedforward_layernorm.weight`` [h];

plus ``model.embed_tokens.weight`` [V, h], ``model.norm.weight`` [h] and ``lm_head.weight`` [V, h] unless tied.
Olmo2RMSNorm multiplies by its weight in fp32 before casting back (``(w * x).to(dtype)``), so a trained norm
saves an fp32 normalised tensor (``facts.norm.weight_fp32``); the engine reads ``facts.norm.qk == "full"``
``facts.norm.post_norms`` (the block's Linears read the residual stream, not a norm output) and
``facts.position.rope_keeps_dtype`` (its RoPE casts q and k back: no fp32 k in the KV cache under autocast).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family

#: transformers 5.24 ``Olmo2Config`` defaults (no head_dim key: hidden_size / heads; rope_theta 10000).
OLMO2_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,  # None -> num_attention_heads
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
}


@register_family("olmo2")
def build_olmo2(cfg: Mapping[str, Any]) -> Architecture:
    """OLMo 2 as ``Olmo2ForCausalLM``: post-norms only, q/k RMSNorm over the full projection."""
    d = OLMO2_DEFAULTS
    bias = read_bool(cfg, "attention_bias", d["attention_bias"])
    arch = build_decoder(
        cfg,
        family="olmo2",
        hf_class="Olmo2ForCausalLM",
        defaults=d,
        qkv_bias=bias,
        o_bias=bias,
        layer_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
        extra={
            "qk_norm": "full",
            "post_norms": True,
            "norm_weight_fp32": True,
            "rope_keeps_dtype": True,
            "coverage": ("compiled",),
            "compiled_recipes": (("bf16", "full"),),  # autocast +5.0%, LoRA -1.1% against the rule (traced)
        },
    )
    L, p = arch.num_layers, "model.layers.*.self_attn."
    qk = (
        ParamGroup(name=p + "q_norm.weight", kind="norm", shape=(arch.num_heads * arch.head_dim,), count=L),
        ParamGroup(
            name=p + "k_norm.weight", kind="norm", shape=(arch.num_kv_heads * arch.head_dim,), count=L
        ),
    )
    return dataclasses.replace(arch, params=arch.params + qk)
