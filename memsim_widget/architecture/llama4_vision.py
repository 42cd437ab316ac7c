"""Llama 4's vision tower (``Llama4VisionModel``, transformers 5.24 ``models/llama4/modeling_llama4.py``).

Under ``<prefix>`` (``vision_model.`` in ``Llama4ForConditionalGeneration``): ``patch_embedding.linear`` [h, C p p]
(an Unfold then a Linear, no bias), ``class_embedding`` [h] (appended after the patches), ``positional_embedding_vlm``
[(image/p)^2 + 1, h], ``layernorm_pre`` and ``layernorm_post`` (LayerNorms with biases), and per layer
``model.layers.*.``: ``self_attn.{q,k,v,o}_proj`` [h, h] with biases (2D RoPE from a complex buffer: no weights),
``mlp.fc1`` [I, h] / ``mlp.fc2`` [h, I] with biases (``nn.GELU``), ``input_layernorm`` / ``post_attention_layernorm``.
Then the vision adapter (``vision_adapter.mlp``): a pixel shuffle by ``pixel_shuffle_ratio`` r turns the
(image/p)^2 patch rows of width h into (image/p)^2 r^2 rows of width h / r^2, which ``fc1`` [projector_input_dim,
h / r^2] (Llama4VisionMLP2 reads it as ``intermediate_size``) and ``fc2`` [projector_output_dim,
projector_output_dim] map, each followed by GELU, no biases.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_int, read_square
from memsim_widget.architecture.layers import linear_params, norm_params
from memsim_widget.architecture.types import Architecture, ParamGroup
from memsim_widget.architecture.vision import tower_architecture
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``Llama4VisionConfig`` defaults (the published checkpoints set image_size 336 and
#: vision_output_dim 4096).
LLAMA4_VISION_DEFAULTS: dict[str, Any] = {
    "hidden_size": 768,
    "hidden_act": "gelu",
    "num_hidden_layers": 34,
    "num_attention_heads": 16,
    "num_channels": 3,
    "intermediate_size": 5632,
    "vision_output_dim": 7680,
    "image_size": 448,
    "patch_size": 14,
    "pixel_shuffle_ratio": 0.5,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
    "vision_feature_layer": -1,
}


def shuffle_ratio(cfg: Mapping[str, Any]) -> float:
    """``pixel_shuffle_ratio``: a float in (0, 1] whose inverse square is an integer (0.5 -> 4 patches per row)."""
    r = cfg.get("pixel_shuffle_ratio", LLAMA4_VISION_DEFAULTS["pixel_shuffle_ratio"])
    if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r <= 1 or (1 / r**2) % 1:
        raise ScenarioError(
            "model.pixel_shuffle_ratio", f"must be 1/k for an integer k (0.5, 0.25), got {r!r}"
        )
    return float(r)


def llama4_vision_tower(
    cfg: Mapping[str, Any], prefix: str, *, scope: str = "pre"
) -> tuple[list[ParamGroup], Architecture, dict[str, int]]:
    """The tower's and adapter's parameter groups under ``prefix`` at ``scope``, the tower as an Architecture of
    its own (its layers at scope ``layer``), and the adapter's sizes: ``rows`` per image (tile) it outputs,
    ``shuffled`` (fc1's input width), ``inner`` (fc1's output), ``out`` (fc2's output)."""
    full = {**LLAMA4_VISION_DEFAULTS, **cfg}
    d = LLAMA4_VISION_DEFAULTS
    h = read_int(full, "hidden_size")
    L = read_int(full, "num_hidden_layers")
    heads = read_int(full, "num_attention_heads")
    inter = read_int(full, "intermediate_size")
    if h % heads:
        raise ScenarioError("model.num_attention_heads", f"{heads} does not divide hidden_size {h}")
    image = read_square(full, "image_size", d["image_size"])
    patch = read_square(full, "patch_size", d["patch_size"])
    channels = read_int(full, "num_channels", d["num_channels"])
    if image % patch:
        raise ScenarioError("model.patch_size", f"{patch} does not divide image_size {image}")
    side = image // patch
    r = shuffle_ratio(full)
    k = round(1 / r**2)
    if (side * r) % 1 or h * k != inter:
        raise ScenarioError(
            "model.pixel_shuffle_ratio", f"{r} must split the {side} x {side} patch grid evenly and give rows of "
            f"hidden_size / ratio^2 = {h * k}, which Llama4VisionMLP2 reads as intermediate_size ({inter})",
        )  # fmt: skip
    p_in = read_int(full, "projector_input_dim")
    p_out = read_int(full, "projector_output_dim")
    n = side * side
    S = "vision"

    def groups(layer_scope: str) -> list[ParamGroup]:
        out = [
            ParamGroup(prefix + "class_embedding", "embedding", (h,), scope=scope, stack=S),
            ParamGroup(prefix + "positional_embedding_vlm", "position", (n + 1, h), scope=scope, stack=S),
            ParamGroup(prefix + "patch_embedding.linear.weight", "embedding", (h, channels * patch * patch),
                       scope=scope, stack=S),
        ]  # fmt: skip
        out += norm_params(prefix, ("layernorm_pre", "layernorm_post"), h, 1, bias=True, scope=scope, stack=S)
        lp = prefix + "model.layers.*."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out += linear_params(lp + f"self_attn.{name}", "attention", h, h, bias=True, parallel=None,
                                 module=name, count=L, stack=S, scope=layer_scope)  # fmt: skip
        out += linear_params(lp + "mlp.fc1", "mlp", inter, h, bias=True, parallel=None, module="fc1", count=L,
                             stack=S, scope=layer_scope)  # fmt: skip
        out += linear_params(lp + "mlp.fc2", "mlp", h, inter, bias=True, parallel=None, module="fc2", count=L,
                             stack=S, scope=layer_scope)  # fmt: skip
        out += norm_params(lp, ("input_layernorm", "post_attention_layernorm"), h, L, bias=True, stack=S,
                           scope=layer_scope)  # fmt: skip
        ap = prefix + "vision_adapter.mlp."
        out += linear_params(ap + "fc1", "mlp", p_in, inter, bias=False, parallel=None, module="fc1", scope=scope,
                             stack=S)  # fmt: skip
        out += linear_params(ap + "fc2", "mlp", p_out, p_out, bias=False, parallel=None, module="fc2", scope=scope,
                             stack=S)  # fmt: skip
        return out

    tower = tower_architecture(
        "llama4_vision",
        {**full, "hidden_act": "gelu"},  # nn.GELU() whatever hidden_act says (the modules hard-code it)
        groups("layer"),
        causal=False,
        seq=n + 1,
        image_size=image,
        patch_size=patch,
        num_channels=channels,
        num_patches=n,
        softmax_in_compute_dtype=False,
    )
    sizes = {"rows": round(n * r * r), "shuffled": inter, "inner": p_in, "out": p_out}
    return groups(scope), tower, sizes
