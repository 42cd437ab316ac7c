"""The shared builder of RMSNorm + RoPE decoder-only models (llama, mistral, qwen2, mixtral, gemma, gemma2, phi3,
and the family modules that start from it: qwen3, olmo2, glm4, cohere, gemma3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    REQUIRED_KEYS,
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
from memsim_widget.architecture.moe import routed_experts
from memsim_widget.architecture.types import Architecture, ParamGroup
from memsim_widget.errors import ScenarioError


def _attention_params(
    L: int, h: int, heads: int, kv: int, d: int, *, fused: bool, qkv_bias: bool, o_bias: bool
) -> list[ParamGroup]:
    """The attention projections of every layer: q/k/v/o, or (phi3, ``fused``) one qkv_proj then o_proj."""
    p = "model.layers.*."
    if not fused:
        return attention_params(p, L, h, heads, kv, d, bias=qkv_bias, o_bias=o_bias)
    # phi3: one qkv_proj [(a + 2 kv) d, h], then o_proj
    groups = linear_params(
        p + "self_attn.qkv_proj", "attention", (heads + 2 * kv) * d, h,
        bias=qkv_bias, parallel="col", module="qkv_proj", count=L,
    )  # fmt: skip
    groups += linear_params(
        p + "self_attn.o_proj", "attention", h, heads * d,
        bias=o_bias, parallel="row", module="o_proj", count=L,
    )  # fmt: skip
    return groups


def _mixtral_experts(L: int, h: int, inter: int, n_exp: int) -> list[ParamGroup]:
    """Mixtral's router and routed experts as transformers 5.24.0 holds them (``models/mixtral/modeling_mixtral.py``
    ``MixtralSparseMoeBlock``: ``mlp.gate`` a [E, h] router, ``mlp.experts`` ``MixtralExperts`` with
    ``gate_up_proj`` [E, 2I, h] and ``down_proj`` [E, h, I], plain parameters, w1 and w3 of the checkpoint fused
    into ``gate_up_proj``), per expert over layers * experts (``moe.routed_experts``)."""
    p = "model.layers.*."
    groups = linear_params(
        p + "block_sparse_moe.gate", "router", n_exp, h, bias=False, parallel=None, module="gate", count=L
    )
    return groups + routed_experts(p + "mlp.experts.", L, n_exp, inter, h)


def _gated_mlp(L: int, h: int, inter: int, *, fused: bool, mlp_bias: bool) -> list[ParamGroup]:
    """Every layer's gated MLP: gate_proj, up_proj, down_proj, or (phi3, ``fused``) gate_up_proj [2 I, h]."""
    p = "model.layers.*."
    groups: list[ParamGroup] = []
    if fused:
        groups += linear_params(
            p + "mlp.gate_up_proj",
            "mlp",
            2 * inter,
            h,
            bias=mlp_bias,
            parallel="col",
            module="gate_up_proj",
            count=L,
        )
    else:
        for name in ("gate_proj", "up_proj"):
            groups += linear_params(
                p + f"mlp.{name}", "mlp", inter, h, bias=mlp_bias, parallel="col", module=name, count=L
            )
    groups += linear_params(
        p + "mlp.down_proj", "mlp", h, inter, bias=mlp_bias, parallel="row", module="down_proj", count=L
    )
    return groups


def _rope_info(
    cfg: Mapping[str, Any],
    defaults: Mapping[str, Any],
    hf_class: str,
    layer_norms: tuple[str, ...],
    extra: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The ``extra`` facts every RoPE decoder carries (class, positions, RoPE base and scaling, norms)."""
    info: dict[str, Any] = {
        "hf_class": hf_class,
        "max_position_embeddings": read_int(
            cfg, "max_position_embeddings", defaults["max_position_embeddings"]
        ),
        "rope_theta": read_rope_theta(cfg, defaults["rope_theta"]),
        "rms_norm_eps": read_positive(cfg, "rms_norm_eps", defaults["rms_norm_eps"]),
        "norms_per_layer": len(layer_norms),
    }
    if isinstance(cfg.get("rope_scaling"), Mapping):
        info["rope_scaling"] = dict(cfg["rope_scaling"])
    info.update(extra or {})
    return info


def build_decoder(
    cfg: Mapping[str, Any],
    *,
    family: str,
    hf_class: str,
    defaults: Mapping[str, Any],
    act_key: str = "hidden_act",
    qkv_bias: bool = False,
    o_bias: bool = False,
    mlp_bias: bool = False,
    layer_norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm"),
    fused: bool = False,
    moe: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> Architecture:
    """Shared builder for RMSNorm + RoPE decoder-only models (llama, mistral, qwen2, mixtral, gemma, phi3)."""
    h, n_layers, heads, inter, vocab = (read_int(cfg, k) for k in REQUIRED_KEYS)
    kv = read_kv_heads(cfg, heads, defaults["num_key_value_heads"])
    d = read_head_dim(cfg, h, heads, defaults.get("head_dim"))
    tied = read_bool(cfg, "tie_word_embeddings", defaults["tie_word_embeddings"])
    act = read_str(cfg, act_key, defaults[act_key])
    n_exp = read_int(cfg, "num_local_experts", defaults.get("num_local_experts", 0)) if moe else 0
    top_k = read_int(cfg, "num_experts_per_tok", defaults.get("num_experts_per_tok", 0)) if moe else 0
    if moe and top_k > n_exp:
        raise ScenarioError("model.num_experts_per_tok", f"{top_k} exceeds num_local_experts {n_exp}")

    L = n_layers
    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += _attention_params(L, h, heads, kv, d, fused=fused, qkv_bias=qkv_bias, o_bias=o_bias)
    if moe:
        groups += _mixtral_experts(L, h, inter, n_exp)
    else:
        groups += _gated_mlp(L, h, inter, fused=fused, mlp_bias=mlp_bias)
    groups += norm_params("model.layers.*.", layer_norms, h, L, bias=False, stack="decoder")
    groups += final_norm_and_head("model.", "norm", h, vocab, tied=tied, bias=False)
    info = _rope_info(cfg, defaults, hf_class, layer_norms, extra)
    return Architecture(
        family=family,
        model_type=str(cfg.get("model_type", family)),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=vocab,
        tied_embeddings=tied,
        params=tuple(groups),
        mlp_activation=activation_label(act_key, act, gated=True),
        norm="rmsnorm",
        position="rope",
        num_experts=n_exp,
        experts_per_token=top_k,
        attention_dropout=read_probability(cfg, "attention_dropout", defaults["attention_dropout"]),
        hidden_dropout=read_probability(cfg, "resid_pdrop", defaults.get("resid_pdrop", 0.0)),
        decoder_layers=L,
        causal=True,
        extra=info,
    )
