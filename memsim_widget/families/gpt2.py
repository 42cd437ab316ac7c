"""GPT-2 as ``GPT2LMHeadModel`` (transformers 5.24 ``models/gpt2/modeling_gpt2.py``): learned positions, Conv1D
weights stored [in, out], tied lm_head.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool, read_int, read_probability, read_str
from memsim_widget.architecture.layers import (
    activation_label,
    embedding_param,
    final_norm_and_head,
    linear_params,
    norm_params,
)
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``GPT2Config`` defaults (structural keys stay required).
GPT2_DEFAULTS: dict[str, Any] = {
    "n_positions": 1024,
    "n_inner": None,  # None -> 4 * n_embd
    "activation_function": "gelu_new",
    "resid_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "attn_pdrop": 0.1,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
    "add_cross_attention": False,
}


@register_family("gpt2")
def build_gpt2(cfg: Mapping[str, Any]) -> Architecture:
    """GPT-2 as ``GPT2LMHeadModel``: learned positions, Conv1D weights stored [in, out], tied lm_head.

    Accepts GPT-2's own keys (n_embd, n_layer, n_head) or the generic aliases (hidden_size, ...).
    """
    d = GPT2_DEFAULTS
    h = read_int(cfg, "n_embd", aliases=("hidden_size",))
    L = read_int(cfg, "n_layer", aliases=("num_hidden_layers",))
    heads = read_int(cfg, "n_head", aliases=("num_attention_heads",))
    vocab = read_int(cfg, "vocab_size")
    n_pos = read_int(cfg, "n_positions", d["n_positions"], aliases=("max_position_embeddings",))
    inner = read_int(cfg, "n_inner", 4 * h)
    tied = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    if h % heads:
        raise ScenarioError("model.n_head", f"n_embd {h} is not divisible by n_head {heads}")
    if read_bool(cfg, "add_cross_attention", d["add_cross_attention"]):
        raise ScenarioError("model.add_cross_attention", "GPT-2 with cross-attention is not supported")
    p = "transformer.h.*."
    groups: list[ParamGroup] = [
        embedding_param("transformer.wte.weight", vocab, h),
        ParamGroup(name="transformer.wpe.weight", kind="position", shape=(n_pos, h), scope="pre"),
    ]
    groups += norm_params(p, ("ln_1",), h, L, bias=True, stack="decoder")
    groups += linear_params(
        p + "attn.c_attn",
        "attention",
        3 * h,
        h,
        bias=True,
        parallel="col",
        module="c_attn",
        count=L,
        conv1d=True,
    )
    groups += linear_params(
        p + "attn.c_proj", "attention", h, h, bias=True, parallel="row", module="c_proj", count=L, conv1d=True
    )
    groups += norm_params(p, ("ln_2",), h, L, bias=True, stack="decoder")
    groups += linear_params(
        p + "mlp.c_fc", "mlp", inner, h, bias=True, parallel="col", module="c_fc", count=L, conv1d=True
    )
    groups += linear_params(
        p + "mlp.c_proj", "mlp", h, inner, bias=True, parallel="row", module="c_proj", count=L, conv1d=True
    )
    groups += final_norm_and_head("transformer.", "ln_f", h, vocab, tied=tied, bias=True)
    act = read_str(cfg, "activation_function", d["activation_function"])
    return Architecture(
        family="gpt2",
        model_type=str(cfg.get("model_type", "gpt2")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=h // heads,
        intermediate_size=inner,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("activation_function", act, gated=False),
        norm="layernorm",
        position="learned",
        attention_dropout=read_probability(cfg, "attn_pdrop", d["attn_pdrop"]),
        hidden_dropout=read_probability(cfg, "resid_pdrop", d["resid_pdrop"]),
        decoder_layers=L,
        causal=True,
        max_seq_len=n_pos,
        extra={
            "hf_class": "GPT2LMHeadModel",
            "n_positions": n_pos,
            "max_position_embeddings": n_pos,
            "embd_pdrop": read_probability(cfg, "embd_pdrop", d["embd_pdrop"]),
            "conv1d": True,
            "norms_per_layer": 2,
            "softmax_in_compute_dtype": True,
        },
    )
