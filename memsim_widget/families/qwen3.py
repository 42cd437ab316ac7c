"""Qwen3 (dense) as ``Qwen3ForCausalLM`` (transformers 5.24 ``models/qwen3/modeling_qwen3.py``).

Parameter tensors, per layer ``model.layers.*.``:

- ``self_attn.q_proj.weight`` [a*d, h], ``k_proj.weight`` / ``v_proj.weight`` [kv*d, h],
  ``o_proj.weight`` [h, a*d] (each with a bias when ``attention_bias``, o_proj included);
- ``self_attn.q_norm.weight`` / ``self_attn.k_norm.weight`` [d]: RMSNorm over each head's d features,
  one weight shared by all heads (applied to the q_proj / k_proj outputs viewed as [.., heads, d]);
- ``mlp.gate_proj.weight`` / ``mlp.up_proj.weight`` [I, h], ``mlp.down_proj.weight`` [h, I];
- ``input_layernorm.weight`` / ``post_attention_layernorm.weight`` [h];

plus ``model.embed_tokens.weight`` [V, h], ``model.norm.weight`` [h] and ``lm_head.weight`` [V, h] unless
``tie_word_embeddings``. The q/k norms are ``facts.norm.qk == "head"`` (engine/activations/norms.py: each
saves its fp32 input and one rsqrt per head and token, plus the normalised tensor when its weight trains).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.layers import qk_norm_params
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``Qwen3Config`` defaults (head_dim is its own key, 128; rope_theta the library's 10000).
QWEN3_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,  # None -> num_attention_heads
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "attention_dropout": 0.0,
}


@register_family("qwen3")
def build_qwen3(cfg: Mapping[str, Any]) -> Architecture:
    """Qwen3 as ``Qwen3ForCausalLM``: llama layout, no q/k/v bias by default, per-head q/k RMSNorm."""
    d = QWEN3_DEFAULTS
    bias = read_bool(cfg, "attention_bias", d["attention_bias"])
    use_window = read_bool(cfg, "use_sliding_window", d["use_sliding_window"])
    arch = build_decoder(
        cfg,
        family="qwen3",
        hf_class="Qwen3ForCausalLM",
        defaults=d,
        qkv_bias=bias,
        o_bias=bias,
        extra={
            "qk_norm": "head",
            "coverage": ("compiled", "liger"),  # compiled: traced; apply_liger_kernel_to_qwen3
            "use_sliding_window": use_window,
            "sliding_window": cfg.get("sliding_window", d["sliding_window"]) if use_window else None,
            "max_window_layers": cfg.get("max_window_layers", d["max_window_layers"]),
        },
    )
    return dataclasses.replace(arch, params=arch.params + tuple(qk_norm_params(arch, arch.head_dim)))
