"""Tensor-parallel ranks: the engine's allocation stream (``alloc_stream.rank_stream`` with ``tp_stream``'s
buffers) replayed against the fake-tensor trace of one rank of the same job (``trace/distributed.py``: PyTorch's
own DTensor plan on a fake process group), replayed the same way (docs/allocator.md, "Tensor parallel ranks").

For each case: the trace's peak reserved and allocated, the engine stream's and the fitted rule's reserved (``reserved_model`` unset). Nothing is fitted.

Run: python benchmarks/allocator_replay_tp.py [-k TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import LLAMA_H512_V32K as SMALL_LLAMA  # noqa: E402  (the test's case, written once)

BASE = {"micro_batch_size": 2, "seq_len": 512, "precision": "bf16", "reserved_model": "replay"}
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
    (
        "llama L4 h512 V32k torchtitan tp2 sp (loss parallel; fitted rule)",
        {**BASE, "model": SMALL_LLAMA, "parallel": {"tp": 2, **SP}, "framework": "torchtitan"},
    ),
]


def compare(d: dict[str, Any]) -> dict[str, Any]:
    """The trace's replay, the engine stream's and the fitted rule's reserved for scenario ``d``."""
    from memsim_widget import estimate
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.counters.allocator import replay
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import trace_scenario
    from memsim_widget.trace.replay import _prepared

    sc = Scenario.from_dict(d)
    result = trace_scenario(sc, progress=False)
    events, _outside, conf, _ = _prepared(result.tracker, sc, None)
    traced = replay(events, conf=conf)
    ctx = Context(sc)
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    fitted = estimate(Scenario.from_dict({**d, "reserved_model": "fitted"})).ranks[0]
    return {
        "trace": traced.peak_reserved,
        "trace_allocated": traced.peak_allocated,
        "streams": sorted({st for _h, size, st in events if size >= 0}),
        "stream": rep.peak_reserved,
        "stream_allocated": rep.peak_allocated,
        "fitted": fitted.peak_reserved_bytes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    print("| case | trace replay | engine stream | fitted rule | allocated: trace, stream | CUDA streams |")
    print("|---|---:|---:|---:|---:|---|")
    for name, d in CASES:
        if args.k not in name:
            continue
        r = compare(d)
        t, ta = r["trace"], r["trace_allocated"]
        print(
            f"| {name} | {t:,} B | {(r['stream'] - t) / t:+.2%} | {(r['fitted'] - t) / t:+.2%} | "
            f"{ta:,}, {(r['stream_allocated'] - ta) / ta:+.2%} | {r['streams']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
