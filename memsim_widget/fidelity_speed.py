"""Modelled step time against published training throughput, and the fit of the time model's constants.

``data/throughput/published.csv`` holds published runs (normalised from the shared development set by
``benchmarks/fidelity_speed.py --normalise``), each with the scenario that reproduces it. The only fitted
constants are ``engine/speed/gpu_speed.MATMUL_EFFICIENCY`` (one per GPU generation) and
``engine/speed/step_time.ATTENTION_EFFICIENCY``; ``fit_constants`` refits them on the rows in
``engine/speed/gpu_speed.FIT_ROWS`` alone, so every other row is a held-out check.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from memsim_widget.engine.context import Context
from memsim_widget.engine.speed.gpu_speed import FIT_ROWS
from memsim_widget.engine.speed.step_time import (
    TimeModel,
    optimizer_step_bytes,
    scenario_columns,
    step_parts,
)
from memsim_widget.engine.speed.time_breakdown import context_time_model
from memsim_widget.scenario import Scenario

DATA = Path(__file__).resolve().parent.parent / "data" / "throughput" / "published.csv"
#: Row groups: ``full`` (every key of the run is published), ``assumed`` (some keys assumed, in
#: ``assumptions``), ``excluded`` (not reproducible; ``reason`` says why).
GROUPS = ("full", "assumed", "excluded")
#: Rows the attention efficiency is fitted on (long sequences, where attention is most of the work).
ATTENTION_FIT_ROWS = ("tp0294",)


@dataclass(frozen=True)
class SpeedRow:
    """One published run: its throughput, its scenario (None when excluded) and how it was mapped."""

    row_id: str
    source: str
    model: str
    gpu: str
    group: str
    published: float | None  # tokens per second per GPU
    scenario: Scenario | None
    reason: str
    assumptions: str
    metric: str

    @property
    def generation(self) -> str:
        """The GPU generation of the row's card."""
        assert self.scenario is not None
        return Context(self.scenario).gpu.generation


def load(path: Path | str = DATA) -> list[SpeedRow]:
    """The rows of a normalised throughput CSV."""
    out = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            sc = Scenario.from_dict(json.loads(r["scenario_json"])) if r["scenario_json"] else None
            pub = r["published_tokens_per_s_per_gpu"]
            out.append(
                SpeedRow(
                    row_id=r["row_id"],
                    source=r["source_id"],
                    model=r["model"],
                    gpu=r["gpu"],
                    group=r["group"],
                    published=float(pub) if pub else None,
                    scenario=sc,
                    reason=r["reason"],
                    assumptions=r["assumptions"],
                    metric=r["metric_as_published"],
                )
            )
    return out


def _model(row: SpeedRow) -> tuple[TimeModel, dict]:
    ctx = Context(row.scenario)  # type: ignore[arg-type]
    cols = scenario_columns(ctx.scenario, optimizer_step_bytes(ctx.recipe, ctx.opt))
    return context_time_model(ctx), cols


def predicted(row: SpeedRow, efficiency: float | None = None, attention: float | None = None) -> float:
    """Modelled tokens/s per GPU of a row (with trial constants when given)."""
    k, cols = _model(row)
    if efficiency is not None:
        k = replace(k, efficiency=efficiency)
    if attention is not None:
        k = replace(k, attention_efficiency=attention)
    return float(step_parts(k, cols)["tokens_per_gpu_s"])


def error(row: SpeedRow, **trial: float) -> float:
    """Relative error of the modelled throughput: predicted / published - 1."""
    assert row.published
    return predicted(row, **trial) / row.published - 1.0


def _golden(f: Callable[[float], float], lo: float, hi: float, steps: int = 60) -> float:
    """The minimum of a unimodal ``f`` on [lo, hi] (golden-section search, a fixed number of steps)."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def _loss(rows: Sequence[SpeedRow], **trial: float) -> float:
    """Sum of squared log ratios predicted / published."""
    return sum(math.log(predicted(r, **trial) / r.published) ** 2 for r in rows)  # type: ignore[operator]


def fit_constants(rows: Iterable[SpeedRow]) -> tuple[dict[str, float], float]:
    """Refit the matmul efficiency of each generation in ``FIT_ROWS`` and the attention efficiency on
    ``ATTENTION_FIT_ROWS`` (jointly with their generation), rounded as committed (3 and 2 decimals)."""
    by_id = {r.row_id: r for r in rows}
    gen_rows = {g: [by_id[i] for i in ids] for g, ids in FIT_ROWS.items()}
    att_rows = [by_id[i] for i in ATTENTION_FIT_ROWS]
    att_gen = att_rows[0].generation
    joint = gen_rows[att_gen] + att_rows

    def best_eta(rs: Sequence[SpeedRow], att: float) -> float:
        return _golden(lambda e: _loss(rs, efficiency=e, attention=att), 0.2, 1.0)

    att = round(_golden(lambda a: _loss(joint, efficiency=best_eta(joint, a), attention=a), 0.2, 1.0, 30), 2)
    effs = {g: round(best_eta(gen_rows[g] + (att_rows if g == att_gen else []), att), 3) for g in FIT_ROWS}
    return effs, att


@dataclass(frozen=True)
class Comparison:
    """One row's predicted and published throughput, and whether a constant was fitted on it."""

    row: SpeedRow
    predicted: float
    fitted_on: bool

    @property
    def error(self) -> float:
        return self.predicted / self.row.published - 1.0  # type: ignore[operator]


def compare(rows: Iterable[SpeedRow]) -> list[Comparison]:
    """Predicted against published for every row that has a scenario and a throughput."""
    fit = {i for ids in FIT_ROWS.values() for i in ids} | set(ATTENTION_FIT_ROWS)
    return [Comparison(r, predicted(r), r.row_id in fit) for r in rows if r.scenario and r.published]


def summary(comps: Sequence[Comparison]) -> dict[str, float]:
    """Count, median and worst absolute relative error of ``comps``."""
    errs = [abs(c.error) for c in comps]
    return {
        "rows": len(errs),
        "median": statistics.median(errs) if errs else math.nan,
        "worst": max(errs) if errs else math.nan,
    }
