"""The chart of a ``Comparison``: the memory breakdown chart with one bar per scenario, and the step times below.

The memory part is ``charts.breakdown_spec`` fed each scenario's worst rank under the scenario's name (so the
bars, tooltips, totals and the capacity line are the breakdown chart's own); the time part takes its marks and
colours from ``charts.times.time_spec``, one bar per scenario.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from memsim_widget.charts import breakdown_spec
from memsim_widget.charts.parts import CAPACITY_COLOR, SCHEMA
from memsim_widget.charts.times import time_spec
from memsim_widget.engine.estimate import Estimate
from memsim_widget.engine.speed.step_time import TIME_CATEGORIES
from memsim_widget.units import GiB

#: Pixels per scenario bar in the memory part (names such as ``method=qlora`` need more than a rank label).
BAR_STEP = 110


class Compared(Protocol):
    """What the chart reads of a comparison (``comparison.Comparison`` is one): the chart depends on this shape,
    not on the comparison module, which draws its chart through this one."""

    @property
    def estimates(self) -> Sequence[Estimate]: ...
    @property
    def names(self) -> Sequence[str]: ...
    @property
    def headroom(self) -> float: ...
    @property
    def differences(self) -> Mapping[str, Any]: ...


def memory_records(cmp: Compared) -> list[dict[str, Any]]:
    """Each scenario's worst-rank rows at its peak, with the scenario's name as the rank and its index as stage."""
    out = []
    for i, (name, est) in enumerate(zip(cmp.names, cmp.estimates, strict=True)):
        worst = est.worst.label
        out.extend({**r, "rank": name, "stage": i} for r in est.rows() if r["rank"] == worst)
    return out


def _capacity_ticks(cmp: Compared, x: dict[str, Any]) -> dict[str, Any]:
    """One capacity tick per bar, for scenarios on GPUs of different sizes (one line would be wrong)."""
    rows = [
        {
            "rank": n,
            "gib": round(e.gpu.memory_bytes / GiB, 4),
            "label": f"{e.gpu.name}: {e.gpu.memory_bytes / GiB:.1f} GiB",
        }
        for n, e in zip(cmp.names, cmp.estimates, strict=True)
    ]
    return {
        "data": {"values": rows},
        "mark": {"type": "tick", "color": CAPACITY_COLOR, "thickness": 3},
        "encoding": {
            "x": x,
            "y": {"field": "gib", "type": "quantitative"},
            "tooltip": [{"field": "label", "type": "nominal", "title": "GPU capacity"}],
        },
    }


def memory_spec(cmp: Compared) -> dict[str, Any]:
    """The breakdown chart of the scenarios' worst ranks side by side, against their GPU capacity."""
    caps = {e.gpu.memory_bytes for e in cmp.estimates}
    gpus = dict.fromkeys(e.gpu.name for e in cmp.estimates)
    spec = breakdown_spec(
        memory_records(cmp),
        cmp.headroom,
        capacity_bytes=max(caps),
        gpu_name=" / ".join(gpus),
        title="memory per GPU at the peak (worst rank)",
    )
    spec.pop("$schema")
    band, rule, bars, labels, rule_label = spec["layer"]
    if len(caps) > 1:
        spec["layer"] = [bars, labels, _capacity_ticks(cmp, bars["encoding"]["x"])]
    for tip in bars["encoding"]["tooltip"]:
        if tip["field"] == "rank":
            tip["title"] = "scenario"
    spec["width"] = BAR_STEP * len(cmp.names)
    return spec


def step_time_spec(cmp: Compared) -> dict[str, Any]:
    """One stacked bar of modelled step time per scenario, labelled with seconds, tokens/s and MFU."""
    base = time_spec(cmp.estimates[0])
    rows, totals = [], []
    for name, est in zip(cmp.names, cmp.estimates, strict=True):
        rows.extend(
            {**r, "scenario": name, "order": TIME_CATEGORIES.index(r["category"])} for r in est.time_rows()
        )
        totals.append(
            {
                "scenario": name,
                "seconds": est.step_time_s,
                "label": f"{est.step_time_s:.3g} s, {est.tokens_per_second_per_gpu:,.0f} tok/s/GPU, MFU {est.mfu:.0%}",
            }
        )
    y = {"field": "scenario", "type": "nominal", "title": None, "sort": list(cmp.names)}
    encoding = dict(base["encoding"])
    encoding["tooltip"] = [{"field": "scenario", "type": "nominal"}, *encoding["tooltip"]]
    return {
        "title": "step time (modelled)",
        "width": max(300, BAR_STEP * len(cmp.names)),
        "height": {"step": 26},
        "layer": [
            {"data": {"values": rows}, "mark": base["mark"], "encoding": {**encoding, "y": y}},
            {
                "data": {"values": totals},
                "mark": {"type": "text", "align": "left", "dx": 4, "fontSize": 11},
                "encoding": {
                    "y": y,
                    "x": {"field": "seconds", "type": "quantitative"},
                    "text": {"field": "label"},
                },
            },
        ],
    }


def compare_spec(cmp: Compared) -> dict[str, Any]:
    """Vega-Lite spec: the memory bars side by side above the step-time bars; the title names what differs."""
    differs = ", ".join(cmp.differences) or "nothing (the scenarios are the same)"
    return {
        "$schema": SCHEMA,
        "title": {"text": f"{len(cmp.names)} scenarios compared", "subtitle": f"differs: {differs}"},
        "vconcat": [memory_spec(cmp), step_time_spec(cmp)],
        "resolve": {"scale": {"color": "independent"}},
    }
