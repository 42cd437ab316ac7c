"""The engine against torchtitan's published memory figures (held out: nothing in the engine is fitted on them).

Run: python benchmarks/torchtitan_published.py

Sources: pytorch/torchtitan ``benchmarks/llama3_h100_202412_torchtitan.md`` (commit 31a17bfdb70bab6f62a13d21816a5339b911d6e3;
the runs used torchtitan 9dec370, torch 1963fc8 and torchao eab345c of December 2024) on H100s with 96 GB of HBM2e
(the catalog's ``h100-96gb``). Its "Memory(GiB)" is torchtitan's logged ``max_reserved`` (``torch.cuda.
memory_stats()["reserved_bytes.all.peak"]``: torchtitan ``utils.py``/``metrics.py`` of that commit), the largest over
the ranks, after about 90 steps, with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (torchtitan's launch
script; the torchtitan profile's default, engine/frameworks.py). Each row's scenario is written below from the
table's caption and ``train_configs/llama3_*.toml`` at 9dec370: seq_len 8192 unless the table says, AdamW, FSDP2
with bf16 parameters and fp32 reduction (``amp-bf16`` here), ``selective`` checkpointing per op (the 8B config's
``selective_ac_option = 'op'``), Float8 as torchao's tensorwise recipe; the pipeline rows' local batch is split into
as many micro-batches as pipeline stages (the default of ``pipeline_parallel_microbatches`` then). Two later rows
from ``benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md`` (June 2025, H200) follow (``_h200``).

Prints per row: the measured reserved, the engine's reserved, the error, and which rule gave it (``replay``: the
caching allocator replayed over the engine's own stream; ``fitted``: ``engine/counters/overhead``'s rule where the
stream does not model the step). docs/allocator.md ("torchtitan's published runs") quotes the table.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402
from memsim_widget.units import GiB  # noqa: E402

#: The common part of every row: Llama 3.1 8B, local batch 2 x 8192, per-op selective checkpointing.
BASE: dict[str, Any] = {
    "model": "llama-3.1-8b",
    "method": "full",
    "precision": "amp-bf16",
    "optimizer": "adamw",
    "micro_batch_size": 2,
    "seq_len": 8192,
    "activation_checkpointing": "selective-op",
    "attention": "sdpa",
    "framework": "torchtitan",
    "gpu": "h100-96gb",
}
#: torchtitan 9dec370 compiled each block but not the loss (``train.py``: ``torch.compile(loss_fn)`` commented out
#: on 2024-12-18, e8977b0, "compiling loss function causes CUDA errors"; back on 2025-02-20, d1f62be).
COMPILED: dict[str, Any] = {"compile": True, "compile_loss": False}
FP8: dict[str, Any] = {**COMPILED, "fp8_recipe": "tensorwise"}
FSDP8: dict[str, Any] = {"parallel": {"dp": 8, "zero": 3}, "num_gpus": 8}
FSDP128: dict[str, Any] = {"parallel": {"dp": 128, "zero": 3}, "num_gpus": 128}


def _cp(dp: int, cp: int) -> dict[str, Any]:
    """Table 2's rows: FSDP x CP on 8 GPUs, local batch 1, full checkpointing, the sequence 32k x cp."""
    return {
        **FP8,
        "parallel": {"dp": dp, "cp": cp, "zero": 3},
        "num_gpus": 8,
        "micro_batch_size": 1,
        "seq_len": 32768 * cp,
        "activation_checkpointing": "full",
    }


def _pp(batch: int, seq: int, schedule: str) -> dict[str, Any]:
    """Tables 5 and 6: Llama 3.1 405B on FSDP 8 x TP 8 x PP 8, full checkpointing, the local batch in 8 micro-batches."""
    return {
        **FP8,
        "model": "llama-3.1-405b",
        "parallel": {
            "dp": 8,
            "tp": 8,
            "pp": 8,
            "zero": 3,
            "sequence_parallel": True,
            "pp_microbatches": 8,
            "pp_schedule": schedule,
            **({"virtual_stages": 2} if schedule == "interleaved" else {}),
        },
        "num_gpus": 512,
        "micro_batch_size": batch // 8,
        "seq_len": seq,
        "activation_checkpointing": "full",
    }


def _h200(gpus: int) -> dict[str, Any]:
    """The June 2025 H200 rows (``benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md``, torchtitan e7c0cae, torch
    2.8.0a0): Llama 3.1 8B on FSDP over 32 or 64 H200s, local batch 2 x 8192, per-op selective checkpointing,
    compiled, Float8 with FSDP's fp8 all-gather. That torchtitan compiles its loss too (``components/loss.py``
    ``build_cross_entropy_loss``: ``torch.compile(loss_fn)`` under ``training.compile``): ``compile_loss`` true,
    the torchtitan profile's default (engine/activations/loss.compiled_apart_terms)."""
    return {
        **FP8,
        "compile_loss": True,
        "fp8_all_gather": True,
        "gpu": "h200",
        "parallel": {"dp": gpus, "zero": 3},
        "num_gpus": gpus,
    }


#: (table and row, measured GiB, the row's keys over ``BASE``).
ROWS: list[tuple[str, float, dict[str, Any]]] = [
    ("T1 FSDP", 82.4, FSDP8),
    ("T1 FSDP + compile", 77.0, {**FSDP8, **COMPILED}),
    ("T1 FSDP + compile + Float8", 76.8, {**FSDP8, **FP8}),
    ("T2 FSDP 8, CP 1, 32k", 83.9, _cp(8, 1)),
    ("T2 FSDP 4, CP 2, 64k", 84.2, _cp(4, 2)),
    ("T2 FSDP 2, CP 4, 128k", 84.0, _cp(2, 4)),
    ("T2 FSDP 1, CP 8, 256k", 84.5, _cp(1, 8)),
    ("T3 FSDP (128 GPUs)", 67.0, FSDP128),
    ("T3 FSDP + compile (128 GPUs)", 62.0, {**FSDP128, **COMPILED}),
    ("T3 FSDP + compile + Float8 (128 GPUs)", 61.8, {**FSDP128, **FP8}),
    (
        "T4 70B FSDP 32 x TP 8",
        71.9,
        {
            **FP8,
            "model": "llama-3.1-70b",
            "parallel": {"dp": 32, "tp": 8, "zero": 3, "sequence_parallel": True},
            "num_gpus": 256,
            "micro_batch_size": 16,
            "activation_checkpointing": "full",
        },
    ),
    ("T5 405B 1F1B", 82.5, _pp(32, 8192, "1f1b")),
    ("T5 405B interleaved 1F1B", 72.7, _pp(32, 8192, "interleaved")),
    ("T6 405B CP 1, 32k", 75.3, _pp(8, 32768, "1f1b")),
    ("2025 H200 8B FSDP 32 + compile + Float8", 47.96, _h200(32)),
    ("2025 H200 8B FSDP 64 + compile + Float8", 46.97, _h200(64)),
]


def rule(est: Any) -> str:
    """Which rule gave the reserved counter: the replay or the fitted rule (read off the worst rank's reserved
    item, whose formula names the replay)."""
    return "replay" if "replayed" in est.worst.reserved.formula else "fitted"


def main() -> None:
    print(f"{'row':40s} {'measured':>9s} {'allocated':>10s} {'reserved':>9s} {'error':>8s}  rule")
    for name, measured, keys in ROWS:
        data = {**BASE, **keys}
        try:
            est = estimate(Scenario.from_dict(data))
        except Exception as exc:  # a layout the engine refuses is a finding, printed, not a crash
            print(f"{name:40s} {measured:9.1f}  refused: {exc}")
            continue
        reserved = est.peak_reserved_bytes / GiB
        print(
            f"{name:40s} {measured:9.1f} {est.peak_allocated_bytes / GiB:10.2f} {reserved:9.2f} "
            f"{reserved / measured - 1:+8.1%}  {rule(est)}"
        )


if __name__ == "__main__":
    main()
