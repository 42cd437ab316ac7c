"""PyTorch's CUDA caching allocator, replayed: the reserved counter from an ordered stream of allocations
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
from dataclasses import field
from typing import Any, cast

from memsim_widget.alloc_conf import (
    ALLOC_CONF_OPTIONS,
    DEFAULT_CONF,
    LARGE_BUFFER,
    AllocatorConf,
    alloc_conf_error,
    parse_alloc_conf,
)
from memsim_widget.fast_dataclass import dataclass

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
#: The event size that frees a handle.
FREE = -1
#: A cached block's entry in its free list is one int, ``size << ADDR_BITS | address``: sorted by size, then
#: address (``BlockPool``'s order), compared faster than a pair. Addresses stay below 2**64.
ADDR_BITS = 64
ADDR_MASK = (1 << ADDR_BITS) - 1


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

    __slots__ = ("addr", "size", "key", "allocated", "prev", "next", "mapped", "seg", "gc_base", "req", "fl")

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
        self.req = 0  # the bytes asked for, while allocated
        self.fl: list[int] | None = None  # ``run``: its stream and pool's free list, once looked up

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


def oom_fields(f: Failure | None) -> dict[str, Any]:
    """A failed replay's cause, request and largest free block as ``--json`` and the trace's report name them
    (None each when the replay ran)."""
    return {
        "oom_cause": f.cause if f else None,
        "oom_request_bytes": f.request if f else None,
        "oom_largest_free_bytes": f.largest_free if f else None,
    }


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


def largest_cached(lists: Iterable[list[int]], n: int = 3) -> tuple[int, ...]:
    """The sizes of the ``n`` largest cached blocks of free lists (each sorted: its last ``n`` suffice)."""
    return tuple(sorted((entry >> ADDR_BITS for lst in lists for entry in lst[-n:]), reverse=True)[:n])


# ----- the allocator ------------------------------------------------------------------------------------
class CachingAllocator:
    """One device's caching allocator. ``capacity``: the bytes cudaMalloc may hand out in all (the card less
    the context, NCCL and memory allocated outside PyTorch); None: unlimited."""

    def __init__(self, capacity: int | None = None, conf: AllocatorConf = DEFAULT_CONF) -> None:
        self.conf = conf
        self.capacity = capacity
        frac = conf.per_process_memory_fraction
        self.allowed = None if frac is None or capacity is None else int(frac * capacity)
        self.free_lists: dict[tuple[int, bool], list[int]] = {}  # sorted ``entry`` ints
        self.free_blocks: dict[int, _Block] = {}  # addr -> cached block
        self.unmapped: dict[tuple[int, bool], list[tuple[int, _Block]]] = {}
        self.live: dict[object, _Block] = {}  # handle -> its allocated block
        self.gc_calls = {True: 0, False: 0}
        # ``run``'s inlined loop serves the common settings: no max_split_size and no garbage collection (their
        # rules only through ``malloc``), sizes in 512 B steps unless power-of-two divisions are set
        self._plain_round = all(d <= 1 for d in conf.roundup_power2_divisions)
        self._fast = conf.max_split_size is None and conf.garbage_collection_threshold <= 0
        self._expandable = conf.expandable_segments
        self.allocated = self.reserved = self.requested = 0
        self.peak_allocated = self.peak_reserved = self.peak_requested = 0
        #: ``run``: the index of the allocation after which reserved last rose above every earlier value (-1:
        #: none yet), and the free lists' last three blocks then (``alloc_stream``: the largest cached blocks)
        self.peak_event, self.peak_tails = -1, []
        self._seen = -1
        self.cache_releases = self.segments = 0
        self._next_addr = 1 << 40
        self._next_seg = 0

    # -- the free lists (``BlockPool.blocks``: by stream, size, address) --
    def _cache(self, b: _Block) -> None:
        b.gc_base = self.gc_calls[b.key[1]]
        insort(self.free_lists.setdefault(b.key, []), b.size << ADDR_BITS | b.addr)
        self.free_blocks[b.addr] = b

    def _uncache(self, b: _Block) -> None:
        lst = self.free_lists[b.key]
        del lst[bisect_left(lst, b.size << ADDR_BITS | b.addr)]
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

    # -- a stream --
    def run(self, events: Iterable[Event]) -> tuple[int, Failure | None]:
        """Replay ``events`` in order up to the first allocation that fails: (the events replayed, that failure
        with its index). Sets ``peak_event`` and ``peak_tails``. Under the fast path's settings, ``malloc`` and
        ``free`` inlined in one loop (the same steps, local counters; ``_get_free_block``'s best fit too, expandable
        segments' included: a change to one is a change to both, held equal by tests/engine/test_allocator_reference.py)."""
        if not self._fast:
            return self._run_calls(events)
        lists, blocks, live = self.free_lists, self.free_blocks, self.live
        conf, plain, exp = self.conf, self._plain_round, self._expandable
        allocated, requested, seen, n = self.allocated, self.requested, self._seen, 0
        peak_a, peak_q = self.peak_allocated, self.peak_requested
        made = (
            self.reserved > seen
        )  # reserved may have risen past ``seen``: after a segment or pages are made
        for n, (handle, size, stream) in enumerate(events, 1):  # noqa: B007
            if size == FREE:  # ``free``
                b = live.pop(handle, None)
                if b is None:
                    continue
                b.allocated = False
                allocated -= b.size
                requested -= b.req
                lst = b.fl
                if lst is None:
                    lst = b.fl = lists.setdefault(b.key, [])
                p = b.prev
                if p is not None and not p.allocated and p.mapped:  # unmapped ranges stay apart
                    del lst[bisect_left(lst, p.size << ADDR_BITS | p.addr)]
                    del blocks[p.addr]
                    b.addr, pp = p.addr, p.prev
                    b.prev = pp
                    if pp is not None:
                        pp.next = b
                    b.size += p.size
                x = b.next
                if x is not None and not x.allocated and x.mapped:
                    del lst[bisect_left(lst, x.size << ADDR_BITS | x.addr)]
                    del blocks[x.addr]
                    xx = b.next = x.next
                    if xx is not None:
                        xx.prev = b
                    b.size += x.size
                insort(lst, b.size << ADDR_BITS | b.addr)
                blocks[b.addr] = b
                continue
            if size > 0:  # ``malloc``
                rounded = (size + 511) & -512 if plain else round_size(size, conf)
                small = rounded <= SMALL_SIZE
                key = (stream, small)
                lst = lists.get(key)
                block = None
                if lst:  # ``_get_free_block`` inlined (no max_split_size here)
                    i = bisect_left(lst, rounded << ADDR_BITS)
                    end = len(lst)
                    if i < end:
                        if exp:  # as ``_get_free_block``: the size it can grow to, the unmapped range after it counts
                            b = blocks[lst[i] & ADDR_MASK]
                            x = b.next
                            grow = b.size + (x.size if x is not None and not x.mapped else 0)
                            while i + 1 < end:
                                b = blocks[lst[i + 1] & ADDR_MASK]
                                x = b.next
                                g = b.size + (x.size if x is not None and not x.mapped else 0)
                                if g >= grow:
                                    break
                                i, grow = i + 1, g
                        block = blocks.pop(lst.pop(i) & ADDR_MASK)
                if block is None:
                    made = True
                    block = self._alloc_block(key, rounded)
                    if block is None:
                        self._release_cached()
                        block = self._alloc_block(key, rounded)
                        self.cache_releases += block is not None
                        if block is None:
                            self.allocated, self.requested = allocated, requested
                            self.peak_allocated, self.peak_requested, self._seen = peak_a, peak_q, seen
                            f = self._failure(rounded)
                            return n, Failure(
                                n - 1, f.request, f.segment, f.free_bytes, f.largest_free, f.cause
                            )
                rest = block.size - rounded
                if rest > SMALL_SIZE or ((small or exp) and rest >= MIN_BLOCK):  # ``should_split``
                    r = _Block(block.addr + rounded, rest, key, block.seg)
                    x = r.next = block.next
                    r.prev = block
                    if x is not None:
                        x.prev = r
                    block.next = r
                    block.size = rounded
                    lst = r.fl = block.fl
                    if lst is None:  # ``_alloc_block`` may have made it (expandable segments)
                        lst = r.fl = lists.setdefault(key, [])
                    insort(lst, rest << ADDR_BITS | r.addr)
                    blocks[r.addr] = r
                block.allocated = True
                block.req = size
                live[handle] = block
                allocated += block.size
                requested += size
                if allocated > peak_a:
                    peak_a = allocated
                if requested > peak_q:
                    peak_q = requested
            if made and self.reserved > seen:
                made, seen, self.peak_event = False, self.reserved, n - 1
                self.peak_tails = [lst[-3:] for lst in lists.values()]
        self.allocated, self.requested = allocated, requested
        self.peak_allocated, self.peak_requested, self._seen = peak_a, peak_q, seen
        return n, None

    @property
    def skippable(self) -> bool:
        """Whether a replay may skip repeated events by comparing ``state`` (the fast path's settings, fixed
        segments: not under expandable segments, whose pages map and unmap)."""
        return self._fast and not self._expandable

    def run_from(self, events: list[Event], start: int, end: int) -> None:
        """``run`` over ``events[start:end]``, ``peak_event`` kept as an index into the whole of ``events``."""
        if end <= start:
            return
        seen = self._seen
        self.run(events[start:end])
        if self._seen > seen:
            self.peak_event += start

    def state(self, lo: int, here: int) -> tuple[Any, ...]:
        """What decides the next events' replay: reserved, the segments, the cached blocks, and the live blocks by
        address with their handles (int handles above ``lo`` counted from the handle counter ``here``: a copy
        of a repeated block of events, ``alloc_stream._run_micro_batches``)."""
        live = sorted(
            ((h - here, 1) if h > lo else (h, 0), b.addr, b.size, b.req, b.key)
            for h, b in cast("dict[int, _Block]", self.live).items()
        )
        free = sorted((k, tuple(v)) for k, v in self.free_lists.items() if v)
        return self.reserved, self.segments, self._next_addr, self.allocated, self.requested, live, free

    def shift_live(self, lo: int, shift: int) -> None:
        """Move the live int handles above ``lo`` by ``shift`` (repeated events skipped: the live blocks are the
        last copy's)."""
        live = cast("dict[int, _Block]", self.live)
        self.live = {h + shift if h > lo else h: b for h, b in live.items()}

    def largest_at_peak(self, n: int = 3) -> tuple[int, ...]:
        """The sizes of the ``n`` largest cached blocks when reserved last rose (``run``'s ``peak_tails``)."""
        return largest_cached(self.peak_tails, n)

    def _run_calls(self, events: Iterable[Event]) -> tuple[int, Failure | None]:
        """``run`` one ``malloc`` or ``free`` call per event (every setting)."""
        n = 0
        for n, (handle, size, stream) in enumerate(events, 1):  # noqa: B007
            if size == FREE:
                self.free(handle)
                continue
            f = self.malloc(handle, size, stream)
            if f is not None:
                return n, Failure(n - 1, f.request, f.segment, f.free_bytes, f.largest_free, f.cause)
            if self.reserved > self._seen:
                self._seen, self.peak_event = self.reserved, n - 1
                self.peak_tails = [lst[-3:] for lst in self.free_lists.values()]
        return n, None

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
        block.req = size
        self.live[handle] = block
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
        i = bisect_left(lst, size << ADDR_BITS)
        if i == len(lst):
            return None
        if self.conf.expandable_segments:  # size it can grow to: the unmapped range after it counts
            blocks, end = self.free_blocks, len(lst)
            b = blocks[lst[i] & ADDR_MASK]
            x = b.next
            grow = b.size + (x.size if x is not None and not x.mapped else 0)
            while i + 1 < end:
                b = blocks[lst[i + 1] & ADDR_MASK]
                x = b.next
                g = b.size + (x.size if x is not None and not x.mapped else 0)
                if g >= grow:
                    break
                i, grow = i + 1, g
        bsize = lst[i] >> ADDR_BITS
        ms = self.conf.max_split_size
        if ms is not None:
            if size < ms <= bsize:
                return None
            if size >= ms and bsize >= size + self.conf.max_non_split_rounding:
                return None
        block = self.free_blocks[lst[i] & ADDR_MASK]
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
        if (self.capacity is not None or self.allowed is not None) and not self._room(seg_size):
            return None
        block = _Block(self._next_addr, seg_size, key, self._next_seg)
        self._next_addr += seg_size
        self._next_seg += 1
        self.segments += 1
        self.reserved += seg_size  # ``_set_reserved``
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
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
        i = bisect_left(lst, target << ADDR_BITS)
        if i < len(lst):
            b = self.free_blocks[lst[i] & ADDR_MASK]
            if b.is_split() or not b.mapped:
                return False
            self._release_block(b)
            return True
        released = 0
        for entry in reversed(list(lst)):
            bsize, b = entry >> ADDR_BITS, self.free_blocks[entry & ADDR_MASK]
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
        b = self.live.pop(handle, None)
        if b is None:
            return
        b.allocated = False
        self.allocated -= b.size
        self.requested -= b.req
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
        for _, c in self.unmapped.get(key, []):
            if c.prev is not None and not c.prev.allocated:
                c = c.prev
            total, b = 0, c  # the free run from ``c`` holds ``size``
            while total < size and b is not None and not b.allocated:
                total += b.size
                b = b.next
            if total >= size:
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
        page = SMALL_BUFFER if b.key[1] else LARGE_BUFFER  # ``_page``
        mapped = -(-size // page) * page
        if (self.capacity is not None or self.allowed is not None) and not self._room(mapped):
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
        largest = max([outside, *(lst[-1] >> ADDR_BITS for lst in self.free_lists.values() if lst)])
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
    n, failure = a.run(events)
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
    "largest_cached",
    "parse_alloc_conf",
    "replay",
    "round_size",
]
