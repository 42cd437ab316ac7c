"""ModernBERT (``model_type: modernbert``): exact parameters against transformers' ``ModernBertForMaskedLM``,
its global/local layers, what its layers save (the fused Wqkv buffer, the local layers' SDPA masks), the trace."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _family_meta import assert_matches_transformers, meta_model  # noqa: E402
from fidelity_cases import CASES, MODERNBERT, compare  # noqa: E402

from memsim_widget.architecture import build_architecture  # noqa: E402
from memsim_widget.catalog.models import PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.activations import activations  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

MB_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] == "modernbert"]

#: Non-default keys: every bias on, untied decoder, an explicit layer pattern, nested rope_parameters.
INLINE = {
    "model_type": "modernbert",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "vocab_size": 301,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
    "norm_bias": True,
    "attention_bias": True,
    "mlp_bias": True,
    "classifier_bias": True,
    "tie_word_embeddings": False,
    "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 80000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0},
    },
}


def test_two_presets() -> None:
    assert MB_PRESETS == ["modernbert-base", "modernbert-large"]


@pytest.mark.parametrize("preset", MB_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    arch = architecture_for(preset)
    assert_matches_transformers(arch, PRESETS[preset])
    model = meta_model(PRESETS[preset])
    assert type(model).__name__ == arch.extra["hf_class"] == "ModernBertForMaskedLM"
    assert tuple(model.config.layer_types) == arch.extra["layer_types"]


def test_modernbert_base_by_hand() -> None:
    """149,655,232 and 395,881,664: transformers' counts for ModernBertForMaskedLM (base, large)."""
    for preset, (h, I, L) in {
        "modernbert-base": (768, 1152, 22),
        "modernbert-large": (1024, 2624, 28),
    }.items():
        V = 50368
        layer = 3 * h * h + h * h + 2 * I * h + I * h + 2 * h  # Wqkv, Wo, Wi (2I), Wo, two bias-free norms
        total = (
            V * h + h + L * layer - h + h + (h * h + h) + V
        )  # tied; embeddings norm; layer 0 lacks attn_norm;
        # final_norm; head.dense + head.norm; decoder.bias
        assert architecture_for(preset).parameters == total
    assert architecture_for("modernbert-base").parameters == 149_655_232
    assert architecture_for("modernbert-large").parameters == 395_881_664


def test_inline_dict_matches_transformers() -> None:
    arch = architecture_for(INLINE)
    assert_matches_transformers(arch, INLINE)
    assert arch.extra["rope_theta"] == {"full_attention": 80000.0, "sliding_attention": 5000.0}
    assert arch.extra["sliding_layers"] == 2


def test_global_every_third_layer_by_default() -> None:
    """``global_attn_every_n_layers`` 3 over 22 layers: layers 0, 3, ..., 21 global (8), 14 local, as
    transformers' config builds ``layer_types``."""
    arch = architecture_for("modernbert-base")
    cfg = transformers.AutoConfig.for_model(**PRESETS["modernbert-base"])
    assert list(arch.extra["layer_types"]) == list(cfg.layer_types)
    assert arch.extra["sliding_layers"] == 14 and arch.extra["sliding_window"] == 64


def test_rope_long_sequences_are_accepted() -> None:
    """RoPE bounds nothing: 16,384 tokens (twice the trained context) still estimate."""
    assert architecture_for("modernbert-base").max_seq_len is None
    assert estimate(Scenario(model="modernbert-base", seq_len=16384)).parameters == 149_655_232


@pytest.mark.parametrize("key", ["attention_dropout", "mlp_dropout", "embedding_dropout"])
def test_dropout_is_refused_not_ignored(key: str) -> None:
    with pytest.raises(ScenarioError) as info:
        build_architecture({**INLINE, key: 0.1})
    assert info.value.field == f"model.{key}"


def _layers(seq_len: int, **keys: object) -> float:
    """Per-layer saved bytes of the fidelity shape (h 256, I 384, 8 heads, 4 layers: 2 of them local), b 2."""
    return activations(
        Context(Scenario(model=MODERNBERT, micro_batch_size=2, seq_len=seq_len, **keys))
    ).layer_bytes()


def test_layer_saves_the_fused_qkv_buffer_and_the_local_layers_masks() -> None:
    """bf16, SDPA, full training, per layer (the local layers' masks averaged over the 4): two LayerNorm inputs
    (2 B x T x h + 8 B x T each), the norm outputs Wqkv and Wi read, Wqkv's whole output (3 x 2 B x T x h:
    SDPA's v is a view of it), the rotated q and k, SDPA's output and logsumexp, Wi's output (2 x 2 B x T x I),
    GELU's output and the product (2 B x T x I each), and in the 2 local layers the bf16 (b, 1, s, s) mask SDPA
    made from the boolean one. Layer 0 has no attn_norm: one LayerNorm term fewer there."""
    b, s, h, I, a, L = 2, 512, 256, 384, 8, 4
    T = b * s
    norm = 2 * T * h + 8 * T
    layer = (
        2 * norm + 2 * 2 * T * h + 3 * 2 * T * h + 2 * 2 * T * h + 2 * T * h + 4 * b * a * s + 4 * 2 * T * I
    )
    assert _layers(s) * L == L * layer + 2 * (2 * b * s * s)
    acts = activations(Context(Scenario(model=MODERNBERT, micro_batch_size=b, seq_len=s)))
    (ln,) = [t for t in acts.per_layer if t.name.startswith("LayerNorm")]
    assert ln.skip_first and ln.first_bytes == norm


def test_no_mask_while_the_sequence_is_within_the_half_window() -> None:
    """transformers skips the sliding mask while s < local_attention / 2 (64): then nothing grows with s^2."""
    per_token = _layers(48) / 48
    assert _layers(32) / 32 == per_token
    assert _layers(64) / 64 > per_token  # from 64 tokens on, each local layer keeps its b x s x s mask


@pytest.mark.parametrize(
    "name",
    ["modernbert bf16 sdpa b2 s512", "modernbert bf16 lora Wqkv b2 s512", "modernbert fp32 eager b2 s256"],
)
@pytest.mark.slow
def test_engine_within_one_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r
