"""The caching-allocator replay: each rule of PyTorch's CUDACachingAllocator.cpp on a hand-worked stream (exact
bytes from the rule, worked out in the comments), and invariants on random streams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.counters.allocator import (
    AllocatorConf,
    CachingAllocator,
    alloc,
    allocation_size,
    free,
    largest_cached,
    parse_alloc_conf,
    replay,
    round_size,
)
from memsim_widget.errors import ScenarioError

KiB, MiB = 1024, 1024**2
EXP = AllocatorConf(expandable_segments=True)


# ----- sizes ---------------------------------------------------------------------------------------------
def test_round_size_is_512_byte_multiples():
    assert [round_size(n) for n in (1, 511, 512, 513, 1000)] == [512, 512, 512, 1024, 1024]


def test_round_size_power2_divisions():
    conf = AllocatorConf(roundup_power2_divisions=(4,) * 16)
    # 1.2 MiB lies in [1 MiB, 2 MiB): four steps of 256 KiB -> 1.25 MiB
    assert round_size(int(1.2 * MiB), conf) == 1280 * KiB
    # below 4 x 512 B the 512 B rule applies
    assert round_size(1200, conf) == 1536
    assert round_size(2 * MiB, conf) == 2 * MiB  # powers of two stay


def test_allocation_size_pools():
    assert allocation_size(512) == 2 * MiB  # small pool: 2 MiB segments
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB  # 1 .. 10 MiB: a 20 MiB segment
    assert allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB  # from 10 MiB: rounded up to 2 MiB
    assert allocation_size(11 * MiB + 512) == 12 * MiB


# ----- pools, splitting, coalescing ----------------------------------------------------------------------
def test_small_requests_pack_into_2mib_segments():
    four = [alloc(i, 512 * KiB) for i in range(4)]
    assert replay(four).peak_reserved == 2 * MiB
    assert replay([*four, alloc(9, 1)]).peak_reserved == 4 * MiB  # the fifth needs a second segment


def test_large_segment_is_split_and_reused():
    # 3 MiB -> a 20 MiB segment split into 3 + 17; the second 3 MiB takes the 17 MiB remainder
    r = replay([alloc(1, 3 * MiB), alloc(2, 3 * MiB)])
    assert (r.peak_allocated, r.peak_reserved, r.segments) == (6 * MiB, 20 * MiB, 1)
    # 19 MiB rounds to 20 MiB: the 14 MiB left is too small, a new 20 MiB segment
    r = replay([alloc(1, 3 * MiB), alloc(2, 3 * MiB), alloc(3, 19 * MiB)])
    assert r.peak_reserved == 40 * MiB


def test_large_remainder_of_1mib_or_less_is_not_split():
    # 11 MiB + 512 B -> a 12 MiB segment; the 1 MiB - 512 B left stays in the block (allocated counts it)
    r = replay([alloc(1, 11 * MiB + 512), alloc(2, 600 * KiB + 512 * KiB)])
    # the second (1112 KiB) is large: a 20 MiB segment, split (18.9 MiB left > 1 MiB), so it counts as asked
    assert (r.peak_allocated, r.peak_reserved) == (12 * MiB + 1112 * KiB, 32 * MiB)
    assert r.peak_requested == 11 * MiB + 512 + 1112 * KiB


def test_frees_coalesce_with_free_neighbours():
    # 3 + 3 MiB in one 20 MiB segment; both freed merge back to 20 MiB, which then serves a 20 MiB request
    r = replay([alloc(1, 3 * MiB), alloc(2, 3 * MiB), free(1), free(2), alloc(3, 20 * MiB)])
    assert (r.peak_reserved, r.segments) == (20 * MiB, 1)
    # without the second free the 17 MiB + 3 MiB are apart: a new segment
    r = replay([alloc(1, 3 * MiB), alloc(2, 3 * MiB), free(1), alloc(3, 20 * MiB)])
    assert r.peak_reserved == 40 * MiB


def test_blocks_are_cached_per_stream():
    r = replay([alloc(1, 3 * MiB, stream=0), free(1), alloc(2, 3 * MiB, stream=1)])
    assert r.peak_reserved == 40 * MiB
    r = replay([alloc(1, 3 * MiB, stream=0), free(1), alloc(2, 3 * MiB, stream=0)])
    assert r.peak_reserved == 20 * MiB


def test_best_fit_takes_the_smallest_block_that_holds_the_request():
    a = CachingAllocator()
    for h, n in ((1, 30 * MiB), (2, 12 * MiB), (3, 16 * MiB)):
        a.malloc(h, n)
    for h in (1, 2, 3):
        a.free(h)
    a.malloc(4, 14 * MiB)  # 16 MiB block: smallest that holds 14 MiB; remainder 2 MiB > 1 MiB: split
    assert sorted(largest_cached(a.free_lists.values(), 9)) == [2 * MiB, 12 * MiB, 30 * MiB]


# ----- max_split_size_mb ---------------------------------------------------------------------------------
def test_max_split_size_keeps_oversize_blocks_for_oversize_requests():
    conf = AllocatorConf(max_split_size=32 * MiB)
    # a 30 MiB request may not take the cached 40 MiB (oversize) block: a new 30 MiB segment
    r = replay([alloc(1, 40 * MiB), free(1), alloc(2, 30 * MiB)], conf=conf)
    assert r.peak_reserved == 70 * MiB
    # a 36 MiB request (oversize) takes it, unsplit, as it is less than 20 MiB larger
    r = replay([alloc(1, 40 * MiB), free(1), alloc(2, 36 * MiB)], conf=conf)
    assert (r.peak_reserved, r.peak_allocated) == (40 * MiB, 40 * MiB)
    # a 64 MiB block is 28 MiB more than 36 MiB: not taken
    r = replay([alloc(1, 64 * MiB), free(1), alloc(2, 36 * MiB)], conf=conf)
    assert r.peak_reserved == 100 * MiB


def test_oversize_blocks_released_first_when_cudamalloc_fails():
    conf = AllocatorConf(max_split_size=32 * MiB)
    # card of 60 MiB: a 30 MiB request may not take the cached 40 MiB oversize block, and 40 + 30 MiB does
    # not fit: release_available_cached_blocks frees the smallest oversize block of the stream, then retries
    r = replay([alloc(1, 40 * MiB), free(1), alloc(2, 30 * MiB)], capacity=60 * MiB, conf=conf)
    assert r.ok and r.cache_releases == 1 and r.peak_reserved == 40 * MiB and r.reserved_at_end == 30 * MiB


# ----- out of memory --------------------------------------------------------------------------------------
def test_failed_cudamalloc_frees_the_cache_and_retries():
    # card 40 MiB: 20 MiB cached on stream 0; 30 MiB on stream 1 needs it freed
    r = replay([alloc(1, 3 * MiB), free(1), alloc(2, 30 * MiB, stream=1)], capacity=40 * MiB)
    assert r.ok and r.only_by_releasing_cache
    assert (r.peak_reserved, r.reserved_at_end) == (30 * MiB, 30 * MiB)
    roomy = replay([alloc(1, 3 * MiB), free(1), alloc(2, 30 * MiB, stream=1)], capacity=50 * MiB)
    assert roomy.ok and not roomy.only_by_releasing_cache and roomy.peak_reserved == 50 * MiB


def test_oom_from_fragmentation():
    # one 20 MiB segment: x 0-4, y 4-8, z 8-12 MiB; x and z freed leave 4 + 12 MiB free around y. 14 MiB
    # needs a new segment: the card (20 MiB) has no room, and the split segment cannot be freed.
    events = [alloc("x", 4 * MiB), alloc("y", 4 * MiB), alloc("z", 4 * MiB), free("x"), free("z")]
    r = replay([*events, alloc("w", 14 * MiB)], capacity=20 * MiB)
    assert not r.ok and r.failure is not None
    assert r.failure.cause == "fragmentation"
    assert (r.failure.free_bytes, r.failure.largest_free, r.failure.request) == (16 * MiB, 12 * MiB, 14 * MiB)
    assert r.failure.event == 5


def test_oom_from_the_total():
    r = replay([alloc(1, 4 * MiB), alloc(2, 18 * MiB)], capacity=20 * MiB)
    assert not r.ok and r.failure is not None and r.failure.cause == "total"
    assert r.failure.free_bytes == 16 * MiB


# ----- garbage_collection_threshold ----------------------------------------------------------------------
def test_garbage_collection_frees_old_blocks_above_the_threshold():
    conf = AllocatorConf(garbage_collection_threshold=0.5, per_process_memory_fraction=1.0)
    # A (40 MiB, stream 0) freed at search 1, B (30 MiB, stream 1) at search 2; C (stream 2) at search 3
    # finds 70 MiB reserved > 50 MiB: ages A=2, B=1, mean 1.5: A is released (40 MiB >= the 20 MiB excess)
    events = [alloc("A", 40 * MiB), free("A"), alloc("B", 30 * MiB, 1), free("B"), alloc("C", 20 * MiB, 2)]
    r = replay(events, capacity=100 * MiB, conf=conf)
    assert (r.peak_reserved, r.reserved_at_end) == (70 * MiB, 50 * MiB)
    no_gc = replay(events, capacity=100 * MiB)
    assert no_gc.reserved_at_end == 90 * MiB


# ----- expandable segments -------------------------------------------------------------------------------
def test_expandable_segment_grows_by_20mib_pages():
    # 3 MiB maps one 20 MiB page; 25 MiB joins the 17 MiB left to one more page: 40 MiB (fixed segments: 20 +
    # a 26 MiB segment = 46 MiB)
    events = [alloc(1, 3 * MiB), alloc(2, 25 * MiB)]
    assert replay(events, conf=EXP).peak_reserved == 40 * MiB
    assert replay(events).peak_reserved == 46 * MiB


def test_expandable_small_pool_grows_by_2mib_pages():
    r = replay([alloc(i, 512 * KiB) for i in range(5)], conf=EXP)
    assert r.peak_reserved == 4 * MiB


def test_expandable_pages_unmapped_on_oom():
    events = [alloc(1, 3 * MiB), free(1), alloc(2, 30 * MiB, stream=1)]
    r = replay(events, capacity=40 * MiB, conf=EXP)
    assert r.ok and r.cache_releases == 1 and r.reserved_at_end == 40 * MiB


def test_expandable_pages_partly_used_cannot_be_unmapped():
    # stream 0: A (3 MiB) maps page 0; B (30 MiB) joins the 17 MiB left to page 1: 0-3 A, 3-33 B, 33-40 free.
    # Freeing A leaves 3 MiB and 7 MiB free, neither a whole 20 MiB page: on a 40 MiB card a request on
    # stream 1 needs a page of its own and none can be unmapped -- fragmentation (10 MiB free, 5 MiB asked)
    events = [alloc("A", 3 * MiB), alloc("B", 30 * MiB), free("A"), alloc("C", 5 * MiB, stream=1)]
    r = replay(events, capacity=40 * MiB, conf=EXP)
    assert not r.ok and r.failure is not None and r.failure.cause == "fragmentation"
    assert (r.failure.free_bytes, r.reserved_at_end) == (10 * MiB, 40 * MiB)


def test_roundup_power2_divisions_list_form_rounds_the_replay():
    conf = parse_alloc_conf(
        "roundup_power2_divisions:[256:4]"
    )  # the first bound also fills the intervals below
    r = replay([alloc(1, int(1.2 * MiB))], conf=conf)
    assert (r.peak_allocated, r.peak_reserved) == (1280 * KiB, 20 * MiB)


def test_oversize_blocks_released_from_the_largest_down_then_the_whole_cache():
    conf = AllocatorConf(max_split_size=32 * MiB)
    # 40 and 50 MiB cached (oversize, two segments); 100 MiB does not fit a 140 MiB card beside them: the
    # oversize blocks are freed from the largest down (90 MiB < 100 MiB asked: not enough on their own), then
    # release_cached_blocks finds nothing more and the retry succeeds
    events = [alloc(1, 40 * MiB), alloc(2, 50 * MiB), free(1), free(2), alloc(3, 100 * MiB)]
    r = replay(events, capacity=140 * MiB, conf=conf)
    assert r.ok and r.cache_releases == 1
    assert (r.peak_reserved, r.reserved_at_end) == (100 * MiB, 100 * MiB)


# ----- PYTORCH_CUDA_ALLOC_CONF ---------------------------------------------------------------------------
def test_parse_alloc_conf_reads_pytorch_syntax():
    c = parse_alloc_conf("expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6")
    assert c.expandable_segments and c.max_split_size == 128 * MiB and c.garbage_collection_threshold == 0.6
    # the list form: 64 MiB:8 fills the intervals below it too; '>' fills from the last bound on (PyTorch's
    # std::fill from last_index, which overwrites the 256 MiB entry)
    c = parse_alloc_conf("roundup_power2_divisions:[64:8,256:4,>:1]")
    assert c.roundup_power2_divisions == (8,) * 7 + (0,) + (1,) * 8
    assert parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * 16
    assert parse_alloc_conf("") == AllocatorConf()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("expandable_segment:True", "unknown PYTORCH_CUDA_ALLOC_CONF option 'expandable_segment'"),
        ("max_split_size_mb:10", "max_split_size_mb must be >= 20"),
        ("expandable_segments:yes", "expandable_segments takes True or False"),
        ("garbage_collection_threshold:1.5", "garbage_collection_threshold must be in (0, 1)"),
        ("roundup_power2_divisions:3", "powers of 2"),
        ("max_split_size_mb", "max_split_size_mb needs a value"),
        ("backend:cudaMallocAsync", "not simulated"),
    ],
)
def test_parse_alloc_conf_errors_name_the_option(text, words):
    with pytest.raises(ScenarioError) as e:
        parse_alloc_conf(text)
    assert e.value.field == "allocator_conf" and words in str(e.value) and "\n" not in str(e.value)


# ----- invariants ----------------------------------------------------------------------------------------
sizes = st.one_of(st.integers(1, 2 * MiB), st.integers(1, 64 * MiB))


@st.composite
def streams(draw):
    """A random stream: allocations of mixed sizes on up to 3 streams, frees of live handles."""
    events, live = [], []
    for i in range(draw(st.integers(1, 60))):
        if live and draw(st.booleans()):
            events.append(free(live.pop(draw(st.integers(0, len(live) - 1)))))
        else:
            events.append(alloc(i, draw(sizes), draw(st.integers(0, 2))))
            live.append(i)
    return events


confs = st.sampled_from(
    [
        AllocatorConf(),
        EXP,
        AllocatorConf(max_split_size=24 * MiB),
        AllocatorConf(roundup_power2_divisions=(4,) * 16),
    ]
)


@settings(max_examples=150, deadline=None)
@given(streams(), confs)
def test_reserved_holds_allocated_and_frees_return_to_the_cache(events, conf):
    a = CachingAllocator(None, conf)
    for h, n, s in events:
        if n < 0:
            a.free(h)
        else:
            a.malloc(h, n, s)
        assert a.reserved >= a.allocated >= a.requested >= 0
    for h in list(a.live):
        a.free(h)
    assert a.allocated == 0
    assert sum(b.size for b in a.free_blocks.values()) == a.reserved  # every mapped byte is cached
    assert a.peak_reserved >= a.peak_allocated >= a.peak_requested


@settings(max_examples=100, deadline=None)
@given(streams(), confs)
def test_a_card_of_the_peak_runs_without_releasing_and_one_smaller_than_requested_fails(events, conf):
    """A card of the free run's peak reserved runs it unchanged; one below its peak allocated runs only by
    releasing cached blocks (a block over ``max_split_size`` is handed out whole, so after a release the same
    requests can hold fewer allocated bytes: hypothesis found such a stream), and one below the bytes requested at
    once never runs."""
    free_run = replay(events, conf=conf)
    exact = replay(events, capacity=free_run.peak_reserved, conf=conf)
    assert exact.ok and exact.cache_releases == 0 and exact.peak_reserved == free_run.peak_reserved
    small = replay(events, capacity=free_run.peak_allocated - 512, conf=conf)
    assert not small.ok or small.cache_releases > 0
    assert not replay(events, capacity=free_run.peak_requested - 1, conf=conf).ok


@settings(max_examples=100, deadline=None)
@given(streams(), confs, st.integers(0, 200 * MiB))
def test_reserved_never_exceeds_the_card(events, conf, capacity):
    a = CachingAllocator(capacity, conf)
    for h, n, s in events:
        if n < 0:
            a.free(h)
        elif a.malloc(h, n, s) is not None:
            break
        assert a.reserved <= capacity


@settings(max_examples=60, deadline=None)
@given(streams(), st.integers(8 * MiB, 200 * MiB))
def test_garbage_collection_keeps_the_counters_ordered_and_on_the_card(events, capacity):
    gc = AllocatorConf(garbage_collection_threshold=0.5, per_process_memory_fraction=1.0)
    a = CachingAllocator(capacity, gc)
    for h, n, s in events:
        if n < 0:
            a.free(h)
        elif a.malloc(h, n, s) is not None:
            break
        assert a.allocated <= a.reserved <= capacity
