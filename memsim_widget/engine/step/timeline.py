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
from typing import Any, NamedTuple, Protocol

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.arith import first_largest, maximum, minimum, negate, where
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import grads_kept, root_resharded_for_loss
from memsim_widget.engine.items import Category, Item
from memsim_widget.engine.parallel.pipeline import (
    loss_count,
    next_backward_count,
    outputs_held_count,
    pending_send_count,
    receive_count,
    through_step_count,
)
from memsim_widget.engine.parallel.schedule import grads_carried, pipeline_carries_grads
from memsim_widget.engine.states import StateBudget
from memsim_widget.engine.step.lazy_items import ItemGroup, Label, LazyItem, built
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


def resident_count(held: Any, offloading: bool, offloaded: int | None = None, at_loss: bool = False) -> Any:
    """Of the ``held`` layer x micro-batch activation sets of a stage (``Context.held_layers``), those it keeps
    on the GPU (numbers or arrays: ``plan/vector`` calls it too): all of them without offloading; with every
    layer offloaded (``offloaded`` None, torchtune) ``OFFLOAD_LAYERS_ON_GPU`` at most; with the first
    ``offloaded`` of them (``activation_offloading_layers``, one stage: the scenario refuses a pipeline)
    ``partial_resident``."""
    if not offloading:
        return held
    full = minimum(held, OFFLOAD_LAYERS_ON_GPU)
    if offloaded is None:
        return full
    return maximum(partial_resident(held, offloaded, at_loss), full)


def partial_resident(held: Any, offloaded: int, at_loss: bool = False) -> Any:
    """The activation sets on the GPU when the first ``offloaded`` of ``held`` layers go to the host, as
    TransformerEngine 2.9 schedules it (``transformer_engine/pytorch/cpu_offload.py``,
    ``AsyncDoubleBufferGroupOffloadHandler``, tag v2.9; what Megatron-Core 0.15 ``TransformerBlock`` runs with
    ``cpu_offloading_num_layers``, Megatron-Bridge's pin): layers 0..N-1 are offloaded, layer i's GPU copy freed
    when the forward of its window layer ends, the last offloaded layer's window being the last layer; in
    backward each offloaded layer is reloaded when the backward of its window layer begins. So while the loss
    runs (``at_loss``) the ``held - N`` layers not offloaded are on the GPU, and from the last layer's backward
    on, one more: layer N-1 is being brought back (``held - N + 1``; N = 0: none moved, ``held``).
    TransformerEngine 2.10 and later (``DefaultOffloadSynchronizer``) keep at most ``held - N`` throughout:
    one set less at the top of backward. Untraced (no trace runs TransformerEngine's hooks)."""
    kept = held - offloaded
    return kept if at_loss or offloaded == 0 else kept + 1


def layer0_sets(first: Any, f: Any, resident: Any, held: Any) -> Any:
    """Layer 0's activation sets among the ``resident`` ones (it lacks the bytes of ``skip_first`` terms): one
    per micro-batch in flight on the first stage, none once offloading moved some sets to the host (the
    resident ones are the last layers run)."""
    return where(first & (resident >= held), f, 0)


def resident_layers(ctx: Context, stage: Stage, at_loss: bool = False) -> float:
    """Layer x micro-batch activation sets a stage keeps on the GPU (``resident_count`` of its held sets)."""
    sc = ctx.scenario
    return resident_count(
        ctx.held_layers(stage), sc.activation_offloading, sc.activation_offloading_layers, at_loss
    )


def checkpointed_layers(ctx: Context, stage: Stage) -> int:
    """Layers of the stage that run under a checkpoint: all with ``selective-op`` or ``full``, every N-th with
    ``checkpoint_every`` N (torchtitan counts a rank's blocks from 1 and wraps those with ``count % N == 0``)."""
    policy = ctx.scenario.activation_checkpointing
    if policy == "selective-op":
        return stage.layers
    if policy == "full":
        return stage.layers // (ctx.scenario.checkpoint_every or 1)
    return 0


def offloaded_activations(ctx: Context, stage: Stage, acts: ActivationBudget) -> list[Item]:
    """Saved activations held in pinned host memory under activation offloading (none otherwise)."""
    full = ctx.held_layers(stage)
    n = ctx.scenario.activation_offloading_layers
    moved = full - resident_layers(ctx, stage) if n is None or n >= full else n  # partial: the first n layers
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


def layer0_cut(t: Term, first: Any) -> tuple[int, int]:
    """(the tensors layer 0 lacks in each of its sets, its sets) of a term with per-tensor ``shares`` whose
    ``first_bytes`` are whole cycles of them (an RMSNorm's fp32 input and rsqrt under LoRA: layer 0's first norm
    saves nothing), else (0, 0): the allocation stream then writes layer 0's set with the cycles it has and every
    other layer's whole (``alloc_stream.tensor_sizes``) where an even split over the layers made each tensor
    smaller than any the run makes (7 norms' bytes over 8 norms' tensors)."""
    k = len(t.shares)
    if not (t.skip_first and k and t.first_bytes > 0 and t.bytes > 0 and first == int(first) and first > 0):
        return (0, 0)
    cycles = t.tensors // k
    missing = t.first_bytes * cycles / t.bytes
    m = round(missing)
    if m < 1 or m > cycles or abs(missing - m) > 1e-9:
        return (0, 0)
    return (m * k, int(first))


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
        # a pipeline over FSDP2: every backward moment meets the unsharded accumulation (the step, the shards)
        "grads": states.accumulated_grads or states.grads,
        "step_grads": states.grads,
        "post_grads": states.post_grads,
        "grads_but_bottom": states.grads_but_bottom,
        "tied_sum": states.tied_sum,
        # ... at the bottom of a backward after the first one of the step (gradients carried)
        "grads_but_bottom_carried": [*states.accumulated_grads, *states.prefetched]
        or states.grads_at_bottom_carried
        or states.grads_but_bottom,
        "head_made": states.head_made,
        "head_made_carried": states.head_made_carried,
        "tied_head_part": states.tied_head_part,
        "bottom_new": states.bottom_new,
        "top_layer_made": states.top_layer_made,
        "top_down_new": states.top_down_new,
        "top_down_made": states.top_down_made,
        "bottom_new_carried": states.bottom_new_carried,
        "gathered_next": states.gathered_next,
        "prefetched": states.prefetched,
        "kept_after_backward": states.kept_after_backward,
        "new_grad": states.new_grad,
        "new_grad_next": states.new_grad_next,
        "chunk_gathered": states.chunk_gathered,
        "gathered": states.gathered,
        "gathered_loss": states.gathered_loss or states.gathered,
        "gathered_grads": states.gathered_grads,
        "step_temps_all": states.step_temps,
        "step_temps": [i for i in states.step_temps if i.level == "tensor"],
        "step_temps_sub": [i for i in states.step_temps_sub or states.step_temps if i.level == "tensor"],
        "kept_unsharded": states.kept_unsharded,
        "kept_unsharded_last": states.kept_unsharded_last,
        "root_reduce": states.root_reduce,
        "grads_but_root": states.grads_but_root if states.root_reduce else states.grads,
        "root_regather": states.root_regather,
        "root_reduce_out": states.root_reduce_out,
        "root_made": states.root_made,
        "loss_grads": states.accumulated_grads or states.loss_grads,
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
        # the units FSDP2 holds gathered while the loss runs (none when the root resharded before it); DeepSpeed's
        # coordinator, what it keeps for reuse and has prefetched (frameworks.deepspeed_zero3_coordinated)
        "gathered_at_loss": where(resharded, none, s["gathered_loss"]),
        "kept_unsharded": s["kept_unsharded"],  # every layer, without reshard after forward
        "kept_unsharded_last": s["kept_unsharded_last"],
        # only the head's gradients made at the top of backward (beside those carried)
        "head_grads": where(carried, grads_in_fwd, where(last, s["post_grads"], none)),
        "gathered": s["gathered"],
        "gathered_grads": s["gathered_grads"],
        "kept_after_backward": s["kept_after_backward"],
        "step_in_backward": where(in_backward, s["step_temps_all"], none),
        "root_regather": s["root_regather"],
        "root_made": s["root_made"],
        "root_reduce": s["root_reduce"],
        "root_reduce_out": s["root_reduce_out"],
        "grads_but_root": s["grads_but_root"],
        # carried: the bottom layer's gradients exist from an earlier micro-batch (a pipeline over FSDP2; the
        # same lists otherwise)
        "grads_but_bottom": where(carried, s["grads_but_bottom_carried"], s["grads_but_bottom"]),
        "grads": s["grads"],
        "tied_sum": s["tied_sum"],  # a tied embedding's two gradients beside their sum
        "step_persistent": s["persistent"],  # the steady state: optimizer states exist
        "step_temps": s["step_temps"],
        "step_temps_sub": s["step_temps_sub"],
        "step_grads": s["step_grads"],
        # GPipe's second backward (engine/parallel/pipeline next_backward_count): gated on the activation side
        "grads_next": where(in_backward, none, s["grads"]),
        "gathered_next": s["gathered_next"],
        "prefetched": s["prefetched"],
        # a backward whose gradients are carried from an earlier micro-batch: the new one apart, then added
        "new_grad": where(carried, s["new_grad"], none),
        "new_grad_next": where(in_backward, none, s["new_grad_next"]),
        "chunk_gathered": s["chunk_gathered"],
        # one GPU (states/gradients.one_gpu_backward): the gradients alive as the head's weight gradient is
        # made, the tied head's part of the embeddings' gradient through backward, the bottom's new tensors
        "head_made": where(carried, s["head_made_carried"], s["head_made"]),
        "tied_head_part": where(carried, s["tied_head_part"], none),
        "bottom_new": where(carried, s["bottom_new_carried"], s["bottom_new"]),
        # ... and the top layer's gradients made before its attention's backward (carried: counted already)
        "top_layer_made": where(carried, none, s["top_layer_made"]),
        # ... and the top layer's down projection's weight gradient: its matmul's output, then its .grad (carried:
        # added in place to the carried one and freed)
        "top_down_new": s["top_down_new"],
        "top_down_made": where(carried, none, s["top_down_made"]),
    }


def _state_groups(
    ctx: Context, stage: Stage, states: StateBudget, overhead: list[Item], f: float
) -> dict[str, list[Item] | list[LazyItem]]:
    """The model-state groups of ``moments.STATE_GROUPS`` on one rank in the steady state (step 2 on)."""
    sc = ctx.scenario
    pipelined = pipeline_carries_grads(ctx.par.pp, ctx.par.pp_microbatches, f)
    kept = grads_kept(sc)  # zero_grad zeroes the gradients in place: every one alive from step 2 on
    carried = grads_carried(sc.grad_accum_steps, pipelined, sc.optimizer_in_backward, kept)
    # carried only where there are gradients: with none, the last stage's head gradients are its post_grads
    carried = bool(carried and states.grads)
    # 2: at the loss of the last stage only the gradients that exist then (an interleaved rank: its loss
    # chunk's, Context.loss_grad_layers); an earlier accumulation step, or a zero_grad that kept them, made
    # every gradient
    carried = 2 if carried and stage.last and sc.grad_accum_steps == 1 and not kept else int(carried)
    resharded = root_resharded_for_loss(sc, stage.last)
    lists = state_lists(states)
    # a stage of no layer with one backward a step: the embedding's gradient becomes .grad (none is added)
    if stage.layers == 0 and ctx.par.pp_microbatches * sc.grad_accum_steps == 1 and not kept:
        lists["grads_but_bottom"] = lists["grads"]
    return state_group_table(lists, overhead, carried, stage.last, resharded, sc.optimizer_in_backward, [])


class Scaler(Protocol):
    """One side's view of a stage's activation groups (``activation_group_table``): ``scale(terms, factor,
    label, first)`` is a term group of one micro-batch's activations (an ``ActivationBudget`` list by name, or
    ``kept``: what each layer keeps for backward -- its checkpointed input where every layer is checkpointed,
    else every term; ``recompute``: what recomputing the last layer adds, ``recomputed_layer`` where set, else
    every per-layer term) repeated ``factor`` times (a boolean: once or not at all; none at or below 0),
    ``first`` of the repeats layer 0 (which lacks the bytes of ``skip_first`` terms); ``label`` says what the
    factor counts (a callable: made only where read); ``raw`` is a group's raw bytes; ``none`` an empty group."""

    @property
    def none(self) -> Any: ...

    def __call__(self, terms: str, factor: Any, label: Label = "", first: Any = 0) -> Any: ...

    def raw(self, group: Any) -> Any: ...


def budget_list(name: str, ckpt: bool, recomputed: bool) -> str:
    """The ``ActivationBudget`` list a ``Scaler`` term name stands for: ``kept``, ``checkpointed_layer`` where
    every layer is checkpointed (``ckpt``), else ``per_layer``; ``recompute``, ``recomputed_layer`` where the
    budget sets it (``recomputed``), else ``per_layer``; any other name, that list."""
    if name == "kept":
        return "checkpointed_layer" if ckpt else "per_layer"
    if name == "recompute":
        return "recomputed_layer" if recomputed else "per_layer"
    return name


#: Term groups whose items are the temporaries of a backward (the others: saved activations).
TRANSIENT_TERMS = frozenset(("layer_backward", "attention_backward", "loss_backward", "top_backward",
                             "bottom_backward", "cache_tangent_layer", "kept_backward", "kept_top_backward",
                             "bottom_layer_backward", "mlp_out_backward"))  # fmt: skip


class ItemScaler:
    """The engine's ``Scaler``: one rank's breakdown items (``LazyItem``: the formula written when read); a
    group is a list of them, groups are joined by ``+``."""

    def __init__(self, acts: ActivationBudget, ckpt: bool) -> None:
        self.acts, self.ckpt = acts, ckpt

    @property
    def none(self) -> list[LazyItem]:
        return []

    def terms(self, name: str) -> list[Term]:
        """The terms a ``Scaler`` name stands for (``budget_list``)."""
        return getattr(self.acts, budget_list(name, self.ckpt, bool(self.acts.recomputed_layer)))

    def __call__(self, terms: str, factor: Any, label: Label = "", first: Any = 0) -> list[LazyItem]:
        found = self.terms(terms) if factor > 0 else None
        if not found:
            return []
        category = Category.TEMPORARIES if terms in TRANSIENT_TERMS else Category.ACTIVATIONS
        items = []
        for t in found:
            nbytes, tensors = scaled_term(t.bytes, t.first_bytes, t.skip_first, t.tensors, factor, first)
            cut = layer0_cut(t, first)
            items.append(
                LazyItem(
                    category,
                    t.name,
                    int(nbytes),
                    t.level,
                    max(1, int(tensors)),
                    label,
                    t.formula,
                    t.shares,
                    cut,
                )
            )
        return items

    def raw(self, group: list[LazyItem]) -> int:
        return sum(i.bytes for i in group)


class StageCounts(NamedTuple):
    """A pipeline stage as its activation groups read it: numbers (one rank, the engine) or (rows, 1) columns
    (``plan/vector``: a row per candidate stage, so that they broadcast against its (rows, statistics) sums)."""

    p: Any  # pipeline ranks
    m: Any  # micro-batches of a step through the pipeline
    layers: Any  # the stage's layers
    f: Any  # micro-batches in flight (schedule.in_flight)
    first: Any  # the first stage
    last: Any  # the last stage
    held: Any  # layer x micro-batch activation sets held at the peak (Context.held_layers)
    held_loss: Any  # ... while the loss runs
    schedule: str  # parallel.pp_schedule
    v: int  # parallel.virtual_stages


class ActivationKnobs(NamedTuple):
    """What else the activation groups of a stage read (``activation_group_table``); ``ckpt`` and ``shared`` are
    numbers or columns like ``StageCounts``, the others plain values."""

    ckpt: Any  # every layer of the stage checkpointed (at least one)
    shared: Any  # the recomputed layer's first norm saves the checkpointed input itself (ckpt_input_shared)
    offloading: bool  # activation offloading
    offloaded: int | None  # ... of the first N layers (activation_offloading_layers); None: every layer
    through_step: bool  # the model output held through the step (ActivationBudget.output_through_step)
    mixed: tuple[int, int] | None = None  # (checkpointed layers, N) where every N-th is (the engine alone)


def _count(x: float) -> str:
    """A count of micro-batches as the labels write it."""
    return fmt_int(x) if x == int(x) else f"{x:.2f}"


def _saved_label(c: StageCounts, resident: float, offloaded: int | None) -> str:
    """What the saved activations of every layer on the GPU count (``offloaded``: the first N layers offloaded)."""
    Ls, f, held = c.layers, c.f, c.held
    if offloaded is not None and 0 < offloaded < held:  # partial_resident
        return f"{resident:g} layers on the GPU ({held:g} - {offloaded} offloaded to host + 1 brought back)"
    if resident < held:  # activation offloading: the rest sits in host memory
        return f"{resident:g} layers on the GPU (the others offloaded to host)"
    if held != Ls * f:  # an interleaved rank's uneven chunks in schedule order
        return f"{held:g} layer x micro-batch sets (chunks of {Ls} layers in the schedule's order)"
    return f"{Ls} layers" + (f" x {_count(f)} micro-batches" if f != 1 else "")


def _mixed_layers(scale: Scaler, n_ckpt: int, n_other: int, micro: float, first: float) -> Any:
    """Saved activations of ``micro`` micro-batches when ``n_ckpt`` of the layers are checkpointed (their inputs)
    and ``n_other`` keep everything; layer 0 is one of the others (``first`` of them lack its skip terms)."""
    fl = f" x {micro:g} micro-batches" if micro != 1 else ""
    return scale("checkpointed_layer", n_ckpt * micro, f"{n_ckpt} checkpointed layers{fl}") + scale(
        "per_layer", n_other * micro, f"{n_other} layers not checkpointed{fl}", first=first
    )


def _saved_group_table(scale: Scaler, c: StageCounts, k: ActivationKnobs, nxt: Any) -> dict[str, Any]:
    """The saved activations of the layers (``activation_group_table``): all of them on the GPU (``saved``,
    ``saved_at_loss``), the other micro-batches' at the bottom of backward (``rest``; at GPipe's second backward
    ``saved_next``, where ``nxt``), layer 0's own (``own``) and the last layer recomputed (``recompute``)."""
    Ls, f, held = c.layers, c.f, c.held
    ckpt, offloading, offloaded, mixed = k.ckpt, k.offloading, k.offloaded, k.mixed
    resident = resident_count(held, offloading, offloaded)
    first = layer0_sets(c.first, f, resident, held)
    saved = scale(
        "kept", resident, lambda: _saved_label(c, resident, offloaded if offloading else None), first
    )
    rest_first = where(first > 0, first - 1, 0)
    if offloading:
        rest = scale.none
    else:
        rest = where(
            f > 1,
            scale(
                "kept",
                where(held == Ls * f, Ls * (f - 1), held - Ls),
                lambda: f"{Ls} layers x {f - 1:g} other micro-batches",
                rest_first,
            ),
            scale.none,
        )
    # while the loss runs, fewer sets than at the peak: an interleaved last rank of uneven chunks, or the first N
    # layers offloaded with the last of them not yet brought back (partial_resident)
    resident_loss = resident_count(held, offloading, offloaded, at_loss=True)
    fewer = (c.held_loss < held) | (resident_loss < resident)

    def loss_label() -> str:
        if c.held_loss < held:
            return f"{c.held_loss:g} layer x micro-batch sets while the loss runs (chunks in the schedule's order)"
        return f"{resident_loss:g} layers on the GPU ({held:g} - {offloaded} offloaded to host)"

    saved_loss = where(
        fewer,
        scale(
            "kept",
            where(fewer, minimum(c.held_loss, resident_loss), 0),
            loss_label,
            layer0_sets(c.first, f, resident_loss, held),
        ),
        saved,
    )
    # the last layer runs backward first: recomputed if it is checkpointed
    last_ckpt = ckpt
    if mixed is not None:  # every N-th layer (offloading is not combined with it: the scenario refuses it)
        n_ckpt, every = mixed
        saved = saved_loss = _mixed_layers(scale, n_ckpt, Ls - n_ckpt, f, first)
        if f > 1 and not offloading:
            rest = _mixed_layers(scale, n_ckpt, Ls - n_ckpt, f - 1, rest_first)
        last_ckpt = Ls % every == 0  # with every N, when N divides the layers
    recompute = scale("recompute", last_ckpt, "1 recomputed layer")
    # layer 0 is checkpointed only when every layer is; a stage of no layer has none of its own
    own = where(
        ckpt,
        where(k.shared, recompute, scale("kept", ckpt, "1 layer") + recompute),
        scale("per_layer", (Ls > 0) & negate(ckpt), "1 layer", c.first),
    )
    # GPipe's second backward: every micro-batch's saved activations but the first's (next_backward_count)
    saved_next = where(nxt > 0, rest, scale.none)
    return {"saved": saved, "saved_at_loss": saved_loss, "recompute": recompute, "rest": rest, "own": own,
            "saved_next": saved_next}  # fmt: skip


def activation_group_table(scale: Scaler, c: StageCounts, k: ActivationKnobs) -> dict[str, Any]:
    """The activation groups of ``moments.ACTIVATION_GROUPS`` of a stage ``c`` under ``k``, made by ``scale``
    (the engine's items of one rank, or ``plan/vector``'s sums for many candidate stages). The counts hold
    nothing of a pipeline without one, so ``k.through_step`` stands for ``pipeline.returns_outputs``."""
    through_step = k.through_step
    p, m, Ls, f, first, last = c.p, c.m, c.layers, c.f, c.first, c.last
    n_loss = loss_count(p, m, c.schedule, last)
    n_recv = receive_count(p, m, c.v, first, last)
    sends = pending_send_count(p, m, c.v, first)
    # GPipe's second backward: one micro-batch fewer of each (0: no such moment)
    nxt = next_backward_count(p, m, c.schedule)
    n_out = outputs_held_count(p, m, f, last, n_loss, through_step) * 1.0
    n_out_next = outputs_held_count(p, m, f - 1, last, n_loss - 1, through_step) * nxt * 1.0
    f_next, loss_next = (f - 1) * nxt, maximum(n_loss - 1, 0) * nxt
    recv_label, send_label = (
        "receive buffers: micro-batches x directions",
        "1 input gradient waiting to be sent",
    )

    def outputs(n: Any) -> Any:  # the stage outputs the schedule keeps (the last stage's: its logits)
        def label() -> str:
            return f"{n:g} micro-batches"

        return scale("pp_logits", where(last, n, 0), label) + scale("pp_output", where(last, 0, n), label)

    def left(n: Any) -> Label:
        return lambda: f"{_count(n)} micro-batches left"

    def layers_label() -> str:
        return f"{Ls} layers"

    def loss_label() -> str:
        return f"{n_loss} micro-batches" if n_loss > 1 else ""

    recv = scale("pp_buffer", n_recv, recv_label)
    # a layer in backward: the larger of its MLP and its attention transients (the first of equals)
    mlp, attention = scale("layer_backward", Ls > 0), scale("attention_backward", Ls > 0)
    layer = where(scale.raw(attention) > scale.raw(mlp), attention, mlp)
    bottom = scale("bottom_layer_backward", Ls > 0)  # a compiled autocast bottom layer's own (else the same)
    # the model output the loop still holds (output_lifetime "backward"/"step"): its logits, and the part of
    # its KV cache that the layers' saved activations do not hold anyway (all of it once they are freed)
    # (a pipeline's loop gets the output only from the schedule, after backward: engine/parallel/pipeline)
    held_logits = scale("output_logits", last & (p == 1))
    cache_all = scale("output_cache", Ls, layers_label)
    # the schedule returns every micro-batch's output: its kept chunks and their concatenation
    n_step = through_step_count(p, m, last, through_step)
    returned = scale(
        "pp_logits", n_step, lambda: f"{n_step} micro-batch outputs (kept chunks and their concatenation)"
    )
    groups = {
        "stage_io_next": scale("pp_buffer", n_recv * nxt, recv_label)
        + scale("pp_buffer", sends & (nxt > 0), send_label)
        + outputs(n_out_next),
        "pre_next": scale("pre", where(first, f_next, 0), left(f_next))
        + scale("inputs", f_next, left(f_next)),
        "post_next": scale("post", loss_next, lambda: f"{loss_next} micro-batches left"),
        "loss_saved_next": scale("loss_saved", loss_next, lambda: f"{loss_next} micro-batches left"),
        "loss_backward_next": scale("loss_backward", last & (nxt > 0)),
        "stage_io": recv + scale("pp_buffer", sends, send_label) + outputs(n_out),
        "receive_buffers": recv,
        "pre": scale("pre", where(first, f, 0)) + scale("inputs", f),
        "post": scale("post", n_loss, loss_label),
        "loss_saved": scale("loss_saved", n_loss, loss_label),
        "loss_forward": scale("loss_forward", last),
        "forward_top": scale("forward_top", last),
        "cache_per_layer": scale("cache_per_layer", Ls, layers_label),
        "loss_backward": scale("loss_backward", last),
        "logits_grad": scale("logits_grad", last),
        "held_logits": held_logits,
        "held_cache_extra": scale("output_cache_extra", Ls, layers_label),
        "top_backward": scale("top_backward", last),
        "layer_backward": layer,
        "attention_in_backward": attention,
        "mlp_out_backward": scale("mlp_out_backward", Ls > 0),
        "bottom_layer": where(scale.raw(bottom) > 0, bottom, layer),
        "cache_but_own": scale("output_cache", maximum(Ls - 1, 0), lambda: f"{max(Ls - 1, 0)} layers")
        + scale("output_cache_extra", Ls > 0, "1 layer"),
        "cache_all": cache_all,
        # calibrated models only
        "bottom_backward": scale("bottom_backward", first),
        # a compiled autocast backward (activations/compiled_kept): every layer's KV-cache zero gradients at the
        # top layer's backward, the bottom layer's own at its backward; what the layers above and the top keep
        # to the bottom
        "tangents_top": scale("cache_tangent_layer", Ls, layers_label),
        "tangents_own": scale("cache_tangent_layer", Ls > 0, "1 layer"),
        "kept_above": scale("kept_backward", maximum(Ls - 1, 0), lambda: f"{max(Ls - 1, 0)} layers above"),
        "kept_top": scale("kept_top_backward", last),
        "held_through_step": held_logits + returned + cache_all if through_step else scale.none,
        "batch_through_step": scale("inputs", 1, "the loop's last micro-batch"),
    }
    return {**groups, **_saved_group_table(scale, c, k, nxt)}


def _activation_groups(
    ctx: Context, stage: Stage, acts: ActivationBudget, f: float, one: bool = False
) -> dict[str, list[LazyItem]]:
    """The activation groups of ``moments.ACTIVATION_GROUPS`` on one rank (``activation_group_table``);
    ``one``: of one micro-batch of the stage, as if no pipeline ran it (``micro_batch_groups``)."""
    sc, par, Ls = ctx.scenario, ctx.par, stage.layers
    n_ckpt = checkpointed_layers(ctx, stage)
    ckpt = 0 < n_ckpt == Ls  # every layer checkpointed
    if one:
        counts = StageCounts(1, 1, Ls, 1.0, stage.first, stage.last, Ls, Ls, par.pp_schedule, 1)
    else:
        counts = StageCounts(par.pp, par.pp_microbatches, Ls, f, stage.first, stage.last, ctx.held_layers(stage),
                             ctx.held_layers(stage, at_loss=True), par.pp_schedule, par.virtual_stages)  # fmt: skip
    mixed = (n_ckpt, sc.checkpoint_every or 1) if 0 < n_ckpt < Ls else None  # every N-th layer
    knobs = ActivationKnobs(ckpt, acts.ckpt_input_shared, sc.activation_offloading, sc.activation_offloading_layers,
                            acts.output_through_step, mixed)  # fmt: skip
    return activation_group_table(ItemScaler(acts, ckpt), counts, knobs)


def micro_batch_groups(ctx: Context, stage: Stage, acts: ActivationBudget) -> dict[str, list[LazyItem]]:
    """The activation groups of one micro-batch of a pipeline stage, its ends (the first stage's embeddings,
    the last's head and loss) kept and none of the pipeline's counts (its micro-batches in flight, receive
    buffers, kept outputs, pending sends): the allocation stream writes those as the schedule makes them
    (``engine/counters/pp_stream``)."""
    return _activation_groups(ctx, stage, acts, 1.0, one=True)


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
        if rule.larger_of:  # the larger of two instants (raw bytes; the first of equals wins)
            alts = [[groups[g] for g in alt] for alt in rule.larger_of]
            chosen = alts[first_largest([sum(g.raw for g in alt) for alt in alts])[1]]
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
