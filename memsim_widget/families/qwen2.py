"""Qwen2 / Qwen2.5 as ``Qwen2ForCausalLM`` (transformers 5.24 ``models/qwen2/modeling_qwen2.py``): the llama
layout with q/k/v biases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``Qwen2Config`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
QWEN2_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 32,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 28,
    "attention_dropout": 0.0,
}


@register_family("qwen2")
def build_qwen2(cfg: Mapping[str, Any]) -> Architecture:
    """Qwen2/2.5 as ``Qwen2ForCausalLM``: llama layout with q/k/v biases (never on o_proj)."""
    use_window = read_bool(cfg, "use_sliding_window", QWEN2_DEFAULTS["use_sliding_window"])
    return build_decoder(
        cfg,
        family="qwen2",
        hf_class="Qwen2ForCausalLM",
        defaults=QWEN2_DEFAULTS,
        qkv_bias=True,
        extra={
            "coverage": ("compiled", "litgpt", "liger"),  # q/k/v biases change nothing these rules save
            "use_sliding_window": use_window,
            "sliding_window": cfg.get("sliding_window") if use_window else None,
            "max_window_layers": cfg.get("max_window_layers", QWEN2_DEFAULTS["max_window_layers"]),
        },
    )
