"""GPT-NeoX / Pythia (``gpt_neox``): parameters exact against transformers and the Pythia model card, the saved
activations of its layer (parallel residual, partial rotary) held to a fake-tensor trace."""

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

#: Total parameters as the Pythia model card lists them ("exact parameter counts", EleutherAI/pythia-*).
MODEL_CARD = {
    "pythia-160m": 162_322_944,
    "pythia-1.4b": 1_414_647_808,
    "pythia-6.9b": 6_857_302_016,
    "pythia-12b": 11_846_072_320,
}

TINY = {
    "model_type": "gpt_neox",
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


@pytest.mark.parametrize("preset", sorted(MODEL_CARD))
def test_pythia_presets_match_the_model_card_and_transformers(preset: str) -> None:
    arch = architecture_for(preset)
    assert arch.family == "gpt_neox"
    assert arch.parameters == MODEL_CARD[preset]
    assert arch.parameters == _meta_count(PRESETS[preset])


def test_tiny_config_counts_every_tensor_by_hand() -> None:
    """h=64, I=88, V=101, 3 layers, biases everywhere, untied head: the sum written out tensor by tensor."""
    h, i, v, layers = 64, 88, 101, 3
    per_layer = (3 * h * h + 3 * h) + (h * h + h) + (i * h + i) + (h * i + h) + 2 * 2 * h
    expected = v * h + layers * per_layer + 2 * h + v * h
    arch = build_architecture(TINY)
    assert arch.parameters == expected == _meta_count(TINY)
    qkv = [g for g in arch.params if g.module == "query_key_value"]
    assert [(g.shape, g.count) for g in qkv] == [((3 * h, h), layers)]


def test_inline_dict_with_nested_rope_parameters() -> None:
    """transformers 5's ``rope_parameters`` (a nested object) sets the rotary share; no biases, tied head."""
    cfg = {
        **TINY,
        "rope_parameters": {"rope_type": "default", "rope_theta": 20000.0, "partial_rotary_factor": 0.5},
        "attention_bias": False,
        "tie_word_embeddings": True,
        "use_parallel_residual": False,
    }
    arch = architecture_for(cfg)
    assert arch.extra["rotary_dim"] == 8  # int(16 x 0.5)
    assert arch.extra["rope_theta"] == 20000.0
    assert arch.parameters == _meta_count(cfg)
    sc = Scenario(model=cfg, seq_len=64)
    assert sc.model["rope_parameters"]["partial_rotary_factor"] == 0.5


def test_legacy_rotary_pct_and_bad_values() -> None:
    assert build_architecture({**TINY, "rotary_pct": 1.0}).extra["rotary_dim"] == 16
    assert build_architecture(TINY).extra["rotary_dim"] == 4  # default 0.25 of head_dim 16
    with pytest.raises(ScenarioError, match=r"model\.rotary_pct"):
        build_architecture({**TINY, "rotary_pct": 0})
    with pytest.raises(ScenarioError, match=r"model\.num_attention_heads"):
        build_architecture({**TINY, "num_attention_heads": 5})


def _layer_terms(cfg: dict[str, Any], **keys: Any) -> dict[str, float]:
    acts = activations(Context(Scenario(model=cfg, micro_batch_size=2, seq_len=512, **keys)))
    return {t.name: t.bytes for t in acts.per_layer}


def test_parallel_residual_saves_the_layer_input_once() -> None:
    """Both norms read x under the parallel residual: one bf16 T x h input fewer than the sequential layer."""
    cfg = {**TINY, "hidden_size": 256, "num_attention_heads": 8, "intermediate_size": 1024}
    par = _layer_terms(cfg)
    seq = _layer_terms({**cfg, "use_parallel_residual": False})
    name = "LayerNorm inputs, mean and rstd"
    T, h = 2 * 512, 256
    assert seq[name] - par[name] == 2 * T * h
    # the out-projection saves the (b, s, a*d) copy of SDPA's output (q comes out of torch.cat)
    assert par["attention output (b, s, a*d) copy: Linear input"] == 2 * T * h


@pytest.mark.parametrize("name", ["gpt_neox bf16 sdpa b2 s512", "gpt_neox sequential V64 bf16 b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
