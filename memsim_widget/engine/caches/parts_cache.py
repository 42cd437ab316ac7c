"""The engine's costly parts memoised by the scenario fields they read, so that a new scenario reuses them.

A rank's model states (``engine/states.model_states``) never read the micro-batch, sequence, checkpointing or
loss keys; one micro-batch's activation terms (``engine/activations.activations``) never read the optimizer,
the data-parallel degree, the ZeRO stage or offload. Scenarios differing only there (a scaling curve's stops,
a widget control moved) share those parts. Each cache is a bounded LRU keyed by every other field, so a
field added to ``Scenario`` later is part of the keys until someone shows the part does not read it.
"""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from operator import attrgetter
from typing import Any

from memsim_widget.engine.activations import ActivationBudget, activations
from memsim_widget.engine.caches import model_rules_cache
from memsim_widget.engine.context import Context, Stage, deepspeed_casts_adapters, deepspeed_zero3_linear
from memsim_widget.engine.counters.overhead import workspace_items
from memsim_widget.engine.frameworks import fsdp2_unsynced_grads, fsdp_wraps
from memsim_widget.engine.states import StateBudget, model_states
from memsim_widget.engine.step.lazy_items import ItemGroup
from memsim_widget.engine.step.timeline import activation_groups, state_groups
from memsim_widget.scenario import ParallelConfig, Scenario

#: Scenario fields ``model_states`` (and the ``engine/frameworks`` helpers it calls) never reads but through
#: ``frameworks.fsdp2_unsynced_grads`` (``grad_accum_steps > 1``), which ``states_key`` adds. ``attention`` is
#: read: one GPU's eager core meets the top layer's gradients (``states/gradients._top_layer_made``).
STATES_IGNORE = frozenset(
    {
        "micro_batch_size",
        "seq_len",
        "grad_accum_steps",
        "activation_checkpointing",
        "checkpoint_every",
        "loss",
        "output_lifetime",
        "zero_grad",
        "ssm_kernel",
        "activation_offloading",
        "activation_offloading_layers",
        "padding",
        "cuda_lazy_loading",
        "allocator_conf",
        "reserved_model",
        "compile_loss",
    }
)
#: Scenario fields the timeline's model-state groups (``timeline.state_groups`` of ``cached_model_states`` and
#: ``overhead.workspace_items``) never read: the model states' but the accumulation steps (gradients carried).
STATE_GROUPS_IGNORE = STATES_IGNORE - {"grad_accum_steps", "zero_grad"}
#: Scenario and ``parallel`` fields ``activations`` (with ``engine/multimodal/tower`` and ``engine/activations/calibrated``) never
#: reads: the optimizer, and the data-parallel layout of the states.
ACTIVATIONS_IGNORE = frozenset(
    {
        "optimizer",
        "optimizer_impl",
        "optimizer_in_backward",
        "zero_grad",
        "grad_accum_steps",
        "gpu",
        "allocator_conf",
        "reserved_model",
    }
)
ACTIVATIONS_IGNORE_PARALLEL = frozenset(
    {"dp", "dp_shard", "zero", "offload", "reshard_after_forward", "overlap_comm", "reduce_bucket_size"}
)

_STATES_FIELDS = tuple(f.name for f in fields(Scenario) if f.name not in STATES_IGNORE)
_STATE_GROUPS_FIELDS = tuple(f.name for f in fields(Scenario) if f.name not in STATE_GROUPS_IGNORE)
_ACTS_FIELDS = tuple(f.name for f in fields(Scenario) if f.name not in ACTIVATIONS_IGNORE | {"parallel"})
_ACTS_PARALLEL = tuple(f.name for f in fields(ParallelConfig) if f.name not in ACTIVATIONS_IGNORE_PARALLEL)

#: Bound of each cache (entries; a model states entry holds a few dozen items, an activations one ~100 terms).
CACHE_SIZE = 1024


_states_get = attrgetter(*_STATES_FIELDS)
_state_groups_get = attrgetter(*_STATE_GROUPS_FIELDS)
_acts_get = attrgetter(*_ACTS_FIELDS)
_acts_parallel_get = attrgetter(*_ACTS_PARALLEL)


def states_key(sc: Scenario) -> tuple[Any, ...]:
    """The fields of ``sc`` a rank's model states depend on, and the one bit of the ignored
    ``grad_accum_steps`` they read (``frameworks.fsdp2_unsynced_grads``: unsharded gradients kept)."""
    return (_states_get(sc), fsdp2_unsynced_grads(sc))


def state_groups_key(sc: Scenario) -> tuple[Any, ...]:
    """The fields of ``sc`` a rank's model-state groups depend on."""
    return _state_groups_get(sc)


def activations_key(sc: Scenario) -> tuple[Any, ...]:
    """The fields of ``sc`` one micro-batch's activation terms depend on, and the two facts they read from the
    left-out ``dp``/``zero``: whether FSDP shards the weights (it decides torchtitan's compute dtype under TP:
    ``frameworks.no_mixed_precision``) and the expert TP degree (``ParallelConfig.expert_tp``: an expert's
    width, ``dp x cp`` deciding how much of ``ep`` folds over the TP group), and from ``zero`` whether DeepSpeed
    casts the LoRA adapters (``context.deepspeed_casts_adapters``: not at ZeRO-3) and whether its ZeRO-3 linear
    keeps every Linear's input (``context.deepspeed_zero3_linear``)."""
    p = sc.parallel
    cast, z3 = deepspeed_casts_adapters(sc), deepspeed_zero3_linear(sc)
    return (_acts_get(sc), _acts_parallel_get(p), fsdp_wraps(p.zero, p.dp, p.cp), p.expert_tp, cast, z3)


class _Keyed:
    """A context that hashes and compares by a key alone (the cache computes from the first one it sees)."""

    __slots__ = ("ctx", "key", "_hash")

    def __init__(self, key: tuple[Any, ...], ctx: Context) -> None:
        self.key, self.ctx, self._hash = key, ctx, hash(key)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and self.key == other.key


@lru_cache(maxsize=CACHE_SIZE)
def _states(keyed: _Keyed, stage: Stage) -> StateBudget:
    return model_states(keyed.ctx, stage)


@lru_cache(maxsize=CACHE_SIZE)
def _activations(keyed: _Keyed) -> ActivationBudget:
    return activations(keyed.ctx)


def cached_model_states(ctx: Context, stage: Stage) -> StateBudget:
    """``model_states(ctx, stage)``, shared by scenarios equal but for ``STATES_IGNORE`` (do not mutate it)."""
    return _states(_Keyed(states_key(ctx.scenario), ctx), stage)


def cached_activations(ctx: Context) -> ActivationBudget:
    """``activations(ctx)``, shared by scenarios equal but for the ``ACTIVATIONS_IGNORE`` fields (do not
    mutate it)."""
    return _activations(_Keyed(activations_key(ctx.scenario), ctx))


@lru_cache(maxsize=CACHE_SIZE)
def _act_groups(keyed: _Keyed, stage: Stage) -> dict[str, ItemGroup]:
    return activation_groups(keyed.ctx, stage, cached_activations(keyed.ctx))


def cached_activation_groups(ctx: Context, stage: Stage) -> dict[str, ItemGroup]:
    """The timeline's activation groups of a rank (``timeline.activation_groups`` of ``cached_activations``):
    they read the activation terms and the pipeline keys only, so they share ``activations_key``."""
    return _act_groups(_Keyed(activations_key(ctx.scenario), ctx), stage)


@lru_cache(maxsize=CACHE_SIZE)
def _state_groups(keyed: _Keyed, stage: Stage) -> tuple[dict[str, ItemGroup], ItemGroup | None]:
    ctx = keyed.ctx
    return state_groups(ctx, stage, cached_model_states(ctx, stage), workspace_items(ctx))


def cached_state_groups(ctx: Context, stage: Stage) -> tuple[dict[str, ItemGroup], ItemGroup | None]:
    """The timeline's model-state groups of a rank and step 1's persistent group (``timeline.state_groups``
    of ``cached_model_states``), shared by scenarios equal but for ``STATE_GROUPS_IGNORE`` (do not mutate)."""
    return _state_groups(_Keyed(state_groups_key(ctx.scenario), ctx), stage)


@lru_cache(maxsize=CACHE_SIZE)
def _trainable(keyed: _Keyed) -> int:
    return keyed.ctx.trainable_parameters


def cached_trainable_parameters(ctx: Context) -> int:
    """``ctx.trainable_parameters`` (the model, method, adapters and frozen towers: ``states_key``'s fields)."""
    return _trainable(_Keyed(states_key(ctx.scenario), ctx))


def cache_clear() -> None:
    """Forget every cached part (benchmarks measuring a cold engine)."""
    _states.cache_clear()
    _activations.cache_clear()
    _trainable.cache_clear()
    _act_groups.cache_clear()
    _state_groups.cache_clear()
    model_rules_cache.cache_clear()
