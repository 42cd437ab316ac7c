"""Hold the engine to a fake-tensor trace: the same HF training step simulated and traced.

The case matrix lives here so the benchmark (``benchmarks/fidelity_trace.py``, all cases) and the
tests (a fast subset) share it. Tracing needs the ``[trace]`` extra (torch, transformers, peft).
"""

from __future__ import annotations

import time
from typing import Any

from memsim_widget.catalog.models import resolve_model_config
from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario
from memsim_widget.trace.api import trace_kwargs

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
MISTRAL = {"model_type": "mistral", **SMALL, "sliding_window": None}
QWEN2 = {"model_type": "qwen2", **SMALL, "tie_word_embeddings": True}
MIXTRAL = {"model_type": "mixtral", **SMALL, "num_local_experts": 4, "num_experts_per_tok": 2}
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

#: (name, scenario dict) pairs; the fast subset runs in the tests.
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
        for label, keys in (
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
    ),
    # OLMo 2: post-norms only, q/k RMSNorm over the whole projection, weights multiplied in fp32
    *(
        (f"olmo2 {label}", {"model": {"model_type": "olmo2", **SMALL, "eos_token_id": 2}, **keys})
        for label, keys in (
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
        for label, keys in (
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
        for label, keys in (
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
    ),
]


def compare(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Run engine and tracer on one scenario."""
    from memsim_widget.trace.hf import trace_hf

    sc = Scenario.from_dict(data)
    est = estimate(sc)
    cfg = resolve_model_config(sc.model)
    t0 = time.perf_counter()
    tr = trace_hf(dict(cfg), **trace_kwargs(sc))
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
