"""ModernBERT as ``ModernBertForMaskedLM`` (transformers 5.24 ``models/modernbert/modeling_modernbert.py``).

A pre-norm RoPE encoder. Parameter tensors (L layers, h hidden, I = intermediate_size, V vocab):

- ``model.embeddings.tok_embeddings.weight`` [V, h] and ``model.embeddings.norm`` (LayerNorm [h]);
- per layer ``model.layers.*.``: ``attn_norm`` (LayerNorm [h]; layer 0 has none: ``nn.Identity``, the
  embeddings are normed already), ``attn.Wqkv`` [3h, h] and ``attn.Wo`` [h, h] (biases with
  ``attention_bias``), ``mlp_norm`` (LayerNorm [h]), ``mlp.Wi`` [2I, h] (input and gate fused) and
  ``mlp.Wo`` [h, I] (biases with ``mlp_bias``);
- ``model.final_norm`` (LayerNorm [h]), the MLM head ``head.dense`` [h, h] (bias with ``classifier_bias``)
  and ``head.norm`` (LayerNorm [h]); ``decoder.weight`` [V, h] tied to the token embeddings unless
  ``tie_word_embeddings`` is false, ``decoder.bias`` [V] with ``decoder_bias`` (default true).

Every LayerNorm has a weight, and a bias only with ``norm_bias`` (default false). Layers alternate global
and local attention: ``layer_types``, else every ``global_attn_every_n_layers``-th layer (from layer 0) is
global and the others attend within ``local_attention / 2`` tokens either side, each kind with its own RoPE
base (``rope_parameters``, else ``global_rope_theta`` 160000 / ``local_rope_theta`` 10000). transformers 5
dropped the unpadding path: every attention implementation (SDPA by default) runs on the padded
(b, s) batch. ``sparse_prediction`` (the head on masked tokens only) is not modelled: the engine, like the
trace, predicts every token, an upper bound for a masking run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    REQUIRED_KEYS,
    layer_kinds,
    read_bool,
    read_int,
    read_positive,
    read_probability,
    read_str,
)
from memsim_widget.architecture.layers import activation_label, embedding_param, linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``ModernBertConfig`` defaults.
MODERNBERT_DEFAULTS: dict[str, Any] = {
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "norm_eps": 1e-5,
    "norm_bias": False,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "embedding_dropout": 0.0,
    "mlp_bias": False,
    "mlp_dropout": 0.0,
    "decoder_bias": True,
    "classifier_bias": False,
    "classifier_activation": "gelu",
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "sparse_prediction": False,
    "tie_word_embeddings": True,
}

_LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_types(cfg: Mapping[str, Any], n_layers: int) -> list[str]:
    """Each layer's attention: ``layer_types`` as given, else global every n-th layer from layer 0."""
    every = 1
    if cfg.get("layer_types") is None:
        every = read_int(cfg, "global_attn_every_n_layers", MODERNBERT_DEFAULTS["global_attn_every_n_layers"])
    return layer_kinds(
        cfg, n_layers, _LAYER_TYPES, lambda i: "sliding_attention" if i % every else "full_attention"
    )


def rope_thetas(cfg: Mapping[str, Any]) -> dict[str, float]:
    """RoPE base per layer kind, from ``rope_parameters`` (transformers 5) or the global/local keys."""
    d = MODERNBERT_DEFAULTS
    out = {
        "full_attention": read_positive(cfg, "global_rope_theta", d["global_rope_theta"]),
        "sliding_attention": read_positive(cfg, "local_rope_theta", d["local_rope_theta"]),
    }
    params = cfg.get("rope_parameters")
    if isinstance(params, Mapping):
        for kind in _LAYER_TYPES:
            sub = params.get(kind)
            if isinstance(sub, Mapping) and sub.get("rope_theta") is not None:
                out[kind] = read_positive(sub, "rope_theta", out[kind], f"rope_parameters.{kind}.rope_theta")
    return out


def _check_no_dropout(cfg: Mapping[str, Any]) -> None:
    """Refuse a non-zero dropout: ModernBERT's are not modelled (the published checkpoints use 0)."""
    for key in ("attention_dropout", "mlp_dropout", "embedding_dropout"):
        if read_probability(cfg, key, MODERNBERT_DEFAULTS[key]):
            raise ScenarioError(
                f"model.{key}", "ModernBERT's dropouts are not modelled; the published checkpoints use 0"
            )


def _layer_params(
    L: int, h: int, inter: int, *, nb: bool, attn_bias: bool, mlp_bias: bool
) -> list[ParamGroup]:
    """Every layer's attn_norm (none in layer 0), fused Wqkv and Wo, mlp_norm, and the GeGLU Wi/Wo."""
    S, p = "encoder", "model.layers.*."
    groups: list[ParamGroup] = []
    if L > 1:  # layer 0's attn_norm is nn.Identity
        groups += norm_params(p, ("attn_norm",), h, L - 1, bias=nb, stack=S)
    groups += linear_params(
        p + "attn.Wqkv",
        "attention",
        3 * h,
        h,
        bias=attn_bias,
        parallel="col",
        module="Wqkv",
        count=L,
        stack=S,
    )
    groups += linear_params(
        p + "attn.Wo", "attention", h, h, bias=attn_bias, parallel="row", module="Wo", count=L, stack=S
    )
    groups += norm_params(p, ("mlp_norm",), h, L, bias=nb, stack=S)
    groups += linear_params(
        p + "mlp.Wi", "mlp", 2 * inter, h, bias=mlp_bias, parallel="col", module="Wi", count=L, stack=S
    )
    groups += linear_params(
        p + "mlp.Wo", "mlp", h, inter, bias=mlp_bias, parallel="row", module="Wo", count=L, stack=S
    )
    return groups


def _head_params(cfg: Mapping[str, Any], h: int, vocab: int, *, nb: bool, tied: bool) -> list[ParamGroup]:
    """The final norm, the MLM head's dense + norm, the untied decoder weight and the decoder bias."""
    d, S = MODERNBERT_DEFAULTS, "encoder"
    groups = norm_params("model.", ("final_norm",), h, 1, bias=nb, scope="post", stack=S)
    groups += linear_params(
        "head.dense", "head", h, h, bias=read_bool(cfg, "classifier_bias", d["classifier_bias"]),
        parallel=None, module="dense", scope="post", stack=S,
    )  # fmt: skip
    groups += norm_params("head.", ("norm",), h, 1, bias=nb, scope="post", stack=S)
    if not tied:
        groups.append(
            ParamGroup(
                name="decoder.weight",
                kind="head",
                shape=(vocab, h),
                scope="post",
                tp_dim=0,
                module="decoder",
                stack=S,
            )
        )
    if read_bool(cfg, "decoder_bias", d["decoder_bias"]):
        groups.append(
            ParamGroup(name="decoder.bias", kind="head", shape=(vocab,), scope="post", tp_dim=0, stack=S)
        )
    return groups


@register_family("modernbert")
def build_modernbert(cfg: Mapping[str, Any]) -> Architecture:
    """ModernBERT as ``ModernBertForMaskedLM``: pre-norm, fused Wqkv, GeGLU Wi/Wo, global/local RoPE layers."""
    d = MODERNBERT_DEFAULTS
    h, L, heads, inter, vocab = (read_int(cfg, k) for k in REQUIRED_KEYS)
    if h % heads:
        raise ScenarioError("model.num_attention_heads", f"hidden_size {h} is not divisible by {heads} heads")
    nb = read_bool(cfg, "norm_bias", d["norm_bias"])
    attn_bias = read_bool(cfg, "attention_bias", d["attention_bias"])
    mlp_bias = read_bool(cfg, "mlp_bias", d["mlp_bias"])
    tied = read_bool(cfg, "tie_word_embeddings", d["tie_word_embeddings"])
    act = read_str(cfg, "hidden_activation", d["hidden_activation"])
    kinds = layer_types(cfg, L)
    window = read_int(cfg, "local_attention", d["local_attention"])
    _check_no_dropout(cfg)
    S = "encoder"
    groups: list[ParamGroup] = [embedding_param("model.embeddings.tok_embeddings.weight", vocab, h, stack=S)]
    groups += norm_params("model.embeddings.", ("norm",), h, 1, bias=nb, scope="pre", stack=S)
    groups += _layer_params(L, h, inter, nb=nb, attn_bias=attn_bias, mlp_bias=mlp_bias)
    groups += _head_params(cfg, h, vocab, nb=nb, tied=tied)
    return Architecture(
        family="modernbert",
        model_type=str(cfg.get("model_type", "modernbert")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=h // heads,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label("hidden_activation", act, gated=True),
        norm="layernorm",
        position="rope",
        encoder_layers=L,
        causal=False,
        extra={
            "hf_class": "ModernBertForMaskedLM",
            "objective": "masked_lm",
            "norms_per_layer": 2,
            "first_layer_norms": 1,  # layer 0's attn_norm is nn.Identity
            "embedding_norm": True,
            "mlm_head": True,
            "final_norm": True,  # model.final_norm, apart from the head's norm
            "fused_qkv_kept": True,  # SDPA's v is a view of Wqkv's output: the whole [q | k | v] stays
            "rope_kinds": len(set(kinds)),  # one cos/sin pair per layer kind
            "layer_types": tuple(kinds),
            "sliding_layers": kinds.count("sliding_attention"),
            "sdpa_sliding_mask": "local",  # one converted mask saved per local layer (engine/activations/attention.py)
            "local_attention": window,
            "sliding_window": window // 2,
            "rope_theta": rope_thetas(cfg),
            "hidden_activation": act,
            "max_position_embeddings": read_int(cfg, "max_position_embeddings", d["max_position_embeddings"]),
            "norm_bias": nb,
            "norm_eps": read_positive(cfg, "norm_eps", d["norm_eps"]),
            "sparse_prediction": read_bool(cfg, "sparse_prediction", d["sparse_prediction"]),
        },
    )
