"""The "how it scales" view runs off the update of a front-end edit (``widget/scaling_panel``): the write returns
with the verdict, peaks, breakdown and table of the new estimate published and ``result["scaling"]`` pending (the
previous chart kept, never the previous largest micro-batch); the job then publishes the view of the scenario
shown, equal to ``charts.scaling_data`` computed directly, unless a later change superseded it. A memoised view
(a headroom move, a value seen before) and Python's own ``set`` publish at once.

The scaling view is slowed by a stub of ``scaling_panel.compute_view`` that waits for an event, so these tests do
not depend on timing; the scaling memo is cleared first, so the edits' curves are new.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from memsim_widget import charts
from memsim_widget.engine.core import estimate
from memsim_widget.engine.estimate import Estimate
from memsim_widget.widget import SCALING_PENDING, MemSim, merge, scaling_panel, scaling_summary
from memsim_widget.widget import memsim as memsim_module

MODEL = "llama-3.2-1b"


class Gate:
    """``compute_view`` in a background job held until ``release`` (the kernel's thread, building a view in place,
    passes): records each job's scenario; ``honour_cancel`` False lets a superseded job run to its end (so only
    the slot keeps it from publishing)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.calls: list[Any] = []
        self.honour_cancel = True
        self.fail: Exception | None = None
        self.real = scaling_panel.compute_view

    def __call__(
        self, est: Estimate, headroom: float, cancelled: Callable[[], bool] | None = None
    ) -> scaling_panel.ScalingView:
        if threading.current_thread() is threading.main_thread():
            return self.real(est, headroom, cancelled)
        self.calls.append(est.scenario)
        self.entered.release()
        assert self.release.wait(20)
        if self.fail is not None:
            raise self.fail
        return self.real(est, headroom, cancelled if self.honour_cancel else None)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    g = Gate()
    monkeypatch.setattr(scaling_panel, "compute_view", g)
    yield g
    g.release.set()


def fresh_widget() -> MemSim:
    """A widget whose scenario's curves are memoised (built in place) while no other curve is."""
    charts._scaling_points.cache_clear()
    return MemSim(model=MODEL, charts_js=False)


def edit(sim: MemSim, **changes: Any) -> None:
    """What the front end does: write ``scenario_data`` with some controls moved."""
    sim.scenario_data = merge(sim.scenario_data, changes)


def expected(sim: MemSim) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scaling summary and chart of the widget's scenario, computed directly."""
    data = charts.scaling_data(sim.estimate, sim.headroom)
    return scaling_summary(data), charts.scaling_spec(data, sim.headroom, sim.estimate.gpu.name)


def test_a_control_change_returns_before_the_scaling_job_and_the_job_publishes_the_direct_view(
    gate: Gate,
) -> None:
    sim = fresh_widget()
    old_chart, old_summary = sim.charts["scaling"], sim.result["scaling"]
    assert old_summary["micro_batch_size"]["max_fit"] is not None
    edit(sim, precision="fp32")  # a new shape at every stop of both curves
    assert gate.entered.acquire(timeout=10), "the job started"
    # The write has returned while the job waits: the rest of the result is the new estimate's already.
    assert not gate.release.is_set() and not sim.wait_scaling(0) and sim._scaling.pending
    est = estimate(sim.scenario)
    assert sim.scenario.precision == "fp32" and sim.result["peaks"][0]["bytes"] == est.device_total_bytes
    assert sim.result["verdict"] == est.verdict(sim.headroom) and len(sim.result["rows"]) == len(est.rows())
    assert sim.charts["breakdown"] == charts.breakdown_spec(est, sim.headroom)
    # Pending: no largest micro-batch of the previous scenario; the previous chart is kept (shown as updating).
    assert sim.result["scaling"] == SCALING_PENDING
    assert sim.charts["scaling"] == old_chart
    gate.release.set()
    assert sim.wait_scaling(30) and not sim._scaling.pending
    summary, spec = expected(sim)
    assert sim.result["scaling"] == summary and sim.charts["scaling"] == spec
    assert summary != old_summary  # fp32 fits fewer: the old numbers would have been wrong
    assert gate.calls == [sim.scenario]


def test_a_superseded_job_never_publishes(gate: Gate) -> None:
    gate.honour_cancel = False  # the first job runs to its end: only the slot keeps it from publishing
    sim = fresh_widget()
    seen: list[dict[str, Any]] = []
    sim.observe(lambda change: seen.append(change["new"]["scaling"]), "result")
    edit(sim, precision="fp32")
    assert gate.entered.acquire(timeout=10)
    first = sim._scaling.job
    edit(sim, precision="fp32", seq_len=4096)  # a new seq_len curve too: a second job
    assert gate.entered.acquire(timeout=10)
    second = sim._scaling.job
    assert first is not None and second is not None and first is not second and first.cancelled
    assert sim.result["scaling"] == SCALING_PENDING
    gate.release.set()
    assert first.done.wait(30) and first.future.result() is not None  # it finished, with a view
    assert sim.wait_scaling(30)
    summary, spec = expected(sim)
    assert sim.result["scaling"] == summary and sim.charts["scaling"] == spec
    # Every value the summary took: pending twice (one per edit), then the second edit's view, nothing else.
    assert seen == [SCALING_PENDING, SCALING_PENDING, summary]


def test_a_superseded_job_stops_at_its_next_stop(gate: Gate) -> None:
    sim = fresh_widget()
    edit(sim, precision="fp32")
    assert gate.entered.acquire(timeout=10)
    first = sim._scaling.job
    edit(sim, precision="fp32", seq_len=4096)
    gate.release.set()
    assert first is not None and first.done.wait(30)
    with pytest.raises(charts.ScalingCancelled):
        first.future.result()
    assert sim.wait_scaling(30) and sim.result["scaling"] == expected(sim)[0]


def test_memoised_views_publish_at_once_without_a_job(gate: Gate) -> None:
    sim = fresh_widget()
    first = sim.scenario_data
    gate.release.set()
    edit(sim, precision="fp32")
    assert sim.wait_scaling(30)
    sim.headroom = 0.25  # same curves, new crossings
    assert sim._scaling.job is None and sim.result["scaling"] == expected(sim)[0]
    sim.scenario_data = first  # back to a scenario seen before: its curves are memoised
    assert sim._scaling.job is None and sim.result["scaling"] == expected(sim)[0]
    edit(sim, micro_batch_size=8)  # the micro-batch curve is the same, the sequence curve is new
    assert sim._scaling.job is not None
    assert sim.wait_scaling(30) and sim.result["scaling"] == expected(sim)[0]
    assert len(gate.calls) == 2


def test_python_set_computes_the_view_in_place(gate: Gate) -> None:
    sim = fresh_widget()
    gate.release.set()
    sim.set(precision="fp32", micro_batch_size=4)
    assert sim._scaling.job is None and sim.wait_scaling(0) and gate.calls == []
    summary, spec = expected(sim)
    assert sim.result["scaling"] == summary and sim.charts["scaling"] == spec


def test_the_next_edit_pauses_a_pending_job_before_its_estimate(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job would compete with the kernel's estimate for the interpreter: it is told to stop first."""
    sim = fresh_widget()
    edit(sim, precision="fp32")
    assert gate.entered.acquire(timeout=10)
    first = sim._scaling.job
    seen: list[bool] = []

    def run(sc: Any) -> Estimate:
        seen.append(first is not None and first.cancelled)
        return estimate(sc)

    monkeypatch.setattr(memsim_module, "run_estimate", run)
    edit(sim, precision="fp32", seq_len=4096)
    assert seen == [True]
    gate.release.set()
    assert sim.wait_scaling(30) and sim.result["scaling"] == expected(sim)[0]


def test_a_rejected_edit_while_pending_still_publishes_the_last_valid_view(gate: Gate) -> None:
    sim = fresh_widget()
    edit(sim, precision="fp32")
    assert gate.entered.acquire(timeout=10)
    first = sim._scaling.job
    edit(
        sim, parallel={"tp": 3}
    )  # 32 heads do not split over 3: refused by the estimate, which paused the job
    assert sim.error_field == "parallel.tp" and sim.result["scaling"] == SCALING_PENDING
    second = sim._scaling.job  # resumed: a new job for the estimate still shown
    assert first is not None and first.cancelled and second is not None and second is not first
    gate.release.set()
    assert sim.wait_scaling(30)
    assert sim.scenario.precision == "fp32" and sim.result["scaling"] == expected(sim)[0]
    assert gate.calls == [sim.scenario, sim.scenario]


def test_a_failed_view_says_why_and_the_next_edit_recovers(gate: Gate) -> None:
    sim = fresh_widget()
    gate.fail = ValueError("boom")
    gate.release.set()
    edit(sim, precision="fp32")
    assert sim.wait_scaling(30)
    assert sim.result["scaling"] == {"error": "ValueError: boom"} and "scaling" not in sim.charts
    assert sim.result["peaks"][0]["bytes"] == estimate(sim.scenario).device_total_bytes
    gate.fail = None
    edit(sim, precision="fp32", seq_len=4096)
    assert sim.wait_scaling(30)
    summary, spec = expected(sim)
    assert sim.result["scaling"] == summary and sim.charts["scaling"] == spec


def test_closing_cancels_a_pending_job(gate: Gate) -> None:
    sim = fresh_widget()
    before = sim.result
    edit(sim, precision="fp32")
    assert gate.entered.acquire(timeout=10)
    job = sim._scaling.job
    pending = sim.result
    sim.close()
    gate.release.set()
    assert job is not None and job.cancelled and job.done.wait(30)
    assert sim.result == pending != before  # nothing published after closing
