"""CLIP, LLaVA and Gemma 3 (multimodal): exact parameters against transformers' meta build, the multimodal scenario keys, what a frozen
tower trains, image tokens in the sequence, and the engine held to the trace (a fast subset of the cases)."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
import transformers  # noqa: E402
from _family_meta import arch_shapes  # noqa: E402
from fidelity_cases import CLIP, GEMMA3_VLM, LLAVA, MULTIMODAL_CASES, compare  # noqa: E402

from memsim_widget.catalog.models import PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

MULTIMODAL_PRESETS = [
    "clip-vit-base-patch32",
    "clip-vit-large-patch14",
    "llava-1.5-7b",
    "llava-1.5-13b",
    "gemma-3-4b",
    "gemma-3-12b",
    "gemma-3-27b",
]


def _meta(cfg: dict) -> torch.nn.Module:
    hf = transformers.AutoConfig.for_model(**cfg)
    cls = transformers.AutoModel if cfg["model_type"] == "clip" else transformers.AutoModelForImageTextToText
    with torch.device("meta"):
        return cls.from_config(hf)


def _assert_exact(model: str | dict) -> None:
    cfg = PRESETS[model] if isinstance(model, str) else model
    arch = architecture_for(model if isinstance(model, str) else cfg)
    m = _meta(cfg)
    assert arch.parameters == sum(p.numel() for p in m.parameters())
    assert arch_shapes(arch) == Counter(tuple(p.shape) for p in m.parameters())


@pytest.mark.parametrize("preset", MULTIMODAL_PRESETS)
def test_presets_match_transformers_tensor_for_tensor(preset: str) -> None:
    _assert_exact(preset)


def test_published_sizes() -> None:
    sizes = {p: architecture_for(p).parameters for p in MULTIMODAL_PRESETS}
    assert sizes == {
        "clip-vit-base-patch32": 151_277_313,
        "clip-vit-large-patch14": 427_616_513,
        "llava-1.5-7b": 7_063_427_072,
        "llava-1.5-13b": 13_351_494_656,
        "gemma-3-4b": 4_300_079_472,
        "gemma-3-12b": 12_187_325_040,
        "gemma-3-27b": 27_432_406_640,
    }


@pytest.mark.parametrize(
    "cfg",
    [
        CLIP,
        LLAVA,
        GEMMA3_VLM,
        # a list of feature layers (concatenated: linear_1 reads 2 x h_v), "full" keeps CLS, no projector bias, Qwen2 LM
        {
            **LLAVA,
            "vision_feature_layer": [-2, -5],
            "vision_feature_select_strategy": "full",
            "multimodal_projector_bias": False,
            "text_config": {**LLAVA["text_config"], "model_type": "qwen2"},
        },
    ],
)
def test_inline_configs_match_transformers(cfg: dict) -> None:
    _assert_exact(cfg)


def test_image_tokens_join_the_language_models_sequence() -> None:
    sc = Scenario.from_dict({"model": "llava-1.5-7b", "seq_len": 1024, "images_per_sample": 2})
    ctx = Context(sc)
    assert ctx.image_tokens == 2 * 576 and ctx.seq_len == 1024 + 1152
    full = Context(
        Scenario.from_dict({"model": {**LLAVA, "vision_feature_select_strategy": "full"}, "seq_len": 8})
    )
    assert full.image_tokens == 197
    assert Context(Scenario.from_dict({"model": "clip-vit-base-patch32", "seq_len": 77})).seq_len == 77
    assert Context(Scenario.from_dict({"model": "gemma-3-4b", "seq_len": 512})).seq_len == 512 + 256


def test_frozen_tower_trains_nothing_and_llava_freezes_it_by_default() -> None:
    arch = architecture_for("llava-1.5-7b")
    vision = sum(g.numel for g in arch.params if g.stack in ("vision", "vision_unused"))
    unused = sum(g.numel for g in arch.params if g.stack == "vision_unused")
    assert vision == 303_507_456 and unused == 12_596_224 + 2048  # one CLIP-L layer and post_layernorm
    base = {"model": "llava-1.5-7b", "seq_len": 512}
    frozen = estimate(Scenario.from_dict(base))
    trained = estimate(Scenario.from_dict({**base, "freeze_vision": False}))
    assert frozen.trainable_parameters == arch.parameters - vision
    # the layer past vision_feature_layer -2 and post_layernorm get no gradient even when the tower trains
    assert trained.trainable_parameters == arch.parameters - unused


def test_lora_matches_target_names_across_the_whole_model_as_peft_does() -> None:
    """peft's ``get_peft_model`` puts an adapter on every module whose name is a target: CLIP-L's attention in
    LLaVA's tower names q_proj and v_proj too, so the frozen tower gets adapters (the layer past the one read
    excepted: no gradient reaches it); ``target_scope`` "language" keeps the tower and projector out."""
    arch = architecture_for("llava-1.5-7b")
    base = {"model": "llava-1.5-7b", "seq_len": 512, "method": "lora"}
    peft = Context(Scenario.from_dict({**base, "lora": {"targets": ["q_proj", "v_proj"], "rank": 16}}))
    tower = {ad.base.name for ad in peft.adapters if ad.base.stack == "vision"}
    assert {ad.base.stack for ad in peft.adapters} == {"decoder", "vision"}
    assert len(tower) == 2  # q_proj, v_proj weight groups, each on the 23 layers run (layer 24 unused)
    assert all(ad.base.count == 23 for ad in peft.adapters if ad.base.stack == "vision")
    # CLIP-L: 1024 wide; a q or v adapter is (1024 + 1024) x 16 per layer
    lm = sum(ad.numel for ad in peft.adapters if ad.base.stack == "decoder")
    assert peft.trainable_parameters == lm + 2 * 23 * (1024 + 1024) * 16
    language = Context(Scenario.from_dict({**base, "lora": {"target_scope": "language"}}))
    assert {ad.base.stack for ad in language.adapters} == {"decoder"}
    assert language.trainable_parameters == lm
    # all-linear reaches the projector too, unless the scope keeps the vision side out
    every = Context(Scenario.from_dict({**base, "lora": {"targets": ["all-linear"]}}))
    assert {ad.base.stack for ad in every.adapters} == {"decoder", "vision", "projector"}
    lm_only = Context(
        Scenario.from_dict({**base, "lora": {"targets": ["all-linear"], "target_scope": "language"}})
    )
    assert {ad.base.stack for ad in lm_only.adapters} == {"decoder"}
    assert arch.extra["vision"]["kind"] == "llava"


def test_the_scope_is_written_only_when_not_peft_default() -> None:
    sc = Scenario.from_dict({"model": "llava-1.5-7b", "method": "lora"})
    assert "target_scope" not in sc.to_dict()["lora"] and sc.lora.target_scope == "model"
    lm = sc.replace(lora={"target_scope": "language"})
    assert lm.to_dict()["lora"]["target_scope"] == "language"
    assert Scenario.from_dict(lm.to_dict()) == lm
    clip = Context(Scenario.from_dict({"model": "clip-vit-base-patch32", "seq_len": 77}))
    assert not clip.freeze_vision and clip.trainable_parameters == clip.arch.parameters


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"model": "llama-3.1-8b", "images_per_sample": 1}, "images_per_sample"),
        ({"model": "llama-3.1-8b", "freeze_vision": True}, "freeze_vision"),
        ({"model": "clip-vit-base-patch32", "seq_len": 77, "images_per_sample": 2}, "images_per_sample"),
        ({"model": "clip-vit-base-patch32", "seq_len": 78}, "seq_len"),
        (
            {"model": "clip-vit-base-patch32", "seq_len": 77, "activation_checkpointing": "full"},
            "activation_checkpointing",
        ),
        ({"model": "llava-1.5-7b", "parallel": {"tp": 2}}, "parallel.tp"),
        ({"model": "llava-1.5-7b", "activation_checkpointing": "selective-op"}, "activation_checkpointing"),
        ({"model": "llava-1.5-7b", "method": "qlora"}, "method"),
        ({"model": "llava-1.5-7b", "objective": "dpo"}, "objective"),
        ({"model": "llava-1.5-7b", "images_per_sample": -1}, "images_per_sample"),
        ({"model": "llava-1.5-7b", "freeze_vision": "yes"}, "freeze_vision"),
        # under LoRA every base weight is frozen: the tower cannot train fully; the adapters' reach is the scope
        ({"model": "llava-1.5-7b", "method": "lora", "freeze_vision": False}, "freeze_vision"),
        ({"model": "llava-1.5-7b", "method": "lora", "lora": {"target_scope": "tower"}}, "lora.target_scope"),
        (
            {"model": {**LLAVA, "text_config": {**LLAVA["text_config"], "model_type": "gemma"}}},
            "model.text_config.model_type",
        ),
        (
            {"model": {**LLAVA, "vision_config": {"model_type": "siglip_vision_model"}}},
            "model.vision_config.model_type",
        ),
        (
            # an omitted size takes CLIPVisionConfig's default, as transformers does (test_subconfig_defaults.py);
            # a wrong one is named
            {"model": {**LLAVA, "vision_config": {"model_type": "clip_vision_model", "hidden_size": "big"}}},
            "model.vision_config.hidden_size",
        ),
        ({"model": {**LLAVA, "vision_feature_layer": 9}}, "model.vision_feature_layer"),
        (
            {
                "model": {
                    **GEMMA3_VLM,
                    "vision_config": {**GEMMA3_VLM["vision_config"], "vision_use_head": True},
                }
            },
            "model.vision_config.vision_use_head",
        ),
        ({"model": {**GEMMA3_VLM, "mm_tokens_per_image": 50}}, "model.mm_tokens_per_image"),
    ],
)
def test_bad_multimodal_input_names_the_field(data: dict, field: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        estimate(Scenario.from_dict(data))
    assert exc.value.field == field


def test_existing_scenarios_echo_no_new_keys() -> None:
    d = Scenario.from_dict({"model": "llama-3.1-8b"}).to_dict()
    assert "images_per_sample" not in d and "freeze_vision" not in d
    d = Scenario.from_dict(
        {"model": "llava-1.5-7b", "images_per_sample": 3, "freeze_vision": False}
    ).to_dict()
    assert d["images_per_sample"] == 3 and d["freeze_vision"] is False


FAST = [
    "clip bf16 sdpa b8 s77",
    "clip bf16 lora qv (both towers) b8 s77",
    "llava bf16 sdpa trained tower b2 s256+196",
    "llava bf16 lora qv (LM and tower: peft's name matching) b2 s256+196",
    "llava bf16 lora qv (LM only) b2 s256+196",
    "llava_next bf16 lora qv (LM and tower: peft's name matching) b2 s256+660",
    "gemma3 bf16 sdpa frozen tower b2 s256+49",
]


@pytest.mark.slow
@pytest.mark.parametrize(("scope", "tower_adapters"), [("model", 4 * 2), ("language", 0)])
def test_the_tracer_puts_adapters_where_peft_does(scope: str, tower_adapters: int) -> None:
    """The trace wraps the model with the real ``get_peft_model``: q_proj and v_proj of the small LLaVA's 4 CLIP
    layers get adapters unless the scope excludes the tower and projector (peft's ``exclude_modules``)."""
    import torch

    from memsim_widget.trace.hf import apply_lora, build_hf_config, build_hf_model

    cfg = build_hf_config(LLAVA, "sdpa")
    with torch.device("meta"):
        model = build_hf_model(cfg, torch.bfloat16, "sdpa")
    notes: list[str] = []
    exclude = ("vision_tower", "multi_modal_projector") if scope == "language" else ()
    model = apply_lora(model, {"r": 8, "target_modules": ["q_proj", "v_proj"]}, notes, exclude=exclude)
    wrapped = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and "vision_tower" in n]
    assert len(wrapped) == tower_adapters
    assert sum(hasattr(m, "lora_A") for n, m in model.named_modules() if "language_model" in n) == 4 * 2


@pytest.mark.parametrize("name", FAST)
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    r = compare(name, dict(MULTIMODAL_CASES)[name])
    assert abs(r["error"]) < 0.03, r


def test_every_launch_file_notes_the_multimodal_assumptions() -> None:
    """No framework key says how many images a sample holds or that the tower is frozen: each export says it."""
    from memsim_widget.export import FORMATS, export

    sc = {"model": "llava-1.5-7b", "seq_len": 1024, "images_per_sample": 2, "method": "lora"}
    for fmt in FORMATS:
        try:
            files = export(sc, fmt)
        except ScenarioError:
            continue  # a format that refuses the scenario names the field itself
        text = "\n".join(files.values())
        assert "images_per_sample 2" in text and "1152 image tokens" in text, fmt
        assert "adapters wherever a target name matches, the vision tower and projector included" in text, fmt
    plain = "\n".join(export({"model": "llama-3.2-1b"}, "hf").values())
    assert "images_per_sample" not in plain.split("Scenario JSON")[0] and "freeze_vision" not in plain


def test_a_multi_gpu_trace_of_a_multimodal_model_is_refused() -> None:
    from memsim_widget.trace.traceable import check_traceable

    with pytest.raises(ScenarioError) as exc:
        check_traceable(Scenario.from_dict({"model": "llava-1.5-7b", "parallel": {"dp": 2}}))
    assert exc.value.field == "parallel"
