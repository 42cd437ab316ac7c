"""Phi-1 / Phi-1.5 / Phi-2 as ``PhiForCausalLM`` (transformers 5.24 ``models/phi``).

Parameter tensors (L layers, h hidden, I = intermediate_size, V vocab, a heads, kv heads, d head_dim):

- ``model.embed_tokens.weight`` [V, h]
- per layer ``model.layers.*.``: ``input_layernorm`` (LayerNorm weight and bias [h]); ``self_attn.q_proj``
  [a d, h], ``k_proj`` and ``v_proj`` [kv d, h], each with a bias; ``self_attn.dense`` [h, a d] + bias [h];
  with ``qk_layernorm`` also ``self_attn.q_layernorm`` and ``k_layernorm`` (LayerNorm weight and bias
  [h / a]); ``mlp.fc1`` [I, h] + bias [I]; ``mlp.fc2`` [h, I] + bias [h]
- ``model.final_layernorm`` weight and bias [h]
- ``lm_head.weight`` [V, h] (unless ``tie_word_embeddings``) and ``lm_head.bias`` [V] (always).

One LayerNorm feeds both branches: x + attn(ln(x)) + mlp(ln(x)) (the same normalised tensor is the input of
q, k, v and fc1). Rotary embeddings cover the first ``partial_rotary_factor x d`` channels (default 0.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_head_dim,
    read_int,
    read_kv_heads,
    read_partial_rope,
    read_positive,
    read_probability,
    read_str,
)
from memsim_widget.architecture.layers import (
    activation_label,
    attention_params,
    embedding_param,
    final_norm_and_head,
    linear_params,
    norm_params,
)
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family

#: ``PhiConfig`` defaults (transformers 5.24).
_PHI_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,  # None -> num_attention_heads
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attention_dropout": 0.0,
    "hidden_act": "gelu_new",
    "max_position_embeddings": 2048,
    "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "qk_layernorm": False,
    "partial_rotary_factor": 0.5,
    "rope_theta": 10000.0,
}


@register_family("phi")
def build_phi(cfg: Mapping[str, Any]) -> Architecture:
    """Phi-1/1.5/2 as ``PhiForCausalLM`` (see the module docstring for every tensor)."""
    d = _PHI_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    inter = read_int(cfg, "intermediate_size")
    vocab = read_int(cfg, "vocab_size")
    kv = read_kv_heads(cfg, heads, d["num_key_value_heads"])
    hd = read_head_dim(cfg, h, heads)
    tied = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    qk_ln = read_bool(cfg, "qk_layernorm", d["qk_layernorm"])
    pct, base = read_partial_rope(
        cfg, d["partial_rotary_factor"], d["rope_theta"], "partial_rotary_factor", "rope_theta"
    )
    act = read_str(cfg, "hidden_act", d["hidden_act"])

    p = "model.layers.*."
    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += norm_params(p, ("input_layernorm",), h, L, bias=True, stack="decoder")
    groups += attention_params(p, L, h, heads, kv, hd, bias=True, o_name="dense")
    if qk_ln:  # transformers sizes these by hidden_size // num_attention_heads
        groups += norm_params(
            p + "self_attn.", ("q_layernorm", "k_layernorm"), h // heads, L, bias=True, stack="decoder"
        )
    groups += linear_params(p + "mlp.fc1", "mlp", inter, h, bias=True, parallel="col", module="fc1", count=L)
    groups += linear_params(p + "mlp.fc2", "mlp", h, inter, bias=True, parallel="row", module="fc2", count=L)
    groups += final_norm_and_head("model.", "final_layernorm", h, vocab, tied=tied, bias=True)
    groups.append(ParamGroup(name="lm_head.bias", kind="head", shape=(vocab,), scope="post", tp_dim=0))
    return Architecture(
        family="phi",
        model_type=str(cfg.get("model_type", "phi")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_act", act, gated=False),
        norm="layernorm",
        position="rope",
        attention_dropout=read_probability(cfg, "attention_dropout", d["attention_dropout"]),
        hidden_dropout=read_probability(cfg, "resid_pdrop", d["resid_pdrop"]),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "PhiForCausalLM",
            "norms_per_layer": 1,
            "max_position_embeddings": read_int(cfg, "max_position_embeddings", d["max_position_embeddings"]),
            "layer_norm_eps": read_positive(cfg, "layer_norm_eps", d["layer_norm_eps"]),
            "embd_pdrop": read_probability(cfg, "embd_pdrop", d["embd_pdrop"]),
            "rope_theta": base,
            "partial_rotary_factor": pct,
            "rotary_dim": int(hd * pct),
            "qk_layernorm": qk_ln,
            # activation rules (engine/activations/norms.py): q, k, v and fc1 read the one norm's output; q comes
            # out of torch.cat (partial rotary), so SDPA's output is copied for ``dense``
            "parallel_attn_mlp": True,
            "sdpa_output_copy": True,
            "attention_output_modules": ("dense",),
        },
    )
