"""Qwen2-VL, Qwen2.5-VL and LLaVA-NeXT: exact parameters against transformers' meta build (presets and inline
configs, flat and nested), image tokens from the image size as transformers' processors count them, what a frozen
tower trains, bad input, and the engine held to the trace (a fast subset of docs/fidelity.md's cases)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
import transformers  # noqa: E402
from _family_meta import arch_shapes  # noqa: E402
from fidelity_cases import LLAVA_NEXT, MULTIMODAL_CASES, QWEN2_5_VL, QWEN2_VL, compare  # noqa: E402

from memsim_widget.architecture import build_architecture  # noqa: E402
from memsim_widget.catalog.models import PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.families.llava_next import anyres_tokens  # noqa: E402
from memsim_widget.families.qwen2_vl import smart_resize  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

PRESETS_HERE = {
    # published totals (model cards: 2.21B, 8.29B, 73.4B, 3.75B, 8.29B, 33.5B, 73.4B, 7.57B, 7.06B, 13.4B, 34.8B)
    "qwen2-vl-2b": 2_208_985_600,
    "qwen2-vl-7b": 8_291_375_616,
    "qwen2-vl-72b": 73_405_560_320,
    "qwen2.5-vl-3b": 3_754_622_976,
    "qwen2.5-vl-7b": 8_292_166_656,
    "qwen2.5-vl-32b": 33_452_718_336,
    "qwen2.5-vl-72b": 73_410_777_344,
    "llava-v1.6-mistral-7b": 7_566_747_648,
    "llava-v1.6-vicuna-7b": 7_063_431_168,
    "llava-v1.6-vicuna-13b": 13_351_499_776,
    "llava-v1.6-34b": 34_752_083_968,
}
MEMSIM_KEYS = ("image_size", "min_pixels", "max_pixels")


def _meta(cfg: dict) -> torch.nn.Module:
    hf = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in MEMSIM_KEYS})
    with torch.device("meta"):
        return transformers.AutoModelForImageTextToText.from_config(hf)


def _assert_exact(model: str | dict) -> None:
    cfg = PRESETS[model] if isinstance(model, str) else model
    arch = architecture_for(model) if isinstance(model, str) else build_architecture(cfg)
    m = _meta(cfg)
    assert arch.parameters == sum(p.numel() for p in m.parameters())
    assert arch_shapes(arch) == Counter(tuple(p.shape) for p in m.parameters())


@pytest.mark.parametrize("preset", sorted(PRESETS_HERE))
def test_presets_match_transformers_tensor_for_tensor(preset: str) -> None:
    _assert_exact(preset)


def test_published_sizes() -> None:
    assert {p: architecture_for(p).parameters for p in PRESETS_HERE} == PRESETS_HERE


_TEXT = {k: QWEN2_VL[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                  "num_key_value_heads", "vocab_size")}  # fmt: skip


@pytest.mark.parametrize(
    "cfg",
    [
        QWEN2_VL,
        QWEN2_5_VL,
        LLAVA_NEXT,
        # a tied head, 3 x 3 merge, a 2-channel Conv3d; a nested text_config (transformers 5's own save format)
        {**QWEN2_VL, "tie_word_embeddings": True, "vision_config": {**QWEN2_VL["vision_config"],
                                                                    "spatial_merge_size": 3, "in_channels": 2}},
        {"model_type": "qwen2_5_vl", "text_config": {**_TEXT, "tie_word_embeddings": True},
         "vision_config": QWEN2_5_VL["vision_config"]},
        {**LLAVA_NEXT, "text_config": {**LLAVA_NEXT["text_config"], "model_type": "mistral"}},
    ],
)  # fmt: skip
def test_inline_configs_match_transformers(cfg: dict) -> None:
    _assert_exact(cfg)


@pytest.mark.parametrize(
    ("h", "w"), [(448, 448), (224, 336), (1080, 1920), (30, 4000), (20, 20), (5000, 6000), (333, 777)]
)
def test_qwen_image_tokens_follow_the_processors_resize(h: int, w: int) -> None:
    """``smart_resize`` as transformers' Qwen2-VL image processor computes it; tokens = (H/28)(W/28)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_resize

    lo, hi = 56 * 56, 28 * 28 * 1280
    assert smart_resize(h, w, 28, lo, hi) == hf_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi)
    arch = build_architecture({**QWEN2_VL, "image_size": [h, w], "min_pixels": lo, "max_pixels": hi})
    Hr, Wr = hf_resize(h, w, factor=28, min_pixels=lo, max_pixels=hi)
    v = arch.extra["vision"]
    assert v["tokens_per_image"] == (Hr // 28) * (Wr // 28)
    assert v["tower"].fixed_seq_len == (Hr // 14) * (Wr // 14)


@pytest.mark.parametrize(
    ("h", "w"), [(672, 672), (300, 500), (600, 300), (1000, 200), (336, 336), (1500, 900)]
)
def test_llava_next_tokens_are_the_processors(h: int, w: int) -> None:
    """Tokens per image as ``LlavaNextProcessor._get_number_of_features`` counts them (default strategy: the
    processor's extra CLS token taken off again), crops as ``image_size_to_num_patches``."""
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches
    from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

    pins = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
    proc = SimpleNamespace(image_processor=SimpleNamespace(image_grid_pinpoints=pins), patch_size=14,
                           num_additional_image_tokens=0, _get_unpadded_features=lambda *a: LlavaNextProcessor._get_unpadded_features(proc, *a))  # fmt: skip
    tokens = LlavaNextProcessor._get_number_of_features(proc, h, w, 336, 336)
    crops = image_size_to_num_patches((h, w), pins, 336)
    assert anyres_tokens(h, w, 336, 14, tuple(map(tuple, pins))) == (crops, tokens)
    v = architecture_for("llava-v1.6-mistral-7b").extra["vision"]
    assert (v["crops_per_image"], v["tokens_per_image"]) == (5, 2928)  # 672 x 672 by default


def test_image_tokens_join_the_sequence_and_the_tower_recipe() -> None:
    ctx = Context(Scenario.from_dict({"model": "qwen2-vl-7b", "seq_len": 1024, "images_per_sample": 2}))
    assert ctx.image_tokens == 2 * 256 and ctx.seq_len == 1024 + 512
    arch = ctx.arch
    tower = sum(g.numel for g in arch.params if g.stack == "vision")
    merger = sum(g.numel for g in arch.params if g.stack == "projector")
    assert tower == 1280 * 3 * 2 * 14 * 14 + 32 * (
        4 * 1280 * 1280 + 4 * 1280 + 2 * 1280 * 5120 + 5120 + 1280 + 4 * 1280
    )
    assert merger == 2 * 1280 + 5120 * 5120 + 5120 + 3584 * 5120 + 3584
    # the frozen tower's recipe trains the merger with the language model
    assert ctx.freeze_vision and ctx.trainable_parameters == arch.parameters - tower
    # LoRA on q/v touches the language model only (the tower's attention is one fused qkv)
    lora = Context(Scenario.from_dict({"model": "qwen2-vl-7b", "method": "lora"}))
    assert {ad.base.stack for ad in lora.adapters} == {"decoder"}
    every = Context(
        Scenario.from_dict({"model": "qwen2-vl-7b", "method": "lora", "lora": {"targets": ["all-linear"]}})
    )
    assert {ad.base.stack for ad in every.adapters} == {"decoder", "vision", "projector"}
    # the tower's Linear names never count as the language model's in its rules (fc1 is an MLP input name)
    assert "fc1" not in every.linear_modules and "gate_proj" in every.linear_modules


def test_a_step_without_images_trains_neither_tower_nor_projector() -> None:
    """The tower and the merger never run: no gradient, no optimizer state (as the trace shows), even when the
    recipe trains them."""
    for model in ("qwen2-vl-2b", "llava-v1.6-vicuna-7b", "llava-1.5-7b"):
        arch = architecture_for(model)
        lm = sum(g.numel for g in arch.params if g.stack not in ("vision", "vision_unused", "projector"))
        ctx = Context(Scenario.from_dict({"model": model, "images_per_sample": 0, "freeze_vision": False}))
        assert ctx.trainable_parameters == lm


@pytest.mark.parametrize(
    ("model", "field"),
    [
        ({**QWEN2_VL, "image_size": [0, 10]}, "model.image_size"),
        ({**QWEN2_VL, "image_size": "448"}, "model.image_size"),
        ({**QWEN2_VL, "image_size": [10, 3000]}, "model.image_size"),  # aspect ratio over 200
        ({**QWEN2_VL, "min_pixels": 10**7, "max_pixels": 10**6}, "model.min_pixels"),
        ({**QWEN2_VL, "vision_config": {**QWEN2_VL["vision_config"], "hidden_size": 128}},
         "model.vision_config.hidden_size"),
        ({**QWEN2_5_VL, "vision_config": {**QWEN2_5_VL["vision_config"], "fullatt_block_indexes": [9]}},
         "model.vision_config.fullatt_block_indexes"),
        ({**QWEN2_VL, "vision_config": {**QWEN2_VL["vision_config"], "num_heads": 7}}, "model.vision_config.num_heads"),
        ({**LLAVA_NEXT, "image_grid_pinpoints": [[300, 600]]}, "model.image_grid_pinpoints"),
        ({**LLAVA_NEXT, "vision_feature_select_strategy": "full"}, "model.vision_feature_select_strategy"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(model: dict, field: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(Scenario.from_dict({"model": model, "seq_len": 64}))
    assert exc.value.field == field


def test_the_image_size_is_stated_in_the_caveats() -> None:
    est = estimate(Scenario.from_dict({"model": {**QWEN2_VL, "image_size": [224, 336]}, "seq_len": 64}))
    assert any("every image is 224 x 336 px" in c and "96 tokens" in c for c in est.caveats)
    est = estimate(Scenario.from_dict({"model": "llava-v1.6-vicuna-7b", "seq_len": 64}))
    assert any("5 crops of 336 px" in c and "2928 tokens" in c for c in est.caveats)


FAST = [
    "qwen2_vl bf16 sdpa trained tower b2 s256+64",
    "qwen2_5_vl bf16 lora all-linear (LM, tower, merger) b2 s256+64",
    "qwen2_5_vl amp-bf16 sdpa frozen tower b2 s256+64",
    "llava_next bf16 sdpa frozen tower b2 s256+660",
    "llava_next bf16 ckpt frozen tower b2 s256+660",  # the frozen tower's tensors the graph keeps
]


@pytest.mark.parametrize("name", FAST)
@pytest.mark.slow
def test_engine_within_one_percent_of_trace(name: str) -> None:
    r = compare(name, dict(MULTIMODAL_CASES)[name])
    assert abs(r["error"]) < 0.01, r
