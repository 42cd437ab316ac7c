"""GPT-OSS (``model_type: gpt_oss``) as transformers 5.24's ``GptOssForCausalLM``, in bf16.

Parameter tensors (``model.layers.*.`` per layer):

- ``model.embed_tokens.weight`` [V, h]; ``lm_head.weight`` [V, h] unless ``tie_word_embeddings``;
  ``model.norm.weight`` [h]
- ``self_attn.q_proj`` [a d, h], ``k_proj`` / ``v_proj`` [kv d, h], ``o_proj`` [h, a d], each with a bias when
  ``attention_bias`` (default true); ``self_attn.sinks`` [a] (one learned attention-sink logit per head)
- ``mlp.router.weight`` [E, h] and ``mlp.router.bias`` [E]; ``mlp.experts.gate_up_proj`` [E, h, 2 I] +
  ``gate_up_proj_bias`` [E, 2 I], ``mlp.experts.down_proj`` [E, I, h] + ``down_proj_bias`` [E, h] (every
  layer is an MoE layer, no shared expert)
- ``input_layernorm`` / ``post_attention_layernorm`` [h]

The published checkpoints store the experts in MXFP4; fine-tuning dequantises them (``Mxfp4Config(dequantize=
True)``), so the count is the bf16 model transformers builds. Forward facts: the router takes the top-k logits
and a softmax over those k only; the experts interleave gate and up columns and apply a clamped SwiGLU
(``(up + 1) * gate * sigmoid(alpha * gate)``); attention alternates sliding-window and full layers
(``layer_types``) and appends each head's sink logit to the softmax. transformers has no SDPA path for it
(``_supports_sdpa = False``): eager attention saves the softmax over s + 1 columns in the compute dtype; the
engine's ``sdpa`` setting stands for the flash kernel with sinks used on GPUs (it saves what SDPA's flash
kernel saves), which cannot be traced on CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    layer_kinds,
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
from memsim_widget.architecture.moe import check_top_k, routed_experts, router
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family

#: GptOssConfig defaults (transformers 5.24.0, configuration_gpt_oss.py).
GPT_OSS_DEFAULTS: dict[str, Any] = {
    "num_local_experts": 128,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 4,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "router_aux_loss_coef": 0.001,
    "attention_bias": True,
    "rope_theta": 150000.0,
}
#: GptOssConfig.layer_types values (sliding layers attend within sliding_window tokens).
LAYER_TYPES = ("sliding_attention", "full_attention")


def _layer_types(cfg: Mapping[str, Any], L: int) -> list[str]:
    """Per-layer attention kind: ``layer_types``, else sliding on even layers and full on odd ones (HF)."""
    return layer_kinds(cfg, L, LAYER_TYPES, lambda i: LAYER_TYPES[(i + 1) % 2 == 0], longer_ok=True)


@register_family("gpt_oss")
def build_gpt_oss(cfg: Mapping[str, Any]) -> Architecture:
    """gpt-oss-20b / gpt-oss-120b as ``GptOssForCausalLM`` with bf16 experts; see the module docstring."""
    d_ = GPT_OSS_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    vocab = read_int(cfg, "vocab_size")
    kv = read_kv_heads(cfg, heads, d_["num_key_value_heads"])
    d = read_head_dim(cfg, h, heads, d_["head_dim"])  # 64 unless given (not hidden_size / heads)
    tied = read_bool(cfg, "tie_word_embeddings", d_["tie_word_embeddings"])
    act = read_str(cfg, "hidden_act", d_["hidden_act"])
    bias = read_bool(cfg, "attention_bias", d_["attention_bias"])
    E = read_int(cfg, "num_local_experts", d_["num_local_experts"], aliases=("num_experts",))
    top_k = read_int(cfg, "num_experts_per_tok", d_["num_experts_per_tok"])
    check_top_k(top_k, E, of="local experts")
    inter = read_int(cfg, "intermediate_size", d_["intermediate_size"])
    types = _layer_types(cfg, L)
    window = cfg.get("sliding_window", d_["sliding_window"])
    if window is not None:
        window = read_int(cfg, "sliding_window", d_["sliding_window"])

    p = "model.layers.*."
    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += attention_params(p, L, h, heads, kv, d, bias=bias)
    # one sink logit per head, split with the heads under tensor parallelism
    groups.append(ParamGroup(name=p + "self_attn.sinks", kind="attention", shape=(heads,), count=L, tp_dim=0))
    groups += router(p + "mlp.router", L, E, h, bias=True)
    groups += routed_experts(p + "mlp.experts.", L, E, inter, h, bias=True, transposed=True)
    groups += norm_params(
        p, ("input_layernorm", "post_attention_layernorm"), h, L, bias=False, stack="decoder"
    )
    groups += final_norm_and_head("model.", "norm", h, vocab, tied=tied, bias=False)

    parts = (
        {"name": "routed experts", "layers": L, "rows": top_k, "width": inter, "experts": E,
         "router": "topk-softmax", "activation": "clamped-swiglu"},
    )  # fmt: skip
    return Architecture(
        family="gpt_oss",
        model_type=str(cfg.get("model_type", "gpt_oss")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_act", act, gated=True),
        norm="rmsnorm",
        position="rope",
        num_experts=E,
        experts_per_token=top_k,
        attention_dropout=read_probability(cfg, "attention_dropout", d_["attention_dropout"]),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "GptOssForCausalLM",
            "max_position_embeddings": read_int(
                cfg, "max_position_embeddings", d_["max_position_embeddings"]
            ),
            "rope_theta": read_rope_theta(cfg, d_["rope_theta"]),
            "rope_scaling": cfg.get("rope_scaling") or cfg.get("rope_parameters"),
            "rms_norm_eps": read_positive(cfg, "rms_norm_eps", d_["rms_norm_eps"]),
            "norms_per_layer": 2,
            "norm_weight_fp32": True,  # GptOssRMSNorm multiplies its weight by the fp32 normalised tensor
            "mlp_parts": parts,
            "moe_layers": L,
            "moe_intermediate_size": inter,
            "attention_sinks": True,
            "eager_softmax_dtype": "compute",  # softmax over s + 1 columns (the sink) in the compute dtype
            "layer_types": types,
            "sliding_window": window,
            "sliding_layers": types.count("sliding_attention"),
            "swiglu_alpha": cfg.get("swiglu_alpha", d_["swiglu_alpha"]),
            "swiglu_limit": cfg.get("swiglu_limit", d_["swiglu_limit"]),
            "router_aux_loss_coef": cfg.get("router_aux_loss_coef", d_["router_aux_loss_coef"]),
            "experts_dtype_note": "bf16 (the checkpoints' MXFP4 experts dequantised for training)",
        },
    )
