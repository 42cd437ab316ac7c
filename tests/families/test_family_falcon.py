"""Falcon (``falcon``): parameters exact against transformers' meta build in every layer form (multi-query,
new decoder architecture, classic multi-head, sequential, alibi, biases, untied), the flag combinations whose
transformers forward fails refused by name, and the saved activations held to a fake-tensor trace."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _family_meta import assert_matches_transformers  # noqa: E402

from memsim_widget.architecture import build_architecture  # noqa: E402
from memsim_widget.catalog.models import PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.activations import activations  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402

TINY = {
    "model_type": "falcon",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 8,
    "vocab_size": 101,
}

#: Layer forms FalconDecoderLayer/FalconAttention build (transformers 5.24), each an inline config dict.
FORMS: dict[str, dict[str, Any]] = {
    "multi-query parallel (Falcon-7B)": {},
    "new decoder, 2 kv groups, ln_attn + ln_mlp (Falcon-40B)": {
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
    },
    "new decoder, one LayerNorm": {
        "new_decoder_architecture": True,
        "num_kv_heads": 4,
        "num_ln_in_parallel_attn": 1,
    },
    "classic multi-head sequential": {"multi_query": False, "parallel_attn": False},
    "classic multi-head parallel with biases": {"multi_query": False, "bias": True},
    "multi-query sequential alibi": {"parallel_attn": False, "alibi": True},
    "untied head, ffn_hidden_size": {"tie_word_embeddings": False, "ffn_hidden_size": 100},
    "legacy n_embed": {"hidden_size": None, "n_embed": 64},
}


def test_falcon_7b_by_hand() -> None:
    """Falcon-7B: fused qkv [(71 + 2) x 64, 4544], dense, 4h MLP, one LayerNorm, no biases, tied head."""
    h, V, L, d = 4544, 65024, 32, 64
    per_layer = (h + 2 * d) * h + h * h + 2 * 4 * h * h + 2 * h
    assert per_layer * L + V * h + 2 * h == 6_921_720_704
    assert architecture_for("falcon-7b").parameters == 6_921_720_704


@pytest.mark.parametrize("preset", ["falcon-7b", "falcon-40b", "falcon-180b"])
def test_presets_equal_transformers_meta_build(preset: str) -> None:
    arch = architecture_for(preset)
    assert arch.family == "falcon"
    assert_matches_transformers(arch, PRESETS[preset])


def test_preset_totals_from_transformers() -> None:
    """The meta-build totals (tied heads, FalconConfig's default) written out."""
    assert architecture_for("falcon-40b").parameters == 41_303_293_952
    assert architecture_for("falcon-180b").parameters == 178_557_088_768


@pytest.mark.parametrize("form", sorted(FORMS))
def test_inline_layer_forms_equal_transformers(form: str) -> None:
    cfg = {k: v for k, v in {**TINY, **FORMS[form]}.items() if v is not None}
    assert_matches_transformers(build_architecture(cfg), cfg)


def test_fused_projection_widths() -> None:
    """query_key_value's rows: a + 2 heads (multi-query), a + 2 kv groups (new decoder), 3a (classic)."""
    d, a = 8, 8

    def rows(cfg: dict[str, Any]) -> int:
        arch = build_architecture({**TINY, **cfg})
        return next(g.shape[0] for g in arch.params if g.module == "query_key_value")

    assert rows({}) == (a + 2) * d
    assert rows({"new_decoder_architecture": True, "num_kv_heads": 2}) == (a + 4) * d
    assert rows({"multi_query": False}) == 3 * a * d


@pytest.mark.parametrize(
    ("more", "field"),
    [
        ({"new_decoder_architecture": True, "parallel_attn": False}, "model.parallel_attn"),
        ({"num_ln_in_parallel_attn": 2}, "model.num_ln_in_parallel_attn"),
        ({"multi_query": False, "num_kv_heads": 2}, "model.num_kv_heads"),
        ({"new_decoder_architecture": True, "num_kv_heads": 3}, "model.num_kv_heads"),
        ({"num_attention_heads": 7}, "model.num_attention_heads"),
    ],
)
def test_combinations_transformers_cannot_run_are_refused(more: dict[str, Any], field: str) -> None:
    with pytest.raises(ScenarioError) as err:
        build_architecture({**TINY, **more})
    assert err.value.field == field


def test_alibi_saves_one_bias_for_all_layers() -> None:
    """Falcon-RW's layer (ALiBi, multi-head, biases): no rotary cos/sin, one (b, a, s, s) bias saved by SDPA, and
    query_key_value's output kept whole by its q/k/v views (2 B x T x 2h beside SDPA's q, k, v)."""
    cfg = {
        **TINY,
        "hidden_size": 256,
        "alibi": True,
        "multi_query": False,
        "parallel_attn": False,
        "bias": True,
    }
    acts = activations(Context(Scenario(model=cfg, micro_batch_size=2, seq_len=512)))
    pre = {t.name: t.bytes for t in acts.pre}
    assert pre == {"ALiBi attention bias (b, a, s, s) saved by SDPA": 2 * 2 * 8 * 512 * 512}
    layer = {t.name: t.bytes for t in acts.per_layer}
    assert layer["fused query_key_value output kept alive by the v view"] == 2 * 1024 * 2 * 256
    assert "attention mask cast to a float bias, saved by SDPA" not in layer


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ({"precision": "amp-bf16"}, "precision"),
        ({"attention": "eager"}, "attention"),
        ({"model": {**TINY, "alibi": True, "attention_dropout": 0.1}}, "model.attention_dropout"),
        ({"model": TINY, "activation_checkpointing": "selective-op"}, "activation_checkpointing"),
    ],
)
def test_untraced_combinations_are_refused(keys: dict[str, Any], field: str) -> None:
    """ALiBi under autocast, eager or with attention dropout, and multi-query under selective-op checkpointing:
    an error naming the key, never an untraced figure."""
    sc = Scenario(**{"model": {**TINY, "alibi": True}, "seq_len": 64, **keys})
    with pytest.raises(ScenarioError) as err:
        activations(Context(sc))
    assert err.value.field == field


def test_unfused_bias_under_autocast_keeps_fp32_mlp_activation() -> None:
    """FalconLinear adds its bias after the matmul: under autocast the fp32 bias promotes the MLP's output, and
    GELU saves an fp32 input (4 B x T x I instead of 2)."""
    cfg = {**TINY, "hidden_size": 256, "new_decoder_architecture": True, "num_kv_heads": 2}
    key = "MLP activation internals (gelu)"
    T, inter = 1024, 1024
    assert _layer_terms({**cfg, "bias": True}, precision="amp-bf16")[key] == 4 * T * inter
    assert _layer_terms(cfg, precision="amp-bf16")[key] == 2 * T * inter
    assert _layer_terms({**cfg, "bias": True})[key] == 2 * T * inter


def _layer_terms(cfg: dict[str, Any], **keys: Any) -> dict[str, float]:
    acts = activations(Context(Scenario(model=cfg, micro_batch_size=2, seq_len=512, **keys)))
    return {t.name: t.bytes for t in acts.per_layer}


def test_multi_query_runs_sdpa_math_fallback() -> None:
    """k, v of one head against a query heads: fp32 q and expanded k, v, the fp32 b x a x s x s probabilities."""
    cfg = {**TINY, "hidden_size": 256}
    terms = _layer_terms(cfg)
    T, hq, b, a, s = 1024, 256, 2, 8, 512
    name = "attention q, k, v (fp32; k and v expanded to all heads when b > 1) saved by SDPA's math fallback"
    assert terms[name] == 12 * T * hq
    # with b = 1 the broadcast over (1, a) is a stride-0 view: k and v stay one head wide
    one = activations(Context(Scenario(model=cfg, micro_batch_size=1, seq_len=512)))
    assert {t.name: t.bytes for t in one.per_layer}[name] == 4 * 512 * (hq + 2 * 32)
    assert terms["attention probabilities (fp32, math SDPA)"] == 4 * b * a * s * s
    new = _layer_terms({**cfg, "new_decoder_architecture": True, "num_kv_heads": 2})
    assert new["attention q, k, v saved by SDPA"] == 2 * T * 3 * hq  # k, v broadcast to all heads
    assert new["attention mask cast to a float bias, saved by SDPA"] == 2 * b * s * s


@pytest.mark.parametrize(
    "name",
    [
        "falcon multi-query bf16 sdpa b2 s512",
        "falcon new-decoder bf16 sdpa b2 s512",
        "falcon alibi multi-head sequential bias (RW) bf16 sdpa b2 s512",
    ],
)
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r


def test_a_plan_leaves_out_the_checkpointing_mode_the_engine_refuses() -> None:
    """The planner tries every checkpointing mode; selective-op, refused for Falcon-7B's multi-query attention,
    is left out of the grid instead of stopping the plan, and every listed candidate equals ``estimate``."""
    from memsim_widget.plan import plan
    from memsim_widget.plan.vector import CHECKPOINTING

    p = plan("falcon-7b", "h100-sxm-80gb", 8, seq_len=2048, top=None, check=True)
    assert p.listed > 0
    tried = {CHECKPOINTING[int(code)] for code in p.columns["checkpointing"]}
    assert tried == {"none", "selective", "full"}
