"""Llama 4's language model (``model_type: llama4_text``) as transformers 5.24's ``Llama4ForCausalLM``.

Parameter tensors (``model.layers.*.`` per layer):

- ``model.embed_tokens.weight`` [V, h]; ``lm_head.weight`` [V, h] unless ``tie_word_embeddings``;
  ``model.norm.weight`` [h]
- ``self_attn.q_proj`` [a d, h], ``k_proj`` / ``v_proj`` [kv d, h], ``o_proj`` [h, a d] (each + bias when
  ``attention_bias``); the q/k norm (``use_qk_norm``, RoPE layers only) is an L2 norm without a weight
- MoE layers (``moe_layers``, else every ``interleave_moe_layer_step``-th layer from step - 1):
  ``feed_forward.router.weight`` [E, h] (an ``nn.Linear``), ``feed_forward.experts.gate_up_proj`` [E, h, 2 I]
  and ``down_proj`` [E, I, h] (stored for ``x @ W``), ``feed_forward.shared_expert.{gate,up,down}_proj`` of
  width I (``intermediate_size``)
- the other layers: ``feed_forward.{gate,up,down}_proj`` of width ``intermediate_size_mlp``
- ``input_layernorm`` / ``post_attention_layernorm`` [h]

Forward facts the engine reads: the router keeps the top-k logits, sets the rest to -inf and takes a sigmoid;
``Llama4TextMoe`` then repeats every token E times, scales each copy by its score (0 for experts not chosen)
and runs all E experts on all tokens with ``torch.bmm``: the routed activations grow with E, not with top-k.
RoPE layers (``no_rope_layers[i] == 1``) rotate q and k in fp32 complex numbers and use chunked attention
(``attention_chunk_size``); NoPE layers scale q by the attention temperature (``attn_temperature_tuning``).

A ``llama4`` config (the vision-language ``Llama4ForConditionalGeneration``) is families/llama4_vlm.py's: this
language model with the vision tower and projector; its ``text_config`` (``model_type: llama4_text``) simulates
the language model alone.
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
from memsim_widget.architecture.moe import check_top_k, dense_mlp, layer_indices, routed_experts, router
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError

#: Llama4TextConfig defaults (transformers 5.24.0, configuration_llama4.py).
LLAMA4_TEXT_DEFAULTS: dict[str, Any] = {
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "attn_temperature_tuning": True,
    "floor_scale": 8192,
    "attn_scale": 0.1,
    "attention_bias": False,
    "rope_theta": 500000.0,
    "router_aux_loss_coef": 0.001,
}

#: Llama4TextConfig.layer_types values (chunked layers attend within attention_chunk_size tokens).
LAYER_TYPES = ("full_attention", "chunked_attention")


def _rope_layers(cfg: Mapping[str, Any], L: int, interval: int) -> list[bool]:
    """Which layers apply RoPE: ``no_rope_layers`` (1 = RoPE), else all but every ``interval``-th layer."""
    value = cfg.get("no_rope_layers")
    if not value:  # HF: None or [] -> the interval default
        return [(i + 1) % interval != 0 for i in range(L)]
    if not isinstance(value, list | tuple) or any(v not in (0, 1) or isinstance(v, float) for v in value):
        raise ScenarioError("model.no_rope_layers", f"must be a list of 0/1 flags, got {value!r:.60}")
    if len(value) < L:
        raise ScenarioError("model.no_rope_layers", f"has {len(value)} flags for {L} layers")
    return [bool(v) for v in value[:L]]


def _moe_layer_set(cfg: Mapping[str, Any], L: int, step: int) -> set[int]:
    """MoE layer indices: ``moe_layers`` when given, else every ``step``-th layer starting at step - 1."""
    if cfg.get("moe_layers") is not None:
        return set(layer_indices(cfg, "moe_layers", L))
    return set(range(step - 1, L, step))


def _read_mlp(cfg: Mapping[str, Any], d_: Mapping[str, Any], L: int) -> tuple[int, int, set[int], int, int]:
    """(experts, top-k, MoE layer indices, expert width, dense MLP width) of ``cfg``, top-k checked."""
    E = read_int(cfg, "num_local_experts", d_["num_local_experts"], aliases=("num_experts",))
    top_k = read_int(cfg, "num_experts_per_tok", d_["num_experts_per_tok"])
    check_top_k(top_k, E, of="local experts")
    step = read_int(cfg, "interleave_moe_layer_step", d_["interleave_moe_layer_step"])
    moe_set = _moe_layer_set(cfg, L, step)
    i_moe = read_int(cfg, "intermediate_size", d_["intermediate_size"])
    i_mlp = read_int(cfg, "intermediate_size_mlp", d_["intermediate_size_mlp"])
    return E, top_k, moe_set, i_moe, i_mlp


def _read_attention(
    cfg: Mapping[str, Any], d_: Mapping[str, Any], L: int
) -> tuple[list[bool], bool, int | None, list[str]]:
    """(RoPE flag per layer, q/k norm, chunk size or None, layer types) of ``cfg``."""
    rope = _rope_layers(cfg, L, read_int(cfg, "no_rope_layer_interval", d_["no_rope_layer_interval"]))
    qk_norm = read_bool(cfg, "use_qk_norm", d_["use_qk_norm"])
    chunk = cfg.get("attention_chunk_size", d_["attention_chunk_size"])
    if chunk is not None:
        chunk = read_int(cfg, "attention_chunk_size", d_["attention_chunk_size"])
    # HF: chunked attention on the RoPE layers when a chunk size is set
    types = layer_kinds(
        cfg, L, LAYER_TYPES, lambda i: "chunked_attention" if rope[i] and chunk is not None else "full_attention",
        longer_ok=True,
    )  # fmt: skip
    return rope, qk_norm, chunk, types


def _mlp_facts(L: int, E: int, top_k: int, moe_set: set[int], i_moe: int, i_mlp: int) -> dict[str, Any]:
    """The ``extra`` entries of the MLP stack: its parts (dense MLP, all-E routed experts, shared expert)."""
    n_moe = len(moe_set)
    n_dense = L - n_moe
    parts: list[dict[str, Any]] = []
    if n_dense:
        parts.append({"name": "dense MLP", "layers": n_dense, "rows": 1, "width": i_mlp})
    if n_moe:
        # every expert runs every token (scores 0 for the experts not chosen): E rows per token
        parts.append(
            {"name": "routed experts (all E run every token)", "layers": n_moe, "rows": E, "width": i_moe,
             "experts": E, "top_k": top_k, "router": "topk-sigmoid", "dispatch": "dense"}
        )  # fmt: skip
        parts.append({"name": "shared expert", "layers": n_moe, "rows": 1, "width": i_moe})
    return {
        "mlp_parts": tuple(parts),
        "moe_layers": n_moe,
        "moe_layer_indices": sorted(moe_set),
        # the experts' torch.bmm and the nn.Linear router run under autocast: 16-bit weight copies cached
        "autocast_expert_copies": True,
        "dense_intermediate_size": i_mlp,
        "moe_intermediate_size": i_moe,
        "shared_experts": 1 if n_moe else 0,
    }


def _attention_facts(
    cfg: Mapping[str, Any], rope: list[bool], qk_norm: bool, chunk: int | None, types: list[str]
) -> dict[str, Any]:
    """The ``extra`` entries of the attention layers: RoPE / NoPE, the q/k norm, chunking, temperature."""
    n_rope = sum(rope)
    return {
        # RoPE layers: q and k rotated as complex numbers (the product saves only freqs_cis), then
        # (use_qk_norm) a weightless L2 norm over each head in fp32
        "rope_layers": n_rope,
        "rope_layer0": rope[0],
        "qk_norm": "l2" if qk_norm and n_rope else None,
        "qk_norm_layers": n_rope if qk_norm else 0,
        "attention_chunk_size": chunk,
        "chunked_layers": types.count("chunked_attention") if chunk is not None else 0,
        "attn_temperature_tuning": read_bool(
            cfg, "attn_temperature_tuning", LLAMA4_TEXT_DEFAULTS["attn_temperature_tuning"]
        ),
    }


@register_family("llama4_text")
def build_llama4_text(cfg: Mapping[str, Any]) -> Architecture:
    """Llama 4 Scout / Maverick language model as ``Llama4ForCausalLM``; see the module docstring."""
    d_ = LLAMA4_TEXT_DEFAULTS
    h = read_int(cfg, "hidden_size")
    L = read_int(cfg, "num_hidden_layers")
    heads = read_int(cfg, "num_attention_heads")
    vocab = read_int(cfg, "vocab_size")
    kv = read_kv_heads(cfg, heads, d_["num_key_value_heads"])
    d = read_head_dim(cfg, h, heads, d_["head_dim"])  # 128 unless given (not hidden_size / heads)
    tied = read_bool(cfg, "tie_word_embeddings", d_["tie_word_embeddings"])
    act = read_str(cfg, "hidden_act", d_["hidden_act"])
    bias = read_bool(cfg, "attention_bias", d_["attention_bias"])
    E, top_k, moe_set, i_moe, i_mlp = _read_mlp(cfg, d_, L)
    n_moe = len(moe_set)
    rope, qk_norm, chunk, types = _read_attention(cfg, d_, L)

    p = "model.layers.*."
    groups: list[ParamGroup] = [embedding_param("model.embed_tokens.weight", vocab, h)]
    groups += attention_params(p, L, h, heads, kv, d, bias=bias)
    groups += router(p + "feed_forward.router", n_moe, E, h)
    groups += routed_experts(p + "feed_forward.experts.", n_moe, E, i_moe, h, transposed=True)
    groups += dense_mlp(p + "feed_forward.shared_expert.", n_moe, i_moe, h)
    groups += dense_mlp(p + "feed_forward.", L - n_moe, i_mlp, h)
    groups += norm_params(
        p, ("input_layernorm", "post_attention_layernorm"), h, L, bias=False, stack="decoder"
    )
    groups += final_norm_and_head("model.", "norm", h, vocab, tied=tied, bias=False)
    return Architecture(
        family="llama4_text",
        model_type=str(cfg.get("model_type", "llama4_text")),
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=d,
        intermediate_size=i_moe if n_moe else i_mlp,
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
            "hf_class": "Llama4ForCausalLM",
            "max_position_embeddings": read_int(
                cfg, "max_position_embeddings", d_["max_position_embeddings"]
            ),
            "rope_theta": read_rope_theta(cfg, d_["rope_theta"]),
            "rope_scaling": cfg.get("rope_scaling") or cfg.get("rope_parameters"),
            "rms_norm_eps": read_positive(cfg, "rms_norm_eps", d_["rms_norm_eps"]),
            "norms_per_layer": 2,
            **_mlp_facts(L, E, top_k, moe_set, i_moe, i_mlp),
            **_attention_facts(cfg, rope, qk_norm, chunk, types),
            "expert_parallel_error": "transformers' Llama 4 has no expert-parallel plan (its experts take every "
            "token pre-scaled by its router score; they shard with tensor parallelism): use tp, not ep",
            "lora_all_linear_error": "'all-linear' makes peft wrap Llama4Router (an nn.Linear whose forward "
            "returns a tuple) and the forward fails; name the target modules (e.g. q_proj, v_proj)",
            "eager_softmax_dtype": "compute",  # Llama 4's eager attention does not upcast its softmax
            "router_aux_loss_coef": cfg.get("router_aux_loss_coef", d_["router_aux_loss_coef"]),
        },
    )
