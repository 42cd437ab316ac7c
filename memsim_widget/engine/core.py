"""The engine entry point: a scenario in, an ``Estimate`` out. Pure Python, no torch or Jupyter."""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

from memsim_widget.catalog.gpus import ON_REGISTER
from memsim_widget.engine.activations import activations
from memsim_widget.engine.arith import first_largest
from memsim_widget.engine.caches import parts_cache
from memsim_widget.engine.caches.parts_cache import (
    cached_activation_groups,
    cached_activations,
    cached_model_states,
    cached_state_groups,
    cached_trainable_parameters,
)
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.overhead import (
    communicators,
    context_bytes,
    counter_bands,
    device_items,
    outside_bytes,
    paged_items,
    reserved_item,
    workspace_items,
)
from memsim_widget.engine.estimate import Estimate
from memsim_widget.engine.rl import objectives
from memsim_widget.engine.states import model_states
from memsim_widget.engine.step.rank_estimate import RankEstimate
from memsim_widget.engine.step.timeline import offloaded_activations, step_moments
from memsim_widget.scenario import Scenario


def estimate(scenario: Scenario | dict) -> Estimate:
    """Simulate the per-GPU memory of one training step for every pipeline stage."""
    if not isinstance(scenario, Scenario):
        scenario = Scenario.from_dict(scenario)
    return _estimate(scenario)


@lru_cache(maxsize=4096)
def _estimate(scenario: Scenario) -> Estimate:
    ctx = Context(objectives.training_scenario(scenario))
    rl = scenario.objective_name != "sft"
    if rl:
        objectives.check_model(ctx, scenario)
    # an objective adds to the parts in place: only the plain step shares them with other scenarios
    acts = activations(ctx) if rl else cached_activations(ctx)
    if rl:
        acts = objectives.loss_terms(ctx, scenario, acts)
    ws = workspace_items(ctx)
    dev = device_items(ctx)
    ranks = []
    for stage in ctx.stages:
        states = model_states(ctx, stage) if rl else cached_model_states(ctx, stage)
        if rl:
            objectives.extra_states(ctx, scenario, stage, states)
        steady, first = step_moments(
            ctx,
            stage,
            states,
            acts,
            ws,
            None if rl else cached_activation_groups(ctx, stage),
            None if rl else cached_state_groups(ctx, stage),
        )
        if rl:
            steady += objectives.phase_moments(ctx, scenario, stage, states, acts, ws, steady)
            first += objectives.phase_moments(ctx, scenario, stage, states, acts, ws, first)
        peak = steady[first_largest([m.allocated_bytes for m in steady])[1]]
        # memory outside the caching allocator: context, NCCL, bitsandbytes' paged optimizer states
        paged = paged_items(states.persistent)
        device = (*dev, *paged)
        outside = outside_bytes(context_bytes(ctx), len(communicators(ctx)), sum(i.bytes for i in paged))
        if rl or not _replayable(ctx):  # a step the allocation stream does not model yet: the fitted rule
            frag = reserved_item(ctx, steady, peak.allocated_bytes, acts, outside)
        else:
            from memsim_widget.engine.counters.alloc_stream import pool_replay, replayed_item

            frag = replayed_item(ctx, pool_replay(ctx, stage), peak.allocated_bytes, outside)
        reserved = peak.allocated_bytes + frag.bytes
        ranks.append(
            RankEstimate(
                stage=stage,
                moments=tuple(steady),
                peak=peak,
                reserved=frag,
                device=device,
                host=(*states.host, *offloaded_activations(ctx, stage, acts)),
                step1_peak_allocated_bytes=max(m.allocated_bytes for m in first),
                params_local=states.params_local,
                trainable_local=states.trainable_local,
                bands=tuple(counter_bands(ctx, peak.allocated_bytes, reserved, outside).items()),
            )
        )
    return Estimate(
        scenario=scenario,
        arch=ctx.arch,
        gpu=ctx.gpu,
        ranks=tuple(ranks),
        trainable_parameters=cached_trainable_parameters(ctx),
    )


def _replayable(ctx: Context) -> bool:
    """``replayable.replayable``, its module imported only where the scenario's reserved model is the replay
    (``Scenario.replays_reserved``): an estimate under the fitted rule does not load it, and the stream's module
    and the allocator's (~2 ms of a CLI start) load only where the stream models the step."""
    if not ctx.scenario.replays_reserved:  # replayable's first condition
        return False
    from memsim_widget.engine.counters.replayable import replayable

    return replayable(ctx)


def _clear_replays() -> None:
    """Forget the cached replays, if any was made (``alloc_stream`` is imported on the first)."""
    stream: Any = sys.modules.get("memsim_widget.engine.counters.alloc_stream")
    if stream is not None:
        stream.cache_clear()


# a card registered (or replaced) under an id must not be served estimates made with an older record
ON_REGISTER.extend((_estimate.cache_clear, parts_cache.cache_clear, _clear_replays))
