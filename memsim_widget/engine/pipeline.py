"""What a pipeline stage holds beyond its layers' activations (``torch.distributed.pipelining``, traced).

Facts from the trace of ``PipelineStage`` with 1F1B, GPipe and interleaved 1F1B schedules
(docs/fidelity-parallel.md): each stage allocates one receive buffer per micro-batch for the hidden states
it gets from the previous stage and one for the gradients it gets from the next, at the first step, and
keeps them for the run; the schedule keeps each stage's output of every micro-batch in flight until that
micro-batch's backward (on the last stage: the logits); a non-first stage holds the input gradient of the
previous micro-batch until it is sent. Under GPipe the last stage runs every micro-batch's loss before the
first backward, so it holds each one's head and loss tensors.
"""

from __future__ import annotations

from memsim_widget.engine.context import Context, Stage


def receive_buffers(ctx: Context, stage: Stage) -> int:
    """Receive buffers of one micro-batch's hidden states (or their gradient) a rank keeps: per micro-batch,
    one per direction per model chunk (a rank of an interleaved schedule holds ``virtual_stages`` chunks);
    the very first stage receives no activations and the very last no gradients."""
    par = ctx.par
    if par.pp == 1:
        return 0
    chunks = par.virtual_stages
    return par.pp_microbatches * (2 * chunks - int(stage.first) - int(stage.last))


def pending_sends(ctx: Context, stage: Stage) -> int:
    """Input gradients waiting to be sent to the previous stage (one, when it has a previous stage and there
    is more than one micro-batch; gone by the optimizer step)."""
    par = ctx.par
    has_previous = not stage.first or par.virtual_stages > 1
    return int(par.pp > 1 and par.pp_microbatches > 1 and has_previous)


def loss_micro_batches(ctx: Context, stage: Stage) -> int:
    """Micro-batches whose head and loss tensors the last stage holds at once: all of them under GPipe
    (every loss runs before the first backward), one under 1F1B and interleaved 1F1B."""
    if not stage.last:
        return 0
    par = ctx.par
    return par.pp_microbatches if par.pp > 1 and par.pp_schedule == "gpipe" else 1


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
    """Stage outputs the schedule keeps for backward: one per micro-batch in flight (none without a pipeline);
    on the last stage every micro-batch's when the schedule returns its outputs."""
    if ctx.par.pp == 1:
        return 0.0
    if stage.last and returns_outputs(ctx, keeps_output):
        return float(ctx.par.pp_microbatches)
    return float(loss_micro_batches(ctx, stage)) if stage.last else ctx.in_flight(stage)


def outputs_through_step(ctx: Context, stage: Stage, keeps_output: bool) -> int:
    """Copies of one micro-batch's last-stage output alive at the optimizer step when the schedule returns
    its outputs: every micro-batch's kept chunk and its part of the concatenation ``step`` returned."""
    return 2 * ctx.par.pp_microbatches if stage.last and returns_outputs(ctx, keeps_output) else 0
