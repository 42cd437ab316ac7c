"""LLaVA (``LlavaForConditionalGeneration``, transformers 5.24 ``models/llava/modeling_llava.py``): a CLIP vision
tower, a two-Linear projector and a decoder language model.

Parameter tensors: ``model.vision_tower.*`` (``CLIPVisionModel``, architecture/vision.py, post_layernorm included
though LLaVA never reads it), ``model.multi_modal_projector.linear_1`` [h_t, h_v x feature layers] and
``linear_2`` [h_t, h_t] (each with a bias unless ``multimodal_projector_bias`` is false; ``projector_hidden_act``
between them, gelu by default), and the language model of ``text_config`` (``model.language_model.*`` and
``lm_head``) exactly as its own family builds it (llama, mistral, qwen2).

Forward: the tower runs every layer with ``output_hidden_states``; the projector reads hidden state
``vision_feature_layer`` (default -2: the last layer's output is computed and discarded), less the CLS row under
``vision_feature_select_strategy`` "default", so each image adds (image/patch)^2 tokens (+1 under "full") to the
text sequence, scattered into the embeddings at the image-token positions (``masked_scatter``). The engine's
sequence is therefore ``seq_len`` text tokens + ``images_per_sample`` x those tokens (engine/context.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool, read_str
from memsim_widget.architecture.layers import activation_label, linear_params
from memsim_widget.architecture.types import FAMILIES, Architecture, ParamGroup, register_family
from memsim_widget.architecture.vision import clip_vision_tower, errors_under, sub_config
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``LlavaConfig`` defaults.
LLAVA_DEFAULTS: dict[str, Any] = {
    "image_token_index": 32000,
    "projector_hidden_act": "gelu",
    "vision_feature_select_strategy": "default",
    "vision_feature_layer": -2,
    "multimodal_projector_bias": True,
}
#: Language models whose builders LLaVA's text_config may name (transformers builds any; these are traced).
TEXT_TYPES = ("llama", "mistral", "qwen2")
VISION_TYPES = ("clip_vision_model",)


def _feature_layers(cfg: Mapping[str, Any], layers: int) -> tuple[int, ...]:
    """The tower's hidden states the projector reads, as indices into ``hidden_states`` (0 = the embeddings)."""
    given = cfg.get("vision_feature_layer", LLAVA_DEFAULTS["vision_feature_layer"])
    items = given if isinstance(given, list | tuple) else [given]
    out = []
    for k in items:
        if isinstance(k, bool) or not isinstance(k, int) or not -(layers + 1) <= k <= layers or not items:
            raise ScenarioError(
                "model.vision_feature_layer",
                f"must be an index (or a list of indices) into the tower's {layers + 1} hidden states, got {given!r}",
            )
        out.append(k % (layers + 1))
    return tuple(out)


def _split_unused(groups: list[ParamGroup], used: int, layers: int) -> list[ParamGroup]:
    out: list[ParamGroup] = []
    for g in groups:
        if ".encoder.layers." in g.name and used < layers:
            each = g.count // layers
            if used:
                out.append(dataclasses.replace(g, count=each * used))
            out.append(dataclasses.replace(g, name=g.name + " (unused layers)", count=each * (layers - used),
                                           stack="vision_unused"))  # fmt: skip
        elif "post_layernorm" in g.name:
            out.append(dataclasses.replace(g, stack="vision_unused"))
        else:
            out.append(g)
    return out


@register_family("llava")
def build_llava(cfg: Mapping[str, Any]) -> Architecture:
    """LLaVA 1.5 as ``LlavaForConditionalGeneration``: CLIP tower + projector + the text_config's decoder."""
    d = LLAVA_DEFAULTS
    text_cfg = sub_config(
        cfg, "text_config", "llama"
    )  # LlavaConfig's defaults: a llama text model, CLIP's tower
    vision_cfg = sub_config(cfg, "vision_config", "clip_vision_model")
    t_type, v_type = text_cfg.get("model_type", "llama"), vision_cfg.get("model_type", "clip_vision_model")
    if t_type not in TEXT_TYPES:
        raise ScenarioError(
            "model.text_config.model_type",
            f"{t_type!r} is not simulated under LLaVA; supported: {', '.join(TEXT_TYPES)}",
        )
    if v_type not in VISION_TYPES:
        raise ScenarioError(
            "model.vision_config.model_type",
            f"{v_type!r} is not simulated (only the CLIP vision tower of LLaVA 1.5 is); supported: {', '.join(VISION_TYPES)}",
        )
    with errors_under("text_config"):
        lm = FAMILIES[t_type]({**text_cfg, "model_type": t_type})
    with errors_under("vision_config"):
        v_groups, tower = clip_vision_tower(vision_cfg, "model.vision_tower.")
    strategy = read_str(cfg, "vision_feature_select_strategy", d["vision_feature_select_strategy"])
    if strategy not in ("default", "full"):
        raise ScenarioError(
            "model.vision_feature_select_strategy", f"must be 'default' or 'full', got {strategy!r}"
        )
    layers = _feature_layers(cfg, tower.num_layers)
    bias = read_bool(cfg, "multimodal_projector_bias", d["multimodal_projector_bias"])
    act = read_str(cfg, "projector_hidden_act", d["projector_hidden_act"])
    h_v, h_t = tower.hidden_size, lm.hidden_size
    pj = "model.multi_modal_projector."
    projector = [
        *linear_params(pj + "linear_1", "mlp", h_t, h_v * len(layers), bias=bias, parallel=None, module="linear_1",
                 scope="pre", stack="projector"),
        *linear_params(pj + "linear_2", "mlp", h_t, h_t, bias=bias, parallel=None, module="linear_2", scope="pre",
                 stack="projector"),
    ]  # fmt: skip
    # the layers after the deepest one read, and post_layernorm, run but get no gradient: the optimizer keeps no
    # state for them (stack "vision_unused", never trained; engine/context.py)
    used = max(layers)
    v_groups = _split_unused(v_groups, used, tower.num_layers)
    lm_groups = [
        dataclasses.replace(g, name="model.language_model." + g.name.removeprefix("model."))
        if g.name.startswith("model.")
        else g
        for g in lm.params
    ]
    n = tower.patches.num_patches + (1 if strategy == "full" else 0)
    return dataclasses.replace(
        lm,
        family="llava",
        model_type="llava",
        params=tuple(v_groups + projector + lm_groups),
        extra=lm.extra_with(
            hf_class="LlavaForConditionalGeneration",
            text_model_type=t_type,
            text_family=lm.family,
            vision={
                "kind": "llava",
                "tower": tower,
                # hidden state k is the output of layer k: the layers after the deepest one read are run but
                # their output is dropped (what they saved is freed when get_image_features returns)
                "layers_used": max(layers),
                "tokens_per_image": n,
                "images_default": 1,
                "freeze_default": True,  # LLaVA's recipes keep the CLIP tower frozen
                "projector": {
                    "in": h_v * len(layers),
                    "hidden": h_t,
                    "activation": activation_label("projector_hidden_act", act, gated=False),
                    "bias": bias,
                },
                "image_token_index": cfg.get("image_token_index", d["image_token_index"]),
                "vision_feature_select_strategy": strategy,
                "vision_feature_layer": cfg.get("vision_feature_layer", d["vision_feature_layer"]),
            },
        ),
    )
