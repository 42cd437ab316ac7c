"""A run of batches whose lengths vary, replayed step after step (``engine/counters/batch_lengths``;
docs/allocator.md, "Variable lengths")."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import VARIABLE_DIVISOR, rank_stream
from memsim_widget.engine.counters.batch_lengths import (
    DELETE,
    TRUNCATE,
    length_schedule,
    lengths_stream,
    reserved_by_step,
)
from memsim_widget.engine.frameworks import allocator_conf
from memsim_widget.scenario import Scenario

ROOT = Path(__file__).resolve().parents[2]
#: the H200 run whose steps had these lengths (benchmarks/gpu_measure.py, ``qwen05b-bf16-longest``)
H200_LENGTHS = (512, 2048, 1280, 768, 1792, 1024, 1536, 2048)


def _h200_row() -> tuple[Scenario, float]:
    with open(ROOT / "data/measured/gpu_h200.csv") as f:
        table = list(csv.DictReader(f))
    for r in table:
        if r["id"] == "g-qwen05b-bf16-longest-reserved":
            assert str(list(H200_LENGTHS)) in r["notes"], "the run's lengths changed"
            return Scenario.from_dict(json.loads(r["scenario_json"])), float(r["measured_bytes"])
    raise AssertionError("the H200 run with per-step lengths is missing")


@settings(max_examples=200)
@given(
    n=st.integers(0, 60),
    longest=st.integers(1, 20_000),
    shortest=st.integers(1, 500),
    over=st.sampled_from([TRUNCATE, DELETE]),
)
def test_lengths_lie_between_the_shortest_and_the_longest(
    n: int, longest: int, shortest: int, over: str
) -> None:
    lengths = length_schedule(n, longest, 3234.4, 2547.5, shortest, over)
    assert len(lengths) == n
    assert all(min(shortest, longest) <= x <= longest for x in lengths)


@settings(max_examples=100)
@given(n=st.integers(1, 40), per_batch=st.integers(2, 8), over=st.sampled_from([TRUNCATE, DELETE]))
def test_a_batch_is_padded_to_its_longest_sample(n: int, per_batch: int, over: str) -> None:
    """Batch k of ``per_batch`` samples is the longest of samples k x per_batch ... (k + 1) x per_batch - 1."""
    samples = length_schedule(n * per_batch, 2048, 3234.4, 2547.5, 91, over)
    batches = length_schedule(n, 2048, 3234.4, 2547.5, 91, over, per_batch)
    assert batches == tuple(max(samples[k * per_batch : (k + 1) * per_batch]) for k in range(n))


def test_the_lengths_have_the_published_mean_and_deviation() -> None:
    """Uncut, the schedule's samples have the data set's mean and standard deviation (the log-normal's two
    parameters come from them; the golden-ratio quantiles spread over the distribution)."""
    x = length_schedule(20_000, 10**9, 3234.4, 2547.5)
    mean = sum(x) / len(x)
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / len(x))
    assert mean == pytest.approx(3234.4, rel=0.01)
    assert sd == pytest.approx(2547.5, rel=0.05)


def test_dropping_the_long_samples_keeps_the_rest_of_the_distribution() -> None:
    """Under ``DELETE`` no sample is cut: none sits at the longest length, and their median is the log-normal's
    median of the part under it; under ``TRUNCATE`` the share over it is cut to it (P(X > 2048) = 0.62)."""
    cut = length_schedule(1000, 2048, 3234.4, 2547.5, 91, TRUNCATE)
    dropped = length_schedule(1000, 2048, 3234.4, 2547.5, 91, DELETE)
    assert sum(x == 2048 for x in cut) / 1000 == pytest.approx(0.62, abs=0.01)
    assert sum(x == 2048 for x in dropped) <= 1
    assert max(dropped) <= 2048


def test_bad_arguments_name_what_they_allow() -> None:
    with pytest.raises(ValueError, match="over: 'cut'"):
        length_schedule(4, 2048, 3234.4, 2547.5, over="cut")
    with pytest.raises(ValueError, match="longest: 0, must be >= 1"):
        length_schedule(4, 0, 3234.4, 2547.5)
    with pytest.raises(ValueError, match="sd: -1.0, must be > 0"):
        length_schedule(4, 2048, 3234.4, -1.0)
    ctx = Context(
        Scenario.from_dict({"model": "gpt2", "seq_len": 512, "grad_accum_steps": 2, "padding": "longest"})
    )
    with pytest.raises(ValueError, match="lengths: 3 micro-batches is not a whole number of steps of 2"):
        lengths_stream(ctx, ctx.stages[0], (512, 256, 128))


@pytest.mark.parametrize("micro", [1, 3])
def test_the_two_step_replay_is_the_run_of_a_short_then_the_longest_batch(micro: int) -> None:
    """The estimate's stream for ``padding: longest`` (step 1 at 1/VARIABLE_DIVISOR of the longest length) is
    the stream of that schedule of lengths, event for event."""
    sc = Scenario.from_dict(
        {"model": "qwen2.5-0.5b", "seq_len": 1024, "padding": "longest", "grad_accum_steps": micro}
    )
    ctx = Context(sc)
    short = (1024 // VARIABLE_DIVISOR,) * micro + (1024,) * micro
    ran = lengths_stream(ctx, ctx.stages[0], short)
    estimated = rank_stream(ctx, ctx.stages[0])
    assert ran.events == estimated.events
    assert ran.marks == estimated.marks


def test_the_h200_run_replayed_at_its_lengths_meets_its_reserved() -> None:
    """The H200 run whose eight steps had the lengths ``H200_LENGTHS`` (a test row: nothing fitted): replayed
    at those lengths, its peak reserved is within 1% of ``max_memory_reserved`` (30.33 GiB against 30.20; the
    estimate's two steps give 31.25, +3.5%). Its peak comes at the first step at the longest length and the
    steps after it add less than 0.05 GiB."""
    sc, measured = _h200_row()
    ctx = Context(sc)
    by_step, failure = reserved_by_step(lengths_stream(ctx, ctx.stages[0], H200_LENGTHS), allocator_conf(ctx))
    assert failure is None
    assert len(by_step) == len(H200_LENGTHS)
    assert by_step[-1] == pytest.approx(measured, rel=0.01)
    assert by_step[-1] - by_step[1] < 0.05 * 2**30


def test_a_run_too_large_for_its_card_stops_at_the_failing_step() -> None:
    sc, _ = _h200_row()
    ctx = Context(sc)
    stream = lengths_stream(ctx, ctx.stages[0], H200_LENGTHS)
    unlimited, _ = reserved_by_step(stream, allocator_conf(ctx))
    by_step, failure = reserved_by_step(stream, allocator_conf(ctx), capacity=unlimited[0] + 2**30)
    assert failure is not None
    assert len(by_step) == 2  # step 1 (512 tokens) fits; step 2 (2048) does not
