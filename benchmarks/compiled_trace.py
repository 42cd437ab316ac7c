"""The compiled GPU runs of data/measured/gpu_h200.csv against the compiled fake-tensor trace of the same step.

The H200 rows are a test set: nothing here is fitted to them. Printed: the trace's peak of live tensor bytes (Inductor's
decompositions and min-cut partitioner, its fusion emulated: memsim_widget/trace/compiled.py), the measured
``max_memory_allocated`` and the error, then the engine's estimate (its traced compiled rule, or its untraced
formula: engine/activations/compiled.py).

Run: python benchmarks/compiled_trace.py [--budget 1.0]   (about 2 minutes per row on one CPU core)
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

ROWS = Path(__file__).resolve().parent.parent / "data" / "measured" / "gpu_h200.csv"


def main(argv: list[str] | None = None) -> int:
    from memsim_widget.trace.api import trace_config

    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--budget", type=float, default=1.0, help="torch._functorch.config.activation_memory_budget"
    )
    args = ap.parse_args(argv)
    for row in csv.DictReader(ROWS.open()):
        data = json.loads(row["scenario_json"])
        if not data.get("compile") or row["counter"] != "allocated":
            continue
        sc = Scenario.from_dict(data)
        measured = int(row["measured_bytes"])
        tr = trace_config(sc, compile_budget=args.budget, progress=False)
        est = estimate(sc)
        print(
            f"{row['id']}: trace {tr.peak_bytes:,} B ({tr.peak_phase}, {tr.peak_op}) vs measured {measured:,} B: "
            f"{tr.peak_bytes / measured - 1:+.2%}; engine {est.peak_allocated_bytes:,} B: "
            f"{est.peak_allocated_bytes / measured - 1:+.2%}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
