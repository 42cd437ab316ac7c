"""The engine's part caches (``engine/caches/parts_cache``): keyed by every field that changes a part, and by no other.

Each cached part is checked three ways: the fields its key leaves out really leave the uncached part unchanged;
two scenarios differing only in a field the key must hold get different parts through the warm cache; and an
estimate made with warm caches equals one made cold, item for item.
"""

from __future__ import annotations

import dataclasses

import pytest

from memsim_widget.engine.activations import activations
from memsim_widget.engine.caches import parts_cache
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import _estimate, estimate
from memsim_widget.engine.counters.overhead import workspace_items
from memsim_widget.engine.states import model_states
from memsim_widget.engine.step.timeline import state_groups
from memsim_widget.scenario import Scenario

#: Base scenarios reaching the engine's branches: compile, tensor and pipeline parallel, LoRA, a framework with its
#: own FSDP rules, an MoE and a multimodal model, a state-space model.
BASES = [
    {"model": "llama-3.2-1b", "seq_len": 1024},
    {"model": "llama-3.2-1b", "seq_len": 1024, "compile": True},  # the compiled rule (traced) and formula
    {"model": "llama-3.2-1b", "seq_len": 1024, "parallel": {"tp": 2, "pp": 2, "pp_microbatches": 4}},
    {"model": "llama-3.2-1b", "method": "lora", "seq_len": 512},
    {"model": "llama-3.2-1b", "framework": "torchtitan", "parallel": {"dp": 2, "zero": 3}},
    {"model": "llama-3.2-1b", "framework": "torchtitan", "compile": True},  # its loss compiled apart
    {"model": "mixtral-8x7b", "seq_len": 256, "parallel": {"dp": 2, "ep": 2, "zero": 1}},
    {"model": "llava-1.5-7b", "seq_len": 256, "method": "lora"},
    {"model": "mamba-130m", "seq_len": 256},
]

#: A different value for every field the model-states key leaves out (checkpoint_every with full checkpointing).
STATES_IGNORED = {
    "micro_batch_size": {"micro_batch_size": 3},
    "seq_len": {"seq_len": 128},
    "grad_accum_steps": {"grad_accum_steps": 8},
    "activation_checkpointing": {"activation_checkpointing": "full"},
    "checkpoint_every": {"activation_checkpointing": "full", "checkpoint_every": 2},
    # (``attention`` is read: one GPU's eager core meets the top layer's gradients, gradients._top_layer_made)
    "loss": {"loss": "chunked"},
    "output_lifetime": {"output_lifetime": "step"},
    "zero_grad": {"zero_grad": "zeros"},
    "ssm_kernel": {"ssm_kernel": "torch"},
    "activation_offloading": {"activation_offloading": True},
    "activation_offloading_layers": {"activation_offloading": True, "activation_offloading_layers": 3},
    "padding": {"padding": "longest"},
    "cuda_lazy_loading": {"cuda_lazy_loading": False},
    "allocator_conf": {"allocator_conf": "expandable_segments:True,max_split_size_mb:128"},
    "reserved_model": {"reserved_model": "replay"},
    "compile_loss": {"compile_loss": False},
}
#: A different value for every field the activations key leaves out.
ACTIVATIONS_IGNORED = {
    "optimizer": {"optimizer": "sgd"},
    "optimizer_impl": {"optimizer_impl": "fused"},
    "optimizer_in_backward": {"optimizer_in_backward": True},
    "zero_grad": {"zero_grad": "zeros"},
    "grad_accum_steps": {"grad_accum_steps": 8},
    "gpu": {"gpu": "a100-40gb"},
    "allocator_conf": {"allocator_conf": "expandable_segments:True,max_split_size_mb:128"},
    "reserved_model": {"reserved_model": "replay"},
    "parallel.dp": {"parallel": {"dp": 4}},
    "parallel.zero": {"parallel": {"dp": 4, "zero": 3}},
    "parallel.offload": {"parallel": {"dp": 4, "zero": 3, "offload": "optimizer+params"}},
    "parallel.reshard_after_forward": {"parallel": {"dp": 4, "zero": 3, "reshard_after_forward": False}},
    "parallel.overlap_comm": {"parallel": {"dp": 4, "zero": 2, "overlap_comm": True}},
    "parallel.reduce_bucket_size": {"parallel": {"dp": 4, "zero": 2, "reduce_bucket_size": "auto"}},
    "parallel.dp_shard": {"parallel": {"dp": 4, "zero": 3, "dp_shard": 2}},
}


def _merged(base: dict, change: dict) -> dict:
    """``base`` with ``change`` merged (``parallel`` key by key)."""
    return {**base, **change, "parallel": {**base.get("parallel", {}), **change.get("parallel", {})}}


def _variant(base: dict, change: dict) -> Scenario | None:
    """``base`` with ``change`` merged, or None where the engine refuses it."""
    try:
        sc = Scenario.from_dict(_merged(base, change))
        Context(sc)
        return sc
    except Exception:  # a combination the scenario or the model refuses: nothing to compare
        return None


def test_the_keys_cover_every_scenario_field_but_the_ignored_ones():
    names = {f.name for f in dataclasses.fields(Scenario)}
    assert set(parts_cache._STATES_FIELDS) == names - parts_cache.STATES_IGNORE
    assert set(parts_cache._ACTS_FIELDS) == names - parts_cache.ACTIVATIONS_IGNORE - {"parallel"}
    assert set(parts_cache._STATE_GROUPS_FIELDS) == names - parts_cache.STATE_GROUPS_IGNORE
    assert names >= parts_cache.STATES_IGNORE and names >= parts_cache.ACTIVATIONS_IGNORE
    assert set(STATES_IGNORED) == parts_cache.STATES_IGNORE
    assert set(ACTIVATIONS_IGNORED) == parts_cache.ACTIVATIONS_IGNORE | {
        f"parallel.{n}" for n in parts_cache.ACTIVATIONS_IGNORE_PARALLEL
    }


@pytest.mark.parametrize("field", sorted(STATES_IGNORED))
def test_model_states_do_not_read_the_fields_their_key_leaves_out(field):
    compared = 0
    for base in BASES:
        a, b = _variant(base, {}), _variant(base, STATES_IGNORED[field])
        if a is None or b is None:
            continue
        ca, cb = Context(a), Context(b)
        for sa, sb in zip(ca.stages, cb.stages, strict=True):
            assert model_states(ca, sa) == model_states(cb, sb)
        assert ca.trainable_parameters == cb.trainable_parameters
        compared += 1
    assert compared  # at least one base takes the change


def _group_figures(side: tuple) -> tuple:  # type: ignore[type-arg]
    """Every figure of a rank's model-state groups (``timeline.state_groups``): each group's name, raw and
    allocated bytes and items, and step 1's persistent group."""
    groups, first = side
    return (
        {name: (g.raw, g.allocated, tuple(g.entries)) for name, g in groups.items()},
        None if first is None else (first.raw, first.allocated, tuple(first.entries)),
    )


def _state_group_sums(ctx: Context, stage) -> tuple:  # type: ignore[no-untyped-def]
    """``_group_figures`` of a rank's model-state groups computed uncached."""
    return _group_figures(state_groups(ctx, stage, model_states(ctx, stage), workspace_items(ctx)))


@pytest.mark.parametrize("field", sorted(STATES_IGNORED.keys() - {"grad_accum_steps", "zero_grad"}))
def test_state_groups_do_not_read_the_fields_their_key_leaves_out(field):
    compared = 0
    for base in BASES:
        a, b = _variant(base, {}), _variant(base, STATES_IGNORED[field])
        if a is None or b is None:
            continue
        ca, cb = Context(a), Context(b)
        for sa, sb in zip(ca.stages, cb.stages, strict=True):
            assert _state_group_sums(ca, sa) == _state_group_sums(cb, sb)
        compared += 1
    assert compared


@pytest.mark.parametrize("field", sorted(ACTIVATIONS_IGNORED))
def test_activations_do_not_read_the_fields_their_key_leaves_out(field):
    compared = 0
    for base in BASES:
        a, b = _variant(base, {}), _variant(base, ACTIVATIONS_IGNORED[field])
        if a is None or b is None:
            continue
        assert activations(Context(a)) == activations(Context(b))
        compared += 1
    assert compared


def _assert_told_apart(first: dict, second: dict, part) -> None:  # type: ignore[no-untyped-def]
    """``part`` of ``second`` is the same computed through a cache warmed with ``first`` as computed cold, and
    differs from ``first``'s: the key holds the field the two differ in."""
    parts_cache.cache_clear()
    part(Context(Scenario.from_dict(first)))
    warm = part(Context(Scenario.from_dict(second)))
    parts_cache.cache_clear()
    assert warm == part(Context(Scenario.from_dict(second)))
    parts_cache.cache_clear()
    assert part(Context(Scenario.from_dict(first))) != warm


@pytest.mark.parametrize(
    "change",
    [{"parallel": {"dp": 8, "zero": 3}}, {"optimizer": "sgd"}, {"precision": "fp32"}, {"method": "lora"}],
    ids=["zero", "optimizer", "precision", "method"],
)
def test_model_states_cache_tells_apart_scenarios_differing_in_a_key_field(change):
    base = {"model": "llama-3.2-1b", "parallel": {"dp": 8}}

    def part(ctx: Context):  # type: ignore[no-untyped-def]
        return parts_cache.cached_model_states(ctx, ctx.stages[0])

    _assert_told_apart(base, _merged(base, change), part)


@pytest.mark.parametrize(
    "change",
    [
        {"micro_batch_size": 2},
        {"seq_len": 1024},
        {"activation_checkpointing": "full"},
        {"parallel": {"tp": 2}},
    ],
    ids=["micro_batch", "seq_len", "checkpointing", "tp"],
)
def test_activations_cache_tells_apart_scenarios_differing_in_a_key_field(change):
    base = {"model": "llama-3.2-1b", "seq_len": 512}
    _assert_told_apart(base, {**base, **change}, parts_cache.cached_activations)


def test_activations_cache_tells_apart_fsdp_on_and_off_under_torchtitan_tp():
    # dp and zero are out of the activations key, but FSDP decides torchtitan's compute dtype under TP (fp32
    # without it: frameworks.no_mixed_precision); a warm cache once served the bf16 terms of dp 2 ZeRO-3 to
    # dp 1 (found by tests/plan/test_plan_equals_estimate.py's random bases)
    base = {
        "model": "gpt2",
        "seq_len": 512,
        "precision": "amp-bf16",
        "framework": "torchtitan",
        "parallel": {"tp": 2},
    }
    fsdp = {**base, "parallel": {"tp": 2, "dp": 2, "zero": 3}}
    _assert_told_apart(fsdp, base, parts_cache.cached_activations)


def test_activations_cache_tells_apart_expert_tp_folded_over_the_tp_group_or_not():
    # dp is out of the activations key, but with ep beyond dp x cp the experts fold over the TP group and stay
    # whole (ParallelConfig.expert_tp 1 at dp 1, 2 at dp 2): an expert's width I / expert_tp differs
    base = {"model": "mixtral-8x7b", "seq_len": 256, "parallel": {"tp": 2, "ep": 2}}
    dp2 = {**base, "parallel": {"tp": 2, "ep": 2, "dp": 2}}
    _assert_told_apart(base, dp2, parts_cache.cached_activations)
    _assert_told_apart(dp2, base, parts_cache.cached_activations)


def test_a_mixtral_estimate_after_its_dp_1_neighbour_equals_it_cold():
    # the pair the planner's byte-for-byte test met (tests/plan/test_plan_vector.py's mixtral base): the dp 1
    # estimate warmed the activations with whole experts (I = 14,336), which the dp 8 one then reused in place
    # of its TP-split ones (I / 2): +528,482,304 B peak allocated
    common = {"model": "mixtral-8x7b", "micro_batch_size": 3, "seq_len": 1024, "activation_checkpointing": "full",
              "loss": "chunked", "optimizer_impl": "fused"}  # fmt: skip
    par = {"tp": 2, "pp": 3, "ep": 2, "sequence_parallel": True, "pp_microbatches": 6}
    before = {**common, "optimizer": "adamw-8bit", "parallel": {**par, "dp": 1, "zero": 0}}
    after = {**common, "optimizer": "paged-adamw-8bit", "parallel": {**par, "dp": 8, "zero": 1}}
    _estimate.cache_clear()
    parts_cache.cache_clear()
    cold = estimate(after).to_dict()
    _estimate.cache_clear()
    parts_cache.cache_clear()
    estimate(before)
    assert estimate(after).to_dict() == cold


@pytest.mark.parametrize(
    "change",
    [{"parallel": {"pp": 2, "pp_microbatches": 4}}, {"activation_checkpointing": "full"}, {"seq_len": 1024}],
    ids=["pipeline", "checkpointing", "seq_len"],
)
def test_activation_groups_cache_tells_apart_scenarios_differing_in_a_key_field(change):
    base = {"model": "llama-3.2-1b", "seq_len": 512, "parallel": {"pp": 2, "pp_microbatches": 2}}

    def part(ctx: Context) -> dict[str, tuple[int, int, int]]:
        groups = parts_cache.cached_activation_groups(ctx, ctx.stages[0])
        return {name: (g.raw, g.allocated, len(g.entries)) for name, g in groups.items()}

    _assert_told_apart(base, {**base, **change}, part)


@pytest.mark.parametrize(
    "change",
    [
        {"grad_accum_steps": 4},
        {"parallel": {"pp_microbatches": 8}},
        {"optimizer": "sgd"},
        {"gpu": "a100-40gb"},
        {"zero_grad": "zeros"},
    ],
    ids=["grad_accum", "pp_microbatches", "optimizer", "gpu", "zero_grad"],
)
def test_state_groups_cache_tells_apart_scenarios_differing_in_a_key_field(change):
    base = {"model": "llama-3.2-1b", "seq_len": 512, "parallel": {"pp": 2, "pp_microbatches": 2}}

    def part(ctx: Context) -> tuple:  # type: ignore[type-arg]
        return _group_figures(parts_cache.cached_state_groups(ctx, ctx.stages[0]))

    _assert_told_apart(base, _merged(base, change), part)


@pytest.mark.parametrize(
    "change",
    [{"method": "lora"}, {"lora": {"rank": 64}}, {"lora": {"target_scope": "language"}}],
    ids=["method", "rank", "tower"],
)
def test_trainable_parameters_cache_tells_apart_scenarios_differing_in_a_key_field(change):
    base = {"model": "llava-1.5-7b", "seq_len": 256, "method": "lora"}
    if "method" in change:
        base = {"model": "llava-1.5-7b", "seq_len": 256}
    _assert_told_apart(base, {**base, **change}, parts_cache.cached_trainable_parameters)


def test_an_estimate_with_warm_parts_equals_a_cold_one_item_for_item():
    sweep = [{"model": "llama-3.2-1b", "seq_len": s, "micro_batch_size": b, "parallel": {"dp": dp, "zero": z}}
             for s in (512, 1024) for b in (1, 2) for dp, z in ((1, 0), (4, 1), (4, 3))]  # fmt: skip
    _estimate.cache_clear()
    parts_cache.cache_clear()
    warm = [estimate(d) for d in sweep]  # each reuses the parts of the ones before it
    for d, w in zip(sweep, warm, strict=True):
        _estimate.cache_clear()
        parts_cache.cache_clear()
        cold = estimate(d)
        assert [(m.name, m.items) for r in w.ranks for m in r.moments] == [
            (m.name, m.items) for r in cold.ranks for m in r.moments
        ]
        assert (
            w.peak_allocated_bytes,
            w.peak_reserved_bytes,
            w.device_total_bytes,
            w.trainable_parameters,
        ) == (
            cold.peak_allocated_bytes,
            cold.peak_reserved_bytes,
            cold.device_total_bytes,
            cold.trainable_parameters,
        )


def test_the_caches_are_bounded():
    for fn in (
        parts_cache._states,
        parts_cache._activations,
        parts_cache._trainable,
        parts_cache._act_groups,
    ):
        assert fn.cache_info().maxsize == parts_cache.CACHE_SIZE
