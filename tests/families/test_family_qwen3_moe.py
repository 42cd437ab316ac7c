"""Qwen3-MoE (issue 12): exact parameter counts against transformers' meta-device build, and the engine's
activations held to a fake-tensor trace of the same training step within 3%."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.errors import ScenarioError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
logging.getLogger("transformers").setLevel(logging.ERROR)

TINY: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 88,
    "moe_intermediate_size": 24,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 20,
    "num_experts": 6,
    "num_experts_per_tok": 2,
    "vocab_size": 101,
    "decoder_sparse_step": 2,
    "mlp_only_layers": [3],
    "attention_bias": True,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
}


def meta_counts(cfg: dict[str, Any]) -> tuple[int, Counter[str]]:
    """Total parameters and per-module-kind sums of the transformers model built on the meta device."""
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    kinds: Counter[str] = Counter()
    for name, p in model.named_parameters():
        if ".experts." in name:
            kinds["experts"] += p.numel()
        elif name.endswith("mlp.gate.weight"):
            kinds["router"] += p.numel()
        elif "norm" in name:
            kinds["norm"] += p.numel()
        elif "embed_tokens" in name:
            kinds["embedding"] += p.numel()
        elif name.startswith("lm_head"):
            kinds["head"] += p.numel()
        elif "self_attn" in name:
            kinds["attention"] += p.numel()
        else:
            kinds["mlp"] += p.numel()
    return sum(p.numel() for p in model.parameters()), kinds


@pytest.mark.parametrize("cfg", [PRESETS["qwen3-30b-a3b"], PRESETS["qwen3-235b-a22b"], TINY], ids=str)
def test_parameters_match_transformers_by_kind(cfg: dict[str, Any]) -> None:
    arch = build_architecture(cfg)
    total, kinds = meta_counts(cfg)
    assert arch.parameters == total
    assert {k: v for k, v in arch.parameters_by_kind().items() if v} == dict(+kinds)


def test_inline_dict_equals_preset_and_published_size() -> None:
    """A pasted config (nested rope_scaling included) builds like the preset; 30B-A3B is 30.5B as published."""
    inline = {**PRESETS["qwen3-30b-a3b"], "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    assert architecture_for(inline).parameters == architecture_for("qwen3-30b-a3b").parameters
    assert round(architecture_for("qwen3-30b-a3b").parameters / 1e9, 1) == 30.5
    assert round(architecture_for("qwen3-235b-a22b").parameters / 1e9) == 235


def test_layer_layout_follows_sparse_step_and_mlp_only_layers() -> None:
    """Layers 1 and 5 of 5 (1-based even... (i + 1) % 2 == 0: i = 1, 3) minus mlp_only_layers [3]: one MoE layer."""
    arch = build_architecture(TINY)
    assert arch.extra["moe_layers"] == 1
    experts = [g for g in arch.params if g.expert]
    assert {g.count for g in experts} == {6}  # 1 MoE layer x 6 experts
    dense = [g for g in arch.params if g.module == "down_proj"]
    assert [g.count for g in dense] == [4]


def test_bad_keys_are_named() -> None:
    with pytest.raises(ScenarioError, match="model.num_experts_per_tok"):
        build_architecture({**TINY, "num_experts_per_tok": 7})
    with pytest.raises(ScenarioError, match="model.mlp_only_layers"):
        build_architecture({**TINY, "mlp_only_layers": [9]})


@pytest.mark.parametrize("name", ["qwen3_moe bf16 sdpa b2 s512", "qwen3_moe bf16 lora qv b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
