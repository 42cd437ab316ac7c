"""OLMo 2 (``model_type: olmo2``): exact parameters against transformers, what its norms save, the trace."""

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

OLMO2_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] == "olmo2"]

#: Non-default keys: attention biases, GQA, an explicit head_dim (not h / heads), tied embeddings, nested rope.
INLINE = {
    "model_type": "olmo2",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 20,
    "vocab_size": 301,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "attention_bias": True,
    "tie_word_embeddings": True,
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
}


def test_four_presets() -> None:
    assert OLMO2_PRESETS == ["olmo-2-1b", "olmo-2-7b", "olmo-2-13b", "olmo-2-32b"]


@pytest.mark.parametrize("preset", OLMO2_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    assert_matches_transformers(architecture_for(preset), PRESETS[preset])


def test_olmo_2_7b_by_hand() -> None:
    h, I, L, V = 4096, 11008, 32, 100352
    # q, k, v, o [h, h]; SwiGLU; two post-norms [h]; q_norm and k_norm over the full projection [h] (MHA)
    layer = 4 * h * h + 3 * h * I + 2 * h + 2 * h
    assert architecture_for("olmo-2-7b").parameters == 2 * V * h + L * layer + h == 7_298_617_344


def test_inline_dict_and_file_match_transformers(tmp_path) -> None:
    assert_matches_transformers(architecture_for(INLINE), INLINE)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(INLINE))
    assert architecture_for(str(path)).parameters == architecture_for(INLINE).parameters
    assert estimate(Scenario(model=INLINE, seq_len=64)).parameters == architecture_for(INLINE).parameters


CFG = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
       "num_key_value_heads": 4, "vocab_size": 100}  # fmt: skip


def _layer(model_type: str, **kw) -> float:
    sc = Scenario(model={"model_type": model_type, **CFG}, micro_batch_size=2, seq_len=256, **kw)
    return activations(Context(sc)).layer_bytes()


def test_norms_save_fp32_normalised_tensors() -> None:
    """Against the llama layout (two RMSNorms over h, bf16 normalised tensors): the post-norms keep their
    normalised tensor in fp32 (+2 B x T x h each), and the q/k norms over the whole projection save their
    fp32 input, one rsqrt per token and an fp32 normalised tensor (8 B x T x width + 4 B x T each)."""
    T, h, hq, hkv = 512, 256, 256, 128
    assert _layer("olmo2") - _layer("llama") == 2 * 2 * T * h + (8 * T * hq + 4 * T) + (8 * T * hkv + 4 * T)


def test_lora_layer_zero_post_norm_reads_the_adapted_attention() -> None:
    """Under LoRA llama's layer 0 input norm reads frozen embeddings and saves nothing; OLMo 2's first norm
    reads the attention output, which needs a gradient once q or v carries an adapter."""
    lora = {"method": "lora", "lora": {"rank": 4, "targets": ["q_proj", "v_proj"]}}
    terms = activations(
        Context(Scenario(model={"model_type": "olmo2", **CFG}, seq_len=256, **lora))
    ).per_layer
    norms = next(t for t in terms if t.name == "RMSNorm fp32 inputs and rsqrt")
    assert not norms.skip_first
    k_norm = next(t for t in terms if t.name.startswith("k_norm"))
    assert (
        k_norm.skip_first and k_norm.first_bytes == k_norm.bytes
    )  # k_proj has no adapter: layer 0 saves none


def test_amp_kv_cache_holds_no_fp32_keys() -> None:
    """OLMo 2's RoPE casts q and k back to their dtype, so under autocast the cache's k is the 16-bit one SDPA
    saves (llama's fp32-RoPE k is an extra 4 B x T x kv*d per layer until the outputs are dropped)."""

    def cache(model_type: str) -> float:
        sc = Scenario(model={"model_type": model_type, **CFG}, seq_len=256, precision="amp-bf16")
        return sum(t.bytes for t in activations(Context(sc)).cache_per_layer)

    assert cache("llama") == 4 * 256 * 128
    assert cache("olmo2") == 0


@pytest.mark.parametrize("name", ["olmo2 bf16 sdpa b2 s512", "olmo2 amp-bf16 sdpa b2 s512"])
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r
