"""Llama 4 multimodal (``model_type: llama4``) as transformers 5.24's ``Llama4ForConditionalGeneration``: the
vision tower and its pixel-shuffle adapter (architecture/llama4_vision.py), a one-Linear projector and the MoE
language model of ``text_config`` (families/llama4.py).

Parameter tensors: ``vision_model.*``; ``multi_modal_projector.linear_1`` [h_text, vision_output_dim] (no bias);
``language_model.model.*`` and ``language_model.lm_head`` exactly as ``Llama4ForCausalLM``'s.

Image tokens (transformers 5.24 ``Llama4ImageProcessor`` and ``Llama4Processor._prompt_split_image``): an image
is resized onto a grid of rh x rw tiles of image_size (336) pixels (at most ``max_patches`` 16 tiles); with
more than one tile a global (downscaled) tile is added. Each tile gives (image/patch)^2 x ratio^2 = 144 feature
rows (``<|patch|>`` tokens); the text also carries ``<|image_start|>``, ``<|image|>`` and ``<|image_end|>``, and
for a grid of several tiles one separator per tile (rw - 1 ``<|tile_x_separator|>`` and one
``<|tile_y_separator|>`` per row). Tokens per image: 144 + 3 for one tile; (rh rw + 1) x 144 + rh rw + 3 for a
grid. The engine takes the one-tile image (an image of at most 336 x 336 pixels): 147 sequence tokens, one tile
through the tower; a larger image is a known miss, said in the estimate's caveats.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.layers import linear_params
from memsim_widget.architecture.llama4_vision import llama4_vision_tower
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.architecture.vision import errors_under, sub_config
from memsim_widget.errors import ScenarioError
from memsim_widget.families.llama4 import build_llama4_text

#: transformers 5.24 ``Llama4Config`` defaults.
LLAMA4_DEFAULTS: dict[str, Any] = {
    "boi_token_index": 200080,
    "eoi_token_index": 200081,
    "image_token_index": 200092,
    "tie_word_embeddings": False,
}
#: Special tokens around one image's feature rows (image_start, image, image_end).
IMAGE_FRAME_TOKENS = 3


def tokens_per_image(rows: int, grid: tuple[int, int] = (1, 1)) -> int:
    """Sequence tokens one image adds for a tile grid (rh, rw): see the module docstring."""
    tiles = grid[0] * grid[1]
    if tiles == 1:
        return rows + IMAGE_FRAME_TOKENS
    return (tiles + 1) * rows + tiles + IMAGE_FRAME_TOKENS


@register_family("llama4")
def build_llama4(cfg: Mapping[str, Any]) -> Architecture:
    """Llama 4 Scout / Maverick with their vision tower, as ``Llama4ForConditionalGeneration``."""
    text_cfg, vision_cfg = sub_config(cfg, "text_config"), sub_config(cfg, "vision_config")
    v_type = vision_cfg.get("model_type", "llama4_vision_model")
    if v_type != "llama4_vision_model":
        raise ScenarioError(
            "model.vision_config.model_type", f"{v_type!r}: Llama 4 takes llama4_vision_model"
        )
    with errors_under("text_config"):
        lm = build_llama4_text({**text_cfg, "model_type": "llama4_text"})
    with errors_under("vision_config"):
        v_groups, tower, sizes = llama4_vision_tower(vision_cfg, "vision_model.")
        v_out = vision_cfg.get("vision_output_dim", 7680)
        projector = linear_params("multi_modal_projector.linear_1", "mlp", lm.hidden_size, v_out, bias=False,
                                  parallel=None, module="linear_1", scope="pre", stack="projector")  # fmt: skip
    if v_out != sizes["out"]:
        raise ScenarioError(
            "model.vision_config.vision_output_dim",
            f"{v_out} must equal projector_output_dim {sizes['out']} (the projector reads the adapter's output)",
        )
    lm_groups: list[ParamGroup] = [dataclasses.replace(g, name="language_model." + g.name) for g in lm.params]
    return dataclasses.replace(
        lm,
        family="llama4",
        model_type="llama4",
        params=tuple(v_groups + projector + lm_groups),
        extra=lm.extra_with(
            hf_class="Llama4ForConditionalGeneration",
            text_model_type="llama4_text",
            text_family=lm.family,
            vision={
                "kind": "llama4",
                "tower": tower,
                "layers_used": tower.num_layers,  # vision_feature_layer -1: the last layer's output
                "tokens_per_image": tokens_per_image(sizes["rows"]),
                "feature_rows": sizes["rows"],
                "tiles_per_image": 1,
                "images_default": 1,
                "freeze_default": True,
                "adapter": sizes,
                "projector": {"in": v_out, "hidden": lm.hidden_size, "activation": "none", "bias": False},
                "image_token_index": cfg.get("image_token_index", LLAMA4_DEFAULTS["image_token_index"]),
                "caveat": f"Llama 4: every image is one {tower.patches.image_size}px tile "
                f"({tokens_per_image(sizes['rows'])} tokens); a larger image is tiled into up to 16 tiles plus a "
                "global one (families/llama4_vlm.py). transformers 5.24's Llama4ForConditionalGeneration.forward "
                "raises AttributeError (outputs.image_outputs) on every call: the figures are for the step once that "
                "is fixed (traced with the field supplied)",
            },
        ),
    )
