"""How many micro-batches a pipeline stage holds at once, and when gradients outlive a micro-batch: written
once over ``engine/arith`` for one stage (the engine: ``Context.in_flight``, ``timeline``) and for many
candidate stages at once (the planner: ``plan/vector``).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.arith import largest_int, maximum, minimum, where


def interleaved_in_flight(p: Any, v: int, m: Any, rank: Any) -> Any:
    """Micro-batches in flight on ``rank`` of an interleaved 1F1B schedule, in units of the rank's ``v`` model
    chunks: the warm-up forwards plus the one whose backward comes first, ``min(w + 1, m v) / v`` with
    ``w = (v - 1) m_r + 2 (p - 1 - rank)`` and ``m_r = m / max(1, m // p)`` micro-batches per round
    (torch.distributed.pipelining ``ScheduleInterleaved1F1B`` / ``_get_warmup_ops``; Megatron's interleaved
    schedule warms up alike, Narayanan et al. 2021, arXiv 2104.04473)."""
    per_round = m // maximum(1, m // p)
    warmup = minimum((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    return minimum(warmup + 1, m * v) / v


def in_flight(p: Any, m: Any, schedule: str, v: int, stage: Any) -> Any:
    """Micro-batches whose activations stage ``stage`` of ``p`` holds at once with ``m`` micro-batches
    (docs/memory-facts.md#parallel-layouts): one without a pipeline; all of them under GPipe (every forward
    before the first backward); the warm-up depth under 1F1B, ``min(m, p - stage)``; ``interleaved_in_flight``
    under interleaved 1F1B. A float (an array of them for arrays)."""
    if schedule == "gpipe":
        f = m * 1.0
    elif schedule == "interleaved":
        f = interleaved_in_flight(p, v, m, stage)
    else:
        f = minimum(m, p - stage) * 1.0
    return where(p == 1, 1.0, f)


def pipeline_carries_grads(p: Any, m: Any, f: Any) -> Any:
    """A pipeline stage holding fewer micro-batches in flight (``f``) than there are (``m``): an earlier one
    already ran backward when its fullest moment comes, so its gradients are alive (never under GPipe)."""
    return (p > 1) & (f < m)


def grads_carried(grad_accum: Any, pipelined: Any, optimizer_in_backward: bool, kept: bool = False) -> Any:
    """Gradients alive through a micro-batch's forward: accumulated over micro-batches (``grad_accum`` > 1),
    carried by the pipeline (``pipeline_carries_grads``) or ``kept`` by a ``zero_grad`` that zeroes them in place
    (``frameworks.grads_kept``), unless the optimizer steps inside backward."""
    return ((grad_accum > 1) | pipelined | kept) & (not optimizer_in_backward)


def first_carrying_stage(p: Any, m: Any, schedule: str, v: int) -> Any:
    """The lowest stage >= 1 of ``p`` that carries gradients (``pipeline_carries_grads`` of its ``in_flight``),
    -1 where none does (GPipe; or one micro-batch): each stage asked through ``in_flight`` itself, from the top
    down so that the lowest one found is kept. Numbers, or arrays of pipelines (``plan/vector``: a candidate's
    extra middle stage, the lowest of those that carry)."""
    found = where(p < 0, p, -1)  # -1, shaped as ``p``
    for s in range(largest_int(p) - 1, 0, -1):
        carries = (s < p) & pipeline_carries_grads(p, m, in_flight(p, m, schedule, v, s))
        found = where(carries, s, found)
    return found
