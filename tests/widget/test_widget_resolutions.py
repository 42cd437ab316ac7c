"""A widget edit resolves the model's architecture once (issue 13).

The edit freezes an inline config before its control rules run (``scenario_edits.with_frozen_model``), so the
rules, the scenario, its scaling stops, the step time, the calibration and trace panels and the options share one
config object and its resolution (``catalog.models.architecture_for``). A preset is looked up by its id.
"""

from __future__ import annotations

from typing import Any

import pytest

from memsim_widget.catalog import models
from memsim_widget.catalog.models import PRESETS
from memsim_widget.widget import MemSim, merge

INLINE = dict(PRESETS["llama-3.2-1b"])


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The model inputs resolved by content (``catalog.models.resolve_architecture``), in order."""
    seen: list[Any] = []
    real = models.resolve_architecture

    def counting(model: Any) -> Any:
        seen.append(model)
        return real(model)

    monkeypatch.setattr(models, "resolve_architecture", counting)
    return seen


def _edit(sim: MemSim, changes: dict[str, Any]) -> None:
    """A front-end write of ``scenario_data`` (a fresh JSON dict, as the browser sends)."""
    sim.scenario_data = merge(sim.scenario_data, changes)
    assert sim.error == "", sim.error


#: Edits in order: new estimates, a move back to estimates already cached, a method, another model config.
EDITS = [
    {"micro_batch_size": 2},
    {"seq_len": 512},
    {"micro_batch_size": 1, "seq_len": 2048},
    {"method": "lora"},
    {"model": {**INLINE, "num_hidden_layers": 4}},
]


def test_an_inline_model_edit_resolves_the_architecture_once(resolutions: list[Any]) -> None:
    sim = MemSim(model=INLINE, charts_js=False)
    per_edit = []
    for changes in EDITS:
        resolutions.clear()
        _edit(sim, changes)
        per_edit.append(len(resolutions))
        assert resolutions[-1] is sim.scenario.model
    assert per_edit == [1] * len(EDITS)


def test_a_preset_edit_resolves_nothing_by_content(resolutions: list[Any]) -> None:
    sim = MemSim(model="llama-3.2-1b", charts_js=False)
    _edit(sim, {"micro_batch_size": 2})
    _edit(sim, {"model": "qwen2.5-0.5b"})
    assert resolutions == []


def test_a_rejected_edit_shows_the_config_as_plain_json() -> None:
    """The model a rejected edit shows is plain JSON data again (lists, not the frozen tuples)."""
    sim = MemSim(model={**INLINE, "extra_list": [1, 2]}, charts_js=False)
    sim.scenario_data = merge(sim.scenario_data, {"micro_batch_size": 0})
    assert sim.error != ""
    shown = sim.scenario_data["model"]
    assert type(shown) is dict and shown["extra_list"] == [1, 2]
