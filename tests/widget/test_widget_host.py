"""The widget as its panels see it: the ``WidgetHost`` protocol, the message dispatch table, background jobs."""

from __future__ import annotations

import ast
import threading
from pathlib import Path
from typing import Any

import pytest

from memsim_widget.widget import MemSim
from memsim_widget.widget.background import BackgroundJob, JobSlot, error_text
from memsim_widget.widget.host import WidgetHost


def make(**kwargs: Any) -> MemSim:
    """A widget without the vega-embed bundle."""
    return MemSim(charts_js=False, **kwargs)


def test_the_widget_is_its_panels_host() -> None:
    sim = make()
    assert isinstance(sim, WidgetHost)
    for panel in (sim._trace, sim._fit, sim._layouts, sim._compare_panel, sim._export):
        assert panel.host is sim


def test_the_panels_use_only_what_the_protocol_names() -> None:
    widget = Path(__file__).resolve().parents[2] / "memsim_widget" / "widget"
    used = {
        node.attr
        for path in widget.glob("*_panel.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and (
            (isinstance(node.value, ast.Name) and node.value.id == "host")
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "host")
        )
    }
    declared = {n for n in dir(WidgetHost) if not n.startswith("__")} | set(WidgetHost.__annotations__)
    assert used and used <= declared, sorted(used - declared)


def test_every_message_type_has_one_handler() -> None:
    sim = make()
    assert set(sim._handlers) == {
        "verify",
        "cancel",
        "fit_apply",
        "layouts",
        "layout_apply",
        "export",
        "import_config",
        "measure",
    }


def test_an_unknown_message_type_is_shown_in_place() -> None:
    sim = make()
    sim._handle_custom_msg({"type": "frobnicate"}, [])
    assert sim.error_field == "message"
    assert sim.error.startswith("message: unknown type 'frobnicate'") and "layout_apply" in sim.error
    assert sim.scenario_data == sim.scenario.to_dict(), "the scenario is untouched"
    sim.set(micro_batch_size=2)
    assert sim.error == "" and sim.error_field == "", "the next edit clears it"


@pytest.mark.parametrize("content", [None, [], {"kind": "anywidget-command", "name": "x"}])
def test_a_message_that_is_not_the_widgets_is_left_alone(content: Any) -> None:
    sim = make()
    sim._handle_custom_msg(content, [])
    assert sim.error == ""


def run(slot: JobSlot[Any], work: Any, **kwargs: Any) -> tuple[BackgroundJob[Any], list[tuple[Any, Any]]]:
    """Start ``work`` in ``slot``; the outcomes ``finish`` published are recorded."""
    published: list[tuple[Any, Any]] = []
    with slot._lock:
        job = slot.start(work, lambda job, result, error: published.append((result, error)), **kwargs)
    return job, published


def test_a_job_publishes_under_the_lock_then_resolves_its_future() -> None:
    lock = threading.RLock()
    slot: JobSlot[int] = JobSlot(lock, "test-job")
    job, published = run(slot, lambda job: 6 * 7, subject="s")
    assert job.future.result(5) == 42 and job.done.is_set()
    assert published == [(42, None)] and not slot.running and slot.job is job and job.subject == "s"
    assert job.thread is not None and job.thread.name == "test-job"

    job, published = run(slot, lambda job: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        job.future.result(5)
    ((result, error),) = published
    assert result is None and error_text(error) == "ZeroDivisionError: division by zero"


def test_a_superseded_job_publishes_nothing_and_cancel_reaches_the_work() -> None:
    slot: JobSlot[str] = JobSlot(threading.RLock(), "test-job")
    gate = threading.Event()

    def slow(job: BackgroundJob[str]) -> str:
        assert gate.wait(5)
        return "cancelled" if job.cancelled else "old"

    old, old_published = run(slot, slow)
    assert slot.running and old.running()
    old.cancel()
    new, new_published = run(slot, lambda job: "new")
    assert new.future.result(5) == "new" and new_published == [("new", None)]
    gate.set()
    assert old.future.result(5) == "cancelled" and old_published == [], "superseded: its outcome is not shown"


def test_a_job_ticks_while_it_runs() -> None:
    slot: JobSlot[None] = JobSlot(threading.RLock(), "test-job")
    ticks = threading.Semaphore(0)
    release = threading.Event()

    def work(job: BackgroundJob[None]) -> None:
        assert ticks.acquire(timeout=5) and ticks.acquire(timeout=5)
        release.set()

    job, _ = run(slot, work, tick=(0.001, lambda job: ticks.release()))
    job.future.result(5)
    assert release.is_set()
