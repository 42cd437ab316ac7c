"""The step timeline: evaluate each candidate moment of a training step and find the peak.

docs/memory-facts.md#where-the-peak-falls: with small T and foreach AdamW the peak is in ``optimizer.step``;
with large T
at the start of backward. Optimizer state is created lazily at the first step, so step 1 peaks lower
than every later step; the steady state (step 2 on) is what we report as the peak.

Which groups of items are live at each moment is the table ``engine/step/moments.MOMENT_TABLE`` (the planner's
``plan/vector`` reads it too); this module builds the groups of one rank and the moments from them,
numbers first: the items and their formulas are built when a breakdown reads them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.arith import maximum, minimum, where
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import root_resharded_for_loss
from memsim_widget.engine.items import Category, Item
from memsim_widget.engine.parallel.pipeline import (
    loss_micro_batches,
    next_backward,
    outputs_held,
    outputs_held_next,
    outputs_through_step,
    pending_sends,
    receive_buffers,
)
from memsim_widget.engine.parallel.schedule import grads_carried, pipeline_carries_grads
from memsim_widget.engine.states import StateBudget
from memsim_widget.engine.step.lazy_items import ItemGroup, LazyItem, built
from memsim_widget.engine.step.moments import MOMENT_TABLE, MOMENTS, OPTIMIZER_STEPS, MomentRule
from memsim_widget.units import fmt_int

__all__ = ["MOMENTS", "Moment", "moments", "offloaded_activations", "step_moments"]

#: Layers whose saved activations stay on the GPU under activation offloading: one, the layer whose backward
#: brought its saved tensors back. torchtune ``OffloadActivations`` (v0.6.1, streams on) copies every saved tensor
#: of at least 1024 B to host memory in forward and keeps a GPU original only while fewer than five tensors have
#: been packed after it; in backward it keeps what it brought back for the node running and the one before. Traced
#: (trace/torchtune_memory.py): at the loss the final norm's own saved tensors have pushed every layer's out of
#: that stash (0 layers; the one counted is an upper bound there), in a layer's backward at most that layer's.
OFFLOAD_LAYERS_ON_GPU = 1


def resident_count(held: Any, offloading: bool) -> Any:
    """Of the ``held`` layer x micro-batch activation sets of a stage (``Context.held_layers``), those it keeps
    on the GPU: all of them, or ``OFFLOAD_LAYERS_ON_GPU`` at most under activation offloading (numbers or
    arrays: ``plan/vector`` calls it too)."""
    return minimum(held, OFFLOAD_LAYERS_ON_GPU) if offloading else held


def layer0_sets(first: Any, f: Any, resident: Any, held: Any) -> Any:
    """Layer 0's activation sets among the ``resident`` ones (it lacks the bytes of ``skip_first`` terms): one
    per micro-batch in flight on the first stage, none once offloading moved some sets to the host (the
    resident ones are the last layers run)."""
    return where(first & (resident >= held), f, 0)


def resident_layers(ctx: Context, stage: Stage) -> float:
    """Layer x micro-batch activation sets a stage keeps on the GPU (``resident_count`` of its held sets)."""
    return resident_count(ctx.held_layers(stage), ctx.scenario.activation_offloading)


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
) -> list[LazyItem]:
    """Saved activations of ``micro`` micro-batches when ``n_ckpt`` of the layers are checkpointed (their inputs)
    and ``n_other`` keep everything; layer 0 is one of the others (``first`` of them lack its skip terms)."""
    fl = f" x {micro:g} micro-batches" if micro != 1 else ""
    return _scaled(acts.checkpointed_layer, n_ckpt * micro, f"{n_ckpt} checkpointed layers{fl}") + _scaled(
        acts.per_layer, n_other * micro, f"{n_other} layers not checkpointed{fl}", first=first
    )


def offloaded_activations(ctx: Context, stage: Stage, acts: ActivationBudget) -> list[Item]:
    """Saved activations held in pinned host memory under activation offloading (none otherwise)."""
    full = ctx.held_layers(stage)
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


class Moment:
    """The items alive at one instant of the step on one rank: given as ``items``, or as item groups (the
    timeline's), whose sums give the totals and whose items are built only when ``items`` is read."""

    def __init__(self, name: str, items: Iterable[Item] = (), *, groups: Sequence[ItemGroup] = ()) -> None:
        self.name = name
        self.groups = tuple(groups)
        if not self.groups:
            self.__dict__["items"] = tuple(items)
        else:  # every estimate reads it (the peak is the largest): set here, not through cached_property's lock
            self.__dict__["allocated_bytes"] = sum(g.allocated for g in self.groups)

    @cached_property
    def items(self) -> tuple[Item, ...]:
        return built(i for g in self.groups for i in g.entries)

    @cached_property
    def tensor_bytes(self) -> int:
        if self.groups:
            return sum(g.tensor for g in self.groups)
        return sum(i.bytes for i in self.items if i.level == "tensor")

    @cached_property
    def allocated_bytes(self) -> int:
        if self.groups:
            return sum(g.allocated for g in self.groups)
        return sum(i.allocated_bytes for i in self.items)

    def pool_sums(self, persistent: Collection[str], loss_names: set[str]) -> tuple[int, int, int]:
        """(allocated, allocated in ``persistent`` categories, allocated loss buffers): what the allocator's
        pool at this moment is made of (``engine/counters/overhead.reserved_item``)."""
        alloc = long = loss = 0
        for g in self.groups or (ItemGroup(self.items),):
            a, lg, ls = g.pool_sums(persistent, loss_names)
            alloc += a
            long += lg
            loss += ls
        return alloc, long, loss

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Moment) and (self.name, self.items) == (other.name, other.items)

    def __hash__(self) -> int:
        return hash((self.name, self.items))

    def __repr__(self) -> str:
        return f"Moment(name={self.name!r}, items={self.items!r})"


def _scaled(
    terms: list[Term],
    factor: float,
    label: str,
    category: Category | str = Category.ACTIVATIONS,
    first: float = 0,
) -> list[LazyItem]:
    """Terms repeated ``factor`` times (layers x micro-batches in flight) as breakdown items (built when read);
    ``first`` of those repeats are layer 0, which lacks the bytes of ``skip_first`` terms."""
    if factor <= 0:
        return []
    items = []
    for t in terms:
        nbytes, tensors = scaled_term(t.bytes, t.first_bytes, t.skip_first, t.tensors, factor, first)
        items.append(
            LazyItem(category, t.name, int(nbytes), t.level, max(1, int(tensors)), label, t.formula, t.shares)
        )
    return items


def scaled_term(
    nbytes: Any, first_bytes: Any, skip_first: Any, tensors: Any, factor: Any, first: Any
) -> tuple:
    """(bytes, tensors) of a term repeated ``factor`` times (layers x micro-batches in flight), ``first`` of the
    repeats layer 0, which lacks the term's ``first_bytes`` where it ``skip_first``s; a repeat count below one
    (a share of a micro-batch) keeps the term's tensors. Before truncation; numbers or arrays (``plan/vector``)."""
    return nbytes * factor - where(skip_first, first_bytes * first, 0), tensors * maximum(factor, 1)


def state_lists(states: StateBudget) -> dict[str, list[Item]]:
    """The lists of a rank's model states that ``state_group_table`` makes the groups of (``plan/vector``
    reduces each to sums per state key): the tensor-level persistent items and optimizer step temporaries,
    the step's temporaries of every level (``step_temps_all``), and the gradients but the root's where the
    root reduces apart (else all of them)."""
    return {
        "persistent": [i for i in states.persistent if i.level == "tensor"],
        "grads": states.grads,
        "post_grads": states.post_grads,
        "grads_but_bottom": states.grads_but_bottom,
        "gathered": states.gathered,
        "gathered_grads": states.gathered_grads,
        "step_temps_all": states.step_temps,
        "step_temps": [i for i in states.step_temps if i.level == "tensor"],
        "kept_unsharded": states.kept_unsharded,
        "kept_unsharded_last": states.kept_unsharded_last,
        "root_reduce": states.root_reduce,
        "grads_but_root": states.grads_but_root if states.root_reduce else states.grads,
        "root_regather": states.root_regather,
        "root_reduce_out": states.root_reduce_out,
        "root_made": states.root_made,
        "loss_grads": states.loss_grads,
    }


def state_group_table(
    s: Mapping[str, Any], overhead: Any, carried: Any, last: Any, resharded: Any, in_backward: bool, none: Any
) -> dict[str, Any]:
    """The model-state groups of ``moments.STATE_GROUPS`` in the steady state (step 2 on) from ``state_lists``
    (items of one rank; or their sums, one row per state key, in ``plan/vector``): ``carried`` gradients alive
    through forward (``schedule.grads_carried``; 2: at the loss only ``loss_grads``), the ``last`` stage, the root ``resharded`` before the loss
    (``frameworks.root_resharded_for_loss``), the optimizer stepping ``in_backward``; ``none``: an empty group."""
    grads_in_fwd = where(carried, s["grads"], none)
    return {
        "persistent": s["persistent"],
        "overhead": overhead,
        # carried 2: the last stage's loss moments meet only the gradients that exist then (loss_grads)
        "grads_carried": where(carried == 2, s["loss_grads"], grads_in_fwd),
        # the units FSDP2 holds gathered while the loss runs (none when the root resharded before it)
        "gathered_at_loss": where(resharded, none, s["gathered"]),
        "kept_unsharded": s["kept_unsharded"],  # every layer, without reshard after forward
        "kept_unsharded_last": s["kept_unsharded_last"],
        # only the head's gradients made at the top of backward (beside those carried)
        "head_grads": where(carried, grads_in_fwd, where(last, s["post_grads"], none)),
        "gathered": s["gathered"],
        "gathered_grads": s["gathered_grads"],
        "step_in_backward": where(in_backward, s["step_temps_all"], none),
        "root_regather": s["root_regather"],
        "root_made": s["root_made"],
        "root_reduce": s["root_reduce"],
        "root_reduce_out": s["root_reduce_out"],
        "grads_but_root": s["grads_but_root"],
        "grads_but_bottom": s["grads_but_bottom"],
        "grads": s["grads"],
        "step_persistent": s["persistent"],  # the steady state: optimizer states exist
        "step_temps": s["step_temps"],
        # GPipe's second backward (engine/parallel/pipeline next_backward_count): gated on the activation side
        "grads_next": where(in_backward, none, s["grads"]),
    }


def _state_groups(
    ctx: Context, stage: Stage, states: StateBudget, overhead: list[Item], f: float
) -> dict[str, list[Item] | list[LazyItem]]:
    """The model-state groups of ``moments.STATE_GROUPS`` on one rank in the steady state (step 2 on)."""
    sc = ctx.scenario
    pipelined = pipeline_carries_grads(ctx.par.pp, ctx.par.pp_microbatches, f)
    carried = grads_carried(sc.grad_accum_steps, pipelined, sc.optimizer_in_backward)
    # carried only where there are gradients: with none, the last stage's head gradients are its post_grads
    carried = bool(carried and states.grads)
    # 2: at the loss of the last stage only the gradients that exist then (an interleaved rank: its loss
    # chunk's, Context.loss_grad_layers); an earlier accumulation step made every gradient
    carried = 2 if carried and stage.last and sc.grad_accum_steps == 1 else int(carried)
    resharded = root_resharded_for_loss(sc, stage.last)
    lists = state_lists(states)
    # a stage of no layer with one backward a step: the embedding's gradient becomes .grad (none is added)
    if stage.layers == 0 and ctx.par.pp_microbatches * sc.grad_accum_steps == 1:
        lists["grads_but_bottom"] = lists["grads"]
    return state_group_table(lists, overhead, carried, stage.last, resharded, sc.optimizer_in_backward, [])


def _saved_groups(
    ctx: Context, stage: Stage, acts: ActivationBudget, f: float
) -> dict[str, list[Item] | list[LazyItem]]:
    """The saved activations of the layers: all of them on the GPU (``saved``), the other micro-batches'
    at the bottom of backward (``rest``) and layer 0's own (``own``)."""
    sc = ctx.scenario
    Ls = stage.layers
    n_ckpt = checkpointed_layers(ctx, stage)
    ckpt = n_ckpt > 0 and n_ckpt == Ls  # every layer checkpointed
    mixed = 0 < n_ckpt < Ls  # every N-th layer (checkpoint_every > 1)
    fl = f"{fmt_int(f) if f == int(f) else f'{f:.2f}'} micro-batches"
    mult = f"{Ls} layers" + (f" x {fl}" if f != 1 else "")
    kept = acts.checkpointed_layer if ckpt else acts.per_layer
    held = ctx.held_layers(stage)  # Ls x f, or an interleaved rank's uneven chunks in schedule order
    if held != Ls * f:
        mult = f"{held:g} layer x micro-batch sets (chunks of {Ls} layers in the schedule's order)"
    resident = resident_layers(ctx, stage)
    first = layer0_sets(stage.first, f, resident, held)
    if resident < held:  # activation offloading: the rest sits in host memory
        mult = f"{resident:g} layers on the GPU (the others offloaded to host)"
    saved_all = _scaled(kept, resident, mult, first=first)
    if mixed:  # offloading is not combined with checkpoint_every (the scenario refuses it)
        saved_all = _mixed_layers(acts, n_ckpt, Ls - n_ckpt, f, first)
    # the last layer runs backward first: recomputed if it is checkpointed (with every N, when N divides Ls)
    last_ckpt = ckpt or (mixed and Ls % (sc.checkpoint_every or 1) == 0)
    recompute = _scaled(acts.recomputed_layer or acts.per_layer, 1, "1 recomputed layer") if last_ckpt else []
    rest = (
        []
        if sc.activation_offloading
        else _scaled(
            kept,
            Ls * (f - 1) if held == Ls * f else held - Ls,
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
    if Ls == 0:  # a first or last stage of only its embedding or head: no layer runs backward
        own = recompute = []
    # an interleaved last rank of uneven chunks holds fewer sets while its loss runs than at its peak
    held_loss, saved_loss = ctx.held_layers(stage, at_loss=True), saved_all
    if held_loss < held and not mixed:
        label = f"{held_loss:g} layer x micro-batch sets while the loss runs (chunks in the schedule's order)"
        saved_loss = _scaled(kept, min(held_loss, resident), label, first=first)
    # GPipe's second backward: every micro-batch's saved activations but the first's (next_backward_count)
    saved_next = rest if next_backward(ctx) else []
    return {"saved": saved_all, "saved_at_loss": saved_loss, "recompute": recompute, "rest": rest, "own": own,
            "saved_next": saved_next}  # fmt: skip


def _activation_groups(
    ctx: Context, stage: Stage, acts: ActivationBudget, f: float
) -> dict[str, list[Item] | list[LazyItem]]:
    """The activation groups of ``moments.ACTIVATION_GROUPS`` on one rank."""
    Ls = stage.layers
    last = 1 if stage.last else 0
    n_loss = loss_micro_batches(ctx, stage)
    loss_label = f"{n_loss} micro-batches" if n_loss > 1 else ""
    # a pipeline stage's receive buffers (kept for the run) and its outputs and pending sends (this step)
    recv = _scaled(acts.pp_buffer, receive_buffers(ctx, stage), "receive buffers: micro-batches x directions")
    n_out = outputs_held(ctx, stage, acts.output_through_step)
    stage_io = (
        recv
        + _scaled(acts.pp_buffer, pending_sends(ctx, stage), "1 input gradient waiting to be sent")
        + _scaled(acts.pp_logits if stage.last else acts.pp_output, n_out, f"{n_out:g} micro-batches")
    )
    # a layer in backward: the larger of its MLP and its attention transients
    layer_bwd = max(
        _scaled(acts.layer_backward, 1 if Ls else 0, "", "temporaries"),
        _scaled(acts.attention_backward, 1 if Ls else 0, "", "temporaries"),
        key=lambda x: sum(i.bytes for i in x),
    )
    # the model output the loop still holds (output_lifetime "backward"/"step"): its logits, and the part of
    # its KV cache that the layers' saved activations do not hold anyway (all of it once they are freed)
    # (a pipeline's loop gets the output only from the schedule, after backward: engine/parallel/pipeline)
    held_logits = _scaled(acts.output_logits, last if ctx.par.pp == 1 else 0, "")
    cache_all = _scaled(acts.output_cache, Ls, f"{Ls} layers")
    n_step = outputs_through_step(ctx, stage, acts.output_through_step)
    returned = _scaled(
        acts.pp_logits, n_step, f"{n_step} micro-batch outputs (kept chunks and their concatenation)"
    )
    nxt = next_backward(ctx)  # GPipe's second backward: one micro-batch fewer of each (0: no such moment)
    n_out_next = outputs_held_next(ctx, stage, acts.output_through_step) * nxt
    f_next, loss_next = (f - 1) * nxt, (n_loss - 1) * nxt
    label_next = f"{fmt_int(f_next) if f_next == int(f_next) else f'{f_next:.2f}'} micro-batches left"
    return {
        "stage_io_next": _scaled(
            acts.pp_buffer, receive_buffers(ctx, stage) * nxt, "receive buffers: micro-batches x directions"
        )
        + _scaled(acts.pp_buffer, pending_sends(ctx, stage) * nxt, "1 input gradient waiting to be sent")
        + _scaled(
            acts.pp_logits if stage.last else acts.pp_output, n_out_next, f"{n_out_next:g} micro-batches"
        ),
        "pre_next": _scaled(acts.pre, f_next if stage.first else 0, label_next)
        + _scaled(acts.inputs, f_next, label_next),
        "post_next": _scaled(acts.post, loss_next, f"{loss_next} micro-batches left"),
        "loss_saved_next": _scaled(acts.loss_saved, loss_next, f"{loss_next} micro-batches left"),
        "loss_backward_next": _scaled(acts.loss_backward, last * nxt, "", "temporaries"),
        "stage_io": stage_io,
        "receive_buffers": recv,
        "pre": _scaled(acts.pre, f if stage.first else 0, "") + _scaled(acts.inputs, f, ""),
        "post": _scaled(acts.post, n_loss, loss_label),
        "loss_saved": _scaled(acts.loss_saved, n_loss, loss_label),
        "loss_forward": _scaled(acts.loss_forward, last, ""),
        "cache_per_layer": _scaled(acts.cache_per_layer, Ls, f"{Ls} layers"),
        "loss_backward": _scaled(acts.loss_backward, last, "", "temporaries"),
        "held_logits": held_logits,
        "held_cache_extra": _scaled(acts.output_cache_extra, Ls, f"{Ls} layers"),
        "top_backward": _scaled(acts.top_backward, last, "", "temporaries"),
        "layer_backward": layer_bwd,
        "cache_but_own": _scaled(acts.output_cache, max(Ls - 1, 0), f"{max(Ls - 1, 0)} layers")
        + _scaled(acts.output_cache_extra, min(Ls, 1), "1 layer"),
        "cache_all": cache_all,
        # calibrated models only
        "bottom_backward": _scaled(acts.bottom_backward, 1 if stage.first else 0, "", "temporaries"),
        "held_through_step": held_logits + returned + cache_all if acts.output_through_step else [],
        **_saved_groups(ctx, stage, acts, f),
    }


def _applies(ctx: Context, rule: MomentRule) -> bool:
    """Whether the step has the rule's moment (``moments.OPTIMIZER_STEPS``: an optimizer stepping after
    backward)."""
    if rule.only_if == OPTIMIZER_STEPS:
        return ctx.scenario.optimizer != "none" and not ctx.scenario.optimizer_in_backward
    return not rule.only_if


def _evaluate(ctx: Context, groups: dict[str, ItemGroup]) -> list[Moment]:
    """The moments of ``moments.MOMENT_TABLE`` that the step has, from the groups' items and sums."""
    out = []
    for rule in MOMENT_TABLE:
        if not _applies(ctx, rule):
            continue
        chosen: list[ItemGroup] = []
        for alt in rule.larger_of:  # the larger of two instants (raw bytes; the first of equals wins)
            parts = [groups[g] for g in alt]
            if not chosen or sum(g.raw for g in parts) > sum(g.raw for g in chosen):
                chosen = parts
        parts = [groups[g] for g in rule.live] + chosen + [groups[g] for g in rule.after]
        out.append(Moment(rule.name, groups=parts))
    return out


def activation_groups(ctx: Context, stage: Stage, acts: ActivationBudget) -> dict[str, ItemGroup]:
    """The activation groups of ``moments.ACTIVATION_GROUPS`` on one rank, with their sums."""
    items = _activation_groups(ctx, stage, acts, ctx.in_flight(stage))
    return {name: ItemGroup(g) for name, g in items.items()}


def state_groups(
    ctx: Context, stage: Stage, states: StateBudget, overhead: list[Item]
) -> tuple[dict[str, ItemGroup], ItemGroup | None]:
    """The model-state groups of ``moments.STATE_GROUPS`` on one rank, with their sums, and step 1's
    ``persistent`` group (None where it is the steady one: no optimizer state to leave out)."""
    items = _state_groups(ctx, stage, states, overhead, ctx.in_flight(stage))
    groups = {name: ItemGroup(g) for name, g in items.items()}
    # step 1: optimizer states do not exist before the first optimizer.step (until then, but for
    # optimizer_step, the moments hold the other persistent items only); no alternative compares them
    step1 = [
        i for i in items["persistent"] if not (i.category == "optimizer_states" and "master" not in i.item)
    ]
    return groups, None if len(step1) == len(items["persistent"]) else ItemGroup(step1)


def step_moments(
    ctx: Context,
    stage: Stage,
    states: StateBudget,
    acts: ActivationBudget,
    overhead: list[Item],
    act_groups: dict[str, ItemGroup] | None = None,
    state_side: tuple[dict[str, ItemGroup], ItemGroup | None] | None = None,
) -> tuple[list[Moment], list[Moment]]:
    """Every candidate peak moment of one rank's training step, in the steady state (step 2 on) and in
    step 1 (no optimizer states before the first step). ``act_groups``: ``activation_groups`` already made;
    ``state_side``: ``state_groups`` already made (neither is changed)."""
    sgroups, new = state_side if state_side is not None else state_groups(ctx, stage, states, overhead)
    groups = {**sgroups, **(act_groups if act_groups is not None else activation_groups(ctx, stage, acts))}
    steady = _evaluate(ctx, groups)
    if new is None:
        return steady, list(steady)
    old = groups["persistent"]
    return steady, [Moment(m.name, groups=[new if g is old else g for g in m.groups]) for m in steady]


def moments(
    ctx: Context,
    stage: Stage,
    states: StateBudget,
    acts: ActivationBudget,
    overhead: list[Item],
    *,
    steady: bool = True,
) -> list[Moment]:
    """Every candidate peak moment of one rank's training step, as ``moments.MOMENT_TABLE`` lists them
    (``steady``: step 2 on; else step 1)."""
    return step_moments(ctx, stage, states, acts, overhead)[0 if steady else 1]
