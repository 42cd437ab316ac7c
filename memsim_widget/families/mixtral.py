"""Mixtral as ``MixtralForCausalLM`` (transformers 5.24 ``models/mixtral/modeling_mixtral.py``): the llama
attention with a per-layer router and SwiGLU experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``MixtralConfig`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
MIXTRAL_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_theta": 1e6,
    "sliding_window": None,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 2,
    "num_local_experts": 8,
    "router_aux_loss_coef": 0.001,
}


@register_family("mixtral")
def build_mixtral(cfg: Mapping[str, Any]) -> Architecture:
    """Mixtral as ``MixtralForCausalLM``: per-layer router [E, h] and E SwiGLU experts, listed per expert
    (``count = layers * experts``) as transformers 5 fuses them: ``mlp.experts.gate_up_proj`` [E, 2I, h] (the
    checkpoint's w1 and w3) and ``mlp.experts.down_proj`` [E, h, I] (w2); a rank holds one fused tensor of each
    per layer (``engine/states/budget.fused_experts``).
    """
    return build_decoder(
        cfg,
        family="mixtral",
        hf_class="MixtralForCausalLM",
        defaults=MIXTRAL_DEFAULTS,
        moe=True,
        extra={
            "sliding_window": cfg.get("sliding_window", MIXTRAL_DEFAULTS["sliding_window"]),
            "router_aux_loss_coef": cfg.get("router_aux_loss_coef", MIXTRAL_DEFAULTS["router_aux_loss_coef"]),
            # the checkpoint's expert Linears, fused in transformers 5 (architecture/facts.LimitFacts)
            "lora_expert_targets": ("w1", "w2", "w3", "gate"),
        },
    )
