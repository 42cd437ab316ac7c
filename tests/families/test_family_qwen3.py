"""Qwen3 (``model_type: qwen3``): exact parameters against transformers, the q/k norms' saved bytes, the trace."""

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

QWEN3_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] == "qwen3"]

#: Non-default keys on purpose: q/k/v/o biases, an explicit head_dim that is not h / heads, GQA, untied head,
#: and nested objects (rope_scaling, a dict of lists) that an inline config must accept.
INLINE = {
    "model_type": "qwen3",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 20,
    "vocab_size": 301,
    "attention_bias": True,
    "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "max_position_embeddings": 4096,
    "task_specific_params": {"note": {"lists": [1, 2, 3]}},
}


def test_six_presets() -> None:
    assert QWEN3_PRESETS == ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"]


@pytest.mark.parametrize("preset", QWEN3_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    assert_matches_transformers(architecture_for(preset), PRESETS[preset])


def test_qwen3_0_6b_by_hand() -> None:
    h, I, L, a, kv, d, V = 1024, 3072, 28, 16, 8, 128, 151936
    layer = (
        h * a * d + 2 * h * kv * d + a * d * h + 3 * h * I + 2 * h + 2 * d
    )  # q, k, v, o, MLP, norms, q/k norms
    assert architecture_for("qwen3-0.6b").parameters == V * h + L * layer + h == 596_049_920  # tied head


def test_inline_dict_and_file_match_transformers(tmp_path) -> None:
    hf = {k: v for k, v in INLINE.items() if k != "task_specific_params"}
    assert_matches_transformers(architecture_for(INLINE), hf)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(INLINE))
    assert architecture_for(str(path)).parameters == architecture_for(INLINE).parameters
    assert estimate(Scenario(model=INLINE, seq_len=64)).parameters == architecture_for(INLINE).parameters


def test_q_and_k_norms_save_fp32_inputs_rsqrt_and_normalised_tensors() -> None:
    """Qwen3 saves what the same config as llama saves, plus per layer each norm's fp32 input (4 B x T x width),
    rsqrt per head (4 B x T x heads) and its bf16 normalised tensor (2 B x T x width)."""
    b, s, a, kv, d = 2, 256, 8, 4, 32
    cfg = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": a,
           "num_key_value_heads": kv, "head_dim": d, "vocab_size": 100}  # fmt: skip
    T = b * s

    def layer(model_type: str, **kw) -> float:
        sc = Scenario(model={"model_type": model_type, **cfg}, micro_batch_size=b, seq_len=s, **kw)
        return activations(Context(sc)).layer_bytes()

    q, k = (4 + 2) * T * a * d + 4 * T * a, (4 + 2) * T * kv * d + 4 * T * kv
    assert layer("qwen3") - layer("llama") == q + k
    # under LoRA the frozen norm weights keep no normalised tensor
    lora = {"method": "lora", "lora": {"rank": 4, "targets": ["q_proj", "v_proj"]}}
    assert layer("qwen3", **lora) - layer("llama", **lora) == 4 * T * (a * d + a) + 4 * T * (kv * d + kv)


@pytest.mark.parametrize("name", ["qwen3 bf16 sdpa b2 s512", "qwen3 bf16 lora qv b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
