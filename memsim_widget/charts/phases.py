"""The phase chart of a GRPO/PPO (or DPO) estimate: one stacked bar per phase at its own peak, by category.

The rollout phase (a colocated vLLM engine generating, then scoring) and the training step are two different
instants on the same GPU; the peak is the larger bar (``Estimate.phases``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memsim_widget.charts import model_label, to_altair
from memsim_widget.charts.parts import SCHEMA, capacity_layers, category_color
from memsim_widget.engine.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.engine.items import CATEGORIES
from memsim_widget.units import GiB, fmt_bytes

if TYPE_CHECKING:
    import altair as alt


def phase_records(est: Estimate) -> list[dict[str, Any]]:
    """One record per item of each phase's peak moment (worst rank), labelled ``phase (moment)``."""
    out = []
    for r in est.phase_rows():
        out.append(
            {
                "phase": f"{r['phase']} ({r['moment']})",
                "category": r["category"],
                "item": r["item"],
                "gib": round(r["bytes"] / GiB, 4),
                "size": fmt_bytes(r["bytes"]),
                "formula": r["formula"],
                "order": CATEGORIES.index(r["category"]),
            }
        )
    return out


def phase_spec(est: Estimate, headroom: float = DEFAULT_HEADROOM, title: str | None = None) -> dict[str, Any]:
    """Vega-Lite spec: a stacked bar per phase against the GPU capacity and headroom band."""
    records = phase_records(est)
    phases = list(dict.fromkeys(r["phase"] for r in records))
    totals = {p: sum(r["gib"] for r in records if r["phase"] == p) for p in phases}
    x = {"field": "phase", "type": "nominal", "title": None, "sort": phases, "axis": {"labelAngle": 0}}
    bars = {
        "data": {"values": records},
        "mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.5},
        "encoding": {
            "x": x,
            "y": {
                "field": "gib",
                "type": "quantitative",
                "stack": "zero",
                "title": "GiB per GPU (allocated)",
            },
            "color": category_color(3),
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "phase", "type": "nominal"},
                {"field": "category", "type": "nominal"},
                {"field": "item", "type": "nominal"},
                {"field": "size", "type": "nominal", "title": "bytes"},
                {"field": "formula", "type": "nominal"},
            ],
        },
    }
    labels = {
        "data": {"values": [{"phase": p, "gib": g, "label": f"{g:.1f} GiB"} for p, g in totals.items()]},
        "mark": {"type": "text", "baseline": "bottom", "dy": -3, "fontSize": 11},
        "encoding": {"x": x, "y": {"field": "gib", "type": "quantitative"}, "text": {"field": "label"}},
    }
    band, rule, rule_label = capacity_layers(est.gpu.memory_bytes, headroom, est.gpu.name)
    sc = est.scenario
    return {
        "$schema": SCHEMA,
        "title": {
            "text": title or f"{model_label(sc.model)} {sc.objective_name}: memory of each phase",
            "subtitle": "the peak is the larger phase; rollout rules are formula-only (vLLM's arithmetic)",
        },
        "width": max(220, 110 * len(phases)),
        "height": 300,
        "layer": [band, rule, bars, labels, rule_label],
    }


def phase_chart(est: Estimate, headroom: float = DEFAULT_HEADROOM) -> alt.LayerChart:
    """Altair chart of ``phase_spec``."""
    return to_altair(phase_spec(est, headroom))  # type: ignore[return-value]
