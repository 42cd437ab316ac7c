"""DeepSpeed ranks with ``offload_optimizer`` (``framework: deepspeed``, ``parallel.offload: optimizer``, HF
Trainer's DeepSpeed integration, ``mixed-bf16``) under the replay, now their default
(``engine/counters/zero_offload_stream.py``), beside the fitted rule (what ``reserved`` was for them before), and
what a new shape costs.

    python benchmarks/allocator_replay_zero_offload.py

Per scenario: peak allocated, reserved by the replay and by the fitted rule (``engine/counters/overhead.py``), and
the milliseconds of a new shape through ``estimate`` (CPU time, the fastest of 3, every cache cleared). No GPU row
measures an offloaded DeepSpeed rank: these are predictions, the stream held to the real optimizer run on the CPU
(``benchmarks/zero_trace.py --offload optimizer``).
"""

from __future__ import annotations

from typing import Any

from allocator_replay_ddp import cold  # the same cold-estimate timing

from memsim_widget.engine.core import estimate
from memsim_widget.units import GiB

#: dp 8 on an H100 unless named; ZeRO-2 and ZeRO-3 with the optimizer on the host (LLaMA-Factory's and axolotl's
#: offload configs put it there to fit a model on few GPUs)
CASES: list[dict[str, Any]] = [
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 2048, "zero": 2},
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 4096, "zero": 2, "grad_accum_steps": 4},
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 2048, "zero": 2, "dp": 2},
    {"model": "qwen2.5-7b", "micro_batch_size": 2, "seq_len": 4096, "zero": 3,
     "activation_checkpointing": "full"},
    {"model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 2048, "zero": 3},
    {"model": "llama-3.1-8b", "micro_batch_size": 4, "seq_len": 4096, "zero": 3, "activation_checkpointing": "full"},
    {"model": "llama-3.2-3b", "micro_batch_size": 2, "seq_len": 4096, "zero": 3, "dp": 2},
]  # fmt: skip


def main() -> None:
    """Print one row per case: allocated, reserved by the replay and by the fitted rule, the new shape's cost."""
    print("| scenario | allocated | replay (now the default) | fitted | new shape |")
    print("|---|---:|---:|---:|---:|")
    for case in CASES:
        extra = {k: v for k, v in case.items() if k not in ("dp", "zero")}
        sc = {
            "framework": "deepspeed", "precision": "mixed-bf16", "optimizer": "adamw", "gpu": "h100-sxm-80gb",
            "parallel": {"dp": case.get("dp", 8), "zero": case["zero"], "offload": "optimizer"}, **extra,
        }  # fmt: skip
        est, ms = cold(sc)
        fit = estimate({**sc, "reserved_model": "fitted"}).ranks[0]
        r = est.ranks[0]
        assert "offload_optimizer" in r.reserved.formula, r.reserved.formula
        more = f" x{case['grad_accum_steps']}" if case.get("grad_accum_steps", 1) > 1 else ""
        more += ", ckpt" if case.get("activation_checkpointing") == "full" else ""
        name = f"{case['model']} {case['micro_batch_size']}x{case['seq_len']}{more}, ZeRO-{case['zero']} dp {case.get('dp', 8)}"
        print(
            f"| {name} | {r.peak_allocated_bytes / GiB:.2f} | {r.peak_reserved_bytes / GiB:.2f} | "
            f"{fit.peak_reserved_bytes / GiB:.2f} ({fit.peak_reserved_bytes / r.peak_reserved_bytes - 1:+.1%}) | "
            f"{ms:.0f} ms |",
            flush=True,
        )


if __name__ == "__main__":
    main()
