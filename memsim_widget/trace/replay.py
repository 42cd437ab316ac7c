"""The reserved and nvidia-smi counters of a traced run: its allocations and frees, in order, replayed through
the caching allocator (``engine/counters/allocator.py``).

The tracker records every tensor storage with the sequence numbers of its allocation and its free; sorted,
they are the stream of requests PyTorch's allocator sees on the GPU. Two things the trace cannot see are added
as the engine models them: the cuBLAS workspaces (allocated through the caching allocator, one per cuBLAS
handle and stream, ``overhead.workspace_items``: the forward thread's when the first forward starts, the autograd
thread's right after the output of the first matmul of the first backward, ``overhead.AUTOGRAD_HANDLES``) and
what lives outside the allocator (CUDA context, NCCL, paged states: ``overhead.device_items``), added to reserved
for nvidia-smi.

Streams: each record carries the CUDA stream it is allocated on (``StorageRecord.stream``): FSDP2's all-gather
outputs on its all-gather copy-in stream, its reduce-scatter outputs (the gradient shards) on the reduce-scatter
stream, as FSDP2 enters them (``trace/distributed.fsdp_streams``); everything else, the reduce-scatter inputs
and the unsharded parameters included, on the compute stream.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.counters.allocator import (
    AllocatorConf,
    Event,
    ReplayResult,
    alloc,
    free,
    oom_fields,
    replay,
)

#: The ATen ops that call cuBLAS (through ``at::cuda::blas``): the first of them on a thread makes that
#: thread's handle and its workspace (``getCurrentCUDABlasHandle``, after the op has allocated its output).
CUBLAS_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "addr", "_scaled_mm"})


def allocation_stream(
    tracker: Any, workspaces: tuple[int, ...] = (), autograd_workspaces: int = 0
) -> list[Event]:
    """The traced run's allocations and frees in the order they happened (outputs of one op in the order the
    op returned them), with ``workspaces`` allocated (never freed): the last ``autograd_workspaces`` of them
    right after the output of the first cuBLAS op of the first backward (the autograd engine's device thread
    has its own handle, ``overhead.AUTOGRAD_HANDLES``), the others when the first forward starts."""
    keyed: list[tuple[int, int, int, Event]] = []
    first_mm: int | None = None
    backward = tracker.mark_seq(1, "backward")
    for i, rec in enumerate(tracker.records):
        if rec.nbytes <= 0:
            continue
        keyed.append((rec.alloc_seq, 1, i, alloc(i, rec.nbytes, getattr(rec, "stream", 0))))
        if rec.free_seq is not None:
            keyed.append((rec.free_seq, 0, i, free(i)))
        if backward is not None and rec.alloc_seq >= backward and rec.op in CUBLAS_OPS:
            first_mm = rec.alloc_seq if first_mm is None else min(first_mm, rec.alloc_seq)
    start = tracker.mark_seq(1, "forward")
    start = 0 if start is None else start
    split = len(workspaces) - (autograd_workspaces if first_mm is not None else 0)
    for j, n in enumerate(workspaces):
        # the autograd thread's after the first backward matmul's output (rank 2 sorts after its allocation)
        seq, rank = (start, 0) if j < split or first_mm is None else (first_mm, 2)
        keyed.append((seq, rank, -1 - j, alloc(("workspace", j), n)))
    keyed.sort(key=lambda k: k[:3])
    return [k[3] for k in keyed]


def _prepared(
    tracker: Any, sc: Any, conf: AllocatorConf | None
) -> tuple[list[Event], int, AllocatorConf, int]:
    """(the stream with the cuBLAS workspaces, the bytes outside the allocator, the allocator settings, the
    card's capacity as the engine reads it)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.counters.overhead import AUTOGRAD_HANDLES, device_items, workspace_items
    from memsim_widget.engine.frameworks import allocator_conf

    ctx = Context(sc)
    ws = workspace_items(ctx)[0]
    per = ws.bytes // max(ws.tensors, 1)
    events = allocation_stream(tracker, (per,) * ws.tensors, AUTOGRAD_HANDLES)
    outside = sum(i.bytes for i in device_items(ctx))
    return events, outside, conf or allocator_conf(ctx), ctx.gpu.memory_bytes


def replay_trace(tracker: Any, sc: Any, conf: AllocatorConf | None = None) -> tuple[ReplayResult, int]:
    """(the replay of a traced run of scenario ``sc`` on an unlimited card, the bytes outside the allocator
    that nvidia-smi adds): its peak reserved is what ``torch.cuda.max_memory_reserved`` reports."""
    events, outside, conf, _ = _prepared(tracker, sc, conf)
    return replay(events, conf=conf), outside


#: The three counters, as ``memsim estimate --json`` names them.
COUNTERS = ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes")


def traced_counters(sc: Any, result: Any) -> dict[str, Any]:
    """The traced run's three counters by replay: allocated and reserved as the caching allocator counts them
    (``max_memory_allocated``, ``max_memory_reserved``) and nvidia-smi (reserved + what lives outside it), and
    the replay on the scenario's card (its memory less what lives outside the allocator): whether the step
    runs, runs only because failed cudaMallocs made the allocator free its cache, or runs out of memory, and
    then whether fragmentation or the total is the cause. Empty when the result kept no tracker."""
    tracker = getattr(result, "tracker", None)
    if tracker is None:
        return {}
    events, outside, conf, memory = _prepared(tracker, sc, None)
    res = replay(events, conf=conf)
    on_card = replay(events, capacity=max(memory - outside, 0), conf=conf)
    return {
        "peak_allocated_bytes": res.peak_allocated,
        "peak_reserved_bytes": res.peak_reserved,
        "device_total_bytes": res.peak_reserved + outside,
        "allocator_events": res.events,
        "allocator_segments": res.segments,
        "allocator_conf": conf.text,
        "on_card": {
            "capacity_bytes": max(memory - outside, 0),
            "runs": on_card.ok,
            "only_by_releasing_cache": on_card.only_by_releasing_cache,
            "cache_releases": on_card.cache_releases,
            **oom_fields(on_card.failure),
        },
    }


def on_card_text(on_card: dict[str, Any] | None) -> str:
    """The replay's verdict on the card in words (empty without a replay): ``card_replay.card_text``."""
    from memsim_widget.engine.counters.card_replay import card_text

    if not on_card:
        return ""
    return card_text(
        on_card["capacity_bytes"],
        on_card["runs"],
        on_card["cache_releases"] if on_card["only_by_releasing_cache"] else 0,
        on_card.get("oom_cause"),
        on_card.get("oom_request_bytes") or 0,
        on_card.get("oom_largest_free_bytes") or 0,
    )
