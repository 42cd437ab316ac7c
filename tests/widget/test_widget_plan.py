"""The widget's "Make it fit" panel and "Layouts" search, from the Python side: traits, messages, API.

Run ``python tests/widget/test_widget_plan.py --write-js-fixture`` to refresh ``tests/js/fixtures/plan.json`` (the
``fit`` and ``layouts`` traits the node tests render) after their layout changes.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.plan import Recommendation, plan, recommend
from memsim_widget.scenario import Scenario
from memsim_widget.widget import (
    LAYOUT_ROWS,
    MemSim,
    build_fit_view,
    build_layouts_view,
    fit_panel,
    fit_target,
    layouts_panel,
    layouts_stale_keys,
)
from memsim_widget.widget.layouts_panel import layout_is_current, mark_current

ROOT = Path(__file__).resolve().parents[2]
PLAN_FIXTURE = ROOT / "tests" / "js" / "fixtures" / "plan.json"
#: Full bf16 fine-tuning of an 8B model at 4096 tokens: far over an A100 40GB.
TOO_BIG = {
    "model": "llama-3.1-8b",
    "method": "full",
    "precision": "bf16",
    "gpu": "a100-40gb",
    "seq_len": 4096,
}
#: The same model with QLoRA on an 80 GB card: fits with room to spare.
ROOMY = {"model": "llama-3.1-8b", "method": "qlora", "gpu": "h100-sxm-80gb", "seq_len": 1024}


def make(*args: Any, **kwargs: Any) -> MemSim:
    """A widget without the vega-embed bundle (the Python side does not need it)."""
    return MemSim(*args, charts_js=False, **kwargs)


def wait_for(cond: Callable[[], bool], timeout: float = 120) -> None:
    """Poll until ``cond()`` holds (fails after ``timeout`` seconds: a guard against a hang, not a timing; a
    search on a loaded two-core machine can take tens of seconds)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def fit_ready(sim: MemSim) -> bool:
    """The panel shows the recommendations of the current scenario."""
    return sim.fit["state"] == "done" and not sim.fit["stale"]


def open_panel(sim: MemSim) -> None:
    """What the front end's toggle does (a state write), then wait for the current recommendations."""
    sim.set_state({"fit_open": True})
    wait_for(lambda: fit_ready(sim))


def send(sim: MemSim, content: dict[str, Any]) -> None:
    """A custom message from the front end."""
    sim._handle_custom_msg(content, [])


class CountingRecommend:
    """Wraps ``plan.recommend``: counts calls and can wait on ``gate`` or raise ``fail`` first."""

    def __init__(self, fail: Exception | None = None, gate: threading.Event | None = None) -> None:
        """Record calls; raise ``fail`` when given; block until ``gate`` is set when given."""
        self.calls: list[Scenario] = []
        self.fail, self.gate = fail, gate

    def __call__(self, sc: Scenario, headroom: float = 0.1) -> Recommendation:
        """Record, maybe wait or fail, else recommend for real."""
        self.calls.append(sc)
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        return recommend(sc, headroom=headroom)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingRecommend:
    """Count the widget's recommendation runs."""
    fake = CountingRecommend()
    monkeypatch.setattr(fit_panel, "plan_recommend", fake)
    return fake


# ----- make it fit -------------------------------------------------------------------------------------------
def test_nothing_is_computed_while_the_panel_is_closed(counting: CountingRecommend) -> None:
    sim = make(**TOO_BIG)
    for mb in (2, 4, 1):
        sim.set(micro_batch_size=mb)
    sim.headroom = 0.2
    assert counting.calls == []
    assert sim.fit["state"] == "idle" and sim.fit["view"] is None and not sim.fit_open


def test_open_panel_lists_fixes_and_apply_makes_it_fit(counting: CountingRecommend) -> None:
    sim = make(**TOO_BIG)
    assert sim.result["verdict"] == "does not fit"
    before = sim.scenario
    open_panel(sim)
    view = sim.fit["view"]
    assert view["fits"] is False and view["verdict"] == "does not fit"
    assert view["scenario"] == sim.scenario.to_dict() and len(counting.calls) == 1
    rec = recommend(before, headroom=sim.headroom)
    assert [c["label"] for c in view["changes"]] == [c.label for c in rec.changes]
    first = view["changes"][0]
    assert first["fits"] and first["saved_gib"] > 0 and first["cost"]
    assert first["saved_bytes"] == rec.changes[0].saved_bytes
    assert isinstance(sim.fit["ms"], float)

    send(sim, {"type": "fit_apply", "kind": "change", "index": 0, "id": sim.fit["id"]})
    assert sim.scenario == rec.changes[0].scenario != before
    assert sim.scenario_data == rec.changes[0].scenario.to_dict()
    assert sim.result["verdict"] == "fits" and sim.error == ""
    assert estimate(sim.scenario).device_total_bytes == sim.result["peaks"][0]["bytes"]
    # The open panel follows: the fixed scenario fits, so it shows how far it goes and the single levers.
    wait_for(lambda: fit_ready(sim))
    view = sim.fit["view"]
    assert view["fits"] is True and view["changes"] == []
    assert view["max_micro_batch"] >= 1 and view["max_seq_len"] >= sim.scenario.seq_len
    assert view["levers"] and all("saved_gib" in lever for lever in view["levers"])


def test_recommendations_follow_changes_while_open_and_are_cached(counting: CountingRecommend) -> None:
    sim = make(**TOO_BIG)
    open_panel(sim)
    shown = sim.fit["id"]
    sim.set(seq_len=2048)
    assert sim.fit["stale"] or fit_ready(sim), "the old view is marked stale until the new one is in"
    wait_for(lambda: fit_ready(sim) and sim.fit["view"]["scenario"]["seq_len"] == 2048)
    assert sim.fit["id"] > shown and len(counting.calls) == 2
    sim.set(seq_len=4096)  # back: from the cache, at once, without a new run
    assert fit_ready(sim) and sim.fit["view"]["scenario"]["seq_len"] == 4096 and sim.fit["ms"] == 0.0
    assert len(counting.calls) == 2
    sim.headroom = 0.3  # the headroom is an input of its own
    wait_for(lambda: fit_ready(sim) and sim.fit["view"]["headroom"] == 0.3)
    assert len(counting.calls) == 3
    sim.fit_open = False
    sim.set(seq_len=1024)
    assert sim.fit["stale"] and len(counting.calls) == 3, "closed: marked stale, not computed"
    sim.fit_open = True
    wait_for(lambda: fit_ready(sim))
    assert sim.fit["view"]["scenario"]["seq_len"] == 1024 and len(counting.calls) == 4


def test_a_slow_recommendation_does_not_slow_the_update(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    slow = CountingRecommend(gate=gate)
    monkeypatch.setattr(fit_panel, "plan_recommend", slow)
    sim = make(**TOO_BIG)
    sim.fit_open = True
    wait_for(lambda: sim.fit["state"] == "running")
    t0 = time.perf_counter()
    for seq in (1024, 2048, 512):
        sim.set(seq_len=seq)
        assert sim.result["verdict"]  # the ordinary update finished
    assert time.perf_counter() - t0 < 2
    assert sim.fit["state"] == "running" and sim.fit["view"] is None
    gate.set()
    wait_for(lambda: fit_ready(sim))
    assert sim.fit["view"]["scenario"]["seq_len"] == 512, "the worker ends on the newest scenario"
    assert len(slow.calls) <= 3, "intermediate scenarios are skipped while one runs"


def test_apply_of_a_stale_or_unknown_entry_is_refused_in_place(counting: CountingRecommend) -> None:
    sim = make(**TOO_BIG)
    open_panel(sim)
    before, old_id = sim.scenario, sim.fit["id"]
    send(sim, {"type": "fit_apply", "kind": "change", "index": 0, "id": old_id - 1})
    assert sim.scenario == before and "changed since" in sim.fit["error"]
    send(sim, {"type": "fit_apply", "kind": "change", "index": 999, "id": old_id})
    assert sim.scenario == before and "no change number 999" in sim.fit["error"]
    send(sim, {"type": "fit_apply", "kind": "nonsense", "index": 0, "id": old_id})
    assert sim.scenario == before and "kind must be one of" in sim.fit["error"]
    send(sim, {"type": "fit_apply", "kind": "change", "index": 0, "id": old_id})
    assert sim.result["verdict"] == "fits"


def test_a_failing_recommendation_shows_its_error_and_the_widget_keeps_working(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(fit_panel, "plan_recommend", CountingRecommend(fail=RuntimeError("planner broke")))
    sim = make(**TOO_BIG)
    sim.fit_open = True
    wait_for(lambda: sim.fit["state"] == "error")
    assert sim.fit["error"] == "RuntimeError: planner broke" and sim.fit["view"] is None
    sim.set(micro_batch_size=2)
    assert sim.error == "" and sim.scenario.micro_batch_size == 2
    assert sim.result["peaks"][0]["bytes"] == estimate(sim.scenario).device_total_bytes
    monkeypatch.setattr(fit_panel, "plan_recommend", recommend)
    sim.set(micro_batch_size=1)
    wait_for(lambda: fit_ready(sim))
    assert sim.fit["error"] == "" and sim.fit["view"]["changes"]


def test_a_rejected_input_keeps_the_panel_on_the_last_valid_scenario(counting: CountingRecommend) -> None:
    sim = make(**TOO_BIG)
    open_panel(sim)
    sim.scenario_data = {**sim.scenario_data, "parallel": {**sim.scenario_data["parallel"], "tp": 3}}
    assert sim.error and sim.fit["rejected"] and not sim.fit["stale"]
    send(sim, {"type": "fit_apply", "kind": "change", "index": 0, "id": sim.fit["id"]})
    assert sim.error == "" and sim.result["verdict"] == "fits", "applying a fix replaces the rejected input"


def test_python_api_recommend_and_apply() -> None:
    sim = make(**TOO_BIG)
    rec = sim.recommend()
    assert isinstance(rec, Recommendation) and not rec.fits
    assert (
        rec.to_dict()["recommendations"] == recommend(sim.scenario, sim.headroom).to_dict()["recommendations"]
    )
    assert sim.fit["state"] == "done" and sim.fit["view"]["changes"], "shown in the panel too"
    assert sim.recommend() is rec, "cached per scenario and headroom"
    with pytest.raises(ScenarioError, match="no micro-batch fits"):
        sim.apply_recommendation(kind="max_micro_batch")
    assert sim.apply_recommendation(0) is sim
    assert sim.scenario == rec.changes[0].scenario and sim.result["verdict"] == "fits"
    fixed = sim.recommend()
    assert fixed.fits and fixed.max_micro_batch
    sim.apply_recommendation(kind="max_micro_batch")
    assert sim.scenario.micro_batch_size == fixed.max_micro_batch and sim.result["verdict"] != "does not fit"
    with pytest.raises(ScenarioError, match="no change number 0"):
        sim.apply_recommendation(0)  # it fits: there is nothing to fix


def test_fit_target_and_fit_view_are_pure() -> None:
    rec = recommend(Scenario.from_dict(ROOMY))
    assert rec.fits
    view = build_fit_view(rec)
    assert json.loads(json.dumps(view)) == view
    assert view["spare_bytes"] == view["usable_bytes"] - view["device_total_bytes"] > 0
    assert fit_target(rec, "max_seq_len").seq_len == rec.max_seq_len
    assert fit_target(rec, "max_micro_batch").micro_batch_size == rec.max_micro_batch
    assert fit_target(rec, "lever", 0) == rec.singles[0].scenario
    assert fit_target(rec, "min_gpus").parallel.world_size == rec.min_gpus["num_gpus"]
    for kind, index in (("lever", len(rec.singles)), ("lever", True), ("change", 0), ("what", 0)):
        with pytest.raises(ScenarioError):
            fit_target(rec, kind, index)


def test_the_largest_on_the_same_gpus_with_any_layout_is_shown_and_applied() -> None:
    rec = recommend(Scenario.from_dict(ROOMY))
    view = build_fit_view(rec)
    for kind, key in (("max_micro_batch_searched", "micro_batch_size"), ("max_seq_len_searched", "seq_len")):
        r = getattr(rec, kind)
        assert r is not None and view[kind]["value"] == r.value == getattr(r.scenario, key)
        assert "scenario" not in view[kind], "the view carries no scenario: Apply names the entry"
        target = fit_target(rec, kind)
        assert target == r.scenario and target.parallel.world_size == rec.scenario.parallel.world_size
        assert estimate(target).fits(headroom=rec.headroom)
    gone = dataclasses.replace(rec, max_micro_batch_searched=None)
    with pytest.raises(ScenarioError, match="no layout of these GPUs fits"):
        fit_target(gone, "max_micro_batch_searched")
    assert build_fit_view(gone)["max_micro_batch_searched"] is None


def test_the_fewest_gpus_with_any_layout_and_knobs_is_shown_and_applied() -> None:
    rec = recommend(Scenario.from_dict(TOO_BIG))
    r = rec.min_gpus_searched
    view = build_fit_view(rec)["min_gpus_searched"]
    assert r is not None and view["value"] == view["num_gpus"] == r.value and "scenario" not in view
    target = fit_target(rec, "min_gpus_searched")
    assert target == r.scenario and target.parallel.world_size == r.value
    assert (target.model, target.method, target.seq_len) == (rec.scenario.model, rec.scenario.method,
                                                             rec.scenario.seq_len)  # fmt: skip
    assert estimate(target).fits(headroom=rec.headroom)
    with pytest.raises(ScenarioError, match="no layout of any number of GPUs searched fits"):
        fit_target(dataclasses.replace(rec, min_gpus_searched=None), "min_gpus_searched")


# ----- layouts -----------------------------------------------------------------------------------------------
def test_layouts_run_on_request_in_the_background_and_apply() -> None:
    sim = make(**{**TOO_BIG, "gpu": "a100-80gb"}, parallel={"dp": 8})
    assert sim.layouts["state"] == "idle"
    sim.set(seq_len=2048)
    assert sim.layouts["state"] == "idle", "never on an ordinary update"
    send(sim, {"type": "layouts"})
    wait_for(lambda: sim.layouts["state"] == "done")
    lay = sim.layouts
    view = lay["view"]
    expected = plan(base=sim.scenario, gpus=8, headroom=sim.headroom)
    assert (view["evaluated"], view["fitting"]) == (expected.evaluated, expected.fitting)
    assert lay["gpus"] == [8] and not lay["stale"] and lay["ms"] > 0
    assert [r["candidate"] for r in view["top"]] == expected.frame.candidate.head(LAYOUT_ROWS).tolist()
    assert view["chart"]["layer"] and view["chart"]["data"]["values"]
    best = view["top"][0]
    send(sim, {"type": "layout_apply", "candidate": best["candidate"], "id": lay["id"]})
    assert sim.scenario == expected.scenario(best["candidate"])
    assert sim.result["verdict"] == "fits" and sim.error == ""
    assert (
        sim.scenario.parallel.dp == best["dp"] and sim.scenario.micro_batch_size == best["micro_batch_size"]
    )
    assert not sim.layouts["stale"], "a searched key changed: the search still answers"
    sim.set(seq_len=1024)
    assert sim.layouts["stale"] and sim.layouts["stale_keys"] == ["seq_len"]
    before = sim.scenario
    send(sim, {"type": "layout_apply", "candidate": best["candidate"], "id": lay["id"]})
    assert sim.scenario == before and "search again" in sim.layouts["error"]


def test_layouts_with_a_gpu_count_and_errors_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = make(**TOO_BIG)
    send(sim, {"type": "layouts", "gpus": 4})
    wait_for(lambda: sim.layouts["state"] == "done")
    assert sim.layouts["gpus"] == [4] and sim.layouts["view"]["gpu_counts"] == [4]
    send(sim, {"type": "layouts", "gpus": "four"})
    assert sim.layouts["state"] == "error" and "positive whole number" in sim.layouts["error"]
    assert sim.layouts["view"]["gpu_counts"] == [4], "the last result stays"

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("search broke")

    monkeypatch.setattr(layouts_panel, "plan_search", broken)
    send(sim, {"type": "layouts"})
    wait_for(lambda: sim.layouts["state"] == "error")
    assert sim.layouts["error"] == "RuntimeError: search broke"
    sim.set(micro_batch_size=2)
    assert sim.error == "" and sim.scenario.micro_batch_size == 2


def test_python_api_plan_layouts_and_apply_layout() -> None:
    sim = make(**TOO_BIG)
    p = sim.plan_layouts(gpus=2)
    assert p.fitting > 0 and p.gpu_counts == (2,)
    assert sim.layouts["view"]["fitting"] == p.fitting
    sim.apply_layout(0)
    assert sim.scenario == p.scenario(int(p.frame.candidate.iloc[0])) and sim.result["verdict"] == "fits"
    with pytest.raises(ScenarioError, match="no candidate ranked"):
        sim.apply_layout(10_000)
    sim.set(seq_len=8192)  # stale: apply_layout searches again first, on the same GPU count
    sim.apply_layout(0)
    assert sim.layouts["view"]["gpu_counts"] == [2] and not sim.layouts["stale"]
    assert sim.scenario.seq_len == 8192 and sim.scenario.parallel.world_size == 2


def test_layouts_stale_keys_ignore_searched_keys() -> None:
    a = Scenario.from_dict(TOO_BIG).to_dict()
    b = Scenario.from_dict({**TOO_BIG, "micro_batch_size": 4, "parallel": {"dp": 2, "zero": 3}}).to_dict()
    assert layouts_stale_keys(a, b) == []
    c = Scenario.from_dict({**TOO_BIG, "precision": "amp-bf16"}).to_dict()
    assert layouts_stale_keys(a, c) == ["precision"]


def test_python_marks_the_layout_in_use() -> None:
    """Each top row's ``current`` flag (the front end only shows it): every searched key equal, bools as bools."""
    sim = make(**TOO_BIG)
    sim.plan_layouts(gpus=2)
    top = sim.layouts["view"]["top"]
    assert [r["current"] for r in top] == [False] * len(top)
    row = top[0]
    sc = json.loads(json.dumps(sim.scenario_data))
    assert not layout_is_current(row, sc)
    sc.update(
        {k: row[k] for k in ("micro_batch_size", "grad_accum_steps", "activation_checkpointing", "loss")}
    )
    sc["optimizer"] = row["optimizer"]
    for k in ("dp", "tp", "pp", "cp", "ep", "zero", "sequence_parallel", "offload"):
        sc["parallel"][k] = row[k]
    assert layout_is_current(row, sc)
    assert not layout_is_current({**row, "sequence_parallel": int(row["sequence_parallel"])}, sc)
    assert not layout_is_current(row, {k: v for k, v in sc.items() if k != "parallel"})
    view = sim.layouts["view"]
    assert mark_current(view, sim.scenario_data) is view, "unchanged flags: the same view, nothing to send"
    assert mark_current(None, sc) is None

    sim.apply_layout(0)
    assert [r["current"] for r in sim.layouts["view"]["top"]][0] is True
    assert sim.layouts["view"]["chart"] is view["chart"], "the chart is not rebuilt"
    sim.scenario_data = {**sim.scenario_data, "micro_batch_size": 0}  # rejected: flags follow the input shown
    assert sim.error and not sim.layouts["view"]["top"][0]["current"]
    sim.scenario_data = {**sim.scenario_data, "micro_batch_size": row["micro_batch_size"]}
    assert sim.error == "" and sim.layouts["view"]["top"][0]["current"]


def test_closing_stops_the_panel() -> None:
    sim = make(**TOO_BIG)
    sim.fit_open = True
    sim.close()
    wait_for(lambda: not sim._fit.jobs.running)


# ----- JS fixture ----------------------------------------------------------------------------------------------
def _js_fixture_plan() -> dict[str, Any]:
    """``fit`` for a scenario that does not fit and one that fits, and a small ``layouts`` search."""
    out: dict[str, Any] = {}
    for name, data in (("too_big", TOO_BIG), ("roomy", ROOMY)):
        sim = make(**data)
        sim.recommend()
        out[name] = {"scenario_data": sim.scenario_data, "fit": {**sim.fit, "ms": 42.0}}
    sim = make(**TOO_BIG)
    sim.plan_layouts(gpus=2)
    view = build_layouts_view(sim._layouts.plan, points=40)  # type: ignore[arg-type]
    out["layouts"] = {
        "scenario_data": sim.scenario_data,
        "layouts": {**sim.layouts, "view": mark_current(view, sim.scenario_data), "ms": 120.0},
    }
    sim.apply_layout(0)  # the best candidate: Python now marks it current
    out["applied"] = {
        "scenario_data": sim.scenario_data,
        "layouts": {**sim.layouts, "view": mark_current(view, sim.scenario_data), "ms": 120.0},
    }
    return json.loads(json.dumps(out))


def test_js_plan_fixture_has_the_current_layout() -> None:
    fixture = json.loads(PLAN_FIXTURE.read_text())
    fresh = _js_fixture_plan()
    assert set(fixture) == set(fresh)
    for name in ("too_big", "roomy"):
        assert set(fixture[name]["fit"]) == set(fresh[name]["fit"]), "run --write-js-fixture"
        assert set(fixture[name]["fit"]["view"]) == set(fresh[name]["fit"]["view"])
    assert set(fixture["layouts"]["layouts"]["view"]) == set(fresh["layouts"]["layouts"]["view"])
    assert set(fixture["layouts"]["layouts"]["view"]["top"][0]) == set(
        fresh["layouts"]["layouts"]["view"]["top"][0]
    )


if __name__ == "__main__" and "--write-js-fixture" in sys.argv:
    PLAN_FIXTURE.write_text(json.dumps(_js_fixture_plan(), separators=(",", ":")) + "\n")
    print(f"wrote {PLAN_FIXTURE}")
