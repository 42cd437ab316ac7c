"""What a pipeline stage holds beyond its layers' activations (``torch.distributed.pipelining``, traced).

Facts from the trace of ``PipelineStage`` with 1F1B, GPipe and interleaved 1F1B schedules
(docs/fidelity-parallel.md): each stage allocates one receive buffer per micro-batch for the hidden states
it gets from the previous stage and one for the gradients it gets from the next, at the first step, and
keeps them for the run; the schedule keeps each stage's output of every micro-batch in flight until that
micro-batch's backward (on the last stage: the logits); a non-first stage holds the input gradient of the
previous micro-batch until it is sent. Under GPipe the last stage runs every micro-batch's loss before the
first backward, so it holds each one's head and loss tensors; and as backward runs micro-batch by
micro-batch, the second one starts with every gradient made and one micro-batch fewer held
(``next_backward_count``).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.arith import negate, where
from memsim_widget.engine.context import Context, Stage

# ----- the counts, over numbers (one stage) or arrays (plan/vector: many candidate stages) ----------------


def receive_count(p: Any, m: Any, v: int, first: Any, last: Any) -> Any:
    """Receive buffers of one micro-batch's hidden states (or their gradient) a rank keeps: per micro-batch,
    one per direction per model chunk (a rank of an interleaved schedule holds ``v`` chunks); the very first
    stage receives no activations and the very last no gradients; none without a pipeline."""
    return where(p > 1, m * (2 * v - first - last), 0)


def pending_send_count(p: Any, m: Any, v: int, first: Any) -> Any:
    """Whether an input gradient waits to be sent to the previous stage: a previous stage exists and there is
    more than one micro-batch (gone by the optimizer step)."""
    return (p > 1) & (m > 1) & (negate(first) | (v > 1))


def loss_count(p: Any, m: Any, schedule: str, last: Any) -> Any:
    """Micro-batches whose head and loss tensors the last stage holds at once: all of them under GPipe
    (every loss runs before the first backward), one under 1F1B and interleaved 1F1B; none elsewhere."""
    return where(last, where((p > 1) & (schedule == "gpipe"), m, 1), 0)


def next_backward_count(p: Any, m: Any, schedule: str) -> Any:
    """1 where the second micro-batch's backward is a moment of its own: under GPipe every forward (and on the
    last stage every loss) runs before the first backward, then the backwards run one micro-batch after the
    other, so the second starts with every gradient of the stage made by the first and ``m - 1``
    micro-batches' activations, outputs and loss tensors still held (torch 2.13 ``pipelining/schedules.py``
    ``ScheduleGPipe._step_microbatches``: a loop of ``forward_one_chunk`` and ``_maybe_compute_loss`` over
    every micro-batch, then a loop of ``backward_one_chunk``; gradients accumulate in ``.grad``). Traced:
    the last stage's peak is the second micro-batch's loss backward (docs/fidelity-parallel.md). 0 under
    1F1B and interleaved 1F1B (``pipeline_carries_grads`` covers them), with one micro-batch, or without a
    pipeline."""
    return where((p > 1) & (m > 1) & (schedule == "gpipe"), 1, 0)


def outputs_held_count(p: Any, m: Any, f: Any, last: Any, n_loss: Any, returned: bool) -> Any:
    """Stage outputs the schedule keeps for backward: one per micro-batch in flight (``f``); on the last stage
    its ``n_loss`` (``loss_count``), every micro-batch's when the schedule returns its outputs (``returned``:
    ``returns_outputs``); none without a pipeline."""
    return where(p > 1, where(last, m if returned else n_loss, f), 0.0)


def through_step_count(p: Any, m: Any, last: Any, returned: bool) -> Any:
    """Copies of one micro-batch's last-stage output alive at the optimizer step when the schedule returns its
    outputs (``returned``): every micro-batch's kept chunk and its part of the concatenation ``step`` returned."""
    return where((p > 1) & last, 2 * m, 0) if returned else 0


# ----- one rank of the engine --------------------------------------------------------------------------------


def loss_micro_batches(ctx: Context, stage: Stage) -> int:
    """Micro-batches whose head and loss tensors the last stage holds at once (``loss_count``)."""
    par = ctx.par
    return loss_count(par.pp, par.pp_microbatches, par.pp_schedule, stage.last)


def returns_outputs(ctx: Context, keeps_output: bool) -> bool:
    """Whether the schedule returns the last stage's outputs: ``schedule.step(return_outputs=True)``,
    PyTorch's default, which the loop asks for when it keeps the model output through the step
    (``keeps_output``: the activations' ``output_through_step``, ``output_lifetime`` "step" where the
    framework's loop holds an output at all -- not Megatron's);
    torchtitan passes ``return_outputs=False``. The last stage then appends every micro-batch's output to
    ``PipelineStage.output_chunks``, emptied only by ``clear_runtime_states`` at the next step, and
    ``step`` returns their concatenation (torch 2.13 ``pipelining/stage.py`` ``forward_one_chunk``,
    ``schedules.py`` ``_merge_outputs``)."""
    return ctx.par.pp > 1 and keeps_output


def outputs_held(ctx: Context, stage: Stage, keeps_output: bool = False) -> float:
    """Stage outputs the schedule keeps for backward (``outputs_held_count``)."""
    par, returned = ctx.par, returns_outputs(ctx, keeps_output)
    n_loss = loss_micro_batches(ctx, stage)
    return float(
        outputs_held_count(par.pp, par.pp_microbatches, ctx.in_flight(stage), stage.last, n_loss, returned)
    )


def outputs_through_step(ctx: Context, stage: Stage, keeps_output: bool) -> int:
    """Copies of one micro-batch's last-stage output alive at the optimizer step (``through_step_count``)."""
    return through_step_count(
        ctx.par.pp, ctx.par.pp_microbatches, stage.last, returns_outputs(ctx, keeps_output)
    )
