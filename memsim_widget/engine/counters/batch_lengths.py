"""A run of batches whose lengths vary (``padding: "longest"``), replayed step after step through the caching
allocator: the history the two-step replay of ``alloc_stream`` leaves out (docs/allocator.md, "Variable
lengths").

A run padded per batch makes its loss buffers (T x V, the largest blocks of a step) and its activations at a
new size every micro-batch. The allocator keeps every segment it made (nothing frees the cache but a failed
cudaMalloc or ``empty_cache``), so a batch whose blocks do not pack into the segments cached so far makes new
ones, and ``max_memory_reserved`` ratchets up over the run. How far depends on the sequence of lengths, which a
scenario does not hold: ``length_schedule`` writes one from a data set's published statistics (an assumption,
labelled where it is used), ``lengths_stream`` the stream of a run of such batches from the engine's own
groups, ``reserved_by_step`` the peak reserved after each optimizer step of its replay.

Not read by ``estimate``: the engine's ``reserved_model: replay`` still replays two steps (``alloc_stream``).
``benchmarks/allocator_replay_varlen.py`` measures these replays against published and measured runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

from memsim_widget.engine.counters.alloc_stream import (
    BOTTOM_LAYER_BACKWARD,
    FINAL_NORM,
    KEPT_TOP,
    LAYER_BACKWARD,
    LAYER_FORWARD,
    StreamWriter,
    grad_order,
    step_stream,
)
from memsim_widget.engine.counters.allocator import AllocatorConf, CachingAllocator, Failure
from memsim_widget.engine.frameworks import grads_kept

#: The golden ratio's fractional part: ``k x GOLDEN mod 1`` (k = 1, 2, ...) visits [0, 1) evenly in a fixed,
#: unsorted order (Weyl's equidistribution), so the lengths it draws have the distribution's shape without a
#: random generator.
GOLDEN = (math.sqrt(5) - 1) / 2
#: What a sample longer than the longest length allowed becomes: cut to it (``truncate``: ms-swift's
#: ``truncation_left``, transformers' ``truncation=True``) or dropped from the data set (``delete``: ms-swift
#: 1.x's default ``truncation_strategy``).
TRUNCATE, DELETE = "truncate", "delete"


def length_schedule(
    n: int, longest: int, mean: float, sd: float, shortest: int = 1, over: str = TRUNCATE, per_batch: int = 1
) -> tuple[int, ...]:
    """``n`` batch lengths of a data set whose sample lengths (tokens) have ``mean`` and standard deviation
    ``sd``, at least ``shortest``, modelled log-normal (an assumption: a published mean and deviation fix its
    two parameters). Sample ``k`` is the distribution's quantile at ``k x GOLDEN mod 1``; a sample over
    ``longest`` is cut to it (``TRUNCATE``) or dropped (``DELETE``: the quantile is taken in the part at or
    under ``longest``); each batch is padded to its longest of ``per_batch`` samples."""
    if over not in (TRUNCATE, DELETE):
        raise ValueError(f"over: {over!r} is not one of {TRUNCATE!r}, {DELETE!r}")
    for field, value, ok, allowed in (
        ("n", n, n >= 0, ">= 0"),
        ("longest", longest, longest >= 1, ">= 1"),
        ("mean", mean, mean > 0, "> 0"),
        ("sd", sd, sd > 0, "> 0"),
        ("per_batch", per_batch, per_batch >= 1, ">= 1"),
    ):
        if not ok:
            raise ValueError(f"{field}: {value!r}, must be {allowed}")
    s2 = math.log(1 + (sd / mean) ** 2)
    dist = NormalDist(math.log(mean) - s2 / 2, math.sqrt(s2))
    kept = dist.cdf(math.log(longest)) if over == DELETE else 1.0
    out: list[int] = []
    k = 0
    for _ in range(n):
        batch = 0
        for _ in range(per_batch):
            k += 1
            u = min(max((k * GOLDEN) % 1.0 * kept, 1e-12), 1 - 1e-12)
            batch = max(batch, min(max(shortest, int(math.exp(dist.inv_cdf(u)))), longest))
        out.append(batch)
    return tuple(out)


def lengths_stream(ctx: Any, stage: Any, lengths: Sequence[int]) -> StreamWriter:
    """The stream of ``stage``'s rank of ``ctx`` over micro-batches of ``lengths`` tokens in turn (a whole
    number of optimizer steps of ``grad_accum_steps`` micro-batches each): ``alloc_stream.rank_stream``'s
    stream with each micro-batch's activation items at its own length (``step_stream``'s ``schedule``); one
    set of items per distinct length."""
    from memsim_widget.engine.activations.compiled_steps import (
        bottom_layer_backward_steps,
        kept_top,
        layer_backward_steps,
        layer_forward_steps,
    )
    from memsim_widget.engine.activations.forward import final_norm_transients
    from memsim_widget.engine.caches.parts_cache import cached_activation_groups, cached_state_groups
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.states.budget import local_groups

    sc = ctx.scenario
    micro = max(sc.grad_accum_steps, 1)
    if not lengths or len(lengths) % micro:
        raise ValueError(f"lengths: {len(lengths)} micro-batches is not a whole number of steps of {micro}")
    by_length: dict[int, dict[str, Sequence[Any]]] = {}
    for n in sorted(set(lengths)):
        c = Context(sc.replace(seq_len=n))
        a: dict[str, Sequence[Any]] = {
            k: list(g.entries) for k, g in cached_activation_groups(c, stage).items()
        }
        a[LAYER_FORWARD] = layer_forward_steps(c)
        a[LAYER_BACKWARD] = layer_backward_steps(c)
        a[BOTTOM_LAYER_BACKWARD] = bottom_layer_backward_steps(c)
        a[KEPT_TOP] = kept_top(c)
        a[FINAL_NORM] = final_norm_transients(c)
        by_length[n] = a
    groups, step1 = cached_state_groups(ctx, stage)
    sg = {k: g.entries for k, g in groups.items()}
    numels = tuple(lg.numel_each for lg in local_groups(ctx, stage) for _ in range(lg.count))
    first = step1.entries if step1 is not None else sg["persistent"]
    schedule = [by_length[n] for n in lengths]
    steps = len(lengths) // micro
    return step_stream(
        schedule[0],
        sg,
        first,
        numels,
        stage.layers,
        steps,
        grad_order(ctx, stage),
        micro=micro,
        kept=grads_kept(sc),
        schedule=schedule,
    )


def reserved_by_step(
    stream: StreamWriter, conf: AllocatorConf, capacity: int | None = None
) -> tuple[tuple[int, ...], Failure | None]:
    """The peak reserved of ``stream``'s replay after each of its optimizer steps (the last value is the whole
    run's ``max_memory_reserved``), on ``capacity`` bytes (None: unlimited; a failed cudaMalloc releases the
    cache and retries, ``allocator.CachingAllocator``), and the allocation that failed (None: it ran; the
    steps then stop at the failing one)."""
    a = CachingAllocator(capacity, conf)
    starts: dict[str, int] = {}
    for n, label in stream.marks:  # "step 3 micro-batch 1 forward": step 3 starts at its first mark
        if label.startswith("step "):
            starts.setdefault(label.split()[1], n)
    ends = list(starts.values())[1:] + [len(stream.events)]
    out: list[int] = []
    start = 0
    for end in ends:
        failure = a.run(stream.events[start:end])[1]
        out.append(a.peak_reserved)
        if failure is not None:
            return tuple(out), failure
        start = end
    return tuple(out), None
