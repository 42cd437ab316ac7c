"""The typed model facts (architecture/facts.py): every ``extra`` key a family writes is declared, a misspelt one
fails at once, and the facts that replaced the engine's family-name branches hold for exactly the families the
traces back."""

from __future__ import annotations

import dataclasses

import pytest

from memsim_widget.architecture import Architecture
from memsim_widget.architecture.facts import FACT_KEYS, KEPT_KEYS, ModelFacts, model_facts
from memsim_widget.catalog.models import architecture_for, load_presets

PRESETS = tuple(load_presets()[0])


def _tiny(**extra: object) -> Architecture:
    return Architecture(
        family="llama", model_type="llama", hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=4,
        intermediate_size=16, vocab_size=32, tied_embeddings=True, params=(), extra=extra,
    )  # fmt: skip


def test_a_key_is_either_a_fact_or_kept_never_both() -> None:
    assert not FACT_KEYS & KEPT_KEYS


def test_a_misspelt_extra_key_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="norm_weigth_fp32"):
        _tiny(norm_weigth_fp32=True)


def test_a_misspelt_rule_coverage_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="compile"):
        _tiny(coverage=("compile",))


def test_no_extra_means_the_default_facts() -> None:
    # the defaults are a plain RoPE decoder's: what the engine read when a key was absent
    assert _tiny().facts == ModelFacts()
    assert model_facts({}, "x") == ModelFacts()


def test_a_misspelt_fact_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        _tiny().facts.norm.weight_fp23  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize("preset", PRESETS)
def test_the_traced_layouts_are_the_families_the_traces_ran(preset: str) -> None:
    # compile: traced on Llama-layout decoders (llama, mistral, qwen2), Gemma, Gemma 3, Qwen 3 and OLMo 2 (Gemma's
    # and OLMo 2's in bf16 only); litgpt on llama, mistral, qwen2; Liger patches those and Qwen 3
    # (apply_liger_kernel_to_*); T5's blocks and ViT's pixels have their own rules; Gemma's RMSNorm is (1 + w)
    # (a multimodal model carries its language model's coverage, which those rules never apply to an image model)
    arch = architecture_for(preset)
    for a in (arch, *([arch.facts.vision.tower] if arch.facts.vision else [])):
        c = a.facts.coverage
        if a.facts.vision is None:
            assert c.compiled == (
                a.family in ("llama", "mistral", "qwen2", "gemma", "qwen3", "olmo2", "gemma3")
            )
            assert c.litgpt == (a.family in ("llama", "mistral", "qwen2"))
            narrower = {"gemma": ("full", "lora"), "olmo2": ("full",), "gemma3": ("full", "lora")}
            recipes = c.compiled_recipes
            assert recipes == (
                None if a.family not in narrower else tuple(("bf16", m) for m in narrower[a.family])
            )
            assert c.liger == (a.family in ("llama", "mistral", "qwen2", "qwen3"))
        assert c.encoder_decoder == (a.family == "t5")
        assert c.pixel_input == (a.family == "vit")
        assert a.facts.norm.one_plus_weight == a.family.startswith("gemma")


def test_with_facts_changes_the_facts_only() -> None:
    arch = architecture_for("jamba-v0.1")
    seen = arch.with_facts(ssm=None, hybrid=None)
    assert (seen.facts.ssm, seen.facts.hybrid) == (None, None)
    assert seen.extra is arch.extra and seen == arch  # facts take no part in equality: the shape is the same
    assert dataclasses.replace(seen).facts == arch.facts  # rebuilt from extra


def test_extra_with_keeps_each_key_in_place() -> None:
    arch = _tiny(hf_class="A", use_cache=False, rope_kinds=2)
    assert list(arch.extra_with(drop=("use_cache",), hf_class="B", mlm_head=True).items()) == [
        ("hf_class", "B"), ("rope_kinds", 2), ("mlm_head", True)
    ]  # fmt: skip
