"""Falcon as ``FalconForCausalLM`` (transformers 5.24 ``models/falcon``), in all its layer forms.

Parameter tensors (L layers, h hidden, a heads of d = h / a, F = ``ffn_hidden_size`` (default 4h), V vocab):

- ``transformer.word_embeddings.weight`` [V, h]
- per layer ``transformer.h.*.``: ``self_attention.query_key_value`` [(a + 2 kv) d, h] with kv = 1 for
  ``multi_query`` (Falcon-7B), ``num_kv_heads`` under ``new_decoder_architecture`` (Falcon-40B/180B) and a
  otherwise; ``self_attention.dense`` [h, h]; ``mlp.dense_h_to_4h`` [F, h] and ``mlp.dense_4h_to_h`` [h, F]; each
  Linear with a bias [out] only when ``bias``. LayerNorms (weight and bias [h]): ``input_layernorm`` and
  ``post_attention_layernorm`` when not ``parallel_attn``; else ``ln_attn`` and ``ln_mlp`` when
  ``num_ln_in_parallel_attn`` is 2 (the default under ``new_decoder_architecture``), else ``input_layernorm``
- ``transformer.ln_f`` weight and bias [h]
- ``lm_head.weight`` [V, h], tied to the embeddings unless ``tie_word_embeddings`` is false (default true).

How a layer runs: the fused projection is split per head; under ``new_decoder_architecture`` k and v are
broadcast to all a heads (so attention, and the cache, see a full-width k and v); with ``multi_query`` k and v
keep one head, which SDPA's fused kernels refuse (their head counts differ), so SDPA runs its math fallback:
fp32 copies of q and of k, v expanded to all heads, and the fp32 a x s x s probabilities. Rotary embeddings
cover the whole head unless ``alibi``, where one (b, a, s, s) bias built by the model is every layer's mask.
Parallel attention: x + attn(ln(x)) + mlp(ln'(x)); sequential: y = x + attn(ln(x)), y + mlp(ln'(y)).
``FalconLinear`` runs the matmul, then adds the bias: under autocast an fp32 bias makes the output fp32.

transformers' forward fails for some flag combinations its constructor accepts (``new_decoder_architecture``
without ``parallel_attn``; ``num_ln_in_parallel_attn`` 2 without ``new_decoder_architecture``; ``num_kv_heads``
other than a on the classic multi-head layer): those are refused here, naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_int,
    read_positive,
    read_probability,
    read_rope_theta,
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

#: ``FalconConfig`` defaults (transformers 5.24).
_FALCON_DEFAULTS: dict[str, Any] = {
    "num_kv_heads": None,  # None -> num_attention_heads
    "num_ln_in_parallel_attn": None,  # None -> 2 under new_decoder_architecture, else 1
    "alibi": False,
    "new_decoder_architecture": False,
    "multi_query": True,
    "parallel_attn": True,
    "bias": False,
    "ffn_hidden_size": None,  # None -> 4 x hidden_size
    "activation": "gelu",
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "layer_norm_epsilon": 1e-5,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "rope_theta": 10000.0,
}


def _layout(cfg: Mapping[str, Any], heads: int) -> tuple[bool, bool, bool, int, int]:
    """(new_decoder, multi_query, parallel, kv heads of the fused projection, LayerNorms per layer), refusing
    the flag combinations whose transformers forward fails."""
    d = _FALCON_DEFAULTS
    new = read_bool(cfg, "new_decoder_architecture", d["new_decoder_architecture"])
    mq = read_bool(cfg, "multi_query", d["multi_query"])
    parallel = read_bool(cfg, "parallel_attn", d["parallel_attn"])
    n_ln = read_int(cfg, "num_ln_in_parallel_attn", 2 if new else 1)
    if n_ln not in (1, 2):
        raise ScenarioError("model.num_ln_in_parallel_attn", f"must be 1 or 2, got {n_ln}")
    kv_cfg = read_int(cfg, "num_kv_heads", heads)
    if new:
        if not parallel:
            raise ScenarioError(
                "model.parallel_attn",
                "false with new_decoder_architecture: transformers' FalconDecoderLayer builds "
                "input_layernorm/post_attention_layernorm but its forward reads ln_attn (or no MLP input)",
            )
        if heads % kv_cfg:
            raise ScenarioError("model.num_kv_heads", f"{kv_cfg} does not divide num_attention_heads {heads}")
        kv = kv_cfg
    elif mq:
        kv = 1
    else:
        if kv_cfg != heads:
            raise ScenarioError(
                "model.num_kv_heads",
                f"{kv_cfg} with multi_query and new_decoder_architecture false: that Falcon layer projects all "
                f"{heads} heads for k and v, and transformers' forward fails on any other num_kv_heads",
            )
        kv = heads
    if not new and parallel and n_ln == 2:
        raise ScenarioError(
            "model.num_ln_in_parallel_attn",
            "2 needs new_decoder_architecture: transformers builds ln_attn/ln_mlp but the classic layer's "
            "forward reads input_layernorm",
        )
    norms = 2 if not parallel or n_ln == 2 else 1
    return new, mq, parallel, kv, norms


@register_family("falcon")
def build_falcon(cfg: Mapping[str, Any]) -> Architecture:
    """Falcon as ``FalconForCausalLM`` (see the module docstring for every tensor and refused combination)."""
    d = _FALCON_DEFAULTS
    h = read_int(cfg, "hidden_size", aliases=("n_embed",))
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    vocab = read_int(cfg, "vocab_size")
    if h % heads:
        raise ScenarioError("model.num_attention_heads", f"hidden_size {h} is not divisible by {heads} heads")
    hd = h // heads
    ffn = read_int(cfg, "ffn_hidden_size", 4 * h)
    new, mq, parallel, kv, norms = _layout(cfg, heads)
    bias = read_bool(cfg, "bias", d["bias"])
    alibi = read_bool(cfg, "alibi", d["alibi"])
    tied = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    act = read_str(cfg, "activation", d["activation"])
    hidden_dropout = read_probability(cfg, "hidden_dropout", d["hidden_dropout"])
    attention_dropout = read_probability(cfg, "attention_dropout", d["attention_dropout"])

    p = "transformer.h.*."
    names = ("ln_attn", "ln_mlp") if parallel and norms == 2 else ("input_layernorm",)
    groups: list[ParamGroup] = [embedding_param("transformer.word_embeddings.weight", vocab, h)]
    groups += norm_params(p, names, h, L, bias=True, stack="decoder")
    groups += linear_params(
        p + "self_attention.query_key_value", "attention", (heads + 2 * kv) * hd, h,
        bias=bias, parallel="col", module="query_key_value", count=L,
    )  # fmt: skip
    groups += linear_params(
        p + "self_attention.dense", "attention", h, h, bias=bias, parallel="row", module="dense", count=L
    )
    if not parallel:
        groups += norm_params(p, ("post_attention_layernorm",), h, L, bias=True, stack="decoder")
    groups += linear_params(
        p + "mlp.dense_h_to_4h", "mlp", ffn, h, bias=bias, parallel="col", module="dense_h_to_4h", count=L
    )
    groups += linear_params(
        p + "mlp.dense_4h_to_h", "mlp", h, ffn, bias=bias, parallel="row", module="dense_4h_to_h", count=L
    )
    groups += final_norm_and_head("transformer.", "ln_f", h, vocab, tied=tied, bias=True)
    # residual dropouts: one after the MLP (hidden_dropout); the sequential layer also drops the attention
    # output with attention_dropout's rate. Attention probabilities are dropped only on the alibi path.
    masks = int(hidden_dropout > 0) + int(not parallel and attention_dropout > 0)
    # the math SDPA fallback (multi-query: k, v keep one head while q has a)
    mq_math = mq and not new and heads > 1
    return Architecture(
        family="falcon",
        model_type=str(cfg.get("model_type", "falcon")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        # what attention and the cache see: k, v broadcast to all heads under new_decoder_architecture
        num_kv_heads=heads if new else kv,
        head_dim=hd,
        intermediate_size=ffn,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("activation", act, gated=False),
        norm="layernorm",
        position="alibi" if alibi else "rope",
        attention_dropout=attention_dropout if alibi else 0.0,
        hidden_dropout=max(hidden_dropout, attention_dropout if not parallel else 0.0),
        decoder_layers=L,
        causal=True,
        extra={
            "hf_class": "FalconForCausalLM",
            "norms_per_layer": norms,
            "max_position_embeddings": read_int(cfg, "max_position_embeddings", d["max_position_embeddings"]),
            "layer_norm_eps": read_positive(cfg, "layer_norm_epsilon", d["layer_norm_epsilon"]),
            "rope_theta": read_rope_theta(cfg, d["rope_theta"]),
            "new_decoder_architecture": new,
            "multi_query": mq and not new,
            "parallel_attn": parallel,
            "alibi": alibi,
            "bias": bias,
            "qkv_kv_heads": kv,
            # activation rules (engine/activations/)
            "parallel_attn_mlp": parallel and norms == 1,
            "norm_inputs": 1 if parallel else norms,
            "residual_dropout_masks": masks,
            "sdpa_math_fallback": mq_math,
            "softmax_compute_dtype": True,  # eager softmax(dtype=hidden_states.dtype), no fp32 copy
            # fused SDPA gets the explicit boolean mask (allow_is_causal_skip=False) and saves its float cast;
            # its output is laid out (b, s, a, d), so the out-projection reads a view (traced)
            "unfused_bias": bias,  # FalconLinear: matmul, then + bias (fp32 under autocast promotes the output)
            "sdpa_float_mask": not alibi,
            # classic multi-head ALiBi: q, k, v stay views of query_key_value's output and SDPA keeps all of it
            # (with rotary, q and k come out of RoPE and nothing keeps it; traced)
            "sdpa_fused_qkv_view": alibi and not mq and not new,
            # ALiBi: one (b, a, s, s) float bias for all layers, saved by fused SDPA (not by the math fallback)
            "alibi_bias_saved": alibi and not mq_math,
            "attention_output_modules": ("dense",),
        },
    )
