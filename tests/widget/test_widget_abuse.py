"""The widget under abuse (issue 25): an edit is bounded before any rule sees it, a front-end write of the wrong
type is an error in place (never a TraitError out of ``set_state``), a calibrated model's first edit never waits
in the kernel, and background jobs are stopped when the interpreter exits."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.architecture.types import FAMILIES
from memsim_widget.widget import MemSim

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 128, "vocab_size": 100}  # fmt: skip


@pytest.fixture(scope="module")
def sim() -> MemSim:
    return MemSim(charts_js=False)


def _recovers(sim: MemSim, good: dict[str, Any]) -> None:
    """A valid edit after the rejected one is applied: no error repeats on later edits."""
    sim.scenario_data = {**good, "micro_batch_size": 2}
    assert sim.error == "" and sim.scenario.micro_batch_size == 2
    sim.scenario_data = good
    assert sim.error == "" and sim.wait_scaling(30)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"micro_batch_size": 10**400}, "micro_batch_size"),
        ({"seq_len": 2**63}, "seq_len"),
        ({"parallel": {"tp": -(2**70)}}, "parallel.tp"),
        ({"lora": {"rank": 1e308 * 10}}, "lora.rank"),
        ({"lora": {"targets": ["q_proj"] * 50_000}}, "lora"),
        ({"model": "m" * 100_000}, "model"),
        ({"gpu": {"memory_gib": 80, "name": "\ud800"}}, "gpu.name"),
        ({"model": {**SMALL, "x": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}}, "model"),
    ],
)  # fmt: skip
def test_an_out_of_bounds_edit_is_a_named_error_and_the_next_edit_works(
    sim: MemSim, edit: dict[str, Any], field: str
) -> None:
    good = dict(sim.scenario_data)
    before = sim.result
    sim.scenario_data = {**good, **edit}
    assert sim.error_field.startswith(field), sim.error
    assert "internal error" not in sim.error and sim.result == before
    _recovers(sim, good)


@pytest.mark.parametrize(
    "state",
    [{"headroom": "x"}, {"headroom": 5}, {"headroom": None}, {"headroom": True}, {"fit_open": "yes"},
     {"fit_open": 3}, {"scenario_data": []}, {"scenario_data": "x"}],
)  # fmt: skip
def test_a_front_end_write_of_the_wrong_type_is_an_error_in_place(sim: MemSim, state: dict[str, Any]) -> None:
    good = dict(sim.scenario_data)
    headroom, fit_open = sim.headroom, sim.fit_open
    sim.set_state(state)  # what the comm handler calls: it must not raise
    name = next(iter(state))
    assert sim.error_field == name and sim.error.startswith(f"{name}: ")
    assert sim.headroom == headroom and sim.fit_open == fit_open
    _recovers(sim, good)


def test_the_first_edit_of_a_calibrated_model_returns_before_its_build_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model's build (meta device, then traces: seconds) is held on an Event: the edit must come back while
    it waits, with ``calibration`` running; nothing here measures time."""
    import memsim_widget.calibrate as calibrate

    mt = "gptj"
    assert mt not in FAMILIES
    release, entered = threading.Event(), threading.Event()

    def builder(config: Any) -> Any:
        entered.set()
        assert release.wait(20)
        return FAMILIES["llama"]({**config, **SMALL})

    monkeypatch.setattr(calibrate, "calibrated_builder", lambda model_type: builder)
    sim = MemSim(charts_js=False)
    before = sim.result
    sim.scenario_data = {**sim.scenario_data, "model": {**SMALL, "model_type": mt}}
    try:
        assert not release.is_set()  # the edit returned while the build still waits
        assert sim.calibration["state"] == "running" and sim.error == "" and sim.result == before
    finally:
        release.set()
    assert entered.wait(10) and sim.wait_calibration(20)
    assert sim.calibration["state"] == "done", sim.calibration
    assert sim.scenario.model["model_type"] == mt and sim.error == ""


def test_background_jobs_are_cancelled_and_joined_at_exit() -> None:
    """A job still running when the interpreter exits is cancelled and waited for (``background.stop_all`` at
    ``atexit``), so it never runs on into the interpreter's finalisation."""
    code = (
        "import threading, time\n"
        "from memsim_widget.widget.background import JobSlot\n"
        "def work(job):\n"
        "    while not job.cancelled: time.sleep(0.01)\n"
        "    print('cancelled', flush=True)\n"
        "slot = JobSlot(threading.RLock(), 'test')\n"
        "with slot._lock: slot.start(work, lambda *a: None)\n"
        "time.sleep(0.1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "cancelled"


JUNK = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80), st.floats(), st.text(max_size=20), st.none(), st.booleans(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)  # fmt: skip
KEYS = [
    "model",
    "gpu",
    "method",
    "micro_batch_size",
    "seq_len",
    "precision",
    "parallel",
    "lora",
    "rl",
    "objective",
]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("edit"), st.sampled_from(KEYS), JUNK),
        st.tuples(st.just("state"), st.sampled_from(["headroom", "fit_open", "pins"]), JUNK),
        st.tuples(st.just("msg"), st.sampled_from(["export", "fit_apply", "layouts", "nope"]), JUNK),
    ),
    max_size=8,
)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=OPS)
def test_any_sequence_of_front_end_operations_raises_nothing_and_recovers(
    sim: MemSim, ops: list[Any]
) -> None:
    good = dict(sim.scenario_data)
    for kind, key, value in ops:
        if kind == "edit":
            sim.scenario_data = {**sim.scenario_data, key: value}
        elif kind == "state":
            sim.set_state({key: value})
        else:
            sim._on_front_msg(sim, {"type": key, "format": value, "gpus": value, "index": value}, [])
    sim.set_state({"fit_open": False, "headroom": 0.1})
    _recovers(sim, good)
