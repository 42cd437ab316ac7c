"""FSDP2 with gradient accumulation under HF Trainer (``fsdp2_accumulation == "no_sync"``): every micro-batch
but the last runs with ``set_requires_gradient_sync(False)``, so each unit's UNSHARDED gradients stay alive
through the later micro-batches (docs/allocator.md, "FSDP2 with gradient accumulation"). The model states count
them (``states/gathered._unsynced_grads``), read from the scenario through one bit
(``frameworks.fsdp2_unsynced_grads``) that the states' cache key and the planner's state key hold."""

from __future__ import annotations

import numpy as np
import pytest
from fidelity_cases import LLAMA_H512_V32K
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget import estimate
from memsim_widget.engine.caches import parts_cache
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import rank_stream
from memsim_widget.engine.counters.allocator import replay
from memsim_widget.engine.frameworks import fsdp2_unsynced_grads, unsynced_grads
from memsim_widget.engine.states import model_states
from memsim_widget.plan import SearchSpace, plan
from memsim_widget.scenario import Scenario

_REAL = {"model": "llama-3.2-1b", "micro_batch_size": 1, "seq_len": 1024, "precision": "bf16"}
_SMALL = {"model": LLAMA_H512_V32K, "micro_batch_size": 2, "seq_len": 512, "precision": "bf16"}
_FSDP4 = {"parallel": {"dp": 4, "zero": 3}}

#: Peak allocated bytes of rank 0 in the fake-tensor trace of the real loop (benchmarks/allocator_replay_fsdp.py
#: -k " a", the "allocated: trace" column of docs/allocator.md's table); the engine was 6.6% to 22.1% under them.
TRACED = [
    ("llama-3.2-1b a2", {**_REAL, **_FSDP4, "grad_accum_steps": 2}, 8_419_223_552),
    ("llama L4 h512 V32k a3", {**_SMALL, **_FSDP4, "grad_accum_steps": 3}, 790_129_664),
    (
        "llama L4 h512 V32k tied a2",
        {
            **_SMALL,
            "model": {**LLAMA_H512_V32K, "tie_word_embeddings": True},
            **_FSDP4,
            "grad_accum_steps": 2,
        },
        696_740_352,
    ),
    (
        "llama L4 h512 V32k ckpt a2",
        {**_SMALL, **_FSDP4, "grad_accum_steps": 2, "activation_checkpointing": "full"},
        700_611_584,
    ),
]


@pytest.mark.parametrize(("name", "d", "traced"), TRACED, ids=[c[0] for c in TRACED])
def test_allocated_is_within_one_percent_under_the_trace(name, d, traced):
    got = estimate(d).ranks[0].peak_allocated_bytes
    # under it by at most 1% (the prototype's -0.07%..-0.93%): what is left is not these gradients
    assert -0.01 <= (got - traced) / traced <= 0, name


def _accumulated(d: dict) -> list:  # type: ignore[type-arg]
    ctx = Context(Scenario.from_dict(d))
    return model_states(ctx, ctx.stages[0]).accumulated_grads


def test_the_unsharded_gradients_are_every_trainable_element_in_bf16():
    # llama-3.2-1b (tied): 1,235,814,400 parameters, each a bf16 gradient on every rank (no dp shard until
    # the last micro-batch reduce-scatters them)
    d = {**_REAL, **_FSDP4, "grad_accum_steps": 2}
    assert Context(Scenario.from_dict(d)).trainable_parameters == 1_235_814_400
    assert _accumulated(d)[0].bytes == 1_235_814_400 * 2


@pytest.mark.parametrize(
    "change",
    [
        {"grad_accum_steps": 1},
        {"framework": "torchtitan"},  # "reduce": the sharded gradients carried
        {"parallel": {"dp": 4, "zero": 2}},  # no FSDP2 units
        {"parallel": {"dp": 4, "zero": 3, "offload": "optimizer+params"}},  # units fetched from the host
    ],
    ids=["one micro-batch", "torchtitan", "zero 2", "params offloaded"],
)
def test_only_an_accumulating_no_sync_fsdp2_rank_keeps_them(change):
    d = {**_REAL, **_FSDP4, "grad_accum_steps": 2}
    assert fsdp2_unsynced_grads(Scenario.from_dict(d))
    assert _accumulated(d)
    changed = {**d, **change}
    assert not fsdp2_unsynced_grads(Scenario.from_dict(changed))
    assert _accumulated(changed) == []


def test_the_states_read_the_accumulation_steps_only_through_the_bit():
    d = {**_SMALL, **_FSDP4}
    two, eight = ({**d, "grad_accum_steps": n} for n in (2, 8))
    c2, c8 = Context(Scenario.from_dict(two)), Context(Scenario.from_dict(eight))
    assert model_states(c2, c2.stages[0]) == model_states(c8, c8.stages[0])


def test_the_states_cache_tells_one_micro_batch_from_several():
    one = {**_SMALL, **_FSDP4}
    two = {**one, "grad_accum_steps": 2}
    for first, second in ((one, two), (two, one)):
        parts_cache.cache_clear()
        ca, cb = Context(Scenario.from_dict(first)), Context(Scenario.from_dict(second))
        parts_cache.cached_model_states(ca, ca.stages[0])
        warm = parts_cache.cached_model_states(cb, cb.stages[0])
        assert warm == model_states(cb, cb.stages[0])
        assert warm != model_states(ca, ca.stages[0])
    parts_cache.cache_clear()


@settings(max_examples=200, deadline=None)
@given(
    framework=st.sampled_from(["hf", "torchtitan", "liger", "deepspeed", "torchtune"]),
    in_backward=st.booleans(),
    accum=st.integers(1, 4),
    zero=st.integers(0, 3),
    dp=st.sampled_from([1, 2, 4]),
    cp=st.sampled_from([1, 2]),
    pp=st.sampled_from([1, 2]),
    on_host=st.booleans(),
)
def test_the_planner_columns_give_the_scenario_bit(framework, in_backward, accum, zero, dp, cp, pp, on_host):
    """``unsynced_grads`` on numpy columns (the planner) equals it on one scenario's integers (the engine)."""
    one = bool(unsynced_grads(framework, in_backward, accum, zero, dp, cp, pp, on_host))
    cols = unsynced_grads(
        framework, in_backward, *(np.array([v]) for v in (accum, zero, dp, cp, pp)), np.array([on_host])
    )
    assert bool(np.broadcast_to(cols, (1,))[0]) == one


@pytest.mark.parametrize("framework", ["hf", "torchtitan"])
def test_the_planner_equals_estimate_on_accumulating_fsdp2_candidates(framework):
    """The fitted rule (no replay): a global batch of 8 sequences over 2 and 4 GPUs, the ZeRO-3 candidates
    running 1 to 4 micro-batches a step, each equal to ``estimate`` byte for byte."""
    base = {"model": LLAMA_H512_V32K, "seq_len": 512, "framework": framework}
    space = SearchSpace(micro_batch=(1, 2), zero=(3,), offload=("none",))
    p = plan(base=base, gpu="h100-sxm-80gb", gpus=(2, 4), space=space, top=10, global_batch_tokens=8 * 512)
    assert p.mismatches(np.arange(p.evaluated)) == []
    kept = [fsdp2_unsynced_grads(p.estimate(i).scenario) for i in range(p.evaluated)]
    assert any(kept) == (framework == "hf")


@pytest.mark.parametrize(("name", "d", "traced"), TRACED, ids=[c[0] for c in TRACED])
def test_the_states_agree_with_the_allocation_stream_within_one_percent(name, d, traced):
    """The allocation stream (``fsdp_stream``: the units' unsharded gradients kept by unit, held to the traces
    within 0.25%) and the states count the same tensors."""
    ctx = Context(Scenario.from_dict(d))
    got = replay(rank_stream(ctx, ctx.stages[0]).events).peak_allocated
    want = estimate(d).ranks[0].peak_allocated_bytes
    assert abs(got / want - 1) < 0.01, name
