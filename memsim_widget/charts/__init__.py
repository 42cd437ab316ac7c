"""Charts of an estimate: pure functions from an ``Estimate`` (or its frame) to Vega-Lite specs and Altair charts.

The ``*_spec`` functions build plain Vega-Lite dicts (fast: the widget calls them on every change); the
``*_chart`` functions wrap the same specs as Altair charts for notebooks (``chart.save("x.png")``).
Sizes are GiB (2**30 bytes), the unit ``nvidia-smi`` and PyTorch's memory summaries use.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memsim_widget.charts.parts import (  # noqa: F401
    CAPACITY_COLOR,  # CAPACITY_COLOR and CATEGORY_COLORS: the notebooks read the palette from charts
    CATEGORY_COLORS,
    SCHEMA,
    capacity_layers,
    category_color,
    gib,
)
from memsim_widget.engine.core import estimate as run_estimate
from memsim_widget.engine.estimate import DEFAULT_HEADROOM, Estimate
from memsim_widget.engine.items import CATEGORIES
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.units import GiB, fmt_bytes

if TYPE_CHECKING:
    import altair as alt
    import pandas as pd

#: Log-scale stops of the two "how it scales" axes.
MICRO_BATCH_STOPS = tuple(2**i for i in range(11))
SEQ_LEN_STOPS = tuple(128 * 2**i for i in range(11))
AXIS_TITLES = {"micro_batch_size": "micro-batch size", "seq_len": "sequence length"}


def model_label(model: Any) -> str:
    """A short name for a scenario's model: the preset id, or ``custom <model_type>``."""
    if isinstance(model, Mapping):
        return f"custom {model.get('model_type', 'model')}"
    return str(model)


def gpu_label(gpu: Any) -> str:
    """A short name for a scenario's GPU: the catalog id, or ``custom <N> GiB``."""
    if isinstance(gpu, Mapping):
        return (
            f"custom {gpu.get('memory_gib', '?'):g} GiB"
            if isinstance(gpu.get("memory_gib"), int | float)
            else "custom GPU"
        )
    return str(gpu)


# ----- breakdown per rank --------------------------------------------------------------------------------
def breakdown_records(source: Estimate | pd.DataFrame | Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One record per (rank, item) with bytes > 0: GiB, human size, share of the rank's total, formula."""
    if isinstance(source, Estimate):
        rows: Iterable[Mapping[str, Any]] = source.rows()
    elif hasattr(source, "to_dict") and hasattr(source, "columns"):
        rows = source.to_dict("records")  # type: ignore[union-attr]
    else:
        rows = source
    rows = [r for r in rows if r["bytes"] > 0]
    totals: dict[str, int] = {}
    for r in rows:
        totals[r["rank"]] = totals.get(r["rank"], 0) + int(r["bytes"])
    out = []
    for r in rows:
        nbytes = int(r["bytes"])
        size = fmt_bytes(nbytes)
        out.append(
            {
                "rank": r["rank"],
                "stage": int(r["stage"]),
                "category": r["category"],
                "order": CATEGORIES.index(r["category"]) if r["category"] in CATEGORIES else len(CATEGORIES),
                "item": r["item"],
                "bytes": nbytes,
                "gib": gib(nbytes),
                "size": size,
                "share": round(nbytes / max(totals[r["rank"]], 1), 4),
                "formula": f"{r['formula']} = {size}",
                "counter": r["counter"],
                "moment": r["moment"],
            }
        )
    return out


def breakdown_spec(
    source: Estimate | pd.DataFrame | Iterable[Mapping[str, Any]],
    headroom: float = DEFAULT_HEADROOM,
    *,
    capacity_bytes: int | None = None,
    gpu_name: str | None = None,
    title: str | None = None,
) -> dict[str, Any]:
    """Vega-Lite spec: one stacked bar per rank (pipeline stage) against the GPU capacity and headroom band."""
    records = breakdown_records(source)
    if isinstance(source, Estimate):
        roles = {r.label: source.role(r) for r in source.ranks}
        records = [{**r, "role": roles.get(r["rank"], "")} for r in records]
        capacity_bytes = source.gpu.memory_bytes if capacity_bytes is None else capacity_bytes
        gpu_name = gpu_name or source.gpu.name
        if title is None:
            title = f"{model_label(source.scenario.model)}: memory per GPU at each rank's peak"
    if capacity_bytes is None:
        raise ValueError("capacity_bytes is needed to chart a frame or rows")
    ranks = sorted({(r["stage"], r["rank"]) for r in records})
    totals = []
    for stage, rank in ranks:
        nbytes = sum(r["bytes"] for r in records if r["rank"] == rank)
        totals.append({"rank": rank, "stage": stage, "gib": gib(nbytes), "label": f"{nbytes / GiB:.1f} GiB"})
    x = {
        "field": "rank",
        "type": "nominal",
        "title": None,
        "sort": [r for _, r in ranks],
        "axis": {"labelAngle": 0},
    }
    role_tip = (
        [{"field": "role", "type": "nominal", "title": "holds"}] if records and "role" in records[0] else []
    )
    bars = {
        "data": {"values": records},
        "mark": {"type": "bar", "stroke": "white", "strokeWidth": 0.5},
        "encoding": {
            "x": x,
            "y": {"field": "gib", "type": "quantitative", "stack": "zero", "title": "GiB per GPU"},
            "color": category_color(3),
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "rank", "type": "nominal"},
                *role_tip,
                {"field": "category", "type": "nominal"},
                {"field": "item", "type": "nominal"},
                {"field": "size", "type": "nominal", "title": "bytes"},
                {"field": "share", "type": "quantitative", "format": ".1%", "title": "share of rank"},
                {"field": "formula", "type": "nominal"},
                {"field": "counter", "type": "nominal", "title": "counted by"},
                {"field": "moment", "type": "nominal", "title": "peak moment"},
            ],
        },
    }
    labels = {
        "data": {"values": totals},
        "mark": {"type": "text", "baseline": "bottom", "dy": -3, "fontSize": 11},
        "encoding": {"x": x, "y": {"field": "gib", "type": "quantitative"}, "text": {"field": "label"}},
    }
    band, rule, rule_label = capacity_layers(capacity_bytes, headroom, gpu_name or "GPU")
    # The capacity label goes right of the plot, on two lines: above the bars it would collide with the total
    # of a bar that ends near the line (the default scenario's 79.4 GiB on an 80 GiB card). The category legend
    # goes below the plot to leave that room.
    rule_label["data"]["values"] = [
        {**v, "label": v["label"].replace(": ", "\n", 1)} for v in rule_label["data"]["values"]
    ]
    rule_label["mark"].update({"align": "left", "baseline": "middle", "dx": 4, "dy": 0, "lineBreak": "\n"})
    rule_label["encoding"]["x"] = {"value": "width"}
    return {
        "$schema": SCHEMA,
        "title": title or "memory per GPU",
        "width": max(220, 70 * len(ranks)),
        "height": 300,
        "layer": [band, rule, bars, labels, rule_label],
    }


# ----- how it scales ------------------------------------------------------------------------------------
#: Scaling curves kept (``_scaling_points``): one per scenario with an axis factored out.
SCALING_CACHE = 512


class ScalingCancelled(Exception):
    """A scaling curve's computation stopped because its ``cancelled()`` said so (a superseded widget job)."""


def _curve_key(scenario: Scenario, axis: str, stops: Sequence[int]) -> Scenario:
    """The scenario a curve is memoised under: ``axis`` moved to the first stop, so every value of the axis
    shares the curve (the scenario itself when that first stop is invalid: a GRPO completion longer than it)."""
    try:
        return scenario.replace(**{axis: stops[0]})
    except ScenarioError:
        return scenario


def scaling_points(
    scenario: Scenario, axis: str, stops: Sequence[int], cancelled: Callable[[], bool] | None = None
) -> dict[str, Any]:
    """Estimate ``scenario`` with ``axis`` at each stop: per-category GiB, totals, and skipped invalid stops.

    Memoised on the scenario with ``axis`` factored out, so moving the slider of that axis reuses the curve.
    The returned dict is shared: copy before changing it. ``cancelled`` is asked before each stop not memoised
    yet; when it says True, ``ScalingCancelled`` is raised and nothing is memoised.
    """
    return _scaling_points(_curve_key(scenario, axis, stops), axis, tuple(stops), cancelled)


class _CurveMemo:
    """The memo of ``scaling_points`` (least recently used dropped beyond ``SCALING_CACHE``), thread-safe: the
    widget computes curves in a background job while the kernel may ask for them. Unlike ``functools.lru_cache``
    it answers whether a curve is memoised without computing it (``peek``), so the widget publishes a memoised
    scaling view at once and sends only new ones to the background."""

    def __init__(self, maxsize: int) -> None:
        """An empty memo of at most ``maxsize`` curves."""
        self.maxsize = maxsize
        self._curves: OrderedDict[tuple[Scenario, str, tuple[int, ...]], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def peek(self, scenario: Scenario, axis: str, stops: tuple[int, ...]) -> dict[str, Any] | None:
        """The memoised curve of a key scenario (``_curve_key``), None when it is not memoised."""
        key = (scenario, axis, stops)
        with self._lock:
            curve = self._curves.get(key)
            if curve is not None:
                self._curves.move_to_end(key)
            return curve

    def __call__(
        self,
        scenario: Scenario,
        axis: str,
        stops: tuple[int, ...],
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """The curve of a key scenario (``_curve_key``): memoised, else computed outside the memo's lock."""
        curve = self.peek(scenario, axis, stops)
        if curve is None:
            curve = _curve(scenario, axis, stops, cancelled)
            with self._lock:
                curve = self._curves.setdefault((scenario, axis, stops), curve)  # a racing twin's stays
                while len(self._curves) > self.maxsize:
                    self._curves.popitem(last=False)
        return curve

    def cache_clear(self) -> None:
        """Forget every curve (benchmarks measure cold updates)."""
        with self._lock:
            self._curves.clear()


def _curve(
    scenario: Scenario, axis: str, stops: tuple[int, ...], cancelled: Callable[[], bool] | None
) -> dict[str, Any]:
    """``scaling_points`` for a scenario whose ``axis`` sits at the first stop, computed."""
    points: list[dict[str, Any]] = []
    totals: list[dict[str, Any]] = []
    invalid: list[dict[str, Any]] = []
    capacity = None
    for value in stops:
        if cancelled is not None and cancelled():
            raise ScalingCancelled(f"{axis} curve cancelled at {value}")
        try:
            est = run_estimate(scenario.replace(**{axis: value}))
        except ScenarioError as exc:
            invalid.append({"value": value, "error": str(exc)})
            continue
        capacity = est.gpu.memory_bytes
        comps = est.components()
        total = sum(comps.values())  # == device_total_bytes, without recomputing the rank totals
        for cat, nbytes in comps.items():
            points.append(
                {
                    "x": value,
                    "category": cat,
                    "order": CATEGORIES.index(cat),
                    "gib": gib(nbytes),
                    "size": fmt_bytes(nbytes),
                    "total": fmt_bytes(total),
                }
            )
        totals.append({"x": value, "bytes": total, "gib": gib(total)})
        if (rep := est.card_replay) is not None and not rep.runs:  # reserved_model: replay, out of memory
            totals[-1]["oom"] = True
    return {
        "axis": axis,
        "stops": list(stops),
        "points": points,
        "totals": totals,
        "invalid": invalid,
        "capacity_bytes": capacity,
    }


#: The memo of ``scaling_points`` (``_scaling_points.cache_clear()`` forgets it).
_scaling_points = _CurveMemo(SCALING_CACHE)


def crossing(totals: Sequence[Mapping[str, Any]], limit_bytes: float) -> dict[str, Any]:
    """Where a total-vs-stop curve crosses ``limit_bytes``: last stop under it, first over, interpolated x. A
    stop marked ``oom`` (``reserved_model: replay``: its replay on the card runs out of memory,
    ``Estimate.card_replay``) counts as over whatever its capped total, and is where the curve crosses."""
    under = over = None
    for t in sorted(totals, key=lambda t: t["x"]):
        if t["bytes"] <= limit_bytes and not t.get("oom"):
            if over is None:
                under = t
        elif over is None:
            over = t
    out: dict[str, Any] = {
        "max_fit": under["x"] if under else None,
        "first_over": over["x"] if over else None,
        "at": None,
    }
    if under and over and not over.get("oom"):
        span = over["bytes"] - under["bytes"]
        frac = (limit_bytes - under["bytes"]) / span if span else 0.0
        out["at"] = round(under["x"] + frac * (over["x"] - under["x"]), 1)
    elif over:
        out["at"] = over["x"]
    return out


def _axis_stops(axis: str) -> tuple[int, ...]:
    """The stops of a "how it scales" axis."""
    return MICRO_BATCH_STOPS if axis == "micro_batch_size" else SEQ_LEN_STOPS


def scaling_cached(est: Estimate, axes: Sequence[str] = ("micro_batch_size", "seq_len")) -> bool:
    """Whether ``scaling_data(est)`` would estimate nothing: every axis' curve is memoised (or the axis fixed)."""
    for axis in axes:
        if axis == "seq_len" and est.arch.fixed_seq_len:
            continue
        stops = _axis_stops(axis)
        if _scaling_points.peek(_curve_key(est.scenario, axis, stops), axis, stops) is None:
            return False
    return True


def scaling_data(
    est: Estimate,
    headroom: float = DEFAULT_HEADROOM,
    axes: Sequence[str] = ("micro_batch_size", "seq_len"),
    cancelled: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """The "how it scales" data of an estimate along each axis, with the current point and capacity crossings.

    ``cancelled``: asked before each stop estimated (``scaling_points``); ``ScalingCancelled`` when it says so.
    """
    out: dict[str, Any] = {}
    cap = est.gpu.memory_bytes
    for axis in axes:
        if axis == "seq_len" and est.arch.fixed_seq_len:
            out[axis] = {"axis": axis, "fixed": est.arch.fixed_seq_len}
            continue
        data = dict(scaling_points(est.scenario, axis, _axis_stops(axis), cancelled))
        data["current"] = {
            "x": getattr(est.scenario, axis),
            "gib": gib(est.device_total_bytes),
            "bytes": est.device_total_bytes,
        }
        data["capacity_bytes"] = cap
        data["crosses_capacity"] = crossing(data["totals"], cap)
        data["crosses_headroom"] = crossing(data["totals"], cap * (1 - headroom))
        out[axis] = data
    return out


def _x_encoding(axis: str, title: str, stops: Sequence[int]) -> dict[str, Any]:
    """The log-2 x axis of a scaling panel, ticked at its stops."""
    return {
        "field": "x",
        "type": "quantitative",
        "title": title,
        "scale": {"type": "log", "base": 2, "domain": [stops[0], stops[-1]]},
        "axis": {"values": stops, "labelAngle": -40 if axis == "seq_len" else 0, "grid": False},
    }


def _y_scale(data: Mapping[str, Any]) -> dict[str, Any]:
    """Zoom on the capacity: curves far above it are clipped so the crossing stays readable."""
    cap_gib = data["capacity_bytes"] / GiB
    top = max((t["gib"] for t in data["totals"]), default=cap_gib)
    y_max = round(max(cap_gib * 1.5, data["current"]["gib"] * 1.15), 1) if top > cap_gib * 1.5 else None
    return {"domain": [0, y_max]} if y_max else {}


def _curve_layers(data: Mapping[str, Any], x: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The stacked areas per category and the total's points."""
    areas = {
        "data": {"values": data["points"]},
        "mark": {"type": "area", "opacity": 0.85, "line": {"strokeWidth": 0.5}, "clip": True},
        "encoding": {
            "x": x,
            "y": {
                "field": "gib",
                "type": "quantitative",
                "stack": "zero",
                "title": "GiB per GPU (worst rank)",
                "scale": _y_scale(data),
            },
            "color": category_color(6),
            "order": {"field": "order", "type": "quantitative"},
            "tooltip": [
                {"field": "x", "type": "quantitative", "title": title},
                {"field": "category", "type": "nominal"},
                {"field": "size", "type": "nominal", "title": "bytes"},
                {"field": "total", "type": "nominal", "title": "total (nvidia-smi)"},
            ],
        },
    }
    totals = {
        "data": {"values": data["totals"]},
        "mark": {"type": "point", "filled": True, "size": 18, "color": "#333", "clip": True},
        "encoding": {
            "x": x,
            "y": {"field": "gib", "type": "quantitative"},
            "tooltip": [
                {"field": "x", "type": "quantitative", "title": title},
                {"field": "gib", "type": "quantitative", "format": ".2f", "title": "total GiB"},
            ],
        },
    }
    return [areas, totals]


def _current_layers(current: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The current point: a dashed rule and a diamond."""
    cur = dict(current, label=f"current: {current['x']}")
    rule = {
        "data": {"values": [cur]},
        "mark": {"type": "rule", "strokeDash": [4, 3], "color": "#111"},
        "encoding": {"x": {"field": "x", "type": "quantitative"}},
    }
    point = {
        "data": {"values": [cur]},
        "mark": {"type": "point", "shape": "diamond", "size": 120, "filled": True, "color": "#111"},
        "encoding": {
            "x": {"field": "x", "type": "quantitative"},
            "y": {"field": "gib", "type": "quantitative"},
            "tooltip": [
                {"field": "label", "type": "nominal", "title": "current"},
                {"field": "gib", "type": "quantitative", "format": ".2f", "title": "GiB"},
            ],
        },
    }
    return [rule, point]


def _crossing_layers(at: float, stops: Sequence[int]) -> list[dict[str, Any]]:
    """Where the total exceeds the GPU: a rule and its label, on the roomier side (the x axis is log-scale)."""
    left_half = math.log(max(at, stops[0]) / stops[0]) < 0.5 * math.log(stops[-1] / stops[0])
    mark = {
        "x": at,
        "label": f"exceeds the GPU at ≈{at:,.0f}" if at >= 10 else f"exceeds the GPU at ≈{at:g}",
    }
    rule = {
        "data": {"values": [mark]},
        "mark": {"type": "rule", "color": CAPACITY_COLOR, "strokeDash": [2, 2], "strokeWidth": 2},
        "encoding": {
            "x": {"field": "x", "type": "quantitative"},
            "tooltip": [{"field": "label", "type": "nominal", "title": "crossing"}],
        },
    }
    text = {
        "data": {"values": [mark]},
        "mark": {
            "type": "text",
            "align": "left" if left_half else "right",
            "baseline": "top",
            "dx": 3 if left_half else -3,
            "dy": 3,
            "angle": 0,
            "color": CAPACITY_COLOR,
        },
        "encoding": {
            "x": {"field": "x", "type": "quantitative"},
            "y": {"value": 0},
            "text": {"field": "label"},
        },
    }
    return [rule, text]


def _scaling_panel(data: Mapping[str, Any], headroom: float, gpu_name: str) -> dict[str, Any]:
    """One layered panel: stacked areas per category vs a log axis, capacity, current point, crossing."""
    axis = data["axis"]
    title = str(AXIS_TITLES.get(axis, axis))
    x = _x_encoding(axis, title, data["stops"])
    band, rule, rule_label = capacity_layers(data["capacity_bytes"], headroom, gpu_name)
    layers: list[dict[str, Any]] = [band, rule]
    layers += _curve_layers(data, x, title)
    layers += _current_layers(data["current"])
    cross = data["crosses_capacity"]
    if cross["at"] is not None:
        layers += _crossing_layers(cross["at"], data["stops"])
    layers.append(rule_label)
    return {"title": f"memory vs {title}", "width": 260, "height": 220, "layer": layers}


def scaling_spec(
    data: Mapping[str, Any], headroom: float = DEFAULT_HEADROOM, gpu_name: str = "GPU"
) -> dict[str, Any]:
    """Vega-Lite spec: side-by-side panels of memory against micro-batch and sequence length."""
    panels = []
    notes = []
    for axis in ("micro_batch_size", "seq_len"):
        d = data.get(axis)
        if not d:
            continue
        if d.get("fixed"):
            notes.append(f"sequence length is fixed by the model ({d['fixed']} tokens)")
            continue
        if not d["totals"]:
            notes.append(f"no valid {AXIS_TITLES[axis]} stop")
            continue
        panels.append(_scaling_panel(d, headroom, gpu_name))
    spec: dict[str, Any] = {"$schema": SCHEMA, "hconcat": panels, "resolve": {"scale": {"color": "shared"}}}
    if notes:
        spec["title"] = {"text": "how it scales", "subtitle": notes}
    return spec


# ----- Altair wrappers -----------------------------------------------------------------------------------
def to_altair(spec: Mapping[str, Any]) -> alt.Chart | alt.LayerChart | alt.HConcatChart | alt.VConcatChart:
    """Wrap a Vega-Lite dict as Altair chart objects without Altair's slow ``from_dict`` (no validation here)."""
    import altair as alt

    rest = {k: v for k, v in spec.items() if k not in ("$schema", "layer", "hconcat", "vconcat")}
    if "layer" in spec:
        return alt.LayerChart(layer=[to_altair(s) for s in spec["layer"]], **rest)
    if "hconcat" in spec:
        return alt.HConcatChart(hconcat=[to_altair(s) for s in spec["hconcat"]], **rest)
    if "vconcat" in spec:
        return alt.VConcatChart(vconcat=[to_altair(s) for s in spec["vconcat"]], **rest)
    if isinstance(rest.get("encoding"), Mapping):
        rest["encoding"] = alt.FacetedEncoding(**rest["encoding"])
    return alt.Chart(**rest)


def breakdown_chart(est: Estimate, headroom: float = DEFAULT_HEADROOM) -> alt.LayerChart:
    """Altair chart: stacked category bars per rank against the GPU capacity line and headroom band."""
    return to_altair(breakdown_spec(est, headroom))  # type: ignore[return-value]


def scaling_chart(est: Estimate, headroom: float = DEFAULT_HEADROOM) -> alt.HConcatChart:
    """Altair chart: memory against micro-batch and sequence length, current point and crossing marked."""
    return to_altair(scaling_spec(scaling_data(est, headroom), headroom, est.gpu.name))  # type: ignore[return-value]
