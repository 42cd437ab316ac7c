"""Tensor-parallel ranks: the engine's allocation stream (``alloc_stream.rank_stream`` with ``tp_stream``'s
buffers) replayed against the fake-tensor trace of one rank of the same job (``trace/distributed.py``: PyTorch's
own DTensor plan on a fake process group), replayed the same way (docs/allocator.md, "Tensor parallel ranks").

For each case: the trace's peak reserved and allocated, the engine stream's and the fitted rule's reserved
(``reserved_model: fitted``), and the CUDA streams the trace allocates on (``tests/data/stream_vs_trace.figures``).
Nothing is fitted.

Run: python benchmarks/allocator_replay_tp.py [-k TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import LLAMA_H512_V32K as SMALL_LLAMA  # noqa: E402  (the test's case, written once)
from stream_vs_trace import BASE, change, figures  # noqa: E402  (the comparison the tests hold, written once)
from torchtitan_tp_cases import TORCHTITAN_TP_CASES  # noqa: E402  (torchtitan's plan: the test's cases)

ONE_B = {**BASE, "model": "llama-3.2-1b", "seq_len": 1024}
SP = {"sequence_parallel": True}
FSDP = {"dp": 2, "zero": 3}

CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama L4 h512 V32k tp2", {**BASE, "model": SMALL_LLAMA, "parallel": {"tp": 2}}),
    ("llama L4 h512 V32k tp4", {**BASE, "model": SMALL_LLAMA, "parallel": {"tp": 4}}),
    ("llama L4 h512 V32k tp2 sp", {**BASE, "model": SMALL_LLAMA, "parallel": {"tp": 2, **SP}}),
    ("llama L4 h512 V32k tp4 sp", {**BASE, "model": SMALL_LLAMA, "parallel": {"tp": 4, **SP}}),
    (
        "llama L4 h512 V32k tp2 tied",
        {**BASE, "model": {**SMALL_LLAMA, "tie_word_embeddings": True}, "parallel": {"tp": 2}},
    ),
    (
        "llama L4 h512 V32k tp2 ckpt",
        {**BASE, "model": SMALL_LLAMA, "parallel": {"tp": 2}, "activation_checkpointing": "full"},
    ),
    (
        "llama L4 h512 V32k tp2 b1",
        {**BASE, "model": SMALL_LLAMA, "parallel": {"tp": 2}, "micro_batch_size": 1},
    ),
    ("llama-3.2-1b tp2 2 x 1024", {**ONE_B, "parallel": {"tp": 2}}),
    ("llama-3.2-1b tp4 2 x 1024", {**ONE_B, "parallel": {"tp": 4}}),
    ("llama-3.2-1b tp2 sp 2 x 1024", {**ONE_B, "parallel": {"tp": 2, **SP}}),
    ("llama-3.2-1b tp4 sp 2 x 1024", {**ONE_B, "parallel": {"tp": 4, **SP}}),
    ("llama L4 h512 V32k dp2 x tp2 fsdp", {**BASE, "model": SMALL_LLAMA, "parallel": {**FSDP, "tp": 2}}),
    (
        "llama L4 h512 V32k dp2 x tp2 fsdp no reshard",
        {**BASE, "model": SMALL_LLAMA, "parallel": {**FSDP, "tp": 2, "reshard_after_forward": False}},
    ),
    (
        "llama L4 h512 V32k dp4 x tp2 fsdp",
        {**BASE, "model": SMALL_LLAMA, "parallel": {**FSDP, "dp": 4, "tp": 2}},
    ),
    (
        "llama L4 h512 V32k dp2 x tp4 sp fsdp",
        {**BASE, "model": SMALL_LLAMA, "parallel": {**FSDP, "tp": 4, **SP}},
    ),
    (
        "llama L4 h512 V32k dp2 x tp2 fsdp tied",
        {**BASE, "model": {**SMALL_LLAMA, "tie_word_embeddings": True}, "parallel": {**FSDP, "tp": 2}},
    ),
    (
        "llama L4 h512 V32k dp2 x tp2 fsdp ckpt",
        {**BASE, "model": SMALL_LLAMA, "parallel": {**FSDP, "tp": 2}, "activation_checkpointing": "full"},
    ),
    ("llama-3.2-1b dp2 x tp2 fsdp 2 x 1024", {**ONE_B, "parallel": {**FSDP, "tp": 2}}),
    ("llama-3.2-1b dp2 x tp4 sp fsdp 2 x 1024", {**ONE_B, "parallel": {**FSDP, "tp": 4, **SP}}),
] + [(f"torchtitan plan: {name}", {**BASE, **keys}) for name, keys in TORCHTITAN_TP_CASES]

#: A shape whose layers, not the loss, decide the peak (h 2048, V 8000, 2 x 2048 tokens): outside the held set, the
#: TP stream of either plan is 2-3% under its trace here (docs/allocator.md "Tensor parallel ranks").
WIDE = {**SMALL_LLAMA, "hidden_size": 2048, "intermediate_size": 5504, "num_attention_heads": 16}
WIDE = {**BASE, "model": {**WIDE, "num_key_value_heads": 8, "vocab_size": 8000}, "seq_len": 2048}
CASES += [
    ("wide h2048 V8k one GPU (not held)", WIDE),
    ("wide h2048 V8k tp2 (not held)", {**WIDE, "parallel": {"tp": 2}}),
    ("wide h2048 V8k tp2 sp (not held)", {**WIDE, "parallel": {"tp": 2, **SP}}),
    (
        "torchtitan plan: wide h2048 V8k tp2 sp (not held)",
        {**WIDE, "framework": "torchtitan", "parallel": {"tp": 2, **SP}},
    ),
    (
        "torchtitan plan: wide h2048 V8k tp4 sp (not held)",
        {**WIDE, "framework": "torchtitan", "parallel": {"tp": 4, **SP}},
    ),
    (
        "torchtitan plan: wide h2048 V8k dp2 x tp2 sp (not held)",
        {**WIDE, "framework": "torchtitan", "parallel": {"tp": 2, **SP, **FSDP}},
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    print("| case | trace replay | engine stream | fitted rule | allocated: trace, stream | CUDA streams |")
    print("|---|---:|---:|---:|---:|---|")
    for name, d in CASES:
        if args.k not in name:
            continue
        r = figures(d)
        t, ta = r["trace"], r["trace_allocated"]
        print(
            f"| {name} | {t:,} B | {change(r['stream'], t)} | {change(r['fitted'], t)} | "
            f"{ta:,}, {change(r['stream_allocated'], ta)} | {r['streams']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
