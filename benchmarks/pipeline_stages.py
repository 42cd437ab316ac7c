"""Engine vs trace for every stage of a pipeline (small Llama, b2 s512 bf16): 1F1B, GPipe, interleaved.

Run: python benchmarks/pipeline_stages.py [--json out.json] [--top 8]
Prints one row per (layout, stage): the engine's peak_tensor_bytes for the stage, the traced peak of that
rank (memsim_widget.trace.pipeline), the error, the traced phase/op at the peak and the roles alive then.

Run: python benchmarks/pipeline_stages.py --reserved [--seq 1024]
Prints instead each stage's peak reserved: its trace replayed through the caching allocator (trace/replay.py),
the fitted rule's and the stage's own stream's (engine/counters/pp_stream.py, reserved_model: replay) against it,
and the stream's without the CUDA-only scratch a CPU trace cannot see (``rank_stream(traced_only=True)``: flash
attention's fp32 dq accumulator), the like-for-like comparison,
on the h=512 Llama at a real 32k vocabulary, bf16, GPipe and 1F1B with 2p micro-batches
(docs/allocator.md#pipeline-stages).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario
from memsim_widget.trace.pipeline import trace_pipeline

# the engine-vs-trace case matrices are test data (tests/data), not in the wheel
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
from fidelity_cases import LLAMA, LLAMA_H512_V32K  # noqa: E402

LAYOUTS: list[dict[str, Any]] = [
    {"pp": pp, "pp_schedule": sched, "pp_microbatches": m}
    for pp in (2, 4)
    for sched in ("1f1b", "gpipe")
    for m in (4, 8)
] + [{"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "pp_microbatches": m} for m in (4, 8)]


def label(par: dict[str, Any]) -> str:
    """A short name of a layout, e.g. 'pp4 1f1b m8'."""
    v = f" v{par['virtual_stages']}" if "virtual_stages" in par else ""
    return f"pp{par['pp']} {par['pp_schedule']}{v} m{par['pp_microbatches']}"


def row(par: dict[str, Any], stage: int, top: int) -> dict[str, Any]:
    """Trace one stage's rank and simulate it."""
    sc = Scenario.from_dict({"model": LLAMA, "micro_batch_size": 2, "seq_len": 512, "parallel": par})
    engine = estimate(sc).ranks[stage]
    tr = trace_pipeline(sc, rank=stage, top_n=top)
    return {
        "layout": label(par),
        "stage": stage,
        "engine": engine.peak_tensor_bytes,
        "engine_moment": max(engine.moments, key=lambda m: m.tensor_bytes).name,
        "trace": tr.peak_bytes,
        "error": (engine.peak_tensor_bytes - tr.peak_bytes) / tr.peak_bytes,
        "phase": tr.peak_phase,
        "op": tr.peak_op,
        "by_role": {k: v for k, v in tr.by_role.items() if v},
        "top": tr.top,
        "notes": tr.notes,
    }


def reserved_rows(seq: int) -> None:
    """Peak reserved of every stage: its trace replayed, the fitted rule and the stage's stream (GPipe, 1F1B)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.alloc_stream import pool_replay, rank_stream, replay_stream
    from memsim_widget.engine.frameworks import allocator_conf
    from memsim_widget.trace.replay import replay_trace

    print(
        "| layout | stage | trace replay (B) | fitted | stream | traced ops only | stream allocated vs trace |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for par in [
        p for p in LAYOUTS if p["pp_schedule"] != "interleaved" and p["pp_microbatches"] == 2 * p["pp"]
    ]:
        d = {
            "model": LLAMA_H512_V32K,
            "micro_batch_size": 2,
            "seq_len": seq,
            "precision": "bf16",
            "parallel": par,
        }
        fitted = estimate({**d, "reserved_model": "fitted"}).ranks
        replayed = estimate({**d, "reserved_model": "replay"}).ranks
        sc = Scenario.from_dict(d)
        for stage in range(par["pp"]):
            traced, _ = replay_trace(trace_pipeline(sc, rank=stage).tracker, sc)
            t = traced.peak_reserved
            f, r = fitted[stage].peak_reserved_bytes, replayed[stage].peak_reserved_bytes
            assert "caching allocator replayed" in replayed[stage].reserved.formula
            ctx = Context(Scenario.from_dict({**d, "reserved_model": "replay"}))
            a = pool_replay(ctx, ctx.stages[stage]).peak_allocated
            seen = replay_stream(rank_stream(ctx, ctx.stages[stage], traced_only=True), allocator_conf(ctx))
            print(
                f"| {label(par)} | {stage} | {t:,} | {f / t - 1:+.2%} | {r / t - 1:+.2%} | "
                f"{seen.peak_reserved / t - 1:+.2%} | "
                f"{a / traced.peak_allocated - 1:+.2%} |",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    """Print the table (and optionally write every row, with top tensors, as JSON)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--top", type=int, default=8, help="largest tensors kept per row")
    ap.add_argument(
        "--reserved", action="store_true", help="peak reserved: trace replay, fitted rule, stream"
    )
    ap.add_argument("--seq", type=int, default=1024, help="tokens a sample with --reserved")
    args = ap.parse_args(argv)
    if args.reserved:
        reserved_rows(args.seq)
        return 0
    rows = []
    print("| layout | stage | engine bytes | trace bytes | error | engine moment | trace phase (op) |")
    print("|---|---:|---:|---:|---:|---|---|")
    for par in LAYOUTS:
        for stage in range(par["pp"]):
            r = row(par, stage, args.top)
            rows.append(r)
            print(
                f"| {r['layout']} | {stage} | {r['engine']:,} | {r['trace']:,} | {r['error']:+.2%} | "
                f"{r['engine_moment']} | {r['phase']} ({r['op']}) |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
