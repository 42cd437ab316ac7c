"""Model presets: published HF ``config.json`` values per preset id, and how a ``model`` input resolves.

A scenario's ``model`` is a preset id (``"llama-3.1-8b"``), a path to a local HF ``config.json`` (or a
folder holding one), or an inline HF config dict with a ``model_type``. Preset dicts carry the keys of
the published configs that shape the model; purely runtime keys (torch_dtype, transformers_version,
use_cache, task_specific_params) are left out. Classification ViTs carry ``num_labels`` instead of the
1000-entry ``id2label`` map. ``vit-huge-patch14-224`` is the ImageNet-21k checkpoint (published without
a classifier); the preset gives it a 1000-label ImageNet-1k head like the other two ViTs, i.e. it models
fine-tuning it for classification.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..architecture import Architecture, build_architecture
from ..errors import ScenarioError, choice_error, short_repr
from ..jsonio import read_json_object

# ----------------------------------------------------------------------------- shared key sets

_GPT2_BASE: dict[str, Any] = {
    "model_type": "gpt2",
    "architectures": ["GPT2LMHeadModel"],
    "activation_function": "gelu_new",
    "attn_pdrop": 0.1,
    "embd_pdrop": 0.1,
    "resid_pdrop": 0.1,
    "bos_token_id": 50256,
    "eos_token_id": 50256,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "n_ctx": 1024,
    "n_positions": 1024,
    "vocab_size": 50257,
}
_BERT_BASE: dict[str, Any] = {
    "model_type": "bert",
    "architectures": ["BertForMaskedLM"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}
_LLAMA2_BASE: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 4096,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
_LLAMA3_BASE: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
}
_LLAMA31_ROPE = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
_LLAMA32_ROPE = {**_LLAMA31_ROPE, "factor": 32.0}
_QWEN25_BASE: dict[str, Any] = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "use_mrope": False,
    "use_sliding_window": False,
}
_GEMMA2_BASE: dict[str, Any] = {
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0,
    "bos_token_id": 2,
    "cache_implementation": "hybrid",
    "eos_token_id": 1,
    "final_logit_softcapping": 30.0,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "initializer_range": 0.02,
    "max_position_embeddings": 8192,
    "pad_token_id": 0,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "vocab_size": 256000,
}
_PHI3_BASE: dict[str, Any] = {
    "model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "embd_pdrop": 0.0,
    "eos_token_id": 32000,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "pad_token_id": 32000,
    "resid_pdrop": 0.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "sliding_window": 2047,
    "tie_word_embeddings": False,
    "vocab_size": 32064,
}
_T5_BASE: dict[str, Any] = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_kv": 64,
    "decoder_start_token_id": 0,
    "dropout_rate": 0.1,
    "eos_token_id": 1,
    "initializer_factor": 1.0,
    "is_encoder_decoder": True,
    "layer_norm_epsilon": 1e-06,
    "n_positions": 512,
    "pad_token_id": 0,
    "relative_attention_num_buckets": 32,
    "vocab_size": 32128,
}
_VIT_BASE: dict[str, Any] = {
    "model_type": "vit",
    "architectures": ["ViTForImageClassification"],
    "attention_probs_dropout_prob": 0.0,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.0,
    "image_size": 224,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-12,
    "num_channels": 3,
    "num_labels": 1000,
    "patch_size": 16,
    "qkv_bias": True,
}


def _llama2(h: int, inter: int, heads: int, layers: int, kv: int) -> dict[str, Any]:
    """A Llama 2 config.json."""
    return {
        **_LLAMA2_BASE,
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
    }


def _llama3(h: int, inter: int, heads: int, layers: int, **more: Any) -> dict[str, Any]:
    """A Llama 3.x config.json (8 KV heads throughout)."""
    base = {"rope_scaling": _LLAMA31_ROPE, "tie_word_embeddings": False}
    return {
        **_LLAMA3_BASE,
        **base,
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        **more,
    }


def _qwen25(
    h: int,
    inter: int,
    heads: int,
    layers: int,
    kv: int,
    *,
    tie: bool,
    vocab: int,
    ctx: int,
    window_layers: int,
) -> dict[str, Any]:
    """A Qwen2.5 base-model config.json."""
    return {
        **_QWEN25_BASE,
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "max_position_embeddings": ctx,
        "sliding_window": ctx,
        "max_window_layers": window_layers,
        "rms_norm_eps": 1e-06 if h < 5120 else 1e-05,
        "tie_word_embeddings": tie,
        "vocab_size": vocab,
    }


def _gemma2(
    h: int, inter: int, heads: int, layers: int, kv: int, head_dim: int, scalar: int
) -> dict[str, Any]:
    """A Gemma 2 config.json."""
    return {
        **_GEMMA2_BASE,
        "hidden_size": h,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "query_pre_attn_scalar": scalar,
    }


def _gemma3_text(
    h: int,
    inter: int,
    heads: int,
    layers: int,
    kv: int,
    *,
    head_dim: int = 256,
    scalar: int = 256,
    **more: Any,
) -> dict[str, Any]:
    """A Gemma 3 language-model config: the 1B's config.json, or a multimodal model's text_config written out
    with the Gemma3TextConfig defaults it leaves implicit (262,208 vocab, 128k context, 8x linear RoPE scaling on
    the full-attention layers)."""
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "final_logit_softcapping": None,
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 131072,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "pad_token_id": 0,
        "query_pre_attn_scalar": scalar,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "rope_theta": 1000000.0,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
        "vocab_size": 262208,
        **more,
    }


def _pythia(h: int, heads: int, layers: int, vocab: int) -> dict[str, Any]:
    """An EleutherAI Pythia config.json (GPT-NeoX; I = 4h, rotary on a quarter of each head, parallel residual)."""
    return {
        "model_type": "gpt_neox",
        "architectures": ["GPTNeoXForCausalLM"],
        "bos_token_id": 0,
        "eos_token_id": 0,
        "hidden_act": "gelu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": 4 * h,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "rotary_emb_base": 10000,
        "rotary_pct": 0.25,
        "tie_word_embeddings": False,
        "use_parallel_residual": True,
        "vocab_size": vocab,
    }


def _phi(h: int, layers: int, rotary: float, resid_pdrop: float) -> dict[str, Any]:
    """A Microsoft Phi-1.5 / Phi-2 config.json (I = 4h, 32 heads, partial rotary, lm_head with a bias)."""
    return {
        "model_type": "phi",
        "architectures": ["PhiForCausalLM"],
        "attention_dropout": 0.0,
        "embd_pdrop": 0.0,
        "hidden_act": "gelu_new",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": 4 * h,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048,
        "num_attention_heads": 32,
        "num_hidden_layers": layers,
        "num_key_value_heads": 32,
        "partial_rotary_factor": rotary,
        "qk_layernorm": False,
        "resid_pdrop": resid_pdrop,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": 51200,
    }


def _vit(h: int, heads: int, layers: int, inter: int, patch: int) -> dict[str, Any]:
    """A ViT image-classification config.json (1000 ImageNet labels)."""
    return {
        **_VIT_BASE,
        "hidden_size": h,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "intermediate_size": inter,
        "patch_size": patch,
        "encoder_stride": patch,
    }


def _clip(
    ht: int, it: int, at: int, hv: int, iv: int, av: int, lv: int, patch: int, proj: int
) -> dict[str, Any]:
    """An openai/clip-vit-* config.json: 12-layer text tower, vision tower at 224px, quick_gelu."""
    return {
        "model_type": "clip",
        "architectures": ["CLIPModel"],
        "logit_scale_init_value": 2.6592,
        "projection_dim": proj,
        "text_config": {
            "model_type": "clip_text_model",
            "hidden_size": ht,
            "intermediate_size": it,
            "num_attention_heads": at,
            "num_hidden_layers": 12,
            "max_position_embeddings": 77,
            "vocab_size": 49408,
            "hidden_act": "quick_gelu",
            "layer_norm_eps": 1e-5,
            "bos_token_id": 0,
            "eos_token_id": 2,
            "projection_dim": proj,
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": hv,
            "intermediate_size": iv,
            "num_attention_heads": av,
            "num_hidden_layers": lv,
            "image_size": 224,
            "patch_size": patch,
            "hidden_act": "quick_gelu",
            "layer_norm_eps": 1e-5,
            "projection_dim": proj,
        },
    }


def _llava(h: int, inter: int, heads: int, layers: int) -> dict[str, Any]:
    """A llava-hf/llava-1.5-*-hf config.json: CLIP ViT-L/14 at 336px (24 layers), Vicuna v1.5 language model."""
    return {
        "model_type": "llava",
        "architectures": ["LlavaForConditionalGeneration"],
        "ignore_index": -100,
        "image_token_index": 32000,
        "pad_token_id": 32001,
        "projector_hidden_act": "gelu",
        "tie_word_embeddings": False,
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "text_config": {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": h,
            "intermediate_size": inter,
            "num_attention_heads": heads,
            "num_hidden_layers": layers,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "vocab_size": 32064,
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 1024,
            "image_size": 336,
            "intermediate_size": 4096,
            "num_attention_heads": 16,
            "num_hidden_layers": 24,
            "patch_size": 14,
            "projection_dim": 768,
        },
    }


def _qwen3(h: int, inter: int, heads: int, layers: int, *, tie: bool) -> dict[str, Any]:
    """A Qwen3 dense config.json (Qwen/Qwen3-*: 128-wide heads, 8 KV heads, 40k context)."""
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 40960,
        "max_window_layers": layers,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": tie,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


def _olmo2(h: int, inter: int, heads: int, layers: int, kv: int) -> dict[str, Any]:
    """An OLMo 2 config.json (allenai/OLMo-2-*: 100k vocab, 4k context, RoPE base 500k)."""
    return {
        "model_type": "olmo2",
        "architectures": ["Olmo2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "eos_token_id": 100257,
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 4096,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "pad_token_id": 100277,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 500000,
        "tie_word_embeddings": False,
        "vocab_size": 100352,
    }


def _glm4(h: int, inter: int, heads: int, layers: int) -> dict[str, Any]:
    """A GLM-4-0414 config.json (THUDM/GLM-4-*-0414: 2 KV heads of 128, half-width RoPE, 32k context)."""
    return {
        "model_type": "glm4",
        "architectures": ["Glm4ForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": [151329, 151336, 151338],
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "max_position_embeddings": 32768,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "pad_token_id": 151329,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": 151552,
    }


def _command_r(
    h: int, inter: int, heads: int, layers: int, kv: int, *, theta: float, ctx: int, scale: float, qk: bool
) -> dict[str, Any]:
    """A Cohere Command-R config.json (CohereForAI/c4ai-command-r*: 256k vocab, tied embeddings)."""
    return {
        "model_type": "cohere",
        "architectures": ["CohereForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 5,
        "eos_token_id": 255001,
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "layer_norm_eps": 1e-05,
        "logit_scale": scale,
        "max_position_embeddings": ctx,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "pad_token_id": 0,
        "rope_theta": theta,
        "tie_word_embeddings": True,
        "use_qk_norm": qk,
        "vocab_size": 256000,
    }


def _roberta(h: int, inter: int, heads: int, layers: int, xlm: bool = False) -> dict[str, Any]:
    """A RoBERTa config.json (FacebookAI/roberta-*: 514 positions, padding offset 1, one token type); ``xlm``:
    FacebookAI/xlm-roberta-* (the same model, a 250,002-token vocabulary)."""
    return {
        "model_type": "xlm-roberta" if xlm else "roberta",
        "architectures": ["XLMRobertaForMaskedLM" if xlm else "RobertaForMaskedLM"],
        "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 514,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 1,
        "type_vocab_size": 1,
        "vocab_size": 250002 if xlm else 50265,
    }


def _modernbert(h: int, inter: int, heads: int, layers: int) -> dict[str, Any]:
    """A ModernBERT config.json (answerdotai/ModernBERT-*: 8k context, global attention every 3rd layer,
    128-token local window, no biases but the decoder's)."""
    return {
        "model_type": "modernbert",
        "architectures": ["ModernBertForMaskedLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 50281,
        "classifier_activation": "gelu",
        "classifier_bias": False,
        "classifier_dropout": 0.0,
        "classifier_pooling": "mean",
        "cls_token_id": 50281,
        "decoder_bias": True,
        "deterministic_flash_attn": False,
        "embedding_dropout": 0.0,
        "eos_token_id": 50282,
        "global_attn_every_n_layers": 3,
        "global_rope_theta": 160000.0,
        "hidden_activation": "gelu",
        "hidden_size": h,
        "initializer_cutoff_factor": 2.0,
        "initializer_range": 0.02,
        "intermediate_size": inter,
        "local_attention": 128,
        "local_rope_theta": 10000.0,
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "mlp_dropout": 0.0,
        "norm_bias": False,
        "norm_eps": 1e-05,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 50283,
        "sep_token_id": 50282,
        "tie_word_embeddings": True,
        "vocab_size": 50368,
    }


def _starcoder2(
    h: int, inter: int, heads: int, layers: int, kv: int, theta: float, tie: bool
) -> dict[str, Any]:
    """A StarCoder2 config.json (bigcode/starcoder2-*: 49k vocab, 16k context, 4k sliding window, dropout 0.1)."""
    return {
        "model_type": "starcoder2",
        "architectures": ["Starcoder2ForCausalLM"],
        "attention_dropout": 0.1,
        "bos_token_id": 0,
        "embedding_dropout": 0.1,
        "eos_token_id": 0,
        "hidden_act": "gelu_pytorch_tanh",
        "hidden_size": h,
        "initializer_range": 0.018042,
        "intermediate_size": inter,
        "max_position_embeddings": 16384,
        "norm_epsilon": 1e-05,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv,
        "residual_dropout": 0.1,
        "rope_theta": theta,
        "sliding_window": 4096,
        "tie_word_embeddings": tie,
        "use_bias": True,
        "vocab_size": 49152,
    }


def _llama4_text(
    experts: int, step: int, *, qk_norm: bool, rope_scaling: Any, max_pos: int
) -> dict[str, Any]:
    """The language model of a Llama 4 checkpoint: the ``text_config`` of meta-llama/Llama-4-*'s config.json,
    as ``llama4_text`` (the vision tower and projector of the published model are not part of it)."""
    layers = 48
    return {
        "model_type": "llama4_text",
        "architectures": ["Llama4ForCausalLM"],
        "attention_bias": False,
        "attention_chunk_size": 8192,
        "attention_dropout": 0.0,
        "attn_scale": 0.1,
        "attn_temperature_tuning": True,
        "bos_token_id": 200000,
        "eos_token_id": [200001, 200007, 200008],
        "floor_scale": 8192,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "interleave_moe_layer_step": step,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "max_position_embeddings": max_pos,
        "moe_layers": list(range(step - 1, layers, step)),
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(layers)],
        "num_attention_heads": 40,
        "num_experts_per_tok": 1,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "num_local_experts": experts,
        "output_router_logits": False,
        "pad_token_id": 200018,
        "rms_norm_eps": 1e-05,
        "rope_scaling": rope_scaling,
        "rope_theta": 500000.0,
        "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "use_qk_norm": qk_norm,
        "vocab_size": 202048,
    }


def _gpt_oss(layers: int, experts: int) -> dict[str, Any]:
    """An openai/gpt-oss-* config.json without its ``quantization_config`` (MXFP4 experts): the model
    fine-tuning runs is the bf16 one transformers builds after dequantising."""
    return {
        "model_type": "gpt_oss",
        "architectures": ["GptOssForCausalLM"],
        "attention_bias": True,
        "attention_dropout": 0.0,
        "eos_token_id": 200002,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 2880,
        "initializer_range": 0.02,
        "intermediate_size": 2880,
        "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
        "max_position_embeddings": 131072,
        "num_attention_heads": 64,
        "num_experts_per_tok": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 8,
        "num_local_experts": experts,
        "output_router_logits": False,
        "pad_token_id": 199999,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
        "rope_theta": 150000,
        "router_aux_loss_coef": 0.9,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": 201088,
    }


def _falcon(h: int, heads: int, layers: int, kv: int | None) -> dict[str, Any]:
    """A TII Falcon config.json (model_type falcon, 65k vocab, no biases, rotary, parallel attention + MLP).

    ``kv`` None: Falcon-7B's multi-query layer (one k/v head, one LayerNorm); else ``new_decoder_architecture``
    with ``kv`` grouped k/v heads and two LayerNorms (Falcon-40B/180B). The published files leave
    ``tie_word_embeddings`` unset: FalconConfig's default ties the head to the embeddings."""
    cfg: dict[str, Any] = {
        "model_type": "falcon",
        "architectures": ["FalconForCausalLM"],
        "alibi": False,
        "attention_dropout": 0.0,
        "bias": False,
        "bos_token_id": 11,
        "eos_token_id": 11,
        "hidden_dropout": 0.0,
        "hidden_size": h,
        "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05,
        "multi_query": True,
        "new_decoder_architecture": kv is not None,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "parallel_attn": True,
        "vocab_size": 65024,
    }
    if kv is not None:
        cfg["num_kv_heads"] = kv
    return cfg


#: Preset id -> full HF config dict (the published config.json values that shape the model).
PRESETS: dict[str, dict[str, Any]] = {
    "gpt2": {**_GPT2_BASE, "n_embd": 768, "n_head": 12, "n_layer": 12},
    "gpt2-medium": {**_GPT2_BASE, "n_embd": 1024, "n_head": 16, "n_layer": 24},
    "gpt2-large": {**_GPT2_BASE, "n_embd": 1280, "n_head": 20, "n_layer": 36},
    "gpt2-xl": {**_GPT2_BASE, "n_embd": 1600, "n_head": 25, "n_layer": 48},
    "pythia-160m": _pythia(768, 12, 12, 50304),
    "pythia-1.4b": _pythia(2048, 16, 24, 50304),
    "pythia-6.9b": _pythia(4096, 32, 32, 50432),
    "pythia-12b": _pythia(5120, 40, 36, 50688),
    "phi-1_5": {**_phi(2048, 24, 0.5, 0.0), "bos_token_id": None, "eos_token_id": None},
    "phi-2": {**_phi(2560, 32, 0.4, 0.1), "bos_token_id": 50256, "eos_token_id": 50256},
    "bert-base-uncased": {
        **_BERT_BASE,
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
    },
    "bert-large-uncased": {
        **_BERT_BASE,
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
    },
    "roberta-base": _roberta(768, 3072, 12, 12),
    "roberta-large": _roberta(1024, 4096, 16, 24),
    "xlm-roberta-base": _roberta(768, 3072, 12, 12, xlm=True),
    "xlm-roberta-large": _roberta(1024, 4096, 16, 24, xlm=True),
    "modernbert-base": _modernbert(768, 1152, 12, 22),
    "modernbert-large": _modernbert(1024, 2624, 16, 28),
    "llama-2-7b": _llama2(4096, 11008, 32, 32, 32),
    "llama-2-13b": _llama2(5120, 13824, 40, 40, 40),
    "llama-2-70b": _llama2(8192, 28672, 64, 80, 8),
    "llama-3.1-8b": _llama3(4096, 14336, 32, 32),
    "llama-3.1-70b": _llama3(8192, 28672, 64, 80),
    "llama-3.1-405b": _llama3(16384, 53248, 128, 126),
    "llama-3.2-1b": _llama3(
        2048, 8192, 32, 16, head_dim=64, rope_scaling=_LLAMA32_ROPE, tie_word_embeddings=True
    ),
    "llama-3.2-3b": _llama3(
        3072, 8192, 24, 28, head_dim=128, rope_scaling=_LLAMA32_ROPE, tie_word_embeddings=True
    ),
    "mistral-7b": {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "vocab_size": 32768,
    },
    "mixtral-8x7b": {
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "output_router_logits": False,
        "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.02,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "vocab_size": 32000,
    },
    "qwen2.5-0.5b": _qwen25(896, 4864, 14, 24, 2, tie=True, vocab=151936, ctx=32768, window_layers=24),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 12, 28, 2, tie=True, vocab=151936, ctx=131072, window_layers=28),
    "qwen2.5-3b": _qwen25(2048, 11008, 16, 36, 2, tie=True, vocab=151936, ctx=32768, window_layers=36),
    "qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, tie=False, vocab=152064, ctx=131072, window_layers=28),
    "qwen2.5-14b": _qwen25(5120, 13824, 40, 48, 8, tie=False, vocab=152064, ctx=131072, window_layers=48),
    "qwen2.5-32b": _qwen25(5120, 27648, 40, 64, 8, tie=False, vocab=152064, ctx=131072, window_layers=64),
    "qwen2.5-72b": _qwen25(8192, 29568, 64, 80, 8, tie=False, vocab=152064, ctx=131072, window_layers=80),
    "gemma-2-2b": _gemma2(2304, 9216, 8, 26, 4, head_dim=256, scalar=256),
    "gemma-2-9b": _gemma2(3584, 14336, 16, 42, 8, head_dim=256, scalar=256),
    "gemma-2-27b": _gemma2(4608, 36864, 32, 46, 16, head_dim=128, scalar=144),
    "gemma-3-1b": _gemma3_text(
        1152,
        6912,
        4,
        26,
        1,
        max_position_embeddings=32768,
        rope_scaling=None,
        sliding_window=512,
        vocab_size=262144,
    ),
    "gemma-3-4b-text": _gemma3_text(2560, 10240, 8, 34, 4),
    "gemma-3-12b-text": _gemma3_text(3840, 15360, 16, 48, 8),
    "gemma-3-27b-text": _gemma3_text(5376, 21504, 32, 62, 16, head_dim=128, scalar=168),
    "phi-3-mini": {
        **_PHI3_BASE,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
    },
    "phi-3-medium": {
        **_PHI3_BASE,
        "hidden_size": 5120,
        "intermediate_size": 17920,
        "num_attention_heads": 40,
        "num_hidden_layers": 40,
        "num_key_value_heads": 10,
    },
    "t5-base": {
        **_T5_BASE,
        "d_ff": 3072,
        "d_model": 768,
        "num_heads": 12,
        "num_layers": 12,
    },
    "flan-t5-large": {
        **_T5_BASE,
        "d_ff": 2816,
        "d_model": 1024,
        "dense_act_fn": "gelu_new",
        "feed_forward_proj": "gated-gelu",
        "is_gated_act": True,
        "num_decoder_layers": 24,
        "num_heads": 16,
        "num_layers": 24,
        "relative_attention_max_distance": 128,
        "tie_word_embeddings": False,
    },
    "vit-base-patch16-224": _vit(768, 12, 12, 3072, 16),
    "vit-large-patch16-224": _vit(1024, 16, 24, 4096, 16),
    "vit-huge-patch14-224": _vit(1280, 16, 32, 5120, 14),
    "qwen3-0.6b": _qwen3(1024, 3072, 16, 28, tie=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 16, 28, tie=True),
    "qwen3-4b": _qwen3(2560, 9728, 32, 36, tie=True),
    "qwen3-8b": _qwen3(4096, 12288, 32, 36, tie=False),
    "qwen3-14b": _qwen3(5120, 17408, 40, 40, tie=False),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64, tie=False),
    # Qwen3-MoE (Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B config.json)
    **{
        name: {
            "model_type": "qwen3_moe",
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "decoder_sparse_step": 1,
            "eos_token_id": 151645,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": h,
            "initializer_range": 0.02,
            "intermediate_size": inter,
            "max_position_embeddings": 40960,
            "max_window_layers": layers,
            "mlp_only_layers": [],
            "moe_intermediate_size": moe_inter,
            "norm_topk_prob": True,
            "num_attention_heads": heads,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": layers,
            "num_key_value_heads": 4,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 151936,
        }
        for name, h, inter, moe_inter, heads, layers in (
            ("qwen3-30b-a3b", 2048, 6144, 768, 32, 48),
            ("qwen3-235b-a22b", 4096, 12288, 1536, 64, 94),
        )
    },
    "olmo-2-1b": _olmo2(2048, 8192, 16, 16, 16),
    "olmo-2-7b": _olmo2(4096, 11008, 32, 32, 32),
    "olmo-2-13b": _olmo2(5120, 13824, 40, 40, 40),
    "olmo-2-32b": _olmo2(5120, 27648, 40, 64, 8),
    # DeepSeek (deepseek-ai/DeepSeek-V3, deepseek-ai/DeepSeek-V2-Lite config.json; V3's fp8
    # quantization_config and auto_map left out: the trainable model is the bf16 one)
    "deepseek-v3": {
        "model_type": "deepseek_v3",
        "architectures": ["DeepseekV3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": 3,
        "hidden_act": "silu",
        "hidden_size": 7168,
        "initializer_range": 0.02,
        "intermediate_size": 18432,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "n_group": 8,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 61,
        "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "use_cache": True,
        "v_head_dim": 128,
        "vocab_size": 129280,
    },
    "deepseek-v2-lite": {
        "model_type": "deepseek_v2",
        "architectures": ["DeepseekV2ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "aux_loss_alpha": 0.001,
        "bos_token_id": 100000,
        "eos_token_id": 100001,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 1408,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "norm_topk_prob": False,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
        "rope_theta": 10000,
        "routed_scaling_factor": 1.0,
        "scoring_func": "softmax",
        "seq_aux": True,
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "greedy",
        "use_cache": True,
        "v_head_dim": 128,
        "vocab_size": 102400,
    },
    "glm-4-9b": _glm4(4096, 13696, 32, 40),
    "glm-4-32b": _glm4(6144, 23040, 48, 61),
    "command-r-35b": _command_r(8192, 22528, 64, 40, 64, theta=8000000.0, ctx=8192, scale=0.0625, qk=False),
    "command-r-32b": _command_r(8192, 24576, 64, 40, 8, theta=4000000.0, ctx=131072, scale=0.0625, qk=False),
    "command-r-plus-104b": _command_r(
        12288, 33792, 96, 64, 8, theta=75000000.0, ctx=131072, scale=0.8333333333333334, qk=True
    ),
    "starcoder2-3b": _starcoder2(3072, 12288, 24, 30, 2, 999999.4420358813, tie=True),
    "starcoder2-7b": _starcoder2(4608, 18432, 36, 32, 4, 1000000.0, tie=True),
    "starcoder2-15b": _starcoder2(6144, 24576, 48, 40, 4, 100000.0, tie=False),
    # Llama 4 (meta-llama/Llama-4-Scout-17B-16E, meta-llama/Llama-4-Maverick-17B-128E config.json text_config)
    "llama-4-scout-17b-16e-text-only": _llama4_text(
        16,
        1,
        qk_norm=True,
        rope_scaling={
            "factor": 16.0,
            "high_freq_factor": 1.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
        max_pos=10485760,
    ),
    "llama-4-maverick-17b-128e-text-only": _llama4_text(
        128, 2, qk_norm=False, rope_scaling=None, max_pos=1048576
    ),
    # GPT-OSS (openai/gpt-oss-20b, openai/gpt-oss-120b config.json)
    "gpt-oss-20b": _gpt_oss(24, 32),
    "gpt-oss-120b": _gpt_oss(36, 128),
    "falcon-7b": _falcon(4544, 71, 32, None),
    "falcon-40b": _falcon(8192, 128, 60, 8),
    "falcon-180b": _falcon(14848, 232, 80, 8),
    # ----- multimodal (families/clip.py, families/llava.py): the published config.json, sizes written out -----
    # openai/clip-vit-base-patch32, openai/clip-vit-large-patch14 config.json (text and vision sub-configs)
    "clip-vit-base-patch32": _clip(512, 2048, 8, 768, 3072, 12, 12, 32, 512),
    "clip-vit-large-patch14": _clip(768, 3072, 12, 1024, 4096, 16, 24, 14, 768),
    # llava-hf/llava-1.5-{7b,13b}-hf config.json: its text_config (Vicuna v1.5) leaves the sizes to LlamaConfig's
    # defaults (7B) or names them (13B); written out here, as every family requires them
    "llava-1.5-7b": _llava(4096, 11008, 32, 32),
    "llava-1.5-13b": _llava(5120, 13824, 40, 40),
    # google/gemma-3-{4b,12b,27b}-pt config.json: SigLIP So400m at 896px, 256 tokens per image, and the text model
    # (the *-text presets above, with Gemma3TextConfig's defaults written out)
    **{
        f"gemma-3-{size}": {
            "model_type": "gemma3",
            "architectures": ["Gemma3ForConditionalGeneration"],
            "boi_token_index": 255999,
            "eoi_token_index": 256000,
            "image_token_index": 262144,
            "mm_tokens_per_image": 256,
            "text_config": {k: v for k, v in _gemma3_text(*args, **kw).items() if k != "architectures"},
            "vision_config": {
                "model_type": "siglip_vision_model",
                "hidden_size": 1152,
                "image_size": 896,
                "intermediate_size": 4304,
                "num_attention_heads": 16,
                "num_hidden_layers": 27,
                "patch_size": 14,
                "vision_use_head": False,
            },
        }
        for size, args, kw in (
            ("4b", (2560, 10240, 8, 34, 4), {}),
            ("12b", (3840, 15360, 16, 48, 8), {}),
            ("27b", (5376, 21504, 32, 62, 16), {"head_dim": 128, "scalar": 168}),
        )
    },
}

#: Preset id -> {"description", "params_label" (the published size), "hf_repo" (where the config is from)}.
PRESET_INFO: dict[str, dict[str, str]] = {
    "gpt2": {
        "description": "GPT-2 small, 12 layers",
        "params_label": "124M",
        "hf_repo": "openai-community/gpt2",
    },
    "gpt2-medium": {
        "description": "GPT-2 medium, 24 layers",
        "params_label": "355M",
        "hf_repo": "openai-community/gpt2-medium",
    },
    "gpt2-large": {
        "description": "GPT-2 large, 36 layers",
        "params_label": "774M",
        "hf_repo": "openai-community/gpt2-large",
    },
    "gpt2-xl": {
        "description": "GPT-2 XL, 48 layers",
        "params_label": "1.5B",
        "hf_repo": "openai-community/gpt2-xl",
    },
    "pythia-160m": {
        "description": "Pythia (GPT-NeoX), 12 layers, parallel residual",
        "params_label": "160M",
        "hf_repo": "EleutherAI/pythia-160m",
    },
    "pythia-1.4b": {
        "description": "Pythia (GPT-NeoX), 24 layers, parallel residual",
        "params_label": "1.4B",
        "hf_repo": "EleutherAI/pythia-1.4b",
    },
    "pythia-6.9b": {
        "description": "Pythia (GPT-NeoX), 32 layers, parallel residual",
        "params_label": "6.9B",
        "hf_repo": "EleutherAI/pythia-6.9b",
    },
    "pythia-12b": {
        "description": "Pythia (GPT-NeoX), 36 layers, parallel residual",
        "params_label": "12B",
        "hf_repo": "EleutherAI/pythia-12b",
    },
    "phi-1_5": {
        "description": "Microsoft Phi-1.5, 24 layers, parallel attention + MLP",
        "params_label": "1.4B",
        "hf_repo": "microsoft/phi-1_5",
    },
    "phi-2": {
        "description": "Microsoft Phi-2, 32 layers, parallel attention + MLP",
        "params_label": "2.7B",
        "hf_repo": "microsoft/phi-2",
    },
    "bert-base-uncased": {
        "description": "BERT base encoder, masked-LM head",
        "params_label": "110M",
        "hf_repo": "google-bert/bert-base-uncased",
    },
    "bert-large-uncased": {
        "description": "BERT large encoder, masked-LM head",
        "params_label": "340M",
        "hf_repo": "google-bert/bert-large-uncased",
    },
    "roberta-base": {
        "description": "RoBERTa base encoder, masked-LM head tied to the embeddings, 512 tokens",
        "params_label": "125M",
        "hf_repo": "FacebookAI/roberta-base",
    },
    "roberta-large": {
        "description": "RoBERTa large encoder, masked-LM head tied to the embeddings, 512 tokens",
        "params_label": "355M",
        "hf_repo": "FacebookAI/roberta-large",
    },
    "xlm-roberta-base": {
        "description": "XLM-RoBERTa base: RoBERTa with a 250k multilingual vocabulary, 512 tokens",
        "params_label": "278M",
        "hf_repo": "FacebookAI/xlm-roberta-base",
    },
    "xlm-roberta-large": {
        "description": "XLM-RoBERTa large: RoBERTa with a 250k multilingual vocabulary, 512 tokens",
        "params_label": "560M",
        "hf_repo": "FacebookAI/xlm-roberta-large",
    },
    "modernbert-base": {
        "description": "ModernBERT base encoder: pre-norm, GeGLU, RoPE, global/local attention, 8k tokens",
        "params_label": "149M",
        "hf_repo": "answerdotai/ModernBERT-base",
    },
    "modernbert-large": {
        "description": "ModernBERT large encoder: pre-norm, GeGLU, RoPE, global/local attention, 8k tokens",
        "params_label": "395M",
        "hf_repo": "answerdotai/ModernBERT-large",
    },
    "llama-2-7b": {
        "description": "Llama 2 7B, MHA",
        "params_label": "7B",
        "hf_repo": "meta-llama/Llama-2-7b-hf",
    },
    "llama-2-13b": {
        "description": "Llama 2 13B, MHA",
        "params_label": "13B",
        "hf_repo": "meta-llama/Llama-2-13b-hf",
    },
    "llama-2-70b": {
        "description": "Llama 2 70B, GQA (8 KV heads)",
        "params_label": "70B",
        "hf_repo": "meta-llama/Llama-2-70b-hf",
    },
    "llama-3.1-8b": {
        "description": "Llama 3.1 8B, 128k vocab, GQA",
        "params_label": "8B",
        "hf_repo": "meta-llama/Llama-3.1-8B",
    },
    "llama-3.1-70b": {
        "description": "Llama 3.1 70B, GQA",
        "params_label": "70B",
        "hf_repo": "meta-llama/Llama-3.1-70B",
    },
    "llama-3.1-405b": {
        "description": "Llama 3.1 405B, 126 layers",
        "params_label": "405B",
        "hf_repo": "meta-llama/Llama-3.1-405B",
    },
    "llama-3.2-1b": {
        "description": "Llama 3.2 1B, tied embeddings",
        "params_label": "1B",
        "hf_repo": "meta-llama/Llama-3.2-1B",
    },
    "llama-3.2-3b": {
        "description": "Llama 3.2 3B, tied embeddings",
        "params_label": "3B",
        "hf_repo": "meta-llama/Llama-3.2-3B",
    },
    "mistral-7b": {
        "description": "Mistral 7B v0.3, 32k vocab, GQA",
        "params_label": "7B",
        "hf_repo": "mistralai/Mistral-7B-v0.3",
    },
    "mixtral-8x7b": {
        "description": "Mixtral 8x7B MoE, 2 of 8 experts per token (~13B active)",
        "params_label": "47B",
        "hf_repo": "mistralai/Mixtral-8x7B-v0.1",
    },
    "qwen2.5-0.5b": {
        "description": "Qwen2.5 0.5B, tied embeddings",
        "params_label": "0.5B",
        "hf_repo": "Qwen/Qwen2.5-0.5B",
    },
    "qwen2.5-1.5b": {
        "description": "Qwen2.5 1.5B, tied embeddings",
        "params_label": "1.5B",
        "hf_repo": "Qwen/Qwen2.5-1.5B",
    },
    "qwen2.5-3b": {
        "description": "Qwen2.5 3B, tied embeddings",
        "params_label": "3B",
        "hf_repo": "Qwen/Qwen2.5-3B",
    },
    "qwen2.5-7b": {"description": "Qwen2.5 7B", "params_label": "7B", "hf_repo": "Qwen/Qwen2.5-7B"},
    "qwen2.5-14b": {"description": "Qwen2.5 14B", "params_label": "14B", "hf_repo": "Qwen/Qwen2.5-14B"},
    "qwen2.5-32b": {"description": "Qwen2.5 32B", "params_label": "32B", "hf_repo": "Qwen/Qwen2.5-32B"},
    "qwen2.5-72b": {"description": "Qwen2.5 72B", "params_label": "72B", "hf_repo": "Qwen/Qwen2.5-72B"},
    "gemma-2-2b": {
        "description": "Gemma 2 2B, 256k vocab, tied embeddings",
        "params_label": "2B",
        "hf_repo": "google/gemma-2-2b",
    },
    "gemma-2-9b": {
        "description": "Gemma 2 9B, sliding/global attention",
        "params_label": "9B",
        "hf_repo": "google/gemma-2-9b",
    },
    "gemma-2-27b": {
        "description": "Gemma 2 27B, sliding/global attention",
        "params_label": "27B",
        "hf_repo": "google/gemma-2-27b",
    },
    "gemma-3-1b": {
        "description": "Gemma 3 1B (text-only model), q/k norms, 5 sliding : 1 global layers, tied embeddings",
        "params_label": "1B",
        "hf_repo": "google/gemma-3-1b-pt",
    },
    "gemma-3-4b-text": {
        "description": "Gemma 3 4B LANGUAGE MODEL ONLY (text_config as Gemma3ForCausalLM): "
        "the ~0.4B SigLIP vision tower and projector are NOT counted (preset gemma-3-4b has them)",
        "params_label": "3.9B of 4.3B",
        "hf_repo": "google/gemma-3-4b-pt",
    },
    "gemma-3-12b-text": {
        "description": "Gemma 3 12B LANGUAGE MODEL ONLY (text_config as Gemma3ForCausalLM): "
        "the ~0.4B SigLIP vision tower and projector are NOT counted (preset gemma-3-12b has them)",
        "params_label": "11.8B of 12.2B",
        "hf_repo": "google/gemma-3-12b-pt",
    },
    "gemma-3-27b-text": {
        "description": "Gemma 3 27B LANGUAGE MODEL ONLY (text_config as Gemma3ForCausalLM): "
        "the ~0.4B SigLIP vision tower and projector are NOT counted (preset gemma-3-27b has them)",
        "params_label": "27.0B of 27.4B",
        "hf_repo": "google/gemma-3-27b-pt",
    },
    "phi-3-mini": {
        "description": "Phi-3 mini 4k, fused qkv / gate_up",
        "params_label": "3.8B",
        "hf_repo": "microsoft/Phi-3-mini-4k-instruct",
    },
    "phi-3-medium": {
        "description": "Phi-3 medium 4k, GQA",
        "params_label": "14B",
        "hf_repo": "microsoft/Phi-3-medium-4k-instruct",
    },
    "t5-base": {
        "description": "T5 base encoder-decoder, ReLU MLP",
        "params_label": "220M",
        "hf_repo": "google-t5/t5-base",
    },
    "flan-t5-large": {
        "description": "Flan-T5 large encoder-decoder, gated-GELU; transformers 5 ties its lm_head to the shared "
        "embedding (the published checkpoint stores its own: 783M)",
        "params_label": "780M",
        "hf_repo": "google/flan-t5-large",
    },
    "vit-base-patch16-224": {
        "description": "ViT-B/16 at 224px, 1000-class head",
        "params_label": "86M",
        "hf_repo": "google/vit-base-patch16-224",
    },
    "vit-large-patch16-224": {
        "description": "ViT-L/16 at 224px, 1000-class head",
        "params_label": "304M",
        "hf_repo": "google/vit-large-patch16-224",
    },
    "vit-huge-patch14-224": {
        "description": "ViT-H/14 at 224px (ImageNet-21k weights), given a 1000-class head",
        "params_label": "632M",
        "hf_repo": "google/vit-huge-patch14-224-in21k",
    },
    "qwen3-0.6b": {
        "description": "Qwen3 0.6B, per-head q/k RMSNorm, tied embeddings",
        "params_label": "0.6B",
        "hf_repo": "Qwen/Qwen3-0.6B",
    },
    "qwen3-1.7b": {
        "description": "Qwen3 1.7B, per-head q/k RMSNorm, tied embeddings",
        "params_label": "1.7B",
        "hf_repo": "Qwen/Qwen3-1.7B",
    },
    "qwen3-4b": {
        "description": "Qwen3 4B, per-head q/k RMSNorm, tied embeddings",
        "params_label": "4B",
        "hf_repo": "Qwen/Qwen3-4B",
    },
    "qwen3-8b": {
        "description": "Qwen3 8B, per-head q/k RMSNorm",
        "params_label": "8B",
        "hf_repo": "Qwen/Qwen3-8B",
    },
    "qwen3-14b": {
        "description": "Qwen3 14B, per-head q/k RMSNorm",
        "params_label": "14B",
        "hf_repo": "Qwen/Qwen3-14B",
    },
    "qwen3-32b": {
        "description": "Qwen3 32B, per-head q/k RMSNorm",
        "params_label": "32B",
        "hf_repo": "Qwen/Qwen3-32B",
    },
    "qwen3-30b-a3b": {
        "description": "Qwen3-MoE 30B-A3B: 128 experts, 8 per token, q/k norm (~3.3B active)",
        "params_label": "30.5B",
        "hf_repo": "Qwen/Qwen3-30B-A3B",
    },
    "qwen3-235b-a22b": {
        "description": "Qwen3-MoE 235B-A22B: 128 experts, 8 per token, q/k norm (~22B active)",
        "params_label": "235B",
        "hf_repo": "Qwen/Qwen3-235B-A22B",
    },
    "olmo-2-1b": {
        "description": "OLMo 2 1B, post-norms, q/k RMSNorm over the projection",
        "params_label": "1B",
        "hf_repo": "allenai/OLMo-2-0425-1B",
    },
    "olmo-2-7b": {
        "description": "OLMo 2 7B, post-norms, q/k RMSNorm over the projection",
        "params_label": "7B",
        "hf_repo": "allenai/OLMo-2-1124-7B",
    },
    "olmo-2-13b": {
        "description": "OLMo 2 13B, post-norms, q/k RMSNorm over the projection",
        "params_label": "13B",
        "hf_repo": "allenai/OLMo-2-1124-13B",
    },
    "olmo-2-32b": {
        "description": "OLMo 2 32B, GQA (8 KV heads), post-norms",
        "params_label": "32B",
        "hf_repo": "allenai/OLMo-2-0325-32B",
    },
    "deepseek-v3": {
        "description": "DeepSeek-V3 671B: MLA, 256 routed + 1 shared experts, 3 dense layers (MTP layer not built)",
        "params_label": "671B",
        "hf_repo": "deepseek-ai/DeepSeek-V3",
    },
    "deepseek-v2-lite": {
        "description": "DeepSeek-V2-Lite 16B: MLA without q compression, 64 routed + 2 shared experts",
        "params_label": "15.7B",
        "hf_repo": "deepseek-ai/DeepSeek-V2-Lite",
    },
    "glm-4-9b": {
        "description": "GLM-4 9B (0414), four norms per block, half-width RoPE",
        "params_label": "9B",
        "hf_repo": "THUDM/GLM-4-9B-0414",
    },
    "glm-4-32b": {
        "description": "GLM-4 32B (0414), four norms per block, half-width RoPE",
        "params_label": "32B",
        "hf_repo": "THUDM/GLM-4-32B-Base-0414",
    },
    "command-r-35b": {
        "description": "Command-R 35B (v01), MHA, parallel attention + MLP, tied embeddings",
        "params_label": "35B",
        "hf_repo": "CohereForAI/c4ai-command-r-v01",
    },
    "command-r-32b": {
        "description": "Command-R 32B (08-2024), GQA, parallel attention + MLP, tied embeddings",
        "params_label": "32B",
        "hf_repo": "CohereForAI/c4ai-command-r-08-2024",
    },
    "command-r-plus-104b": {
        "description": "Command R+ 104B (v01), GQA, per-head q/k LayerNorm, tied embeddings",
        "params_label": "104B",
        "hf_repo": "CohereForAI/c4ai-command-r-plus",
    },
    "starcoder2-3b": {
        "description": "StarCoder2 3B, LayerNorm + GELU MLP with biases, tied embeddings",
        "params_label": "3B",
        "hf_repo": "bigcode/starcoder2-3b",
    },
    "starcoder2-7b": {
        "description": "StarCoder2 7B, LayerNorm + GELU MLP with biases, tied embeddings",
        "params_label": "7B",
        "hf_repo": "bigcode/starcoder2-7b",
    },
    "starcoder2-15b": {
        "description": "StarCoder2 15B, LayerNorm + GELU MLP with biases",
        "params_label": "15B",
        "hf_repo": "bigcode/starcoder2-15b",
    },
    "llama-4-scout-17b-16e-text-only": {
        "description": "Llama 4 Scout TEXT MODEL ONLY (Llama4ForCausalLM; vision tower and projector NOT counted): "
        "16 experts + 1 shared in every layer; HF runs all 16 experts on every token",
        "params_label": "107.8B (text)",
        "hf_repo": "meta-llama/Llama-4-Scout-17B-16E",
    },
    "llama-4-maverick-17b-128e-text-only": {
        "description": "Llama 4 Maverick TEXT MODEL ONLY (Llama4ForCausalLM; vision tower and projector NOT "
        "counted): 128 experts + 1 shared every 2nd layer; HF runs all 128 experts on every token",
        "params_label": "400.7B (text)",
        "hf_repo": "meta-llama/Llama-4-Maverick-17B-128E",
    },
    "gpt-oss-20b": {
        "description": "gpt-oss-20b as the bf16 model fine-tuning runs (checkpoint experts MXFP4, dequantised): "
        "32 experts, 4 per token, attention sinks",
        "params_label": "21B",
        "hf_repo": "openai/gpt-oss-20b",
    },
    "gpt-oss-120b": {
        "description": "gpt-oss-120b as the bf16 model fine-tuning runs (checkpoint experts MXFP4, dequantised): "
        "128 experts, 4 per token, attention sinks",
        "params_label": "117B",
        "hf_repo": "openai/gpt-oss-120b",
    },
    "falcon-7b": {
        "description": "TII Falcon-7B, 32 layers, multi-query attention (one k/v head), parallel attention + "
        "MLP under one LayerNorm, tied head",
        "params_label": "7B",
        "hf_repo": "tiiuae/falcon-7b",
    },
    "falcon-40b": {
        "description": "TII Falcon-40B, 60 layers, new decoder architecture (8 k/v groups, ln_attn + ln_mlp), "
        "tied head as FalconConfig's default (the config.json values here are written from the published "
        "file without an online check)",
        "params_label": "40B",
        "hf_repo": "tiiuae/falcon-40b",
    },
    "falcon-180b": {
        "description": "TII Falcon-180B (gated repo), 80 layers, new decoder architecture (8 k/v groups), "
        "tied head as FalconConfig's default (the config.json values here are written from the published "
        "file without an online check)",
        "params_label": "180B",
        "hf_repo": "tiiuae/falcon-180B",
    },
    # ----- multimodal -----
    "clip-vit-base-patch32": {
        "description": "CLIP ViT-B/32 (CLIPModel): both towers and projections, contrastive loss; seq_len is the "
        "text length (at most 77), one 224px image per sample",
        "params_label": "151M",
        "hf_repo": "openai/clip-vit-base-patch32",
    },
    "clip-vit-large-patch14": {
        "description": "CLIP ViT-L/14 (CLIPModel): both towers and projections, contrastive loss; seq_len is the "
        "text length (at most 77), one 224px image per sample",
        "params_label": "428M",
        "hf_repo": "openai/clip-vit-large-patch14",
    },
    "llava-1.5-7b": {
        "description": "LLaVA 1.5 7B: CLIP ViT-L/14-336 tower (frozen by default: freeze_vision), 2-layer GELU "
        "projector, Vicuna 7B; each image adds 576 tokens to seq_len",
        "params_label": "7.1B",
        "hf_repo": "llava-hf/llava-1.5-7b-hf",
    },
    "llava-1.5-13b": {
        "description": "LLaVA 1.5 13B: CLIP ViT-L/14-336 tower (frozen by default: freeze_vision), 2-layer GELU "
        "projector, Vicuna 13B; each image adds 576 tokens to seq_len",
        "params_label": "13.4B",
        "hf_repo": "llava-hf/llava-1.5-13b-hf",
    },
    "gemma-3-4b": {
        "description": "Gemma 3 4B with its vision tower (Gemma3ForConditionalGeneration): SigLIP So400m at 896px "
        "(frozen by default: freeze_vision), 256 tokens per image, trained with token_type_ids (a mask in every layer)",
        "params_label": "4.3B",
        "hf_repo": "google/gemma-3-4b-pt",
    },
    "gemma-3-12b": {
        "description": "Gemma 3 12B with its vision tower (Gemma3ForConditionalGeneration): SigLIP So400m at 896px "
        "(frozen by default: freeze_vision), 256 tokens per image, trained with token_type_ids (a mask in every layer)",
        "params_label": "12.2B",
        "hf_repo": "google/gemma-3-12b-pt",
    },
    "gemma-3-27b": {
        "description": "Gemma 3 27B with its vision tower (Gemma3ForConditionalGeneration): SigLIP So400m at 896px "
        "(frozen by default: freeze_vision), 256 tokens per image, trained with token_type_ids (a mask in every layer)",
        "params_label": "27.4B",
        "hf_repo": "google/gemma-3-27b-pt",
    },
}


def preset_ids() -> list[str]:
    """All preset ids, in catalog order (grouped by family, small to large)."""
    return list(PRESETS)


def _read_config_file(path: Path) -> dict[str, Any]:
    """Read an HF config.json (or a folder's config.json) as plain JSON; never executes code."""
    try:
        file = path / "config.json" if path.is_dir() else path
    except (OSError, ValueError) as exc:  # a name too long for the file system, or with a NUL byte
        raise ScenarioError("model", f"cannot read {short_repr(str(path))}: {exc}") from None
    data = read_json_object(file, "model")
    if not isinstance(data.get("model_type"), str):
        raise ScenarioError("model", f"{str(file)!r} has no 'model_type'; is it an HF config.json?")
    return data


def _looks_like_path(model: str) -> bool:
    """True if a model string names a file or folder rather than a preset id."""
    if model.endswith(".json") or "/" in model or "\\" in model:
        return True
    try:
        return Path(model).exists()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL byte: no such file
        return False


def _plain(value: Any) -> Any:
    """A mutable deep copy of JSON-like data: mappings as dicts, sequences as lists (the scenario holds
    inline configs frozen; the builders and transformers' config classes read plain HF data)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def resolve_model_config(model: str | Mapping[str, Any]) -> dict[str, Any]:
    """Turn a preset id, a config.json path or an inline HF config dict into a fresh HF config dict."""
    if isinstance(model, Mapping):
        if not isinstance(model.get("model_type"), str):
            raise ScenarioError(
                "model.model_type", "an inline model config needs a 'model_type' (e.g. 'llama')"
            )
        return _plain(model)
    if not isinstance(model, str):
        raise ScenarioError(
            "model", f"must be a preset id, a config.json path or a config dict, got {type(model).__name__}"
        )
    if model in PRESETS:
        return copy.deepcopy(PRESETS[model])
    if _looks_like_path(model):
        return _read_config_file(Path(model).expanduser())
    raise choice_error("model", model, preset_ids())


@functools.lru_cache(maxsize=128)
def _preset_architecture(preset: str) -> Architecture:
    """Architecture of a preset, built once (presets never change)."""
    return build_architecture(PRESETS[preset])


@functools.lru_cache(maxsize=256)
def _json_architecture(canonical: str) -> Architecture:
    """Architecture of an inline config, cached by its canonical JSON text."""
    return build_architecture(json.loads(canonical))


def architecture_for(model: str | Mapping[str, Any]) -> Architecture:
    """The Architecture of a preset id, config.json path or inline config (presets and dicts cached)."""
    if isinstance(model, str) and model in PRESETS:
        return _preset_architecture(model)
    config = resolve_model_config(model)
    if isinstance(model, str):  # a file: read each time, it may have changed
        return build_architecture(config)
    try:
        canonical = json.dumps(config, sort_keys=True)
    except (TypeError, ValueError):
        return build_architecture(config)
    return _json_architecture(canonical)
