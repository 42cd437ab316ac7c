"""A pipeline stage's step in the allocation stream (``alloc_stream``): its micro-batches' forwards and backwards in
the order the schedule runs them, and what the schedule keeps between them.

Read from torch 2.13's ``torch/distributed/pipelining`` (``schedules.py``: ``ScheduleGPipe._step_microbatches``,
``Schedule1F1B._step_microbatches``; ``stage.py``: ``forward_one_chunk``, ``backward_one_chunk``,
``get_bwd_send_ops``, ``_create_grad_recv_info``) and held to the fake-tensor trace of the same rank
(``trace/pipeline.py``) replayed through the caching allocator (tests/engine/test_pp_stream.py):

- order: GPipe runs every micro-batch's forward (and on the last stage its loss), then every backward; 1F1B runs
  ``min(m, p - stage)`` forwards, then one backward and one forward in turn while forwards remain, then the
  remaining backwards (``schedule_order``);
- receive buffers: at the first step, before the first forward, one per micro-batch per direction the stage
  receives (hidden states from the previous stage, their gradient from the next), kept for the run; a later
  stage's layers read the received hidden states in place (no embeddings' output), an earlier stage's backward
  starts from the received gradient (no head, no loss);
- a stage's output of each micro-batch stays in its forward cache until that micro-batch's backward has run; the
  last stage's (its logits) is also the schedule loop's ``output`` until the next forward returns;
- a later stage's input gradient, its bottom layer's (``backward_one_chunk``: ``stage_backward`` returns the
  gradient autograd made for the stage's input, no copy), stays in ``bwd_cache`` and then in the send ops until
  the next backward's send ops replace them, after that micro-batch's output is popped from the forward cache
  (the fake process group's sends complete at once: on a GPU a send still in flight holds it longer);
- only the first stage holds token ids and only the last labels (``PipelineSchedule.step`` splits the step's into
  micro-batch views): a middle stage's micro-batch has its rotary embeddings alone
  (``alloc_stream._micro_batch_groups``);
- every backward after a step's first adds its gradients into ``.grad`` in place (``_Grads.new``), as gradient
  accumulation does; the optimizer step and ``zero_grad`` follow as on one GPU.

Interleaved 1F1B (several model chunks on a rank) and a pipeline over data parallelism are not written: they keep
the fitted rule (``pp_replayable``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memsim_widget.fast_dataclass import dataclass

#: a forward, a backward of micro-batch ``j`` (``schedule_order``'s entries)
FORWARD, BACKWARD = "F", "B"


def schedule_order(p: int, m: int, schedule: str, stage: int) -> tuple[tuple[str, int], ...]:
    """The forwards and backwards stage ``stage`` of ``p`` runs over ``m`` micro-batches, in order: GPipe's
    fill and drain, or 1F1B's ``min(m, p - stage)`` warm-up forwards, then a backward and a forward in turn,
    then the cool-down backwards (torch 2.13 ``Schedule1F1B._step_microbatches``)."""
    if schedule == "gpipe":
        return tuple((FORWARD, j) for j in range(m)) + tuple((BACKWARD, j) for j in range(m))
    warmup = min(m, p - stage)
    out = [(FORWARD, j) for j in range(warmup)]
    fwd = warmup
    for bwd in range(m):
        out.append((BACKWARD, bwd))
        if fwd < m:
            out.append((FORWARD, fwd))
            fwd += 1
    return tuple(out)


@dataclass(frozen=True)
class PipelineStage:
    """What the stream writes of a pipeline stage beside its micro-batches' own tensors."""

    order: tuple[tuple[str, int], ...]
    first: bool
    last: bool
    #: bytes of one receive buffer (one micro-batch's hidden states, or their gradient)
    buffer: int
    #: receive buffers the stage keeps (``engine/parallel/pipeline.receive_count``)
    receives: int


def pipeline_stage(ctx: Any, stage: Any) -> PipelineStage:
    """``PipelineStage`` of ``stage``'s rank of ``ctx`` (one model chunk a rank)."""
    from memsim_widget.engine.caches.parts_cache import cached_activations
    from memsim_widget.engine.parallel.pipeline import receive_count

    par = ctx.par
    order = schedule_order(par.pp, par.pp_microbatches, par.pp_schedule, stage.index)
    n = receive_count(par.pp, par.pp_microbatches, 1, stage.first, stage.last)
    buffer = int(sum(t.bytes for t in cached_activations(ctx).pp_buffer))  # activations/dispatch.stage_io
    return PipelineStage(order, stage.first, stage.last, buffer, int(n))


def pp_replayable(ctx: Any) -> bool:
    """Whether the stream models the scenario's pipeline rank: pp > 1 alone (no data, tensor, context or expert
    parallelism), GPipe or 1F1B (one model chunk a rank), one optimizer step per schedule step
    (``grad_accum_steps`` 1), eager, the schedule not returning its outputs (``pipeline.returns_outputs``),
    every layer checkpointed or none."""
    from memsim_widget.engine.caches.parts_cache import cached_activations
    from memsim_widget.engine.parallel.pipeline import returns_outputs

    sc, p = ctx.scenario, ctx.par
    return (
        p.pp > 1
        and p.dp * p.tp * p.cp * p.ep == 1
        and p.pp_schedule in ("gpipe", "1f1b")
        and sc.grad_accum_steps == 1
        and not sc.compile
        and sc.checkpoint_every in (None, 1)
        and not returns_outputs(ctx, cached_activations(ctx).output_through_step)
    )


def run_schedule(
    s: Any,
    pipe: PipelineStage,
    a: dict[str, Sequence[Any]],
    sg: dict[str, Sequence[Any]],
    layers: int,
    step: int,
    grads: Any,
    late: Sequence[int],
    micro_forward: Callable[..., Any],
    micro_backward: Callable[..., Any],
    repeat: bool = True,
    kept: bool = False,
) -> list[int]:
    """One schedule step of the stage on ``s`` (``alloc_stream.StreamWriter``): the receive buffers at the first
    step, each micro-batch's forward and backward in ``pipe.order`` (``micro_forward`` / ``micro_backward``:
    ``alloc_stream``'s, the single-GPU step's halves), the outputs and input gradients held as the schedule
    holds them; the gradients the step's first backward made (the optimizer steps them, ``zero_grad`` frees
    them; ``kept``: zeroed in place instead, so every backward after the first step's first adds into them)."""
    if step == 1 and pipe.receives:
        s.mark("step 1 receive buffers")
        s.alloc(pipe.buffer, pipe.receives)  # kept for the run
    forwards: dict[int, Any] = {}
    made_grads: list[int] = []
    loop_output: list[int] = []  # the last forward's output, held by the schedule loop until the next returns
    done: list[int] = []  # the loop output's when its backward has run
    sending: list[int] = []  # the input gradient in the send ops
    backwards = 0
    for kind, j in pipe.order:
        label = f"step {step} micro-batch {j + 1}"
        if kind == FORWARD:
            fw = micro_forward(s, a, layers, label, repeat=repeat, hidden_in=None if pipe.first else [],
                               keep_output=True, drop=done)  # fmt: skip
            loop_output, done = fw.out, []
            forwards[j] = fw
            continue
        fw = forwards.pop(j)
        grads.new = backwards > 0 or (kept and step > 1)  # later backwards add into .grad in place
        work = late if step == 1 and backwards == 0 else ()
        grad_in: list[int] = []  # the bottom layer's input gradient: the stage's, which it sends
        # the loop holds no output past its backward
        made, _held = micro_backward(s, fw, sg, grads, work, None if pipe.first else grad_in)
        made_grads = made_grads or made
        backwards += 1
        if not pipe.first and not grad_in:  # the layers' backward not op by op: made here
            grad_in = s.alloc(pipe.buffer)
        if fw.out is loop_output:  # still the loop's output: freed when the next forward returns
            done = fw.out
        else:  # popped from the forward cache
            s.free(fw.out)
        if not pipe.first:  # the input gradient, waiting in bwd_cache then the send ops
            s.free(sending)
            sending = grad_in
    s.free(sending + done)
    return made_grads
