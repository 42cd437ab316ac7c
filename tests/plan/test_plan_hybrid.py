"""The planner with hybrid sharding (``parallel.dp_shard``): a scenario's own figures through ``plan.vector``
equal ``estimate``'s, a search from an HSDP base shards over every dp rank (HSDP never lowers memory per GPU),
and the GPU-scaling chart adds replicas of the scenario's shard group."""

from __future__ import annotations

import numpy as np
import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.plan import plan
from memsim_widget.plan.gpu_scaling import gpu_scaling
from memsim_widget.plan.vector import evaluate, scenario_columns
from memsim_widget.scenario import Scenario


@pytest.mark.parametrize(
    "data",
    [
        {"framework": "torchtitan", "parallel": {"dp": 8, "dp_shard": 4, "zero": 3}},
        {"framework": "torchtitan", "grad_accum_steps": 2, "parallel": {"dp": 8, "dp_shard": 2, "zero": 3}},
        {"framework": "hf", "parallel": {"dp": 4, "tp": 2, "dp_shard": 2, "zero": 3}},
        {"framework": "deepspeed", "parallel": {"dp": 8, "dp_shard": 2, "zero": 2}},
        {"framework": "deepspeed", "parallel": {"dp": 4, "cp": 2, "dp_shard": 2, "zero": 1}},
        {"framework": "hf", "parallel": {"dp": 8, "dp_shard": 1, "zero": 3}},
    ],
)
def test_a_hybrid_scenario_s_columns_give_estimate_s_figures(data: dict) -> None:
    sc = Scenario.from_dict({"model": "llama-3.2-1b", "seq_len": 1024, **data})
    est = estimate(sc)
    ev = evaluate(sc, {k: np.array([v]) for k, v in scenario_columns(sc).items()}, (sc.optimizer,))
    got = (int(ev.peak_allocated_bytes[0]), int(ev.peak_reserved_bytes[0]), int(ev.device_total_bytes[0]))
    assert got == (est.peak_allocated_bytes, est.peak_reserved_bytes, est.device_total_bytes)


def test_a_search_from_an_hsdp_base_runs_and_shards_over_every_dp_rank() -> None:
    base = Scenario.from_dict(
        {"model": "llama-3.2-1b", "seq_len": 1024, "parallel": {"dp": 8, "dp_shard": 4, "zero": 3}}
    )
    p = plan(base=base, gpus=8, top=5, check=True)
    assert p.fitting > 0
    assert all(p.scenario(int(i)).parallel.dp_shard is None for i in p.frame.candidate)


def test_gpu_scaling_adds_replicas_of_the_shard_group() -> None:
    """ZeRO-3 sharded in groups of 4: from 8 GPUs on, a rank holds the same (the groups and their two
    communicators do not grow); counts whose dp 4 does not divide have no ZeRO rows."""
    sc = Scenario.from_dict(
        {"model": "llama-3.2-1b", "seq_len": 1024, "parallel": {"dp": 8, "dp_shard": 4, "zero": 3}}
    )
    frame = gpu_scaling(sc, gpus=(1, 32))
    z3 = frame[frame.zero == 3]
    assert z3.num_gpus.tolist() == [4, 8, 16, 32]
    assert z3.device_total_gib.iloc[1:].nunique() == 1
    assert set(frame[frame.num_gpus == 2].zero) == {0}
