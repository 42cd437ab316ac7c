"""Gradient accumulation: the engine's allocation stream replayed against the fake-tensor trace of the same
accumulating step, replayed the same way (docs/allocator.md, "Gradient accumulation").

For each case: the trace's peak reserved and allocated (``trace/replay``), the engine stream's
(``alloc_stream.rank_stream`` + ``replay_stream``), and the fitted rule's reserved (``reserved_model: fitted``:
what the estimate gave for these steps before the replay covered them): ``tests/data/stream_vs_trace.figures``.
Nothing is fitted.

Run: python benchmarks/allocator_replay_accum.py [--accum 3] [-k TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import LLAMA_H512_V32K as SMALL_LLAMA  # noqa: E402  (the test's case, written once)
from stream_vs_trace import BASE, figures  # noqa: E402  (the comparison the tests hold, written once)

LORA = {"method": "lora", "lora": {"rank": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama L4 h512 V32k full b2 s512", {**BASE, "model": SMALL_LLAMA}),
    ("llama L4 h512 V32k tied b2 s512", {**BASE, "model": {**SMALL_LLAMA, "tie_word_embeddings": True}}),
    ("llama L4 h512 V32k LoRA b2 s512", {**BASE, "model": SMALL_LLAMA, **LORA}),
    ("llama-3.2-1b full b1 s1024", {**BASE, "model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 1024}),
    (
        "llama-3.2-1b LoRA b1 s1024",
        {**BASE, "model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 1024, **LORA},
    ),
    (
        "llama-3.2-1b full ckpt b1 s1024",
        {
            **BASE,
            "model": "llama-3.2-1b",
            "micro_batch_size": 1,
            "seq_len": 1024,
            "activation_checkpointing": "full",
        },
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accum", type=int, nargs="+", default=[1, 3], help="grad_accum_steps to compare")
    ap.add_argument("-k", default="", help="only cases whose name holds this text")
    args = ap.parse_args()
    for name, d in CASES:
        if args.k not in name:
            continue
        for ga in args.accum:
            r = figures({**d, "grad_accum_steps": ga})
            tr = int(r["trace"])
            print(
                f"{name:34s} accum {ga}: reserved trace {tr:,} stream {int(r['stream']):,} "
                f"({int(r['stream']) / tr - 1:+.2%}, at {r['at']}), fitted {int(r['fitted']) / tr - 1:+.2%}; "
                f"allocated trace {int(r['trace_allocated']):,} stream {int(r['stream_allocated']):,}",
                flush=True,
            )


if __name__ == "__main__":
    main()
