"""Cohere Command-R (``model_type: cohere``): exact parameters against transformers, its norm's saved bytes,
the shared norm output, the trace."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _family_meta import assert_matches_transformers  # noqa: E402
from fidelity_cases import CASES, compare  # noqa: E402

from memsim_widget.catalog.models import PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.activations import activations  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

COHERE_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] == "cohere"]

#: Non-default keys: biases on q/k/v/o, GQA, per-head q/k norms, untied head, nested rope_scaling.
INLINE = {
    "model_type": "cohere",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "vocab_size": 301,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "attention_bias": True,
    "use_qk_norm": True,
    "tie_word_embeddings": False,
    "logit_scale": 0.5,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
}


def test_three_presets() -> None:
    assert COHERE_PRESETS == ["command-r-35b", "command-r-32b", "command-r-plus-104b"]


@pytest.mark.parametrize("preset", COHERE_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    assert_matches_transformers(architecture_for(preset), PRESETS[preset])


def test_command_r_35b_by_hand() -> None:
    h, I, L, V = 8192, 22528, 40, 256000
    layer = 4 * h * h + 3 * h * I + h  # q, k, v, o (MHA); SwiGLU; one norm weight, no bias
    assert architecture_for("command-r-35b").parameters == V * h + L * layer + h == 34_980_831_232  # tied


def test_inline_dict_and_file_match_transformers(tmp_path) -> None:
    assert_matches_transformers(architecture_for(INLINE), INLINE)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(INLINE))
    assert architecture_for(str(path)).parameters == architecture_for(INLINE).parameters
    assert estimate(Scenario(model=INLINE, seq_len=64)).parameters == architecture_for(INLINE).parameters
    assert architecture_for(INLINE).extra["logit_scale"] == 0.5


CFG = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
       "num_key_value_heads": 4, "vocab_size": 100}  # fmt: skip


def _terms(model_type: str, **kw) -> dict[str, float]:
    sc = Scenario(model={"model_type": model_type, **CFG}, micro_batch_size=2, seq_len=256, **kw)
    return {t.name: t.bytes for t in activations(Context(sc)).per_layer}


def test_one_norm_saves_two_centred_copies_and_its_output_once() -> None:
    """CohereLayerNorm saves two fp32 centred copies (8 B x T x h), rsqrt (4 B x T) and the fp32 normalised
    tensor (4 B x T x h); its bf16 output feeds q, k, v, gate and up and is saved once (2 B x T x h)."""
    T, h = 512, 256
    t = _terms("cohere")
    assert t["RMSNorm fp32 inputs and rsqrt"] == 8 * T * h + 4 * T
    assert t["RMSNorm normalised tensors"] == 4 * T * h
    assert t["attention input: Linear input"] == 2 * T * h
    assert "MLP input: Linear input" not in t


def test_per_head_qk_norm() -> None:
    """With use_qk_norm each of q and k saves its two centred copies, one rsqrt per head and an fp32
    normalised tensor: (8 + 4) B x T x width + 4 B x T x heads."""
    T, a, kv, d = 512, 8, 4, 32
    sc = Scenario(model={"model_type": "cohere", **CFG, "use_qk_norm": True}, micro_batch_size=2, seq_len=256)
    t = {x.name: x.bytes for x in activations(Context(sc)).per_layer}
    assert t["q_norm fp32 input and rsqrt, normalised tensor"] == 12 * T * a * d + 4 * T * a
    assert t["k_norm fp32 input and rsqrt, normalised tensor"] == 12 * T * kv * d + 4 * T * kv


@pytest.mark.parametrize("name", ["cohere bf16 sdpa b2 s512", "cohere qk-norm bf16 sdpa b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
