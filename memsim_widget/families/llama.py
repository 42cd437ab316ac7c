"""Llama 2 / 3 as ``LlamaForCausalLM`` (transformers 5.24 ``models/llama/modeling_llama.py``): the shared
RMSNorm + RoPE decoder (``architecture/decoder.py``) with optional attention and MLP biases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``LlamaConfig`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
LLAMA_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,  # None -> num_attention_heads
    "head_dim": None,  # None -> hidden_size // num_attention_heads
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
}


@register_family("llama")
def build_llama(cfg: Mapping[str, Any]) -> Architecture:
    """Llama 2/3 as ``LlamaForCausalLM``: optional attention/MLP biases, lm_head unless tied."""
    attn_bias = read_bool(cfg, "attention_bias", LLAMA_DEFAULTS["attention_bias"])
    return build_decoder(
        cfg,
        family="llama",
        hf_class="LlamaForCausalLM",
        defaults=LLAMA_DEFAULTS,
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        mlp_bias=read_bool(cfg, "mlp_bias", LLAMA_DEFAULTS["mlp_bias"]),
        extra={"coverage": ("compiled", "litgpt", "liger")},  # traced: compile, litgpt and Liger rules
    )
