"""The small pool on tiny models: the engine's one-GPU stream of the 4-layer h 256 Llama (V 1000: every activation
1 MiB or less, so the small pool's 2 MiB segments decide reserved) against the fake-tensor trace of the same step,
both replayed through the same allocator (docs/allocator.md, "The small pool on tiny models").

For each case: the trace's peak reserved (``trace/replay``; torchtune's savers through ``trace/torchtune_memory``)
and the engine stream's error against it (``alloc_stream.rank_stream`` + ``replay_stream``). Nothing is fitted.

Run: python benchmarks/allocator_replay_small_pool.py [-k TEXT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import CASES, TORCHTUNE_CASES  # noqa: E402  (the test cases, written once)

NAMES = [
    "llama bf16 sdpa b2 s512",
    "llama bf16 ckpt b2 s512",
    "llama bf16 lora qv bf16 b2 s512",
    "llama bf16 lora qv ckpt b2 s512",
    "llama bf16 lora all-linear bf16 b2 s512",
    "mistral bf16 lora all-linear b2 s512",
    "qwen3 bf16 lora qv b2 s512",
    "llama bf16 opt-in-bwd b2 s512",
    "llama bf16 ckpt offload b2 s512",
    "llama bf16 ckpt offload opt-in-bwd b2 s512",
]


def error(d: dict) -> tuple[int, float]:
    """(the trace's peak reserved, the engine stream's error against it)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.engine.rl import objectives
    from memsim_widget.scenario import Scenario
    from memsim_widget.trace.api import trace_config
    from memsim_widget.trace.replay import replay_trace

    sc = Scenario.from_dict({**d, "reserved_model": "replay"})
    traced, _ = replay_trace(trace_config(sc, progress=False).tracker, sc)
    ctx = Context(objectives.training_scenario(sc))
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    return traced.peak_reserved, rep.peak_reserved / traced.peak_reserved - 1


def main(argv: list[str] | None = None) -> int:
    """Print one row per case."""
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    args = ap.parse_args(argv)
    cases = {**dict(CASES), **dict(TORCHTUNE_CASES)}
    print("| case | trace replay (B) | stream |")
    print("|---|---:|---:|")
    for name in NAMES:
        if args.k in name:
            traced, err = error(cases[name])
            print(f"| {name} | {traced:,} | {err:+.2%} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
