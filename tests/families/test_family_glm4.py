"""GLM-4 (``model_type: glm4``): exact parameters against transformers, what its norms and RoPE save, the trace."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _family_meta import assert_matches_transformers, meta_model  # noqa: E402
from fidelity_cases import CASES, compare  # noqa: E402

from memsim_widget.catalog.models import PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.activations import activations  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

GLM4_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] == "glm4"]

#: Non-default keys: no attention bias, MHA, tied embeddings, RoPE on a quarter of the head given nested.
INLINE = {
    "model_type": "glm4",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "head_dim": 24,
    "vocab_size": 301,
    "pad_token_id": 0,
    "eos_token_id": 2,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.25},
}


def test_two_presets() -> None:
    assert GLM4_PRESETS == ["glm-4-9b", "glm-4-32b"]


@pytest.mark.parametrize("preset", GLM4_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    assert_matches_transformers(architecture_for(preset), PRESETS[preset])


def test_glm_4_9b_by_hand() -> None:
    h, I, L, a, kv, d, V = 4096, 13696, 40, 32, 2, 128, 151552
    attn = h * a * d + a * d + 2 * (h * kv * d + kv * d) + a * d * h  # q, k, v with biases; o_proj without
    layer = attn + 2 * I * h + h * I + 4 * h  # gate_up_proj [2I, h], down_proj, four norms
    assert architecture_for("glm-4-9b").parameters == 2 * V * h + L * layer + h == 9_400_279_040


def test_inline_dict_and_file_match_transformers(tmp_path) -> None:
    assert_matches_transformers(architecture_for(INLINE), INLINE)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(INLINE))
    assert architecture_for(str(path)).parameters == architecture_for(INLINE).parameters
    assert estimate(Scenario(model=INLINE, seq_len=64)).parameters == architecture_for(INLINE).parameters


def test_rotary_width_follows_the_config() -> None:
    """The rotary tables cover partial_rotary_factor x head_dim channels, as transformers builds inv_freq."""
    arch = architecture_for(INLINE)
    inv_freq = meta_model(INLINE).model.rotary_emb.inv_freq
    assert arch.extra["rotary_dim"] == 2 * inv_freq.shape[0] == 6
    assert architecture_for("glm-4-9b").extra["rotary_dim"] == 64


CFG = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
       "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 100, "pad_token_id": 0}  # fmt: skip


def _layer(model_type: str, **kw) -> float:
    sc = Scenario(model={"model_type": model_type, **CFG}, micro_batch_size=2, seq_len=256, **kw)
    return activations(Context(sc)).layer_bytes()


def test_four_norms_and_the_copied_attention_output() -> None:
    """Against llama with the same widths (bf16): two more RMSNorms (fp32 input, rsqrt, bf16 normalised tensor:
    6 B x T x h + 4 B x T each) and the (b, s, a*d) copy of SDPA's output that o_proj saves (2 B x T x a*d)."""
    T, h, hq = 512, 256, 256
    assert _layer("glm4") - _layer("llama") == 2 * (6 * T * h + 4 * T) + 2 * T * hq


def test_amp_post_norms_keep_16bit_normalised_tensors() -> None:
    """Under autocast the residual stream is fp32: the pre-norms save fp32 normalised tensors, the post-norms
    (reading bf16 projection outputs) bf16 ones: 2 x 4 + 2 x 2 B x T x h."""
    T, h = 512, 256
    sc = Scenario(model={"model_type": "glm4", **CFG}, micro_batch_size=2, seq_len=256, precision="amp-bf16")
    terms = {t.name: t.bytes for t in activations(Context(sc)).per_layer}
    assert terms["RMSNorm normalised tensors"] == (2 * 4 + 2 * 2) * T * h


@pytest.mark.parametrize("name", ["glm4 bf16 sdpa b2 s512", "glm4 amp-bf16 sdpa b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
