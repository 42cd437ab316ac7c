"""DeepSpeed ZeRO-3 ranks (``framework: deepspeed``, ``parallel.zero`` 3, HF Trainer's DeepSpeed integration,
``mixed-bf16``, DeepSpeed's stage-3 defaults) under ``reserved_model: replay`` (``engine/counters/zero3_stream.py``)
beside the fitted rule (what ``reserved`` was for these ranks before the stream modelled them), and what a new
shape costs.

    python benchmarks/allocator_replay_zero3.py

Per scenario: peak allocated, reserved by the replay and by the fitted rule (``engine/counters/overhead.py``), and
the milliseconds of a new shape through ``estimate`` (CPU time of the process, the fastest of 3, every cache
cleared). No GPU row measures a ZeRO-3 rank under DeepSpeed: these are predictions, the stream held to the real
optimizer run on the CPU (``benchmarks/zero_trace.py --stage 3``).
"""

from __future__ import annotations

from typing import Any

from allocator_replay_ddp import cold  # the same cold-estimate timing

from memsim_widget.engine.core import estimate
from memsim_widget.units import GiB

#: dp 8 on an H100 unless named; the last three: full activation checkpointing, tied embeddings (Llama 3.2's,
#: Qwen 2.5's small models), both
CASES: list[dict[str, Any]] = [
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 2048},
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 4096},
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 2048, "grad_accum_steps": 4},
    {"model": "qwen2.5-7b", "micro_batch_size": 1, "seq_len": 4096},
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 2048, "gpu": "h200-sxm-141gb", "dp": 2},
    {"model": "llama-3.1-8b", "micro_batch_size": 4, "seq_len": 4096, "activation_checkpointing": "full"},
    {"model": "llama-3.2-3b", "micro_batch_size": 2, "seq_len": 4096},
    {"model": "qwen2.5-1.5b", "micro_batch_size": 4, "seq_len": 4096, "activation_checkpointing": "full"},
]


def main() -> None:
    """Print one row per case: allocated, reserved by the replay and by the fitted rule, the new shape's cost."""
    print("| scenario | gpu | allocated | replay | fitted | new shape |")
    print("|---|---|---:|---:|---:|---:|")
    for case in CASES:
        sc = {
            "framework": "deepspeed", "precision": "mixed-bf16", "reserved_model": "replay", "optimizer": "adamw",
            "gpu": "h100-sxm-80gb", "parallel": {"dp": case.get("dp", 8), "zero": 3},
            **{k: v for k, v in case.items() if k != "dp"},
        }  # fmt: skip
        est, ms = cold(sc)
        fit = estimate({**sc, "reserved_model": "fitted"}).ranks[0]
        r = est.ranks[0]
        assert "DeepSpeed ZeRO-3" in r.reserved.formula, r.reserved.formula
        accum = f" x{case['grad_accum_steps']}" if case.get("grad_accum_steps", 1) > 1 else ""
        accum += ", ckpt" if case.get("activation_checkpointing") == "full" else ""
        name = (
            f"{case['model']} {case['micro_batch_size']}x{case['seq_len']}{accum}, dp {sc['parallel']['dp']}"
        )
        print(
            f"| {name} | {sc['gpu']} | {r.peak_allocated_bytes / GiB:.2f} | {r.peak_reserved_bytes / GiB:.2f} | "
            f"{fit.peak_reserved_bytes / GiB:.2f} ({fit.peak_reserved_bytes / r.peak_reserved_bytes - 1:+.1%}) | "
            f"{ms:.0f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
