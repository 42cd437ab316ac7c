"""DeepSeek-V2 / V3 (issue 12): exact parameter counts against transformers' meta-device build (MLA with and
without q compression, routed + shared experts, dense first layers), and the engine held to a trace within 3%."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.errors import ScenarioError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
logging.getLogger("transformers").setLevel(logging.ERROR)

TINY_V3: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "hidden_size": 64,
    "intermediate_size": 88,
    "moe_intermediate_size": 24,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 40,
    "kv_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 12,
    "v_head_dim": 20,
    "first_k_dense_replace": 2,
    "n_routed_experts": 6,
    "n_shared_experts": 2,
    "num_experts_per_tok": 2,
    "n_group": 3,
    "topk_group": 2,
    "vocab_size": 101,
    "attention_bias": True,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
}
TINY_V2 = {
    **TINY_V3,
    "model_type": "deepseek_v2",
    "q_lora_rank": None,
    "mlp_bias": True,
    "n_group": None,
    "topk_group": None,
}


def meta_total(cfg: dict[str, Any]) -> tuple[int, dict[str, int]]:
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    kinds = {"experts": 0, "router": 0}
    for name, p in model.named_parameters():
        if ".experts." in name:
            kinds["experts"] += p.numel()
        elif name.endswith("mlp.gate.weight"):
            kinds["router"] += p.numel()
    return sum(p.numel() for p in model.parameters()), kinds


@pytest.mark.parametrize(
    "cfg", [PRESETS["deepseek-v3"], PRESETS["deepseek-v2-lite"], TINY_V3, TINY_V2], ids=str
)
def test_parameters_match_transformers(cfg: dict[str, Any]) -> None:
    arch = build_architecture(cfg)
    total, kinds = meta_total(cfg)
    assert arch.parameters == total
    by_kind = arch.parameters_by_kind()
    assert (by_kind["experts"], by_kind["router"]) == (kinds["experts"], kinds["router"])


def test_published_sizes_and_inline_dict() -> None:
    """671B and 15.7B as published (the MTP layer is not part of DeepseekV3ForCausalLM)."""
    assert round(architecture_for("deepseek-v3").parameters / 1e9) == 671
    assert round(architecture_for("deepseek-v2-lite").parameters / 1e9, 1) == 15.7
    inline = {**PRESETS["deepseek-v3"], "rope_scaling": dict(PRESETS["deepseek-v3"]["rope_scaling"])}
    assert architecture_for(inline).parameters == architecture_for("deepseek-v3").parameters


def test_layer_layout() -> None:
    """2 dense layers then 2 MoE layers, each with 6 routed experts and a shared expert 2 x 24 wide."""
    arch = build_architecture(TINY_V3)
    assert {g.count for g in arch.params if g.expert} == {12}
    shared = [g for g in arch.params if g.name.endswith("shared_experts.down_proj.weight")]
    assert [(g.shape, g.count) for g in shared] == [((64, 48), 2)]
    dense = [g for g in arch.params if g.name == "model.layers.*.mlp.down_proj.weight"]
    assert [(g.shape, g.count) for g in dense] == [((64, 88), 2)]


def test_bad_group_settings_are_named() -> None:
    with pytest.raises(ScenarioError, match="model.n_group"):
        build_architecture({**TINY_V3, "n_group": 4})
    with pytest.raises(ScenarioError, match="model.topk_group"):
        build_architecture({**TINY_V3, "topk_group": 5})


@pytest.mark.parametrize(
    "name",
    [
        "deepseek_v3 bf16 sdpa b2 s512",
        "deepseek_v2 bf16 sdpa b2 s512 (no q_lora)",
        "deepseek_v3 bf16 lora q_a kv_a b2 s512",
    ],
)
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
