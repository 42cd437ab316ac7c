"""The caching allocator as it was before its fast path (memsim-widget engine/counters/allocator.py at commit 8cf9259),
kept unchanged as the reference the fast simulator is checked against (tests/engine/test_allocator_reference.py,
benchmarks/replay_speed.py): the same rules written one call per rule, no inlined path.

PyTorch's CUDA caching allocator, replayed: the reserved counter from an ordered stream of allocations
and frees, and whether that stream runs on a card of a given capacity.

Every rule below was read in PyTorch's source (docs/allocator.md lists them with their lines):

- ``c10/cuda/CUDACachingAllocator.cpp``, pytorch/pytorch commit 001074d25084fdb87a799823e395a50f5ec044d3:
  ``round_size`` (512 B, or ``roundup_power2_divisions``), ``get_pool`` (<= 1 MiB small), ``get_allocation_size``
  (2 MiB small segments, 20 MiB large segments below 10 MiB, else rounded up to 2 MiB), ``get_free_block``
  (best fit per stream: smallest size, then lowest address; oversize blocks), ``should_split`` (small or
  expandable: remainder >= 512 B; large: remainder > 1 MiB and request < ``max_split_size``), ``free_block``
  and ``try_merge_blocks`` (coalescing with free neighbours), ``malloc`` (free block, else garbage collection,
  cudaMalloc, free oversize cached blocks and retry, free every unsplit cached block and retry, else OOM),
  ``release_available_cached_blocks``, ``release_cached_blocks``, ``garbage_collect_cached_blocks`` and the
  expandable segments (Note [Expandable Segments]; ``find_expandable_block``, ``map_block``, ``unmap_block``:
  one segment per stream and pool growing by 2 MiB pages (small) or 20 MiB pages (large)).
- ``c10/core/AllocatorConfig.h`` of torch 2.13.0: the same size constants (``kMinBlockSize`` ...).

The ``PYTORCH_CUDA_ALLOC_CONF`` settings are parsed in ``alloc_conf.py``. What is not modelled: cross-stream uses (``record_stream`` events; a block returns to its stream's cache at its
free), CUDA graph private pools, and memory allocated outside PyTorch (context, NCCL: see ``overhead.py``).
Addresses are virtual: segments are laid out in cudaMalloc order, which only breaks best-fit ties.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from dataclasses import dataclass, field
from heapq import nlargest
from typing import Any

from memsim_widget.alloc_conf import (
    ALLOC_CONF_OPTIONS,
    DEFAULT_CONF,
    LARGE_BUFFER,
    AllocatorConf,
    alloc_conf_error,
    parse_alloc_conf,
)

KiB = 1024
MiB = 1024**2
GiB = 1024**3
#: All sizes are rounded to at least 512 B (``kMinBlockSize``).
MIN_BLOCK = 512
#: The largest "small" request: 1 MiB (``kSmallSize``).
SMALL_SIZE = MiB
#: Small requests are packed in 2 MiB segments (``kSmallBuffer``); also the small pool's expandable page.
SMALL_BUFFER = 2 * MiB
#: Requests below 10 MiB get a 20 MiB segment (``kMinLargeAlloc``).
MIN_LARGE_ALLOC = 10 * MiB
#: The large segment (``kLargeBuffer``, ``alloc_conf.LARGE_BUFFER``) is also the large pool's expandable page.
#: Larger requests are rounded up to 2 MiB (``kRoundLarge``).
ROUND_LARGE = 2 * MiB
#: Free-block lists are keyed by (stream, small pool).
FREE = -1


# ----- the size rules -----------------------------------------------------------------------------------
def _power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` up to the next of ``divisions`` equal steps between the
    powers of two around it (1200 with 4 divisions -> 1280)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, conf: AllocatorConf = DEFAULT_CONF) -> int:
    """The block size a request gets (``round_size``): 512 B multiples, or power-of-two divisions."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    divisions = conf.divisions(size)
    if divisions > 1 and size > MIN_BLOCK * divisions:
        return _power2_next_division(size, divisions)
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def allocation_size(size: int) -> int:
    """The segment cudaMalloc'd for a rounded request no cached block serves (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def _addr(t: tuple[int, object]) -> int:
    return t[0]


# ----- blocks -------------------------------------------------------------------------------------------
class _Block:
    """A range of a segment: allocated, cached (free) or, in an expandable segment, unmapped."""

    __slots__ = ("addr", "size", "key", "allocated", "prev", "next", "mapped", "seg", "gc_base")

    def __init__(self, addr: int, size: int, key: tuple[int, bool], seg: int, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.key = key  # (stream, small pool)
        self.allocated = False
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.mapped = mapped
        self.seg = seg  # segment id; expandable segments are negative
        self.gc_base = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


@dataclass(frozen=True)
class Failure:
    """Why a replay ran out of memory: the request, the card's free bytes (less what is allocated), the
    largest block that could have served it, and the cause: ``fragmentation`` when the bytes not allocated
    would hold the request but no single free range does, else ``total``."""

    event: int
    request: int
    segment: int
    free_bytes: int
    largest_free: int
    cause: str


@dataclass(frozen=True)
class ReplayResult:
    """What a replay measured: the two counters' peaks (PyTorch's ``allocated_bytes`` and ``reserved_bytes``
    peaks), ``requested`` (sizes as asked), whether every allocation succeeded, how many times a cudaMalloc
    failed and the allocator released cached blocks to retry (the step then runs, slower), and the failure."""

    peak_allocated: int
    peak_reserved: int
    peak_requested: int
    ok: bool
    cache_releases: int
    segments: int
    events: int
    failure: Failure | None = None
    reserved_at_end: int = 0
    allocated_at_end: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def only_by_releasing_cache(self) -> bool:
        """It ran, but only because failed cudaMallocs made the allocator free its cache (slower steps)."""
        return self.ok and self.cache_releases > 0


# ----- the allocator ------------------------------------------------------------------------------------
class CachingAllocator:
    """One device's caching allocator. ``capacity``: the bytes cudaMalloc may hand out in all (the card less
    the context, NCCL and memory allocated outside PyTorch); None: unlimited."""

    def __init__(self, capacity: int | None = None, conf: AllocatorConf = DEFAULT_CONF) -> None:
        self.conf = conf
        self.capacity = capacity
        frac = conf.per_process_memory_fraction
        self.allowed = None if frac is None or capacity is None else int(frac * capacity)
        self.free_lists: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        self.free_blocks: dict[int, _Block] = {}  # addr -> cached block
        self.unmapped: dict[tuple[int, bool], list[tuple[int, _Block]]] = {}
        self.live: dict[object, tuple[_Block, int]] = {}  # handle -> (block, requested bytes)
        self.gc_calls = {True: 0, False: 0}
        self.allocated = self.reserved = self.requested = 0
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        self.cache_releases = self.segments = 0
        self._next_addr = 1 << 40
        self._next_seg = 0

    # -- the free lists (``BlockPool.blocks``: by stream, size, address) --
    def _cache(self, b: _Block) -> None:
        b.gc_base = self.gc_calls[b.key[1]]
        insort(self.free_lists.setdefault(b.key, []), (b.size, b.addr))
        self.free_blocks[b.addr] = b

    def _uncache(self, b: _Block) -> None:
        lst = self.free_lists[b.key]
        del lst[bisect_left(lst, (b.size, b.addr))]
        del self.free_blocks[b.addr]

    def _set_reserved(self, delta: int) -> None:
        self.reserved += delta
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved

    def _room(self, size: int) -> bool:
        """Whether cudaMalloc of ``size`` more bytes succeeds (the fraction's limit, then the card's)."""
        if self.allowed is not None and self.reserved + size > self.allowed:
            return False
        return self.capacity is None or self.reserved + size <= self.capacity

    # -- malloc --
    def malloc(self, handle: object, size: int, stream: int = 0) -> Failure | None:
        """Allocate ``size`` bytes on ``stream`` for ``handle``; returns the failure if it runs out of memory."""
        if size <= 0:
            return None
        conf = self.conf
        rounded = round_size(size, conf)
        key = (stream, rounded <= SMALL_SIZE)
        block = self._get_free_block(key, rounded)
        if block is None:
            if conf.garbage_collection_threshold > 0 and self.allowed is not None:
                self._garbage_collect()
            block = self._alloc_block(key, rounded)
            if block is None and self._release_available(key, rounded):
                block = self._alloc_block(key, rounded)
                self.cache_releases += block is not None
            if block is None:
                self._release_cached()
                block = self._alloc_block(key, rounded)
                self.cache_releases += block is not None
            if block is None:
                return self._failure(rounded)
        if self._should_split(block, rounded):
            rest = _Block(block.addr + rounded, block.size - rounded, key, block.seg)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = rounded
            self._cache(rest)
        block.allocated = True
        self.live[handle] = (block, size)
        self.allocated += block.size
        self.requested += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_requested = max(self.peak_requested, self.requested)
        return None

    def _should_split(self, b: _Block, size: int) -> bool:
        """``should_split``: small pool or expandable: any remainder of 512 B; large: a remainder over 1 MiB,
        and never a block asked for at ``max_split_size`` or more."""
        rest = b.size - size
        if b.key[1] or self.conf.expandable_segments:
            return rest >= MIN_BLOCK
        ms = self.conf.max_split_size
        return (ms is None or size < ms) and rest > SMALL_SIZE

    def _get_free_block(self, key: tuple[int, bool], size: int) -> _Block | None:
        """``get_free_block``: the smallest cached block of the stream and pool that holds ``size`` (lowest
        address on ties); a request under ``max_split_size`` never takes an oversize block, and an oversize
        request only one less than ``max_non_split_rounding`` larger."""
        self.gc_calls[key[1]] += 1
        lst = self.free_lists.get(key)
        if not lst:
            return None
        i = bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        if self.conf.expandable_segments:  # size it can grow to: the unmapped range after it counts
            blocks = self.free_blocks

            def grow(j: int) -> int:
                b = blocks[lst[j][1]]
                return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

            while i + 1 < len(lst) and grow(i + 1) < grow(i):
                i += 1
        bsize = lst[i][0]
        ms = self.conf.max_split_size
        if ms is not None:
            if size < ms <= bsize:
                return None
            if size >= ms and bsize >= size + self.conf.max_non_split_rounding:
                return None
        block = self.free_blocks[lst[i][1]]
        self._uncache(block)
        return block

    def _alloc_block(self, key: tuple[int, bool], size: int) -> _Block | None:
        """``alloc_block``: a new segment from cudaMalloc (``allocation_size``), or pages mapped into the
        stream's expandable segment; None when the card (or the memory fraction) has no room."""
        if self.conf.expandable_segments:
            if self.allowed is not None and self.reserved + allocation_size(size) > self.allowed:
                return None
            return self._expand(key, size)
        seg_size = allocation_size(size)
        if not self._room(seg_size):
            return None
        block = _Block(self._next_addr, seg_size, key, self._next_seg)
        self._next_addr += seg_size
        self._next_seg += 1
        self.segments += 1
        self._set_reserved(seg_size)
        return block

    # -- releasing the cache --
    def _release_block(self, b: _Block) -> None:
        """``release_block``: cudaFree an unsplit cached segment."""
        self._uncache(b)
        self._set_reserved(-b.size)

    def _release_available(self, key: tuple[int, bool], size: int) -> bool:
        """``release_available_cached_blocks`` (only with ``max_split_size``): free the smallest oversize
        cached block that holds the request, else oversize blocks from the largest down until enough."""
        ms = self.conf.max_split_size
        lst = self.free_lists.get(key)
        if ms is None or not lst:
            return False
        target = max(size, ms)
        i = bisect_left(lst, (target, -1))
        if i < len(lst):
            b = self.free_blocks[lst[i][1]]
            if b.is_split() or not b.mapped:
                return False
            self._release_block(b)
            return True
        released = 0
        for bsize, addr in reversed(list(lst)):
            b = self.free_blocks[addr]
            if released >= target or bsize < ms:
                break
            if b.is_split():
                continue
            released += bsize
            self._release_block(b)
        return released >= target

    def _release_cached(self) -> None:
        """``release_cached_blocks``: cudaFree every unsplit cached segment; in expandable segments, unmap
        every whole free page."""
        for b in list(self.free_blocks.values()):
            if b.seg < 0:
                self._unmap(b)
            elif not b.is_split():
                self._release_block(b)

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: above ``garbage_collection_threshold`` x the allowed memory,
        free unsplit large cached blocks at least as old (in free-block searches) as the average until the
        excess is reclaimed."""
        assert self.allowed is not None
        threshold = int(self.conf.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        calls = self.gc_calls[False]
        ages = {
            b.addr: calls - b.gc_base
            for b in self.free_blocks.values()
            if not b.key[1] and not b.is_split() and b.seg >= 0
        }
        freed = True
        while reclaimed < target and freed and ages:
            mean = sum(ages.values()) / len(ages)
            freed = False
            for addr, age in sorted(ages.items(), key=lambda kv: (self.free_blocks[kv[0]].key, kv[0])):
                if age >= mean:
                    b = self.free_blocks[addr]
                    reclaimed += b.size
                    del ages[addr]
                    self._release_block(b)
                    freed = True

    # -- free --
    def free(self, handle: object) -> None:
        """Return ``handle``'s block to its stream's cache, merged with free neighbours (``free_block``)."""
        entry = self.live.pop(handle, None)
        if entry is None:
            return
        b, req = entry
        b.allocated = False
        self.allocated -= b.size
        self.requested -= req
        for other in (b.prev, b.next):
            self._merge(b, other)
        self._cache(b)

    def _merge(self, dst: _Block, src: _Block | None) -> None:
        """``try_merge_blocks``: absorb a free neighbour of the same mapped state into ``dst``."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            self._uncache(src)
        else:
            self._unmapped_remove(src)
        if src is dst.prev:
            dst.addr, dst.prev = src.addr, src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size

    # -- expandable segments --
    def _unmapped_remove(self, b: _Block) -> None:
        lst = self.unmapped[b.key]
        del lst[bisect_left(lst, b.addr, key=_addr)]

    def _page(self, key: tuple[int, bool]) -> int:
        return SMALL_BUFFER if key[1] else LARGE_BUFFER

    def _expand(self, key: tuple[int, bool], size: int) -> _Block | None:
        """``try_allocate_expandable_block``: the lowest-addressed free-and-unmapped run of the stream's
        segment that holds ``size``, its pages mapped; None if the card has no room for them."""
        cand = self._find_expandable(key, size)
        if not cand.mapped and not self._map(cand, min(cand.size, size)):
            return None
        while cand.size < size:
            nxt = cand.next
            assert nxt is not None
            if not self._map(nxt, min(size - cand.size, nxt.size)):
                return None
            cand = nxt
        self._uncache(cand)
        return cand

    def _find_expandable(self, key: tuple[int, bool], size: int) -> _Block:
        """``find_expandable_block``: walk the unmapped ranges by address (with a free block just before),
        else open a new segment for the stream and pool."""

        def room(b: _Block | None) -> bool:
            total = 0
            while total < size and b is not None and not b.allocated:
                total += b.size
                b = b.next
            return total >= size

        for _, c in self.unmapped.get(key, []):
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            if room(c):
                return c
        span = -(-(2 * (self.capacity or (1 << 48)) + size) // LARGE_BUFFER) * LARGE_BUFFER
        self._next_addr = -(-self._next_addr // LARGE_BUFFER) * LARGE_BUFFER  # page-aligned for both pools
        self._next_seg += 1
        c = _Block(self._next_addr, span, key, -self._next_seg, mapped=False)
        self._next_addr += span
        insort(self.unmapped.setdefault(key, []), (c.addr, c), key=_addr)
        self.segments += 1
        return c

    def _map(self, b: _Block, size: int) -> bool:
        """``map_block``: map whole pages over the first ``size`` bytes of unmapped ``b``."""
        page = self._page(b.key)
        mapped = -(-size // page) * page
        if not self._room(mapped):
            return False
        self._unmapped_remove(b)
        b.mapped = True
        if mapped < b.size:
            rest = _Block(b.addr + mapped, b.size - mapped, b.key, b.seg, mapped=False)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = mapped
            insort(self.unmapped[b.key], (rest.addr, rest), key=_addr)
        self._merge(b, b.prev)
        self._merge(b, b.next)
        self._cache(b)
        self._set_reserved(mapped)
        return True

    def _unmap(self, b: _Block) -> None:
        """``unmap_block``: unmap the whole pages inside cached block ``b`` of an expandable segment."""
        page = self._page(b.key)
        start = -(-b.addr // page) * page  # expandable segments start at multiples of both pages
        end = (b.addr + b.size) // page * page
        if end <= start:
            return
        self._uncache(b)
        if start > b.addr:
            before = _Block(b.addr, start - b.addr, b.key, b.seg)
            before.prev, before.next = b.prev, b
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            self._cache(before)
        if end < b.addr + b.size:
            after = _Block(end, b.addr + b.size - end, b.key, b.seg)
            after.prev, after.next = b, b.next
            if b.next is not None:
                b.next.prev = after
            b.next = after
            self._cache(after)
        b.addr, b.size, b.mapped = start, end - start, False
        self._merge(b, b.prev)
        self._merge(b, b.next)
        insort(self.unmapped.setdefault(b.key, []), (b.addr, b), key=_addr)
        self._set_reserved(-(end - start))

    # -- out of memory --
    def _failure(self, size: int) -> Failure:
        """The OOM report: fragmentation when the card's bytes not allocated would hold the request."""
        cap = self.capacity if self.allowed is None else self.allowed
        assert cap is not None
        outside = cap - self.reserved
        largest = max([outside, *(s for lst in self.free_lists.values() for s, _ in lst[-1:])])
        free_bytes = cap - self.allocated
        cause = "fragmentation" if free_bytes >= size else "total"
        return Failure(-1, size, allocation_size(size), free_bytes, largest, cause)


# ----- replaying a stream -------------------------------------------------------------------------------
#: An event: ``(handle, size, stream)`` allocates ``size`` bytes; ``(handle, FREE, 0)`` frees ``handle``.
Event = tuple[object, int, int]


def alloc(handle: object, size: int, stream: int = 0) -> Event:
    """The event allocating ``size`` bytes on ``stream`` for ``handle``."""
    return (handle, size, stream)


def free(handle: object) -> Event:
    """The event freeing ``handle``."""
    return (handle, FREE, 0)


def replay(
    events: Iterable[Event], capacity: int | None = None, conf: AllocatorConf = DEFAULT_CONF
) -> ReplayResult:
    """Run ``events`` through one device's caching allocator; stops at the first allocation that fails."""
    a = CachingAllocator(capacity, conf)
    failure = None
    n = 0
    for n, (handle, size, stream) in enumerate(events, 1):  # noqa: B007
        if size == FREE:
            a.free(handle)
        else:
            f = a.malloc(handle, size, stream)
            if f is not None:
                failure = Failure(n - 1, f.request, f.segment, f.free_bytes, f.largest_free, f.cause)
                break
    return ReplayResult(
        peak_allocated=a.peak_allocated,
        peak_reserved=a.peak_reserved,
        peak_requested=a.peak_requested,
        ok=failure is None,
        cache_releases=a.cache_releases,
        segments=a.segments,
        events=n,
        failure=failure,
        reserved_at_end=a.reserved,
        allocated_at_end=a.allocated,
    )


__all__ = [
    "ALLOC_CONF_OPTIONS",
    "AllocatorConf",
    "CachingAllocator",
    "Failure",
    "ReplayResult",
    "alloc",
    "alloc_conf_error",
    "allocation_size",
    "free",
    "parse_alloc_conf",
    "replay",
    "round_size",
]


def replay_stream(stream: Any, conf: AllocatorConf) -> Any:
    """``alloc_stream.replay_stream`` as it was before the fast path, on this reference simulator: the phase looked
    up at every event, the largest cached blocks taken at every new peak (tests/engine/test_allocator_reference.py
    and benchmarks/replay_speed.py hold the fast path to it)."""
    from memsim_widget.engine.counters import alloc_stream

    a = CachingAllocator(None, conf)
    marks, m, label, at, cached, peak = stream.marks, 0, "", "", (), -1
    for n, (handle, size, stream_id) in enumerate(stream.events):
        while m < len(marks) and marks[m][0] <= n:
            label = marks[m][1]
            m += 1
        if size == FREE:
            a.free(handle)
            continue
        a.malloc(handle, size, stream_id)
        if a.reserved > peak:
            peak, at = a.reserved, label
            cached = tuple(nlargest(3, (s for lst in a.free_lists.values() for s, _ in lst[-3:])))
    return alloc_stream.PoolReplay(
        a.peak_reserved, a.peak_allocated, at, cached, a.segments, len(stream.events), a.peak_requested
    )
