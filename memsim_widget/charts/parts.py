"""What every chart of the package shares: the Vega-Lite schema, the category palette and colour scale, GiB for
compact JSON, and the GPU's capacity line with its headroom band (``charts``, ``charts.phases``, ``charts.times``,
``charts.comparison``, ``charts.plan`` and the planner's GPU-count chart draw with these)."""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.items import CATEGORIES
from memsim_widget.units import GiB

SCHEMA = "https://vega.github.io/schema/vega-lite/v6.4.1.json"
#: One color per category, in ``CATEGORIES`` order (the GPU capacity line is red, so no category is).
CATEGORY_COLORS = ("#4c78a8", "#72b7b2", "#54a24b", "#f58518", "#eeca3b", "#9d755d")
CAPACITY_COLOR = "#d62728"


def category_color(columns: int) -> dict[str, Any]:
    """Colour by breakdown category, in the fixed category palette, legend below the plot."""
    return {
        "field": "category",
        "type": "nominal",
        "scale": color_scale(),
        "legend": {"title": None, "orient": "bottom", "direction": "horizontal", "columns": columns},
    }


def color_scale() -> dict[str, Any]:
    """The shared category color scale."""
    return {"domain": list(CATEGORIES), "range": list(CATEGORY_COLORS)}


def gib(nbytes: float) -> float:
    """Bytes to GiB, rounded for compact JSON."""
    return round(nbytes / GiB, 4)


def capacity_layers(capacity_bytes: int, headroom: float, label: str) -> list[dict[str, Any]]:
    """The headroom band, the capacity rule and its label (shared by every chart)."""
    cap = gib(capacity_bytes)
    usable = gib(capacity_bytes * (1 - headroom))
    band = {"lo": usable, "hi": cap, "note": f"headroom {headroom:.0%}: above {usable:.1f} GiB is 'tight'"}
    rule = {"gib": cap, "label": f"{label}: {cap:.1f} GiB", "note": "GPU capacity (total_memory)"}
    return [
        {
            "data": {"values": [band]},
            "mark": {"type": "rect", "color": CAPACITY_COLOR, "opacity": 0.12},
            "encoding": {
                "x": {"value": 0},
                "x2": {"value": "width"},
                "y": {"field": "lo", "type": "quantitative"},
                "y2": {"field": "hi"},
                "tooltip": [{"field": "note", "type": "nominal", "title": "headroom"}],
            },
        },
        {
            "data": {"values": [rule]},
            "mark": {"type": "rule", "color": CAPACITY_COLOR, "strokeWidth": 2},
            "encoding": {
                "y": {"field": "gib", "type": "quantitative"},
                "tooltip": [
                    {"field": "label", "type": "nominal", "title": "GPU"},
                    {"field": "note", "type": "nominal", "title": "line"},
                ],
            },
        },
        {
            "data": {"values": [rule]},
            "mark": {
                "type": "text",
                "align": "left",
                "baseline": "bottom",
                "dx": 3,
                "dy": -3,
                "color": CAPACITY_COLOR,
                "fontWeight": "bold",
            },
            "encoding": {
                "x": {"value": 0},
                "y": {"field": "gib", "type": "quantitative"},
                "text": {"field": "label"},
            },
        },
    ]
