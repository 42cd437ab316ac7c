"""A trace is the same whatever the process ran before it: the cyclic garbage collector runs no automatic
collection inside a trace, whose timing would depend on every allocation the process made; the garbage dropped in
a phase is collected at the phase's end (``tracker.YOUNG_GENERATIONS``; docs/trace.md, "Garbage collection")."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from memsim_widget.trace.tracker import MemoryTracker  # noqa: E402


@pytest.fixture
def collector() -> Iterator[None]:
    """Leave the collector's thresholds and switch as the test found them."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        (gc.enable if enabled else gc.disable)()


def test_inside_a_trace_the_collector_runs_no_automatic_collection(collector: None) -> None:
    gc.enable()
    with MemoryTracker(track_modules=False):
        assert not gc.isenabled()
        with MemoryTracker(track_modules=False):  # a nested tracker leaves it off for the outer one
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    with MemoryTracker(track_modules=False):
        pass
    assert not gc.isenabled()  # a caller's choice is kept


def test_a_trace_that_fails_to_start_leaves_the_collector_on(collector: None, monkeypatch: Any) -> None:
    def broken(self: MemoryTracker) -> None:
        raise RuntimeError("resize hook")

    gc.enable()
    monkeypatch.setattr(MemoryTracker, "_follow_resize", broken)
    with pytest.raises(RuntimeError, match="resize hook"), MemoryTracker(track_modules=False):
        pass
    assert gc.isenabled()


def _cycle_holding(tracker: MemoryTracker) -> tuple[list[Any], Any]:
    """A reference cycle holding a tensor made by one op (one tracked 4 KiB storage), and its record."""
    x = torch.ones(1024) * 2
    cycle: list[Any] = [x]
    cycle.append(cycle)
    return cycle, tracker.records[-1]


def _churn() -> None:
    """More allocations than make CPython's collector (thresholds 700, 10, 10) run each generation by itself."""
    keep = [[] for _ in range(len(gc.get_objects()))]  # the old generation more than doubled
    for i in range(200):
        _ = [[j] for j in range(700 + i)]
    del keep


def test_cyclic_garbage_dropped_in_a_phase_is_freed_at_its_end(collector: None) -> None:
    gc.set_threshold(10, 1, 1)  # a caller's: a collection every few allocations
    gc.enable()
    with MemoryTracker(track_modules=False) as tracker:
        tracker.set_phase("forward", 1)
        cycle, rec = _cycle_holding(tracker)
        del cycle
        _churn()
        assert rec.free_seq is None  # no collection by itself inside the phase
        tracker.set_phase("backward")
        assert rec.free_seq == tracker.marks[-1]["seq"] - 1  # freed right before the next phase's mark
    tracker.close()


def test_old_cyclic_garbage_lives_to_the_end_of_the_trace(collector: None) -> None:
    """What Dynamo does to the first compiled step's output: a reference cycle holds the tensor, its own
    ``gc.collect(1)`` after the compile moves it to the oldest generation while still reachable, then it is dropped.
    With the collector on, the churn after it starts a full collection that frees it (before the fix: at seq 5,
    within the phase); inside a trace it lives to the end."""
    gc.set_threshold(100, 1, 1)
    gc.enable()
    with MemoryTracker(track_modules=False) as tracker:
        tracker.set_phase("forward", 1)
        cycle, rec = _cycle_holding(tracker)
        gc.collect(1)  # Dynamo's run_gc_after_compile, while the cycle is reachable
        del cycle
        _churn()
        tracker.set_phase("backward")
        tracker.set_phase("end")
        assert rec.free_seq is None
    tracker.close()


@pytest.mark.slow
def test_a_compiled_trace_after_the_estimate_under_ci_equals_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clean-clone CI failure (CI=true, the engine's estimate first, then the trace in the same process: a
    compiled GPT-2 b2 s512 under autocast read 105.6 MB instead of 111.8 MB, a full collection in the first step's
    backward having freed the first step's output that Dynamo's garbage held), with the collector's thresholds set
    to collect often, and after an eager trace and another compiled one in the same process (8 KiB more when only
    full collections were held back): the bytes of each phase equal a trace in a fresh interpreter."""
    from fresh_interpreter import run_json

    code = (
        "import gc, json, sys\n"
        "from fidelity_cases import CASES, COMPILED_CASES, Scenario, estimate\n"
        "from memsim_widget.trace.api import trace_config\n"
        "sc = Scenario.from_dict(dict(COMPILED_CASES)['gpt2 amp-bf16 sdpa b2 s512 compiled'])\n"
        "if sys.argv[1] == 'after':\n"
        "    estimate(sc)\n"
        "    gc.set_threshold(100, 2, 2)\n"
        "    trace_config(Scenario.from_dict(dict(CASES)['gpt2 bf16 sdpa b2 s512']))\n"
        "    trace_config(Scenario.from_dict(dict(COMPILED_CASES)['gpt2 bf16 sdpa b2 s512 compiled']))\n"
        "tr = trace_config(sc)\n"
        "print(json.dumps({'peak': tr.peak_bytes, 'phases': tr.phase_peaks}))\n"
    )
    fresh = run_json(code, "fresh")
    monkeypatch.setenv("CI", "true")
    after = run_json(code, "after")
    assert after == fresh
