"""Phi-1/1.5/2 (``phi``): parameters exact against transformers' meta build and a by-hand sum, the saved
activations of its parallel attention + MLP layer held to a fake-tensor trace."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from memsim_widget.architecture import build_architecture
from memsim_widget.catalog.models import PRESETS, architecture_for
from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

TINY = {
    "model_type": "phi",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 88,
    "vocab_size": 101,
}


def _meta_count(cfg: dict[str, Any]) -> int:
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    return sum(p.numel() for p in model.parameters())


def _by_hand(h: int, i: int, v: int, layers: int, *, kv_width: int, tied: bool, qk_ln: int = 0) -> int:
    """Every tensor of PhiForCausalLM: embedding, per layer (LN, q/k/v/dense with biases, q/k LayerNorm,
    fc1/fc2 with biases), final LN, lm_head weight (unless tied) and its bias."""
    attn = (h * h + h) + 2 * (kv_width * h + kv_width) + (h * h + h)
    per_layer = 2 * h + attn + 2 * 2 * qk_ln + (i * h + i) + (h * i + h)
    return v * h + layers * per_layer + 2 * h + (0 if tied else v * h) + v


@pytest.mark.parametrize(
    ("preset", "h", "layers", "rotary"), [("phi-1_5", 2048, 24, 32), ("phi-2", 2560, 32, 32)]
)
def test_presets_match_transformers_and_the_sum(preset: str, h: int, layers: int, rotary: int) -> None:
    arch = architecture_for(preset)
    expected = _by_hand(h, 4 * h, 51200, layers, kv_width=h, tied=False)
    assert arch.parameters == expected == _meta_count(PRESETS[preset])
    assert arch.extra["rotary_dim"] == rotary  # int(head_dim x partial_rotary_factor)


def test_inline_variants_gqa_qk_layernorm_tied_nested_rope() -> None:
    cfg = {
        **TINY,
        "num_key_value_heads": 2,
        "qk_layernorm": True,
        "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    }
    arch = architecture_for(cfg)
    assert arch.extra["rotary_dim"] == 4
    assert arch.parameters == _by_hand(64, 88, 101, 3, kv_width=32, tied=True, qk_ln=16) == _meta_count(cfg)
    assert [g.name for g in arch.params if g.kind == "head"] == ["lm_head.bias"]


def test_bad_rotary_factor_is_named() -> None:
    with pytest.raises(ScenarioError, match=r"model\.partial_rotary_factor"):
        build_architecture({**TINY, "partial_rotary_factor": 1.5})


def test_one_norm_output_is_saved_once_for_attention_and_mlp() -> None:
    """q, k, v and fc1 read the same normalised tensor: one bf16 T x h 'attention input', no 'MLP input'."""
    cfg = {**TINY, "hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 1024}
    acts = activations(Context(Scenario(model=cfg, micro_batch_size=2, seq_len=512)))
    terms = {t.name: t.bytes for t in acts.per_layer}
    T, h = 1024, 256
    assert terms["attention input: Linear input"] == 2 * T * h
    assert not any(name.startswith("MLP input") for name in terms)
    assert terms["LayerNorm inputs, mean and rstd"] == 2 * T * h + 8 * T


def test_lora_layer0_mlp_saves_nothing() -> None:
    """Under LoRA on q/v the MLP of layer 0 reads the norm of the frozen embeddings: no gradient, nothing saved."""
    cfg = {**TINY, "hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 1024}
    sc = Scenario(
        model=cfg, micro_batch_size=2, seq_len=512, method="lora", lora={"targets": ["q_proj", "v_proj"]}
    )
    mlp = next(t for t in activations(Context(sc)).per_layer if t.name.startswith("MLP activation internals"))
    assert mlp.skip_first and mlp.first_bytes == mlp.bytes == 4 * 2 * 1024 * 1024


@pytest.mark.parametrize("name", ["phi V64 bf16 sdpa b2 s512", "phi V64 bf16 lora qv b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
