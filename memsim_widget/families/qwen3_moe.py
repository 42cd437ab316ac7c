"""Qwen3-MoE (``model_type: qwen3_moe``) as transformers 5.24's ``Qwen3MoeForCausalLM``.

Parameter tensors (``model.layers.*.`` per layer):

- ``model.embed_tokens.weight`` [V, h]; ``lm_head.weight`` [V, h] unless ``tie_word_embeddings``
- ``self_attn.q_proj`` [a d, h], ``k_proj`` / ``v_proj`` [kv d, h], ``o_proj`` [h, a d] (each + bias when
  ``attention_bias``); ``self_attn.q_norm`` / ``k_norm`` [d] (RMSNorm over each head)
- MoE layers (``(i + 1) % decoder_sparse_step == 0`` and ``i`` not in ``mlp_only_layers``, when num_experts > 0):
  ``mlp.gate.weight`` [E, h] (the router), ``mlp.experts.gate_up_proj`` [E, 2 I_moe, h] and
  ``mlp.experts.down_proj`` [E, h, I_moe]
- the other layers: ``mlp.gate_proj`` / ``up_proj`` [I, h], ``mlp.down_proj`` [h, I]
- ``input_layernorm`` / ``post_attention_layernorm`` [h]; ``model.norm.weight`` [h]

The router takes a softmax over all E experts in fp32 and keeps the top k (renormalised when
``norm_topk_prob``); the experts run token by token groups (``Qwen3MoeExperts.forward``'s loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_head_dim,
    read_int,
    read_kv_heads,
    read_positive,
    read_probability,
    read_rope_theta,
    read_str,
)
from memsim_widget.architecture.layers import (
    activation_label,
    attention_params,
    embedding_param,
    final_norm_and_head,
    norm_params,
)
from memsim_widget.architecture.moe import (
    check_top_k,
    dense_mlp,
    layer_indices,
    mlp_parts,
    routed_experts,
    router,
)
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family

#: Qwen3MoeConfig defaults (transformers 5.24.0, configuration_qwen3_moe.py).
QWEN3_MOE_DEFAULTS: dict[str, Any] = {
    "intermediate_size": 6144,
    "num_key_value_heads": 4,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "attention_dropout": 0.0,
    "decoder_sparse_step": 1,
    "moe_intermediate_size": 768,
    "num_experts_per_tok": 8,
    "num_experts": 128,
    "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001,
}


@register_family("qwen3_moe")
def build_qwen3_moe(cfg: Mapping[str, Any]) -> Architecture:
    """Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B) as ``Qwen3MoeForCausalLM``; see the module docstring."""
    d_ = QWEN3_MOE_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    vocab = read_int(cfg, "vocab_size")
    kv = read_kv_heads(cfg, heads, d_["num_key_value_heads"])
    d = read_head_dim(cfg, h, heads)
    tied = read_bool(cfg, "tie_word_embeddings", d_["tie_word_embeddings"])
    act = read_str(cfg, "hidden_act", d_["hidden_act"])
    bias = read_bool(cfg, "attention_bias", d_["attention_bias"])
    E = read_int(cfg, "num_experts", d_["num_experts"], minimum=0, aliases=("num_local_experts",))
    top_k = read_int(cfg, "num_experts_per_tok", d_["num_experts_per_tok"])
    check_top_k(top_k, E)
    step = read_int(cfg, "decoder_sparse_step", d_["decoder_sparse_step"])
    i_moe = read_int(cfg, "moe_intermediate_size", d_["moe_intermediate_size"])
    dense_only = set(layer_indices(cfg, "mlp_only_layers", L))
    moe_flags = [i not in dense_only and E > 0 and (i + 1) % step == 0 for i in range(L)]
    n_moe = sum(moe_flags)
    n_dense = L - n_moe
    inter = read_int(cfg, "intermediate_size", d_["intermediate_size"])

    p = "model.layers.*."
    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += attention_params(p, L, h, heads, kv, d, bias=bias)
    groups += norm_params(p + "self_attn.", ("q_norm", "k_norm"), d, L, bias=False, stack="decoder")
    groups += router(p + "mlp.gate", n_moe, E, h)
    groups += routed_experts(p + "mlp.experts.", n_moe, E, i_moe, h)
    groups += dense_mlp(p + "mlp.", n_dense, inter, h)
    groups += norm_params(
        p, ("input_layernorm", "post_attention_layernorm"), h, L, bias=False, stack="decoder"
    )
    groups += final_norm_and_head("model.", "norm", h, vocab, tied=tied, bias=False)

    use_window = read_bool(cfg, "use_sliding_window", d_["use_sliding_window"])
    return Architecture(
        family="qwen3_moe",
        model_type=str(cfg.get("model_type", "qwen3_moe")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=i_moe if n_moe else inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_act", act, gated=True),
        norm="rmsnorm",
        position="rope",
        num_experts=E if n_moe else 0,
        experts_per_token=top_k if n_moe else 0,
        attention_dropout=read_probability(cfg, "attention_dropout", d_["attention_dropout"]),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "Qwen3MoeForCausalLM",
            "max_position_embeddings": read_int(
                cfg, "max_position_embeddings", d_["max_position_embeddings"]
            ),
            "rope_theta": read_rope_theta(cfg, d_["rope_theta"]),
            "rms_norm_eps": read_positive(cfg, "rms_norm_eps", d_["rms_norm_eps"]),
            "norms_per_layer": 2,
            "qk_norm": "head",  # q_norm / k_norm: one RMSNorm per head over d (engine/activations/norms.py)
            "mlp_parts": mlp_parts(n_dense, inter, n_moe, top_k, i_moe, E),
            "moe_layers": n_moe,
            # transformers 4's expert Linears, fused in 5 (architecture/facts.LimitFacts)
            "lora_expert_targets": ("gate_proj", "up_proj", "down_proj", "gate") if n_moe else (),
            "dense_intermediate_size": inter,
            "moe_intermediate_size": i_moe,
            "norm_topk_prob": read_bool(cfg, "norm_topk_prob", d_["norm_topk_prob"]),
            "decoder_sparse_step": step,
            "mlp_only_layers": sorted(dense_only),
            "sliding_window": cfg.get("sliding_window", d_["sliding_window"]) if use_window else None,
            "router_aux_loss_coef": cfg.get("router_aux_loss_coef", d_["router_aux_loss_coef"]),
        },
    )
