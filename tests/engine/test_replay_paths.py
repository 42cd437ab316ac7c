"""The replay's shortcuts against what they replace, field by field (docs/allocator.md, "Cost"):

- a stream written with its third to last layers copied from the second (``StreamWriter.repeat``: identical
  layers, handles shifted) is the stream written layer by layer (``step_stream(..., repeat=False)``);
- its replays give the figures of the reference simulator (tests/data/allocator_reference.py, the simulator before
  the fast path): ``replay_stream`` (every field of ``PoolReplay``), ``card_outcome`` and ``allocator.replay`` on a
  card (every field of ``ReplayResult``, the failure included);
- ``card_runs`` (the planner's: no second replay when the requested bytes peak above the room) is
  ``card_replay(...).runs``;
- ``alloc_stream.asks`` (read off the events, no allocator) has the replay's requested peak, and its bound is at
  least the replay's peak reserved (the planner's rows decided without a replay, tests/plan/test_plan_replay.py).

On every fidelity scenario (tests/data/fidelity_cases.py), the H200 runs' scenarios (benchmarks/gpu_measure.py,
real sizes: ``slow``) and random scenarios (hypothesis)."""

from __future__ import annotations

import sys
from dataclasses import astuple
from pathlib import Path
from typing import Any

import allocator_reference as ref
import fidelity_cases as fc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget import Scenario
from memsim_widget.engine.caches.parts_cache import cached_activation_groups, cached_state_groups
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters import alloc_stream, card_replay
from memsim_widget.engine.counters.allocator import AllocatorConf, parse_alloc_conf, replay
from memsim_widget.engine.counters.replayable import replayable
from memsim_widget.engine.rl import objectives

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import gpu_measure as gm  # noqa: E402


def _ctx(d: dict[str, Any]) -> Context:
    return Context(objectives.training_scenario(Scenario.from_dict({**d, "reserved_model": "replay"})))


def _written_layer_by_layer(ctx: Context) -> alloc_stream.StreamWriter:
    """``alloc_stream.rank_stream`` with every layer written by its own loop iteration (no copies)."""
    seen: list[alloc_stream.StreamWriter] = []
    step_stream = alloc_stream.step_stream

    def plain(*args: Any, **kwargs: Any) -> alloc_stream.StreamWriter:
        seen.append(step_stream(*args, **{**kwargs, "repeat": False}))
        return seen[-1]

    alloc_stream.step_stream = plain  # type: ignore[assignment]
    try:
        alloc_stream.rank_stream(ctx, ctx.stages[0])
    finally:
        alloc_stream.step_stream = step_stream  # type: ignore[assignment]
    return seen[0]


def _check(ctx: Context, conf: AllocatorConf, fractions: tuple[float, ...]) -> None:
    stage = ctx.stages[0]
    stream = alloc_stream.rank_stream(ctx, stage)
    plain = _written_layer_by_layer(ctx)
    assert stream.events == plain.events and stream.marks == plain.marks
    rep = alloc_stream.replay_stream(stream, conf)
    assert astuple(rep) == astuple(ref.replay_stream(stream, conf))
    asks = alloc_stream.asks(stream, conf)
    assert asks.peak_requested == rep.peak_requested
    assert (asks.reserved_bound is None) == conf.expandable_segments
    assert asks.reserved_bound is None or asks.reserved_bound >= rep.peak_reserved
    for f in fractions:
        cap = int(rep.peak_reserved * f)
        assert astuple(replay(stream.events, cap, conf)) == astuple(ref.replay(stream.events, cap, conf))
        card = card_replay.card_outcome(stream, conf, cap)
        want = ref.replay(stream.events, cap, conf)
        got = (card.runs, card.cache_releases, card.failure and astuple(card.failure))
        assert got == (want.ok, want.cache_releases, want.failure and astuple(want.failure))


@pytest.mark.parametrize(
    ("name", "d"), fc.CASES + fc.OBJECTIVE_CASES, ids=lambda x: x if isinstance(x, str) else ""
)
def test_fidelity_scenarios_replay_as_the_reference(name: str, d: dict[str, Any]) -> None:
    ctx = _ctx(d)
    if replayable(ctx):
        _check(ctx, AllocatorConf(), (0.7,))


@pytest.mark.slow
@pytest.mark.parametrize("m", gm.MEASUREMENTS, ids=lambda m: m.name)
def test_h200_scenarios_replay_as_the_reference(m: gm.Measurement) -> None:
    ctx = _ctx(gm.resolved(m))
    if replayable(ctx):
        _check(ctx, AllocatorConf(), (0.6, 0.9))
        _check(ctx, parse_alloc_conf("expandable_segments:True"), (0.9,))


MODELS = [fc.LLAMA, {**fc.LLAMA, "tie_word_embeddings": True}, fc.GEMMA, fc.MIXTRAL, fc.GPT_NEOX, "gpt2"]
CONFS = ["", "expandable_segments:True", "max_split_size_mb:24", "roundup_power2_divisions:4"]


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    """A random one-GPU scenario of a small model: shape, checkpointing, method, accumulation, padding."""
    d: dict[str, Any] = {
        "model": draw(st.sampled_from(MODELS)),
        "micro_batch_size": draw(st.integers(1, 4)),
        "seq_len": draw(st.sampled_from([32, 100, 256, 512, 1024])),
        "precision": draw(st.sampled_from(["bf16", "fp32", "amp-bf16"])),
        "activation_checkpointing": draw(st.sampled_from(["none", "full", "selective"])),
        "grad_accum_steps": draw(st.integers(1, 3)),
        "padding": draw(st.sampled_from(["max_length", "longest"])),
        "allocator_conf": draw(st.sampled_from(CONFS)),
    }
    if draw(st.booleans()):
        # Mixtral's all-linear reaches its fused experts, refused outside bf16 (rules/model.py): its attention Linears
        targets = ["q_proj", "k_proj", "v_proj", "o_proj"] if d["model"] is fc.MIXTRAL else ["all-linear"]
        d |= {"method": "lora", "lora": {"rank": 8, "targets": targets}}
    return d


@settings(max_examples=30, deadline=None)
@given(scenarios(), st.floats(0.05, 1.2))
def test_random_scenarios_replay_as_the_reference(d: dict[str, Any], fraction: float) -> None:
    ctx = _ctx(d)
    if not replayable(ctx):
        return
    from memsim_widget.engine.frameworks import allocator_conf

    _check(ctx, allocator_conf(ctx), (fraction,))
    alloc_stream.cache_clear()
    stage = ctx.stages[0]
    cap = int(alloc_stream.pool_replay(ctx, stage).peak_reserved * fraction)
    assert card_replay.card_runs(ctx, stage, cap) == card_replay.card_replay(ctx, stage, cap).runs


def test_card_runs_skips_the_second_replay_only_when_the_requested_bytes_exceed_the_room() -> None:
    """Under the requested peak the answer is known (out of memory) without a replay on the card; at the
    requested peak exactly the card is replayed."""
    ctx = _ctx({"model": fc.LLAMA, "micro_batch_size": 2, "seq_len": 512})
    stage = ctx.stages[0]
    alloc_stream.cache_clear()
    rep = alloc_stream.pool_replay(ctx, stage)
    assert 0 < rep.peak_requested <= rep.peak_allocated <= rep.peak_reserved
    assert not card_replay.card_runs(ctx, stage, rep.peak_requested - 1)
    assert card_replay._card_cached.cache_info().currsize == 0
    alloc_stream.cache_clear()  # decided from the stream alone: not even the unlimited replay
    assert not card_replay.card_runs(ctx, stage, rep.peak_requested - 1)
    assert alloc_stream._replay_cached.cache_info().currsize == 0
    card_replay.card_runs(ctx, stage, rep.peak_requested)
    assert card_replay._card_cached.cache_info().currsize == 1


def test_a_shapes_card_replay_reuses_its_stream() -> None:
    """The replay on the card, asked after the unlimited one, builds no second stream."""
    ctx = _ctx({"model": fc.LLAMA, "micro_batch_size": 2, "seq_len": 512})
    stage = ctx.stages[0]
    cached_activation_groups(ctx, stage), cached_state_groups(ctx, stage)
    alloc_stream.cache_clear()
    built = []
    rank_stream = alloc_stream.rank_stream

    def counted(*args: Any, **kwargs: Any) -> alloc_stream.StreamWriter:
        built.append(1)
        return rank_stream(*args, **kwargs)

    alloc_stream.rank_stream = counted  # type: ignore[assignment]
    try:
        need = alloc_stream.pool_replay(ctx, stage).peak_reserved
        card_replay.card_replay(ctx, stage, need // 2)
    finally:
        alloc_stream.rank_stream = rank_stream  # type: ignore[assignment]
    assert len(built) == 1


KiB, MiB = 1024, 1024**2
GC = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.9"
SIZES = st.one_of(
    st.integers(-1, 4 * KiB),
    st.integers(1, 2 * MiB),
    st.integers(1, 64 * MiB),
    st.sampled_from([512, 10 * MiB]),
)


@st.composite
def raw_streams(draw: st.DrawFn) -> alloc_stream.StreamWriter:
    """Events as ``allocator.replay`` takes them, odd ones included: sizes of 0, frees of handles never
    allocated or already freed, a live handle allocated again (its first block stays allocated), 3 streams."""
    s = alloc_stream.StreamWriter()
    for _ in range(draw(st.integers(0, 80))):
        h = draw(st.integers(0, 12))
        size = draw(SIZES)
        s.events.append((h, size, draw(st.integers(0, 2))) if size != -1 else (h, -1, 0))
    return s


@settings(max_examples=400, deadline=None)
@given(raw_streams(), st.sampled_from([*CONFS, "roundup_power2_divisions:[256:1,>:8]", GC]))
def test_a_streams_asks_bound_its_unlimited_replay(stream: alloc_stream.StreamWriter, conf: str) -> None:
    """The requested peak counted off the events is the reference replay's, its reserved bound at least the
    reference's peak reserved (under expandable segments no bound is claimed)."""
    c = parse_alloc_conf(conf)
    want = ref.replay(stream.events, None, c)
    got = alloc_stream.asks(stream, c)
    assert got.peak_requested == want.peak_requested
    assert got.reserved_bound is None or got.reserved_bound >= want.peak_reserved
