"""A composite model's sub-configs that omit structural keys take their config class's defaults, as transformers
fills them: LLaVA-1.5's published config.json (its ``text_config`` names only the vocabulary and a few
non-structural keys) builds the same model as the preset that writes the sizes out."""

from __future__ import annotations

import copy

import pytest

from memsim_widget.architecture.vision import SUBCONFIG_STRUCTURE
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

#: llava-hf/llava-1.5-7b-hf config.json's sub-configs as published (the keys that matter here).
PUBLISHED_TEXT = {"_name_or_path": "lmsys/vicuna-7b-v1.5", "architectures": ["LlamaForCausalLM"],
                  "max_position_embeddings": 4096, "model_type": "llama", "rms_norm_eps": 1e-05,
                  "torch_dtype": "float16", "vocab_size": 32064}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(SUBCONFIG_STRUCTURE))
def test_the_table_is_transformers_class_defaults(kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    cls = transformers.AutoConfig.for_model(kind).__class__
    defaults = cls().to_dict()
    assert {k: defaults[k] for k in SUBCONFIG_STRUCTURE[kind]} == SUBCONFIG_STRUCTURE[kind]


def test_llava_15_published_text_config_builds_the_preset_model() -> None:
    published = copy.deepcopy(PRESETS["llava-1.5-7b"])
    published["text_config"] = dict(PUBLISHED_TEXT)
    assert architecture_for(published).parameters == architecture_for("llava-1.5-7b").parameters
    a = estimate(Scenario(model=published, method="lora"))
    b = estimate(Scenario(model="llava-1.5-7b", method="lora"))
    assert a.peak_allocated_bytes == b.peak_allocated_bytes


def test_transformers_builds_the_same_sizes_from_the_published_text_config() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlavaConfig(
        text_config=dict(PUBLISHED_TEXT), vision_config=PRESETS["llava-1.5-7b"]["vision_config"]
    )
    text = PRESETS["llava-1.5-7b"]["text_config"]
    assert (cfg.text_config.hidden_size, cfg.text_config.intermediate_size, cfg.text_config.num_hidden_layers) == (
        text["hidden_size"], text["intermediate_size"], text["num_hidden_layers"])  # fmt: skip


def test_a_top_level_config_still_names_its_sizes() -> None:
    from memsim_widget.errors import ScenarioError

    with pytest.raises(ScenarioError, match="model.hidden_size"):
        architecture_for({"model_type": "llama", "vocab_size": 32000})
