"""Mistral as ``MistralForCausalLM`` (transformers 5.24 ``models/mistral/modeling_mistral.py``): the llama layout
without biases, its sliding window recorded in ``extra``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``MistralConfig`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
MISTRAL_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "attention_dropout": 0.0,
}


@register_family("mistral")
def build_mistral(cfg: Mapping[str, Any]) -> Architecture:
    """Mistral as ``MistralForCausalLM``: llama layout without biases; sliding window in ``extra``."""
    window = cfg.get("sliding_window", MISTRAL_DEFAULTS["sliding_window"])
    return build_decoder(
        cfg,
        family="mistral",
        hf_class="MistralForCausalLM",
        defaults=MISTRAL_DEFAULTS,
        extra={"sliding_window": window, "coverage": ("compiled", "litgpt", "liger")},
    )
