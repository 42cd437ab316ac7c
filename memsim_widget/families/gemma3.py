"""Gemma 3 (text) as ``Gemma3ForCausalLM`` (transformers 5.24 ``models/gemma3/modeling_gemma3.py``).

Each block is Gemma 2's: ``h = x + post_attention_layernorm(attn(input_layernorm(x)))``, ``out = h +
post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``, with Gemma's RMSNorm (fp32, ``x * (1 + w)``).
Parameter tensors, per layer ``model.layers.*.``:

- ``self_attn.q_proj.weight`` [a*d, h], ``k_proj.weight`` / ``v_proj.weight`` [kv*d, h], ``o_proj.weight``
  [h, a*d] (each with a bias when ``attention_bias``);
- ``self_attn.q_norm.weight`` / ``self_attn.k_norm.weight`` [d]: Gemma RMSNorm over each head's d features;
- ``mlp.gate_proj.weight`` / ``mlp.up_proj.weight`` [I, h], ``mlp.down_proj.weight`` [h, I] (GeGLU);
- ``input_layernorm``, ``post_attention_layernorm``, ``pre_feedforward_layernorm``,
  ``post_feedforward_layernorm`` weights [h];

plus ``model.embed_tokens.weight`` [V, h] (scaled by sqrt(h) in forward), ``model.norm.weight`` [h] and
``lm_head.weight`` [V, h] unless ``tie_word_embeddings`` (default true). Layers are ``sliding_attention`` or
``full_attention`` (``layer_types``, else every ``sliding_window_pattern``-th layer is full, default 6); each
kind has its own RoPE base (``rope_parameters`` per layer type, or the older ``rope_theta`` for full layers and
``rope_local_base_freq`` for sliding ones), so the model computes one cos/sin pair per kind. Unlike Gemma 2,
transformers runs Gemma 3 with SDPA and never passes ``attn_logit_softcapping`` to the attention (the key is
read but has no effect); ``final_logit_softcapping`` (default null) caps the logits with a tanh. On sliding layers at
s >= ``sliding_window`` transformers passes a mask to SDPA, with k and v repeated to all heads (engine/activations/attention.py).
``use_bidirectional_attention`` (EmbeddingGemma) is refused: it masks every layer and halves the window.

A ``gemma3`` config is ``Gemma3ForConditionalGeneration``: SigLIP vision tower, projector, and the language model
in ``text_config`` (``build_gemma3`` below; its vision side in engine/multimodal/tower.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import layer_kinds, read_bool, read_int, read_positive
from memsim_widget.architecture.decoder import build_decoder
from memsim_widget.architecture.layers import qk_norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.architecture.vision import errors_under, siglip_vision_tower, sub_config
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``Gemma3TextConfig`` defaults (structural keys stay required: ``REQUIRED_KEYS``).
GEMMA3_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,  # full_attention layers ("global")
    "rope_local_base_freq": 10_000.0,  # sliding_attention layers ("local")
    "attention_bias": False,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
}

LAYER_TYPES = ("sliding_attention", "full_attention")


def layer_types(cfg: Mapping[str, Any], layers: int, pattern_default: int) -> tuple[str, ...]:
    """Each layer's attention kind: ``layer_types`` as given, else every ``sliding_window_pattern``-th is full."""
    pattern = (
        read_int(cfg, "sliding_window_pattern", pattern_default) if cfg.get("layer_types") is None else 1
    )
    return tuple(
        layer_kinds(
            cfg, layers, LAYER_TYPES, lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention"
        )
    )


def rope_bases(cfg: Mapping[str, Any]) -> dict[str, float]:
    """RoPE base per layer kind, read as ``Gemma3TextConfig.convert_rope_params_to_dict`` does.

    ``rope_parameters`` ({layer kind: {rope_type, rope_theta, ...}}) wins; a missing theta falls back to
    ``rope_theta`` (full layers) or ``rope_local_base_freq`` (sliding layers), then to 1e6 / 1e4.
    """
    d = GEMMA3_DEFAULTS
    fallback = {
        "full_attention": read_positive(cfg, "rope_theta", d["rope_theta"]),
        "sliding_attention": read_positive(cfg, "rope_local_base_freq", d["rope_local_base_freq"]),
    }
    params = cfg.get("rope_parameters")
    out = dict(fallback)
    if isinstance(params, Mapping):
        for kind in LAYER_TYPES:
            sub = params.get(kind)
            if isinstance(sub, Mapping) and sub.get("rope_theta") is not None:
                out[kind] = read_positive(
                    sub, "rope_theta", fallback[kind], f"rope_parameters.{kind}.rope_theta"
                )
    return out


@register_family("gemma3_text")
def build_gemma3_text(cfg: Mapping[str, Any]) -> Architecture:
    """Gemma 3 language model as ``Gemma3ForCausalLM``: Gemma 2's block plus per-head q/k RMSNorm."""
    d = GEMMA3_DEFAULTS
    bias = read_bool(cfg, "attention_bias", d["attention_bias"])
    h, heads = read_int(cfg, "hidden_size"), read_int(cfg, "num_attention_heads")
    if h % heads:  # Gemma3TextConfig.validate_architecture refuses it too
        raise ScenarioError(
            "model.num_attention_heads",
            f"hidden_size {h} is not a multiple of {heads} heads (transformers refuses it)",
        )
    arch = build_decoder(
        cfg,
        family="gemma3",
        hf_class="Gemma3ForCausalLM",
        defaults=d,
        act_key="hidden_activation",
        qkv_bias=bias,
        o_bias=bias,
        layer_norms=(
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ),
        extra={
            "norm_one_plus_weight": True,
            "coverage": ("compiled",),
            "compiled_recipes": (("bf16", "full"), ("bf16", "lora")),
        },
    )
    if read_bool(cfg, "use_bidirectional_attention", d["use_bidirectional_attention"]):
        raise ScenarioError(
            "model.use_bidirectional_attention",
            "bidirectional Gemma 3 (EmbeddingGemma) passes a mask to every layer and halves the window; not simulated",
        )
    kinds = layer_types(cfg, arch.num_layers, d["sliding_window_pattern"])
    bases = rope_bases(cfg)
    window = cfg.get("sliding_window", d["sliding_window"])
    rope_parameters = cfg.get("rope_parameters")
    extra = arch.extra_with(
        qk_norm="head",
        layer_types=kinds,
        sdpa_sliding_mask="decoder",  # sliding layers at s >= window: SDPA's mask, k/v repeated (activations)
        rope_kinds=len(set(kinds)),  # one cos/sin pair per layer kind present
        rope_theta=bases["full_attention"],
        rope_local_base_freq=bases["sliding_attention"],
        sliding_window=window,
        query_pre_attn_scalar=cfg.get("query_pre_attn_scalar", d["query_pre_attn_scalar"]),
        final_logit_softcapping=cfg.get("final_logit_softcapping", d["final_logit_softcapping"]),
        # read by Gemma3TextConfig but never passed to the attention by Gemma3Attention (no effect)
        attn_logit_softcapping=None,
        embedding_scale="sqrt(hidden_size)",
        **({"rope_parameters": dict(rope_parameters)} if isinstance(rope_parameters, Mapping) else {}),
    )
    return dataclasses.replace(
        arch, params=arch.params + tuple(qk_norm_params(arch, arch.head_dim)), extra=extra
    )


#: transformers 5.24 ``Gemma3Config`` defaults (the multimodal model).
GEMMA3_VLM_DEFAULTS: dict[str, Any] = {
    "mm_tokens_per_image": 256,
    "image_token_index": 262_144,
    "boi_token_index": 255_999,
    "eoi_token_index": 256_000,
}


@register_family("gemma3")
def build_gemma3(cfg: Mapping[str, Any]) -> Architecture:
    """Gemma 3 with its vision tower, as ``Gemma3ForConditionalGeneration``: a SigLIP tower
    (architecture/vision.py, ``model.vision_tower.``), the projector (``model.multi_modal_projector.``:
    ``mm_soft_emb_norm`` Gemma RMSNorm [h_v] and ``mm_input_projection_weight`` [h_v, h_t], after an average pool
    of the patch grid down to ``mm_tokens_per_image`` tokens per image) and the ``text_config`` language model as
    ``gemma3_text`` builds it (``model.language_model.``, its lm_head tied by default). The model applies no final
    logit softcapping (``Gemma3ForConditionalGeneration`` never reads it). Trained as Gemma 3's processor feeds it,
    with ``token_type_ids``: image tokens attend to each other both ways, so every layer gets an explicit mask
    (engine/activations/attention.py: SDPA keeps the additive mask and k, v repeated to all heads, per layer)."""
    d = GEMMA3_VLM_DEFAULTS
    text_cfg, vision_cfg = sub_config(cfg, "text_config"), sub_config(cfg, "vision_config")
    v_type = vision_cfg.get("model_type", "siglip_vision_model")
    if v_type != "siglip_vision_model":
        raise ScenarioError(
            "model.vision_config.model_type", f"{v_type!r}: Gemma 3's tower is siglip_vision_model"
        )
    with errors_under("text_config"):
        lm = build_gemma3_text({**text_cfg, "model_type": "gemma3_text"})
    with errors_under("vision_config"):
        v_groups, tower = siglip_vision_tower(vision_cfg, "model.vision_tower.")
    tokens = read_int(cfg, "mm_tokens_per_image", d["mm_tokens_per_image"])
    side, grid = math.isqrt(tokens), tower.patches.image_size // tower.patches.patch_size
    if side * side != tokens or grid % side:
        raise ScenarioError(
            "model.mm_tokens_per_image",
            f"must be a square whose side divides the {grid} x {grid} patch grid (the average pool), got {tokens}",
        )
    h_v, h_t = tower.hidden_size, lm.hidden_size
    pj = "model.multi_modal_projector."
    projector = [
        ParamGroup(pj + "mm_soft_emb_norm.weight", "norm", (h_v,), scope="pre", stack="projector"),
        ParamGroup(pj + "mm_input_projection_weight", "mlp", (h_v, h_t), scope="pre", stack="projector"),
    ]
    lm_groups = [
        dataclasses.replace(g, name="model.language_model." + g.name.removeprefix("model."))
        if g.name.startswith("model.")
        else g
        for g in lm.params
    ]
    return dataclasses.replace(
        lm,
        model_type="gemma3",
        params=tuple(v_groups + projector + lm_groups),
        extra=lm.extra_with(
            hf_class="Gemma3ForConditionalGeneration",
            final_logit_softcapping=None,
            vision={
                "kind": "gemma3",
                "tower": tower,
                "layers_used": tower.num_layers,
                "tokens_per_image": tokens,
                "images_default": 1,
                "freeze_default": True,
                "projector": {"in": h_v, "hidden": h_t, "pool": (grid // side) ** 2},
                "image_token_index": cfg.get("image_token_index", d["image_token_index"]),
                "image_mask_all_layers": True,  # token_type_ids: bidirectional image blocks, a mask in every layer
            },
        ),
    )
