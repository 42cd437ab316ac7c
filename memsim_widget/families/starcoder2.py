"""StarCoder2 as ``Starcoder2ForCausalLM`` (transformers 5.24 ``models/starcoder2/modeling_starcoder2.py``).

A pre-norm RoPE decoder with LayerNorms (weight and bias) and a plain GELU MLP. Parameter tensors, per layer
``model.layers.*.``:

- ``self_attn.q_proj`` [a*d, h], ``k_proj`` / ``v_proj`` [kv*d, h], ``o_proj`` [h, a*d]: weights, and biases
  when ``use_bias`` (default true);
- ``mlp.c_fc`` [I, h] and ``mlp.c_proj`` [h, I]: weights (+ biases with ``use_bias``);
- ``input_layernorm`` / ``post_attention_layernorm``: nn.LayerNorm weight and bias [h];

plus ``model.embed_tokens.weight`` [V, h], ``model.norm`` weight and bias [h] and ``lm_head.weight`` [V, h]
unless ``tie_word_embeddings`` (default true). ``gelu_pytorch_tanh`` is one fused op (``F.gelu(approximate=
"tanh")``) that saves only its input, as the exact GELU does, so the engine's activation is ``gelu`` (GPT-2's
``gelu_new`` is a chain of pointwise ops and stays ``gelu_tanh``). ``residual_dropout`` drops the attention and
MLP outputs (two masks per layer), ``embedding_dropout`` the embeddings.
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
    linear_params,
    norm_params,
)
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family

#: transformers 5.24 ``Starcoder2Config`` defaults (rope_theta the library's 10000).
STARCODER2_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 2,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 4096,
    "norm_epsilon": 1e-5,
    "rope_theta": 10000.0,
    "sliding_window": None,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
    "use_bias": True,
    "tie_word_embeddings": True,
}

#: HF activations that are one op saving only its input (the engine's "gelu" rule).
_ONE_OP_GELU = ("gelu", "gelu_pytorch_tanh")


@register_family("starcoder2")
def build_starcoder2(cfg: Mapping[str, Any]) -> Architecture:
    """StarCoder2 as ``Starcoder2ForCausalLM``: LayerNorms with bias, biased Linears, GELU c_fc/c_proj MLP."""
    d = STARCODER2_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    inter = read_int(cfg, "intermediate_size")
    vocab = read_int(cfg, "vocab_size")
    kv = read_kv_heads(cfg, heads, d["num_key_value_heads"])
    hd = read_head_dim(cfg, h, heads)
    bias = read_bool(cfg, "use_bias", d["use_bias"])
    tied = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    act = read_str(cfg, "hidden_act", d["hidden_act"])
    mlp_act = "gelu" if act in _ONE_OP_GELU else activation_label("hidden_act", act, gated=False)

    p = "model.layers.*."
    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += norm_params(p, ("input_layernorm",), h, L, bias=True, stack="decoder")
    groups += attention_params(p, L, h, heads, kv, hd, bias=bias)
    groups += norm_params(p, ("post_attention_layernorm",), h, L, bias=True, stack="decoder")
    groups += linear_params(
        p + "mlp.c_fc", "mlp", inter, h, bias=bias, parallel="col", module="c_fc", count=L
    )
    groups += linear_params(
        p + "mlp.c_proj", "mlp", h, inter, bias=bias, parallel="row", module="c_proj", count=L
    )
    groups += final_norm_and_head("model.", "norm", h, vocab, tied=tied, bias=True)
    return Architecture(
        family="starcoder2",
        model_type=str(cfg.get("model_type", "starcoder2")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=hd,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=mlp_act,
        norm="layernorm",
        position="rope",
        attention_dropout=read_probability(cfg, "attention_dropout", d["attention_dropout"]),
        hidden_dropout=read_probability(cfg, "residual_dropout", d["residual_dropout"]),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "Starcoder2ForCausalLM",
            "norms_per_layer": 2,
            "hidden_act": act,
            "max_position_embeddings": read_int(cfg, "max_position_embeddings", d["max_position_embeddings"]),
            "rope_theta": read_rope_theta(cfg, d["rope_theta"]),
            "norm_epsilon": read_positive(cfg, "norm_epsilon", d["norm_epsilon"]),
            "sliding_window": cfg.get("sliding_window", d["sliding_window"]),
            "embedding_dropout": read_probability(cfg, "embedding_dropout", d["embedding_dropout"]),
            "use_bias": bias,
        },
    )
