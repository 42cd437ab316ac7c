"""The moment table (``engine/step/moments``) and the two paths that read it: the engine's timeline and the planner.

``tests/plan/test_plan_vector.py`` holds the two paths' figures equal byte for byte; these tests hold them to the same
table: every group it names is built by both, on one side each, and a moment's totals are its items' sums.
"""

from __future__ import annotations

import numpy as np
import pytest

from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.overhead import PERSISTENT_CATEGORIES, pool_bytes, workspace_items
from memsim_widget.engine.rl.objectives import training_scenario
from memsim_widget.engine.states import model_states
from memsim_widget.engine.step import timeline
from memsim_widget.engine.step.moments import (
    ACTIVATION_GROUPS,
    MOMENT_TABLE,
    MOMENTS,
    STATE_GROUPS,
    STREAM_GROUPS,
)
from memsim_widget.plan import vector
from memsim_widget.scenario import Scenario

SCENARIOS = [
    {"model": "llama-3.2-1b", "seq_len": 1024},
    {"model": "llama-3.2-1b", "activation_checkpointing": "full", "grad_accum_steps": 4},
    {"model": "llama-3.2-1b", "parallel": {"pp": 4, "pp_microbatches": 8, "dp": 2, "zero": 3}},
    {"model": "llama-3.2-1b", "framework": "torchtitan", "parallel": {"dp": 4, "zero": 3, "tp": 2}},
    {"model": "llama-3.2-1b", "method": "lora", "output_lifetime": "step", "optimizer_in_backward": True},
    {"model": "qwen2.5-0.5b", "attention": "eager", "padding": "longest", "objective": "dpo"},
]


def test_every_group_the_table_names_is_on_one_side_and_every_declared_group_is_used():
    named = {g for rule in MOMENT_TABLE for g in rule.groups}
    assert not set(STATE_GROUPS) & set(ACTIVATION_GROUPS)
    # but the groups built for the allocation streams alone (the step's temporaries, per parameter)
    assert set(STREAM_GROUPS) <= set(STATE_GROUPS) and not set(STREAM_GROUPS) & named
    assert named == (set(STATE_GROUPS) - set(STREAM_GROUPS)) | set(ACTIVATION_GROUPS)
    assert MOMENTS == (
        "forward_end",
        "backward_start",
        "head_backward",
        "backward_regather",
        "backward_top",
        "chunk_regather",
        "backward_end",
        "backward_next",
        "root_grads_made",
        "root_reduce_scatter",
        "optimizer_step",
    )
    # a moment with alternatives compares two instants or more (the planner picks among any number)
    assert all(len(rule.larger_of) != 1 for rule in MOMENT_TABLE)


@pytest.mark.parametrize("data", SCENARIOS[:4], ids=range(4))
def test_the_engine_timeline_builds_exactly_the_table_groups(data):
    ctx = Context(Scenario.from_dict(data))
    stage = ctx.stages[-1]
    f = ctx.in_flight(stage)
    states = model_states(ctx, stage)
    built = timeline._state_groups(ctx, stage, states, workspace_items(ctx), f)
    assert tuple(built) == STATE_GROUPS
    assert set(timeline._activation_groups(ctx, stage, activations(ctx), f)) == set(ACTIVATION_GROUPS)


def test_the_planner_builds_exactly_the_table_groups_on_each_side():
    base = Scenario.from_dict({"model": "llama-3.2-1b", "seq_len": 1024})
    cols = {k: np.array([v]) for k, v in vector.scenario_columns(base).items()}
    akey, _ = vector.unique_codes(
        [cols[k] for k in ("micro_batch", "tp", "cp", "sp", "checkpointing", "loss")]
    )
    xkey = np.array([[0, 1, 0, 1]])  # the first (and only) stage of the one activation key
    groups, _, _ = vector._activation_side(base, 16, akey, vector._act_rows(base, akey), xkey)
    assert set(groups) == set(ACTIVATION_GROUPS)
    # one GPU, adamw, no ZeRO or offload; first and last stage, an even split, synced, not carried (0: unset)
    ones = {"tp", "ep", "dp", "cp", "pp", "first", "last"}
    skey = np.array([[int(name in ones) for name in vector.STATE_KEY]])
    ws = np.zeros(vector.NSTAT, dtype=np.int64)
    states, _ = vector._state_side(base, ("adamw",), skey, 16, ws)
    assert tuple(states) == STATE_GROUPS


@pytest.mark.parametrize("data", SCENARIOS, ids=range(len(SCENARIOS)))
def test_a_moments_totals_are_the_sums_of_its_items(data):
    est = estimate(data)
    ctx = Context(training_scenario(Scenario.from_dict(data)))
    loss_names = activations(ctx).loss_buffer_names()
    for rank in est.ranks:
        for m in rank.moments:
            items = m.items
            assert m.tensor_bytes == sum(i.bytes for i in items if i.level == "tensor")
            assert m.allocated_bytes == sum(i.allocated_bytes for i in items)
            alloc, long, loss = m.pool_sums(PERSISTENT_CATEGORIES, loss_names)
            assert alloc == pool_bytes(ctx, items, loss_names)[0] == m.allocated_bytes
            assert long == sum(i.allocated_bytes for i in items if i.category in PERSISTENT_CATEGORIES)
            assert loss == sum(
                i.allocated_bytes
                for i in items
                if i.category not in PERSISTENT_CATEGORIES and i.item in loss_names
            )
