"""RoBERTa (``model_type: roberta``): exact parameters against transformers' ``RobertaForMaskedLM``, the
padding offset of its position table, what its layers save, the trace."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _family_meta import assert_matches_transformers, meta_model  # noqa: E402
from fidelity_cases import CASES, compare  # noqa: E402

from memsim_widget.catalog.models import PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.activations import activations  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

ROBERTA_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] in ("roberta", "xlm-roberta")]

#: Non-default keys: untied decoder (its own weight and bias), padding index 2 (3 offset rows), 3 token types.
INLINE = {
    "model_type": "roberta",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "vocab_size": 301,
    "max_position_embeddings": 70,
    "pad_token_id": 2,
    "type_vocab_size": 3,
    "tie_word_embeddings": False,
}


def test_four_presets() -> None:
    assert ROBERTA_PRESETS == ["roberta-base", "roberta-large", "xlm-roberta-base", "xlm-roberta-large"]


@pytest.mark.parametrize("preset", ROBERTA_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    arch = architecture_for(preset)
    assert_matches_transformers(arch, PRESETS[preset])
    assert type(meta_model(PRESETS[preset])).__name__ == arch.extra["hf_class"]
    assert arch.family == "roberta"
    assert arch.max_seq_len == 512  # 514 rows less padding_idx 1 and the row before it


def test_published_sizes() -> None:
    """transformers' counts: roberta-large 355,412,057; XLM-R base 278,295,186 and large 560,142,482 (the
    same model with a 250,002-token vocabulary)."""
    assert architecture_for("roberta-large").parameters == 355_412_057
    assert architecture_for("xlm-roberta-base").parameters == 278_295_186
    assert architecture_for("xlm-roberta-large").parameters == 560_142_482


@pytest.mark.parametrize("model_type", ["xlm-roberta", "camembert"])
def test_roberta_under_other_names_matches_transformers(model_type: str) -> None:
    cfg = {**INLINE, "model_type": model_type}
    arch = architecture_for(cfg)
    assert_matches_transformers(arch, cfg)
    assert arch.parameters == architecture_for(INLINE).parameters


def test_roberta_base_by_hand() -> None:
    """124,697,433: transformers' count for RobertaForMaskedLM (tied decoder; lm_head.bias once)."""
    h, I, L, V, P = 768, 3072, 12, 50265, 514
    emb = V * h + P * h + 1 * h + 2 * h  # word, position (514 rows), one token type, LayerNorm
    layer = 4 * (h * h + h) + (h * I + I) + (I * h + h) + 2 * 2 * h  # q/k/v/dense, MLP, two LayerNorms
    head = (h * h + h) + 2 * h + V  # lm_head.dense, lm_head.layer_norm, lm_head.bias (= decoder.bias)
    assert architecture_for("roberta-base").parameters == emb + L * layer + head == 124_697_433


def test_inline_untied_matches_transformers_and_offsets_positions() -> None:
    """A 70-row table with padding_idx 2: positions 3..69, so 67 tokens (the presets: 514 rows, padding_idx 1,
    512 tokens)."""
    arch = architecture_for(INLINE)
    assert_matches_transformers(arch, INLINE)
    assert arch.max_seq_len == 70 - (2 + 1)  # positions are numbered from pad_token_id + 1
    assert estimate(Scenario(model=INLINE, seq_len=67)).parameters == arch.parameters
    with pytest.raises(ScenarioError) as info:
        estimate(Scenario(model=INLINE, seq_len=68))
    assert info.value.field == "seq_len" and "at most 67" in str(info.value)


def test_a_table_no_longer_than_its_offset_is_refused() -> None:
    with pytest.raises(ScenarioError) as info:
        architecture_for({**INLINE, "max_position_embeddings": 3})
    assert info.value.field == "model.max_position_embeddings"


def test_layer_saves_what_a_bert_layer_saves() -> None:
    """bf16, SDPA, full training: two post-norm LayerNorms (input, mean and rstd each), query/key/value's
    input, SDPA's q, k, v, output and fp32 logsumexp, intermediate.dense's input, GELU's input and
    output.dense's input (2 B x T x I each), and the two residual dropout masks (hidden_dropout_prob 0.1 by
    default, 1 B x T x h each)."""
    b, s, h, I, a = 2, 64, 96, 200, 6
    T = b * s
    sc = Scenario(model=INLINE, micro_batch_size=b, seq_len=s)
    per_layer = activations(Context(sc)).layer_bytes()
    norms = 2 * (2 * T * h + 8 * T)
    attn = 2 * T * h + 3 * 2 * T * h + 2 * T * h + 4 * b * a * s
    mlp = 2 * T * h + 2 * T * I + 2 * T * I
    assert per_layer == norms + attn + mlp + 2 * T * h
    bert = Scenario(model={**INLINE, "model_type": "bert"}, micro_batch_size=b, seq_len=s)
    assert activations(Context(bert)).layer_bytes() == per_layer


@pytest.mark.parametrize(
    "name", ["roberta bf16 sdpa b4 s256 (no dropout)", "roberta bf16 lora qv b4 s256 (no dropout)"]
)
@pytest.mark.slow
def test_engine_within_one_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r
