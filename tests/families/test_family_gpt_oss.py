"""GPT-OSS (issue 12): exact parameter counts against transformers' meta-device build of ``GptOssForCausalLM``
(the bf16 model fine-tuning runs), what cannot be traced refused by name, and the engine's activations held
to a fake-tensor trace of the same training step within 3%."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog.models import PRESET_INFO, PRESETS, architecture_for
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
logging.getLogger("transformers").setLevel(logging.ERROR)

#: Odd sizes, explicit layer_types, nested yarn rope_scaling as the published config.json has it.
TINY: dict[str, Any] = {
    "model_type": "gpt_oss",
    "hidden_size": 64,
    "intermediate_size": 24,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 20,
    "num_local_experts": 5,
    "num_experts_per_tok": 2,
    "vocab_size": 101,
    "layer_types": ["sliding_attention", "full_attention", "full_attention"],
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 4096,
    },
}


def meta_counts(cfg: dict[str, Any]) -> tuple[int, Counter[str]]:
    """Total parameters and per-kind sums of the transformers model built on the meta device."""
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
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
        else:  # self_attn.{q,k,v,o}_proj (+ biases) and self_attn.sinks
            assert "self_attn" in name, name
            kinds["attention"] += p.numel()
    return sum(p.numel() for p in model.parameters()), kinds


@pytest.mark.parametrize(
    "cfg",
    [
        PRESETS["gpt-oss-20b"],
        PRESETS["gpt-oss-120b"],
        TINY,
        {**TINY, "attention_bias": False, "tie_word_embeddings": True, "layer_types": None},
    ],
    ids=["20b", "120b", "tiny", "tiny-no-bias-tied"],
)
def test_parameters_match_transformers_by_kind(cfg: dict[str, Any]) -> None:
    arch = build_architecture(cfg)
    total, kinds = meta_counts(cfg)
    assert arch.parameters == total
    assert {k: v for k, v in arch.parameters_by_kind().items() if v} == dict(+kinds)


def test_preset_totals_are_the_bf16_models() -> None:
    """transformers 5.24's bf16 builds: 20.9B and 116.8B, as OpenAI publishes (experts dequantised from MXFP4)."""
    assert architecture_for("gpt-oss-20b").parameters == 20_914_757_184
    assert architecture_for("gpt-oss-120b").parameters == 116_829_156_672
    assert "quantization_config" not in PRESETS["gpt-oss-20b"]
    for preset in ("gpt-oss-20b", "gpt-oss-120b"):
        assert "bf16" in PRESET_INFO[preset]["description"] and "MXFP4" in PRESET_INFO[preset]["description"]


def test_inline_dict_with_rope_parameters_equals_preset() -> None:
    """transformers 5's nested rope_parameters (rope_theta inside) count like the preset's rope_scaling."""
    inline = {k: v for k, v in PRESETS["gpt-oss-20b"].items() if k not in ("rope_scaling", "rope_theta")}
    inline["rope_parameters"] = {**PRESETS["gpt-oss-20b"]["rope_scaling"], "rope_theta": 150000.0}
    assert architecture_for(inline).parameters == architecture_for("gpt-oss-20b").parameters
    assert architecture_for(inline).extra["rope_theta"] == 150000.0


def test_biases_sinks_and_layer_types() -> None:
    """Router and experts carry biases; one sink logit per head and layer; sliding/full alternate."""
    arch = build_architecture(TINY)
    by_name = {g.name.removeprefix("model.layers.*."): g for g in arch.params}
    assert (by_name["self_attn.sinks"].shape, by_name["self_attn.sinks"].count) == ((4,), 3)
    assert by_name["mlp.router.bias"].shape == (5,)
    assert by_name["mlp.experts.gate_up_proj_bias"].shape == (48,)
    assert by_name["mlp.experts.gate_up_proj"].shape == (64, 48)  # stored [E, h, 2I]
    assert build_architecture({**TINY, "layer_types": None}).extra["layer_types"] == [
        "sliding_attention",
        "full_attention",
        "sliding_attention",
    ]


def test_bad_keys_are_named() -> None:
    with pytest.raises(ScenarioError, match="model.num_experts_per_tok"):
        build_architecture({**TINY, "num_experts_per_tok": 6})
    with pytest.raises(ScenarioError, match="model.layer_types"):
        build_architecture({**TINY, "layer_types": ["global"] * 3})


def test_untraceable_paths_are_refused_by_name() -> None:
    """transformers has no SDPA path for GPT-OSS, and torch's CPU grouped_mm runs bf16 only."""
    from memsim_widget.trace.traceable import check_traceable

    base = {"model": TINY, "micro_batch_size": 1, "seq_len": 64}
    with pytest.raises(ScenarioError, match="attention.*no SDPA path"):
        check_traceable(Scenario.from_dict(base))
    with pytest.raises(ScenarioError, match="precision.*grouped_mm"):
        check_traceable(Scenario.from_dict({**base, "attention": "eager", "precision": "fp32"}))
    check_traceable(Scenario.from_dict({**base, "attention": "eager"}))
    mixtral = {**base, "model": "mixtral-8x7b", "precision": "amp-bf16"}  # grouped_mm experts too
    with pytest.raises(ScenarioError, match="precision.*grouped_mm"):
        check_traceable(Scenario.from_dict(mixtral))


@pytest.mark.parametrize("name", ["gpt_oss bf16 eager b2 s256", "gpt_oss bf16 eager lora qv b2 s256"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r


def test_sdpa_estimate_takes_no_other_familys_sliding_mask_rule() -> None:
    """GPT-OSS lists sliding layers too, but neither Gemma 3's decoder mask rule nor ModernBERT's local-layer
    one applies to it (a merge once let ModernBERT's fire for any family with ``sliding_layers``)."""
    from memsim_widget.engine.core import estimate

    est = estimate(Scenario.from_dict({"model": "gpt-oss-20b", "method": "lora", "seq_len": 1024}))
    assert not [i.item for i in est.worst.peak.items if "sliding" in i.item]
