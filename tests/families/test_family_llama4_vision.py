"""Llama 4 with its vision tower (issue 12): ``Llama4ForConditionalGeneration``'s parameters exactly as transformers
builds them on the meta device, the image tokens its processor inserts, the adapter's and projector's saved
tensors (a formula, labelled as such), the frozen-tower and LoRA-on-LM cases, and what is refused."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.families.llama4_vlm import tokens_per_image
from memsim_widget.scenario import Scenario

PRESET_IDS = ["llama-4-scout-17b-16e", "llama-4-maverick-17b-128e"]
TEXT = {"model_type": "llama4_text", "hidden_size": 64, "intermediate_size": 24, "intermediate_size_mlp": 40,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_local_experts": 3, "num_experts_per_tok": 1, "vocab_size": 101}  # fmt: skip
#: A 56px image in 14px patches: a 4 x 4 grid, shuffled by 0.5 into 4 rows of 4 x 32 = 128 (= intermediate_size)
VISION = {"model_type": "llama4_vision_model", "hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "image_size": 56, "patch_size": 14, "vision_output_dim": 48,
          "projector_input_dim": 48, "projector_output_dim": 48, "pixel_shuffle_ratio": 0.5}  # fmt: skip
TINY = {"model_type": "llama4", "text_config": TEXT, "vision_config": VISION}


def meta_total(cfg: dict[str, Any]) -> int:
    """Parameters of ``Llama4ForConditionalGeneration`` built on the meta device."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(transformers.AutoConfig.for_model(**cfg))
    assert type(model).__name__ == "Llama4ForConditionalGeneration"
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "cfg",
    [
        *(PRESETS[p] for p in PRESET_IDS),
        TINY,
        {**TINY, "vision_config": {**VISION, "num_channels": 1, "num_hidden_layers": 3}},
        {
            **TINY,
            "vision_config": {
                **VISION,
                "image_size": 112,
                "pixel_shuffle_ratio": 0.25,
                "intermediate_size": 512,
            },
        },
    ],
    ids=[*PRESET_IDS, "tiny", "tiny-gray-3-layers", "tiny-ratio-0.25"],
)
def test_parameters_match_transformers(cfg: dict[str, Any]) -> None:
    assert build_architecture(cfg).parameters == meta_total(cfg)


def test_presets_are_the_text_presets_plus_the_same_tower() -> None:
    tower = {
        p: architecture_for(p).parameters - architecture_for(f"{p}-text-only").parameters for p in PRESET_IDS
    }
    assert tower["llama-4-scout-17b-16e"] == tower["llama-4-maverick-17b-128e"] > 0
    stacks = {g.stack for g in architecture_for(PRESET_IDS[0]).params}
    assert {"vision", "projector"} <= stacks


def test_image_tokens_follow_the_processors_tiles() -> None:
    """One 336px tile: 144 patch tokens + image_start, image, image_end; a 2 x 2 grid adds the global tile and
    one separator per tile (Llama4Processor._prompt_split_image)."""
    assert tokens_per_image(144) == 147
    assert tokens_per_image(144, (2, 2)) == 5 * 144 + 4 + 3
    assert tokens_per_image(144, (1, 3)) == 4 * 144 + 3 + 3
    arch = architecture_for(PRESET_IDS[0])
    assert arch.extra["vision"]["tokens_per_image"] == 147 and arch.extra["vision"]["feature_rows"] == 144
    ctx = Context(Scenario.from_dict({"model": TINY, "seq_len": 100, "images_per_sample": 2}))
    assert ctx.seq_len == 100 + 2 * (4 + 3)


def _pre(**keys: Any) -> dict[str, float]:
    ctx = Context(Scenario.from_dict({"model": TINY, "micro_batch_size": 2, "seq_len": 64, **keys}))
    out = activations(ctx)
    return {t.name: t.bytes for t in out.pre + out.loss_forward}


def test_adapter_and_projector_saved_tensors() -> None:
    """b=2, one image each: N = 2 x 4 rows; tower rows T = 2 x 17. bf16."""
    N, T, h = 2 * 4, 2 * 17, 32
    frozen = _pre()
    assert frozen["projector: linear_1 input (the adapter's output)"] == 2 * N * 48
    assert not any(k.startswith("vision tower: layernorm_post") for k in frozen)
    trained = _pre(freeze_vision=False)
    name = next(k for k in trained if k.startswith("vision tower: layernorm_post"))
    assert trained[name] == 2 * T * h + 8 * T + 2 * N * (128 + 2 * 48 + 48)
    lora = _pre(method="lora", lora={"targets": ["q_proj", "v_proj"]})
    assert lora["adapter output held by the model output (image_hidden_states)"] == 2 * N * 48
    assert "projector: linear_1 input (the adapter's output)" not in lora


def test_the_estimate_names_the_one_tile_image_and_the_transformers_bug() -> None:
    est = estimate(Scenario.from_dict({"model": TINY, "micro_batch_size": 1, "seq_len": 64}))
    (caveat,) = [c for c in est.caveats if c.startswith("Llama 4:")]
    assert "one 56px tile (7 tokens)" in caveat and "AttributeError" in caveat


@pytest.mark.parametrize(
    "name", ["llama4 bf16 sdpa frozen tower b2 s256+19", "llama4 bf16 sdpa trained tower b2 s256+19"]
)
@pytest.mark.slow
def test_engine_within_one_percent_of_trace(name: str) -> None:
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r


@pytest.mark.parametrize(
    ("vision", "field"),
    [
        ({"pixel_shuffle_ratio": 0.3}, "model.vision_config.pixel_shuffle_ratio"),
        ({"intermediate_size": 100}, "model.vision_config.pixel_shuffle_ratio"),
        ({"vision_output_dim": 64}, "model.vision_config.vision_output_dim"),
        ({"patch_size": 15}, "model.vision_config.patch_size"),
        ({"model_type": "clip_vision_model"}, "model.vision_config.model_type"),
    ],
)
def test_bad_vision_keys_are_named(vision: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        build_architecture({**TINY, "vision_config": {**VISION, **vision}})
    assert err.value.field == field
