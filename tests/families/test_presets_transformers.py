"""Every preset's Architecture matches the transformers model it describes, tensor for tensor.

Models are built on the meta device (no memory, no download) from the preset config dicts. The class
per family is the one each builder documents: ``*ForCausalLM`` for decoders, ``*ForMaskedLM`` for BERT,
RoBERTa and ModernBERT, ``T5ForConditionalGeneration`` and ``ViTForImageClassification``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from _family_meta import MASKED_LM_TYPES  # noqa: E402

from memsim_widget.architecture import Architecture, build_architecture  # noqa: E402
from memsim_widget.catalog.models import PRESETS, architecture_for, preset_ids  # noqa: E402

logging.getLogger("transformers").setLevel(logging.ERROR)


def _model_class(model_type: str) -> Any:
    """The transformers class used for training a family (see each builder's docstring)."""
    if model_type in MASKED_LM_TYPES:  # BertForMaskedLM, RobertaForMaskedLM, ModernBertForMaskedLM
        return transformers.AutoModelForMaskedLM
    if model_type == "t5":
        return transformers.T5ForConditionalGeneration
    if model_type == "vit":
        return transformers.ViTForImageClassification
    if model_type == "clip":  # CLIPModel (both towers, projections, logit_scale)
        return transformers.AutoModel
    # LlavaForConditionalGeneration, Gemma3ForConditionalGeneration, LlavaNextForConditionalGeneration,
    # Qwen2VLForConditionalGeneration, Qwen2_5_VLForConditionalGeneration, Llama4ForConditionalGeneration
    if model_type in ("llava", "gemma3", "llava_next", "qwen2_vl", "qwen2_5_vl", "llama4"):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def _build_meta(cfg: dict[str, Any]) -> torch.nn.Module:
    """Instantiate the transformers model of an HF config dict on the meta device."""
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    cls = _model_class(cfg["model_type"])
    with torch.device("meta"):
        if cls in (
            transformers.AutoModelForCausalLM,
            transformers.AutoModelForMaskedLM,
            transformers.AutoModel,
            transformers.AutoModelForImageTextToText,
        ):
            return cls.from_config(hf_cfg)
        return cls(hf_cfg)


def _kind(name: str) -> str:
    """Classify a transformers parameter name into the Architecture's kinds, by simple name rules."""
    n = name.lower()
    if ".experts." in n:
        return "experts"
    # multimodal (CLIP, LLaVA): the projector is a 2-Linear MLP, the contrastive head's projections and scale a head
    if "mm_soft_emb_norm" in n:
        return "norm"
    if "multi_modal_projector." in n:
        return "mlp"
    if n == "model.image_newline" or ".patch_embed." in n:  # LLaVA-NeXT's row-end token, Qwen2-VL's Conv3d
        return "embedding"
    if n.startswith(("visual_projection", "text_projection", "logit_scale")):
        return "head"
    if "position_embedding." in n or "positional_embedding_vlm" in n:  # Llama 4's tower: the latter
        return "position"
    if any(k in n for k in ("class_embedding", "patch_embedding.", "token_embedding.")):
        return "embedding"
    if n.endswith("mlp.gate.weight") or ".router." in n:  # Llama 4 feed_forward.router, GPT-OSS mlp.router
        return "router"
    if ".mixer." in n:  # Mamba's state-space mixer (in_proj, conv1d, x_proj, dt_proj, A_log, D, out_proj)
        return "ssm"
    if ".mamba." in n:  # Jamba's Mamba mixer, its dt/B/C RMSNorms included
        return "ssm"
    if "norm" in n or ".ln_" in n or n.startswith("transformer.ln_f"):
        return "norm"
    if any(k in n for k in ("wpe.", "position_embeddings", "relative_attention_bias")):
        return "position"
    if any(
        k in n
        for k in (
            "embed_tokens",
            "tok_embeddings",
            "wte.",
            "word_embeddings",
            "token_type_embeddings",
            "cls_token",
        )
    ):
        return "embedding"
    if ".embed_in." in n:  # GPT-NeoX
        return "embedding"
    if n.startswith("shared.") or "patch_embeddings" in n:
        return "embedding"
    if n.startswith(("lm_head", "classifier", "cls.predictions", "head.", "language_model.lm_head")) or n in (
        "decoder.weight",
        "decoder.bias",
    ):
        return "head"  # ModernBERT: head.dense, head.norm (a norm, above), decoder
    if any(k in n for k in ("attn", "attention")):
        return "attention"
    if any(k in n for k in ("mlp", "feed_forward", "densereludense", "intermediate", ".output.dense")):
        return "mlp"
    return "other"


def _torch_counts(model: torch.nn.Module) -> tuple[int, dict[str, int]]:
    """Total parameters (shared tensors once) and per-kind sums of a transformers model. A tied embedding is an
    embedding whichever name ``named_parameters`` meets it by first (XLM-R declares its lm_head first)."""
    kinds: Counter[str] = Counter()
    try:
        emb = getattr(model.get_input_embeddings(), "weight", None)
    except NotImplementedError:  # CLIPModel has two towers and names no input embedding
        emb = None
    for name, p in model.named_parameters():
        kinds["embedding" if p is emb else _kind(name)] += p.numel()
    return sum(p.numel() for p in model.parameters()), dict(kinds)


@pytest.mark.parametrize("preset", preset_ids())
def test_preset_parameter_count_matches_transformers(preset: str) -> None:
    """Total and per-kind parameter counts equal those of the meta-device transformers model."""
    arch = architecture_for(preset)
    model = _build_meta(PRESETS[preset])
    total, kinds = _torch_counts(model)
    assert arch.parameters == total
    mine = {k: v for k, v in arch.parameters_by_kind().items() if v}
    expected = {k: v for k, v in kinds.items() if v}
    assert mine == expected
    assert "other" not in mine


def test_flan_t5_head_is_tied_as_transformers_5_builds_it() -> None:
    """transformers 5.24's T5Config forces tie_word_embeddings on (Flan-T5's false only turns off the decoder
    output scaling): the model trained has lm_head.weight is shared.weight, no separate head; the count is
    the meta build's (the transformers 4 checkpoint's separate head, 32128 x 1024, is not in it)."""
    arch = architecture_for("flan-t5-large")
    model = _build_meta(PRESETS["flan-t5-large"])
    assert model.lm_head.weight is model.shared.weight
    assert arch.tied_embeddings and not [g for g in arch.params if g.module == "lm_head"]
    assert arch.parameters == _torch_counts(model)[0] == 783_150_080 - 32128 * 1024
    assert arch.extra["scale_decoder_outputs"] is False and model.config.scale_decoder_outputs is False


@pytest.mark.parametrize("tie", [True, False, None])
@pytest.mark.parametrize("gated", [True, False])
def test_t5_inline_dicts_equal_the_meta_build_with_either_tying(tie: bool | None, gated: bool) -> None:
    """An inline T5 dict with tie_word_embeddings true, false or unset (and tie_encoder_decoder, which
    transformers 5.24 no longer reads) counts what transformers builds."""
    cfg: dict[str, Any] = {
        "model_type": "t5",
        "d_model": 64,
        "d_ff": 96,
        "d_kv": 16,
        "num_heads": 4,
        "num_layers": 2,
        "num_decoder_layers": 3,
        "vocab_size": 100,
        "feed_forward_proj": "gated-gelu" if gated else "relu",
        "tie_encoder_decoder": True,
    }
    if tie is not None:
        cfg["tie_word_embeddings"] = tie
    model = _build_meta(cfg)
    arch = build_architecture(cfg)
    assert arch.parameters == _torch_counts(model)[0]
    assert arch.extra["scale_decoder_outputs"] is model.config.scale_decoder_outputs is (tie is not False)


def _small(model_type: str) -> dict[str, Any]:
    """A tiny but complete config per family, exercising biases, GQA, untied heads and odd sizes."""
    dec = {
        "hidden_size": 64,
        "intermediate_size": 88,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 101,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    configs: dict[str, dict[str, Any]] = {
        "llama": {**dec, "attention_bias": True, "mlp_bias": True},
        "mistral": dec,
        "qwen2": {**dec, "tie_word_embeddings": True},
        "mixtral": {**dec, "num_local_experts": 4, "num_experts_per_tok": 2},
        "gemma": {**dec, "head_dim": 24},
        "gemma2": {**dec, "head_dim": 24, "tie_word_embeddings": False},
        "gemma3_text": {**dec, "head_dim": 24, "tie_word_embeddings": False, "sliding_window_pattern": 2},
        "phi3": dec,
        "gpt2": {
            "n_embd": 64,
            "n_layer": 3,
            "n_head": 4,
            "n_positions": 40,
            "n_inner": 100,
            "vocab_size": 101,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "tie_word_embeddings": False,
        },
        "bert": {
            "hidden_size": 64,
            "intermediate_size": 88,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "vocab_size": 101,
            "max_position_embeddings": 40,
            "type_vocab_size": 3,
            "tie_word_embeddings": False,
        },
        "roberta": {  # untied decoder, padding offset 3
            "hidden_size": 64,
            "intermediate_size": 88,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "vocab_size": 101,
            "max_position_embeddings": 40,
            "pad_token_id": 2,
            "type_vocab_size": 1,
            "tie_word_embeddings": False,
        },
        "modernbert": {  # every bias on, untied decoder, global attention every 2nd layer
            "hidden_size": 64,
            "intermediate_size": 88,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "vocab_size": 101,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "cls_token_id": 1,
            "sep_token_id": 2,
            "norm_bias": True,
            "attention_bias": True,
            "mlp_bias": True,
            "classifier_bias": True,
            "global_attn_every_n_layers": 2,
            "tie_word_embeddings": False,
        },
        "t5": {
            "d_model": 64,
            "d_kv": 20,
            "d_ff": 88,
            "num_layers": 2,
            "num_decoder_layers": 3,
            "num_heads": 4,
            "vocab_size": 101,
            "feed_forward_proj": "gated-gelu",
            "relative_attention_num_buckets": 16,
        },
        "vit": {
            "hidden_size": 64,
            "intermediate_size": 88,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "image_size": 32,
            "patch_size": 8,
            "num_channels": 2,
            "num_labels": 7,
        },
    }
    return {"model_type": model_type, **configs[model_type]}


SMALL_FAMILIES = [
    "llama",
    "mistral",
    "qwen2",
    "mixtral",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt2",
    "bert",
    "roberta",
    "modernbert",
    "t5",
    "vit",
]


def _torch_shapes(model: torch.nn.Module, arch: Architecture) -> Counter[tuple[int, ...]]:
    """Multiset of parameter shapes, with transformers 5's fused expert tensors split per expert as
    ``architecture/moe.routed_experts`` lists them."""
    shapes: Counter[tuple[int, ...]] = Counter()
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if name.endswith("experts.gate_up_proj"):  # [E, 2I, h] -> E x [2I, h] (w1 and w3 together)
            e, two_i, h = shape
            shapes[(two_i, h)] += e
        elif name.endswith("experts.down_proj"):  # [E, h, I] -> E x [h, I] (w2)
            e, h, i = shape
            shapes[(h, i)] += e
        else:
            shapes[shape] += 1
    return shapes


@pytest.mark.parametrize("family", SMALL_FAMILIES)
def test_param_group_shapes_match_transformers(family: str) -> None:
    """Each ParamGroup's shape x count matches the transformers parameters one for one."""
    cfg = _small(family)
    arch = build_architecture(cfg)
    model = _build_meta(cfg)
    mine: Counter[tuple[int, ...]] = Counter()
    for g in arch.params:
        mine[g.shape] += g.count
    assert mine == _torch_shapes(model, arch)
    total, kinds = _torch_counts(model)
    assert arch.parameters == total


@pytest.mark.parametrize("family", SMALL_FAMILIES)
def test_linear_module_names_match_transformers(family: str) -> None:
    """Every nn.Linear leaf name in the transformers model is a ``module`` of some ParamGroup."""
    cfg = _small(family)
    arch = build_architecture(cfg)
    model = _build_meta(cfg)
    modules = {g.module for g in arch.params if g.module}
    try:
        emb = getattr(model.get_input_embeddings(), "weight", None)
    except NotImplementedError:  # CLIPModel has two towers and names no input embedding
        emb = None
    leaves = {
        name.rsplit(".", 1)[-1]
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and m.weight is not emb  # a tied head is the embedding
    }
    assert leaves <= modules
