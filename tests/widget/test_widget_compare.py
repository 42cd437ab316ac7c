"""The widget's compare panel, from the Python side: the ``pins`` the front end writes, the ``comparison`` it shows.

Run ``python tests/widget/test_widget_compare.py --write-js-fixture`` to refresh ``tests/js/fixtures/compare.json``
(the traits the node tests render) after their layout changes.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.widget import MemSim, compare_panel
from memsim_widget.widget.compare_panel import MAX_PINS

ROOT = Path(__file__).resolve().parents[2]
COMPARE_FIXTURE = ROOT / "tests" / "js" / "fixtures" / "compare.json"
BASE = {"model": "llama-3.2-1b", "gpu": "a100-40gb", "seq_len": 1024}


def make(**kwargs: Any) -> MemSim:
    """A widget without the vega-embed bundle (the Python side does not need it)."""
    return MemSim(charts_js=False, **{**BASE, **kwargs})


def front_end_pin(sim: MemSim) -> None:
    """What the "Pin" button does: append the shown scenario to ``pins``."""
    sim.pins = [*sim.pins, {"scenario": sim.scenario_data}]


def test_without_pins_there_is_nothing_to_compare() -> None:
    sim = make()
    assert sim.pins == []
    assert sim.comparison == {"error": "", "max_pins": MAX_PINS, "pins": [], "view": None}
    sim.set(method="lora")
    assert sim.comparison["view"] is None, "edits without pins compute no comparison"
    with pytest.raises(ScenarioError, match=r"^pins: nothing is pinned"):
        sim.compare()


def test_pin_then_change_a_knob_compares_the_pin_with_the_current_scenario() -> None:
    sim = make()
    front_end_pin(sim)
    assert sim.pins == [{"name": "pin 1", "scenario": sim.scenario_data}]
    sim.set(method="lora")
    view = sim.comparison["view"]
    assert view["names"] == ["pin 1", "current"]
    assert view["differences"] == [{"field": "method", "values": ["full", "lora"], "changed": [True, False]}]
    full, lora = estimate(Scenario.from_dict(BASE)), estimate(Scenario.from_dict({**BASE, "method": "lora"}))
    assert [r["verdict"] for r in view["rows"]] == [full.verdict(0.1), lora.verdict(0.1)]
    assert [r["step_time"] for r in view["rows"]] == [
        f"{full.step_time_s:.3g} s",
        f"{lora.step_time_s:.3g} s",
    ]
    bars = view["chart"]["vconcat"][0]["layer"][2]["data"]["values"]
    assert {r["rank"] for r in bars} == {"pin 1", "current"}
    assert sum(r["bytes"] for r in bars if r["rank"] == "current") == lora.device_total_bytes
    (pin,) = sim.comparison["pins"]
    assert pin["name"] == "pin 1" and pin["summary"].startswith(
        f"{full.device_total_bytes / 2**30:.2f} GiB, "
    )
    cmp = sim.compare()
    assert cmp.names == ("pin 1", "current") and cmp.estimates[1] is sim.estimate


def test_a_pin_is_estimated_once_not_on_every_edit(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Scenario] = []

    def counting(sc: Scenario) -> Any:
        calls.append(sc)
        return estimate(sc)

    monkeypatch.setattr(compare_panel, "run_estimate", counting)
    sim = make()
    front_end_pin(sim)
    assert len(calls) == 1
    for mbs in (2, 4, 8, 2):
        sim.set(micro_batch_size=mbs)
    assert len(calls) == 1, "edits estimate only the current scenario"
    front_end_pin(sim)
    assert len(calls) == 2
    assert sim.comparison["view"]["names"] == ["pin 1", "pin 2", "current"]
    sim.pins = sim.pins[1:]  # removing a pin estimates nothing either
    assert len(calls) == 2 and sim.pin_names == ["pin 2"]


def test_at_most_three_pins_and_no_twins() -> None:
    sim = make()
    for mbs in (1, 2, 3):
        sim.set(micro_batch_size=mbs).pin()
    assert sim.pin_names == ["pin 1", "pin 2", "pin 3"]
    sim.set(micro_batch_size=4)
    front_end_pin(sim)
    assert sim.pin_names == ["pin 1", "pin 2", "pin 3"]
    assert sim.comparison["error"] == "pins: at most 3 pinned scenarios (4 with the current one)"
    with pytest.raises(ScenarioError, match=r"^pins: at most 3"):
        sim.pin()
    sim.unpin("pin 1")
    sim.set(micro_batch_size=2)
    with pytest.raises(ScenarioError, match=r"^pins: this scenario is pinned already \(pin 2\)$"):
        sim.pin()
    assert sim.pin_names == ["pin 2", "pin 3"]


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ({"scenario": {**BASE, "micro_batch_size": 0}}, r"^pins\[1\]\.micro_batch_size: must be an integer"),
        ({"scenario": {**BASE, "optimiser": "adamw"}}, r"^pins\[1\]\.optimiser: "),
        ("llama", r'^pins\[1\]: must be \{"name": \.\.\., "scenario": \{\.\.\.\}\}$'),
        ({"name": "x"}, r"^pins\[1\]: must be "),
    ],
)
def test_a_bad_pin_is_refused_with_its_field_and_the_others_stay(entry: Any, error: str) -> None:
    sim = make()
    sim.pin()
    sim.pins = [*sim.pins, entry]
    assert sim.pin_names == ["pin 1"]
    assert sim.pins == [{"name": "pin 1", "scenario": sim.scenario_data}]
    assert sim.comparison["error"] and re.match(error, sim.comparison["error"])
    sim.set(micro_batch_size=2).pin()
    assert sim.comparison["error"] == "", "the next accepted pin clears the message"


def test_removing_a_pin_keeps_the_other_names_and_the_next_pin_takes_the_free_one() -> None:
    sim = make()
    for mbs in (1, 2, 3):
        sim.set(micro_batch_size=mbs).pin()
    sim.pins = [p for p in sim.pins if p["name"] != "pin 2"]  # the remove button
    assert sim.pin_names == ["pin 1", "pin 3"]
    sim.set(micro_batch_size=5).pin()
    assert sim.pin_names == ["pin 1", "pin 3", "pin 2"]
    sim.unpin().unpin(0).unpin("pin 3")
    assert sim.pins == [] and sim.comparison["view"] is None
    with pytest.raises(ScenarioError, match=r"^pin: 'pin 9' is not pinned; pinned: none$"):
        sim.unpin("pin 9")


def test_pin_names_from_python() -> None:
    sim = make()
    sim.pin(name="full")
    sim.set(method="lora")
    assert sim.compare().names == ("full", "current")
    for bad in ("full", "current", " ", 3):
        with pytest.raises(ScenarioError, match=r"^name: must be a new non-empty name; taken: full, current"):
            sim.pin(name=bad)  # type: ignore[arg-type]
    sim.pins = [*sim.pins, {"name": "full", "scenario": sim.scenario_data}]
    assert sim.pin_names == ["full", "pin 1"], "a taken name written by the front end becomes pin N"


def test_headroom_and_rejected_input() -> None:
    sim = make(micro_batch_size=8)
    sim.pin()
    sim.set(micro_batch_size=1)
    before = sim.comparison
    sim.scenario_data = {**sim.scenario_data, "micro_batch_size": -1}
    assert sim.error.startswith("micro_batch_size")
    assert sim.comparison == before, "a rejected edit keeps the comparison of the last valid scenario"
    est = estimate(Scenario.from_dict({**BASE, "micro_batch_size": 8}))
    sim.headroom = (
        1 - est.device_total_bytes / est.gpu.memory_bytes + 0.01
    )  # the pin just misses the headroom
    rows = sim.comparison["view"]["rows"]
    assert rows[0]["verdict"] == "tight" and sim.comparison["pins"][0]["summary"].split(", ")[1] == "tight"


# ----- JS fixture ----------------------------------------------------------------------------------------------
def _js_fixture_compare() -> dict[str, Any]:
    """Two pins and the current scenario (chart replaced by a tiny spec), and a refused pin's message."""
    sim = make()
    sim.pin()
    sim.set(method="lora").pin()
    sim.set(method="qlora")
    comparison = {**sim.comparison, "view": {**sim.comparison["view"], "chart": {"mark": "bar"}}}
    return json.loads(
        json.dumps({"scenario_data": sim.scenario_data, "pins": sim.pins, "comparison": comparison})
    )


def test_js_compare_fixture_has_the_current_layout() -> None:
    fixture, fresh = json.loads(COMPARE_FIXTURE.read_text()), _js_fixture_compare()
    assert set(fixture) == set(fresh)
    assert set(fixture["comparison"]) == set(fresh["comparison"]), "run --write-js-fixture"
    assert set(fixture["comparison"]["view"]) == set(fresh["comparison"]["view"])
    assert set(fixture["comparison"]["view"]["rows"][0]) == set(fresh["comparison"]["view"]["rows"][0])
    assert set(fixture["comparison"]["view"]["differences"][0]) == set(
        fresh["comparison"]["view"]["differences"][0]
    )


if __name__ == "__main__" and "--write-js-fixture" in sys.argv:
    COMPARE_FIXTURE.write_text(json.dumps(_js_fixture_compare(), indent=1) + "\n")
    print(f"wrote {COMPARE_FIXTURE}")
