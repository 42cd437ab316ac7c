"""``memsim_widget.compare``: scenarios side by side, with the numbers of their own estimates and what differs."""

from __future__ import annotations

from typing import Any

import pytest

import memsim_widget
from memsim_widget import Scenario, ScenarioError, compare, estimate
from memsim_widget.catalog.gpus import GPUS
from memsim_widget.charts import CATEGORIES
from memsim_widget.comparison import Comparison

GiB = 1024**3
#: The A100 40GB as total_memory reports it (deviceQuery, catalog/gpus.json): the capacity the charts mark.
A100_40GB = GPUS["a100-40gb"].memory_bytes
BASE = {"model": "llama-3.2-1b", "gpu": "a100-40gb", "seq_len": 1024}
FULL = dict(BASE)
LORA = {**BASE, "method": "lora", "lora": {"rank": 8}}
QLORA = {**BASE, "method": "qlora", "lora": {"rank": 8}}


def test_the_package_exports_compare_and_comparison() -> None:
    assert memsim_widget.compare is compare
    assert isinstance(compare([FULL, LORA]), memsim_widget.Comparison)


def test_frame_holds_each_estimates_own_bytes_per_category_and_headline() -> None:
    cmp = compare([FULL, LORA, QLORA], names=["full", "LoRA", "QLoRA"], headroom=0.2)
    frame = cmp.frame
    assert list(frame["scenario"].unique()) == ["full", "LoRA", "QLoRA"]
    for name, data in zip(["full", "LoRA", "QLoRA"], [FULL, LORA, QLORA], strict=True):
        est = estimate(Scenario.from_dict(data))
        rows = frame[frame["scenario"] == name].set_index("category")
        assert list(rows.index) == list(CATEGORIES)
        for category, nbytes in est.components().items():
            assert rows.loc[category, "bytes"] == nbytes
            assert rows.loc[category, "gib"] == pytest.approx(nbytes / GiB)
        assert rows["bytes"].sum() == est.device_total_bytes
        assert rows["share"].sum() == pytest.approx(1.0)
        assert set(rows["device_total_bytes"]) == {est.device_total_bytes}
        assert set(rows["step_time_s"]) == {est.step_time_s}
        assert set(rows["tokens_per_second_per_gpu"]) == {est.tokens_per_second_per_gpu}
        assert set(rows["mfu"]) == {est.mfu}
        assert set(rows["fits"]) == {est.fits(headroom=0.2)}
        assert set(rows["verdict"]) == {est.verdict(0.2)}
        assert set(rows["gpu_memory_bytes"]) == {
            A100_40GB
        }  # the card as the driver reports it, not the label


def test_totals_is_one_row_per_scenario() -> None:
    cmp = compare([FULL, LORA], names=["a", "b"])
    totals = cmp.totals.set_index("scenario")
    lora = estimate(Scenario.from_dict(LORA))
    assert list(totals.index) == ["a", "b"]
    assert totals.loc["b", "device_total_bytes"] == lora.device_total_bytes
    assert totals.loc["b", "peak_allocated_bytes"] == lora.peak_allocated_bytes
    assert totals.loc["b", "peak_phase"] == lora.peak_phase
    assert totals.loc["b", "gpu"] == "NVIDIA A100 40GB"


def test_estimates_are_taken_as_they_are() -> None:
    a, b = estimate(Scenario.from_dict(FULL)), estimate(Scenario.from_dict(LORA))
    cmp = compare([a, b])
    assert cmp.estimates[0] is a and cmp.estimates[1] is b


def test_differences_name_every_differing_field_with_its_value_per_scenario() -> None:
    cmp = compare([FULL, LORA, {**LORA, "micro_batch_size": 4}], names=["x", "y", "z"])
    assert cmp.differences == {
        "method": {"x": "full", "y": "lora", "z": "lora"},
        "lora.rank": {"x": 16, "y": 8, "z": 8},
        "micro_batch_size": {"x": 1, "y": 1, "z": 4},
    }


def test_differences_reach_into_a_custom_model_and_the_parallel_layout() -> None:
    custom = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
              "intermediate_size": 1024, "vocab_size": 1000}  # fmt: skip
    a = {"model": custom, "gpu": "a100-40gb", "parallel": {"dp": 2}}
    b = {"model": {**custom, "num_hidden_layers": 8}, "gpu": "a100-40gb", "parallel": {"dp": 2, "zero": 3}}
    diffs = compare([a, b], names=["a", "b"]).differences
    assert diffs == {"model.num_hidden_layers": {"a": 4, "b": 8}, "parallel.zero": {"a": 0, "b": 3}}


def test_default_names_say_what_differs() -> None:
    assert compare([FULL, LORA]).names == ("method=full, lora.rank=16", "method=lora, lora.rank=8")
    assert compare([FULL, {**FULL, "gpu": "h100-sxm-80gb"}]).names == ("gpu=a100-40gb", "gpu=h100-sxm-80gb")
    on = {**FULL, "optimizer_in_backward": True}
    assert compare([FULL, on]).names == ("optimizer_in_backward=off", "optimizer_in_backward=on")


def test_same_scenarios_compare_with_no_differences_and_numbered_names() -> None:
    cmp = compare([FULL, Scenario.from_dict(FULL)])
    assert cmp.differences == {}
    assert cmp.names == ("scenario 1", "scenario 2")
    assert "differs: none" in repr(cmp)


def test_names_colliding_on_the_first_fields_fall_back_to_numbers() -> None:
    a = {**FULL, "method": "lora", "micro_batch_size": 1, "seq_len": 512}
    b = {**FULL, "method": "lora", "micro_batch_size": 2, "seq_len": 512}
    c = {**FULL, "method": "lora", "micro_batch_size": 2, "seq_len": 1024}
    # the first two differing fields (micro_batch_size, seq_len) tell all three apart ...
    assert compare([a, b, c]).names == (
        "micro_batch_size=1, seq_len=512",
        "micro_batch_size=2, seq_len=512",
        "micro_batch_size=2, seq_len=1024",
    )
    # ... but when the first two (method, precision) are equal in two scenarios, the names would collide
    d = {**FULL, "micro_batch_size": 1}
    e = {**FULL, "micro_batch_size": 2}
    f = {**FULL, "method": "lora", "precision": "fp32"}
    assert compare([d, e, f]).names == ("scenario 1", "scenario 2", "scenario 3")


@pytest.mark.parametrize("count", [0, 1, 5])
def test_two_to_four_scenarios(count: int) -> None:
    with pytest.raises(ScenarioError, match=rf"^scenarios: compare takes 2 to 4 scenarios, got {count}$"):
        compare([FULL] * count)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["a"], "names: must name each of the 2 scenarios, got 1 names"),
        (["a", "a"], "names: must be distinct"),
        (["a", ""], "names: each name must be a non-empty string"),
        ("ab", "names: must be a list of 2 strings, got str"),
    ],
)
def test_bad_names_are_rejected(names: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match="^" + message):
        compare([FULL, LORA], names=names)


def test_bad_scenarios_name_their_position_and_field() -> None:
    with pytest.raises(ScenarioError, match=r"^scenarios\[1\]\.micro_batch_size: "):
        compare([FULL, {**FULL, "micro_batch_size": 0}])
    with pytest.raises(
        ScenarioError, match=r"^scenarios\[0\]: must be a Scenario, a scenario dict or an Estimate"
    ):
        compare(["llama-3.2-1b", FULL])
    with pytest.raises(ScenarioError, match=r"^scenarios: must be a list"):
        compare(Scenario())  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match=r"^headroom: "):
        compare([FULL, LORA], headroom=1.5)


def _layer(spec: dict[str, Any], mark: str) -> list[dict[str, Any]]:
    """The layers of a layered spec drawing ``mark``."""
    return [
        x for x in spec["layer"] if (x["mark"]["type"] if isinstance(x["mark"], dict) else x["mark"]) == mark
    ]


def test_chart_puts_each_scenarios_worst_rank_side_by_side_under_one_capacity_line() -> None:
    cmp = compare([FULL, LORA, {**LORA, "parallel": {"pp": 2}}], names=["full", "lora", "lora pp2"])
    memory, time = cmp.spec()["vconcat"]
    (bars,) = [x for x in _layer(memory, "bar")]
    by_name: dict[str, int] = {}
    for r in bars["data"]["values"]:
        by_name[r["rank"]] = by_name.get(r["rank"], 0) + r["bytes"]
    assert by_name == {n: e.device_total_bytes for n, e in zip(cmp.names, cmp.estimates, strict=True)}
    assert bars["encoding"]["x"]["sort"] == ["full", "lora", "lora pp2"]
    (rule,) = _layer(memory, "rule")
    assert rule["data"]["values"][0]["gib"] == round(A100_40GB / GiB, 4)
    totals: dict[str, float] = {}
    (time_bars,) = _layer(time, "bar")
    for r in time_bars["data"]["values"]:
        totals[r["scenario"]] = totals.get(r["scenario"], 0.0) + r["seconds"]
    for name, est in zip(cmp.names, cmp.estimates, strict=True):
        assert totals[name] == pytest.approx(est.step_time_s)
    assert cmp.spec()["title"]["subtitle"] == "differs: method, lora.rank, parallel.pp, num_gpus"


def test_chart_marks_each_gpus_capacity_when_the_gpus_differ() -> None:
    cmp = compare([FULL, {**FULL, "gpu": "h100-sxm-80gb"}])
    memory = cmp.spec()["vconcat"][0]
    assert _layer(memory, "rule") == []
    (ticks,) = _layer(memory, "tick")
    assert [(t["rank"], t["gib"]) for t in ticks["data"]["values"]] == [
        ("gpu=a100-40gb", round(A100_40GB / GiB, 4)),
        ("gpu=h100-sxm-80gb", round(GPUS["h100-sxm-80gb"].memory_bytes / GiB, 4)),
    ]


def test_chart_is_valid_altair_and_the_reprs_read_well() -> None:
    cmp = compare([FULL, LORA], names=["full", "LoRA"])
    assert cmp.chart().to_dict()["vconcat"]  # Altair validates the spec against the Vega-Lite schema
    text = repr(cmp)
    assert text.startswith("Comparison of 2 scenarios (headroom 10%):\n  full: ")
    assert text.endswith("differs: method, lora.rank")
    html = cmp._repr_html_()
    assert (
        "<th>full</th><th>LoRA</th>" in html
        and "<th>lora.rank</th><td><b>16</b></td><td><b>8</b></td>" in html
    )
    assert isinstance(cmp, Comparison)
