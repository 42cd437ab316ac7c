"""The SigLIP vision tower (``SiglipVisionModel``, transformers 5.24 ``models/siglip/modeling_siglip.py``) as
multimodal models embed it (Gemma 3, families/gemma3.py): CLIP's encoder layer (families/clip.py) without a CLS
token or ``pre_layrnorm``.

Parameter tensors under ``<prefix>vision_model.``: ``embeddings.patch_embedding`` (Conv2d [h, C, p, p] with a bias),
``embeddings.position_embedding`` [(image/p)^2, h], the layers (``encoder.layers.*.``: q/k/v/out_proj, layer_norm1/2,
fc1/fc2, all with biases; ``hidden_act`` gelu_pytorch_tanh, one op that saves its input), and ``post_layernorm``,
applied to every patch row (the output the projector reads). The attention-pooling head (``vision_use_head``,
default true in ``SiglipVisionConfig``) is not simulated: its config must say false, as Gemma 3's does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture import (
    Architecture,
    ParamGroup,
    _bool,
    _head_dim,
    _int,
    _norms,
    _square,
    _str,
)
from memsim_widget.errors import ScenarioError
from memsim_widget.families.clip import _TOWER_REQUIRED, _tower_arch, encoder_layers

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
    h, L, heads, inter = (_int(cfg, k) for k in _TOWER_REQUIRED)
    _head_dim(cfg, h, heads)
    image = _square(cfg, "image_size", d["image_size"])
    patch = _square(cfg, "patch_size", d["patch_size"])
    channels = _int(cfg, "num_channels", d["num_channels"])
    act = _str(cfg, "hidden_act", d["hidden_act"])
    if act not in _ONE_OP:
        raise ScenarioError(
            "model.hidden_act", f"{act!r} is not simulated for SigLIP; supported: {', '.join(_ONE_OP)}"
        )
    if _bool(cfg, "vision_use_head", d["vision_use_head"]):
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
        out += encoder_layers(p + "encoder.layers.*.", h, inter, L, stack=S, scope=layer_scope)
        out += _norms(p, ("post_layernorm",), h, 1, bias=True, scope=scope, stack=S)
        return out

    tower = _tower_arch(
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
