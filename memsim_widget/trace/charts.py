"""Charts of a trace: live bytes through the two training steps with the peak marked, and measured
next to simulated per category. Plain Vega-Lite dicts (fast, JSON-ready) wrapped by Altair on demand."""

from __future__ import annotations

from typing import Any

GiB = 1024**3
PHASE_ORDER = ["setup", "forward", "loss", "backward", "optimizer_step", "zero_grad", "end"]


def _downsample(points: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """Keep at most ``max_points`` points, the largest of each bucket, so the peak survives."""
    if len(points) <= max_points:
        return points
    size = -(-len(points) // max_points)
    return [max(points[i : i + size], key=lambda p: p["live_bytes"]) for i in range(0, len(points), size)]


def timeline_spec(
    report: dict[str, Any], width: int = 560, height: int = 220, max_points: int = 300
) -> dict[str, Any]:
    """Vega-Lite spec: live tensor GiB against the op index, coloured by phase, the peak as a rule."""
    rows = [
        {"op": p["op_index"], "step": p["step"], "phase": p["phase"], "gib": round(p["live_bytes"] / GiB, 6)}
        for p in _downsample(report["timeline"], max_points)
    ]
    peak_gib = report["peak_tensor_bytes"] / GiB
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "width": width,
        "height": height,
        "title": f"Live tensor memory through two training steps (peak {peak_gib:.3f} GiB at "
        f"{report['peak_phase']})",
        "layer": [
            {
                "data": {"values": rows},
                "mark": {"type": "area", "interpolate": "step-after", "opacity": 0.75},
                "encoding": {
                    "x": {"field": "op", "type": "quantitative", "title": "op index"},
                    "y": {"field": "gib", "type": "quantitative", "title": "live tensors (GiB)"},
                    "color": {"field": "phase", "type": "nominal", "sort": PHASE_ORDER},
                    "tooltip": [
                        {"field": "step"},
                        {"field": "phase"},
                        {"field": "gib", "format": ".4f", "title": "GiB"},
                    ],
                },
            },
            {
                "data": {"values": [{"gib": peak_gib, "label": "peak"}]},
                "mark": {"type": "rule", "color": "black", "strokeDash": [4, 3]},
                "encoding": {"y": {"field": "gib", "type": "quantitative"}},
            },
        ],
    }


def comparison_spec(report: dict[str, Any], width: int = 360, height: int = 220) -> dict[str, Any]:
    """Vega-Lite spec: traced vs simulated bytes per category, side by side."""
    sim = report.get("simulated", {}).get("components", {})
    rows = []
    for cat in sorted(set(report["components"]) | set(sim)):
        rows.append({"category": cat, "source": "traced", "gib": report["components"].get(cat, 0) / GiB})
        rows.append({"category": cat, "source": "simulated", "gib": sim.get(cat, 0) / GiB})
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "width": width,
        "height": height,
        "title": "Traced vs simulated, per category, at the peak",
        "data": {"values": rows},
        "mark": "bar",
        "encoding": {
            "y": {"field": "category", "type": "nominal", "title": None},
            "yOffset": {"field": "source"},
            "x": {"field": "gib", "type": "quantitative", "title": "GiB"},
            "color": {"field": "source", "type": "nominal"},
            "tooltip": [{"field": "category"}, {"field": "source"}, {"field": "gib", "format": ".4f"}],
        },
    }


def timeline_chart(report: dict[str, Any]) -> Any:
    """The timeline as an Altair chart."""
    import altair as alt

    return alt.LayerChart.from_dict(timeline_spec(report))


def comparison_chart(report: dict[str, Any]) -> Any:
    """Traced vs simulated as an Altair chart."""
    import altair as alt

    return alt.Chart.from_dict(comparison_spec(report))
