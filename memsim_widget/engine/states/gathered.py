"""ZeRO-3 / FSDP on one rank: the unsharded units a sharded model gathers around the layer being computed --
FSDP2's (traced, docs/fidelity-parallel.md) and DeepSpeed's (formula only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import (
    deepspeed_zero3_coordinated,
    embedding_split,
    fp8_linear_weight,
    fsdp2_unsynced_grads,
    gathered_weight_bytes,
    megatron_fp8_params,
    parameters_fetched_from_host,
    profile,
    tp_plan,
)
from memsim_widget.engine.items import Item
from memsim_widget.engine.states.budget import LocalGroup, StateBudget
from memsim_widget.engine.states.gradients import ZERO3_GRAD_PARTITIONS_ITEM, new_gradient
from memsim_widget.units import fmt_int

if TYPE_CHECKING:
    from memsim_widget.engine.counters.zero3_stream import Zero3Units


def gathered_units(ctx: Context, stage: Stage, groups: list[LocalGroup], grad_b: int, b: StateBudget) -> None:
    """The gathered units of ZeRO-3 / FSDP when parameters are sharded (or fetched from the host)."""
    par = ctx.par
    shard = par.shard_degree  # hybrid sharding: the shard group, not every data-parallel rank
    z = par.zero
    fetched = parameters_fetched_from_host(ctx)
    if z >= 3 and (par.dp * par.cp > 1 or fetched):
        per_layer = sum(g.numel for g in groups if g.group.scope == "layer") // max(stage.layers, 1)
        root = sum(g.numel for g in groups if g.group.scope != "layer")
        largest = max((g.numel_each for g in groups if g.group.scope != "layer"), default=0)
        if profile(ctx).zero3 == "fsdp2" and not fetched:
            unit = _layer_unit(ctx, groups, per_layer, stage.layers)
            _fsdp2_units(ctx, b, per_layer, root, grad_b, stage.layers, largest, unit)
            if ctx.full_training and root:
                _root_grads_made(ctx, b, root, groups)
            if par.pp > 1 and ctx.full_training and not ctx.scenario.optimizer_in_backward:
                layer_largest = max((g.numel_each for g in groups if g.group.scope == "layer"), default=0)
                pipeline_fsdp2(ctx, stage, b, root, per_layer, grad_b, unit)
                _pipeline_new_grads(ctx, stage, b, per_layer, grad_b, layer_largest or largest, unit)
            elif fsdp2_unsynced_grads(ctx.scenario) and b.grads:
                _unsynced_grads(b, grad_b)
        elif not fetched and deepspeed_zero3_coordinated(ctx):
            _deepspeed_coordinator(ctx, stage, b, per_layer, grad_b)
        else:
            _deepspeed_units(ctx, b, per_layer, root, grad_b, shard, fetched)


def _unsynced_grads(b: StateBudget, grad_b: int) -> None:
    """FSDP2 under ``set_requires_gradient_sync(False)`` on every micro-batch but the last (HF Trainer's
    ``no_sync``: ``frameworks.fsdp2_unsynced_grads``): torch 2.13 ``FSDPParamGroup.post_backward`` reshards and
    returns before the reduce, so each unit's unsharded gradients stay on its unsharded parameters through the
    later micro-batches (docs/allocator.md, "FSDP2 with gradient accumulation"). Counted as a pipeline's
    accumulation (``pipeline_fsdp2``): the rank's trainable elements x the gradient bytes meet every moment that
    carries gradients; the step still sees the shards (``b.grads``)."""
    n = b.trainable_local
    b.accumulated_grads = [
        Item(
            "gradients",
            "FSDP2 unsharded gradients kept over the micro-batches (no_sync: reduce-scatter at the last)",
            n * grad_b,
            f"{fmt_int(n)} params x {grad_b} B (no dp shard until the last micro-batch)",
            "tensor",
            max(1, b.grads[0].tensors),
        ),
        *b.grads[1:],
    ]


#: Bytes of the fp32 scale torchao keeps beside each fp8-gathered weight (``fsdp_post_all_gather``'s metadata).
FP8_SCALE_BYTES = 4


def _layer_unit(ctx: Context, groups: list[LocalGroup], per_layer: int, layers: int) -> tuple[int, str]:
    """Bytes and formula of one layer's FSDP2 unit while gathered: ``per_layer`` x the gathered dtype, or under
    ``fp8_all_gather`` its Linear weights in fp8 (1 B, plus a 4 B fp32 scale each) and the rest (norms) as before.

    Source: torchao 0.18.0 ``float8/fsdp_utils.py``, ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``
    hands FSDP2 the shard's fp8 bytes (``_data``) with its scale as metadata, and ``fsdp_post_all_gather`` wraps
    the gathered bytes as the unsharded ``Float8TrainingTensor``: the all-gather output is the unsharded weight, and
    FSDP2 frees it as it frees a bf16 one. Traced: benchmarks/fp8_all_gather.py (docs/fidelity.md, "fp8")."""
    wb = gathered_weight_bytes(ctx)
    if not ctx.scenario.fp8_all_gather:
        return per_layer * wb, f"{fmt_int(per_layer)} params/layer x {wb} B"
    lin = [g for g in groups if fp8_linear_weight(g.group.scope, g.group.module, g.group.kind)]
    n = sum(g.numel for g in lin) // max(layers, 1)
    tensors = sum(g.count for g in lin) // max(layers, 1)
    rest = per_layer - n
    # Megatron FSDP gives a gathered fp8 unit its transpose before its backward and drops it on release: 1 B more
    # per Linear element, counted for the whole time the unit is gathered (an over-estimate in forward).
    te = 2 if megatron_fp8_params(ctx) else 1
    note = " (fp8 + transpose, Megatron FSDP)" if te == 2 else " (fp8)"
    return (
        te * n + tensors * FP8_SCALE_BYTES + rest * wb,
        f"{fmt_int(n)} Linear params/layer x {te} B{note} + {tensors} x {FP8_SCALE_BYTES} B scales"
        f" + {fmt_int(rest)} x {wb} B",
    )


def _layers_gathered(what: str, n: int, unit: tuple[int, str]) -> Item:
    """``n`` layers' unsharded parameters alive at once (``unit``: one layer's bytes and their formula)."""
    return Item("parameters", what, n * unit[0], f"{n} layers x ({unit[1]})", "tensor", 9 * n)


def _kept_unsharded(b: StateBudget, unit: tuple[int, str], layers: int) -> None:
    """``reshard_after_forward=False``: each layer's unsharded parameters stay from its forward until its own
    backward has run (FSDP2 skips the post-forward reshard; the post-backward one frees them)."""
    if layers > 1:
        b.kept_unsharded.append(
            _layers_gathered(
                "FSDP2 unsharded layers kept for backward (reshard_after_forward=False)", layers - 1, unit
            )
        )
    b.kept_unsharded_last.append(
        Item(
            "parameters",
            "FSDP2 unsharded last layer kept for backward (reshard_after_forward=False)",
            unit[0],
            unit[1],
            "tensor",
            9,
        )
    )


def _fsdp2_units(
    ctx: Context,
    b: StateBudget,
    per_layer: int,
    root: int,
    grad_b: int,
    stage_layers: int = 1,
    root_largest: int = 0,
    unit: tuple[int, str] | None = None,
) -> None:
    """FSDP2 ``fully_shard`` per layer and on the root (torchtitan's wrapping), as its trace shows.

    The unsharded parameters are a separate buffer beside the shard (the root's stay unsharded from the
    forward until its backward ends); the last all-gather output is held until the next all-gather
    (FSDP2's ``AllGatherState``, so the copy stream cannot reuse memory still read); in backward a layer is
    unsharded while the next one's all-gather is prefetched. Checked: docs/fidelity-parallel.md.
    """
    wb = gathered_weight_bytes(ctx)
    unit = unit or (per_layer * wb, f"{fmt_int(per_layer)} params/layer x {wb} B")
    if root:
        b.gathered.append(
            Item(
                "parameters",
                "FSDP2 unsharded root unit (embeddings, final norm, head)",
                root * wb,
                f"{fmt_int(root)} params x {wb} B (beside the shard)",
                "tensor",
                3,
            )
        )
    if root and ctx.par.reshard_after_forward:
        _root_regather(b, root, wb)
    if ctx.par.reshard_after_forward:  # without it no all-gather output outlives its copy-out (traced)
        b.gathered.append(
            Item(
                "parameters",
                "FSDP2 all-gather output of the last unit (held until the next all-gather)",
                unit[0],
                unit[1],
                "tensor",
                1,
            )
        )
    b.gathered_grads.append(
        Item(
            "parameters",
            "FSDP2 unsharded parameters of the layer in backward",
            unit[0],
            unit[1],
            "tensor",
            9,
        )
    )
    if not ctx.par.reshard_after_forward:
        _kept_unsharded(b, unit, stage_layers)
    if ctx.full_training and root:
        _root_reduce(ctx, b, root, grad_b, wb, root_largest)
    if ctx.full_training:
        b.gathered_grads.append(
            Item(
                "gradients",
                "FSDP2 unsharded gradients of one layer (before its reduce-scatter)",
                per_layer * grad_b,
                f"{fmt_int(per_layer)} x {grad_b} B",
                "tensor",
                1,
            )
        )


def _root_grads_made(ctx: Context, b: StateBudget, root: int, groups: list[LocalGroup]) -> None:
    """The bottom of backward under FSDP2: the root unit's unsharded gradients are all made (the head's at the
    top of backward, the embedding's last) and wait for the root's post-backward, beside the unsharded root.
    A vocab-sharded DTensor embedding (tp > 1, not Megatron's) makes a ``Partial`` full-vocabulary gradient
    (``partial_embedding_grad``): FSDP2's ``_get_grad_inner_tensor`` redistributes it to the parameter's
    ``Shard(0)``, so the full one (tp shards' worth) is alive beside its shard (traced:
    docs/fidelity-parallel.md)."""
    wb = gathered_weight_bytes(ctx)
    b.root_made.append(
        Item(
            "gradients",
            "FSDP2 unsharded gradients of the root unit (embedding's just made)",
            root * wb,
            f"{fmt_int(root)} params x {wb} B",
            "tensor",
            3,
        )
    )
    par = ctx.par
    partial = (
        par.tp > 1
        and embedding_split(ctx)
        and tp_plan(ctx.scenario) != "megatron"
        and not ctx.arch.tied_embeddings
    )
    emb = sum(g.numel for g in groups if g.group.kind == "embedding" and g.group.scope == "pre")
    if partial and emb:
        b.root_made.append(
            Item(
                "gradients",
                "embedding gradient as a Partial DTensor beside its Shard(0) redistribution (full vocabulary)",
                emb * par.tp * wb,
                f"{fmt_int(emb)} params x {par.tp} x {wb} B (tp shards' worth)",
                "tensor",
                1,
            )
        )


def _root_regather(b: StateBudget, root: int, wb: int) -> None:
    """The root unit gathered again when backward starts. With an explicit ``reshard_after_forward=True`` the
    root reshards after its forward too (FSDP2 keeps the root gathered only when the flag is left to its
    default: torch 2.13 ``_fsdp_state._lazy_init``, ``_auto_reshard_after_forward``), so its pre-backward
    all-gather runs while every saved activation is alive; the all-gather output and the unsharded copy it is
    copied out to coexist until the next all-gather (``AllGatherState``). Traced: docs/fidelity-parallel.md."""
    b.root_regather += [
        Item(
            "parameters",
            "FSDP2 root unit re-gathered for backward (unsharded)",
            root * wb,
            f"{fmt_int(root)} params x {wb} B",
            "tensor",
            3,
        ),
        Item(
            "parameters",
            "FSDP2 all-gather output of the root unit (until the next all-gather)",
            root * wb,
            f"{fmt_int(root)} params x {wb} B",
            "tensor",
            1,
        ),
    ]


def _root_reduce(ctx: Context, b: StateBudget, root: int, grad_b: int, wb: int, largest: int) -> None:
    """The root unit's reduce-scatter, the last of backward (embeddings, final norm and head: with a real
    vocabulary the largest unit by far). FSDP2's ``FSDPParamGroup.post_backward`` takes the unsharded
    gradients, reshards the parameters, then ``foreach_reduce`` allocates the reduce-scatter input (the root's
    numel in ``reduce_dtype``) and copies the gradients in before it frees them: both are alive at once, while
    the root's new gradient shard does not exist yet (torch ``distributed/fsdp/_fully_shard/
    _fsdp_param_group.py`` ``post_backward`` and ``_fsdp_collectives.py`` ``foreach_reduce``, torch 2.13;
    traced: docs/fidelity-parallel.md)."""
    dp = ctx.par.shard_degree
    b.root_reduce += [
        Item(
            "gradients",
            "FSDP2 unsharded gradients of the root unit (before its reduce-scatter)",
            root * wb,
            f"{fmt_int(root)} params x {wb} B (param_dtype)",
            "tensor",
            3,
        ),
        Item(
            "gradients",
            "FSDP2 reduce-scatter input of the root unit",
            root * grad_b,
            f"{fmt_int(root)} params x {grad_b} B (reduce_dtype)",
            "tensor",
            1,
        ),
    ]
    own = root * grad_b // dp
    if ctx.par.tp > 1 and largest:
        # dp x tp: when the reduce-scatter output is allocated, after the copy-in cleared the unsharded
        # gradients, one of the root's (local) unsharded gradients is still referenced (seen in the trace, its
        # owner not identified in the source: counted as the largest root tensor's)
        b.root_reduce_out += [
            b.root_reduce[1],
            Item(
                "gradients",
                "FSDP2 reduce-scatter output of the root unit (its gradient shard)",
                own,
                f"{fmt_int(root)} params x {grad_b} B / {dp}",
                "tensor",
                1,
            ),
            Item(
                "gradients",
                "an unsharded root gradient still referenced (dp x tp, traced)",
                largest * wb,
                f"largest root tensor {fmt_int(largest)} x {wb} B",
                "tensor",
                1,
            ),
        ]
    b.grads_but_root = [
        *b.grads[1:],
        Item(
            "gradients",
            "gradients (all but the root unit's shard, still to come)",
            max(0, b.grads[0].bytes - own) if b.grads else 0,
            f"gradients - {fmt_int(root)} root params x {grad_b} B / {dp}",
            "tensor",
            max(1, b.grads[0].tensors - 3) if b.grads else 1,
        ),
    ]


def _deepspeed_coordinator(ctx: Context, stage: Stage, b: StateBudget, per_layer: int, grad_b: int) -> None:
    """A DeepSpeed ZeRO-3 rank's gathered parameters as its coordinator holds them (``counters/zero3_gathered``;
    deepspeed 0.19.8 ``partitioned_param_coordinator.py``, ``parameter_offload.py``): at the loss, what it kept
    for reuse (the head's, with a real vocabulary; the whole model, a small one), the persistent ones and the
    prefetch in flight (``gathered_loss``: the embeddings, freed after their forward, are not among them); in
    backward, the most it holds at once (``gathered``); each a whole buffer beside its partition. Read without
    checkpointing's recomputes (a recompute only puts a layer's reuse further away: never fewer gathered). And
    ZeRO-3's bf16 gradient partitions (``stage3.py``: ``grad_partitions_flat_buffer``, made at ``__init__`` on
    the GPU unless ``offload_optimizer`` puts it on the host), kept: the trained partitions x the model's
    bytes. The unsharded gradients of a layer stay as ``_deepspeed_units`` counts them."""
    from dataclasses import replace

    from memsim_widget.engine.counters.zero3_gathered import zero3_gathered
    from memsim_widget.engine.counters.zero3_stream import zero3_units
    from memsim_widget.engine.counters.zero_lora import lora_zero3_units

    # the coordinator is the same with the optimizer offloaded (zero_offload_stream's writer: host buffers alone)
    u = zero3_units(ctx, stage) if ctx.full_training else lora_zero3_units(ctx, stage)
    u = replace(u, recompute=False, dp=ctx.par.shard_degree)
    g = zero3_gathered(u)
    what = "(kept for reuse, persistent and prefetched; whole, beside the partitions)"
    b.gathered_loss.append(
        Item("parameters", "ZeRO-3 parameters gathered while the loss runs (DeepSpeed's coordinator)", g.at_loss,
             f"{g.at_loss_tensors} gathered buffers {what}", "tensor", max(g.at_loss_tensors, 1))
    )  # fmt: skip
    b.gathered.append(
        Item("parameters", "ZeRO-3 parameters gathered in backward, the most at once (DeepSpeed's coordinator)",
             g.in_backward, f"{g.in_backward_tensors} gathered buffers {what}", "tensor",
             max(g.in_backward_tensors, 1))
    )  # fmt: skip
    if ctx.full_training:
        b.gathered_grads.append(_layer_gradients(per_layer, grad_b))
    if ctx.par.offload == "none" and not ctx.scenario.optimizer_in_backward:
        _grad_partitions(b, u)


def _grad_partitions(b: StateBudget, u: Zero3Units) -> None:
    """ZeRO-3's gradients on the GPU (``stage3.py``, deepspeed 0.19.8): each parameter's gradient is copied into
    the ipg bucket and reduce-scattered into ``grad_partitions_flat_buffer`` (bf16, made at ``__init__``, kept;
    ``partition_grads`` adds a later micro-batch's in place), so the rank's gradients are that buffer at every
    moment (persistent) and nothing more is carried or accumulated; the fp32 gradient is made per sub group by
    the step (``_prepare_fp32_grad_for_sub_group``, freed before the next: ``sub_group_size`` splits a group's
    partition), so the step's gradients (``step_grads``) are the largest sub group's in fp32, and the inner
    optimizer's temporaries that sub group's (``step_temps_sub``; the stream reads the whole ``step_temps`` per
    partition element, ``zero3_stream.per_element``)."""
    parts, trained = u.parts(), u.trained
    n = sum(parts[p] for p in trained)
    mb = u.model_bytes
    b.persistent.append(
        Item("gradients", ZERO3_GRAD_PARTITIONS_ITEM, n * mb,
             f"{fmt_int(n)} trained partition elements x {mb} B (kept from the wrap)", "tensor", 1)
    )  # fmt: skip
    if b.grads:
        held = Item("gradients", "gradients (in ZeRO-3's partition buffer: counted with the persistent items)", 0,
                    "0 B beyond grad_partitions_flat_buffer", "tensor", 0)  # fmt: skip
        b.accumulated_grads = [held]
        b.grads_but_bottom = [held]
        subs = [sum(parts[p] for p in g) for g in u.sub_groups()]
        big = max(subs, default=0)
        b.grads = [
            Item("gradients", "ZeRO-3 fp32 gradient of the sub group being stepped (the largest)", big * 4,
                 f"{fmt_int(big)} partition elements (largest of {len(subs)} sub groups, sub_group_size) x 4 B",
                 "tensor", 1)
        ]  # fmt: skip
        total, n_params = sum(subs), len(trained)
        b.step_temps_sub = [
            Item(i.category, i.item, i.bytes * big // total, f"{i.formula}; one sub group's: {fmt_int(big)} of "
                 f"{fmt_int(total)} partition elements", i.level, max(i.tensors // max(n_params, 1), 1))
            for i in b.step_temps if total
        ]  # fmt: skip


def _deepspeed_units(
    ctx: Context, b: StateBudget, per_layer: int, root: int, grad_b: int, dp: int, fetched: bool
) -> None:
    """DeepSpeed ZeRO-3 (and parameter offload): the unit computing plus the prefetched next one, and the
    root's gathered parameters (DeepSpeed's estimator budgets a few units; formula only, not traced)."""
    recipe = ctx.recipe
    wb = gathered_weight_bytes(ctx)
    b.gathered.append(
        Item(
            "parameters",
            "ZeRO-3 gathered layers (current + prefetched)",
            2 * per_layer * wb,
            f"2 x {fmt_int(per_layer)} params/layer x {wb} B",
            "tensor",
            2,
        )
    )
    if root:
        b.gathered.append(
            Item(
                "parameters",
                "ZeRO-3 gathered root unit (embeddings, head)",
                root * wb - (0 if fetched or wb != recipe.weight_bytes else root * wb // dp),
                f"{fmt_int(root)} x {wb} B"
                + (
                    " (fetched from host)"
                    if fetched
                    else (f" x (1 - 1/{dp})" if wb == recipe.weight_bytes else " (bf16 copy)")
                ),
                "tensor",
                2,
            )
        )
    if ctx.full_training:
        b.gathered_grads.append(_layer_gradients(per_layer, grad_b))


def pipeline_fsdp2(
    ctx: Context, stage: Stage, b: StateBudget, root: int, per_layer: int, grad_b: int, unit: tuple[int, str]
) -> None:
    """A pipeline stage over FSDP2: no reduce-scatter and no reshard after backward until the schedule's end.

    torch 2.13 ``distributed/pipelining/stage.py``: ``_PipelineStageBase.backward_maybe_with_nosync`` calls
    ``set_is_last_backward(False)``, ``set_reshard_after_backward(False)`` and
    ``set_requires_gradient_sync(False)`` on the stage's ``FSDPModule`` before EVERY micro-batch's backward,
    the last included; the schedules then call ``perform_reduce_grad`` once after every backward, which turns
    them back on and runs each FSDP state's ``post_backward`` (``fsdp/_fully_shard/_fsdp_param_group.py``):
    for the root first (``_state_ctx.all_states`` follows ``root.modules()``), then each layer, it reshards
    and reduce-scatters. So on the stage, as traced (docs/fidelity-parallel.md, the pp x dp rows):

    - the unsharded gradients of the whole stage accumulate over the micro-batches
      (``FSDPParam.to_accumulated_grad_if_needed``: in ``reduce_dtype`` where it differs from the parameter
      dtype, which makes each layer's new gradients in the parameter dtype a transient until its
      post-backward adds them), and every backward moment meets them all, not the shards;
    - a layer stays gathered after its backward until the next forward of that layer reshards it, so at the
      bottom of backward every layer above is gathered (``kept_after_backward``);
    - the root of a stage that does not end in the head registers its pre-backward hook on the same output
      as its last layer, after it: the root's all-gather runs after the last layer's copy-out and the next
      layer's prefetch, and its output meets both (``root_regather`` when the root resharded after forward);
    - the final reduce-scatter (the root's first, or layer 0's where the stage has no root parameters) holds
      the reduce input and its shard beside the accumulation and every layer still gathered.

    The optimizer step sees the shards (``b.grads``, unchanged)."""
    g_div = ctx.par.shard_degree if ctx.par.zero >= 2 else 1
    wb = gathered_weight_bytes(ctx)
    n = b.trainable_local
    layers = stage.layers
    b.accumulated_grads = [
        Item(
            "gradients",
            "FSDP2 unsharded gradients accumulated over the micro-batches (pipeline: reduce-scatter at the end)",
            n * grad_b,
            f"{fmt_int(n)} params x {grad_b} B (no dp shard until perform_reduce_grad)",
            "tensor",
            max(1, b.grads[0].tensors if b.grads else 1),
        ),
        *b.grads[1:],
    ]
    # the first backward of a step makes them: at its bottom, all but the bottom layer's and the embeddings'
    n_bottom = (b.grads[0].bytes * g_div - b.grads_but_bottom[-1].bytes * g_div) if b.grads_but_bottom else 0
    b.grads_but_bottom = [
        Item(
            "gradients",
            "FSDP2 unsharded gradients (all but the bottom layer's and the embeddings', still to come)",
            max(0, n * grad_b - n_bottom),
            f"{fmt_int(n)} params x {grad_b} B - 1 layer - embeddings (unsharded)",
            "tensor",
            max(1, b.accumulated_grads[0].tensors - 10),
        ),
    ]
    b.gathered_grads = [i for i in b.gathered_grads if i.category == "parameters"]
    if grad_b != wb and per_layer:
        b.gathered_grads.append(
            Item(
                "gradients",
                "FSDP2 new gradients of the layer in backward, in param_dtype (before they join the accumulation)",
                per_layer * wb,
                f"{fmt_int(per_layer)} x {wb} B",
                "tensor",
                9,
            )
        )
    if layers > 1:
        b.kept_after_backward = [
            _layers_gathered(
                "FSDP2 layers kept gathered after their backward (pipeline: reshard_after_backward=False)",
                layers - 1,
                unit,
            )
        ]
    if b.root_regather and not stage.last and layers:
        b.root_regather += [
            Item("parameters", "FSDP2 unsharded last layer of the stage (gathered before the root)", unit[0],
                 unit[1], "tensor", 9),
        ]  # fmt: skip
        if layers > 1:
            b.root_regather.append(
                Item("parameters", "FSDP2 all-gather output of the next layer (prefetched)", unit[0], unit[1],
                     "tensor", 1)
            )  # fmt: skip
    # GPipe's later backwards (no forward between them): the root and every layer still gathered from the
    # first, no all-gather left (the new gradients: _pipeline_new_grads)
    b.gathered_next = [
        *[i for i in b.gathered if "root" in i.item],
        _layers_gathered(
            "FSDP2 layers still gathered from the first backward (pipeline: reshard_after_backward=False)",
            layers,
            unit,
        ),
    ]
    # the next layer's all-gather output is prefetched during a layer's backward and freed at its copy-out:
    # none is left at the bottom of backward (layer 0 prefetches nothing)
    b.prefetched = [i for i in b.gathered if "all-gather output" in i.item]
    b.gathered = [i for i in b.gathered if "all-gather output" not in i.item]
    # ... but at the bottom layer's copy-out (before its backward) its own all-gather output is still alive
    b.grads_but_bottom += b.prefetched if layers else []
    b.root_made = []
    b.grads_but_root = list(b.accumulated_grads)
    b.root_reduce_out = []
    _pipeline_final_reduce(b, root, per_layer, layers, grad_b, g_div, unit)


def _pipeline_final_reduce(
    b: StateBudget, root: int, per_layer: int, layers: int, grad_b: int, g_div: int, unit: tuple[int, str]
) -> None:
    """The schedule's final reduce-scatter under ``pipeline_fsdp2``: the first unit's (the root's, or layer 0's
    where the stage has no root parameters) reduce input and shard beside every layer still gathered."""
    first_n, first_name = (root, "the root unit") if root else (per_layer, "layer 0")
    still = layers if root else layers - 1
    b.root_reduce = [
        Item(
            "gradients",
            f"FSDP2 reduce-scatter input of {first_name} (the schedule's final reduce, first)",
            first_n * grad_b,
            f"{fmt_int(first_n)} params x {grad_b} B (reduce_dtype)",
            "tensor",
            1,
        ),
        Item(
            "gradients",
            f"FSDP2 reduce-scatter output of {first_name} (its gradient shard)",
            first_n * grad_b // g_div,
            f"{fmt_int(first_n)} params x {grad_b} B / {g_div}",
            "tensor",
            1,
        ),
    ]
    if still > 0:
        b.root_reduce.append(
            _layers_gathered(
                "FSDP2 layers still gathered at the final reduce-scatter (resharded one by one)", still, unit
            )
        )


def _pipeline_new_grads(
    ctx: Context,
    stage: Stage,
    b: StateBudget,
    per_layer: int,
    grad_b: int,
    largest: int,
    unit: tuple[int, str],
) -> None:
    """Under ``pipeline_fsdp2``, what a backward after the first of the step makes beside the accumulation,
    and what an interleaved rank keeps gathered from its other chunks.

    - The new gradients (``gradients.new_gradient``): with the gradient in the parameter dtype,
      ``AccumulateGrad`` meets the unsharded ``.grad`` an earlier micro-batch left (``new_grad``: at the top
      of a backward whose gradients are carried; ``new_grad_next``: GPipe's later backwards, the larger of it
      and the loss's backward, which come one after the other). Where ``reduce_dtype`` differs, the layer's
      new gradients in the parameter dtype are already counted (``gathered_grads``); GPipe's later backwards
      meet them too.
    - An interleaved rank (``virtual_stages`` > 1, ``reshard_after_forward``): a chunk's layers stay gathered
      from its backward until its next forward, so while another chunk is gathered (its forward, or the top
      of its backward) they are still there (``chunk_gathered``, with that chunk's layer). Torch 2.13
      ``ScheduleInterleaved1F1B`` on rank 0 of pp 2, v 2, m 4 runs B(stage 0, mb 0) right before F(stage 2,
      mb 3), on rank 1 B(3, 1) before F(1, 2) and B(1, 0): traced, those are the peaks. Counted as every layer
      of the rank but one chunk's (``layers - layers // v``: an upper bound where a forward of that chunk came
      in between)."""
    wb = gathered_weight_bytes(ctx)
    if stage.layers or largest:
        item = new_gradient(largest, grad_b)
        if grad_b != wb and stage.layers:
            item = new_gradient(per_layer, wb, f"{fmt_int(per_layer)} x {wb} B (the layer's, in param_dtype)")
        b.new_grad_next = [item]
        b.new_grad = [item] if grad_b == wb and stage.layers else []
    v = ctx.par.virtual_stages
    if ctx.par.pp_schedule == "interleaved" and v > 1 and ctx.par.reshard_after_forward and stage.layers:
        kept = stage.layers - stage.layers // v
        b.chunk_gathered = [
            _layers_gathered("FSDP2 layers of the rank's other chunks still gathered from their backward (interleaved)", kept, unit),
            Item("parameters", "FSDP2 unsharded parameters of the chunk's layer (gathered)", unit[0], unit[1],
                 "tensor", 9),
        ]  # fmt: skip


def _layer_gradients(per_layer: int, grad_b: int) -> Item:
    """One layer's unsharded gradients under ZeRO-3 (made in its backward, reduce-scattered after it)."""
    return Item(
        "gradients",
        "ZeRO-3 unsharded gradients of one layer",
        per_layer * grad_b,
        f"{fmt_int(per_layer)} x {grad_b} B",
        "tensor",
        1,
    )
