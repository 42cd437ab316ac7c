"""Issue #22's bar for the engine's reserved by replay (``reserved_model: replay``), held to the project's own
eager GPU runs (data/measured/gpu_*.csv; a test set: nothing is fitted on it): median error within 3%, and no
run under-predicted by more than 3% but one whose allocated miss is explained (docs/accuracy.md)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fidelity_measured as fm  # noqa: E402


@pytest.fixture(scope="module")
def errors() -> dict[str, dict[str, float]]:
    return fm.replay_errors(fm.load_rows())


def _explained() -> set[str]:
    return {rid.removeprefix("g-").removesuffix("-allocated") for rid in fm.GPU_EXPLAINED_ALLOCATED}


@pytest.mark.parametrize("counter", ["reserved", "nvidia-smi"])
def test_the_median_replayed_counter_is_within_the_bar(errors: dict, counter: str) -> None:
    e = [x[counter] for x in errors.values() if counter in x]
    assert len(e) >= 20, "the eager GPU runs are missing"
    assert abs(statistics.median(e)) < fm.GPU_TARGET_REPLAY_MEDIAN, statistics.median(e)


@pytest.mark.parametrize("counter", ["reserved", "nvidia-smi"])
def test_no_run_is_under_beyond_the_bar_but_the_explained(errors: dict, counter: str) -> None:
    """qwen05b-bf16 and modernbert-base were 13-14% under until the autograd thread's cuBLAS workspace was
    placed at the first backward matmul (docs/allocator.md); a run left under has its allocated miss explained
    (the engine's terms, not the allocator) or a stated cause (``GPU_EXPLAINED_REPLAY``)."""
    under = {run for run, x in errors.items() if x.get(counter, 0.0) < fm.GPU_TARGET_REPLAY_UNDER}
    named = {k.removesuffix(f"-{counter}") for k in fm.GPU_EXPLAINED_REPLAY if k.endswith(f"-{counter}")}
    assert under <= _explained() | named, under - _explained() - named
    assert named <= under, (
        f"explained but no longer under: {named - under}"
    )  # the explanation cannot go stale


def test_the_bar_can_fail(errors: dict) -> None:
    """A run replayed 5% low is caught; the compiled runs are left out of the bar."""
    run = next(iter(sorted(set(errors) - _explained())))
    low = {**errors, run: {"reserved": -0.05, "nvidia-smi": -0.05}}
    assert {r for r, x in low.items() if x["reserved"] < fm.GPU_TARGET_REPLAY_UNDER} - _explained() == {run}
    assert not any("compile" in r for r in errors)
