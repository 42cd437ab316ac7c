"""The caching-allocator simulator (engine/counters/allocator.py: ``malloc``/``free`` one call per event, and ``run``'s loop
with both inlined, which ``replay`` and ``alloc_stream.replay_stream`` use) against the reference kept in
tests/data/allocator_reference.py (the simulator before the fast path): after every event the same counters, at
the end the same blocks at the same addresses, on random streams and on the engine's own streams, under each
allocator setting."""

from __future__ import annotations

from dataclasses import astuple

import allocator_reference as ref
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget import Scenario
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters import alloc_stream
from memsim_widget.engine.counters.allocator import (
    ADDR_BITS,
    FREE,
    AllocatorConf,
    CachingAllocator,
    alloc,
    free,
    largest_cached,
    parse_alloc_conf,
    replay,
)
from memsim_widget.engine.rl import objectives

KiB, MiB = 1024, 1024**2

CONFS = [
    AllocatorConf(),
    AllocatorConf(expandable_segments=True),
    AllocatorConf(max_split_size=24 * MiB),
    AllocatorConf(roundup_power2_divisions=(4,) * 16),
    AllocatorConf(garbage_collection_threshold=0.5, per_process_memory_fraction=0.9),
]


def _state(a: CachingAllocator | ref.CachingAllocator) -> tuple:
    """Everything a replay can see: the counters, the cached blocks (size, address) per stream and pool, and
    each live handle's block (address, size, requested bytes)."""
    live = {}
    for h, entry in a.live.items():
        b, req = entry if isinstance(entry, tuple) else (entry, entry.req)
        live[h] = (b.addr, b.size, req)
    lists = {
        k: [e if isinstance(e, tuple) else divmod(e, 1 << ADDR_BITS) for e in v]
        for k, v in a.free_lists.items()
        if v
    }
    counters = (a.allocated, a.reserved, a.requested, a.peak_allocated, a.peak_reserved, a.peak_requested)
    return counters, a.cache_releases, a.segments, lists, live


def _run_both(events: list, conf: AllocatorConf, capacity: int | None) -> None:
    fast, slow = CachingAllocator(capacity, conf), ref.CachingAllocator(capacity, conf)
    for n, (h, size, s) in enumerate(events):
        if size == FREE:
            fast.free(h)
            slow.free(h)
        else:
            f, g = fast.malloc(h, size, s), slow.malloc(h, size, s)
            assert (f is None) == (g is None), n
            if f is not None and g is not None:
                assert (f.request, f.free_bytes, f.largest_free, f.cause) == (
                    g.request,
                    g.free_bytes,
                    g.largest_free,
                    g.cause,
                )
                break
        assert _state(fast)[:3] == _state(slow)[:3], n
    assert _state(fast) == _state(slow)


sizes = st.one_of(
    st.integers(1, 4 * KiB),
    st.integers(1, 2 * MiB),
    st.integers(1, 64 * MiB),
    st.sampled_from([512, MiB, MiB + 512, 10 * MiB, 20 * MiB, 21 * MiB]),
)


@st.composite
def streams(draw: st.DrawFn) -> list:
    """A random stream: allocations of mixed sizes on up to 3 streams, frees of live handles (any order)."""
    events, live = [], []
    for i in range(draw(st.integers(1, 80))):
        if live and draw(st.booleans()):
            events.append(free(live.pop(draw(st.integers(0, len(live) - 1)))))
        else:
            events.append(alloc(i, draw(sizes), draw(st.integers(0, 2))))
            live.append(i)
    return events


@st.composite
def layered(draw: st.DrawFn) -> list:
    """The shape of a training step: per layer the same kept and transient sizes, kept ones freed in reverse."""
    kept = draw(st.lists(sizes, min_size=1, max_size=4))
    temps = draw(st.lists(sizes, max_size=4))
    events, saved, h = [], [], 0
    for _ in range(draw(st.integers(1, 8))):
        t = []
        for n in temps:
            h += 1
            events.append(alloc(h, n))
            t.append(h)
        for n in kept:
            h += 1
            events.append(alloc(h, n))
            saved.append(h)
        events += [free(x) for x in t]
    events += [free(x) for x in reversed(saved)]
    return events


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(streams(), layered()), st.sampled_from(CONFS), st.one_of(st.none(), st.integers(0, 300 * MiB))
)
def test_malloc_and_free_match_the_reference_event_by_event(events, conf, capacity):
    _run_both(events, conf, capacity)


def _reference_run(a: ref.CachingAllocator, events: list) -> tuple:
    """``CachingAllocator.run`` on the reference: one call per event, the peak tracked after each allocation."""
    seen, peak_event, tails, n = -1, -1, [], 0
    for n, (h, size, s) in enumerate(events, 1):  # noqa: B007
        if size == FREE:
            a.free(h)
            continue
        f = a.malloc(h, size, s)
        if f is not None:
            return n, (n - 1, f.request, f.segment, f.free_bytes, f.largest_free, f.cause), peak_event, tails
        if a.reserved > seen:
            seen, peak_event, tails = a.reserved, n - 1, [lst[-3:] for lst in a.free_lists.values()]
    return n, None, peak_event, tails


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(streams(), layered()), st.sampled_from(CONFS), st.one_of(st.none(), st.integers(0, 300 * MiB))
)
def test_a_whole_stream_runs_as_on_the_reference(events, conf, capacity):
    """``run`` (its inlined loop under the default settings) and ``replay``: the same events replayed, failure,
    peak, largest cached blocks then, blocks at the end and ``ReplayResult`` as the reference's."""
    fast, slow = CachingAllocator(capacity, conf), ref.CachingAllocator(capacity, conf)
    n, f = fast.run(events)
    tails = [[divmod(e, 1 << ADDR_BITS) for e in lst] for lst in fast.peak_tails]
    assert (n, None if f is None else astuple(f), fast.peak_event, tails) == _reference_run(slow, events)
    assert _state(fast) == _state(slow)
    assert astuple(replay(events, capacity, conf)) == astuple(ref.replay(events, capacity, conf))


@pytest.mark.parametrize(
    "scenario",
    [
        {"model": "llama-3.2-1b", "seq_len": 2048},
        {"model": "qwen2.5-0.5b", "seq_len": 1024, "micro_batch_size": 4, "activation_checkpointing": "full"},
        {"model": "llama-3.2-1b", "seq_len": 1024, "method": "lora", "lora": {"targets": ["all-linear"]}},
        {"model": "gpt2", "seq_len": 1024, "micro_batch_size": 8, "padding": "longest"},
    ],
)
@pytest.mark.parametrize(
    "conf",
    ["", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4"],
)
def test_the_engines_streams_replay_to_the_same_figures(scenario, conf):
    ctx = Context(objectives.training_scenario(Scenario.from_dict({**scenario, "reserved_model": "replay"})))
    stream = alloc_stream.rank_stream(ctx, ctx.stages[0])
    c = parse_alloc_conf(conf)
    assert alloc_stream.replay_stream(stream, c) == ref.replay_stream(stream, c)


def test_a_block_freed_after_an_unmapped_page_stays_apart_from_it():
    """Expandable segments, a 80 MiB card: A, C, B take stream 0's pages 0-20, 20-40, 40-60 MiB; C freed; D (30 MiB,
    stream 1) needs two pages of its own: the cudaMalloc fails, C's page is unmapped and the retry fits (40 + 40
    MiB). B's previous neighbour is now that unmapped page: freed, B stays a 20 MiB cached block beside it (a
    mapped block never merges with an unmapped range, ``try_merge_blocks``)."""
    events = [
        alloc("A", 20 * MiB),
        alloc("C", 20 * MiB),
        alloc("B", 20 * MiB),
        free("C"),
        alloc("D", 30 * MiB, 1),
        free("B"),
    ]
    _run_both(events, AllocatorConf(expandable_segments=True), 80 * MiB)
    a = CachingAllocator(80 * MiB, AllocatorConf(expandable_segments=True))
    assert a.run(events) == (6, None) and a.cache_releases == 1
    assert largest_cached([a.free_lists[(0, False)]]) == (20 * MiB,)  # the only block cached on stream 0
