"""CLIP (``CLIPModel``, transformers 5.24 ``models/clip/modeling_clip.py``): a text tower and a vision tower trained
with the contrastive loss. The encoder layer and the vision tower, which LLaVA embeds too, are in
architecture/vision.py.

Both towers stack the same pre-LayerNorm block, ``x + self_attn(layer_norm1(x))`` then ``x + mlp(layer_norm2(x))``,
per layer ``encoder.layers.*.``:

- ``self_attn.q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj`` [h, h], each with a bias;
- ``layer_norm1`` / ``layer_norm2`` (LayerNorm weight and bias) [h];
- ``mlp.fc1`` [I, h] + bias, ``mlp.fc2`` [h, I] + bias, ``hidden_act`` between them (``quick_gelu`` by default).

Text tower (``text_model.``): ``embeddings.token_embedding`` [V, h], ``embeddings.position_embedding``
[max_position_embeddings, h], the layers under a causal mask, ``final_layer_norm``; the pooled row is the EOS
token's. Vision tower (``vision_model.``): ``embeddings.class_embedding`` [h], ``embeddings.patch_embedding``
(Conv2d [h, C, p, p], no bias), ``embeddings.position_embedding`` [(image/p)^2 + 1, h], ``pre_layrnorm``, the
layers, ``post_layernorm`` (on the CLS row only). ``CLIPModel`` adds ``visual_projection`` [proj, h_v] and
``text_projection`` [proj, h_t] (no bias) and the scalar ``logit_scale``.

The engine's layers are the text tower's (``seq_len`` is the text length, at most max_position_embeddings); the
vision tower is a second stack (``facts.vision``) whose saved tensors engine/multimodal/tower.py adds per micro-batch of
b images. Structural keys of both sub-configs are required (as for every family), the rest default as
``CLIPTextConfig`` / ``CLIPVisionConfig`` do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_head_dim, read_int
from memsim_widget.architecture.layers import linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.architecture.vision import (
    TOWER_REQUIRED,
    clip_encoder_layers,
    clip_vision_tower,
    errors_under,
    sub_config,
    tower_architecture,
)

#: transformers 5.24 ``CLIPTextConfig`` defaults for the non-structural keys.
CLIP_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 49408,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0,
}
CLIP_DEFAULTS: dict[str, Any] = {"projection_dim": 512}


def _text_tower(cfg: Mapping[str, Any], prefix: str) -> tuple[list[ParamGroup], int, int]:
    d = CLIP_TEXT_DEFAULTS
    h, L, heads, inter = (read_int(cfg, k) for k in TOWER_REQUIRED)
    read_head_dim(cfg, h, heads)
    vocab = read_int(cfg, "vocab_size", d["vocab_size"])
    pos = read_int(cfg, "max_position_embeddings", d["max_position_embeddings"])
    S = "decoder"
    groups = [
        ParamGroup(
            prefix + "embeddings.token_embedding.weight", "embedding", (vocab, h), scope="pre", stack=S
        ),
        ParamGroup(
            prefix + "embeddings.position_embedding.weight", "position", (pos, h), scope="pre", stack=S
        ),
    ]
    groups += clip_encoder_layers(prefix + "encoder.layers.*.", h, inter, L, stack=S)
    groups += norm_params(prefix, ("final_layer_norm",), h, 1, bias=True, scope="post", stack=S)
    return groups, vocab, pos


@register_family("clip")
def build_clip(cfg: Mapping[str, Any]) -> Architecture:
    """``CLIPModel`` trained with its contrastive loss (``return_loss=True``): both towers, both projections and
    ``logit_scale``. The engine's layers are the text tower's; the vision tower rides in ``facts.vision``."""
    text_cfg = sub_config(cfg, "text_config", "clip_text_model")
    vision_cfg = sub_config(cfg, "vision_config", "clip_vision_model")
    proj = read_int(cfg, "projection_dim", CLIP_DEFAULTS["projection_dim"])
    with errors_under("text_config"):
        t_groups, vocab, pos = _text_tower(text_cfg, "text_model.")
        t_arch = tower_architecture("clip", text_cfg, t_groups, causal=True, seq=None)
    with errors_under("vision_config"):
        v_groups, tower = clip_vision_tower(vision_cfg, "vision_model.")
    heads_ = [
        *linear_params("visual_projection", "head", proj, tower.hidden_size, bias=False, parallel=None,
                 module="visual_projection", scope="post", stack="vision"),
        *linear_params("text_projection", "head", proj, t_arch.hidden_size, bias=False, parallel=None,
                 module="text_projection", scope="post"),
        ParamGroup("logit_scale", "head", (), scope="post"),
    ]  # fmt: skip
    return dataclasses.replace(
        t_arch,
        model_type="clip",
        params=tuple(t_groups + v_groups + heads_),
        max_seq_len=pos,
        extra=t_arch.extra_with(
            hf_class="CLIPModel",
            text_vocab_size=vocab,
            projection_dim=proj,
            vision={
                "kind": "clip",
                "tower": tower,
                "layers_used": tower.num_layers,
                "tokens_per_image": 0,  # the towers meet only in the b x b logits
                "images_default": 1,
                "freeze_default": False,  # contrastive training trains both towers
                "projector": None,
            },
        ),
    )
