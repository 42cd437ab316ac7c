"""Gemma 1 as ``GemmaForCausalLM`` (transformers 5.24 ``models/gemma/modeling_gemma.py``): the llama layout with
GeGLU, head_dim 256 and tied embeddings by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``GemmaConfig`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
GEMMA_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 16,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
}


@register_family("gemma")
def build_gemma(cfg: Mapping[str, Any]) -> Architecture:
    """Gemma 1 as ``GemmaForCausalLM``: GeGLU, head_dim 256 by default, embeddings tied by default."""
    attn_bias = read_bool(cfg, "attention_bias", GEMMA_DEFAULTS["attention_bias"])
    return build_decoder(
        cfg,
        family="gemma",
        hf_class="GemmaForCausalLM",
        defaults=GEMMA_DEFAULTS,
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        extra={
            "embedding_scale": "sqrt(hidden_size)",
            "norm_one_plus_weight": True,
            "coverage": ("compiled",),
            "compiled_recipes": (
                ("bf16", "full"),
                ("bf16", "lora"),
            ),  # autocast: +0.5% over the rule (traced)
        },
    )
