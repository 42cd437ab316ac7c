"""torchtitan's tensor-parallel plan (``apply_tp``: vocab-sharded embedding, sequence parallel, loss parallel) on
one rank: the cases the engine's allocation stream is held to (tests/engine/test_tp_stream.py, slow) and
``benchmarks/allocator_replay_tp.py`` prints, written once. Each is the keys over ``stream_vs_trace.BASE`` (two
sequences of 512 tokens in bf16): torchtitan's loop (loss outside the model) and its launcher's
``expandable_segments:True``, but the last (HF Trainer's loop with torchtitan's plan, PyTorch's defaults).
torchtitan always runs sequence parallel with TP (``apply_tp``); the rows without it hold the plan's other
layouts too.
"""

from __future__ import annotations

from typing import Any

from fidelity_cases import LLAMA_H512_V32K

TITAN: dict[str, Any] = {"framework": "torchtitan", "model": LLAMA_H512_V32K}
V128K = {**LLAMA_H512_V32K, "vocab_size": 128256}  # Llama 3's vocabulary, untied, at the small width
ONE_B = {"model": "llama-3.2-1b", "seq_len": 1024}  # Llama 3's vocabulary, tied, at its width
SP = {"sequence_parallel": True}
FSDP = {"dp": 2, "zero": 3}
AMP = {"precision": "amp-bf16"}  # torchtitan's recipe: FSDP2 MixedPrecisionPolicy(param_dtype=bf16)

_CASES: list[tuple[str, dict[str, Any]]] = [
    ("tp2 sp", {"parallel": {"tp": 2, **SP}}),
    ("tp4 sp", {"parallel": {"tp": 4, **SP}}),
    ("tp2", {"parallel": {"tp": 2}}),
    ("tp2 sp no loss parallel", {"parallel": {"tp": 2, **SP, "loss_parallel": False}}),
    ("tp2 sp b1", {"parallel": {"tp": 2, **SP}, "micro_batch_size": 1}),
    ("tp2 sp ckpt", {"parallel": {"tp": 2, **SP}, "activation_checkpointing": "full"}),
    ("dp2 x tp2 sp", {"parallel": {"tp": 2, **SP, **FSDP}}),
    ("dp2 x tp2 sp amp", {"parallel": {"tp": 2, **SP, **FSDP}, **AMP}),
    ("dp4 x tp2 sp", {"parallel": {"tp": 2, **SP, **FSDP, "dp": 4}}),
    ("dp2 x tp4 sp", {"parallel": {"tp": 4, **SP, **FSDP}}),
    ("V128k tp2 sp", {"parallel": {"tp": 2, **SP}, "model": V128K}),
    ("V128k tp4 sp", {"parallel": {"tp": 4, **SP}, "model": V128K}),
    ("V128k tp2 sp no loss parallel", {"parallel": {"tp": 2, **SP, "loss_parallel": False}, "model": V128K}),
    ("V128k dp2 x tp2 sp amp", {"parallel": {"tp": 2, **SP, **FSDP}, "model": V128K, **AMP}),
    ("llama-3.2-1b tp2 sp 2 x 1024", {**ONE_B, "parallel": {"tp": 2, **SP}}),
    ("llama-3.2-1b tp4 sp 2 x 1024", {**ONE_B, "parallel": {"tp": 4, **SP}}),
    (
        "llama-3.2-1b tp2 sp 1 x 2048",
        {**ONE_B, "parallel": {"tp": 2, **SP}, "micro_batch_size": 1, "seq_len": 2048},
    ),
    ("llama-3.2-1b dp2 x tp2 sp amp 2 x 1024", {**ONE_B, "parallel": {"tp": 2, **SP, **FSDP}, **AMP}),
    (
        "HF loop, torchtitan plan tp2 sp",
        {"parallel": {"tp": 2, **SP, "tp_plan": "torchtitan"}, "framework": "hf"},
    ),
]
#: (name, keys over ``stream_vs_trace.BASE``)
TORCHTITAN_TP_CASES: list[tuple[str, dict[str, Any]]] = [(name, {**TITAN, **keys}) for name, keys in _CASES]
