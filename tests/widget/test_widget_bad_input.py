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
