"""Phi-3 as ``Phi3ForCausalLM`` (transformers 5.24 ``models/phi3/modeling_phi3.py``): the llama layout with fused
``qkv_proj`` and ``gate_up_proj`` Linears.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_probability
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``Phi3Config`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
PHI3_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "sliding_window": None,
}


@register_family("phi3")
def build_phi3(cfg: Mapping[str, Any]) -> Architecture:
    """Phi-3 as ``Phi3ForCausalLM``: fused ``qkv_proj`` and ``gate_up_proj`` Linears, no biases."""
    d = PHI3_DEFAULTS
    return build_decoder(
        cfg,
        family="phi3",
        hf_class="Phi3ForCausalLM",
        defaults=d,
        fused=True,
        extra={
            "sliding_window": cfg.get("sliding_window", d["sliding_window"]),
            "embd_pdrop": read_probability(cfg, "embd_pdrop", d["embd_pdrop"]),
            "original_max_position_embeddings": cfg.get(
                "original_max_position_embeddings", d["original_max_position_embeddings"]
            ),
        },
    )
