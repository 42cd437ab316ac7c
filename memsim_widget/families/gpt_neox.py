"""GPT-NeoX / Pythia as ``GPTNeoXForCausalLM`` (transformers 5.24 ``models/gpt_neox``).

Parameter tensors (L layers, h hidden, I = intermediate_size, V vocab):

- ``gpt_neox.embed_in.weight`` [V, h]
- per layer ``gpt_neox.layers.*.``: ``input_layernorm`` and ``post_attention_layernorm`` (LayerNorm weight and
  bias [h]); ``attention.query_key_value`` [3h, h] (+ bias [3h] when ``attention_bias``, default true);
  ``attention.dense`` [h, h] (+ bias [h] likewise); ``mlp.dense_h_to_4h`` [I, h] + bias [I];
  ``mlp.dense_4h_to_h`` [h, I] + bias [h] (the MLP Linears always carry biases)
- ``gpt_neox.final_layer_norm`` weight and bias [h]
- ``lm_head.weight`` [V, h] (the checkpoints' ``embed_out``), untied unless ``tie_word_embeddings``.

The fused ``query_key_value`` output is viewed per head as [q | k | v] slices of ``3 x head_dim``; rotary
embeddings cover the first ``partial_rotary_factor x head_dim`` channels (``rotary_pct``, default 0.25).
``use_parallel_residual`` (default true) feeds both norms from the layer input: x + attn(ln1(x)) + mlp(ln2(x)).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_int,
    read_partial_rope,
    read_positive,
    read_probability,
    read_str,
)
from memsim_widget.architecture.layers import (
    activation_label,
    embedding_param,
    final_norm_and_head,
    linear_params,
    norm_params,
)
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError

#: ``GPTNeoXConfig`` defaults (transformers 5.24).
_GPT_NEOX_DEFAULTS: dict[str, Any] = {
    "hidden_act": "gelu",
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "max_position_embeddings": 2048,
    "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "use_parallel_residual": True,
    "attention_bias": True,
    "rotary_pct": 0.25,
    "rotary_emb_base": 10000.0,
}


@register_family("gpt_neox")
def build_gpt_neox(cfg: Mapping[str, Any]) -> Architecture:
    """GPT-NeoX / Pythia as ``GPTNeoXForCausalLM`` (see the module docstring for every tensor)."""
    d = _GPT_NEOX_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    inter = read_int(cfg, "intermediate_size")
    vocab = read_int(cfg, "vocab_size")
    if h % heads:
        raise ScenarioError("model.num_attention_heads", f"hidden_size {h} is not divisible by {heads} heads")
    hd = h // heads
    bias = read_bool(cfg, "attention_bias", d["attention_bias"])
    tied = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    parallel = read_bool(cfg, "use_parallel_residual", d["use_parallel_residual"])
    pct, base = read_partial_rope(cfg, d["rotary_pct"], d["rotary_emb_base"])
    rotary = int(hd * pct)
    act = read_str(cfg, "hidden_act", d["hidden_act"])

    p = "gpt_neox.layers.*."
    groups: list[ParamGroup] = [embedding_param("gpt_neox.embed_in.weight", vocab, h)]
    groups += norm_params(p, ("input_layernorm",), h, L, bias=True, stack="decoder")
    groups += linear_params(
        p + "attention.query_key_value", "attention", 3 * h, h,
        bias=bias, parallel="col", module="query_key_value", count=L,
    )  # fmt: skip
    groups += linear_params(
        p + "attention.dense", "attention", h, h, bias=bias, parallel="row", module="dense", count=L
    )
    groups += norm_params(p, ("post_attention_layernorm",), h, L, bias=True, stack="decoder")
    groups += linear_params(
        p + "mlp.dense_h_to_4h", "mlp", inter, h, bias=True, parallel="col", module="dense_h_to_4h", count=L
    )
    groups += linear_params(
        p + "mlp.dense_4h_to_h", "mlp", h, inter, bias=True, parallel="row", module="dense_4h_to_h", count=L
    )
    groups += final_norm_and_head("gpt_neox.", "final_layer_norm", h, vocab, tied=tied, bias=True)
    return Architecture(
        family="gpt_neox",
        model_type=str(cfg.get("model_type", "gpt_neox")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=hd,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_act", act, gated=False),
        norm="layernorm",
        position="rope",
        attention_dropout=read_probability(cfg, "attention_dropout", d["attention_dropout"]),
        hidden_dropout=read_probability(cfg, "hidden_dropout", d["hidden_dropout"]),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "GPTNeoXForCausalLM",
            "norms_per_layer": 2,
            "max_position_embeddings": read_int(cfg, "max_position_embeddings", d["max_position_embeddings"]),
            "layer_norm_eps": read_positive(cfg, "layer_norm_eps", d["layer_norm_eps"]),
            "rope_theta": base,
            "partial_rotary_factor": pct,
            "rotary_dim": rotary,
            "parallel_residual": parallel,
            # activation rules (engine/activations/norms.py): both norms read the layer input under the parallel
            # residual; q comes out of torch.cat (partial rotary), so SDPA's output is copied for ``dense``
            "norm_inputs": 1 if parallel else 2,
            "sdpa_output_copy": True,
            "fused_qkv_kept_without_cache": True,  # v is a chunk of query_key_value's output (attention.py)
            "attention_output_modules": ("dense",),
        },
    )
