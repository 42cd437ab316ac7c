"""A calibrated model's first estimate runs off the widget's update (issue 12): an edit from the front end that
would trace (about a dozen tiny traces, ~30 s) returns at once with ``calibration`` running and the last result
kept; the estimate is published when the background job ends, or its error shown. The calibration is stubbed here
(``pending_fit`` and the job's ``run_estimate``), so these tests take milliseconds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.widget import MemSim, calibration_panel

#: The model the stub treats as calibrated-from-traces (any preset: the estimate itself is the engine's).
SLOW = "gpt2-medium"


class Stub:
    """``SLOW`` needs a fit until its background estimate has run; that estimate waits for ``release``."""

    def __init__(self) -> None:
        self.fitted: set[str] = set()
        self.release = threading.Event()
        self.calls: list[str] = []
        self.fail: ScenarioError | None = None
        self.finished = threading.Event()  # set when a stubbed estimate returns

    def pending(self, sc: Scenario) -> bool:
        return sc.model == SLOW and SLOW not in self.fitted

    def run(self, sc: Scenario) -> Any:
        self.calls.append(str(sc.model))
        assert self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        self.fitted.add(str(sc.model))
        try:
            return estimate(sc)
        finally:
            self.finished.set()


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    s = Stub()
    monkeypatch.setattr(calibration_panel, "pending_fit", s.pending)
    monkeypatch.setattr(calibration_panel, "run_estimate", s.run)
    yield s
    s.release.set()


def edit(sim: MemSim, **changes: Any) -> None:
    """What the front end does: write ``scenario_data`` with some keys moved."""
    sim.scenario_data = {**sim.scenario_data, **changes}


def test_a_front_end_edit_that_would_trace_returns_at_once_and_publishes_when_done(stub: Stub) -> None:
    sim = MemSim(charts_js=False)
    before, old = sim.result, sim.estimate
    edit(sim, model=SLOW)
    assert sim.calibration["state"] == "running" and sim.calibration["model"]
    assert sim.scenario_data["model"] == SLOW  # the controls show the edit
    assert sim.result == before and sim.estimate is old and sim.error == ""  # the last result stays
    stub.release.set()
    assert sim.wait_calibration(10)
    assert sim.calibration["state"] == "done" and stub.calls == [SLOW]
    assert sim.scenario.model == SLOW and sim.error == ""
    assert sim.wait_scaling(30)  # its scaling view has a job of its own (``scaling_panel``)
    fresh = MemSim(sim.scenario, charts_js=False)  # what a widget opened on the new scenario shows
    assert sim.result == fresh.result and sim.charts == fresh.charts and sim.result != before


def test_a_failed_calibration_shows_its_error_and_keeps_the_last_valid_scenario(stub: Stub) -> None:
    sim = MemSim(charts_js=False)
    first = sim.scenario
    stub.fail = ScenarioError("model.model_type", "'x' could not be calibrated from traces of shrunk copies")
    edit(sim, model=SLOW)
    stub.release.set()
    assert sim.wait_calibration(10)
    assert sim.calibration["state"] == "error" and "could not be calibrated" in sim.calibration["error"]
    assert sim.error_field == "model.model_type" and sim.error.startswith("model.model_type: ")
    assert sim.scenario == first and sim.scenario_data["model"] == SLOW  # the input shown, as typed


def test_a_newer_edit_supersedes_a_running_calibration(stub: Stub) -> None:
    sim = MemSim(charts_js=False)
    edit(sim, model=SLOW)
    assert sim.calibration["state"] == "running"
    edit(sim, model="gpt2", micro_batch_size=3)  # needs no fit: applied at once
    assert sim.calibration["state"] == "idle"
    assert sim.scenario.model == "gpt2" and sim.scenario.micro_batch_size == 3
    assert sim.wait_calibration(0)  # a superseded calibration is never published: nothing to wait for
    stub.release.set()
    assert stub.finished.wait(10)
    assert sim.scenario.model == "gpt2" and sim.scenario.micro_batch_size == 3  # not replaced by the old job
    assert SLOW in stub.fitted  # the fit was made all the same (cached for the next time)


def test_the_python_api_still_blocks_and_raises(stub: Stub) -> None:
    """``set`` is a Python call: it estimates inline (nothing in the background) and raises when refused."""
    sim = MemSim(charts_js=False)
    sim.set(model=SLOW)
    assert sim.scenario.model == SLOW and sim.calibration["state"] == "idle" and stub.calls == []


def test_pending_fit_is_true_only_for_a_calibrated_recipe_not_yet_fitted() -> None:
    pytest.importorskip("transformers")
    opt = {"model_type": "opt", "hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2,
           "num_attention_heads": 4, "vocab_size": 50, "max_position_embeddings": 64}  # fmt: skip
    assert calibration_panel.pending_fit(Scenario.from_dict({"model": opt, "seq_len": 32}))
    assert not calibration_panel.pending_fit(Scenario.from_dict({"model": "gpt2"}))
