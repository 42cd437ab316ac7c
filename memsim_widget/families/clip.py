"""CLIP (``CLIPModel``, transformers 5.24 ``models/clip/modeling_clip.py``): a text tower and a vision tower trained
with the contrastive loss, plus the CLIP vision tower other models embed (LLaVA, families/llava.py).

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
vision tower is a second stack (``extra["vision"]``) whose saved tensors engine/vision.py adds per micro-batch of
b images. Structural keys of both sub-configs are required (as for every family), the rest default as
``CLIPTextConfig`` / ``CLIPVisionConfig`` do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture import (
    Architecture,
    ParamGroup,
    _activation,
    _float,
    _head_dim,
    _int,
    _linear,
    _norms,
    _square,
    _str,
    register_family,
)
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``CLIPTextConfig`` defaults for the non-structural keys.
CLIP_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 49408,
    "max_position_embeddings": 77,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0,
}
#: ... and ``CLIPVisionConfig``'s.
CLIP_VISION_DEFAULTS: dict[str, Any] = {
    "image_size": 224,
    "patch_size": 32,
    "num_channels": 3,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0,
}
CLIP_DEFAULTS: dict[str, Any] = {"projection_dim": 512}

_TOWER_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def _sub(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    sub = cfg.get(key)
    if not isinstance(sub, Mapping):
        raise ScenarioError(f"model.{key}", "is required (a mapping with the tower's sizes)")
    return sub


def _where(err: ScenarioError, key: str) -> ScenarioError:
    """The same error, its field moved under ``model.<key>.`` (sub-config keys are read as ``model.x``)."""
    field = err.field.removeprefix("model.")
    return ScenarioError(f"model.{key}.{field}", err.message)


def encoder_layers(
    prefix: str, h: int, inter: int, L: int, *, stack: str, scope: str = "layer"
) -> list[ParamGroup]:
    """The parameter groups of ``L`` CLIP encoder layers under ``prefix`` (``...encoder.layers.*.``)."""
    groups: list[ParamGroup] = []
    for name in ("q_proj", "k_proj", "v_proj"):
        groups += _linear(
            prefix + f"self_attn.{name}", "attention", h, h,
            bias=True, parallel=None, module=name, count=L, stack=stack, scope=scope,
        )  # fmt: skip
    groups += _linear(
        prefix + "self_attn.out_proj", "attention", h, h,
        bias=True, parallel=None, module="out_proj", count=L, stack=stack, scope=scope,
    )  # fmt: skip
    groups += _norms(prefix, ("layer_norm1", "layer_norm2"), h, L, bias=True, stack=stack, scope=scope)
    groups += _linear(
        prefix + "mlp.fc1", "mlp", inter, h,
        bias=True, parallel=None, module="fc1", count=L, stack=stack, scope=scope,
    )  # fmt: skip
    groups += _linear(
        prefix + "mlp.fc2", "mlp", h, inter,
        bias=True, parallel=None, module="fc2", count=L, stack=stack, scope=scope,
    )  # fmt: skip
    return groups


def _tower_arch(
    family: str,
    cfg: Mapping[str, Any],
    groups: list[ParamGroup],
    *,
    causal: bool,
    seq: int | None,
    **extra: Any,
) -> Architecture:
    h, L, heads, inter = (_int(cfg, k) for k in _TOWER_REQUIRED)
    d = _head_dim(cfg, h, heads)
    act = _str(cfg, "hidden_act", "quick_gelu")
    return Architecture(
        family=family,
        model_type=family,
        hidden_size=h,
        num_layers=L,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d,
        intermediate_size=inter,
        vocab_size=0,
        tied_embeddings=False,
        params=tuple(groups),
        mlp_activation=_activation("hidden_act", act, gated=False),
        norm="layernorm",
        position="learned",
        attention_dropout=_float(cfg, "attention_dropout", 0.0),
        encoder_layers=0 if causal else L,
        decoder_layers=L if causal else 0,
        causal=causal,
        fixed_seq_len=seq,
        extra={"norms_per_layer": 2, "use_cache": False, "hf_class": family, **extra},
    )


def clip_vision_tower(
    cfg: Mapping[str, Any], prefix: str, *, scope: str = "pre"
) -> tuple[list[ParamGroup], Architecture]:
    """The CLIP vision tower's parameter groups under ``prefix`` (``vision_model.``, LLaVA's
    ``model.vision_tower.``) with ``scope`` (``pre``: before the language model's layers), and the tower as an
    Architecture of its own (its layers at scope ``layer``) that engine/vision.py runs the activation rules on."""
    d = CLIP_VISION_DEFAULTS
    h, L, heads, inter = (_int(cfg, k) for k in _TOWER_REQUIRED)
    _head_dim(cfg, h, heads)
    image = _square(cfg, "image_size", d["image_size"])
    patch = _square(cfg, "patch_size", d["patch_size"])
    channels = _int(cfg, "num_channels", d["num_channels"])
    if image % patch:
        raise ScenarioError("model.patch_size", f"{patch} does not divide image_size {image}")
    n = (image // patch) ** 2
    S = "vision"

    def groups(layer_scope: str) -> list[ParamGroup]:
        out = [
            ParamGroup(prefix + "embeddings.class_embedding", "embedding", (h,), scope=scope, stack=S),
            ParamGroup(
                prefix + "embeddings.patch_embedding.weight",
                "embedding",
                (h, channels, patch, patch),
                scope=scope,
                stack=S,
            ),
            ParamGroup(
                prefix + "embeddings.position_embedding.weight", "position", (n + 1, h), scope=scope, stack=S
            ),
        ]
        out += _norms(prefix, ("pre_layrnorm",), h, 1, bias=True, scope=scope, stack=S)
        out += encoder_layers(prefix + "encoder.layers.*.", h, inter, L, stack=S, scope=layer_scope)
        out += _norms(prefix, ("post_layernorm",), h, 1, bias=True, scope=scope, stack=S)
        return out

    tower = _tower_arch(
        "clip_vision",
        cfg,
        groups("layer"),
        causal=False,
        seq=n + 1,
        image_size=image,
        patch_size=patch,
        num_channels=channels,
        num_patches=n,
        softmax_in_compute_dtype=False,
    )
    return groups(scope), tower


def _text_tower(cfg: Mapping[str, Any], prefix: str) -> tuple[list[ParamGroup], int, int]:
    d = CLIP_TEXT_DEFAULTS
    h, L, heads, inter = (_int(cfg, k) for k in _TOWER_REQUIRED)
    _head_dim(cfg, h, heads)
    vocab = _int(cfg, "vocab_size", d["vocab_size"])
    pos = _int(cfg, "max_position_embeddings", d["max_position_embeddings"])
    S = "decoder"
    groups = [
        ParamGroup(
            prefix + "embeddings.token_embedding.weight", "embedding", (vocab, h), scope="pre", stack=S
        ),
        ParamGroup(
            prefix + "embeddings.position_embedding.weight", "position", (pos, h), scope="pre", stack=S
        ),
    ]
    groups += encoder_layers(prefix + "encoder.layers.*.", h, inter, L, stack=S)
    groups += _norms(prefix, ("final_layer_norm",), h, 1, bias=True, scope="post", stack=S)
    return groups, vocab, pos


@register_family("clip")
def build_clip(cfg: Mapping[str, Any]) -> Architecture:
    """``CLIPModel`` trained with its contrastive loss (``return_loss=True``): both towers, both projections and
    ``logit_scale``. The engine's layers are the text tower's; the vision tower rides in ``extra["vision"]``."""
    text_cfg, vision_cfg = _sub(cfg, "text_config"), _sub(cfg, "vision_config")
    proj = _int(cfg, "projection_dim", CLIP_DEFAULTS["projection_dim"])
    try:
        t_groups, vocab, pos = _text_tower(text_cfg, "text_model.")
        t_arch = _tower_arch("clip", text_cfg, t_groups, causal=True, seq=None)
    except ScenarioError as e:
        raise _where(e, "text_config") from None
    try:
        v_groups, tower = clip_vision_tower(vision_cfg, "vision_model.")
    except ScenarioError as e:
        raise _where(e, "vision_config") from None
    heads_ = [
        *_linear("visual_projection", "head", proj, tower.hidden_size, bias=False, parallel=None,
                 module="visual_projection", scope="post", stack="vision"),
        *_linear("text_projection", "head", proj, t_arch.hidden_size, bias=False, parallel=None,
                 module="text_projection", scope="post"),
        ParamGroup("logit_scale", "head", (), scope="post"),
    ]  # fmt: skip
    return dataclasses.replace(
        t_arch,
        model_type="clip",
        params=tuple(t_groups + v_groups + heads_),
        max_seq_len=pos,
        extra={
            **t_arch.extra,
            "hf_class": "CLIPModel",
            "text_vocab_size": vocab,
            "projection_dim": proj,
            "vision": {
                "kind": "clip",
                "tower": tower,
                "layers_used": tower.num_layers,
                "tokens_per_image": 0,  # the towers meet only in the b x b logits
                "images_default": 1,
                "freeze_default": False,  # contrastive training trains both towers
                "projector": None,
            },
        },
    )
