"""Junk typed into the widget (issue 14): every edit shows an error naming a scenario field, never a Python
exception out of the trait and never "internal error"; the widget keeps its last valid result and recovers."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from test_fuzz_scenario import ALLOWED_FIELDS, SCENARIO

from memsim_widget.widget import MemSim

SIM = MemSim(charts_js=False)
GOOD = dict(SIM.scenario_data)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(edit=SCENARIO)
def test_any_edit_is_a_result_or_a_named_error(edit):
    before = SIM.result["verdict"]
    SIM.scenario_data = {**GOOD, **edit}
    if SIM.error_field:
        assert SIM.error_field.split(".")[0].split("[")[0] in ALLOWED_FIELDS, SIM.error
        assert "internal error" not in str(SIM.error)
        assert SIM.result["verdict"] == before  # the last valid result stays on screen
    SIM.scenario_data = GOOD
    assert not SIM.error_field


def test_an_unknown_key_stays_shown_until_the_last_valid_scenario_clears_it():
    sim = MemSim(charts_js=False)
    good = dict(sim.scenario_data)
    sim.scenario_data = {**good, "lora": {"x": 0}}
    assert sim.error_field == "lora.x"
    assert (
        sim.scenario_data["lora"]["x"] == 0
    )  # the key the error names is visible (the scenario JSON shows it)
    sim.scenario_data = good  # a change: the rejected input differs from the last valid one
    assert not sim.error_field and sim.error == ""


def test_an_edit_of_another_key_drops_an_unknown_key_it_only_carries_over():
    sim = MemSim(charts_js=False)
    sim.scenario_data = {**sim.scenario_data, "lora": {**sim.scenario_data["lora"], "x": 0}}
    assert sim.error_field == "lora.x"
    sim.set(micro_batch_size=2)  # builds on the shown input, whose lora.x it did not type
    assert not sim.error_field and sim.scenario.micro_batch_size == 2
    assert "x" not in sim.scenario_data["lora"]
