"""Gemma 2 as ``Gemma2ForCausalLM`` (transformers 5.24 ``models/gemma2/modeling_gemma2.py``): four norms per
block, alternating sliding-window and global attention, logit softcapping, no SDPA path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``Gemma2Config`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
GEMMA2_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
}


@register_family("gemma2")
def build_gemma2(cfg: Mapping[str, Any]) -> Architecture:
    """Gemma 2 as ``Gemma2ForCausalLM``: 4 RMSNorms per layer, GeGLU, tied embeddings, logit softcapping.

    ``head_dim`` is its own key (default 256), not hidden_size / heads; layers alternate sliding-window
    (even) and global (odd) attention. transformers has no SDPA path for it (``facts.attention.sdpa`` False): it runs
    eager, which ``Architecture.attention_kernel`` makes the engine and the tracer follow.
    """
    attn_bias = read_bool(cfg, "attention_bias", GEMMA2_DEFAULTS["attention_bias"])
    d = GEMMA2_DEFAULTS
    return build_decoder(
        cfg,
        family="gemma2",
        hf_class="Gemma2ForCausalLM",
        defaults=d,
        act_key="hidden_activation",
        qkv_bias=attn_bias,
        o_bias=attn_bias,
        layer_norms=(
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        extra={
            "norm_one_plus_weight": True,
            "sliding_window": cfg.get("sliding_window", d["sliding_window"]),
            "attn_logit_softcapping": cfg.get("attn_logit_softcapping", d["attn_logit_softcapping"]),
            "final_logit_softcapping": cfg.get("final_logit_softcapping", d["final_logit_softcapping"]),
            "query_pre_attn_scalar": cfg.get("query_pre_attn_scalar", d["query_pre_attn_scalar"]),
            "layer_pattern": "sliding,global",
            "embedding_scale": "sqrt(hidden_size)",
            # Gemma2PreTrainedModel._supports_sdpa = False (SDPA cannot softcap the attention logits): transformers
            # runs it eager unless flash_attention_2 / flex_attention is asked for, and refuses "sdpa"
            "sdpa": False,
            "attention_note": "Gemma2ForCausalLM has no SDPA path in transformers (attention logit softcapping); "
            "it runs eager",
        },
    )
