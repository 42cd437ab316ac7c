"""GLM-4 (0414 series) as ``Glm4ForCausalLM`` (transformers 5.24 ``models/glm4/modeling_glm4.py``).

Each block is ``h = x + post_self_attn_layernorm(attn(input_layernorm(x)))``, ``out = h +
post_mlp_layernorm(mlp(post_attention_layernorm(h)))``. Parameter tensors, per layer ``model.layers.*.``:

- ``self_attn.q_proj.weight`` [a*d, h] + ``.bias`` [a*d], ``k_proj`` / ``v_proj`` [kv*d, h] + biases [kv*d]
  (``attention_bias``, default true), ``self_attn.o_proj.weight`` [h, a*d] (never a bias);
- ``mlp.gate_up_proj.weight`` [2I, h] (gate and up fused, chunked in forward), ``mlp.down_proj.weight`` [h, I];
- ``input_layernorm``, ``post_self_attn_layernorm``, ``post_attention_layernorm``, ``post_mlp_layernorm``
  weights [h];

plus ``model.embed_tokens.weight`` [V, h], ``model.norm.weight`` [h] and ``lm_head.weight`` [V, h] unless tied.
RoPE covers the first ``partial_rotary_factor x d`` channels (default 0.5; q and k are rebuilt with torch.cat,
so SDPA's output is copied before o_proj: ``facts.attention.sdpa_output_copy``). The two post-norms read a 16-bit
projection output, so under autocast their normalised tensors are 16-bit (``facts.norm.post_norms_16bit``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool, read_partial_rope
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.layers import linear_params
from memsim_widget.architecture.types import Architecture, register_family

#: transformers 5.24 ``Glm4Config`` defaults (its own head_dim 128, 2 KV heads, rope_theta the library's 10000,
#: partial_rotary_factor 0.5 set in ``__post_init__``).
GLM4_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1.5625e-07,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": True,
    "attention_dropout": 0.0,
    "partial_rotary_factor": 0.5,
}


@register_family("glm4")
def build_glm4(cfg: Mapping[str, Any]) -> Architecture:
    """GLM-4 as ``Glm4ForCausalLM``: q/k/v biases, fused gate_up_proj, four norms per block, partial RoPE."""
    d = GLM4_DEFAULTS
    pct, base = read_partial_rope(
        cfg, d["partial_rotary_factor"], d["rope_theta"], "partial_rotary_factor", "rope_theta"
    )
    arch = build_decoder(
        cfg,
        family="glm4",
        hf_class="Glm4ForCausalLM",
        defaults=d,
        qkv_bias=read_bool(cfg, "attention_bias", d["attention_bias"]),
        layer_norms=(
            "input_layernorm",
            "post_self_attn_layernorm",
            "post_attention_layernorm",
            "post_mlp_layernorm",
        ),
    )
    rotary = int(arch.head_dim * pct)
    # the llama MLP's gate_proj + up_proj become one gate_up_proj [2I, h] (same elements, one Linear)
    gate_up = linear_params(
        "model.layers.*.mlp.gate_up_proj", "mlp", 2 * arch.intermediate_size, arch.hidden_size,
        bias=False, parallel="col", module="gate_up_proj", count=arch.num_layers,
    )  # fmt: skip
    params = []
    for g in arch.params:
        if g.module == "gate_proj":
            params += gate_up
        elif g.module != "up_proj":
            params.append(g)
    extra = arch.extra_with(
        rope_theta=base,
        partial_rotary_factor=pct,
        rotary_dim=rotary,
        sdpa_output_copy=rotary < arch.head_dim,
        post_norms_16bit=2,
    )
    return dataclasses.replace(arch, params=tuple(params), extra=extra)
