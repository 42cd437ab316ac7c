"""Charts of a trace: live bytes through the two training steps with the peak marked, and measured
next to simulated per category. Plain Vega-Lite dicts (fast, JSON-ready) wrapped by Altair on demand."""

from __future__ import annotations

from typing import Any

from memsim_widget.units import GiB

PHASE_ORDER = ["setup", "forward", "loss", "backward", "optimizer_step", "zero_grad", "end"]


def _downsample(points: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """Keep at most ``max_points`` points, the largest of each bucket, so the peak survives."""
    if len(points) <= max_points:
        return points
    size = -(-len(points) // max_points)
    return [max(points[i : i + size], key=lambda p: p["live_bytes"]) for i in range(0, len(points), size)]


def _timeline_rows(points: list[dict[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """Timeline points as chart rows (op index, step, phase, GiB), downsampled keeping the peak."""
    return [
        {"op": p["op_index"], "step": p["step"], "phase": p["phase"], "gib": round(p["live_bytes"] / GiB, 6)}
        for p in _downsample(points, max_points)
    ]


def _timeline_frame(
    report: dict[str, Any], width: int, height: int, layers: list[dict[str, Any]]
) -> dict[str, Any]:
    """The top level of both timeline specs: size, the title with the peak, the layers."""
    peak_gib = report["peak_tensor_bytes"] / GiB
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "width": width,
        "height": height,
        "title": f"Live tensor memory through two training steps (peak {peak_gib:.3f} GiB at "
        f"{report['peak_phase']})",
        "layer": layers,
    }


def timeline_spec(
    report: dict[str, Any], width: int = 560, height: int = 220, max_points: int = 300
) -> dict[str, Any]:
    """Vega-Lite spec: live tensor GiB against the op index, coloured by phase, the peak as a rule."""
    rows = _timeline_rows(report["timeline"], max_points)
    peak_gib = report["peak_tensor_bytes"] / GiB
    return _timeline_frame(
        report,
        width,
        height,
        [
            {
                "data": {"values": rows},
                "mark": {"type": "area", "interpolate": "step-after", "opacity": 0.75},
                "encoding": {
                    "x": {"field": "op", "type": "quantitative", "title": "op index"},
                    "y": {
                        "field": "gib",
                        "type": "quantitative",
                        "title": "live tensors (GiB)",
                        "stack": None,
                    },
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
    )


def comparison_spec(report: dict[str, Any], width: int = 360, height: int = 220) -> dict[str, Any]:
    """Vega-Lite spec: traced vs simulated bytes per category, side by side."""
    sim = report.get("simulated", {}).get("components", {})
    rows = []
    for cat in sorted(set(report["components"]) | set(sim)):
        rows.append({"category": cat, "source": "traced", "gib": report["components"].get(cat, 0) / GiB})
        rows.append({"category": cat, "source": "simulated", "gib": sim.get(cat, 0) / GiB})
    world = int(report.get("world_size", 1) or 1)
    title = (
        f"Rank {report.get('rank', 0)} of {world}: traced vs simulated (stage "
        f"{report.get('simulated', {}).get('stage', 0)}), per category, at the peak"
        if world > 1
        else "Traced vs simulated, per category, at the peak"
    )
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "width": width,
        "height": height,
        "title": title,
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


def peak_point(report: dict[str, Any]) -> dict[str, Any] | None:
    """The timeline point of the reported peak (the largest one of the peak's step), or None without a timeline."""
    points = report.get("timeline") or []
    step = report.get("peak_step")
    in_step = [p for p in points if p["step"] == step] or points
    if not in_step:
        return None
    p = max(in_step, key=lambda q: q["live_bytes"])
    return {
        "op": p["op_index"],
        "step": p["step"],
        "phase": p["phase"],
        "gib": round(p["live_bytes"] / GiB, 6),
    }


def phase_spans(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Consecutive runs of one (step, phase) in the timeline: ``start``/``end`` op index, ``step``, ``phase``."""
    spans: list[dict[str, Any]] = []
    for p in report.get("timeline") or []:
        last = spans[-1] if spans else None
        if last is not None and (last["step"], last["phase"]) == (p["step"], p["phase"]):
            last["end"] = p["op_index"]
            continue
        if last is not None:
            last["end"] = p["op_index"]
        spans.append({"start": p["op_index"], "end": p["op_index"], "step": p["step"], "phase": p["phase"]})
    return [s for s in spans if s["phase"] not in ("setup", "end") and s["end"] > s["start"]]


def verify_timeline_spec(
    report: dict[str, Any], width: int = 430, height: int = 200, max_points: int = 400
) -> dict[str, Any]:
    """The widget's timeline: live tensor GiB as one unstacked step area over phase bands, the peak marked.

    Unlike ``timeline_spec`` (one area per phase, which Vega-Lite stacks where phases share an op index),
    the line here is exactly the live bytes.
    """
    rows = _timeline_rows(report.get("timeline") or [], max_points)
    peak_gib = report["peak_tensor_bytes"] / GiB
    spans = phase_spans(report)
    phases = [p for p in PHASE_ORDER if any(s["phase"] == p for s in spans)]
    layers: list[dict[str, Any]] = [
        {
            "data": {"values": spans},
            "mark": {"type": "rect", "opacity": 0.22},
            "encoding": {
                "x": {"field": "start", "type": "quantitative", "title": "op index"},
                "x2": {"field": "end"},
                "color": {"field": "phase", "type": "nominal", "sort": phases, "scale": {"domain": phases}},
                "tooltip": [{"field": "step"}, {"field": "phase"}],
            },
        },
        {
            "data": {"values": rows},
            "mark": {
                "type": "area",
                "interpolate": "step-after",
                "color": "#4c78a8",
                "opacity": 0.7,
                "line": {"color": "#1f3b5c", "strokeWidth": 1},
            },
            "encoding": {
                "x": {"field": "op", "type": "quantitative"},
                "y": {"field": "gib", "type": "quantitative", "title": "live tensors (GiB)", "stack": None},
                "tooltip": [
                    {"field": "step"},
                    {"field": "phase"},
                    {"field": "op", "title": "op index"},
                    {"field": "gib", "format": ".4f", "title": "GiB"},
                ],
            },
        },
        {
            "data": {"values": [{"gib": peak_gib}]},
            "mark": {"type": "rule", "color": "black", "strokeDash": [4, 3]},
            "encoding": {"y": {"field": "gib", "type": "quantitative"}},
        },
    ]
    peak = peak_point(report)
    if peak is not None:
        label = f"peak {peak['gib']:.3f} GiB ({peak['phase']}, step {peak['step']})"
        layers.append(
            {
                "data": {"values": [{**peak, "label": label}]},
                "encoding": {
                    "x": {"field": "op", "type": "quantitative"},
                    "y": {"field": "gib", "type": "quantitative"},
                },
                "layer": [
                    {"mark": {"type": "point", "filled": True, "color": "black", "size": 60}},
                    {
                        "mark": {"type": "text", "align": "right", "dx": -8, "dy": 12, "fontWeight": "bold"},
                        "encoding": {"text": {"field": "label"}},
                    },
                ],
            }
        )
    return _timeline_frame(report, width, height, layers)


def verify_specs(
    report: dict[str, Any],
    schema: str | None = None,
    timeline_width: int = 430,
    comparison_width: int = 260,
    height: int = 200,
) -> dict[str, dict[str, Any]]:
    """The widget's trace charts: ``comparison`` (traced vs simulated per category) and ``timeline``."""
    timeline = verify_timeline_spec(report, width=timeline_width, height=height)
    comparison = comparison_spec(report, width=comparison_width, height=height)
    if schema:
        timeline["$schema"] = comparison["$schema"] = schema
    return {"comparison": comparison, "timeline": timeline}
