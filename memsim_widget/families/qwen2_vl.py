"""Qwen2-VL and Qwen2.5-VL (``Qwen2VLForConditionalGeneration``, ``Qwen2_5_VLForConditionalGeneration``,
transformers 5.24 ``models/qwen2_vl/modeling_qwen2_vl.py`` and ``models/qwen2_5_vl/modeling_qwen2_5_vl.py``).

Parameter tensors: the vision tower ``model.visual.*``: ``patch_embed.proj`` (Conv3d [e, C, t, p, p], no bias,
t = ``temporal_patch_size``), per block ``blocks.*.``: ``attn.qkv`` [3e, e] and ``attn.proj`` [e, e] (each with a
bias), then Qwen2-VL: ``norm1`` / ``norm2`` LayerNorm (weight, bias) and ``mlp.fc1`` [r e, e] / ``mlp.fc2``
[e, r e] with biases (r = ``mlp_ratio``, ``hidden_act`` quick_gelu); Qwen2.5-VL: RMSNorm ``norm1`` / ``norm2``
(weight) and a SwiGLU ``mlp.gate_proj`` / ``up_proj`` [I, e] / ``down_proj`` [e, I] with biases. The merger
``merger.ln_q`` (LayerNorm, or RMSNorm in 2.5) over e, then ``merger.mlp.0`` [4e, 4e] + bias, GELU,
``merger.mlp.2`` [h_t, 4e] + bias on each 2 x 2 block of patches (``spatial_merge_size`` m: m^2 e wide). The
language model ``model.language_model.*`` + ``lm_head`` is Qwen2's (families/qwen2.py), read from ``text_config``
or, as the published config.json files write it, from the top-level keys; ``tie_word_embeddings`` (top level,
default false) ties the head. M-RoPE (``mrope_section``) only changes the position ids: no memory.

Image tokens: the processor resizes each image to multiples of p m = 28 (``smart_resize``: the nearest, then
scaled so that the pixel count lies in [``min_pixels``, ``max_pixels``]); the tower sees (H/14)(W/14) patches
and the language model (H/28)(W/28) tokens. memsim reads the image size from the model config's ``image_size``
(memsim's key: an int or [height, width], default 448: 1024 patches, 256 tokens) with the processor's
``min_pixels`` / ``max_pixels`` (defaults 3136 and 12845056, the published preprocessor_config.json values
as remembered; transformers' processor class alone defaults to 1003520).

Recipes (Qwen2-VL's fine-tuning scripts, LLaMA-Factory): ``freeze_vision`` freezes the patch embedding and the
blocks; the merger (stack "projector") trains with the language model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from memsim_widget.architecture.config_keys import read_bool, read_int, read_str
from memsim_widget.architecture.layers import activation_label, linear_params, norm_params
from memsim_widget.architecture.types import FAMILIES, Architecture, ParamGroup, register_family
from memsim_widget.architecture.vision import error_under, errors_under, sub_config
from memsim_widget.errors import ScenarioError

#: transformers 5.24 ``Qwen2VLVisionConfig`` / ``Qwen2_5_VLVisionConfig`` defaults.
QWEN2_VL_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "embed_dim": 1280,
    "hidden_size": 3584,
    "hidden_act": "quick_gelu",
    "mlp_ratio": 4,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
QWEN2_5_VL_VISION_DEFAULTS: dict[str, Any] = {
    "depth": 32,
    "hidden_size": 3584,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": (7, 15, 23, 31),
}
#: ``Qwen2VLTextConfig`` defaults where they differ from ``Qwen2Config``'s (families/qwen2.py).
QWEN2_VL_TEXT_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 32768,
}
#: The processor's pixel bounds (Qwen2-VL / Qwen2.5-VL preprocessor_config.json) and memsim's default image.
IMAGE_DEFAULTS: dict[str, Any] = {"image_size": 448, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16384}
#: Top-level keys of a flat (published) config.json that are not the language model's.
_NOT_TEXT = ("vision_config", "model_type", "architectures", "image_size", "min_pixels", "max_pixels")


def image_hw(cfg: Mapping[str, Any], key: str = "image_size", default: int = 448) -> tuple[int, int]:
    """The ``image_size`` memsim key: an int (square) or [height, width], positive."""
    v = cfg.get(key, default)
    hw = (v, v) if isinstance(v, int) and not isinstance(v, bool) else v
    if (
        not isinstance(hw, list | tuple)
        or len(hw) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in hw)
    ):
        raise ScenarioError(f"model.{key}", f"must be a positive int or [height, width], got {v!r}")
    return int(hw[0]), int(hw[1])


def smart_resize(h: int, w: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The size Qwen2-VL's image processor resizes an h x w image to (``image_processing_qwen2_vl.smart_resize``,
    transformers 5.24): each side rounded to a multiple of ``factor``, then scaled into [min_pixels, max_pixels]."""
    if max(h, w) / min(h, w) > 200:
        raise ScenarioError(
            "model.image_size", f"aspect ratio must be under 200 (the processor refuses), got {h}x{w}"
        )
    hb, wb = round(h / factor) * factor, round(w / factor) * factor
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb = max(factor, math.floor(h / beta / factor) * factor)
        wb = max(factor, math.floor(w / beta / factor) * factor)
    elif hb * wb < min_pixels:
        beta = math.sqrt(min_pixels / (h * w))
        hb, wb = math.ceil(h * beta / factor) * factor, math.ceil(w * beta / factor) * factor
    return hb, wb


def _text_config(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The language model's config (``text_config``, else the top-level keys) and whether its head is tied."""
    if isinstance(cfg.get("text_config"), Mapping):
        text = dict(cfg["text_config"])
    else:
        text = {k: v for k, v in cfg.items() if k not in _NOT_TEXT}
    tied = read_bool(cfg, "tie_word_embeddings", False) or read_bool(text, "tie_word_embeddings", False)
    for k, v in QWEN2_VL_TEXT_DEFAULTS.items():
        text.setdefault(k, v)
    text.pop("rope_scaling", None)  # M-RoPE sections: position ids only
    return {**text, "model_type": "qwen2", "tie_word_embeddings": tied}, tied


def _tower(
    cfg: Mapping[str, Any], v25: bool, out_hidden: int
) -> tuple[list[ParamGroup], list[ParamGroup], dict]:
    """The tower's parameter groups (stack "vision", scope "pre": before the language model's layers), the
    merger's (stack "projector") and the tower's sizes."""
    d = QWEN2_5_VL_VISION_DEFAULTS if v25 else QWEN2_VL_VISION_DEFAULTS
    L = (
        read_int(cfg, "depth", d["depth"])
        if "depth" in cfg or "num_hidden_layers" not in cfg
        else read_int(cfg, "num_hidden_layers")
    )
    e = read_int(cfg, "hidden_size" if v25 else "embed_dim", d["hidden_size" if v25 else "embed_dim"])
    heads = (
        read_int(cfg, "num_heads", d["num_heads"])
        if "num_attention_heads" not in cfg
        else read_int(cfg, "num_attention_heads")
    )
    if e % heads:
        raise ScenarioError(
            "model.num_heads",
            f"{'hidden_size' if v25 else 'embed_dim'} {e} is not a multiple of {heads} heads",
        )
    C = read_int(cfg, "in_channels", d["in_channels"])
    p, tp = (
        read_int(cfg, "patch_size", d["patch_size"]),
        read_int(cfg, "temporal_patch_size", d["temporal_patch_size"]),
    )
    m = read_int(cfg, "spatial_merge_size", d["spatial_merge_size"])
    act = read_str(cfg, "hidden_act", d["hidden_act"])
    inter = (
        read_int(cfg, "intermediate_size", d["intermediate_size"])
        if v25
        else e * read_int(cfg, "mlp_ratio", d["mlp_ratio"])
    )
    pv, S = "model.visual.", "vision"
    blk = pv + "blocks.*."
    groups = [ParamGroup(pv + "patch_embed.proj.weight", "embedding", (e, C, tp, p, p), scope="pre", stack=S)]
    groups += linear_params(
        blk + "attn.qkv",
        "attention",
        3 * e,
        e,
        bias=True,
        parallel=None,
        module="qkv",
        count=L,
        scope="pre",
        stack=S,
    )
    groups += linear_params(
        blk + "attn.proj",
        "attention",
        e,
        e,
        bias=True,
        parallel=None,
        module="proj",
        count=L,
        scope="pre",
        stack=S,
    )
    groups += norm_params(blk, ("norm1", "norm2"), e, L, bias=not v25, scope="pre", stack=S)
    mlp = (
        (("gate_proj", inter, e), ("up_proj", inter, e), ("down_proj", e, inter))
        if v25
        else (("fc1", inter, e), ("fc2", e, inter))
    )
    for name, o, i in mlp:
        groups += linear_params(
            blk + f"mlp.{name}",
            "mlp",
            o,
            i,
            bias=True,
            parallel=None,
            module=name,
            count=L,
            scope="pre",
            stack=S,
        )
    w, P = m * m * e, "projector"
    merger = norm_params(pv + "merger.", ("ln_q",), e, 1, bias=not v25, scope="pre", stack=P)
    merger += linear_params(
        pv + "merger.mlp.0", "mlp", w, w, bias=True, parallel=None, module="0", scope="pre", stack=P
    )
    merger += linear_params(
        pv + "merger.mlp.2", "mlp", out_hidden, w, bias=True, parallel=None, module="2", scope="pre", stack=P
    )
    sizes = {"layers": L, "hidden": e, "heads": heads, "inter": inter, "channels": C, "patch": p,
             "temporal_patch": tp, "merge": m, "act": act}  # fmt: skip
    return groups, merger, sizes


def _tower_architecture(family: str, groups: list[ParamGroup], t: Mapping[str, Any], v25: bool, patches: int,
                        **extra: Any) -> Architecture:  # fmt: skip
    """The tower as an Architecture of its own (its blocks at scope ``layer``) for engine/multimodal/qwen_vl.py."""
    e, heads = t["hidden"], t["heads"]
    return Architecture(
        family=family,
        model_type=family,
        hidden_size=e,
        num_layers=t["layers"],
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=e // heads,
        intermediate_size=t["inter"],
        vocab_size=0,
        tied_embeddings=False,
        params=tuple(dataclasses.replace(g, scope="layer") if ".blocks." in g.name else g for g in groups),
        mlp_activation=activation_label("hidden_act", t["act"], gated=v25),
        norm="rmsnorm" if v25 else "layernorm",
        position="none",  # 2D rope in fp32 on q and k: cos/sin shared by every block, nothing per block
        encoder_layers=t["layers"],
        decoder_layers=0,
        causal=False,
        fixed_seq_len=patches,
        extra={
            "norms_per_layer": 2,
            "use_cache": False,
            "hf_class": family,
            # q, k leave rope as new tensors; v is a view of qkv's output, which SDPA's saved v keeps whole; the
            # per-image outputs are made contiguous and concatenated: the proj input is a copy
            "fused_qkv_kept": True,
            "sdpa_output_copy": True,
            "attention_output_modules": ("proj",),
            "mlp_input_modules": ("fc1",),
            **extra,
        },
    )


def _build(cfg: Mapping[str, Any], v25: bool) -> Architecture:
    mt = "qwen2_5_vl" if v25 else "qwen2_vl"
    vision_cfg = sub_config(cfg, "vision_config")
    text_cfg, tied = _text_config(cfg)
    try:
        lm = FAMILIES["qwen2"](text_cfg)
    except ScenarioError as e:
        raise (error_under(e, "text_config") if "text_config" in cfg else e) from None
    with errors_under("vision_config"):
        d = QWEN2_5_VL_VISION_DEFAULTS if v25 else QWEN2_VL_VISION_DEFAULTS
        out_key = "out_hidden_size" if v25 else "hidden_size"
        out_hidden = read_int(vision_cfg, out_key, d[out_key])
        v_groups, merger, t = _tower(vision_cfg, v25, out_hidden)
    if out_hidden != lm.hidden_size:
        raise ScenarioError(
            f"model.vision_config.{out_key}",
            f"the merger's output ({out_hidden}) must equal the language model's hidden_size {lm.hidden_size}",
        )
    H, W = image_hw(cfg, "image_size", IMAGE_DEFAULTS["image_size"])
    lo = read_int(cfg, "min_pixels", IMAGE_DEFAULTS["min_pixels"])
    hi = read_int(cfg, "max_pixels", IMAGE_DEFAULTS["max_pixels"])
    if lo > hi:
        raise ScenarioError("model.min_pixels", f"{lo} exceeds max_pixels {hi}")
    unit = t["patch"] * t["merge"]
    Hr, Wr = smart_resize(H, W, unit, lo, hi)
    gh, gw = Hr // t["patch"], Wr // t["patch"]
    patches = gh * gw
    tokens = patches // (t["merge"] ** 2)
    extra: dict[str, Any] = {"grid": (1, gh, gw), "resized": (Hr, Wr), "image_size": (H, W)}
    if v25:
        window = read_int(vision_cfg, "window_size", d["window_size"])
        full = vision_cfg.get("fullatt_block_indexes", d["fullatt_block_indexes"])
        if not isinstance(full, list | tuple) or not all(
            isinstance(i, int) and 0 <= i < t["layers"] for i in full
        ):
            raise ScenarioError(
                "model.vision_config.fullatt_block_indexes", f"must list block indices, got {full!r}"
            )
        extra.update(window_size=window, fullatt_block_indexes=tuple(full))
    tower = _tower_architecture(f"{mt}_vision", v_groups, t, v25, patches, **extra)
    lm_groups = [
        dataclasses.replace(g, name="model.language_model." + g.name.removeprefix("model."))
        if g.name.startswith("model.")
        else g
        for g in lm.params
    ]
    hf = "Qwen2_5_VLForConditionalGeneration" if v25 else "Qwen2VLForConditionalGeneration"
    return dataclasses.replace(
        lm,
        family=mt,
        model_type=mt,
        params=tuple(v_groups + merger + lm_groups),
        extra=lm.extra_with(
            hf_class=hf,
            text_model_type="qwen2",
            text_family="qwen2",
            tied_head=tied,
            vision={
                "kind": "qwen2_vl",
                "tower": tower,
                "layers_used": t["layers"],
                "tokens_per_image": tokens,
                "images_default": 1,
                "freeze_default": True,  # Qwen2-VL's fine-tuning scripts keep the tower frozen, the merger trained
                "projector": {
                    "in": t["hidden"],
                    "merge": t["merge"] ** 2,
                    "hidden": lm.hidden_size,
                    "norm": "rmsnorm" if v25 else "layernorm",
                },  # fmt: skip
                "image_token_index": cfg.get("image_token_id", 151655),
                "pixels_per_patch": t["channels"] * t["temporal_patch"] * t["patch"] ** 2,
                "image_note": f"every image is {H} x {W} px (model key image_size), resized by the processor to "
                f"{Hr} x {Wr}: {patches} patches in the tower, {tokens} tokens; the tower's own backward transients "
                "are not modelled",
            },
        ),
    )


@register_family("qwen2_vl")
def build_qwen2_vl(cfg: Mapping[str, Any]) -> Architecture:
    """Qwen2-VL as ``Qwen2VLForConditionalGeneration``: ViT with 2D RoPE, 2 x 2 merger, Qwen2 language model."""
    return _build(cfg, v25=False)


@register_family("qwen2_5_vl")
def build_qwen2_5_vl(cfg: Mapping[str, Any]) -> Architecture:
    """Qwen2.5-VL as ``Qwen2_5_VLForConditionalGeneration``: window-attention ViT (RMSNorm, SwiGLU), merger,
    Qwen2 language model."""
    return _build(cfg, v25=True)
