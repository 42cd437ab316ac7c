"""Engine vs fake-tensor trace: peak live tensor bytes of the same HF training step, per scenario.

Run: python benchmarks/fidelity_trace.py [--quick] [--write docs/fidelity.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from memsim_widget.fidelity import CASES, compare


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--write", help="write a markdown table here")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args(argv)
    cases = CASES[:5] if args.quick else CASES
    rows = []
    for name, data in cases:
        r = compare(name, data)
        rows.append(r)
        print(
            f"{name:<34} engine {r['engine']:>12,} trace {r['trace']:>12,} error {r['error']:+7.2%}  "
            f"engine@{r['engine_moment']} trace@{r['trace_phase']}:{r['trace_op']}",
            flush=True,
        )
        if args.v:
            print("   ", r["by_role"], r["phase_peaks"])
    errs = [abs(r["error"]) for r in rows]
    print(f"median |error| {statistics.median(errs):.2%}, worst {max(errs):.2%}")
    if args.write:
        lines = [
            "| scenario | engine bytes | trace bytes | error | engine moment | trace phase (op) |",
            "|---|---:|---:|---:|---|---|",
        ]
        lines += [
            f"| {r['name']} | {r['engine']:,} | {r['trace']:,} | {r['error']:+.2%} | {r['engine_moment']} | "
            f"{r['trace_phase']} ({r['trace_op']}) |"
            for r in rows
        ]
        lines.append(f"\nMedian absolute error {statistics.median(errs):.2%}; worst {max(errs):.2%}.")
        with open(args.write, "w") as fh:
            fh.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
