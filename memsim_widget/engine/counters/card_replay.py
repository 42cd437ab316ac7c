"""The replay of a rank's steps on the card's real capacity, the verdict's last word (``Estimate.card_replay``):
whether the stream ``engine/counters/alloc_stream`` builds runs on the bytes the allocator may take, runs only by
releasing its cache, or runs out of memory (from fragmentation or the total), in words; and, for the planner,
whether it runs without this second replay where the bytes asked for decide it (``card_runs``).

It reuses the stream the unlimited replay built (``alloc_stream.built_stream``) and caches per shape as that replay
does; ``alloc_stream.cache_clear`` empties its cache too.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from functools import lru_cache
from typing import Any

from memsim_widget.engine.counters.alloc_stream import (
    CLEARED_TOO,
    ReplayArgs,
    StreamWriter,
    built_stream,
    pool_replay,
    stream_asks,
)
from memsim_widget.engine.counters.allocator import AllocatorConf, Failure, ReplayResult, replay
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.units import fmt_bytes

#: ``CardReplay.reason``: the replay on the card ran without a failed cudaMalloc; ran only because failed
#: cudaMallocs made the allocator free its cache and retry (``malloc``'s ``release_cached_blocks``, docs/allocator.md);
#: ran out of memory although the bytes not allocated would hold the request (no single free range does); ran
#: out of memory because they would not.
RUNS, RELEASES_CACHE, FRAGMENTATION, TOTAL = "runs", "releases cache", "fragmentation", "total"


@dataclass(frozen=True)
class CardReplay:
    """The replay of a rank's steps on the card's real capacity (its memory as the driver reports it less what
    lives outside the allocator: context, NCCL, paged states; the split nvidia-smi's figure is made of):
    whether every allocation succeeded, how many times only a release of the cache let it, and the failure."""

    capacity: int
    runs: bool
    cache_releases: int = 0
    #: the out-of-memory request (rounded bytes), the largest free range then, the free bytes, the cause
    failure: Failure | None = None
    #: the phase of the stream the failure came in ('' when it runs)
    at: str = ""
    #: the room on which it runs without a failed cudaMalloc: the unlimited replay's peak reserved (0: not known)
    needed: int = 0

    @property
    def reason(self) -> str:
        """``RUNS``, ``RELEASES_CACHE``, ``FRAGMENTATION`` or ``TOTAL``."""
        if self.runs:
            return RELEASES_CACHE if self.cache_releases else RUNS
        assert self.failure is not None
        return FRAGMENTATION if self.failure.cause == "fragmentation" else TOTAL

    @property
    def text(self) -> str:
        """The outcome in words."""
        f = self.failure
        return card_text(
            self.capacity,
            self.runs,
            self.cache_releases,
            f.cause if f else None,
            f.request if f else 0,
            f.largest_free if f else 0,
        ) + (f" (at {self.at})" if self.at else "")


def card_text(capacity: int, runs: bool, releases: int, cause: str | None, request: int, largest: int) -> str:
    """A replay on a card in words: it runs, runs only by releasing the cache (slower steps), or runs out of
    memory from fragmentation (naming the request and the largest free range) or from the total."""
    cap = fmt_bytes(capacity)
    if runs and releases:
        return (
            f"replayed on the card ({cap} for PyTorch): runs only because failed cudaMallocs make the allocator "
            f"free its cache ({releases} times a step or more): slower steps"
        )
    if runs:
        return f"replayed on the card ({cap} for PyTorch): runs"
    req, big = fmt_bytes(request), fmt_bytes(largest)
    if cause == "fragmentation":
        return (
            f"replayed on the card ({cap} for PyTorch): out of memory from fragmentation: {req} asked, the "
            f"free bytes would hold it but the largest free range is {big}"
        )
    return f"replayed on the card ({cap} for PyTorch): out of memory: {req} asked, more than is free"


def card_replay(ctx: Any, stage: Any, capacity: int) -> CardReplay:
    """The replay of ``stage``'s rank of ``ctx`` on ``capacity`` bytes (``overhead.reserved_cap``). A stream
    whose unlimited replay peaks at or under the capacity never fails a cudaMalloc, so it runs as replayed
    (unless a memory fraction lowers the limit); else the stream is replayed again on the capacity, cached."""
    from memsim_widget.engine.frameworks import allocator_conf

    conf = allocator_conf(ctx)
    needed = pool_replay(ctx, stage).peak_reserved
    if runs_as_replayed(conf, needed, capacity):
        return CardReplay(max(capacity, 0), True, needed=needed)
    from memsim_widget.engine.caches.parts_cache import activations_key, state_groups_key

    key = (state_groups_key(ctx.scenario), activations_key(ctx.scenario), stage, conf, capacity)
    return replace(_card_cached(ReplayArgs(key, (ctx, stage, conf, capacity))), needed=needed)


def runs_as_replayed(conf: AllocatorConf, needed: int, capacity: int) -> bool:
    """Whether a stream whose unlimited replay peaks at ``needed`` reserved bytes runs on ``capacity`` without a
    second replay: it never asks cudaMalloc past the capacity, so none fails (unless a memory fraction lowers the
    limit below the capacity)."""
    return conf.per_process_memory_fraction is None and needed <= capacity


def card_runs(ctx: Any, stage: Any, capacity: int) -> bool:
    """``card_replay(ctx, stage, capacity).runs``, without the second replay where the first decides it: a step
    whose bytes asked for peak above the capacity runs out of memory on it (in a replay that runs, at every
    event requested <= allocated <= reserved <= the capacity, and requested is the same in every replay of the
    stream). The planner reads only this (``plan/vector._replayed_pools``)."""
    if stream_asks(ctx, stage).peak_requested > max(capacity, 0):
        return False
    return card_replay(ctx, stage, capacity).runs


@lru_cache(maxsize=1024)
def _card_cached(args: ReplayArgs) -> CardReplay:
    ctx, stage, conf, capacity = args.args
    args.args = ()
    return card_outcome(built_stream(args.key[:3], ctx, stage), conf, capacity)


def card_outcome(stream: StreamWriter, conf: AllocatorConf, capacity: int) -> CardReplay:
    """``stream`` replayed on ``capacity`` bytes (``allocator.replay``: a failed cudaMalloc releases the cache
    and retries, then fails): whether it runs, the releases that let it, the failure and its phase."""
    res: ReplayResult = replay(stream.events, max(capacity, 0), conf)
    f = res.failure
    return CardReplay(max(capacity, 0), res.ok, res.cache_releases, f, phase_of(stream, f.event) if f else "")


def phase_of(stream: StreamWriter, event: int) -> str:
    """The phase ``stream``'s event ``event`` belongs to (``StreamWriter.mark``)."""
    j = bisect_right([n for n, _ in stream.marks], event) - 1
    return stream.marks[j][1] if j >= 0 else ""


CLEARED_TOO.append(_card_cached.cache_clear)
