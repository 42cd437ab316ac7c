"""Hold the engine to a fake-tensor trace: the same HF training step simulated and traced.

The case matrix lives here, as test data (not in the wheel), so the benchmark (``benchmarks/fidelity_trace.py``,
all cases) and the tests (a fast subset) share it: ``tests/conftest.py`` and the benchmarks put ``tests/data``
on ``sys.path`` (``import fidelity_cases``). Tracing needs the ``[trace]`` extra (torch, transformers, peft).
"""

from __future__ import annotations

import time
from typing import Any

from memsim_widget.catalog.models import PRESETS
from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

SMALL = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "tie_word_embeddings": False,
}
LLAMA = {"model_type": "llama", **SMALL}
#: The same Llama at h=512, I=1376 and a real vocabulary (V=32,000: its T x V loss buffers dominate as in the real
#: models); the allocator-replay cases (tests/engine/test_alloc_stream.py, benchmarks/allocator_replay_accum.py).
LLAMA_H512_V32K = {**LLAMA, "hidden_size": 512, "intermediate_size": 1376, "vocab_size": 32000}
#: The small Llama as ``benchmarks/zero_trace.py`` runs it under DeepSpeed (2 x 512, mixed-bf16, foreach AdamW, 4
#: ranks): the tests of the ZeRO streams add their stage, offload, LoRA and ``reserved_model``.
DEEPSPEED_SMALL_LLAMA = {
    "model": LLAMA_H512_V32K,
    "micro_batch_size": 2,
    "seq_len": 512,
    "precision": "mixed-bf16",
    "framework": "deepspeed",
    "optimizer": "adamw",
    "optimizer_impl": "foreach",
}
MISTRAL = {"model_type": "mistral", **SMALL, "sliding_window": None}
QWEN2 = {"model_type": "qwen2", **SMALL, "tie_word_embeddings": True}
MIXTRAL = {"model_type": "mixtral", **SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}
QWEN3_MOE = {
    "model_type": "qwen3_moe",
    **SMALL,
    "head_dim": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "norm_topk_prob": True,
}
QWEN3_MOE_MIXED = {**QWEN3_MOE, "num_experts": 32, "num_experts_per_tok": 4, "decoder_sparse_step": 2}
QWEN3_MOE_MIXED["mlp_only_layers"] = [3]
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    **{k: SMALL[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")},
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 48,
    "first_k_dense_replace": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "n_shared_experts": 1,
    "n_group": 2,
    "topk_group": 1,
}
DEEPSEEK_V2 = {
    **DEEPSEEK_V3,
    "model_type": "deepseek_v2",
    "q_lora_rank": None,
    "n_group": None,
    "topk_group": None,
}
#: T5 (T5ForConditionalGeneration): 4 encoder + 4 decoder blocks, ReLU feed-forward, dropout off (the CPU trace's
#: dropout masks are not CUDA's 1-byte masks: the dropout rules are checked on the H200 row, docs/accuracy.md)
T5 = {
    "model_type": "t5",
    "d_model": 256,
    "d_ff": 1024,
    "num_layers": 4,
    "num_decoder_layers": 4,
    "num_heads": 8,
    "d_kv": 32,
    "vocab_size": 1000,
    "dropout_rate": 0.0,
    "decoder_start_token_id": 0,
    "pad_token_id": 0,
}
#: Llama 4 text: MoE every 2nd layer (Maverick's interleave) with 4 experts, top-1, a shared expert; layer 3 NoPE
LLAMA4 = {
    "model_type": "llama4_text",
    **SMALL,
    "head_dim": 32,
    "intermediate_size": 128,
    "intermediate_size_mlp": 688,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2,
}
#: GPT-OSS: 8 experts, 2 per token, sinks, sliding/full alternating (no SDPA in transformers: eager rows)
GPT_OSS = {
    "model_type": "gpt_oss",
    **SMALL,
    "head_dim": 32,
    "intermediate_size": 128,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
GPT2 = {
    "model_type": "gpt2",
    "n_embd": 256,
    "n_layer": 4,
    "n_head": 8,
    "vocab_size": 1000,
    "n_positions": 2048,
    "attn_pdrop": 0.0,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
}

BERT = {
    "model_type": "bert",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
ROBERTA = {
    **BERT,
    "model_type": "roberta",
    "max_position_embeddings": 514,  # positions start after pad_token_id 1: 512 usable
    "type_vocab_size": 1,
}
MODERNBERT = {
    "model_type": "modernbert",
    "hidden_size": 256,
    "num_hidden_layers": 4,  # layers 0 and 3 global, 1 and 2 local (every 3rd global)
    "num_attention_heads": 8,
    "intermediate_size": 384,
    "vocab_size": 1000,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "cls_token_id": 1,
    "sep_token_id": 2,
}
VIT = {
    "model_type": "vit",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "intermediate_size": 1024,
    "image_size": 224,
    "patch_size": 16,
    "num_labels": 10,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
GPT_NEOX = {
    "model_type": "gpt_neox",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "intermediate_size": 1024,
    "vocab_size": 1000,
}
#: Gemma 1: tied, GeGLU, head_dim its own key
GEMMA = {"model_type": "gemma", **SMALL, "head_dim": 32, "tie_word_embeddings": True}
#: Gemma 2: tied, four norms per block, attention and final logit softcapping (50, 30: the config defaults)
GEMMA2 = {"model_type": "gemma2", **SMALL, "head_dim": 32, "tie_word_embeddings": True}
#: Gemma 3 text: as Gemma 2 plus per-head q/k norms; sliding and full layers alternate (two RoPE tables); a*d > h
GEMMA3 = {
    "model_type": "gemma3_text",
    **SMALL,
    "head_dim": 64,
    "sliding_window_pattern": 2,
    "tie_word_embeddings": True,
}
SEQ64 = {"vocab_size": 64, "use_parallel_residual": False}
PHI = {**GPT_NEOX, "model_type": "phi"}
FALCON = {
    "model_type": "falcon",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "vocab_size": 1000,
}
FALCON_NEW = {**FALCON, "new_decoder_architecture": True, "num_kv_heads": 2}
#: Falcon-RW's layer: ALiBi, classic multi-head (no multi_query), sequential, biases
FALCON_RW = {**FALCON, "alibi": True, "multi_query": False, "parallel_attn": False, "bias": True}
#: Mamba (MambaForCausalLM): 4 state-space layers, I = 512, N = 16 (no attention, no MLP). Only the torch path
#: (``ssm_kernel: "torch"``) runs on a CPU; its sequential scan makes each trace slow: short sequences.
MAMBA = {"model_type": "mamba", "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 1000,
         "tie_word_embeddings": False}  # fmt: skip
#: Mamba-2 (Mamba2ForCausalLM): 4 layers, 8 heads of 64 (I = 512), 2 groups, N = 16, chunks of 64 tokens
MAMBA2 = {"model_type": "mamba2", "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 1000, "num_heads": 8,
          "head_dim": 64, "state_size": 16, "n_groups": 2, "chunk_size": 64}  # fmt: skip
#: Jamba (JambaForCausalLM): 4 layers, attention at layer 1 (8 heads, 2 KV), Mamba v1 elsewhere (I = 512, N = 16),
#: 4 experts (top 2) on layers 1 and 3, dense MLPs (512) on 0 and 2; torch scan path only on a CPU
JAMBA = {"model_type": "jamba", "hidden_size": 256, "num_hidden_layers": 4, "vocab_size": 1000,
         "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512, "num_experts": 4,
         "num_experts_per_tok": 2, "attn_layer_period": 4, "attn_layer_offset": 1}  # fmt: skip

_LORA_IN = {"method": "lora", "lora": {"rank": 8, "targets": ["in_proj"]}}
_CKPT = {"activation_checkpointing": "full"}
#: Mamba (v1) under autocast, full checkpointing and LoRA (issue 26): (label, model keys, scenario keys), b2 s64
_SSM_ISSUE26: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("torch amp-bf16 b2 s64", {}, {"precision": "amp-bf16"}),
    ("torch bf16 ckpt b2 s64", {}, _CKPT),
    ("torch fp32 ckpt b2 s64", {}, {**_CKPT, "precision": "fp32"}),
    ("torch amp-bf16 ckpt b2 s64", {}, {**_CKPT, "precision": "amp-bf16"}),
    ("torch fp32 lora in_proj b2 s64", {}, {**_LORA_IN, "precision": "fp32"}),
    ("torch amp-bf16 lora in_proj b2 s64", {}, {**_LORA_IN, "precision": "amp-bf16"}),
    (
        "torch V32k tied bf16 ckpt sgd b1 s16 (peak at the tied gradients' sum)",
        {"tie_word_embeddings": True, "vocab_size": 32000},
        {**_CKPT, "optimizer": "sgd", "micro_batch_size": 1, "seq_len": 16},
    ),
    ("torch bf16 lora in_proj ckpt b2 s64", {}, {**_LORA_IN, **_CKPT}),
    ("torch bf16 lora in_proj b1 s128", {}, {**_LORA_IN, "micro_batch_size": 1, "seq_len": 128}),
    (
        "torch V50280 amp-bf16 b2 s64 (the real vocabulary; outputs kept: step, fp32 logits)",
        {"vocab_size": 50280},
        {"precision": "amp-bf16", "output_lifetime": "step"},
    ),
)

#: Jamba under LoRA (issue 26): adapters on in_proj (layer 0's first Linear), b2 s64
_JAMBA_LORA: tuple[tuple[str, dict[str, Any], dict[str, Any]], ...] = (
    ("bf16 lora in_proj b2 s64", {}, _LORA_IN),
    (
        "bf16 lora in_proj x_proj q_proj v_proj b2 s64",
        {},
        {"method": "lora", "lora": {"rank": 8, "targets": ["in_proj", "x_proj", "q_proj", "v_proj"]}},
    ),
    ("fp32 lora in_proj b2 s64 (dense MLPs)", {"num_experts": 1}, {**_LORA_IN, "precision": "fp32"}),
    ("amp-bf16 lora in_proj b2 s64 (dense MLPs)", {"num_experts": 1}, {**_LORA_IN, "precision": "amp-bf16"}),
    ("bf16 lora in_proj ckpt b2 s64", {}, {**_LORA_IN, **_CKPT}),
)

#: (name, scenario dict) pairs; the fast subset runs in the tests.
#: The four cases each newer family is held to (label, scenario keys): bf16 and amp-bf16 SDPA, LoRA on q and v,
#: fp32 eager, at micro-batch 2.
FAMILY_KEYS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("bf16 sdpa b2 s512", {"micro_batch_size": 2, "seq_len": 512}),
    ("amp-bf16 sdpa b2 s512", {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"}),
    (
        "bf16 lora qv b2 s512",
        {
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    (
        "fp32 eager b2 s256",
        {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32", "attention": "eager"},
    ),
)

CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama bf16 sdpa b2 s512", {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512}),
    ("llama bf16 sdpa b1 s64", {"model": LLAMA, "micro_batch_size": 1, "seq_len": 64}),
    ("llama bf16 sdpa b4 s1024", {"model": LLAMA, "micro_batch_size": 4, "seq_len": 1024}),
    ("llama fp32 sdpa b2 s512", {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "precision": "fp32"}),
    (
        "llama amp-bf16 sdpa b2 s512",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"},
    ),
    (
        "llama bf16 eager b2 s256",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 256, "attention": "eager"},
    ),
    (
        "llama bf16 ckpt b2 s512",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "activation_checkpointing": "full"},
    ),
    (
        "llama bf16 lora qv fp32 b2 s512",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    (
        "llama amp-bf16 lora qv b2 s512",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "precision": "amp-bf16",
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    (
        "llama amp-bf16 lora qv ckpt b2 s512",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "precision": "amp-bf16",
            "method": "lora",
            "activation_checkpointing": "full",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    ("llama bf16 sgd b2 s512", {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "optimizer": "sgd"}),
    (
        "llama bf16 fused b2 s512",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "optimizer_impl": "fused"},
    ),
    ("mistral bf16 sdpa b2 s512", {"model": MISTRAL, "micro_batch_size": 2, "seq_len": 512}),
    ("qwen2 bf16 sdpa b2 s512", {"model": QWEN2, "micro_batch_size": 2, "seq_len": 512}),
    ("mixtral bf16 sdpa b2 s512", {"model": MIXTRAL, "micro_batch_size": 2, "seq_len": 512}),
    ("gpt2 bf16 sdpa b2 s512", {"model": GPT2, "micro_batch_size": 2, "seq_len": 512}),
    ("gpt2 fp32 sdpa b2 s512", {"model": GPT2, "micro_batch_size": 2, "seq_len": 512, "precision": "fp32"}),
    ("gpt2 bf16 eager b2 s256", {"model": GPT2, "micro_batch_size": 2, "seq_len": 256, "attention": "eager"}),
    # gelu_new's pow runs in fp32 under CUDA autocast (trace/cuda_autocast.py; measured on an H200)
    (
        "gpt2 amp-bf16 sdpa b2 s512",
        {"model": GPT2, "micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"},
    ),
    ("llama V64 bf16 b4 s512", {"model": {**LLAMA, "vocab_size": 64}, "micro_batch_size": 4, "seq_len": 512}),
    (
        "llama V64 fp32 b4 s512",
        {"model": {**LLAMA, "vocab_size": 64}, "micro_batch_size": 4, "seq_len": 512, "precision": "fp32"},
    ),
    (
        "llama V64 bf16 ckpt b4 s512",
        {
            "model": {**LLAMA, "vocab_size": 64},
            "micro_batch_size": 4,
            "seq_len": 512,
            "activation_checkpointing": "full",
        },
    ),
    (
        "llama bf16 for-loop b1 s64",
        {"model": LLAMA, "micro_batch_size": 1, "seq_len": 64, "optimizer_impl": "for-loop"},
    ),
    (
        "llama bf16 adafactor b1 s64",
        {
            "model": LLAMA,
            "micro_batch_size": 1,
            "seq_len": 64,
            "optimizer": "adafactor",
            "optimizer_impl": "for-loop",
        },
    ),
    (
        "llama fp32 adafactor b1 s64",
        {
            "model": LLAMA,
            "micro_batch_size": 1,
            "seq_len": 64,
            "precision": "fp32",
            "optimizer": "adafactor",
            "optimizer_impl": "for-loop",
        },
    ),
    (
        "llama bf16 sgd-momentum b1 s64",
        {"model": LLAMA, "micro_batch_size": 1, "seq_len": 64, "optimizer": "sgd-momentum"},
    ),
    (
        "llama bf16 lora all-linear bf16 b2 s512",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 16, "targets": ["all-linear"], "adapter_dtype": "bf16"},
        },
    ),
    (
        "llama bf16 lora all-linear fp32 b2 s512",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 16, "targets": ["all-linear"]},
        },
    ),
    (
        "llama bf16 lora qv ckpt b2 s512",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "activation_checkpointing": "full",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    (
        "llama amp-bf16 eager b2 s256",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 256,
            "precision": "amp-bf16",
            "attention": "eager",
        },
    ),
    (
        "qwen2 fp32 eager b2 s256",
        {"model": QWEN2, "micro_batch_size": 2, "seq_len": 256, "precision": "fp32", "attention": "eager"},
    ),
    (
        "llama-2-7b bf16 b1 s2048 (real shape)",
        {"model": "llama-2-7b", "micro_batch_size": 1, "seq_len": 2048},
    ),
    (
        "qwen2.5-0.5b bf16 b2 s1024 (real shape)",
        {"model": "qwen2.5-0.5b", "micro_batch_size": 2, "seq_len": 1024},
    ),
    (
        "llama-3.2-1b amp-bf16 b1 s1024 (real shape)",
        {"model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 1024, "precision": "amp-bf16"},
    ),
    ("bert bf16 sdpa b4 s256 (no dropout)", {"model": BERT, "micro_batch_size": 4, "seq_len": 256}),
    (
        "bert fp32 eager b2 s256 (no dropout)",
        {"model": BERT, "micro_batch_size": 2, "seq_len": 256, "precision": "fp32", "attention": "eager"},
    ),
    # T5: encoder-decoder; SDPA with the relative position bias as a float mask: the math path (fp32 q, k, v and
    # probabilities) while the bias trains, the fused kernel when it is frozen (LoRA) and in cross-attention
    ("t5 bf16 sdpa b2 s512 (no dropout)", {"model": T5, "micro_batch_size": 2, "seq_len": 512}),
    (
        "t5 fp32 sdpa b2 s512 (no dropout)",
        {"model": T5, "micro_batch_size": 2, "seq_len": 512, "precision": "fp32"},
    ),
    (
        "t5 amp-bf16 sdpa b2 s512 (no dropout)",
        {"model": T5, "micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"},
    ),
    (
        "t5 bf16 lora q/v b2 s512 (no dropout)",
        {
            "model": T5,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q", "v"]},
        },
    ),
    (
        "t5 bf16 eager b2 s256 (no dropout)",
        {"model": T5, "micro_batch_size": 2, "seq_len": 256, "attention": "eager"},
    ),
    (
        "t5 gated-gelu untied (v1.1 / Flan layout) bf16 sdpa b2 s512 (no dropout)",
        {
            "model": {**T5, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
            "micro_batch_size": 2,
            "seq_len": 512,
        },
    ),
    (
        "t5 gated-gelu fp32 eager b2 s256 (no dropout)",
        {
            "model": {**T5, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
            "micro_batch_size": 2,
            "seq_len": 256,
            "precision": "fp32",
            "attention": "eager",
        },
    ),
    (
        "t5 bf16 ckpt b2 s512 (no dropout)",
        {"model": T5, "micro_batch_size": 2, "seq_len": 512, "activation_checkpointing": "full"},
    ),
    (
        "t5 amp-bf16 lora q/v b2 s512 (no dropout)",
        {
            "model": T5,
            "micro_batch_size": 2,
            "seq_len": 512,
            "precision": "amp-bf16",
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q", "v"]},
        },
    ),
    ("t5 bf16 sdpa b1 s1024 (no dropout)", {"model": T5, "micro_batch_size": 1, "seq_len": 1024}),
    # RoBERTa: BERT's layers under other names, positions offset by the padding index
    ("roberta bf16 sdpa b4 s256 (no dropout)", {"model": ROBERTA, "micro_batch_size": 4, "seq_len": 256}),
    (
        "roberta amp-bf16 sdpa b4 s256 (no dropout)",
        {"model": ROBERTA, "micro_batch_size": 4, "seq_len": 256, "precision": "amp-bf16"},
    ),
    (
        "roberta fp32 eager b2 s256 (no dropout)",
        {"model": ROBERTA, "micro_batch_size": 2, "seq_len": 256, "precision": "fp32", "attention": "eager"},
    ),
    (
        "roberta bf16 lora qv b4 s256 (no dropout)",
        {
            "model": ROBERTA,
            "micro_batch_size": 4,
            "seq_len": 256,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["query", "value"]},
        },
    ),
    # ModernBERT: pre-norm without biases, fused Wqkv, GeGLU, global/local layers (SDPA masks the local ones)
    ("modernbert bf16 sdpa b2 s512", {"model": MODERNBERT, "micro_batch_size": 2, "seq_len": 512}),
    (
        "modernbert amp-bf16 sdpa b2 s512",
        {"model": MODERNBERT, "micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"},
    ),
    (
        "modernbert fp32 eager b2 s256",
        {
            "model": MODERNBERT,
            "micro_batch_size": 2,
            "seq_len": 256,
            "precision": "fp32",
            "attention": "eager",
        },
    ),
    (
        "modernbert bf16 lora Wqkv b2 s512",
        {
            "model": MODERNBERT,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["Wqkv"]},
        },
    ),
    (
        "modernbert bf16 ckpt b2 s512",
        {"model": MODERNBERT, "micro_batch_size": 2, "seq_len": 512, "activation_checkpointing": "full"},
    ),
    (
        "roberta bf16 ckpt b4 s256 (no dropout)",
        {"model": ROBERTA, "micro_batch_size": 4, "seq_len": 256, "activation_checkpointing": "full"},
    ),
    (
        "modernbert bf16 sdpa b16 s48 (within the half window: no mask)",
        {"model": MODERNBERT, "micro_batch_size": 16, "seq_len": 48},
    ),
    (
        "modernbert-base bf16 sdpa b2 s1024 (real shape)",
        {"model": "modernbert-base", "micro_batch_size": 2, "seq_len": 1024},
    ),
    (
        "roberta-base bf16 sdpa b8 s512 (real shape, no dropout)",
        {
            "model": {
                **PRESETS["roberta-base"],
                "hidden_dropout_prob": 0.0,
                "attention_probs_dropout_prob": 0.0,
            },
            "micro_batch_size": 8,
            "seq_len": 512,
        },
    ),
    ("vit bf16 sdpa b8 (no dropout)", {"model": VIT, "micro_batch_size": 8, "seq_len": 197}),
    (
        "vit amp-bf16 sdpa b8 (no dropout)",
        {"model": VIT, "micro_batch_size": 8, "seq_len": 197, "precision": "amp-bf16"},
    ),
    ("llama bf16 sdpa b8 s256 (batch sweep)", {"model": LLAMA, "micro_batch_size": 8, "seq_len": 256}),
    ("llama bf16 sdpa b1 s2048 (sequence sweep)", {"model": LLAMA, "micro_batch_size": 1, "seq_len": 2048}),
    ("llama bf16 sdpa b1 s4096 (sequence sweep)", {"model": LLAMA, "micro_batch_size": 1, "seq_len": 4096}),
    (
        "llama bf16 eager b1 s1024 (sequence sweep)",
        {"model": LLAMA, "micro_batch_size": 1, "seq_len": 1024, "attention": "eager"},
    ),
    ("llama fp16 sdpa b2 s512", {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "precision": "fp16"}),
    (
        "llama fp32 fused b2 s128",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 128,
            "precision": "fp32",
            "optimizer_impl": "fused",
        },
    ),
    (
        "llama bf16 lora qv bf16 b2 s512",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"], "adapter_dtype": "bf16"},
        },
    ),
    (
        "mistral bf16 lora all-linear b2 s512",
        {
            "model": MISTRAL,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 16, "targets": ["all-linear"]},
        },
    ),
    (
        "qwen2 bf16 ckpt b2 s1024",
        {"model": QWEN2, "micro_batch_size": 2, "seq_len": 1024, "activation_checkpointing": "full"},
    ),
    (
        "mixtral bf16 eager b2 s256",
        {"model": MIXTRAL, "micro_batch_size": 2, "seq_len": 256, "attention": "eager"},
    ),
    # GPT-NeoX / Pythia: fused query_key_value, partial rotary (q and k out of torch.cat), LayerNorm with bias;
    # the parallel residual (both norms read the layer input) and the sequential one
    *(
        (f"gpt_neox {label}", {"model": {**GPT_NEOX, **more}, **keys})
        for label, more, keys in (
            ("bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512}),
            ("sequential V64 bf16 b2 s512", SEQ64, {"micro_batch_size": 2, "seq_len": 512}),
            ("amp-bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"}),
            (
                "V64 fp32 sdpa b2 s512",
                {"vocab_size": 64},
                {"micro_batch_size": 2, "seq_len": 512, "precision": "fp32"},
            ),
            (
                "V64 bf16 eager b2 s256",
                {"vocab_size": 64},
                {"micro_batch_size": 2, "seq_len": 256, "attention": "eager"},
            ),
            (
                "sequential V64 bf16 lora qkv b2 s512",
                SEQ64,
                {
                    "micro_batch_size": 2,
                    "seq_len": 512,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["query_key_value"]},
                },
            ),
            (
                "V64 bf16 lora qkv+dense b2 s512",
                {"vocab_size": 64},
                {
                    "micro_batch_size": 2,
                    "seq_len": 512,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["query_key_value", "dense"]},
                },
            ),
            (
                "V64 bf16 ckpt b2 s512",
                {"vocab_size": 64},
                {"micro_batch_size": 2, "seq_len": 512, "activation_checkpointing": "full"},
            ),
        )
    ),
    # Phi-1/2: q, k, v and fc1 read one LayerNorm's output; partial rotary; gelu_new; optional q/k LayerNorm
    *(
        (f"phi {label}", {"model": {**PHI, **more}, **keys})
        for label, more, keys in (
            ("bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512}),
            ("V64 bf16 sdpa b2 s512", {"vocab_size": 64}, {"micro_batch_size": 2, "seq_len": 512}),
            (
                "V64 qk_layernorm gqa bf16 b2 s512",
                {"vocab_size": 64, "qk_layernorm": True, "num_key_value_heads": 4},
                {"micro_batch_size": 2, "seq_len": 512},
            ),
            ("amp-bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"}),
            (
                "V64 fp32 eager b2 s256",
                {"vocab_size": 64},
                {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32", "attention": "eager"},
            ),
            (
                "V64 bf16 lora qv b2 s512",
                {"vocab_size": 64},
                {
                    "micro_batch_size": 2,
                    "seq_len": 512,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
                },
            ),
        )
    ),
    # the plain loop: `outputs = model(**batch); outputs.loss.backward(); optimizer.step()` keeps the outputs
    *(
        (
            f"{name} {precision} sdpa b{b} s{s} (outputs kept: {lifetime})",
            {
                "model": model,
                "micro_batch_size": b,
                "seq_len": s,
                "precision": precision,
                "output_lifetime": lifetime,
            },
        )  # fmt: skip
        for name, model, precision, b, s, lifetime in (
            ("llama", LLAMA, "bf16", 2, 512, "backward"),
            ("llama", LLAMA, "bf16", 2, 512, "step"),
            ("llama", LLAMA, "amp-bf16", 2, 512, "backward"),
            ("llama", LLAMA, "amp-bf16", 2, 512, "step"),
            ("qwen2", QWEN2, "bf16", 2, 512, "backward"),
            ("qwen2", QWEN2, "amp-bf16", 2, 512, "step"),
            ("llama", LLAMA, "bf16", 1, 64, "step"),
        )
    ),
    # torchtitan's checkpointing policies (trace/checkpointing.py wraps each decoder layer)
    *(
        (
            f"{name} {precision} {label} b{b} s{s}",
            {"model": model, "micro_batch_size": b, "seq_len": s, "precision": precision, **keys},
        )  # fmt: skip
        for name, model, precision, b, s, label, keys in (
            ("llama", LLAMA, "bf16", 2, 512, "selective-op", {"activation_checkpointing": "selective-op"}),
            (
                "llama",
                LLAMA,
                "amp-bf16",
                2,
                512,
                "selective-op",
                {"activation_checkpointing": "selective-op"},
            ),
            (
                "llama V64",
                {**LLAMA, "vocab_size": 64},
                "bf16",
                4,
                512,
                "selective-op",
                {"activation_checkpointing": "selective-op"},
            ),  # fmt: skip
            (
                "llama",
                LLAMA,
                "bf16",
                2,
                512,
                "ckpt every 2",
                {"activation_checkpointing": "full", "checkpoint_every": 2},
            ),
            (
                "llama V64",
                {**LLAMA, "vocab_size": 64},
                "bf16",
                4,
                512,
                "ckpt every 2",
                {"activation_checkpointing": "full", "checkpoint_every": 2},
            ),  # fmt: skip
        )
    ),
    # Qwen3: per-head q/k RMSNorm (head_dim left at the config default, 128: a*d = 1024 > h)
    *(
        (f"qwen3 {label}", {"model": {"model_type": "qwen3", **SMALL, "tie_word_embeddings": True}, **keys})
        for label, keys in FAMILY_KEYS
    ),
    # OLMo 2: post-norms only, q/k RMSNorm over the whole projection, weights multiplied in fp32
    *(
        (f"olmo2 {label}", {"model": {"model_type": "olmo2", **SMALL, "eos_token_id": 2}, **keys})
        for label, keys in FAMILY_KEYS
    ),
    # GLM-4: four norms per block (two read 16-bit projection outputs), fused gate_up_proj, half-width RoPE
    *(
        (
            f"glm4 {label}",
            {
                "model": {
                    "model_type": "glm4",
                    **SMALL,
                    "head_dim": 32,
                    "eos_token_id": 2,
                    "pad_token_id": 0,
                },
                **keys,
            },
        )
        for label, keys in FAMILY_KEYS
    ),
    # Cohere: one mean-centred LayerNorm (no bias) feeding attention and MLP in parallel, optional per-head q/k norm
    *(
        (
            f"cohere {label}",
            {
                "model": {
                    "model_type": "cohere",
                    **SMALL,
                    "tie_word_embeddings": True,
                    "eos_token_id": 2,
                    **qk,
                },
                **keys,
            },
        )
        for label, qk, keys in (
            ("bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512}),
            ("amp-bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"}),
            (
                "bf16 lora qv b2 s512",
                {},
                {
                    "micro_batch_size": 2,
                    "seq_len": 512,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
                },
            ),
            (
                "fp32 eager b2 s256",
                {},
                {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32", "attention": "eager"},
            ),
            ("qk-norm bf16 sdpa b2 s512", {"use_qk_norm": True}, {"micro_batch_size": 2, "seq_len": 512}),
        )
    ),
    # StarCoder2: LayerNorms with bias, biased Linears, one-op GELU MLP (c_fc/c_proj); dropouts off (see notes)
    *(
        (
            f"starcoder2 {label}",
            {
                "model": {
                    "model_type": "starcoder2",
                    **SMALL,
                    "tie_word_embeddings": True,
                    "eos_token_id": 2,
                },
                **keys,
            },
        )
        for label, keys in FAMILY_KEYS
    ),
    # Falcon: fused query_key_value, no biases, tied head. Multi-query (Falcon-7B): SDPA's math fallback (fp32
    # q and expanded k, v, fp32 probabilities); new decoder architecture (Falcon-40B): k, v broadcast to all
    # heads, ln_attn + ln_mlp, the explicit mask's float cast saved per layer; the classic sequential layer
    *(
        (f"falcon {label}", {"model": model, "micro_batch_size": 2, "seq_len": 512, **keys})
        for label, model, keys in (
            ("multi-query bf16 sdpa b2 s512", FALCON, {}),
            ("multi-query amp-bf16 sdpa b2 s512", FALCON, {"precision": "amp-bf16"}),
            (
                "multi-query bf16 lora qkv+dense b2 s512",
                FALCON,
                {"method": "lora", "lora": {"rank": 8, "targets": ["query_key_value", "dense"]}},
            ),
            (
                "multi-query fp32 eager b2 s256",
                FALCON,
                {"precision": "fp32", "attention": "eager", "seq_len": 256},
            ),
            ("new-decoder bf16 sdpa b2 s512", FALCON_NEW, {}),
            ("new-decoder amp-bf16 sdpa b2 s512", FALCON_NEW, {"precision": "amp-bf16"}),
            (
                "new-decoder bf16 lora qkv+dense b2 s512",
                FALCON_NEW,
                {"method": "lora", "lora": {"rank": 8, "targets": ["query_key_value", "dense"]}},
            ),
            (
                "new-decoder fp32 eager b2 s256",
                FALCON_NEW,
                {"precision": "fp32", "attention": "eager", "seq_len": 256},
            ),
            (
                "sequential multi-head V64 bf16 sdpa b2 s512",
                {**FALCON, "multi_query": False, "parallel_attn": False, "vocab_size": 64},
                {},
            ),
            (
                "new-decoder bias amp-bf16 sdpa b2 s512",
                {**FALCON_NEW, "bias": True},
                {"precision": "amp-bf16"},
            ),
            ("alibi multi-head sequential bias (RW) bf16 sdpa b2 s512", FALCON_RW, {}),
            ("alibi multi-head sequential bias (RW) fp32 sdpa b2 s512", FALCON_RW, {"precision": "fp32"}),
            (
                "alibi multi-head sequential bias (RW) bf16 lora qkv+dense b2 s512",
                FALCON_RW,
                {"method": "lora", "lora": {"rank": 8, "targets": ["query_key_value", "dense"]}},
            ),
            ("alibi new-decoder bf16 sdpa b2 s512", {**FALCON_NEW, "alibi": True}, {}),
            ("alibi multi-query bf16 sdpa b2 s512", {**FALCON, "alibi": True}, {}),
            ("multi-query bf16 sdpa b1 s1024", FALCON, {"micro_batch_size": 1, "seq_len": 1024}),
            ("multi-query bf16 eager b1 s512", FALCON, {"micro_batch_size": 1, "attention": "eager"}),
            ("multi-query bf16 ckpt b2 s512", FALCON, {"activation_checkpointing": "full"}),
            ("new-decoder bf16 ckpt b2 s512", FALCON_NEW, {"activation_checkpointing": "full"}),
            ("falcon-7b bf16 b1 s2048 (real shape)", "falcon-7b", {"micro_batch_size": 1, "seq_len": 2048}),
            *(
                (
                    f"{preset} bf16 lora qkv+dense b1 s2048 (real shape)",
                    preset,
                    {
                        "micro_batch_size": 1,
                        "seq_len": 2048,
                        "method": "lora",
                        "lora": {"rank": 16, "targets": ["query_key_value", "dense"]},
                    },
                )
                for preset in ("falcon-40b", "falcon-180b")
            ),
        )
    ),
    # Qwen3-MoE: per-head q/k norms, 8 routed experts (2 per token, renormalised); one dense layer (mlp_only_layers)
    *(
        (f"qwen3_moe {label}", {"model": model, "micro_batch_size": 2, "seq_len": 512})
        for label, model in (
            ("bf16 sdpa b2 s512", QWEN3_MOE),
            ("bf16 sdpa b2 s512 (mlp_only_layers, sparse step 2)", QWEN3_MOE_MIXED),
        )
    ),
    # Gemma 1: Gemma's RMSNorm (fp32 (1 + w), normalised tensor only when w trains, output in the input's dtype)
    *((f"gemma {label}", {"model": GEMMA, **keys}) for label, keys in FAMILY_KEYS[:3]),
    # Gemma 2: transformers has no SDPA path for it (softcapping), so the default "sdpa" scenario runs eager in
    # both engine and trace; the attention softcap's tanh output is saved per layer (b x a x s x s)
    *(
        (f"gemma2 {label}", {"model": GEMMA2, **keys})
        for label, keys in (
            ("bf16 default attention (eager) b2 s256", {"micro_batch_size": 2, "seq_len": 256}),
            ("bf16 eager b2 s512", {"micro_batch_size": 2, "seq_len": 512, "attention": "eager"}),
            ("amp-bf16 eager b2 s256", {"micro_batch_size": 2, "seq_len": 256, "precision": "amp-bf16"}),
            (
                "bf16 lora qv eager b2 s256",
                {
                    "micro_batch_size": 2,
                    "seq_len": 256,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
                },
            ),
            ("fp32 eager b2 s256", {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32"}),
        )
    ),
    (
        "gemma2 bf16 eager b2 s256 (32k vocab: final logit softcapping at the loss)",
        {"model": {**GEMMA2, "vocab_size": 32000}, "micro_batch_size": 2, "seq_len": 256},
    ),
    # Gemma 3: per-head q/k Gemma RMSNorms (fp32 normalised tensors), SDPA, no attention softcapping
    *((f"gemma3_text {label}", {"model": GEMMA3, **keys}) for label, keys in FAMILY_KEYS),
    (
        "gemma3_text bf16 sdpa b2 s512 (sliding_window 128: masked sliding layers, k/v repeated)",
        {"model": {**GEMMA3, "sliding_window": 128}, "micro_batch_size": 2, "seq_len": 512},
    ),
    (
        "gemma-3-1b bf16 lora qv b1 s1024 (real size: one KV head, 262k vocab, window 512)",
        {
            "model": "gemma-3-1b",
            "micro_batch_size": 1,
            "seq_len": 1024,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    (
        "gemma3_text bf16 sdpa b2 s512 (32k vocab, final logit softcapping 30)",
        {
            "model": {**GEMMA3, "vocab_size": 32000, "final_logit_softcapping": 30.0},
            "micro_batch_size": 2,
            "seq_len": 512,
        },
    ),
    # frozen grouped_mm experts under LoRA keep no gathered input rows (traced first on GPT-OSS)
    (
        "mixtral bf16 lora qv b2 s512",
        {
            "model": MIXTRAL,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    (
        "qwen3_moe bf16 lora qv b2 s512",
        {
            "model": QWEN3_MOE,
            "micro_batch_size": 2,
            "seq_len": 512,
            "method": "lora",
            "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
        },
    ),
    # LoRA on the fused routed experts: peft 0.21.2 maps the checkpoint's expert names onto target_parameters
    # (gate_up_proj at twice the rank, down_proj) and saves each layer's merged weight W + B A (engine mlp.expert_lora)
    *(
        (
            f"{family} {prec} lora experts {label} b2 s512",
            {
                "model": model,
                "micro_batch_size": 2,
                "seq_len": 512,
                "precision": prec,
                "method": "lora",
                "lora": {"rank": 8, "targets": targets},
                **extra,
            },
        )
        for family, prec, label, model, targets, extra in (
            (
                "qwen3_moe",
                "bf16",
                "q v gate up down",
                QWEN3_MOE,
                ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"],
                {},
            ),
            ("qwen3_moe", "bf16", "q v down", QWEN3_MOE, ["q_proj", "v_proj", "down_proj"], {}),
            (
                "qwen3_moe",
                "bf16",
                "q v gate up down, ckpt full",
                QWEN3_MOE,
                ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"],
                {"activation_checkpointing": "full"},
            ),
            (
                "qwen3_moe",
                "bf16",
                "gate up down (mlp_only_layers: its dense MLP loses them)",
                QWEN3_MOE_MIXED,
                ["q_proj", "gate_proj", "up_proj", "down_proj"],
                {},
            ),
            ("qwen3_moe", "bf16", "all-linear (the router too)", QWEN3_MOE, ["all-linear"], {}),
            ("qwen3_moe", "bf16", "all-linear (mlp_only_layers)", QWEN3_MOE_MIXED, ["all-linear"], {}),
            ("mixtral", "bf16", "q v w1 w2 w3", MIXTRAL, ["q_proj", "v_proj", "w1", "w2", "w3"], {}),
            ("mixtral", "bf16", "all-linear (the router too)", MIXTRAL, ["all-linear"], {}),
            (
                "mixtral",
                "bf16",
                "q v w1 w2 w3, bf16 adapters",
                MIXTRAL,
                ["q_proj", "v_proj", "w1", "w2", "w3"],
                {
                    "lora": {
                        "rank": 8,
                        "targets": ["q_proj", "v_proj", "w1", "w2", "w3"],
                        "adapter_dtype": "bf16",
                    }
                },
            ),
            (
                "deepseek_v3",
                "bf16",
                "o gate up down (shared experts lose them)",
                DEEPSEEK_V3,
                ["o_proj", "gate_proj", "up_proj", "down_proj"],
                {},
            ),
        )
    ),
    # DeepSeek MLA (q/kv latents, rope/nope split), routed + shared experts, one dense first layer. SDPA rows
    # use v_head_dim = qk_head_dim: with d_v != d_qk the CPU trace falls back to the math kernel (which
    # keeps the s x s probabilities), where CUDA runs the memory-efficient one; eager keeps the real split
    ("deepseek_v3 bf16 sdpa b2 s512", {"model": DEEPSEEK_V3, "micro_batch_size": 2, "seq_len": 512}),
    (
        "deepseek_v3 bf16 eager b2 s256 (d_v != d_qk)",
        {
            "model": {**DEEPSEEK_V3, "v_head_dim": 32},
            "micro_batch_size": 2,
            "seq_len": 256,
            "attention": "eager",
        },
    ),
    (
        "deepseek_v2 bf16 sdpa b2 s512 (no q_lora)",
        {"model": DEEPSEEK_V2, "micro_batch_size": 2, "seq_len": 512},
    ),
    # under LoRA the frozen fp32 router keeps no fp32 input copy (and grouped_mm no gathered rows)
    *(
        (
            f"{name} bf16 lora {label} b2 s512",
            {
                "model": model,
                "micro_batch_size": 2,
                "seq_len": 512,
                "method": "lora",
                "lora": {"rank": 8, "targets": targets},
            },
        )
        for name, model, label, targets in (
            ("deepseek_v3", DEEPSEEK_V3, "q_a kv_a", ["q_a_proj", "kv_a_proj_with_mqa"]),
            ("deepseek_v2", DEEPSEEK_V2, "q kv_a", ["q_proj", "kv_a_proj_with_mqa"]),
        )
    ),
    # Llama 4 text: all E experts run every token (torch.bmm, no grouped_mm: fp32 and autocast trace on CPU),
    # L2 q/k norm on RoPE layers, dense MLP on the other layers
    *(
        (f"llama4_text {label}", {"model": {**LLAMA4, **more}, **keys})
        for label, more, keys in (
            ("bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512}),
            (
                "bf16 lora qv b2 s512",
                {},
                {
                    "micro_batch_size": 2,
                    "seq_len": 512,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
                },
            ),
            ("fp32 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512, "precision": "fp32"}),
            ("amp-bf16 sdpa b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"}),
            ("bf16 eager b2 s256", {}, {"micro_batch_size": 2, "seq_len": 256, "attention": "eager"}),
            (
                "bf16 sdpa b2 s512 (chunk 128: masked chunked layers)",
                {"attention_chunk_size": 128},
                {"micro_batch_size": 2, "seq_len": 512},
            ),
            (
                "V64 bf16 sdpa b2 s512 (8 experts I=256 every layer: peak in backward)",
                {
                    "interleave_moe_layer_step": 1,
                    "num_local_experts": 8,
                    "intermediate_size": 256,
                    "vocab_size": 64,
                },
                {"micro_batch_size": 2, "seq_len": 512},
            ),
            (
                "bf16 sdpa b2 s512 (MoE every layer, no qk norm)",
                {"interleave_moe_layer_step": 1, "use_qk_norm": False},
                {"micro_batch_size": 2, "seq_len": 512},
            ),
        )
    ),
    # GPT-OSS: eager attention with sinks (transformers has no SDPA path), clamped-SwiGLU grouped_mm experts
    *(
        (f"gpt_oss {label}", {"model": {**GPT_OSS, **more}, "attention": "eager", **keys})
        for label, more, keys in (
            ("bf16 eager b2 s256", {}, {"micro_batch_size": 2, "seq_len": 256}),
            (
                "V64 I512 bf16 eager b2 s256 (peak in backward)",
                {"vocab_size": 64, "intermediate_size": 512},
                {"micro_batch_size": 2, "seq_len": 256},
            ),
            (
                "bf16 eager lora qv b2 s256",
                {},
                {
                    "micro_batch_size": 2,
                    "seq_len": 256,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]},
                },
            ),
        )
    ),
    # Mamba: transformers' torch path (every scan state saved); the CUDA kernels' path is a formula (not traced)
    *(
        (f"mamba {label}", {"model": {**MAMBA, **more}, "ssm_kernel": "torch", **keys})
        for label, more, keys in (
            ("torch bf16 b2 s64", {}, {"micro_batch_size": 2, "seq_len": 64}),
            ("torch fp32 b2 s64", {}, {"micro_batch_size": 2, "seq_len": 64, "precision": "fp32"}),
            (
                "torch bf16 b1 s128 (tied, N=8, K=3, biases)",
                {"tie_word_embeddings": True, "state_size": 8, "conv_kernel": 3, "use_bias": True},
                {"micro_batch_size": 1, "seq_len": 128},
            ),
            (
                "torch bf16 lora in_proj x_proj b2 s64",
                {},
                {
                    "micro_batch_size": 2,
                    "seq_len": 64,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["in_proj", "x_proj"]},
                },
            ),
            (
                "torch V32k bf16 b2 s64 (outputs kept: step; the model returns fp32 logits)",
                {"vocab_size": 32000},
                {"micro_batch_size": 2, "seq_len": 64, "output_lifetime": "step"},
            ),
            # issue 26: autocast (softplus in fp32 as on CUDA), full checkpointing, LoRA in every precision
            *(
                (label, more, {"micro_batch_size": 2, "seq_len": 64, **keys})
                for label, more, keys in _SSM_ISSUE26
            ),
        )
    ),
    # Mamba-2: transformers' chunked SSD in torch (the per-chunk states and l x l decays saved); kernel path a formula
    *(
        (f"mamba2 {label}", {"model": {**MAMBA2, **more}, "ssm_kernel": "torch", **keys})
        for label, more, keys in (
            ("torch bf16 b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512}),
            ("torch fp32 b2 s256", {}, {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32"}),
            (
                "torch bf16 b1 s1000 (padded last chunk, tied, K=3, biases)",
                {"tie_word_embeddings": True, "conv_kernel": 3, "use_bias": True},
                {"micro_batch_size": 1, "seq_len": 1000},
            ),
            (
                "torch V64 bf16 b2 s512 (peak in a layer's backward)",
                {"vocab_size": 64},
                {"micro_batch_size": 2, "seq_len": 512},
            ),
            (
                "torch bf16 lora in_proj b2 s512",
                {},
                {
                    "micro_batch_size": 2,
                    "seq_len": 512,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["in_proj"]},
                },
            ),
            (
                "torch bf16 lora in_proj b1 s1000 (padded last chunk)",
                {},
                {
                    "micro_batch_size": 1,
                    "seq_len": 1000,
                    "method": "lora",
                    "lora": {"rank": 8, "targets": ["in_proj"]},
                },
            ),
            (
                "torch V32k bf16 b2 s256 (outputs kept: backward; the model returns fp32 logits)",
                {"vocab_size": 32000},
                {"micro_batch_size": 2, "seq_len": 256, "output_lifetime": "backward"},
            ),
            (
                "torch fp32 lora in_proj b2 s256",
                {},
                {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32", **_LORA_IN},
            ),
            # issue 26: autocast runs the SSD's einsums in bf16
            ("torch amp-bf16 b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16"}),
            (
                "torch amp-bf16 b1 s1000 (padded last chunk, tied, K=3, biases)",
                {"tie_word_embeddings": True, "conv_kernel": 3, "use_bias": True},
                {"micro_batch_size": 1, "seq_len": 1000, "precision": "amp-bf16"},
            ),
            (
                "torch amp-bf16 b2 s256 (16 heads of 32, N=24, chunks of 32)",
                {"num_heads": 16, "head_dim": 32, "state_size": 24, "chunk_size": 32},
                {"micro_batch_size": 2, "seq_len": 256, "precision": "amp-bf16"},
            ),
            (
                "torch amp-bf16 lora in_proj b2 s512",
                {},
                {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16", **_LORA_IN},
            ),
            # issue 26: full checkpointing (each Mamba2Block's fp32 output kept; the recomputed gated norm's backward)
            ("torch bf16 ckpt b2 s512", {}, {"micro_batch_size": 2, "seq_len": 512, **_CKPT}),
            (
                "torch fp32 ckpt b2 s256",
                {},
                {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32", **_CKPT},
            ),
            (
                "torch bf16 lora in_proj ckpt b2 s512",
                {},
                {"micro_batch_size": 2, "seq_len": 512, **_LORA_IN, **_CKPT},
            ),
            # issue 26: under autocast the peak is the recomputed layer's SSD output; an fp32 stream's norm input is
            # the checkpointed input (kept once)
            (
                "torch amp-bf16 ckpt b2 s512",
                {},
                {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16", **_CKPT},
            ),
            (
                "torch amp-fp16 ckpt b2 s512",
                {},
                {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-fp16", **_CKPT},
            ),
            (
                "torch amp-bf16 ckpt b2 s256 (16 heads of 32, N=24, chunks of 32)",
                {"num_heads": 16, "head_dim": 32, "state_size": 24, "chunk_size": 32},
                {"micro_batch_size": 2, "seq_len": 256, "precision": "amp-bf16", **_CKPT},
            ),
            (
                "torch amp-bf16 lora in_proj ckpt b2 s512",
                {},
                {"micro_batch_size": 2, "seq_len": 512, "precision": "amp-bf16", **_LORA_IN, **_CKPT},
            ),
            (
                "torch amp-bf16 lora in_proj ckpt b1 s1000 (padded last chunk)",
                {},
                {"micro_batch_size": 1, "seq_len": 1000, "precision": "amp-bf16", **_LORA_IN, **_CKPT},
            ),
            (
                "torch fp32 lora in_proj ckpt b2 s256",
                {},
                {"micro_batch_size": 2, "seq_len": 256, "precision": "fp32", **_LORA_IN, **_CKPT},
            ),
            (
                "torch fp32 lora in_proj ckpt b1 s1000 (padded last chunk)",
                {},
                {"micro_batch_size": 1, "seq_len": 1000, "precision": "fp32", **_LORA_IN, **_CKPT},
            ),
            # issue 26: a tied embedding's gradient made by the head at the top of backward, summed at the bottom
            (
                "torch bf16 ckpt b1 s1000 (padded last chunk, tied, K=3, biases)",
                {"tie_word_embeddings": True, "conv_kernel": 3, "use_bias": True},
                {"micro_batch_size": 1, "seq_len": 1000, **_CKPT},
            ),
            (
                "torch amp-bf16 ckpt b1 s1000 (padded last chunk, tied, K=3, biases)",
                {"tie_word_embeddings": True, "conv_kernel": 3, "use_bias": True},
                {"micro_batch_size": 1, "seq_len": 1000, "precision": "amp-bf16", **_CKPT},
            ),
            (
                "torch V32k tied bf16 ckpt b1 s64 (peak at the tied gradients' sum)",
                {"tie_word_embeddings": True, "vocab_size": 32000},
                {"micro_batch_size": 1, "seq_len": 64, **_CKPT},
            ),
            (
                "torch V32k tied amp-bf16 sgd b1 s64 (peak at the tied gradients' sum)",
                {"tie_word_embeddings": True, "vocab_size": 32000},
                {"micro_batch_size": 1, "seq_len": 64, "precision": "amp-bf16", "optimizer": "sgd"},
            ),
            (
                "torch V50288 amp-bf16 b2 s256 (the real vocabulary; outputs kept: backward, fp32 logits)",
                {"vocab_size": 50288},
                {
                    "micro_batch_size": 2,
                    "seq_len": 256,
                    "precision": "amp-bf16",
                    "output_lifetime": "backward",
                },
            ),
        )
    ),
    # Jamba: attention and Mamba layers, MoE and dense MLPs (engine/activations/hybrid.py); the torch scan path (grouped_mm
    # experts run only in bf16 on a CPU: the fp32 case has dense MLPs only)
    *(
        (f"jamba {label}", {"model": {**JAMBA, **more}, "ssm_kernel": "torch", **keys})
        for label, more, keys in (
            ("torch bf16 sdpa b2 s64", {}, {"micro_batch_size": 2, "seq_len": 64}),
            ("torch bf16 eager b2 s64", {}, {"micro_batch_size": 2, "seq_len": 64, "attention": "eager"}),
            (
                "torch fp32 b2 s64 (dense MLPs)",
                {"num_experts": 1},
                {"micro_batch_size": 2, "seq_len": 64, "precision": "fp32"},
            ),
            (
                "torch bf16 b1 s128 (tied, N=8, K=3, R=12, biases, attention on top, MoE at even layers)",
                {
                    "tie_word_embeddings": True,
                    "mamba_d_state": 8,
                    "mamba_d_conv": 3,
                    "mamba_proj_bias": True,
                    "mamba_dt_rank": 12,
                    "attn_layer_offset": 3,
                    "expert_layer_offset": 0,
                },
                {"micro_batch_size": 1, "seq_len": 128},
            ),
            (
                "torch amp-bf16 b2 s64 (dense MLPs)",
                {"num_experts": 1},
                {"micro_batch_size": 2, "seq_len": 64, "precision": "amp-bf16"},
            ),
            ("torch bf16 ckpt b2 s64", {}, {"micro_batch_size": 2, "seq_len": 64, **_CKPT}),
            (
                "torch fp32 ckpt b2 s64 (dense MLPs)",
                {"num_experts": 1},
                {"micro_batch_size": 2, "seq_len": 64, "precision": "fp32", **_CKPT},
            ),
            (
                "torch amp-bf16 ckpt b2 s64 (dense MLPs)",
                {"num_experts": 1},
                {"micro_batch_size": 2, "seq_len": 64, "precision": "amp-bf16", **_CKPT},
            ),
            *(
                (f"torch {label}", more, {"micro_batch_size": 2, "seq_len": 64, **keys})
                for label, more, keys in _JAMBA_LORA
            ),
            (
                "torch V65536 bf16 b2 s64 (the real vocabulary; outputs kept: backward, bf16 logits)",
                {"vocab_size": 65536},
                {"micro_batch_size": 2, "seq_len": 64, "output_lifetime": "backward"},
            ),
            (
                "torch V65536 amp-bf16 b2 s64 (dense MLPs; the real vocabulary; outputs kept: step, bf16 logits)",
                {"vocab_size": 65536, "num_experts": 1},
                {"micro_batch_size": 2, "seq_len": 64, "precision": "amp-bf16", "output_lifetime": "step"},
            ),
        )
    ),
]

# ----- multimodal (families/clip.py, llava.py, llava_next.py, qwen2_vl.py; engine/multimodal/) -----------------------------------------
#: CLIP: 4-layer text tower (77 tokens) and 4-layer ViT-B/16-shaped vision tower at 224px (196 patches + CLS)
CLIP = {
    "model_type": "clip",
    "projection_dim": 64,
    "text_config": {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "vocab_size": 1000,
        "max_position_embeddings": 77,
        "bos_token_id": 998,
        "eos_token_id": 999,
        "pad_token_id": 1,
    },
    "vision_config": {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "image_size": 224,
        "patch_size": 16,
    },
}
#: LLaVA: the same vision tower (feature layer -2, CLS dropped: 196 tokens per image) and the small Llama
LLAVA = {
    "model_type": "llava",
    "image_token_index": 999,
    "text_config": {**LLAMA, "pad_token_id": 0},
    "vision_config": {"model_type": "clip_vision_model", **CLIP["vision_config"]},
}
_LORA_QV = {"method": "lora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}
#: LoRA on q/v of the language model only (a multimodal model's tower and projector excluded, as peft's
#: ``exclude_modules`` does); ``_LORA_QV`` is peft's default, names matched across the whole model
_LORA_QV_LM = {
    "method": "lora",
    "lora": {"rank": 8, "targets": ["q_proj", "v_proj"], "target_scope": "language"},
}
#: Gemma 3 with its SigLIP tower (the same 4-layer tower, no CLS, pooled 14 x 14 -> 7 x 7: 49 tokens per image),
#: the small Gemma 3 text model, trained with token_type_ids (a mask in every layer)
GEMMA3_VLM = {
    "model_type": "gemma3",
    "image_token_index": 999,
    "mm_tokens_per_image": 49,
    "text_config": {**GEMMA3, "eos_token_id": 1, "bos_token_id": 2, "pad_token_id": 0},
    "vision_config": {"model_type": "siglip_vision_model", **CLIP["vision_config"], "vision_use_head": False},
}
#: Qwen2-VL: a 4-layer tower (e 256, 8 heads, quick_gelu MLP 4e) at 224 x 224 px (16 x 16 patches: 256 patches,
#: 64 tokens per image after the 2 x 2 merger) and the small Llama's sizes as the Qwen2 language model (M-RoPE
#: sections for its 32-wide heads)
_QWEN_LM = {
    **{k: v for k, v in LLAMA.items() if k != "model_type"},
    "image_token_id": 990,
    "video_token_id": 991,
    "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
}
QWEN2_VL = {
    "model_type": "qwen2_vl",
    **_QWEN_LM,
    "vision_config": {"depth": 4, "embed_dim": 256, "mlp_ratio": 4, "num_heads": 8, "hidden_size": 256},
    "image_size": 224,
}
#: Qwen2.5-VL: the same sizes with RMSNorm and a SwiGLU MLP (I 1024), window attention (112 px windows: 2 x 2
#: windows of 8 x 8 patches) in blocks 0 and 2, full attention in blocks 1 and 3
QWEN2_5_VL = {
    "model_type": "qwen2_5_vl",
    **_QWEN_LM,
    "vision_config": {
        "depth": 4,
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_heads": 8,
        "out_hidden_size": 256,
        "fullatt_block_indexes": [1, 3],
    },
    "image_size": 224,
}
#: LLaVA-NeXT: the LLaVA case's tower (224 px crops, 196 rows each) and Llama, pinpoints [224, 448], [448, 224],
#: [448, 448]; a 300 x 500 image picks 448 x 448: 4 tiles + the base crop, 196 + 16 x 28 unpadded + 16 newline
#: = 660 tokens
LLAVA_NEXT = {
    **LLAVA,
    "model_type": "llava_next",
    "image_grid_pinpoints": [[224, 448], [448, 224], [448, 448]],
    "image_size": [300, 500],
}
_QWEN_KEYS = (
    ("bf16 sdpa frozen tower", {}),
    ("bf16 sdpa trained tower", {"freeze_vision": False}),
    ("amp-bf16 sdpa frozen tower", {"precision": "amp-bf16"}),
    ("amp-bf16 sdpa trained tower", {"precision": "amp-bf16", "freeze_vision": False}),
    ("bf16 lora qv (LM only)", _LORA_QV_LM),
    (
        "bf16 lora all-linear (LM, tower, merger)",
        {"method": "lora", "lora": {"rank": 8, "targets": ["all-linear"]}},
    ),
    ("bf16 ckpt frozen tower", {"activation_checkpointing": "full"}),
    ("bf16 ckpt trained tower", {"activation_checkpointing": "full", "freeze_vision": False}),
)
MULTIMODAL_CASES: list[tuple[str, dict[str, Any]]] = [
    *(
        (f"clip {label} b8 s77", {"model": CLIP, "micro_batch_size": 8, "seq_len": 77, **keys})
        for label, keys in (
            ("bf16 sdpa", {}),
            ("amp-bf16 sdpa", {"precision": "amp-bf16"}),
            ("bf16 lora qv (both towers)", _LORA_QV),
            ("fp32 eager", {"precision": "fp32", "attention": "eager"}),
            ("bf16 sdpa frozen vision tower", {"freeze_vision": True}),
        )
    ),
    *(
        (f"llava {label} b2 s256+196", {"model": LLAVA, "micro_batch_size": 2, "seq_len": 256, **keys})
        for label, keys in (
            ("bf16 sdpa frozen tower", {}),
            ("bf16 sdpa trained tower", {"freeze_vision": False}),
            ("amp-bf16 sdpa frozen tower", {"precision": "amp-bf16"}),
            ("amp-bf16 sdpa trained tower", {"precision": "amp-bf16", "freeze_vision": False}),
            ("bf16 lora qv (LM only)", _LORA_QV_LM),
            ("bf16 lora qv (LM and tower: peft's name matching)", _LORA_QV),
            ("bf16 ckpt frozen tower", {"activation_checkpointing": "full"}),
            ("bf16 ckpt trained tower", {"activation_checkpointing": "full", "freeze_vision": False}),
        )
    ),
    (
        "llava bf16 sdpa frozen tower b2 s256+196 (output held through backward: the tower's hidden states too)",
        {"model": LLAVA, "micro_batch_size": 2, "seq_len": 256, "output_lifetime": "backward"},
    ),
    (
        "gemma3 bf16 sdpa frozen tower b2 s256+49 (output held through backward)",
        {"model": GEMMA3_VLM, "micro_batch_size": 2, "seq_len": 256, "output_lifetime": "backward"},
    ),
    (
        "llava bf16 sdpa frozen tower b2 s256+2x196 (2 images per sample)",
        {"model": LLAVA, "micro_batch_size": 2, "seq_len": 256, "images_per_sample": 2},
    ),
    *(
        (f"gemma3 {label} b2 s256+49", {"model": GEMMA3_VLM, "micro_batch_size": 2, "seq_len": 256, **keys})
        for label, keys in (
            ("bf16 sdpa frozen tower", {}),
            ("bf16 sdpa trained tower", {"freeze_vision": False}),
            ("amp-bf16 sdpa frozen tower", {"precision": "amp-bf16"}),
            ("bf16 lora qv (LM only)", _LORA_QV_LM),
            ("bf16 lora qv (LM and tower: peft's name matching)", _LORA_QV),
        )
    ),
    (
        "gemma3 bf16 sdpa b2 s256 (no image: token_type_ids still mask every layer)",
        {"model": GEMMA3_VLM, "micro_batch_size": 2, "seq_len": 256, "images_per_sample": 0},
    ),
    *(
        (f"{name} {label} b2 s256+64", {"model": model, "micro_batch_size": 2, "seq_len": 256, **keys})
        for name, model in (("qwen2_vl", QWEN2_VL), ("qwen2_5_vl", QWEN2_5_VL))
        for label, keys in _QWEN_KEYS
    ),
    *(
        (
            f"llava_next {label} b2 s256+660",
            {"model": LLAVA_NEXT, "micro_batch_size": 2, "seq_len": 256, **keys},
        )
        for label, keys in (
            ("bf16 sdpa frozen tower", {}),
            ("bf16 sdpa trained tower", {"freeze_vision": False}),
            ("amp-bf16 sdpa frozen tower", {"precision": "amp-bf16"}),
            ("amp-bf16 sdpa trained tower", {"precision": "amp-bf16", "freeze_vision": False}),
            ("bf16 lora qv (LM only)", _LORA_QV_LM),
            ("bf16 lora qv (LM and tower: peft's name matching)", _LORA_QV),
            ("bf16 ckpt frozen tower", {"activation_checkpointing": "full"}),
            ("bf16 ckpt trained tower", {"activation_checkpointing": "full", "freeze_vision": False}),
        )
    ),
    (
        "llava_next bf16 sdpa frozen tower b1 s256+2x616 (2 images of 600 x 300 px: 3 crops, 616 tokens each)",
        {
            "model": {**LLAVA_NEXT, "image_size": [600, 300]},
            "micro_batch_size": 1,
            "seq_len": 256,
            "images_per_sample": 2,
            "output_lifetime": "backward",
        },
    ),
    (
        "qwen2_vl bf16 sdpa trained tower b2 s256+2x96 (2 images of 224 x 336 px per sample)",
        {
            "model": {**QWEN2_VL, "image_size": [224, 336]},
            "micro_batch_size": 2,
            "seq_len": 256,
            "images_per_sample": 2,
            "freeze_vision": False,
        },
    ),
    (
        "qwen2_vl amp-bf16 sdpa b2 s256 (no image: the merger gets no gradient, no state)",
        {
            "model": QWEN2_VL,
            "micro_batch_size": 2,
            "seq_len": 256,
            "precision": "amp-bf16",
            "images_per_sample": 0,
        },
    ),
    (
        "qwen2_5_vl bf16 sdpa frozen tower b2 s256+64 (output held through backward)",
        {"model": QWEN2_5_VL, "micro_batch_size": 2, "seq_len": 256, "output_lifetime": "backward"},
    ),
    # the presets' real shapes (fake tensors: 10-45 s each)
    (
        "llava-1.5-7b bf16 lora qv b1 s512+576 (real shape, peft's name matching: tower adapters too)",
        {"model": "llava-1.5-7b", "micro_batch_size": 1, "seq_len": 512, **_LORA_QV},
    ),
    (
        "llava-1.5-7b bf16 full b1 s512+576 (real shape, frozen tower)",
        {"model": "llava-1.5-7b", "micro_batch_size": 1, "seq_len": 512},
    ),
    (
        "gemma-3-4b bf16 lora qv b1 s512+256 (real shape, peft's name matching: tower adapters too)",
        {"model": "gemma-3-4b", "micro_batch_size": 1, "seq_len": 512, **_LORA_QV},
    ),
    (
        "qwen2-vl-2b bf16 lora qv b1 s512+256 (real shape, 448 px image)",
        {"model": "qwen2-vl-2b", "micro_batch_size": 1, "seq_len": 512, **_LORA_QV},
    ),
    (
        "qwen2.5-vl-3b bf16 full b1 s512+256 (real shape, frozen tower)",
        {"model": "qwen2.5-vl-3b", "micro_batch_size": 1, "seq_len": 512},
    ),
    (
        "llava-v1.6-mistral-7b bf16 lora qv b1 s512+2928 (real shape, 672 px image: 5 crops; peft's name matching)",
        {"model": "llava-v1.6-mistral-7b", "micro_batch_size": 1, "seq_len": 512, **_LORA_QV},
    ),
    (
        "llava-v1.6-mistral-7b bf16 lora qv b1 s512+2928 (real shape; LM only: target_scope language)",
        {"model": "llava-v1.6-mistral-7b", "micro_batch_size": 1, "seq_len": 512, **_LORA_QV_LM},
    ),
    (
        "clip-vit-base-patch32 bf16 sdpa b64 s77 (real shape)",
        {"model": "clip-vit-base-patch32", "micro_batch_size": 64, "seq_len": 77},
    ),
    (
        "clip-vit-large-patch14 amp-bf16 sdpa b32 s77 (real shape)",
        {"model": "clip-vit-large-patch14", "micro_batch_size": 32, "seq_len": 77, "precision": "amp-bf16"},
    ),
]
CASES += MULTIMODAL_CASES

#: Llama 4 with its vision tower: the small Llama 4 text model, a 2-layer tower (h=128, 4 heads) at 112px in 14px
#: patches (8 x 8 + CLS = 65 rows per tile), shuffled by 0.5 into 16 rows of 512, a 256-wide adapter and projector
#: input: 16 + 3 tokens per image (one tile)
LLAMA4_VLM = {
    "model_type": "llama4",
    "image_token_index": 999,
    "text_config": {**LLAMA4, "pad_token_id": 0},
    "vision_config": {"model_type": "llama4_vision_model", "hidden_size": 128, "intermediate_size": 512,
                      "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 112, "patch_size": 14,
                      "vision_output_dim": 256, "projector_input_dim": 256, "projector_output_dim": 256},
}  # fmt: skip
CASES += [
    (f"llama4 {label} b2 s256+19", {"model": LLAMA4_VLM, "micro_batch_size": 2, "seq_len": 256, **keys})
    for label, keys in (
        ("bf16 sdpa frozen tower", {}),
        ("bf16 sdpa trained tower", {"freeze_vision": False}),
        ("bf16 lora qv (LM only)", _LORA_QV_LM),
        ("bf16 lora qv (LM and tower: peft's name matching)", _LORA_QV),
        ("bf16 sdpa trained tower, 2 images per sample", {"freeze_vision": False, "images_per_sample": 2}),
    )
]
#: One GPU's head and embedding gradients (engine/states/gradients.one_gpu_backward): a short sequence, so that
#: the V x h gradients outweigh the T x V loss buffers and the peak falls where autograd makes them. Tied: the
#: head's part waits in autograd's buffer until the embedding's makes the other, and their sum is out of place
#: (before: -34.0% sgd, -3.3% adamw at one micro-batch; -17.7% and -11.5% at three). Untied, three micro-batches:
#: lm_head's new gradient beside the logits' gradient and the accumulated .grad (trace peak: its mm; before: -5.6%
#: bf16, -5.7% checkpointed, -11.2% fp32)
_V32K_B1 = {"model": LLAMA_H512_V32K, "micro_batch_size": 1}
_TIED_V32K = {**LLAMA_H512_V32K, "tie_word_embeddings": True}
ONE_GPU_GRAD_CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama h512 V32k tied sgd b1 s128", {**_V32K_B1, "model": _TIED_V32K, "seq_len": 128, "optimizer": "sgd"}),
    ("llama h512 V32k tied b1 s128", {**_V32K_B1, "model": _TIED_V32K, "seq_len": 128}),
    ("llama h512 V32k tied b1 s128 accum 3", {**_V32K_B1, "model": _TIED_V32K, "seq_len": 128, "grad_accum_steps": 3}),
    (
        "llama h512 V32k tied sgd b1 s128 accum 3",
        {**_V32K_B1, "model": _TIED_V32K, "seq_len": 128, "grad_accum_steps": 3, "optimizer": "sgd"},
    ),
    ("llama h512 V32k sgd b1 s64 accum 3", {**_V32K_B1, "seq_len": 64, "grad_accum_steps": 3, "optimizer": "sgd"}),
    (
        "llama h512 V32k sgd ckpt b1 s64 accum 3",
        {**_V32K_B1, "seq_len": 64, "grad_accum_steps": 3, "optimizer": "sgd", "activation_checkpointing": "full"},
    ),
    (
        "llama h512 V32k fp32 sgd b1 s64 accum 3",
        {**_V32K_B1, "seq_len": 64, "grad_accum_steps": 3, "optimizer": "sgd", "precision": "fp32"},
    ),
]  # fmt: skip
CASES += ONE_GPU_GRAD_CASES
CASES += [  # the Scout preset's real shape (fake tensors: ~15 s each)
    (
        "llama-4-scout-17b-16e bf16 lora qv b1 s512+147 (real shape, peft's name matching: tower adapters too)",
        {"model": "llama-4-scout-17b-16e", "micro_batch_size": 1, "seq_len": 512, **_LORA_QV},
    ),
    (
        "llama-4-scout-17b-16e bf16 full b1 s512+147 (real shape, trained tower)",
        {"model": "llama-4-scout-17b-16e", "micro_batch_size": 1, "seq_len": 512, "freeze_vision": False},
    ),
]


#: Preference and RL training steps (``trace/objectives.py``: TRL's loop on fake tensors). A 32k vocabulary makes
#: the loss's logits terms matter beside the layers' activations.
LLAMA_V32K = {**LLAMA, "vocab_size": 32000}
LORA_QV = {"method": "lora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}
OBJECTIVE_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "dpo llama V32k bf16 ref gpu b1 s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 1,
            "seq_len": 512,
            "objective": "dpo",
            "rl": {"reference": "gpu"},
        },
    ),
    (
        "dpo llama V32k bf16 ref precomputed b2 s256",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 256,
            "objective": "dpo",
            "rl": {"reference": "precomputed"},
        },
    ),
    (
        "dpo llama bf16 ref gpu b2 s512 (V1000: layers dominate)",
        {
            "model": LLAMA,
            "micro_batch_size": 2,
            "seq_len": 512,
            "objective": "dpo",
            "rl": {"reference": "gpu"},
        },
    ),
    (
        "dpo llama V32k bf16 lora qv ref shared_base b2 s256",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 256,
            "objective": "dpo",
            "rl": {"reference": "shared_base"},
            **LORA_QV,
        },
    ),
    (
        "dpo llama V32k bf16 ref gpu ckpt b1 s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 1,
            "seq_len": 512,
            "objective": "dpo",
            "activation_checkpointing": "full",
            "rl": {"reference": "gpu"},
        },
    ),
    (
        "orpo llama V32k bf16 b1 s512",
        {"model": LLAMA_V32K, "micro_batch_size": 1, "seq_len": 512, "objective": "orpo"},
    ),
    (
        "kto llama V32k bf16 ref gpu b1 s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 1,
            "seq_len": 512,
            "objective": "kto",
            "rl": {"reference": "gpu"},
        },
    ),
    (
        "kto llama V32k bf16 ref gpu b2 s256",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 256,
            "objective": "kto",
            "rl": {"reference": "gpu"},
        },
    ),
    (
        "kto llama V32k bf16 ref precomputed b2 s256",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 256,
            "objective": "kto",
            "rl": {"reference": "precomputed"},
        },
    ),
    (
        "kto llama V32k bf16 lora qv ref shared_base b2 s256",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 256,
            "objective": "kto",
            "rl": {"reference": "shared_base"},
            **LORA_QV,
        },
    ),
    (
        "kto llama bf16 ref gpu b4 s512 (V1000: the reference's layers peak)",
        {
            "model": LLAMA,
            "micro_batch_size": 4,
            "seq_len": 512,
            "objective": "kto",
            "rl": {"reference": "gpu"},
        },
    ),
    (
        "kto llama V32k bf16 ref gpu ckpt b2 s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 512,
            "objective": "kto",
            "activation_checkpointing": "full",
            "rl": {"reference": "gpu"},
        },
    ),
    (
        "grpo llama V32k bf16 G4 C256 b1 s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 1,
            "seq_len": 512,
            "objective": "grpo",
            "rl": {"num_generations": 4, "completion_len": 256},
        },
    ),
    (
        "grpo llama V32k bf16 G8 C192 beta>0 (ref log-probs in the batch) b1 s256",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 1,
            "seq_len": 256,
            "objective": "grpo",
            "rl": {"num_generations": 8, "completion_len": 192, "reference": "precomputed"},
        },
    ),
    (
        "grpo llama V32k bf16 lora qv G8 C128 b1 s256",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 1,
            "seq_len": 256,
            "objective": "grpo",
            "rl": {"num_generations": 8, "completion_len": 128},
            **LORA_QV,
        },
    ),
    (
        "grpo llama V32k bf16 G8 C256, 4 completions per micro-batch, s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 1,
            "seq_len": 512,
            "objective": "grpo",
            "rl": {"num_generations": 8, "completion_len": 256, "completions_per_micro_batch": 4},
        },
    ),
    (
        "ppo llama V32k bf16 C256 b2 s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 512,
            "objective": "ppo",
            "rl": {"completion_len": 256},
        },
    ),
    (
        "ppo llama bf16 C256 b4 s512 (V1000: layers dominate)",
        {
            "model": LLAMA,
            "micro_batch_size": 4,
            "seq_len": 512,
            "objective": "ppo",
            "rl": {"completion_len": 256},
        },
    ),
    (
        "ppo llama V32k bf16 lora qv (full value model) C256 b2 s512",
        {
            "model": LLAMA_V32K,
            "micro_batch_size": 2,
            "seq_len": 512,
            "objective": "ppo",
            "rl": {"completion_len": 256},
            **LORA_QV,
        },
    ),
    (
        "grpo qwen2.5-0.5b bf16 G4 C256 b1 s512 (real shape)",
        {
            "model": "qwen2.5-0.5b",
            "micro_batch_size": 1,
            "seq_len": 512,
            "objective": "grpo",
            "rl": {"num_generations": 4, "completion_len": 256},
        },
    ),
]
CASES += OBJECTIVE_CASES


_LORA_QV_COMPILED = {"method": "lora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"]}}
#: Compiled steps (``compile: true``; trace/compiled.py): the engine's traced rule for the Llama-layout decoders
#: (engine/activations/compiled.py), its untraced formula elsewhere (eager's layers, the compiled loss; said in
#: its caveats).
COMPILED_CASES: list[tuple[str, dict[str, Any]]] = (
    [
        (f"{name} compiled", {**dict(CASES)[name], "compile": True})
        for name in (
            "llama bf16 sdpa b2 s512",
            "mistral bf16 sdpa b2 s512",
            "llama V64 bf16 b4 s512",
            "llama amp-bf16 sdpa b2 s512",
            "qwen2 bf16 sdpa b2 s512",
            "gpt2 bf16 sdpa b2 s512",
            "vit bf16 sdpa b8 (no dropout)",
            "gemma bf16 sdpa b2 s512",
            "qwen3 bf16 sdpa b2 s512",
            "olmo2 bf16 sdpa b2 s512",
            "phi bf16 sdpa b2 s512",
            "gemma2 bf16 eager b2 s512",
            "bert bf16 sdpa b4 s256 (no dropout)",
            "vit amp-bf16 sdpa b8 (no dropout)",
            "qwen3 amp-bf16 sdpa b2 s512",
            "qwen3 bf16 lora qv b2 s512",
            "gemma bf16 lora qv b2 s512",
            "gemma amp-bf16 sdpa b2 s512",
            "olmo2 amp-bf16 sdpa b2 s512",
            "olmo2 bf16 lora qv b2 s512",
            "gemma3_text bf16 sdpa b2 s512",
            "gemma3_text bf16 lora qv b2 s512",
            "phi V64 bf16 sdpa b2 s512",
        )
    ]
    + [
        (f"{name} compiled", {**dict(CASES)[base], "precision": "amp-bf16", "compile": True})
        for name, base in (
            ("qwen2 amp-bf16 sdpa b2 s512", "qwen2 bf16 sdpa b2 s512"),
            ("llama V64 amp-bf16 b4 s512", "llama V64 bf16 b4 s512"),
        )
    ]
    + [  # HF's full checkpointing compiled (Dynamo's checkpoint higher-order op)
        (f"{name} compiled", {**dict(CASES)[name], "compile": True})
        for name in ("llama bf16 ckpt b2 s512", "llama V64 bf16 ckpt b4 s512")
    ]
    + [  # below torch's default activation_memory_budget: the engine keeps the default's figure (an upper bound)
        (
            f"{name} compiled budget {b:g}",
            {**dict(CASES)[name], "compile": True, "activation_memory_budget": b},
        )
        for name in ("llama bf16 sdpa b2 s512", "qwen3 bf16 sdpa b2 s512")
        for b in (0.5, 0.2, 0.0)
    ]
    + [
        (f"{name} compiled", {**dict(CASES)[base], **_LORA_QV_COMPILED, "compile": True})
        for name, base in (
            ("llama bf16 lora qv b2 s512", "llama bf16 sdpa b2 s512"),
            ("qwen2 bf16 lora qv b2 s512", "qwen2 bf16 sdpa b2 s512"),
            ("llama V64 bf16 lora qv b4 s512 (peak in a layer's backward)", "llama V64 bf16 b4 s512"),
        )
    ]
)

#: GPT-2, BERT and RoBERTa compiled (engine/activations/compiled_layernorm.py) under autocast, with hidden dropout
#: (GPT-2's resid_pdrop and embd_pdrop, BERT's hidden_dropout_prob as the presets default; attention dropout off:
#: on a CPU SDPA takes the math kernel for it, on CUDA the fused kernel applies it inside) and with HF's full
#: checkpointing; small shapes, and the real dimensions and vocabularies of gpt2, bert-base-uncased and roberta-base
#: (two of their twelve layers) at a realistic length.
_GPT2_HDROP = {**GPT2, "resid_pdrop": 0.1, "embd_pdrop": 0.1}
_BERT_HDROP = {**BERT, "hidden_dropout_prob": 0.1}
_GPT2_L2 = {**PRESETS["gpt2"], "n_layer": 2, "attn_pdrop": 0.0}
_BERT_BASE_L2 = {**PRESETS["bert-base-uncased"], "num_hidden_layers": 2, "attention_probs_dropout_prob": 0.0}
_ROBERTA_BASE_L2 = {**PRESETS["roberta-base"], "num_hidden_layers": 2, "attention_probs_dropout_prob": 0.0}
_G2 = {"micro_batch_size": 2, "seq_len": 512, "compile": True}
_B4 = {"micro_batch_size": 4, "seq_len": 256, "compile": True}
COMPILED_CASES += [
    ("gpt2 amp-bf16 sdpa b2 s512 compiled", {"model": GPT2, **_G2, "precision": "amp-bf16"}),
    ("gpt2 amp-fp16 sdpa b2 s512 compiled", {"model": GPT2, **_G2, "precision": "amp-fp16"}),
    ("gpt2 bf16 hidden dropout b2 s512 compiled", {"model": _GPT2_HDROP, **_G2}),
    ("gpt2 amp-bf16 hidden dropout b2 s512 compiled", {"model": _GPT2_HDROP, **_G2, "precision": "amp-bf16"}),
    ("gpt2 bf16 ckpt b2 s512 compiled", {"model": GPT2, **_G2, "activation_checkpointing": "full"}),
    ("bert amp-bf16 sdpa b4 s256 compiled", {"model": BERT, **_B4, "precision": "amp-bf16"}),
    ("bert amp-fp16 sdpa b4 s256 compiled", {"model": BERT, **_B4, "precision": "amp-fp16"}),
    ("bert bf16 hidden dropout b4 s256 compiled", {"model": _BERT_HDROP, **_B4}),
    ("bert amp-bf16 hidden dropout b4 s256 compiled", {"model": _BERT_HDROP, **_B4, "precision": "amp-bf16"}),
    ("roberta amp-bf16 sdpa b4 s256 (no dropout) compiled", {"model": ROBERTA, **_B4, "precision": "amp-bf16"}),
    ("bert bf16 ckpt b4 s256 compiled", {"model": BERT, **_B4, "activation_checkpointing": "full"}),
    (
        "gpt2 dims L2 V50257 amp-bf16 hidden dropout b4 s1024 compiled",
        {"model": _GPT2_L2, "micro_batch_size": 4, "seq_len": 1024, "precision": "amp-bf16", "compile": True},
    ),
    (
        "bert-base dims L2 V30522 amp-bf16 hidden dropout b8 s512 compiled",
        {"model": _BERT_BASE_L2, "micro_batch_size": 8, "seq_len": 512, "precision": "amp-bf16", "compile": True},
    ),
    (
        "roberta-base dims L2 V50265 bf16 hidden dropout b8 s512 compiled",
        {"model": _ROBERTA_BASE_L2, "micro_batch_size": 8, "seq_len": 512, "compile": True},
    ),
    (
        "gpt2 dims L2 V50257 bf16 hidden dropout ckpt b4 s1024 compiled",
        {"model": _GPT2_L2, "micro_batch_size": 4, "seq_len": 1024, "activation_checkpointing": "full",
         "compile": True},
    ),
]  # fmt: skip

#: ModernBERT compiled (engine/activations/compiled_modernbert.py): local layers masked (s 512 > the half window),
#: unmasked (s 48 within it), and modernbert-base's real dimensions and vocabulary.
COMPILED_CASES += [
    (f"{name} compiled", {**dict(CASES)[name], "compile": True})
    for name in (
        "modernbert bf16 sdpa b2 s512",
        "modernbert bf16 sdpa b16 s48 (within the half window: no mask)",
        "modernbert-base bf16 sdpa b2 s1024 (real shape)",
    )
]


#: litgpt's own step (``framework: "litgpt"``; trace/litgpt.py runs litgpt 0.5.13's GPT, LoRA and chunked loss):
#: the small Llama and Llama 3.2 1B's dimensions (real vocabulary, two layers; its tied head is a separate tensor in
#: litgpt, engine/frameworks.head_copy).
_LITGPT_LORA = {
    "method": "lora",
    "lora": {"rank": 8, "targets": ["q_proj", "v_proj"], "adapter_dtype": "bf16"},
}
_L32_1B_L2 = {  # meta-llama/Llama-3.2-1B's config.json dimensions, 2 of its 16 layers
    "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 2,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
}  # fmt: skip
LITGPT_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "litgpt llama bf16 b2 s512",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "framework": "litgpt"},
    ),
    (
        "litgpt llama bf16 lora qv b2 s512",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "framework": "litgpt", **_LITGPT_LORA},
    ),
    (
        "litgpt llama-3.2-1b dims L2 bf16 b2 s512",
        {"model": _L32_1B_L2, "micro_batch_size": 2, "seq_len": 512, "framework": "litgpt"},
    ),
    (
        "litgpt llama-3.2-1b dims L2 bf16 lora qv b2 s1024",
        {"model": _L32_1B_L2, "micro_batch_size": 2, "seq_len": 1024, "framework": "litgpt", **_LITGPT_LORA},
    ),
]
#: amp-bf16 (Fabric's bf16-mixed, the finetune scripts' default on a bf16 GPU): fp32 model and adapters.
_LITGPT_LORA_FP32 = {**_LITGPT_LORA, "lora": {**_LITGPT_LORA["lora"], "adapter_dtype": "fp32"}}
LITGPT_CASES += [
    (
        "litgpt llama amp-bf16 b2 s512",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "framework": "litgpt", "precision": "amp-bf16"},
    ),
    (
        "litgpt llama amp-bf16 lora qv b2 s512",
        {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "framework": "litgpt", "precision": "amp-bf16",
         **_LITGPT_LORA_FP32},
    ),
    (
        "litgpt llama-3.2-1b dims L2 amp-bf16 lora qv b2 s1024 (frozen head recast per chunk)",
        {"model": _L32_1B_L2, "micro_batch_size": 2, "seq_len": 1024, "framework": "litgpt",
         "precision": "amp-bf16", **_LITGPT_LORA_FP32},
    ),
]  # fmt: skip

#: torchao's float8 training (``fp8_recipe`` tensorwise / rowwise; trace/float8.py swaps every Linear but the head
#: for ``Float8Linear``), bf16 weights, on the small Llama and on two families' real dimensions (real vocabularies,
#: two layers): Llama 3.2 1B and Qwen2.5 0.5B (Qwen/Qwen2.5-0.5B's config.json; q/k/v biases, tied head).
_QWEN25_05B_L2 = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 2,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": True, "max_position_embeddings": 32768,
}  # fmt: skip
FP8_CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama bf16 float8 tensorwise b2 s512",
     {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "fp8_recipe": "tensorwise"}),
    ("llama bf16 float8 rowwise b2 s512",
     {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "fp8_recipe": "rowwise"}),
    ("llama-3.2-1b dims L2 bf16 float8 tensorwise b2 s1024",
     {"model": _L32_1B_L2, "micro_batch_size": 2, "seq_len": 1024, "fp8_recipe": "tensorwise"}),
    ("qwen2.5-0.5b dims L2 bf16 float8 rowwise b2 s1024",
     {"model": _QWEN25_05B_L2, "micro_batch_size": 2, "seq_len": 1024, "fp8_recipe": "rowwise"}),
]  # fmt: skip


#: torchtune's activation offloading and optimizer in backward on the HF step (trace/torchtune_memory.py, its
#: ``OffloadActivations`` and ``register_optim_in_bwd_hooks`` reproduced): the small Llama, and eight layers with a
#: 32k vocabulary (the loss peak, as on a real model). Not in ``CASES``: the engine's one resident layer is an upper
#: bound at the loss (traced: none), so these hold it from above (tests/trace/test_trace_torchtune.py).
_LLAMA_L8_V32K = {**LLAMA, "num_hidden_layers": 8, "vocab_size": 32000}
TORCHTUNE_CASES: list[tuple[str, dict[str, Any]]] = [
    (
        "llama bf16 ckpt offload b2 s512",
        {**dict(CASES)["llama bf16 ckpt b2 s512"], "activation_offloading": True},
    ),
    ("llama bf16 opt-in-bwd b2 s512", {**dict(CASES)["llama bf16 sdpa b2 s512"], "optimizer_in_backward": True}),
    (
        "llama bf16 ckpt offload opt-in-bwd b2 s512",
        {**dict(CASES)["llama bf16 ckpt b2 s512"], "activation_offloading": True, "optimizer_in_backward": True},
    ),
    (
        "llama L8 V32k bf16 ckpt offload b2 s512",
        {"model": _LLAMA_L8_V32K, "micro_batch_size": 2, "seq_len": 512, "activation_checkpointing": "full",
         "activation_offloading": True},
    ),
    (
        "llama L8 V32k bf16 offload b2 s512",
        {"model": _LLAMA_L8_V32K, "micro_batch_size": 2, "seq_len": 512, "activation_offloading": True},
    ),
]  # fmt: skip
#: ... with bitsandbytes' optimizers (trace/bnb_states.py: their states; paged buffers outside the allocator), as
#: torchtune's low-memory recipes run them.
_L8_CKPT = {
    "model": _LLAMA_L8_V32K,
    "micro_batch_size": 2,
    "seq_len": 512,
    "activation_checkpointing": "full",
}
TORCHTUNE_CASES += [
    (
        f"llama L8 V32k bf16 ckpt {opt}{' opt-in-bwd' if in_bwd else ''}{' offload' if off else ''} b2 s512",
        {**_L8_CKPT, "optimizer": opt, "optimizer_impl": "fused", "optimizer_in_backward": in_bwd,
         "activation_offloading": off},
    )
    for opt, in_bwd, off in (
        ("adamw-8bit", False, False),
        ("adamw-8bit", True, True),
        ("paged-adamw-8bit", False, False),
        ("paged-adamw-8bit", True, True),
        ("paged-adamw", True, False),
        ("paged-adamw", True, True),
    )
]  # fmt: skip


def compare(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Run engine and tracer on one scenario."""
    from memsim_widget.trace.api import trace_config

    sc = Scenario.from_dict(data)
    est = estimate(sc)
    t0 = time.perf_counter()
    tr = trace_config(sc)
    secs = time.perf_counter() - t0
    err = (est.peak_tensor_bytes - tr.peak_bytes) / tr.peak_bytes
    moment = max(est.worst.moments, key=lambda m: m.tensor_bytes).name
    return {
        "name": name,
        "engine": est.peak_tensor_bytes,
        "trace": tr.peak_bytes,
        "error": err,
        "engine_moment": moment,
        "trace_phase": tr.peak_phase,
        "trace_op": tr.peak_op,
        "seconds": secs,
        "by_role": tr.by_role,
        "phase_peaks": tr.phase_peaks,
    }
