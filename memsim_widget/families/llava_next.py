"""LLaVA-NeXT / LLaVA 1.6 (``LlavaNextForConditionalGeneration``, transformers 5.24
``models/llava_next/modeling_llava_next.py``): LLaVA 1.5's CLIP tower, projector and language model
(families/llava.py) plus ``model.image_newline`` [h_t], with "anyres" image tiling.

Tiling (``LlavaNextImageProcessor`` and ``LlavaNextProcessor._get_number_of_features``): an H x W image picks the
best of ``image_grid_pinpoints`` (``select_best_resolution``: the most effective pixels, then the least waste),
is cut into (best_h / s)(best_w / s) tiles of the tower's s x s input (s = ``vision_config.image_size``, 336),
plus one base tile of the whole image resized: the tower runs 1 + tiles crops per image, and the projector reads
(s / p)^2 patch rows of each (CLS dropped, ``vision_feature_select_strategy`` "default"; "full" is refused: the
tiles' rows would not reshape). The language model gets the base tile's (s/p)^2 tokens, then the tiles' feature
grid unpadded back to the image's aspect ratio (rows or columns of padding removed, ``unpad_image``) with one
``image_newline`` token after each row. memsim reads the image size from the model config's ``image_size``
(memsim's key: an int or [height, width], default 672: 4 tiles + base, 2928 tokens).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_str
from memsim_widget.architecture.types import Architecture, ParamGroup, register_family
from memsim_widget.errors import ScenarioError
from memsim_widget.families.llava import build_llava
from memsim_widget.families.qwen2_vl import image_hw

#: transformers 5.24 ``LlavaNextConfig`` default pinpoints (height, width) and memsim's default image.
PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))
DEFAULT_IMAGE = 672


def best_resolution(h: int, w: int, pinpoints: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """``select_best_resolution`` (transformers 5.24 ``image_processing_utils``): the pinpoint keeping the most of
    the image's pixels once it is scaled to fit, ties broken by the least padding."""
    best, most, least = pinpoints[0], 0, float("inf")
    for ph, pw in pinpoints:
        scale = min(pw / w, ph / h)
        effective = min(int(w * scale) * int(h * scale), w * h)
        wasted = ph * pw - effective
        if effective > most or (effective == most and wasted < least):
            best, most, least = (ph, pw), effective, wasted
    return best


def anyres_tokens(
    h: int, w: int, side: int, patch: int, pinpoints: tuple[tuple[int, int], ...]
) -> tuple[int, int]:
    """(crops the tower runs, tokens the language model gets) for an h x w image
    (``LlavaNextProcessor._get_number_of_features`` with the default strategy)."""
    bh, bw = best_resolution(h, w, pinpoints)
    n = side // patch
    cur_h, cur_w = n * (bh // side), n * (bw // side)
    if w / h > cur_w / cur_h:
        pad = (cur_h - int(round(h * (cur_w / w), 7))) // 2
        cur_h -= 2 * pad
    else:
        pad = (cur_w - int(round(w * (cur_h / h), 7))) // 2
        cur_w -= 2 * pad
    return 1 + (bh // side) * (bw // side), n * n + cur_h * cur_w + cur_h


def _pinpoints(cfg: Mapping[str, Any], side: int) -> tuple[tuple[int, int], ...]:
    given = cfg.get("image_grid_pinpoints")
    if given is None:
        return PINPOINTS
    ok = isinstance(given, list | tuple) and given
    pts = tuple(tuple(p) for p in given) if ok and all(isinstance(p, list | tuple) for p in given) else ()
    if not pts or not all(
        len(p) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 and x % side == 0 for x in p)
        for p in pts
    ):
        raise ScenarioError(
            "model.image_grid_pinpoints",
            f"must list [height, width] pairs, each a multiple of the tower's image_size {side}, got {given!r}",
        )
    return pts  # type: ignore[return-value]


@register_family("llava_next")
def build_llava_next(cfg: Mapping[str, Any]) -> Architecture:
    """LLaVA-NeXT as ``LlavaNextForConditionalGeneration``: LLaVA 1.5's parts plus ``image_newline``; tokens per
    image from ``image_size`` through the anyres tiling."""
    if read_str(cfg, "vision_feature_select_strategy", "default") != "default":
        raise ScenarioError(
            "model.vision_feature_select_strategy",
            "only 'default' is simulated for LLaVA-NeXT ('full' keeps CLS rows the tiles' grid cannot reshape)",
        )
    base = build_llava({**cfg, "model_type": "llava"})
    v = base.extra["vision"]
    tower = v["tower"]
    side, patch = tower.patches.image_size, tower.patches.patch_size
    pts = _pinpoints(cfg, side)
    H, W = image_hw(cfg, "image_size", DEFAULT_IMAGE)
    crops, tokens = anyres_tokens(H, W, side, patch, pts)
    newline = ParamGroup(
        "model.image_newline", "embedding", (base.hidden_size,), scope="pre", stack="projector"
    )
    return dataclasses.replace(
        base,
        family="llava_next",
        model_type="llava_next",
        params=(*base.params, newline),
        extra=base.extra_with(
            hf_class="LlavaNextForConditionalGeneration",
            vision={
                **v,
                "kind": "llava_next",
                "tokens_per_image": tokens,
                "crops_per_image": crops,
                "tokens_per_crop": v["tokens_per_image"],  # projector rows per crop (CLS dropped)
                "image_size": (H, W),
                "best_resolution": best_resolution(H, W, pts),
                "image_grid_pinpoints": pts,
                "image_note": f"every image is {H} x {W} px (model key image_size): {crops} crops of {side} px "
                f"through the tower, {tokens} tokens; the tower's own backward transients are not modelled",
            },
        ),
    )
