"""Gradient accumulation: the engine's allocation stream replayed against the fake-tensor trace of the same
accumulating step, replayed the same way (docs/allocator.md, "Gradient accumulation").

For each case: the trace's peak reserved and allocated (``trace/replay.replay_trace``), the engine stream's
(``alloc_stream.rank_stream`` + ``replay_stream``), and the fitted rule's reserved (``reserved_model`` unset:
what the estimate gave for these steps before the replay covered them). Nothing is fitted.

Run: python benchmarks/allocator_replay_accum.py [--accum 3] [-k TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import LLAMA_H512_V32K as SMALL_LLAMA  # noqa: E402  (the test's case, written once)

BASE = {"micro_batch_size": 2, "seq_len": 512, "precision": "bf16", "reserved_model": "replay"}
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


def compare(d: dict[str, Any], traced_only: bool = False, inductor: bool = False) -> dict[str, int | str]:
    """The trace's replay, the engine stream's and the fitted rule's reserved for scenario ``d`` (under
    ``reserved_model: replay``); with ``traced_only`` also the stream without the CUDA-only scratch the CPU trace
    cannot see (``rank_stream(traced_only=True)``, benchmarks/allocator_replay_compiled.py); ``inductor``: a
    compiled step traced under ``trace/compiled.inductor_passes``."""
    import contextlib

    from memsim_widget import estimate
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.engine.rl import objectives
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import trace_config
    from memsim_widget.trace.compiled import inductor_passes
    from memsim_widget.trace.replay import replay_trace

    sc = Scenario.from_dict({**d, "reserved_model": "replay"})
    with inductor_passes() if inductor else contextlib.nullcontext():
        traced, _ = replay_trace(trace_config(sc, progress=False).tracker, sc)
    ctx = Context(objectives.training_scenario(sc))
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    seen = (
        replay_stream(rank_stream(ctx, ctx.stages[0], traced_only=True), allocator_conf(ctx))
        if traced_only
        else None
    )
    fitted = estimate(Scenario.from_dict({**d, "reserved_model": "fitted"})).ranks[0].peak_reserved_bytes
    return {
        "trace": traced.peak_reserved,
        "trace_alloc": traced.peak_allocated,
        "stream": rep.peak_reserved,
        "stream_alloc": rep.peak_allocated,
        **(
            {"stream_traced_only": seen.peak_reserved, "stream_traced_only_alloc": seen.peak_allocated}
            if seen
            else {}
        ),
        "fitted": fitted,
        "at": rep.at,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accum", type=int, nargs="+", default=[1, 3], help="grad_accum_steps to compare")
    ap.add_argument("-k", default="", help="only cases whose name holds this text")
    args = ap.parse_args()
    for name, d in CASES:
        if args.k not in name:
            continue
        for ga in args.accum:
            r = compare({**d, "grad_accum_steps": ga})
            tr = int(r["trace"])
            print(
                f"{name:34s} accum {ga}: reserved trace {tr:,} stream {int(r['stream']):,} "
                f"({int(r['stream']) / tr - 1:+.2%}, at {r['at']}), fitted {int(r['fitted']) / tr - 1:+.2%}; "
                f"allocated trace {int(r['trace_alloc']):,} stream {int(r['stream_alloc']):,}",
                flush=True,
            )


if __name__ == "__main__":
    main()
