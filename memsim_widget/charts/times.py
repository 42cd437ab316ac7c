"""The step-time chart of an estimate: one stacked horizontal bar of where a step's seconds go, by category."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memsim_widget.charts import model_label, to_altair
from memsim_widget.charts.parts import SCHEMA
from memsim_widget.engine.estimate import Estimate
from memsim_widget.engine.speed.step_time import TIME_CATEGORIES

if TYPE_CHECKING:
    import altair as alt

#: One colour per time category, in ``TIME_CATEGORIES`` order (compute blue/teal, memory green, comms orange).
TIME_COLORS = (
    "#4c78a8",
    "#72b7b2",
    "#9ecae9",
    "#54a24b",
    "#f58518",
    "#e45756",
    "#bab0ac",
    "#eeca3b",
    "#9d755d",
)


def time_spec(est: Estimate, title: str | None = None) -> dict[str, Any]:
    """Vega-Lite spec: the step time split by category and item, with the step time and MFU in the title."""
    rows = [{**r, "order": TIME_CATEGORIES.index(r["category"])} for r in est.time_rows()]
    return {
        "$schema": SCHEMA,
        "title": {
            "text": title or f"{model_label(est.scenario.model)}: where a training step's time goes",
            "subtitle": f"{est.step_time_s:.3g} s per step, {est.tokens_per_second_per_gpu:,.0f} tokens/s per GPU, "
            f"MFU {est.mfu:.1%} (modelled)",
        },
        "data": {"values": rows},
        "mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.5},
        "height": 60,
        "encoding": {
            "x": {"field": "seconds", "type": "quantitative", "stack": "zero", "title": "seconds per step"},
            "color": {
                "field": "category",
                "type": "nominal",
                "scale": {"domain": list(TIME_CATEGORIES), "range": list(TIME_COLORS)},
                "legend": {"title": None, "orient": "bottom", "columns": 3},
            },
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "category", "type": "nominal"},
                {"field": "item", "type": "nominal"},
                {"field": "seconds", "type": "quantitative", "format": ".4g"},
                {"field": "share", "type": "quantitative", "format": ".1%", "title": "share of step"},
                {"field": "formula", "type": "nominal"},
            ],
        },
    }


def time_chart(est: Estimate) -> alt.Chart:
    """Altair chart of ``time_spec``."""
    return to_altair(time_spec(est))  # type: ignore[return-value]
