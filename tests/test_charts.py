"""Chart specs: capacity rule, headroom band, one bar per rank, categories, tooltips with formulas, scaling."""

from __future__ import annotations

from typing import Any

import pytest

from memsim_widget import charts
from memsim_widget.engine.core import estimate
from memsim_widget.engine.items import CATEGORIES
from memsim_widget.scenario import Scenario

GiB = 1024**3


def _layer(spec: dict[str, Any], mark: str) -> list[dict[str, Any]]:
    """Layers of ``spec`` with the given mark type."""
    return [lay for lay in spec["layer"] if lay["mark"]["type"] == mark]


@pytest.fixture(scope="module")
def est_pp4() -> Any:
    """A 4-stage pipeline estimate (4 ranks)."""
    return estimate(Scenario(model="llama-3.2-1b", parallel={"pp": 4, "pp_microbatches": 4}))


def test_breakdown_has_capacity_rule_and_headroom_band(est_pp4: Any) -> None:
    spec = charts.breakdown_spec(est_pp4, headroom=0.2)
    cap = est_pp4.gpu.memory_bytes / GiB
    (rule,) = _layer(spec, "rule")
    assert rule["data"]["values"][0]["gib"] == pytest.approx(cap, abs=1e-3)
    assert rule["encoding"]["y"]["field"] == "gib"
    (band,) = _layer(spec, "rect")
    values = band["data"]["values"][0]
    assert values["hi"] == pytest.approx(cap, abs=1e-3)
    assert values["lo"] == pytest.approx(cap * 0.8, abs=1e-3)
    texts = [t["data"]["values"][0].get("label", "") for t in _layer(spec, "text")]
    assert any(est_pp4.gpu.name in t for t in texts), "capacity line is labelled with the GPU"


def test_breakdown_one_bar_per_rank_with_categories(est_pp4: Any) -> None:
    spec = charts.breakdown_spec(est_pp4)
    (bars,) = _layer(spec, "bar")
    records = bars["data"]["values"]
    labels = [r.label for r in est_pp4.ranks]
    assert len(labels) == 4
    assert sorted({r["rank"] for r in records}) == sorted(labels)
    assert bars["encoding"]["x"]["field"] == "rank"
    assert bars["encoding"]["x"]["sort"] == labels
    assert bars["encoding"]["y"]["stack"] == "zero"
    color = bars["encoding"]["color"]
    assert color["field"] == "category"
    assert color["scale"]["domain"] == list(CATEGORIES)
    assert {r["category"] for r in records} <= set(CATEGORIES)
    assert {"parameters", "overhead"} <= {r["category"] for r in records}
    for rank in est_pp4.ranks:
        total = sum(r["bytes"] for r in records if r["rank"] == rank.label)
        assert total == rank.device_total_bytes, "segments of a bar add up to the rank's nvidia-smi total"
    totals = [lay for lay in _layer(spec, "text") if lay["encoding"].get("x")]
    assert len(totals[0]["data"]["values"]) == 4


def test_breakdown_tooltips_carry_bytes_share_and_formula(est_pp4: Any) -> None:
    (bars,) = _layer(charts.breakdown_spec(est_pp4), "bar")
    fields = {t["field"] for t in bars["encoding"]["tooltip"]}
    assert {"rank", "category", "item", "size", "share", "formula", "counter"} <= fields
    share = next(t for t in bars["encoding"]["tooltip"] if t["field"] == "share")
    assert share["format"] == ".1%"
    rec = next(r for r in bars["data"]["values"] if r["category"] == "parameters")
    assert " x " in rec["formula"] and rec["formula"].endswith(rec["size"])
    assert any(ch.isdigit() for ch in rec["formula"])
    for rank in est_pp4.ranks:
        shares = sum(r["share"] for r in bars["data"]["values"] if r["rank"] == rank.label)
        assert shares == pytest.approx(1.0, abs=1e-3)


def test_breakdown_from_frame_matches_estimate(est_pp4: Any) -> None:
    from_est = charts.breakdown_spec(est_pp4)
    from_frame = charts.breakdown_spec(
        est_pp4.frame,
        capacity_bytes=est_pp4.gpu.memory_bytes,
        gpu_name=est_pp4.gpu.name,
        title=from_est["title"],
    )
    # an Estimate also says what each rank holds (the tooltip's "holds"); a frame has no such column
    est_values = [
        {k: v for k, v in r.items() if k != "role"} for r in _layer(from_est, "bar")[0]["data"]["values"]
    ]
    assert _layer(from_frame, "bar")[0]["data"]["values"] == est_values
    with pytest.raises(ValueError, match="capacity"):
        charts.breakdown_spec(est_pp4.frame)


@pytest.mark.parametrize(
    "scenario",
    [
        Scenario(),
        Scenario(model="llama-3.2-1b", parallel={"pp": 4, "pp_microbatches": 4}),
        Scenario(model="vit-base-patch16-224", micro_batch_size=64),
        Scenario(model="mixtral-8x7b", parallel={"dp": 8, "ep": 8, "zero": 3}, gpu={"memory_gib": 24}),
        Scenario(model="gpt2", seq_len=1024, method="lora", lora={"targets": ["c_attn"]}),
    ],
    ids=["default", "pp4", "vit", "mixtral-custom-gpu", "gpt2-lora"],
)
def test_specs_validate_against_vega_lite_schema(scenario: Scenario) -> None:
    est = estimate(scenario)
    charts.to_altair(charts.breakdown_spec(est)).to_dict(validate=True)
    chart = charts.scaling_chart(est)
    chart.to_dict(validate=True)


def test_altair_wrappers_return_altair_charts(est_pp4: Any) -> None:
    import altair as alt

    assert isinstance(charts.breakdown_chart(est_pp4), alt.LayerChart)
    assert isinstance(charts.scaling_chart(est_pp4), alt.HConcatChart)


def test_scaling_points_cover_stops_and_mark_current_point() -> None:
    est = estimate(Scenario(model="llama-3.2-1b", micro_batch_size=4, seq_len=1024))
    data = charts.scaling_data(est)
    mb = data["micro_batch_size"]
    assert [t["x"] for t in mb["totals"]] == list(charts.MICRO_BATCH_STOPS)
    assert len(mb["points"]) == len(charts.MICRO_BATCH_STOPS) * len(CATEGORIES)
    assert mb["current"]["x"] == 4
    assert mb["current"]["bytes"] == est.device_total_bytes
    at4 = next(t for t in mb["totals"] if t["x"] == 4)
    assert at4["bytes"] == est.device_total_bytes
    assert data["seq_len"]["current"]["x"] == 1024
    gib = [t["gib"] for t in mb["totals"]]
    assert gib == sorted(gib), "memory grows with the micro-batch"
    spec = charts.scaling_spec(data, 0.1, est.gpu.name)
    assert len(spec["hconcat"]) == 2
    panel = spec["hconcat"][0]
    (area,) = _layer(panel, "area")
    assert area["encoding"]["x"]["scale"]["type"] == "log"
    assert area["encoding"]["color"]["scale"]["domain"] == list(CATEGORIES)
    (cap_rule,) = [
        lay
        for lay in _layer(panel, "rule")
        if "gib" in lay["data"]["values"][0] and "note" in lay["data"]["values"][0]
    ]
    assert cap_rule["data"]["values"][0]["gib"] == pytest.approx(est.gpu.memory_bytes / GiB, abs=1e-3)
    current = [lay for lay in _layer(panel, "point") if lay["mark"].get("shape") == "diamond"]
    assert current[0]["data"]["values"][0]["x"] == 4


def test_scaling_marks_where_memory_crosses_capacity() -> None:
    est = estimate(Scenario(model="llama-3.1-8b", gpu="a10"))
    data = charts.scaling_data(est)
    cross = data["micro_batch_size"]["crosses_capacity"]
    assert cross["at"] is not None
    spec = charts.scaling_spec(data, 0.1, est.gpu.name)
    labels = [t["data"]["values"][0].get("label", "") for t in _layer(spec["hconcat"][0], "text")]
    assert any(lbl.startswith("exceeds the GPU") for lbl in labels)


def test_crossing_interpolates_between_stops() -> None:
    totals = [{"x": 1, "bytes": 10}, {"x": 2, "bytes": 20}, {"x": 4, "bytes": 40}, {"x": 8, "bytes": 80}]
    assert charts.crossing(totals, 30) == {"max_fit": 2, "first_over": 4, "at": 3.0}
    assert charts.crossing(totals, 100) == {"max_fit": 8, "first_over": None, "at": None}
    assert charts.crossing(totals, 5) == {"max_fit": None, "first_over": 1, "at": 1}


def test_scaling_skips_invalid_stops_and_fixed_sequences() -> None:
    est = estimate(Scenario(model="llama-3.2-1b", seq_len=3072, parallel={"cp": 3, "dp": 1}))
    data = charts.scaling_data(est)
    seq = data["seq_len"]
    assert not seq["totals"] and len(seq["invalid"]) == len(charts.SEQ_LEN_STOPS)
    assert "parallel.cp" in seq["invalid"][0]["error"]
    spec = charts.scaling_spec(data)
    assert len(spec["hconcat"]) == 1
    assert "no valid sequence length stop" in spec["title"]["subtitle"]

    vit = estimate(Scenario(model="vit-base-patch16-224"))
    vdata = charts.scaling_data(vit)
    assert vdata["seq_len"] == {"axis": "seq_len", "fixed": 197}
    assert "fixed by the model (197 tokens)" in charts.scaling_spec(vdata)["title"]["subtitle"][0]


def test_labels_for_inline_model_and_gpu() -> None:
    assert charts.model_label({"model_type": "llama"}) == "custom llama"
    assert charts.gpu_label({"memory_gib": 24}) == "custom 24 GiB"
    assert charts.gpu_label("a10") == "a10"


def test_chart_saves_svg(tmp_path: Any, est_pp4: Any) -> None:
    path = tmp_path / "breakdown.svg"
    charts.breakdown_chart(est_pp4).save(str(path))
    text = path.read_text()
    assert text.startswith("<svg") and "stage 3" in text
