"""Trace charts: the timeline keeps the peak when downsampled; the comparison shows both sources."""

from __future__ import annotations

from memsim_widget.charts.trace import comparison_spec, timeline_spec

GiB = 1024**3


def report(n: int = 5000, peak_at: int = 3217) -> dict:
    timeline = [
        {"op_index": i, "step": 1 + i // 2500, "phase": "backward", "live_bytes": i * 10} for i in range(n)
    ]
    timeline[peak_at]["live_bytes"] = 10**9
    return {
        "timeline": timeline,
        "peak_tensor_bytes": 10**9,
        "peak_phase": "backward",
        "components": {"parameters": GiB, "activations": 2 * GiB},
        "simulated": {"components": {"parameters": GiB, "temporaries": GiB}},
    }


def test_timeline_is_downsampled_but_keeps_the_peak_and_marks_it():
    spec = timeline_spec(report(), max_points=300)
    area, rule = spec["layer"]
    values = area["data"]["values"]
    assert len(values) <= 300
    assert max(v["gib"] for v in values) == round(10**9 / GiB, 6)
    assert rule["mark"]["type"] == "rule" and rule["data"]["values"][0]["gib"] == 10**9 / GiB


def test_comparison_has_every_category_from_both_sources():
    rows = comparison_spec(report())["data"]["values"]
    cats = {(r["category"], r["source"]) for r in rows}
    assert cats == {
        (c, s) for c in ("activations", "parameters", "temporaries") for s in ("traced", "simulated")
    }
    assert {r["gib"] for r in rows if r["category"] == "activations" and r["source"] == "traced"} == {2.0}
