"""StarCoder2 (``model_type: starcoder2``): exact parameters against transformers, what its LayerNorms and
one-op GELU save, the trace."""

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

SC2_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] == "starcoder2"]

#: Non-default keys: no biases on the Linears (LayerNorms keep theirs), MHA, untied head, nested rope_parameters.
INLINE = {
    "model_type": "starcoder2",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 6,
    "vocab_size": 301,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_bias": False,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
}


def test_three_presets() -> None:
    assert SC2_PRESETS == ["starcoder2-3b", "starcoder2-7b", "starcoder2-15b"]


@pytest.mark.parametrize("preset", SC2_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    assert_matches_transformers(architecture_for(preset), PRESETS[preset])


def test_starcoder2_3b_by_hand() -> None:
    h, I, L, a, kv, d, V = 3072, 12288, 30, 24, 2, 128, 49152
    attn = (h + 1) * a * d + 2 * (h + 1) * kv * d + (a * d + 1) * h  # q, k, v, o with biases
    layer = attn + (h + 1) * I + (I + 1) * h + 2 * 2 * h  # c_fc, c_proj with biases; two LayerNorms (w, b)
    assert architecture_for("starcoder2-3b").parameters == V * h + L * layer + 2 * h == 3_030_371_328  # tied


def test_inline_dict_and_file_match_transformers(tmp_path) -> None:
    assert_matches_transformers(architecture_for(INLINE), INLINE)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(INLINE))
    assert architecture_for(str(path)).parameters == architecture_for(INLINE).parameters
    assert estimate(Scenario(model=INLINE, seq_len=64)).parameters == architecture_for(INLINE).parameters


def test_layer_saves_layernorm_inputs_and_one_gelu_input() -> None:
    """bf16, SDPA, MHA: two LayerNorms (input, mean, rstd: 2 B x T x h + 8 B x T each), q/k/v's input and
    c_fc's input (the norm outputs), SDPA's q, k, v, output and logsumexp, GELU's input (2 B x T x I: one fused
    op, unlike GPT-2's gelu_new chain) and c_proj's input."""
    b, s, h, I, a = 2, 256, 256, 512, 8
    T = b * s
    cfg = {"model_type": "starcoder2", "hidden_size": h, "intermediate_size": I, "num_hidden_layers": 2,
           "num_attention_heads": a, "num_key_value_heads": a, "vocab_size": 100}  # fmt: skip
    sc = Scenario(model=cfg, micro_batch_size=b, seq_len=s)
    per_layer = activations(Context(sc)).layer_bytes()
    norms = 2 * (2 * T * h + 8 * T)
    attn = 2 * T * h + 2 * T * 3 * h + 2 * T * h + 4 * b * a * s
    mlp = 2 * T * h + 2 * T * I + 2 * T * I
    assert per_layer == norms + attn + mlp


@pytest.mark.parametrize("name", ["starcoder2 bf16 sdpa b2 s512", "starcoder2 amp-bf16 sdpa b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
