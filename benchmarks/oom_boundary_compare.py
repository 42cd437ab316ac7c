"""The engine's largest micro-batch and sequence against the measured OOM boundary (issue 22, item 5b).

``benchmarks/gpu_oom_boundary.py`` writes ``data/measured/oom_boundary_<card>.csv``: per scenario, emulated card
and dimension, the largest micro-batch (or sequence) that ran three real steps under a capped allocator. This
script predicts the same figure with the engine and prints both, with the issue's bar: the prediction equals the
measured boundary in at least 90% of the rows whose boundary is known (``SCORED``) and is never above it (an
over-prediction is an OOM for the user).

What the engine is asked (``--mode``):
  room  (default) a card whose allocator room is exactly the cap the measurement ran under (``cap_bytes``): the
        host GPU's catalog record with its memory set to ``cap_bytes`` plus what the engine itself puts outside
        the allocator for the scenario (context, NCCL, paged states: ``overhead.device_items``), so the
        engine's ``reserved_cap`` is ``cap_bytes``. The CUDA context then cancels out: it lives outside
        ``set_per_process_memory_fraction``'s cap on the GPU and outside ``reserved_cap`` in the engine. This
        tests the allocator replay and the tensors, not the context model.
  card  the emulated catalog card itself (``card_id``), as a user would ask. The measured room was the card's
        capacity less *this host's* measured context (``context_bytes``), not the emulated card's, so a
        mismatch here can also be the context model's (or the kernels': the engine picks SDPA's kernel by the
        card's compute capability, the run used the host's).
Both with headroom 0: the boundary itself, not the recommended margin.

Run (CPU only; no GPU needed):
    python benchmarks/oom_boundary_compare.py                       # data/measured/oom_boundary_*.csv
    python benchmarks/oom_boundary_compare.py --csv FILE --mode card
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memsim_widget.catalog.gpus import GPUS, register_gpu, resolve_gpu
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.plan.recommend import MAX_MICRO_BATCH, MAX_SEQ_LEN, largest_passing
from memsim_widget.scenario import Scenario

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "data" / "measured"
GLOB = "oom_boundary_*.csv"
#: Sequences are probed and predicted in steps of this many tokens (the planner's ``_max_seq_len`` step).
SEQ_STEP = 128
#: The issue's bar: equal in at least this share of the scored rows, and never above.
TARGET_EQUAL = 0.90

#: The columns of ``oom_boundary_<card>.csv`` (data/measured/README.md says what each means).
COLUMNS = [
    "id", "scenario", "dim", "fixed", "card", "card_id", "card_bytes", "host_gpu", "host_total_bytes",
    "context_bytes", "cap_bytes", "fraction", "measured_max", "first_oom", "lo", "hi", "status", "probes",
    "start", "seconds", "alloc_conf", "torch", "transformers", "date", "scenario_json", "note",
]  # fmt: skip
#: ``status`` values, and those whose boundary is known and so count for the bar: ``exact``, ``none_fit`` (nothing
#: runs: the engine must say so too, else it is above) and ``at_top`` (the search's top runs: the engine must reach
#: it, else it is below).
STATUSES = ("exact", "at_top", "none_fit", "bracket", "error", "skipped")
SCORED = ("exact", "none_fit", "at_top")


# ----- the engine's figure ------------------------------------------------------------------------------------
def _outside(sc: Scenario) -> int:
    """What the engine puts outside the caching allocator for ``sc`` (context, NCCL, paged states)."""
    from memsim_widget.engine.counters.overhead import device_items

    return sum(i.bytes for i in device_items(Context(sc)))


def room_gpu(host: str, memory_bytes: int) -> str:
    """Register (once) the host GPU's catalog record with ``memory_bytes`` of memory; its id."""
    base = resolve_gpu(host)
    gid = f"{base.id}@{memory_bytes}"
    if gid not in GPUS:
        # no printed names: nvidia-smi's name of the host must keep resolving to the host's own record
        register_gpu(
            dataclasses.replace(base, id=gid, name=f"{base.name} capped", memory_bytes=memory_bytes, names=())
        )
    return gid


def predicted_fits(sc: Scenario, mode: str, cap_bytes: int, card_id: str, host_gpu: str) -> bool:
    """Whether the engine says ``sc`` runs (headroom 0) on the card of ``mode`` (module docstring)."""
    try:
        if mode == "card":
            return estimate(sc.replace(gpu=card_id)).fits(headroom=0.0)
        on_host = sc.replace(gpu=resolve_gpu(host_gpu).id)
        gid = room_gpu(host_gpu, cap_bytes + _outside(on_host))
        return estimate(sc.replace(gpu=gid)).fits(headroom=0.0)
    except ScenarioError:
        return False


def units(dim: str) -> int:
    """Tokens (or samples) per probed unit of ``dim``."""
    return SEQ_STEP if dim == "seq_len" else 1


def top(sc: Scenario, dim: str) -> int:
    """The largest value of ``dim`` the engine plans (in units): the planner's bound, the position table."""
    if dim == "micro_batch_size":
        return MAX_MICRO_BATCH
    table = Context(sc).arch.max_seq_len
    return (min(MAX_SEQ_LEN, table) if table else MAX_SEQ_LEN) // SEQ_STEP


def predicted_max(sc: Scenario, dim: str, mode: str, cap_bytes: int, card_id: str, host_gpu: str,
                  hi: int | None = None) -> int | None:  # fmt: skip
    """The engine's largest ``dim`` (micro-batch, or sequence in multiples of ``SEQ_STEP``) that runs; None when
    even the smallest does not."""
    u = units(dim)
    best = largest_passing(lambda k: predicted_fits(sc.replace(**{dim: k * u}), mode, cap_bytes, card_id, host_gpu),
                   1, hi if hi is not None else top(sc, dim))  # fmt: skip
    return None if best is None else best * u


# ----- the comparison -----------------------------------------------------------------------------------------
def read_rows(paths: Iterable[Path]) -> list[dict[str, str]]:
    """Every row of the boundary CSVs (their header must be ``COLUMNS``)."""
    rows = []
    for p in paths:
        with open(p, newline="") as f:
            r = csv.DictReader(f)
            if r.fieldnames != COLUMNS:
                raise ScenarioError("--csv", f"{str(p)!r} is not an oom_boundary CSV (columns differ)")
            rows += list(r)
    return rows


def compare_row(row: dict[str, str], mode: str) -> dict[str, Any]:
    """One row: measured and predicted maximum, and whether the prediction is equal, below or above."""
    sc = Scenario.from_dict(json.loads(row["scenario_json"]))
    dim = row["dim"]
    measured = int(row["measured_max"]) if row["measured_max"] else None
    hi = int(row["hi"]) // units(dim) if row["hi"] else None
    pred = predicted_max(sc, dim, mode, int(row["cap_bytes"]), row["card_id"], row["host_gpu"], hi)
    if row["status"] not in SCORED:
        verdict = "not scored"
    elif pred == measured:
        verdict = "equal"
    elif measured is None or (pred is not None and pred > measured):
        verdict = "above"
    else:
        verdict = "below"
    return {"id": row["id"], "scenario": row["scenario"], "card": row["card"], "dim": dim, "status": row["status"],
            "measured": measured, "predicted": pred, "verdict": verdict}  # fmt: skip


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The bar: share equal among the scored rows (``SCORED``), how many above (must be 0), and whether it is met."""
    scored = [r for r in results if r["verdict"] != "not scored"]
    equal = sum(r["verdict"] == "equal" for r in scored)
    above = sum(r["verdict"] == "above" for r in scored)
    share = equal / len(scored) if scored else 0.0
    return {"scored": len(scored), "equal": equal, "above": above, "below": len(scored) - equal - above,
            "share_equal": share, "met": bool(scored) and share >= TARGET_EQUAL and above == 0}  # fmt: skip


def report(results: list[dict[str, Any]], mode: str) -> str:
    """The table and the bar, as printed."""
    lines = [f"{'scenario':<26}{'card':<16}{'dim':<18}{'measured':>9}{'predicted':>10}  verdict"]
    for r in results:
        m = "-" if r["measured"] is None else r["measured"]
        p = "-" if r["predicted"] is None else r["predicted"]
        lines.append(f"{r['scenario']:<26}{r['card']:<16}{r['dim']:<18}{m!s:>9}{p!s:>10}  {r['verdict']}"
                     + ("" if r["status"] == "exact" else f" ({r['status']})"))  # fmt: skip
    s = summarise(results)
    lines.append(f"mode {mode}: {s['equal']}/{s['scored']} equal ({s['share_equal']:.0%}), {s['above']} above, "
                 f"{s['below']} below; bar (>= {TARGET_EQUAL:.0%} equal, none above) "
                 f"{'met' if s['met'] else 'NOT met'}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", nargs="*", type=Path, help=f"boundary CSVs (default data/measured/{GLOB})")
    ap.add_argument("--mode", choices=("room", "card"), default="room")
    ap.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = ap.parse_args(argv)
    paths = args.csv or sorted(DATA_DIR.glob(GLOB))
    if not paths:
        print(f"oom_boundary_compare: no {GLOB} in {DATA_DIR} (run benchmarks/gpu_oom_boundary.py on a GPU)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        results = [compare_row(r, args.mode) for r in read_rows(paths)]
    except ScenarioError as e:
        print(f"oom_boundary_compare: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"rows": results, "summary": summarise(results)}, indent=1))
    else:
        print(report(results, args.mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
