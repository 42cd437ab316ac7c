"""Gemma 3 (``gemma3_text``) and the Gemma 2 fixes: exact parameters against transformers, what transformers runs
(Gemma 2 has no SDPA path), what the norms, softcapping and sliding masks save, and the trace."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402
import transformers  # noqa: E402
from _family_meta import assert_matches_transformers, meta_counts, meta_model  # noqa: E402
from fidelity_cases import CASES, compare  # noqa: E402

from memsim_widget.catalog.models import PRESET_INFO, PRESETS, architecture_for  # noqa: E402
from memsim_widget.engine.activations import activations  # noqa: E402
from memsim_widget.engine.context import Context  # noqa: E402
from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402
from memsim_widget.trace.traceable import trace_kwargs  # noqa: E402

GEMMA3_PRESETS = [p for p, cfg in PRESETS.items() if cfg["model_type"] == "gemma3_text"]

#: google/gemma-3-4b-pt config.json's text_config, as published (the rest is left to Gemma3TextConfig's defaults)
TEXT_CONFIG_4B = {
    "hidden_size": 2560,
    "intermediate_size": 10240,
    "model_type": "gemma3_text",
    "num_hidden_layers": 34,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window": 1024,
}

#: ... and its vision_config (SigLIP, 27 layers)
VISION_CONFIG_4B = {
    "hidden_size": 1152,
    "image_size": 896,
    "intermediate_size": 4304,
    "model_type": "siglip_vision_model",
    "num_attention_heads": 16,
    "num_hidden_layers": 27,
    "patch_size": 14,
    "vision_use_head": False,
}

#: Non-default keys: q/k/v/o biases, untied head, head_dim not h / heads, explicit layer_types, and the
#: transformers 5 per-layer-kind rope_parameters (nested dicts) with one theta left to rope_local_base_freq.
INLINE = {
    "model_type": "gemma3_text",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 20,
    "vocab_size": 301,
    "attention_bias": True,
    "tie_word_embeddings": False,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default"},
    },
    "rope_local_base_freq": 20000.0,
}


def test_four_presets_named_so_nobody_believes_the_vision_tower_is_counted() -> None:
    assert GEMMA3_PRESETS == ["gemma-3-1b", "gemma-3-4b-text", "gemma-3-12b-text", "gemma-3-27b-text"]
    for preset in GEMMA3_PRESETS[1:]:
        assert "LANGUAGE MODEL ONLY" in PRESET_INFO[preset]["description"]
        assert "vision tower" in PRESET_INFO[preset]["description"]


@pytest.mark.parametrize("preset", GEMMA3_PRESETS)
def test_preset_matches_transformers(preset: str) -> None:
    assert_matches_transformers(architecture_for(preset), PRESETS[preset])


def test_gemma_3_1b_by_hand() -> None:
    h, I, L, a, kv, d, V = 1152, 6912, 26, 4, 1, 256, 262144
    layer = (
        h * a * d + 2 * h * kv * d + a * d * h + 3 * h * I + 4 * h + 2 * d
    )  # q, k, v, o, GeGLU, 4 norms, q/k norms
    assert architecture_for("gemma-3-1b").parameters == V * h + L * layer + h == 999_885_952  # tied head


def test_text_presets_are_the_language_model_inside_the_multimodal_model() -> None:
    """gemma-3-4b-text counts exactly the parameters of Gemma3ForConditionalGeneration's language model (the
    published text_config with the defaults written out); the vision tower and projector come on top."""
    cfg = transformers.Gemma3Config(text_config=dict(TEXT_CONFIG_4B), vision_config=dict(VISION_CONFIG_4B))
    with torch.device("meta"):
        vlm = transformers.Gemma3ForConditionalGeneration(cfg)
    language_model = sum(p.numel() for p in vlm.model.language_model.parameters())  # lm_head is tied to it
    assert architecture_for("gemma-3-4b-text").parameters == language_model == 3_880_263_168
    assert (
        sum(p.numel() for p in vlm.parameters()) == 4_300_079_472
    )  # the published 4.3B: +419,816,304 not counted


def test_multimodal_config_builds_the_whole_model_and_names_missing_sizes() -> None:
    """A ``gemma3`` config is Gemma3ForConditionalGeneration (tower, projector, LM: tests/families/test_family_multimodal.py);
    the published text_config leaves sizes to Gemma3TextConfig's defaults, which the builder requires written out."""
    with pytest.raises(ScenarioError) as err:
        architecture_for(
            {"model_type": "gemma3", "text_config": TEXT_CONFIG_4B, "vision_config": VISION_CONFIG_4B}
        )
    assert err.value.field == "model.text_config.num_attention_heads" and "\n" not in str(err.value)
    filled = {**TEXT_CONFIG_4B, "vocab_size": 262208, "num_attention_heads": 8, "num_key_value_heads": 4}
    assert architecture_for(filled).parameters == architecture_for("gemma-3-4b-text").parameters
    whole = architecture_for(
        {"model_type": "gemma3", "text_config": filled, "vision_config": VISION_CONFIG_4B}
    )
    assert whole.parameters == architecture_for("gemma-3-4b").parameters == 4_300_079_472


def test_inline_dict_and_file_match_transformers(tmp_path) -> None:
    assert_matches_transformers(architecture_for(INLINE), INLINE)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(INLINE))
    assert architecture_for(str(path)).parameters == architecture_for(INLINE).parameters
    assert estimate(Scenario(model=INLINE, seq_len=64)).parameters == architecture_for(INLINE).parameters


def test_layer_kinds_and_rope_bases_read_as_transformers_reads_them() -> None:
    """layer_types given or from sliding_window_pattern; one RoPE base per kind (rope_parameters, else
    rope_theta / rope_local_base_freq), as Gemma3TextConfig resolves them."""
    for cfg in (
        INLINE,
        PRESETS["gemma-3-27b-text"],
        {**INLINE, "layer_types": None, "sliding_window_pattern": 2},
    ):
        hf = transformers.AutoConfig.for_model(**cfg)
        arch = architecture_for(cfg)
        assert list(arch.extra["layer_types"]) == hf.layer_types
        assert arch.extra["rope_theta"] == hf.rope_parameters["full_attention"]["rope_theta"]
        assert arch.extra["rope_local_base_freq"] == hf.rope_parameters["sliding_attention"]["rope_theta"]
    assert architecture_for(INLINE).extra["rope_local_base_freq"] == 20000.0
    assert (
        architecture_for("gemma-3-1b").extra["layer_types"].count("full_attention") == 4
    )  # layers 6, 12, 18, 24
    rotary = meta_model(INLINE).model.rotary_emb
    assert {n for n, _ in rotary.named_buffers()} >= {"sliding_attention_inv_freq", "full_attention_inv_freq"}


def test_hidden_size_not_a_multiple_of_heads_is_refused_as_transformers_refuses_it() -> None:
    bad = {**INLINE, "num_attention_heads": 7, "num_key_value_heads": 7}
    with pytest.raises(
        Exception, match="not a multiple"
    ):  # huggingface_hub StrictDataclassClassValidationError
        transformers.AutoConfig.for_model(**bad)
    with pytest.raises(ScenarioError, match="multiple"):
        architecture_for(bad)


def test_bidirectional_gemma3_is_refused_naming_the_key() -> None:
    with pytest.raises(ScenarioError, match="use_bidirectional_attention"):
        architecture_for({**INLINE, "use_bidirectional_attention": True})


# ----------------------------------------------------------------------------- what transformers runs

GEMMA2 = {"model_type": "gemma2", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
          "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "vocab_size": 100}  # fmt: skip


def test_gemma2_has_no_sdpa_in_transformers_and_the_estimate_says_it_runs_eager() -> None:
    """transformers refuses attn_implementation='sdpa' for Gemma 2 (softcapping) and defaults it to eager;
    Gemma 3 runs SDPA. The default scenario (sdpa) is estimated and traced as what transformers runs."""
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**GEMMA2), attn_implementation="sdpa"
        )
    with torch.device("meta"):
        default = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**GEMMA2))
    assert default.config._attn_implementation == "eager"
    g3 = transformers.AutoModelForCausalLM.from_config(
        transformers.AutoConfig.for_model(**INLINE), attn_implementation="sdpa"
    )
    assert g3.config._attn_implementation == "sdpa"

    sc = Scenario(model=GEMMA2, micro_batch_size=2, seq_len=256)
    est = estimate(sc)
    assert est.attention["requested"] == "sdpa" and est.attention["used"] == "eager"
    assert "no SDPA" in est.attention["why"] and est.to_dict()["attention"] == est.attention
    assert trace_kwargs(sc)["attention"] == "eager"
    eager = Scenario(model=GEMMA2, micro_batch_size=2, seq_len=256, attention="eager")
    assert activations(Context(sc)).layer_bytes() == activations(Context(eager)).layer_bytes()
    assert estimate(Scenario(model=INLINE, seq_len=64)).attention == {"requested": "sdpa", "used": "sdpa"}


def _terms(sc: Scenario) -> dict[str, float]:
    """The per-layer activation terms of a scenario, by name (prefix before any parenthesis note)."""
    return {t.name.split(" (eager:")[0]: t.bytes for t in activations(Context(sc)).per_layer}


def test_softcapping_saves_the_tanh_outputs() -> None:
    """Gemma 2's eager attention keeps tanh(scores / 50) (2 B x b x a x s x s in bf16) beside llama's fp32 softmax and
    its cast; the final softcapping keeps tanh(logits / 30) (2 B x T x V) until the loss backward."""
    b, s, a, V = 2, 256, 8, 100
    sc = Scenario(model=GEMMA2, micro_batch_size=b, seq_len=s)
    terms = _terms(sc)
    assert terms["attention logit softcapping: tanh output"] == 2 * b * a * s * s
    assert terms["attention softmax (fp32) and its 16-bit cast"] == (4 + 2) * b * a * s * s
    saved = {t.name: t.bytes for t in activations(Context(sc)).loss_saved}
    assert saved["final logit softcapping (30): tanh output"] == 2 * b * s * V
    off = Scenario(model={**GEMMA2, "attn_logit_softcapping": None, "final_logit_softcapping": None},
                   micro_batch_size=b, seq_len=s)  # fmt: skip
    assert "attention logit softcapping: tanh output" not in _terms(off)
    assert len(activations(Context(off)).loss_saved) == 1  # the fp32 log-softmax only


CFG = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
       "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 100}  # fmt: skip


def test_gemma_norms_save_fp32_normalised_tensors_only_when_their_weight_trains() -> None:
    """Gemma's RMSNorm returns (normed(x) * (1 + w.float())).type_as(x): per norm the fp32 input (4 B x T x h), rsqrt
    (4 B x T), fp32 (1 + w) (4 B x h) and, if w trains, the fp32 normalised tensor (4 B x T x h); the q/k norms
    likewise per head (width a*d or kv*d, d = 64)."""
    b, s, h, hq, hkv, a, kv, d = 2, 256, 256, 512, 256, 8, 4, 64
    T = b * s
    full = _terms(Scenario(model={"model_type": "gemma3_text", **CFG}, micro_batch_size=b, seq_len=s))
    assert full["RMSNorm fp32 inputs and rsqrt, fp32 (1 + w)"] == 4 * (4 * T * h + 4 * T + 4 * h)
    assert full["RMSNorm normalised tensors"] == 4 * 4 * T * h
    assert full["q_norm fp32 input and rsqrt, normalised tensor"] == 8 * T * hq + 4 * T * a + 4 * d
    assert full["k_norm fp32 input and rsqrt, normalised tensor"] == 8 * T * hkv + 4 * T * kv + 4 * d
    lora = {"method": "lora", "lora": {"rank": 4, "targets": ["q_proj", "v_proj"]}}
    frozen = _terms(
        Scenario(model={"model_type": "gemma3_text", **CFG}, micro_batch_size=b, seq_len=s, **lora)
    )
    assert "RMSNorm normalised tensors" not in frozen
    assert frozen["q_norm fp32 input and rsqrt"] == 4 * T * hq + 4 * T * a + 4 * d


def test_under_autocast_every_linear_reading_a_gemma_norm_keeps_its_own_16bit_copy() -> None:
    """Under autocast the residual stream is fp32 and ``type_as(x)`` keeps the norm output fp32: q, k and v each save
    a bf16 copy of it (3 x 2 B x T x h), gate_proj and up_proj two more."""
    T, h = 512, 256
    sc = Scenario(
        model={"model_type": "gemma3_text", **CFG}, micro_batch_size=2, seq_len=256, precision="amp-bf16"
    )
    terms = _terms(sc)
    assert terms["attention input: autocast 16-bit input copies"] == 3 * 2 * T * h
    assert terms["MLP input: autocast 16-bit input copies"] == 2 * 2 * T * h


def test_sliding_layers_past_the_window_save_the_mask_and_repeated_kv() -> None:
    """At s >= sliding_window transformers passes a mask to SDPA on sliding layers: k and v are repeated to all heads
    (2 x 2 B x T x (a*d - kv*d)) and SDPA keeps the additive bf16 mask (2 B x b x s x s); averaged over the
    layers (here 1 of 2 sliding). Nothing below the window."""
    b, s, hq, hkv = 2, 256, 512, 256
    T = b * s
    model = {"model_type": "gemma3_text", **CFG, "sliding_window_pattern": 2}
    name = "sliding-window layers: SDPA's additive mask, k and v repeated to all heads"
    inside = _terms(Scenario(model={**model, "sliding_window": 256}, micro_batch_size=b, seq_len=s))
    assert inside[name] == (2 * 2 * T * (hq - hkv) + 2 * b * s * s) / 2
    assert not any(
        k.startswith("sliding") for k in _terms(Scenario(model=model, micro_batch_size=b, seq_len=s))
    )


def test_two_rope_tables_when_both_layer_kinds_exist() -> None:
    """One (cos, sin) pair per layer kind present: 2 x 2 x 2 B x s x d in bf16."""
    s, d = 256, 64
    both = Scenario(model={"model_type": "gemma3_text", **CFG, "sliding_window_pattern": 2}, seq_len=s)
    one = Scenario(model={"model_type": "gemma3_text", **CFG}, seq_len=s)  # 2 layers, pattern 6: all sliding
    rope = {
        sc: next(t.bytes for t in activations(Context(sc)).pre if t.name.startswith("rotary"))
        for sc in (both, one)
    }
    assert rope[both] == 2 * 2 * 2 * s * d and rope[one] == 2 * 2 * s * d


def test_eager_softmax_backward_counts_what_the_top_layer_freed_before_it() -> None:
    """At the top layer's softmax backward the fp32 gradients (4 + 2 B x b x a x s x s), the residual's gradient
    (2 B x T x h) and v's at every head (2 B x T x a*d) are live, while o_proj's input (2 B x T x a*d), the MLP's
    saved tensors (GeGLU: 3 x 2 B x T x I, down_proj's input 2 B x T x I), the three norms after the attention
    (post-attention, pre- and post-feed-forward: each its fp32 input 4 B x T x h, rsqrt 4 B x T, fp32 (1 + w)
    4 B x h and fp32 normalised tensor 4 B x T x h), the MLP input (2 B x T x h) and the repeated v (2 B x T x a*d,
    4 kv heads of 8) are gone."""
    b, s, a, h, hq, I = 2, 256, 8, 256, 256, 512
    T = b * s
    bwd = activations(Context(Scenario(model=GEMMA2, micro_batch_size=b, seq_len=s))).attention_backward
    held = (4 + 2) * b * a * s * s + 2 * T * h + 2 * T * hq
    norms = 3 * (4 * T * h + 4 * T + 4 * h + 4 * T * h)
    assert [t.bytes for t in bwd] == [held - 2 * T * hq - 4 * 2 * T * I - norms - 2 * T * h - 2 * T * hq]


# ----------------------------------------------------------------------------- the trace


@pytest.mark.slow
def test_memsim_trace_runs_on_gemma2_and_gemma3(tmp_path) -> None:
    """``memsim trace`` used to crash on Gemma (its embed_scale buffer is a constant made in __init__, a real meta
    tensor under fake mode; and 'sdpa' was passed to Gemma 2, which transformers refuses)."""
    for model in (GEMMA2, {"model_type": "gemma3_text", **CFG}):
        path = tmp_path / "s.json"
        path.write_text(json.dumps({"model": model, "micro_batch_size": 1, "seq_len": 64}))
        proc = subprocess.run(
            [sys.executable, "-m", "memsim_widget.cli", "trace", str(path), "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        data = json.loads(proc.stdout)
        assert data["model"]["parameters"] == meta_counts(model)[0]


@pytest.mark.parametrize(
    "name",
    [
        "gemma2 bf16 default attention (eager) b2 s256",
        "gemma2 bf16 eager b2 s512",
        "gemma2 bf16 eager b2 s256 (32k vocab: final logit softcapping at the loss)",
        "gemma3_text bf16 sdpa b2 s512",
        "gemma3_text amp-bf16 sdpa b2 s512",
        "gemma3_text bf16 lora qv b2 s512",
        "gemma3_text bf16 sdpa b2 s512 (sliding_window 128: masked sliding layers, k/v repeated)",
    ],
)
@pytest.mark.slow
def test_engine_within_three_percent_of_trace(name: str) -> None:
    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.03, r


@pytest.mark.slow
def test_gemma2s_top_of_backward_meets_the_trace_at_its_softmax_backward() -> None:
    """Gemma 2 bf16 b2 s512 (sandwich norms: three after the attention core): the engine's top-of-backward moment
    is the trace's live bytes when the top layer's ``_softmax_backward_data`` allocates, over by the tracker's
    small tensors only (7,870 B; +2.67% while the norms after the attention and the MLP input were counted)."""
    from memsim_widget.trace.api import trace_config

    sc = Scenario.from_dict(dict(CASES)["gemma2 bf16 eager b2 s512"])
    tk = trace_config(sc).tracker
    step = max(tk.step_peaks)
    seq = min(
        r.alloc_seq
        for r in tk.records
        if r.step == step and r.phase == "backward" and r.op == "_softmax_backward_data"
    )
    top = next(m.tensor_bytes for m in estimate(sc).worst.moments if m.name == "backward_top")
    assert 0 <= top - tk.live_bytes_at(seq) < 16384, (top, tk.live_bytes_at(seq))


def test_a_gemma2_pipeline_trace_is_refused_naming_why() -> None:
    """Pipeline stages are traced with SDPA (is_causal, no mask between stages); Gemma 2 runs eager."""
    from memsim_widget.trace.pipeline import check_pipeline

    sc = Scenario(model=GEMMA2, parallel={"pp": 2, "pp_microbatches": 2})
    with pytest.raises(ScenarioError, match="no SDPA path"):
        check_pipeline(sc)
