"""Engine vs trace for every stage of a pipeline (small Llama, b2 s512 bf16): 1F1B, GPipe, interleaved.

Run: python benchmarks/pipeline_stages.py [--json out.json] [--top 8]
Prints one row per (layout, stage): the engine's peak_tensor_bytes for the stage, the traced peak of that
rank (memsim_widget.trace.pipeline), the error, the traced phase/op at the peak and the roles alive then.
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
from fidelity_cases import LLAMA  # noqa: E402

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


def main(argv: list[str] | None = None) -> int:
    """Print the table (and optionally write every row, with top tensors, as JSON)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--top", type=int, default=8, help="largest tensors kept per row")
    args = ap.parse_args(argv)
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
