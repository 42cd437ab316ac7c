"""The vision towers multimodal families embed, and the helpers for their sub-configs.

CLIP's encoder layer (``clip_encoder_layers``), ``x + self_attn(layer_norm1(x))`` then ``x + mlp(layer_norm2(x))``,
per layer ``encoder.layers.*.``: ``self_attn.q_proj`` / ``k_proj`` / ``v_proj`` / ``out_proj`` [h, h] and
``mlp.fc1`` [I, h] / ``mlp.fc2`` [h, I], each with a bias, and ``layer_norm1`` / ``layer_norm2``. Two towers stack
it:

- ``clip_vision_tower``: ``CLIPVisionModel`` (transformers 5.24 ``models/clip/modeling_clip.py``), CLIP's own
  (families/clip.py) and LLaVA's (families/llava.py): ``embeddings.class_embedding`` [h],
  ``embeddings.patch_embedding`` (Conv2d [h, C, p, p], no bias), ``embeddings.position_embedding``
  [(image/p)^2 + 1, h], ``pre_layrnorm``, the layers, ``post_layernorm``.
- ``siglip_vision_tower``: ``SiglipVisionModel`` (``models/siglip/modeling_siglip.py``) as Gemma 3 embeds it
  (families/gemma3.py), without a CLS token or ``pre_layrnorm``: under ``<prefix>vision_model.``,
  ``embeddings.patch_embedding`` (Conv2d [h, C, p, p] with a bias), ``embeddings.position_embedding``
  [(image/p)^2, h], the layers (``hidden_act`` gelu_pytorch_tanh, one op that saves its input), and
  ``post_layernorm``, applied to every patch row (the output the projector reads). The attention-pooling head
  (``vision_use_head``, default true in ``SiglipVisionConfig``) is not simulated: its config must say false, as
  Gemma 3's does.

Each returns the tower's parameter groups at the scope the model places them and the tower as an Architecture of
its own (its layers at scope ``layer``), which engine/multimodal/tower.py runs the activation rules on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from memsim_widget.architecture.config_keys import (
    read_bool,
    read_head_dim,
    read_int,
    read_probability,
    read_square,
    read_str,
)
from memsim_widget.architecture.layers import activation_label, linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``CLIPVisionConfig`` defaults for the non-structural keys.
CLIP_VISION_DEFAULTS: dict[str, Any] = {
    "image_size": 224,
    "patch_size": 32,
    "num_channels": 3,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
    "attention_dropout": 0.0,
}

TOWER_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


#: transformers 5.24 config classes' structural defaults (``LlamaConfig()``, ``MistralConfig()``, ``Qwen2Config()``,
#: ``CLIPVisionConfig()``, ``CLIPTextConfig()``), which a composite config gives a sub-config that omits them:
#: transformers builds each sub-config from its class (``LlavaConfig(text_config={"model_type": "llama",
#: "vocab_size": 32064})`` has LlamaConfig's hidden_size 4096), as LLaVA-1.5's published config.json relies on.
#: Only inside a sub-config: a model's own top-level config still names them (architecture/config_keys.py).
SUBCONFIG_STRUCTURE: dict[str, dict[str, int]] = {
    "llama": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
              "vocab_size": 32000},
    "mistral": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "intermediate_size": 14336, "vocab_size": 32000, "num_key_value_heads": 8},
    "qwen2": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 22016,
              "vocab_size": 151936},
    "clip_vision_model": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                          "intermediate_size": 3072},
    "clip_text_model": {"hidden_size": 512, "num_hidden_layers": 12, "num_attention_heads": 8,
                        "intermediate_size": 2048, "vocab_size": 49408},
}  # fmt: skip

#: Parameter-name parts of each one's vision tower (frozen under ``freeze_vision``, kept free of LoRA adapters).
VISION_MODULES = {
    "clip": ("vision_model", "visual_projection"),
    "llava": ("vision_tower",),
    "gemma3": ("vision_tower",),
    # Qwen2-VL / Qwen2.5-VL: the patch embedding and blocks (the merger trains with the language model)
    "qwen2_vl": ("visual.patch_embed", "visual.blocks"),
    "qwen2_5_vl": ("visual.patch_embed", "visual.blocks"),
    "llava_next": ("vision_tower",),
    "llama4": ("vision_model",),  # the tower with its pixel-shuffle adapter
}
#: Parameter-name parts of each one's projector (with the tower: what ``lora.target_scope`` "language" keeps free
#: of adapters).
PROJECTOR_MODULES = {
    "clip": (),
    "llava": ("multi_modal_projector",),
    "gemma3": ("multi_modal_projector",),
    "qwen2_vl": ("visual.merger",),
    "qwen2_5_vl": ("visual.merger",),
    "llava_next": ("multi_modal_projector", "image_newline"),
    "llama4": ("multi_modal_projector",),
}


def sub_config(cfg: Mapping[str, Any], key: str, default_type: str | None = None) -> Mapping[str, Any]:
    """A multimodal config's sub-config (``text_config``, ``vision_config``), which must be a mapping; the
    structural keys it omits take its config class's defaults (``SUBCONFIG_STRUCTURE``, by its ``model_type``,
    else ``default_type``: the composite's own default, e.g. LLaVA's llama text model), as transformers fills them."""
    sub = cfg.get(key)
    if not isinstance(sub, Mapping):
        raise ScenarioError(f"model.{key}", "is required (a mapping with the tower's sizes)")
    kind = sub.get("model_type", default_type)
    missing = {k: v for k, v in SUBCONFIG_STRUCTURE.get(str(kind), {}).items() if sub.get(k) is None}
    return {**sub, **missing} if missing else sub


def error_under(err: ScenarioError, key: str) -> ScenarioError:
    """The same error, its field moved under ``model.<key>.`` (sub-config keys are read as ``model.x``)."""
    field = err.field.removeprefix("model.")
    return ScenarioError(f"model.{key}.{field}", err.message)


@contextlib.contextmanager
def errors_under(key: str) -> Iterator[None]:
    """Inside the block (reading a sub-config), a ScenarioError is raised again with its field under
    ``model.<key>.`` (``error_under``)."""
    try:
        yield
    except ScenarioError as e:
        raise error_under(e, key) from None


def clip_encoder_layers(
    prefix: str, h: int, inter: int, L: int, *, stack: str, scope: str = "layer"
) -> list[ParamGroup]:
    """The parameter groups of ``L`` CLIP encoder layers under ``prefix`` (``...encoder.layers.*.``)."""
    groups: list[ParamGroup] = []
    for name in ("q_proj", "k_proj", "v_proj"):
        groups += linear_params(
            prefix + f"self_attn.{name}", "attention", h, h,
            bias=True, parallel=None, module=name, count=L, stack=stack, scope=scope,
        )  # fmt: skip
    groups += linear_params(
        prefix + "self_attn.out_proj", "attention", h, h,
        bias=True, parallel=None, module="out_proj", count=L, stack=stack, scope=scope,
    )  # fmt: skip
    groups += norm_params(prefix, ("layer_norm1", "layer_norm2"), h, L, bias=True, stack=stack, scope=scope)
    groups += linear_params(
        prefix + "mlp.fc1", "mlp", inter, h,
        bias=True, parallel=None, module="fc1", count=L, stack=stack, scope=scope,
    )  # fmt: skip
    groups += linear_params(
        prefix + "mlp.fc2", "mlp", h, inter,
        bias=True, parallel=None, module="fc2", count=L, stack=stack, scope=scope,
    )  # fmt: skip
    return groups


def tower_architecture(
    family: str,
    cfg: Mapping[str, Any],
    groups: list[ParamGroup],
    *,
    causal: bool,
    seq: int | None,
    **extra: Any,
) -> Architecture:
    h, L, heads, inter = (read_int(cfg, k) for k in TOWER_REQUIRED)
    d = read_head_dim(cfg, h, heads)
    act = read_str(cfg, "hidden_act", "quick_gelu")
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
        mlp_activation=activation_label("hidden_act", act, gated=False),
        norm="layernorm",
        position="learned",
        attention_dropout=read_probability(cfg, "attention_dropout", 0.0),
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
    Architecture of its own (its layers at scope ``layer``) that engine/multimodal/tower.py runs the activation rules on."""
    d = CLIP_VISION_DEFAULTS
    h, L, heads, inter = (read_int(cfg, k) for k in TOWER_REQUIRED)
    read_head_dim(cfg, h, heads)
    image = read_square(cfg, "image_size", d["image_size"])
    patch = read_square(cfg, "patch_size", d["patch_size"])
    channels = read_int(cfg, "num_channels", d["num_channels"])
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
        out += norm_params(prefix, ("pre_layrnorm",), h, 1, bias=True, scope=scope, stack=S)
        out += clip_encoder_layers(prefix + "encoder.layers.*.", h, inter, L, stack=S, scope=layer_scope)
        out += norm_params(prefix, ("post_layernorm",), h, 1, bias=True, scope=scope, stack=S)
        return out

    tower = tower_architecture(
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


#: transformers 5.24 ``SiglipVisionConfig`` defaults for the non-structural keys.
SIGLIP_VISION_DEFAULTS: dict[str, Any] = {
    "image_size": 224,
    "patch_size": 16,
    "num_channels": 3,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
    "attention_dropout": 0.0,
    "vision_use_head": True,
}
#: HF activations that are one PyTorch op saving only their input (``ACT2FN`` -> ``nn.functional.gelu``).
_ONE_OP = {"gelu_pytorch_tanh": "gelu", "gelu": "gelu"}


def siglip_vision_tower(
    cfg: Mapping[str, Any], prefix: str, *, scope: str = "pre"
) -> tuple[list[ParamGroup], Architecture]:
    """SigLIP's parameter groups under ``prefix`` at ``scope``, and the tower as an Architecture of its own."""
    d = SIGLIP_VISION_DEFAULTS
    h, L, heads, inter = (read_int(cfg, k) for k in TOWER_REQUIRED)
    read_head_dim(cfg, h, heads)
    image = read_square(cfg, "image_size", d["image_size"])
    patch = read_square(cfg, "patch_size", d["patch_size"])
    channels = read_int(cfg, "num_channels", d["num_channels"])
    act = read_str(cfg, "hidden_act", d["hidden_act"])
    if act not in _ONE_OP:
        raise ScenarioError(
            "model.hidden_act", f"{act!r} is not simulated for SigLIP; supported: {', '.join(_ONE_OP)}"
        )
    if read_bool(cfg, "vision_use_head", d["vision_use_head"]):
        raise ScenarioError(
            "model.vision_use_head",
            "the attention-pooling head is not simulated: set it to false (Gemma 3's published config does)",
        )
    if image % patch:
        raise ScenarioError("model.patch_size", f"{patch} does not divide image_size {image}")
    n = (image // patch) ** 2
    p = prefix + "vision_model."
    S = "vision"

    def groups(layer_scope: str) -> list[ParamGroup]:
        out = [
            ParamGroup(p + "embeddings.patch_embedding.weight", "embedding", (h, channels, patch, patch), scope=scope, stack=S),
            ParamGroup(p + "embeddings.patch_embedding.bias", "embedding", (h,), scope=scope, stack=S),
            ParamGroup(p + "embeddings.position_embedding.weight", "position", (n, h), scope=scope, stack=S),
        ]  # fmt: skip
        out += clip_encoder_layers(p + "encoder.layers.*.", h, inter, L, stack=S, scope=layer_scope)
        out += norm_params(p, ("post_layernorm",), h, 1, bias=True, scope=scope, stack=S)
        return out

    tower = tower_architecture(
        "siglip_vision",
        {**cfg, "hidden_act": "gelu"},  # one op: saves its input only
        groups("layer"),
        causal=False,
        seq=n,
        image_size=image,
        patch_size=patch,
        num_channels=channels,
        num_patches=n,
        hidden_act=act,
    )
    return groups(scope), tower
