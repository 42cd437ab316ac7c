"""Fuzz the boundaries at scale and count what must be 0: uncaught exceptions, hangs over 10 s, destroyed files.

Suites (the tests run the same strategies at a CI-sized count):

* ``scenario``: junk in every field and in inline HF configs (tests/test_fuzz_scenario.py's strategies): valid
  scenarios, named errors (a ScenarioError naming a scenario key), uncaught exceptions;
* ``export``: hostile GPU names in every format (tests/test_export_hostile.py: refused, or the file parses and
  its header stays a comment), each written with ``--out`` into a folder holding old files and a planted link,
  with a write fault injected at a random step: the folder must hold the whole export or exactly what it held;
* ``files``: special files and abuse sizes as the scenario file or model path (FIFO, /dev/zero, a folder,
  NUL and surrogates, duplicate keys, 2**40 dimensions, pp 2**20): one line, exit 2, within 10 s;
* ``widget``: sequences of front-end operations (edits of junk, trait writes, messages) on one widget
  (tests/widget/test_widget_abuse.py): no exception out of the widget, and a valid edit afterwards applies.

Run: python benchmarks/fuzz.py [--suite all] [--examples 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from memsim_widget.engine.core import estimate  # noqa: E402
from memsim_widget.errors import ScenarioError  # noqa: E402
from memsim_widget.scenario import Scenario  # noqa: E402
from tests.test_fuzz_scenario import ALLOWED_FIELDS, SCENARIO  # noqa: E402


def classify(data: dict) -> tuple[str, str]:
    """('valid' | 'named' | 'unnamed' | 'uncaught', detail) for one drawn scenario."""
    try:
        sc = Scenario.from_dict(data)
        est = estimate(sc)
        json.dumps(sc.to_dict(), allow_nan=False)
        if Scenario.from_json(sc.to_json()) != sc or est.device_total_bytes <= 0:
            return "uncaught", "round trip or result broken"
    except ScenarioError as exc:
        head = exc.field.split(".")[0].split("[")[0]
        return (
            ("named", exc.field) if head in ALLOWED_FIELDS and "\n" not in str(exc) else ("unnamed", str(exc))
        )
    except Exception as exc:  # noqa: BLE001 -- counting them is the point
        return "uncaught", "".join(traceback.format_exception_only(exc)).strip()
    return "valid", ""


def scenario_suite(args: argparse.Namespace) -> int:
    """The scenario boundary: valid, named, unnamed, uncaught."""
    counts: collections.Counter[str] = collections.Counter()
    fields: collections.Counter[str] = collections.Counter()
    uncaught: list[tuple[dict, str]] = []

    @seed(args.seed)
    @settings(
        max_examples=args.examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=SCENARIO)
    def draw(data: dict) -> None:
        kind, detail = classify(data)
        counts[kind] += 1
        if kind == "named":
            fields[detail.split(".")[0]] += 1
        elif kind != "valid":
            uncaught.append((data, detail))

    t0 = time.perf_counter()
    draw()
    secs = time.perf_counter() - t0
    total = sum(counts.values())
    print(f"{total:,} scenarios in {secs:.1f} s (seed {args.seed})")
    for kind in ("valid", "named", "unnamed", "uncaught"):
        print(f"  {kind:9s} {counts[kind]:7,}")
    print("  named errors by field: " + ", ".join(f"{k} {v}" for k, v in fields.most_common(12)))
    for data, detail in uncaught[:10]:
        print(f"  UNCAUGHT {detail}\n    {data!r:.300}")
    return 1 if uncaught else 0


def main(argv: list[str] | None = None) -> int:
    from fuzz_surfaces import SUITES  # the export, files and widget suites

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=["all", "scenario", *SUITES], default="all")
    ap.add_argument("--examples", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    failed = 0
    if args.suite in ("all", "scenario"):
        failed |= scenario_suite(args)
    for name, suite in SUITES.items():
        if args.suite in ("all", name):
            failed |= suite(args)
    return failed


if __name__ == "__main__":
    sys.exit(main())
