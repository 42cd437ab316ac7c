"""The step timeline: evaluate each candidate moment of a training step and find the peak.

REFERENCE.md section 3: with small T and foreach AdamW the peak is in ``optimizer.step``; with large T
at the start of backward. Optimizer state is created lazily at the first step, so step 1 peaks lower
than every later step; the steady state (step 2 on) is what we report as the peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import root_resharded_for_loss
from memsim_widget.engine.items import Category, Item
from memsim_widget.engine.pipeline import loss_micro_batches, outputs_held, pending_sends, receive_buffers
from memsim_widget.engine.states import StateBudget
from memsim_widget.units import fmt_int

MOMENTS = ("forward_end", "backward_start", "backward_top", "backward_end", "optimizer_step")
#: Layers whose saved activations stay on the GPU under activation offloading: the layer computing and the
#: one being copied on the side stream (torchtune ``OffloadActivations``: every saved tensor goes to pinned
#: host memory as forward proceeds and comes back just ahead of its layer's backward).
OFFLOAD_LAYERS_ON_GPU = 2


def resident_layers(ctx: Context, stage: Stage) -> float:
    """Layer x micro-batch activation sets a stage keeps on the GPU (all of them unless offloading)."""
    full = stage.layers * ctx.in_flight(stage)
    return min(full, OFFLOAD_LAYERS_ON_GPU) if ctx.scenario.activation_offloading else full


def checkpointed_layers(ctx: Context, stage: Stage) -> int:
    """Layers of the stage that run under a checkpoint: all with ``selective-op`` or ``full``, every N-th with
    ``checkpoint_every`` N (torchtitan counts a rank's blocks from 1 and wraps those with ``count % N == 0``)."""
    policy = ctx.scenario.activation_checkpointing
    if policy == "selective-op":
        return stage.layers
    if policy == "full":
        return stage.layers // (ctx.scenario.checkpoint_every or 1)
    return 0


def _mixed_layers(
    acts: ActivationBudget, n_ckpt: int, n_other: int, micro: float, first: float
) -> list[Item]:
    """Saved activations of ``micro`` micro-batches when ``n_ckpt`` of the layers are checkpointed (their inputs)
    and ``n_other`` keep everything; layer 0 is one of the others (``first`` of them lack its skip terms)."""
    fl = f" x {micro:g} micro-batches" if micro != 1 else ""
    return _scaled(acts.checkpointed_layer, n_ckpt * micro, f"{n_ckpt} checkpointed layers{fl}") + _scaled(
        acts.per_layer, n_other * micro, f"{n_other} layers not checkpointed{fl}", first=first
    )


def offloaded_activations(ctx: Context, stage: Stage, acts: ActivationBudget) -> list[Item]:
    """Saved activations held in pinned host memory under activation offloading (none otherwise)."""
    full = stage.layers * ctx.in_flight(stage)
    moved = full - resident_layers(ctx, stage)
    if moved <= 0:
        return []
    kept = acts.checkpointed_layer if checkpointed_layers(ctx, stage) else acts.per_layer
    return [
        Item(
            "activations",
            f"{t.name} (offloaded to host)",
            int(t.bytes * moved),
            f"{moved:g} layers x ({t.formula})",
            "host",
            0,
        )
        for t in kept
        if t.level == "tensor"
    ]


@dataclass(frozen=True)
class Moment:
    """The items alive at one instant of the step on one rank."""

    name: str
    items: tuple[Item, ...]

    @cached_property
    def tensor_bytes(self) -> int:
        return sum(i.bytes for i in self.items if i.level == "tensor")

    @cached_property
    def allocated_bytes(self) -> int:
        return sum(i.allocated_bytes for i in self.items)


def _scaled(
    terms: list[Term], factor: float, label: str, category: Category = Category.ACTIVATIONS, first: float = 0
) -> list[Item]:
    """Terms repeated ``factor`` times (layers x micro-batches in flight) as breakdown items;
    ``first`` of those repeats are layer 0, which lacks the bytes of ``skip_first`` terms."""
    if factor <= 0:
        return []
    items = []
    for t in terms:
        note = f"{label} x ({t.formula})" if label else t.formula
        nbytes = t.bytes * factor - (t.first_bytes * first if t.skip_first else 0)
        items.append(
            Item(category, t.name, int(nbytes), note, t.level, max(1, int(t.tensors * max(factor, 1))))
        )
    return items


def moments(
    ctx: Context,
    stage: Stage,
    states: StateBudget,
    acts: ActivationBudget,
    overhead: list[Item],
    *,
    steady: bool = True,
) -> list[Moment]:
    """Every candidate peak moment of one rank's training step."""
    sc = ctx.scenario
    f = ctx.in_flight(stage)
    Ls = stage.layers
    n_ckpt = checkpointed_layers(ctx, stage)
    ckpt = n_ckpt > 0 and n_ckpt == Ls  # every layer checkpointed
    mixed = 0 < n_ckpt < Ls  # every N-th layer (checkpoint_every > 1)
    every = sc.checkpoint_every or 1
    rec_terms = acts.recomputed_layer or acts.per_layer
    persistent = [i for i in states.persistent if i.level == "tensor"]
    step_persistent = persistent
    if not steady:  # step 1: optimizer states do not exist before the first optimizer.step
        persistent = [
            i for i in persistent if not (i.category == "optimizer_states" and "master" not in i.item)
        ]
    # gradients accumulate over micro-batches: at the stage's fullest moment only if an earlier micro-batch
    # already ran backward, i.e. fewer are in flight than there are (never under GPipe: all forwards first)
    pipelined = ctx.par.pp > 1 and f < ctx.par.pp_microbatches
    grads_carried = sc.grad_accum_steps > 1 or pipelined
    grads_in_fwd = states.grads if grads_carried and not sc.optimizer_in_backward else []

    fl = f"{fmt_int(f) if f == int(f) else f'{f:.2f}'} micro-batches"
    mult = f"{Ls} layers" + (f" x {fl}" if f != 1 else "")
    kept = acts.checkpointed_layer if ckpt else acts.per_layer
    first = f if stage.first else 0
    resident = resident_layers(ctx, stage)
    if resident < Ls * f:  # activation offloading: the rest sits in host memory
        mult = f"{resident:g} layers on the GPU (the others offloaded to host)"
        first = 0  # the resident ones are the last layers run
    saved_all = _scaled(kept, resident, mult, first=first)
    if mixed:  # offloading is not combined with checkpoint_every (the scenario refuses it)
        saved_all = _mixed_layers(acts, n_ckpt, Ls - n_ckpt, f, first)
    pre = _scaled(acts.pre, f if stage.first else 0, "") + _scaled(acts.inputs, f, "")
    n_loss = loss_micro_batches(ctx, stage)
    loss_label = f"{n_loss} micro-batches" if n_loss > 1 else ""
    post = _scaled(acts.post, n_loss, loss_label)
    loss_saved = _scaled(acts.loss_saved, n_loss, loss_label)
    # a pipeline stage's receive buffers (kept for the run) and its outputs and pending sends (this step)
    recv = _scaled(acts.pp_buffer, receive_buffers(ctx, stage), "receive buffers: micro-batches x directions")
    n_out = outputs_held(ctx, stage)
    stage_io = (
        recv
        + _scaled(acts.pp_buffer, pending_sends(ctx, stage), "1 input gradient waiting to be sent")
        + _scaled(acts.pp_logits if stage.last else acts.pp_output, n_out, f"{n_out:g} micro-batches")
    )
    # the last layer runs backward first: recomputed if it is checkpointed (with every N, when N divides Ls)
    last_ckpt = ckpt or (mixed and Ls % every == 0)
    recompute = _scaled(rec_terms, 1, "1 recomputed layer") if last_ckpt else []
    # a layer in backward: the larger of its MLP and its attention transients
    layer_bwd = max(
        _scaled(acts.layer_backward, 1, "", "temporaries"),
        _scaled(acts.attention_backward, 1, "", "temporaries"),
        key=lambda x: sum(i.bytes for i in x),
    )
    loss_bwd = _scaled(acts.loss_backward, 1 if stage.last else 0, "", "temporaries")
    loss_fwd = _scaled(acts.loss_forward, 1 if stage.last else 0, "") + _scaled(
        acts.cache_per_layer, Ls, f"{Ls} layers"
    )
    # the model output the loop still holds (output_lifetime "backward"/"step"): its logits, and the part of
    # its KV cache that the layers' saved activations do not hold anyway (all of it once they are freed)
    held_logits = _scaled(acts.output_logits, 1 if stage.last else 0, "")
    held_out = held_logits + _scaled(acts.output_cache_extra, Ls, f"{Ls} layers")
    common = persistent + overhead + stage_io
    # the units FSDP2 holds gathered while the loss runs (none when the root resharded before it)
    loss_gathered = [] if root_resharded_for_loss(ctx.scenario, stage.last) else states.gathered
    unsharded = (
        states.kept_unsharded + states.kept_unsharded_last
    )  # every layer, without reshard after forward
    out = [
        Moment(
            "forward_end",
            tuple(
                common
                + grads_in_fwd
                + loss_gathered
                + unsharded
                + pre
                + saved_all
                + post
                + loss_saved
                + loss_fwd
            ),
        ),
        Moment(
            "backward_start",
            tuple(
                common
                + grads_in_fwd
                + loss_gathered
                + unsharded
                + pre
                + saved_all
                + post
                + loss_saved
                + loss_bwd
                + held_out
            ),
        ),
    ]
    # The top of backward: the loss is done; first the final norm runs backward (its fp32 transients),
    # then the last layer (recomputed first under checkpointing), with every other saved activation alive
    # and only the head's gradients accumulated so far. The larger of the two is the candidate.
    head_grads = (grads_in_fwd or states.post_grads) if stage.last else grads_in_fwd
    base = (
        common
        + head_grads
        + states.gathered
        + states.kept_unsharded
        + states.gathered_grads
        + pre
        + saved_all
    )
    norm_bwd = base + _scaled(acts.top_backward, 1 if stage.last else 0, "", "temporaries")
    last_layer = base + recompute + layer_bwd
    top = max(norm_bwd, last_layer, key=lambda x: sum(i.bytes for i in x))
    out.append(Moment("backward_top", tuple(top + held_out)))
    # At the last layer of backward: all gradients exist; the other in-flight micro-batches' activations
    # remain; of this micro-batch only the layer in backward (recomputed under checkpointing).
    rest = (
        []
        if sc.activation_offloading
        else _scaled(
            kept,
            Ls * (f - 1),
            f"{Ls} layers x {f - 1:g} other micro-batches",
            first=first - 1 if first else 0,
        )
        if f > 1
        else []
    )
    if mixed and f > 1 and not sc.activation_offloading:
        rest = _mixed_layers(acts, n_ckpt, Ls - n_ckpt, f - 1, first - 1 if first else 0)
    if ckpt:  # layer 0 is checkpointed only when every layer is
        own = recompute if acts.ckpt_input_shared else _scaled(kept, 1, "1 layer") + recompute
    else:
        own = _scaled(acts.per_layer, 1, "1 layer", first=1 if stage.first else 0)
    # The bottom of backward, two instants: (a) layer 0's backward, its own gradients and the embeddings'
    # not yet made; (b) the embedding's backward, every gradient made and no layer activation left.
    opt_bwd = states.step_temps if sc.optimizer_in_backward else []
    common_end = common + states.gathered + states.gathered_grads + opt_bwd + pre + rest
    cache_all = _scaled(acts.output_cache, Ls, f"{Ls} layers")
    cache_but_own = _scaled(acts.output_cache, Ls - 1, f"{Ls - 1} layers") + _scaled(
        acts.output_cache_extra, 1, "1 layer"
    )
    layer0 = common_end + states.grads_but_bottom + own + layer_bwd + held_logits + cache_but_own
    embed = common_end + states.grads + held_logits + cache_all
    embed += _scaled(
        acts.bottom_backward, 1 if stage.first else 0, "", "temporaries"
    )  # calibrated models only
    out.append(Moment("backward_end", tuple(max(layer0, embed, key=lambda x: sum(i.bytes for i in x)))))
    if sc.optimizer != "none" and not sc.optimizer_in_backward:
        step_temps = [i for i in states.step_temps if i.level == "tensor"]
        held = held_logits + cache_all if acts.output_through_step else []
        out.append(
            Moment(
                "optimizer_step", tuple(step_persistent + overhead + recv + states.grads + step_temps + held)
            )
        )
    return out
