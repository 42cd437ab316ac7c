"""A trace is the same whatever the process ran before it: the cyclic garbage collector's full collections, whose
timing depends on every allocation the process made, never free a tensor in the middle of a trace
(``tracker.GC_THRESHOLDS``; docs/trace.md, "Garbage collection")."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from memsim_widget.trace.tracker import GC_THRESHOLDS, MemoryTracker  # noqa: E402


@pytest.fixture
def thresholds() -> Iterator[None]:
    """Leave the collector's thresholds as the test found them."""
    outer = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*outer)


def test_inside_a_trace_the_collector_runs_no_full_collection_by_itself(thresholds: None) -> None:
    # a caller's: a full collection as soon as the old generation has grown by a quarter
    gc.set_threshold(100, 1, 1)
    with MemoryTracker(track_modules=False):
        assert gc.get_threshold() == GC_THRESHOLDS
        assert GC_THRESHOLDS[:2] == (700, 10)  # CPython's defaults for the young generations
    assert gc.get_threshold() == (100, 1, 1)


def test_nested_trackers_restore_the_thresholds_in_order(thresholds: None) -> None:
    gc.set_threshold(500, 5, 5)
    with MemoryTracker(track_modules=False):
        gc.set_threshold(300, 3, 3)  # code inside the trace changes them; the inner tracker puts them back
        with MemoryTracker(track_modules=False):
            assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_threshold() == (300, 3, 3)
    assert gc.get_threshold() == (500, 5, 5)


def _full_collections(log: list[int]) -> Any:
    def cb(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            log.append(1)

    return cb


def test_a_tensor_in_old_cyclic_garbage_lives_to_the_end_of_the_trace(thresholds: None) -> None:
    """What Dynamo does to the first step's output (``tracker.GC_THRESHOLDS``): a reference cycle holds the tensor,
    it is promoted to the oldest generation while reachable (``gc.collect(1)``), then dropped. The process then
    makes as many long-lived objects as a compile does, which with the caller's thresholds starts a full collection
    (seen without the trace's thresholds: the tensor was freed mid-trace); inside the trace none runs, so the
    tensor's storage lives until the trace ends, on every run."""
    gc.set_threshold(100, 1, 1)
    log: list[int] = []
    cb = _full_collections(log)
    try:
        with MemoryTracker(track_modules=False) as tracker:
            gc.callbacks.append(cb)  # after the tracker's own full collection of what was there before
            x = torch.ones(1024) * 2  # one op: one tracked 4 KiB storage
            cycle: list[Any] = [x]
            cycle.append(cycle)
            # Dynamo's run_gc_after_compile, while the cycle is reachable: now in the oldest generation
            gc.collect(1)
            del x, cycle
            survivors = [[] for _ in range(len(gc.get_objects()))]  # the old generation more than doubled
            # young collections, each ticking the oldest generation's count
            churn = [[i] for i in range(20_000)]
            del churn
            tracker.set_phase("end")
            rec = next(r for r in tracker.records if r.op == "mul")
            assert rec.free_seq is None
            del survivors
            gc.callbacks.remove(cb)
        tracker.close()
    finally:
        if cb in gc.callbacks:
            gc.callbacks.remove(cb)
    assert not log, "a full collection ran inside the trace"
    assert rec.nbytes == 4096


@pytest.mark.slow
def test_a_compiled_trace_after_the_estimate_under_ci_equals_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clean-clone CI failure (CI=true, the engine's estimate first, then the trace in the same process: a
    compiled GPT-2 b2 s512 under autocast read 105.6 MB instead of 111.8 MB: a full collection in the first step's
    backward freed the first step's output Dynamo's garbage held), and the collector's thresholds set to start full
    collections often: the trace reads the bytes, phase by phase, of a trace in a fresh interpreter."""
    from fresh_interpreter import run_json

    name = "gpt2 amp-bf16 sdpa b2 s512 compiled"
    code = (
        "import gc, json, sys\n"
        "from fidelity_cases import COMPILED_CASES, Scenario, estimate\n"
        "from memsim_widget.trace.api import trace_config\n"
        "sc = Scenario.from_dict(dict(COMPILED_CASES)[sys.argv[1]])\n"
        "if sys.argv[2] == 'after':\n"
        "    estimate(sc)\n"
        "    gc.set_threshold(100, 2, 2)\n"
        "tr = trace_config(sc)\n"
        "print(json.dumps({'peak': tr.peak_bytes, 'phases': tr.phase_peaks}))\n"
    )
    fresh = run_json(code, name, "fresh")
    monkeypatch.setenv("CI", "true")
    after = run_json(code, name, "after")
    assert after == fresh
