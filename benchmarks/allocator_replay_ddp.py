"""DDP ranks (HF Trainer: zero 0, dp > 1) under ``reserved_model: replay`` (``engine/counters/ddp_stream.py``)
beside the fitted rule and the one-GPU replay of the same shape, and what a new shape costs; with ``--zero``,
DeepSpeed ZeRO-1 and ZeRO-2 ranks (``engine/counters/zero_stream.py``, mixed-bf16, DeepSpeed's defaults) the
same way.

    python benchmarks/allocator_replay_ddp.py
    python benchmarks/allocator_replay_ddp.py --zero
    python benchmarks/allocator_replay_ddp.py --qlora

Per scenario: peak allocated, reserved by the replay and by the fitted rule (``engine/counters/overhead.py``),
the one-GPU replay, and the milliseconds of a new shape through ``estimate`` (CPU time of the process, the
fastest of 3, every cache cleared), for the DDP rank and for one GPU. No GPU row measures DDP yet: these are
predictions, the bucket layout and what DDP adds held to real DDP on the CPU (benchmarks/ddp_trace.py).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from memsim_widget.engine.core import estimate
from memsim_widget.units import GiB

CASES: list[dict[str, Any]] = [
    {"model": "qwen2.5-0.5b", "precision": "amp-bf16", "micro_batch_size": 4, "seq_len": 1024},
    {"model": "llama-3.2-1b", "precision": "amp-bf16", "micro_batch_size": 4, "seq_len": 1024},
    {"model": "llama-3.2-1b", "precision": "bf16", "micro_batch_size": 4, "seq_len": 1024},
    {
        "model": "llama-3.2-1b",
        "precision": "bf16",
        "micro_batch_size": 4,
        "seq_len": 1024,
        "grad_accum_steps": 4,
    },
    {"model": "llama-3.2-3b", "precision": "bf16", "micro_batch_size": 2, "seq_len": 2048},
    {
        "model": "llama-3.1-8b",
        "precision": "bf16",
        "micro_batch_size": 1,
        "seq_len": 2048,
        "gpu": "h200-sxm-141gb",
    },
]


def cold(sc: dict[str, Any]) -> tuple[Any, float]:
    """``estimate(sc)`` as a new shape (its parts cached, not its replay nor the result): the estimate and its
    CPU milliseconds, the fastest of 3."""
    from memsim_widget.engine.core import _estimate
    from memsim_widget.engine.counters import alloc_stream

    best = float("inf")
    est = estimate(sc)
    for _ in range(3):
        _estimate.cache_clear()
        alloc_stream.cache_clear()
        t = time.process_time()
        est = estimate(sc)
        best = min(best, time.process_time() - t)
    return est, best * 1e3


#: DeepSpeed ZeRO-1/2 ranks (HF Trainer's DeepSpeed integration), dp 8 on an H100 unless named
ZERO_CASES: list[dict[str, Any]] = [
    {"model": "qwen2.5-0.5b", "micro_batch_size": 4, "seq_len": 1024},
    {"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 1024},
    {"model": "llama-3.2-3b", "micro_batch_size": 2, "seq_len": 2048},
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 2048, "gpu": "h200-sxm-141gb"},
]


def main_zero() -> None:
    """Print one row per ZeRO case, stage and checkpointing setting: allocated, reserved by the replay and by the
    fitted rule (what ``reserved`` was for these ranks before the stream modelled them), the new shape's cost."""
    print("| scenario | zero | ckpt | allocated | replay | fitted | new shape |")
    print("|---|---|---|---:|---:|---:|---:|")
    for case in ZERO_CASES:
        for zero in (1, 2):
            for ckpt in ("none", "full"):
                sc = {
                    "framework": "deepspeed", "precision": "mixed-bf16", "reserved_model": "replay",
                    "activation_checkpointing": ckpt, "parallel": {"dp": 8, "zero": zero}, **case,
                }  # fmt: skip
                est, ms = cold(sc)
                fit = estimate({**sc, "reserved_model": "fitted"}).ranks[0]
                r = est.ranks[0]
                assert "ZeRO-1/2" in r.reserved.formula, r.reserved.formula
                name = f"{case['model']} {case['micro_batch_size']}x{case['seq_len']}"
                print(
                    f"| {name} | {zero} | {ckpt} | {r.peak_allocated_bytes / GiB:.2f} | "
                    f"{r.peak_reserved_bytes / GiB:.2f} | {fit.peak_reserved_bytes / GiB:.2f} "
                    f"({fit.peak_reserved_bytes / r.peak_reserved_bytes - 1:+.1%}) | {ms:.0f} ms |",
                    flush=True,
                )


#: QLoRA DDP ranks (HF Trainer over bitsandbytes NF4, LoRA r16 on every Linear, bf16), dp 4 on an H100:
#: (model, micro-batch, length, activation checkpointing)
QLORA_CASES: list[tuple[str, int, int, str]] = [
    ("llama-3.2-1b", 4, 1024, "none"),
    ("llama-3.2-1b", 4, 1024, "full"),
    ("llama-3.1-8b", 1, 2048, "none"),
    ("llama-3.1-8b", 2, 2048, "full"),
    ("qwen2.5-7b", 1, 4096, "full"),
]


def main_qlora() -> None:
    """Print one row per QLoRA DDP case: allocated, reserved by the replay and by the fitted rule (what it was
    before the stream took QLoRA DDP ranks), the same shape's one-GPU replay."""
    print("| scenario | ckpt | allocated | replay | fitted | one GPU, replay |")
    print("|---|---|---:|---:|---:|---:|")
    for model, b, length, ckpt in QLORA_CASES:
        sc = {
            "model": model, "method": "qlora", "precision": "bf16", "micro_batch_size": b, "seq_len": length,
            "activation_checkpointing": ckpt, "lora": {"rank": 16, "targets": ["all-linear"]},
            "gpu": "h100-sxm-80gb", "parallel": {"dp": 4}, "reserved_model": "replay",
        }  # fmt: skip
        r = estimate(sc).ranks[0]
        fit = estimate({**sc, "reserved_model": "fitted"}).ranks[0].peak_reserved_bytes
        one = estimate({**sc, "parallel": {"dp": 1}}).ranks[0].peak_reserved_bytes
        assert "DDP's wrap-time broadcast" in r.reserved.formula, r.reserved.formula
        print(
            f"| {model} QLoRA {b} x {length} dp4 | {ckpt} | {r.peak_allocated_bytes / GiB:.2f} | "
            f"{r.peak_reserved_bytes / GiB:.2f} | {fit / GiB:.2f} ({fit / r.peak_reserved_bytes - 1:+.1%}) | "
            f"{one / GiB:.2f} |",
            flush=True,
        )


def main() -> None:
    """Print one row per case and checkpointing setting (``--zero``: the ZeRO-1/2 cases; ``--qlora``: QLoRA)."""
    if "--zero" in sys.argv:
        main_zero()
        return
    if "--qlora" in sys.argv:
        main_qlora()
        return
    print("| scenario | ckpt | allocated | replay | fitted | one GPU replay | new shape: DDP, one GPU |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for case in CASES:
        for ckpt in ("none", "full"):
            sc = {"reserved_model": "replay", "activation_checkpointing": ckpt, "parallel": {"dp": 8}, **case}
            est, ms = cold(sc)
            one, ms1 = cold({**sc, "parallel": {"dp": 1}})
            fit = estimate({**sc, "reserved_model": "fitted"}).ranks[0]
            r = est.ranks[0]
            assert "DDP" in r.reserved.formula, r.reserved.formula
            name = f"{case['model']} {case['precision']} {case['micro_batch_size']}x{case['seq_len']}" + (
                f" accum {case['grad_accum_steps']}" if "grad_accum_steps" in case else ""
            )
            print(
                f"| {name} | {ckpt} | {r.peak_allocated_bytes / GiB:.2f} | {r.peak_reserved_bytes / GiB:.2f} | "
                f"{fit.peak_reserved_bytes / GiB:.2f} ({fit.peak_reserved_bytes / r.peak_reserved_bytes - 1:+.1%}) | "
                f"{one.ranks[0].peak_reserved_bytes / GiB:.2f} | {ms:.0f} ms, {ms1:.0f} ms |",
                flush=True,
            )


if __name__ == "__main__":
    main()
