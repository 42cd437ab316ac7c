"""``plan.reach``'s search: the largest stop at which some candidate fits, found with few evaluations.

The climb (``_climb``) is held to a linear scan over synthetic candidates whose memory grows with the stop,
linearly, with a jump, or flat (hypothesis); the answers on real scenarios are held to ``plan`` and ``estimate``
in ``tests/plan/test_answers_properties.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from memsim_widget.errors import ScenarioError
from memsim_widget.plan.reach import _climb, layout_words, reach
from memsim_widget.plan.recommend import planner_space
from memsim_widget.scenario import Scenario

LIMIT = 1000.0

#: One synthetic candidate: memory at stop k = base + slope * k, plus ``jump`` from stop ``at`` on.
candidate = st.tuples(st.integers(0, 1200), st.integers(0, 60), st.integers(0, 500), st.integers(1, 5000))


def synthetic(cands: list[tuple[int, int, int, int]]):
    """``memory(k, idx)`` of the candidates, and a counter of the stops it was asked for."""
    table = np.array(cands, dtype=np.float64).reshape(-1, 4)
    asked: list[int] = []

    def memory(k: int, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        asked.append(k)
        b, s, j, at = (table[idx, c] for c in range(4))
        mem = b + s * k + np.where(k >= at, j, 0.0)
        return mem, mem <= LIMIT

    return memory, table, asked


@settings(max_examples=300, deadline=None)
@example(cands=[(501, 0, 500, 81)], hi=191, start=1)  # flat then a jump: 21 stops with two secant stalls
@given(cands=st.lists(candidate, min_size=1, max_size=12), hi=st.integers(1, 5000), start=st.integers(1, 40))
def test_climb_finds_what_a_linear_scan_finds(cands, hi, start):
    memory, table, asked = synthetic(cands)
    everyone = np.arange(len(cands))
    scan = [k for k in range(start, hi + 1) if memory(k, everyone)[1].any()]
    # memory grows with k for each candidate, so the stops that fit are those up to the largest
    want = scan[-1] if scan and scan[0] == start else None
    asked.clear()
    assert _climb(memory, LIMIT, everyone, hi, start) == want
    assert len(asked) <= 2 * max(hi, 2).bit_length() + 4  # no worse than doubling then bisection, roughly


def test_climb_of_linear_memory_takes_a_few_steps():
    memory, _, asked = synthetic([(100, 3, 0, 1), (300, 2, 0, 1)])
    assert _climb(memory, LIMIT, np.arange(2), 4096) == 350  # 300 + 2 * 350 = 1000
    assert len(asked) <= 6


def test_reach_refuses_what_the_planner_does_not_model():
    sc = Scenario.from_dict({"model": "qwen2.5-0.5b", "objective": "dpo", "method": "lora"})
    with pytest.raises(ScenarioError, match="objective"):
        reach(sc, "micro_batch_size", planner_space(sc), top=64)


def test_reach_keeps_the_job_and_the_gpus():
    sc = Scenario.from_dict({"model": "qwen2.5-0.5b", "gpu": "l4", "method": "lora", "parallel": {"dp": 2}})
    r = reach(sc, "micro_batch_size", planner_space(sc), top=4096)
    assert r is not None and r.scenario.method == "lora" and r.scenario.parallel.world_size == 2
    assert r.scenario.micro_batch_size == r.value and r.next_stop == r.value + 1
    assert r.layout == layout_words(r.scenario) and f"micro-batch {r.value}" in r.layout
    assert r.to_dict()["scenario"] == r.scenario.to_dict()
