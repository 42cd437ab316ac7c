"""Llama 4 text (issue 12): exact parameter counts against transformers' meta-device build of
``Llama4ForCausalLM``, the vision-language ``llama4`` config refused, and the engine's activations held to a
fake-tensor trace of the same training step within 3%."""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog.models import PRESET_INFO, PRESETS, architecture_for
from memsim_widget.errors import ScenarioError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
logging.getLogger("transformers").setLevel(logging.ERROR)

SCOUT = "llama-4-scout-17b-16e-text-only"
MAVERICK = "llama-4-maverick-17b-128e-text-only"

#: Odd sizes, MoE on layers 1, 3, 5 (step 2), biased attention, NoPE layer 3, nested rope_parameters.
TINY: dict[str, Any] = {
    "model_type": "llama4_text",
    "hidden_size": 64,
    "intermediate_size": 24,
    "intermediate_size_mlp": 40,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 20,
    "num_local_experts": 3,
    "num_experts_per_tok": 2,
    "interleave_moe_layer_step": 2,
    "vocab_size": 101,
    "attention_bias": True,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 16.0,
        "high_freq_factor": 1.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    },
}


def meta_model(cfg: dict[str, Any]) -> torch.nn.Module:
    """``AutoModelForCausalLM`` of an HF config dict, built on the meta device."""
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf_cfg)


def meta_counts(cfg: dict[str, Any]) -> tuple[int, Counter[str]]:
    """Total parameters and per-kind sums of the transformers model built on the meta device."""
    model = meta_model(cfg)
    kinds: Counter[str] = Counter()
    for name, p in model.named_parameters():
        if ".experts." in name:
            kinds["experts"] += p.numel()
        elif ".router." in name:
            kinds["router"] += p.numel()
        elif "norm" in name:
            kinds["norm"] += p.numel()
        elif "embed_tokens" in name:
            kinds["embedding"] += p.numel()
        elif name.startswith("lm_head"):
            kinds["head"] += p.numel()
        elif "self_attn" in name:
            kinds["attention"] += p.numel()
        else:  # feed_forward.{gate,up,down}_proj and feed_forward.shared_expert.*
            kinds["mlp"] += p.numel()
    return sum(p.numel() for p in model.parameters()), kinds


@pytest.mark.parametrize(
    "cfg",
    [PRESETS[SCOUT], PRESETS[MAVERICK], TINY, {**TINY, "moe_layers": [0, 5], "tie_word_embeddings": True}],
    ids=["scout", "maverick", "tiny", "tiny-moe_layers-tied"],
)
def test_parameters_match_transformers_by_kind(cfg: dict[str, Any]) -> None:
    arch = build_architecture(cfg)
    total, kinds = meta_counts(cfg)
    assert arch.parameters == total
    assert {k: v for k, v in arch.parameters_by_kind().items() if v} == dict(+kinds)


def test_preset_totals_are_transformers_text_models() -> None:
    """Scout's and Maverick's language models as transformers 5.24 builds them (vision tower not included)."""
    assert architecture_for(SCOUT).parameters == 107_769_861_120
    assert architecture_for(MAVERICK).parameters == 400_711_848_960
    for preset in (SCOUT, MAVERICK):
        assert "TEXT MODEL ONLY" in PRESET_INFO[preset]["description"]
        assert "vision tower" in PRESET_INFO[preset]["description"]


def test_inline_dict_with_nested_rope_equals_preset() -> None:
    """A pasted text_config with transformers 5's nested rope_parameters counts like the preset."""
    inline = {k: v for k, v in PRESETS[SCOUT].items() if k not in ("rope_scaling", "rope_theta")}
    inline["rope_parameters"] = {**PRESETS[SCOUT]["rope_scaling"], "rope_theta": 500000.0}
    assert architecture_for(inline).parameters == architecture_for(SCOUT).parameters
    assert architecture_for(inline).parameters == meta_counts(inline)[0]
    assert architecture_for(inline).extra["rope_theta"] == 500000.0


def test_vision_language_config_is_the_whole_model_not_its_text_part() -> None:
    """transformers' AutoModelForCausalLM quietly builds only the text model of a ``llama4`` config; the simulator
    builds Llama4ForConditionalGeneration instead (tests/families/test_family_llama4_vision.py), never the text part alone."""
    text = {k: v for k, v in TINY.items() if k != "model_type"}
    vision = {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
              "image_size": 28, "patch_size": 14, "vision_output_dim": 16, "projector_input_dim": 16,
              "projector_output_dim": 16}  # fmt: skip
    cfg = {"model_type": "llama4", "text_config": text, "vision_config": vision}
    assert type(meta_model(cfg)).__name__ == "Llama4ForCausalLM"  # what a silent count would have been
    arch = build_architecture(cfg)
    assert arch.family == "llama4" and arch.extra["vision"]["kind"] == "llama4"
    assert arch.parameters > build_architecture(TINY).parameters


def test_layer_layout_follows_moe_layers_and_no_rope_layers() -> None:
    """Step 2 puts experts on layers 1, 3, 5; moe_layers overrides it; NoPE every 4th layer drops qk_norm."""
    arch = build_architecture(TINY)
    model = meta_model(TINY)
    moe = [i for i, layer in enumerate(model.model.layers) if layer.is_moe_layer]
    assert arch.extra["moe_layer_indices"] == moe == [1, 3, 5]
    rope = [i for i, layer in enumerate(model.model.layers) if layer.self_attn.use_rope]
    assert arch.extra["rope_layers"] == len(rope) == 5
    assert arch.extra["qk_norm_layers"] == sum(
        hasattr(layer.self_attn, "qk_norm") for layer in model.model.layers
    )
    assert build_architecture({**TINY, "moe_layers": [0, 5]}).extra["moe_layer_indices"] == [0, 5]
    chunked = [t == "chunked_attention" for t in model.config.layer_types]
    assert arch.extra["chunked_layers"] == sum(chunked) == 5


def test_every_expert_runs_every_token() -> None:
    """Llama4TextMoe feeds all E experts every token (scores 0 for the rest): E rows per token, not top-k."""
    arch = build_architecture(TINY)
    routed = next(p for p in arch.extra["mlp_parts"] if p.get("experts"))
    assert (routed["rows"], routed["experts"], routed["top_k"]) == (3, 3, 2)
    experts = transformers.models.llama4.modeling_llama4.Llama4TextExperts
    assert "torch.bmm" in inspect.getsource(experts.forward)


def test_bad_keys_are_named() -> None:
    with pytest.raises(ScenarioError, match="model.num_experts_per_tok"):
        build_architecture({**TINY, "num_experts_per_tok": 4})
    with pytest.raises(ScenarioError, match="model.moe_layers"):
        build_architecture({**TINY, "moe_layers": [6]})
    with pytest.raises(ScenarioError, match="model.no_rope_layers"):
        build_architecture({**TINY, "no_rope_layers": [1, 0]})


def test_lora_all_linear_is_refused() -> None:
    """peft's all-linear wraps the router (an nn.Linear returning a tuple), which breaks the forward."""
    from memsim_widget.engine.core import estimate
    from memsim_widget.scenario import Scenario

    lora = {"model": TINY, "micro_batch_size": 1, "seq_len": 64, "method": "lora"}
    assert issubclass(transformers.models.llama4.modeling_llama4.Llama4Router, torch.nn.Linear)
    with pytest.raises(ScenarioError, match=r"lora\.targets.*Llama4Router"):
        estimate(Scenario.from_dict({**lora, "lora": {"rank": 8, "targets": ["all-linear"]}}))
    estimate(Scenario.from_dict({**lora, "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}))


def test_expert_parallel_is_refused() -> None:
    """Llama4TextConfig has no base_model_ep_plan: every expert takes every token, so ep has nothing to split."""
    from memsim_widget.engine.core import estimate
    from memsim_widget.scenario import Scenario

    assert not getattr(transformers.Llama4TextConfig, "base_model_ep_plan", None)
    sc = {"model": {**TINY, "num_local_experts": 4}, "micro_batch_size": 1, "seq_len": 64}
    with pytest.raises(ScenarioError, match=r"parallel\.ep.*no expert-parallel plan"):
        estimate(Scenario.from_dict({**sc, "parallel": {"dp": 2, "ep": 2}}))


@pytest.mark.parametrize(
    "name",
    [
        "llama4_text bf16 sdpa b2 s512",
        "llama4_text bf16 lora qv b2 s512",
        "llama4_text bf16 sdpa b2 s512 (chunk 128: masked chunked layers)",
    ],
)
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
