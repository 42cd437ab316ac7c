"""ZeRO-3 / FSDP on one rank: the unsharded units a sharded model gathers around the layer being computed --
FSDP2's (traced, docs/fidelity-parallel.md) and DeepSpeed's (formula only)."""

from __future__ import annotations

from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import (
    embedding_split,
    gathered_weight_bytes,
    megatron_fp8_params,
    parameters_fetched_from_host,
    profile,
    tp_plan,
)
from memsim_widget.engine.items import Item
from memsim_widget.engine.states.budget import LocalGroup, StateBudget
from memsim_widget.units import fmt_int


def gathered_units(ctx: Context, stage: Stage, groups: list[LocalGroup], grad_b: int, b: StateBudget) -> None:
    """The gathered units of ZeRO-3 / FSDP when parameters are sharded (or fetched from the host)."""
    par = ctx.par
    dp = par.dp * par.cp
    z = par.zero
    fetched = parameters_fetched_from_host(ctx)
    if z >= 3 and (dp > 1 or fetched):
        per_layer = sum(g.numel for g in groups if g.group.scope == "layer") // max(stage.layers, 1)
        root = sum(g.numel for g in groups if g.group.scope != "layer")
        largest = max((g.numel_each for g in groups if g.group.scope != "layer"), default=0)
        if profile(ctx).zero3 == "fsdp2" and not fetched:
            unit = _layer_unit(ctx, groups, per_layer, stage.layers)
            _fsdp2_units(ctx, b, per_layer, root, grad_b, stage.layers, largest, unit)
            if ctx.full_training and root:
                _root_grads_made(ctx, b, root, groups)
        else:
            _deepspeed_units(ctx, b, per_layer, root, grad_b, dp, fetched)


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
    lin = [g for g in groups if g.group.scope == "layer" and g.group.module and g.group.kind != "embedding"]
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


def _kept_unsharded(b: StateBudget, unit: tuple[int, str], layers: int) -> None:
    """``reshard_after_forward=False``: each layer's unsharded parameters stay from its forward until its own
    backward has run (FSDP2 skips the post-forward reshard; the post-backward one frees them)."""
    if layers > 1:
        b.kept_unsharded.append(
            Item(
                "parameters",
                "FSDP2 unsharded layers kept for backward (reshard_after_forward=False)",
                (layers - 1) * unit[0],
                f"{layers - 1} layers x ({unit[1]})",
                "tensor",
                9 * (layers - 1),
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
    dp = ctx.par.dp * ctx.par.cp
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
        b.gathered_grads.append(
            Item(
                "gradients",
                "ZeRO-3 unsharded gradients of one layer",
                per_layer * grad_b,
                f"{fmt_int(per_layer)} x {grad_b} B",
                "tensor",
                1,
            )
        )
