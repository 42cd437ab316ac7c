"""Model states on one rank: weights, gradients, master copy, optimizer states, and their sharding.

Bytes per parameter per recipe follow REFERENCE.md section 2; ZeRO (Rajbhandari et al. 2020,
arXiv 1910.02054) shards optimizer states over dp at stage 1, gradients too at stage 2, and the
weights at stage 3, where the unit being computed is gathered in full (plus the prefetched next one).
QLoRA storage follows Dettmers et al. 2023 (arXiv 2305.14314): NF4 0.5 B/param plus block absmax.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from memsim_widget.architecture import ParamGroup
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import (
    embedding_split,
    gathered_weight_bytes,
    parameters_fetched_from_host,
    profile,
    quantises_module,
    reduce_bucket_elements,
)
from memsim_widget.engine.items import Item
from memsim_widget.units import fmt_int

#: NF4 storage per element with double quantisation: 4 bits + int8 absmax per 64 + fp32 per 256 absmaxes.
NF4_BLOCK = 64
NF4_DQ_BLOCK = 256


def nf4_bytes(numel: int) -> int:
    """Bytes of one NF4-quantised weight with double-quantised absmax (bitsandbytes Params4bit)."""
    blocks = math.ceil(numel / NF4_BLOCK)
    return math.ceil(numel / 2) + blocks + 4 * math.ceil(blocks / NF4_DQ_BLOCK) + 4


@dataclass
class LocalGroup:
    """A parameter group as it sits on one rank: tensor count and per-tensor elements after tp/ep."""

    group: ParamGroup
    count: int
    numel_each: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return self.count * self.numel_each


@dataclass
class StateBudget:
    """Model-state items of one rank, sorted by when they are alive."""

    persistent: list[Item] = field(default_factory=list)  # weights, master, optimizer states
    grads: list[Item] = field(default_factory=list)  # all gradients of the step on this rank
    post_grads: list[Item] = field(default_factory=list)  # gradients of the head and final norm
    grads_but_bottom: list[Item] = field(default_factory=list)  # all but layer 0's and the embeddings'
    gathered: list[Item] = field(default_factory=list)  # ZeRO-3 gathered units (forward/backward)
    gathered_grads: list[Item] = field(default_factory=list)  # ZeRO-3 unsharded grads of a unit (backward)
    # FSDP2 without reshard after forward: the unsharded layers kept from their forward to their backward --
    # all but the last layer (which becomes the layer in backward) and that last one
    kept_unsharded: list[Item] = field(default_factory=list)
    kept_unsharded_last: list[Item] = field(default_factory=list)
    step_temps: list[Item] = field(default_factory=list)
    host: list[Item] = field(default_factory=list)
    grad_bytes_per_layer: float = 0.0
    pre_post_grad_bytes: int = 0
    largest_grad_bytes: int = 0
    trainable_local: int = 0
    params_local: int = 0


def local_groups(ctx: Context, stage: Stage) -> list[LocalGroup]:
    """The parameter groups held by ``stage``, split by tensor and expert parallelism."""
    arch, par = ctx.arch, ctx.par
    out: list[LocalGroup] = []
    for g in arch.params:
        if g.scope == "layer":
            count = g.count * stage.layers // arch.num_layers
        elif g.scope == "pre":
            count = g.count if stage.first else 0
        else:
            count = g.count if stage.last else 0
        if g.expert and par.ep > 1:
            count //= par.ep
        shape = list(g.shape)
        if g.tp_dim is not None and par.tp > 1 and (g.kind != "embedding" or embedding_split(ctx)):
            shape[g.tp_dim] = -(-shape[g.tp_dim] // par.tp)
        if count:
            out.append(LocalGroup(g, count, math.prod(shape), tuple(shape)))
    # Tied input/output embeddings with pp > 1: the last stage keeps its own copy for the head.
    if arch.tied_embeddings and ctx.par.pp > 1 and stage.last and not stage.first:
        emb = max((g for g in arch.params if g.kind == "embedding"), key=lambda g: g.numel)
        shape = list(emb.shape)
        if emb.tp_dim is not None and par.tp > 1:
            shape[emb.tp_dim] = -(-shape[emb.tp_dim] // par.tp)
        out.append(
            LocalGroup(
                ParamGroup("lm_head.weight (tied copy)", "head", emb.shape, 1, "post", emb.tp_dim, "lm_head"),
                1,
                math.prod(shape),
                tuple(shape),
            )
        )
    return out


def _shard_note(divisor: int, why: str) -> str:
    return f" / {divisor} ({why})" if divisor > 1 else ""


def model_states(ctx: Context, stage: Stage) -> StateBudget:
    """Weights, gradients, master weights and optimizer states of one rank of ``stage``."""
    sc, par, recipe, opt = ctx.scenario, ctx.par, ctx.recipe, ctx.opt
    dp = par.dp * par.cp  # ZeRO/FSDP shard over the data-parallel (and context-parallel) group
    z = par.zero
    groups = local_groups(ctx, stage)
    b = StateBudget()
    b.params_local = sum(g.numel for g in groups)
    w_div = dp if z >= 3 else 1
    w_note = _shard_note(w_div, "ZeRO-3 dp shard")
    on_host_params = par.offload == "optimizer+params"
    on_host_opt = par.offload != "none"
    weight_level = "host" if on_host_params else "tensor"
    tp_note = f" (tp={par.tp} split)" if par.tp > 1 else ""

    def plain_weights(kind: str, n: int, tensors: int) -> Item:
        """Unquantised weights of one kind on this rank."""
        return Item(
            "parameters",
            f"{kind} weights",
            n * recipe.weight_bytes // w_div,
            f"{fmt_int(n)} params x {recipe.weight_bytes} B{tp_note}{w_note}",
            weight_level,
            tensors,
        )

    # ----- weights ---------------------------------------------------------------------------
    quantised = sc.method == "qlora"
    by_kind: dict[str, list[LocalGroup]] = defaultdict(list)
    for g in groups:
        by_kind[g.group.kind].append(g)
    for kind, gs in by_kind.items():
        n = sum(g.numel for g in gs)
        tensors = sum(g.count for g in gs)
        if (
            quantised
            and kind not in ("embedding", "head", "norm", "position")
            and any(g.group.module for g in gs)
        ):
            q = [g for g in gs if quantises_module(ctx, g.group.module) and len(g.shape) >= 2]
            rest = [g for g in gs if g not in q]
            qbytes = sum(nf4_bytes(g.numel_each) * g.count for g in q)
            nq = sum(g.numel for g in q)
            b.persistent.append(
                Item(
                    "parameters",
                    f"{kind} weights (NF4)",
                    qbytes // w_div,
                    f"{fmt_int(nq)} x (0.5 B + 1 B/64 absmax + 4 B/16384){tp_note}{w_note}",
                    weight_level,
                    sum(g.count for g in q) * 2,
                )
            )
            if not q:  # nothing of this kind is quantised (torchtune: only LoRA-wrapped Linears)
                b.persistent.append(plain_weights(kind, n, tensors))
                continue
            if rest:
                b.persistent.append(
                    plain_weights(kind, sum(g.numel for g in rest), sum(g.count for g in rest))
                )
            continue
        b.persistent.append(plain_weights(kind, n, tensors))

    if recipe.weight_copy_bytes and not recipe.autocast:
        nl = sum(g.numel for g in groups if g.group.module and g.group.kind not in ("embedding", "head"))
        b.persistent.append(
            Item(
                "parameters",
                "fp8 weight and transpose cache",
                nl * recipe.weight_copy_bytes,
                f"{fmt_int(nl)} Linear weights x {recipe.weight_copy_bytes} B (fp8 + transpose)",
                "tensor",
                2,
            )
        )

    # ----- what is trained ---------------------------------------------------------------------
    if ctx.full_training:
        # a frozen stack (a VLM's vision tower) has weights but no gradient or optimizer state
        trainable = [
            (g.shape, g.count, g.numel_each) for g in groups if g.group.stack not in ctx.frozen_stacks
        ]
        grad_b, state_b, master_b = recipe.grad_bytes, recipe.state_bytes, recipe.master_bytes
        what = "params"
    else:
        a_bytes = ctx.adapter_bytes
        frac = stage.layers / ctx.arch.num_layers
        trainable = []
        for ad in ctx.adapters:
            cnt = max(1, round(ad.base.count * frac)) if ad.base.scope == "layer" else ad.base.count
            trainable.append(((ad.rank, ad.in_features), cnt, ad.rank * ad.in_features))
            trainable.append(((ad.out_features, ad.rank), cnt, ad.rank * ad.out_features))
        n_ad = sum(c * e for _, c, e in trainable)
        b.persistent.append(
            Item(
                "parameters",
                "LoRA adapter weights",
                n_ad * a_bytes,
                f"{fmt_int(n_ad)} adapter params x {a_bytes} B "
                f"(rank {sc.lora.rank}, targets {','.join(sc.lora.targets)})",
                "tensor",
                sum(c for _, c, _ in trainable),
            )
        )
        grad_b = a_bytes
        state_b = 4 if recipe.master_bytes else a_bytes
        master_b = 0
        what = "adapter params"
    n_train = sum(c * e for _, c, e in trainable)
    b.trainable_local = n_train
    tensors_train = sum(c for _, c, _ in trainable)

    # ----- gradients ---------------------------------------------------------------------------
    g_div = dp if z >= 2 else 1
    grad_total = n_train * grad_b // g_div
    if sc.optimizer_in_backward:
        largest = max(e for _, _, e in trainable)
        b.grads.append(
            Item(
                "gradients",
                "gradient of the parameter being updated (optimizer in backward)",
                largest * grad_b,
                f"largest param {fmt_int(largest)} x {grad_b} B",
                "tensor",
                1,
            )
        )
    else:
        b.grads.append(
            Item(
                "gradients",
                "gradients",
                grad_total,
                f"{fmt_int(n_train)} {what} x {grad_b} B{_shard_note(g_div, 'ZeRO-2 dp shard')}",
                "tensor",
                tensors_train,
            )
        )
    if par.dp > 1 and z == 0 and profile(ctx).ddp_buckets and not sc.optimizer_in_backward:
        # allocated when DDP wraps the model and kept for the whole run (the Reducer's bucket tensors), so
        # alive at every moment; FSDP2-based replicate (traced) keeps an unsharded parameter copy of the same size
        b.persistent.append(
            Item(
                "gradients",
                "DDP gradient buckets",
                n_train * grad_b,
                f"{fmt_int(n_train)} x {grad_b} B (DDP flat buckets, gradient_as_bucket_view=False; "
                "allocated at wrap time)",
                "tensor",
                max(1, n_train * grad_b // (25 * 1024**2)),
            )
        )
    layer_train = sum(
        c * e for (_, c, e), g in zip(trainable, _trainable_scopes(ctx, groups), strict=False) if g == "layer"
    )
    b.grad_bytes_per_layer = layer_train * grad_b / g_div / max(stage.layers, 1)
    b.pre_post_grad_bytes = max(0, grad_total - int(b.grad_bytes_per_layer * stage.layers))
    if not sc.optimizer_in_backward and ctx.full_training:
        n_pre = sum(
            g.numel for g in groups if g.group.scope == "pre" and g.group.stack not in ctx.frozen_stacks
        )
        missing = int(b.grad_bytes_per_layer) + n_pre * grad_b // g_div
        b.grads_but_bottom = [
            *b.grads[1:],
            Item(
                "gradients",
                "gradients (all but the bottom layer's and the embeddings', still to come)",
                max(0, grad_total - missing),
                f"{fmt_int(n_train)} params x {grad_b} B - 1 layer - embeddings"
                f"{_shard_note(g_div, 'ZeRO-2 dp shard')}",
                "tensor",
                max(1, tensors_train - 10),
            ),
        ]
    else:
        b.grads_but_bottom = list(b.grads)
    if ctx.full_training and not sc.optimizer_in_backward:
        n_post = sum(
            g.numel for g in groups if g.group.scope == "post" and g.group.stack not in ctx.frozen_stacks
        )
        if n_post:
            b.post_grads.append(
                Item(
                    "gradients",
                    "gradients of the head and final norm",
                    n_post * grad_b // g_div,
                    f"{fmt_int(n_post)} params x {grad_b} B",
                    "tensor",
                    2,
                )
            )
    b.largest_grad_bytes = max(e for _, _, e in trainable) * grad_b

    # ----- master weights and optimizer states -------------------------------------------------
    o_div = dp if z >= 1 else 1
    o_note = _shard_note(o_div, f"ZeRO-{z} dp shard")
    level = "host" if on_host_opt else "tensor"
    # bitsandbytes' paged optimizers allocate their state with cudaMallocManaged (torch.frombuffer over
    # unified memory): outside PyTorch's caching allocator, resident on the device until it is paged out
    state_level = "device" if opt.paged and not on_host_opt else level
    if master_b:
        b.persistent.append(
            Item(
                "optimizer_states",
                "fp32 master weights",
                n_train * master_b // o_div,
                f"{fmt_int(n_train)} x {master_b} B{o_note}",
                level,
                tensors_train,
            )
        )
    if opt.states:
        sbytes = sum(opt.state_bytes(shape, state_b) * c for shape, c, _ in trainable) // o_div
        item = Item(
            "optimizer_states",
            f"{opt.name} states",
            sbytes,
            f"{fmt_int(n_train)} {what} x {opt.state_formula(state_b)}{o_note}"
            + (
                " (paged: unified memory outside the caching allocator, can spill to host)"
                if opt.paged
                else ""
            ),
            state_level,
            tensors_train * opt.states,
        )
        b.persistent.append(item)

    # ----- optimizer step temporaries -----------------------------------------------------------
    impl = "fused" if opt.impls == ("fused",) else sc.optimizer_impl
    if sc.optimizer != "none":
        largest = max(e for _, _, e in trainable)
        if sc.optimizer_in_backward:
            factor = {"foreach": 1.0, "fused": 0.0, "for-loop": opt.temp_for_loop}.get(impl, 1.0)
            if opt.temp_foreach == 0 and impl == "foreach":
                factor = 0.0
            tbytes = int(factor * largest * state_b)
            formula = f"{factor:g} x largest param {fmt_int(largest)} x {state_b} B (per-parameter step)"
        elif impl == "foreach":
            tbytes = int(opt.temp_foreach * n_train * state_b // o_div)
            formula = f"{opt.temp_foreach:g} x {fmt_int(n_train)} x {state_b} B (foreach buffer of the group){o_note}"
        elif impl == "for-loop":
            repeated = max((e for _, c, e in trainable if c >= 2), default=0)
            if opt.temp_fp32_copies and state_b < 4:
                tbytes = opt.temp_fp32_copies * 4 * -(-largest // o_div)
                formula = f"{opt.temp_fp32_copies} fp32 copies x largest param {fmt_int(largest)} x 4 B"
            else:
                elems = max(opt.temp_for_loop * largest, (opt.temp_for_loop + 1) * repeated)
                tbytes = int(-(-elems // o_div) * state_b)
                formula = (
                    f"max({opt.temp_for_loop:g} x largest param {fmt_int(largest)}, "
                    f"{opt.temp_for_loop + 1:g} x largest repeated {fmt_int(repeated)}) x {state_b} B "
                    "(per-tensor step; the previous tensor's buffer still alive)"
                )
        else:
            tbytes = int(opt.temp_fused * n_train * state_b // o_div)
            formula = "fused kernel: no temporaries"
        if tbytes:
            b.step_temps.append(
                Item(
                    "temporaries",
                    f"optimizer step ({impl})",
                    tbytes,
                    formula,
                    level if not sc.optimizer_in_backward else "tensor",
                    1 if impl != "foreach" else tensors_train,
                )
            )

    # ----- DeepSpeed ZeRO-1/2 gradient reduce buffer ------------------------------------------------
    bucket = min(reduce_bucket_elements(ctx), n_train)
    if bucket and not sc.optimizer_in_backward:
        b.persistent.append(
            Item(
                "gradients",
                "DeepSpeed gradient reduce bucket (reduce_bucket_size)",
                bucket * recipe.weight_bytes,
                f"min(5e8, {fmt_int(n_train)}) elements x {recipe.weight_bytes} B (ipg_buffer)",
                "tensor",
                1,
            )
        )

    # ----- ZeRO-3 / FSDP gathered units ---------------------------------------------------------
    fetched = parameters_fetched_from_host(ctx)
    if z >= 3 and (dp > 1 or fetched):
        per_layer = sum(g.numel for g in groups if g.group.scope == "layer") // max(stage.layers, 1)
        root = sum(g.numel for g in groups if g.group.scope != "layer")
        if profile(ctx).zero3 == "fsdp2" and not fetched:
            _fsdp2_units(ctx, b, per_layer, root, grad_b, stage.layers)
        else:
            _deepspeed_units(ctx, b, per_layer, root, grad_b, dp, fetched)

    # ----- host memory --------------------------------------------------------------------------
    if on_host_opt:
        b.host.extend(i for i in b.persistent + b.step_temps if i.level == "host")
    return b


def _kept_unsharded(b: StateBudget, per_layer: int, wb: int, layers: int) -> None:
    """``reshard_after_forward=False``: each layer's unsharded parameters stay from its forward until its own
    backward has run (FSDP2 skips the post-forward reshard; the post-backward one frees them)."""
    if layers > 1:
        b.kept_unsharded.append(
            Item(
                "parameters",
                "FSDP2 unsharded layers kept for backward (reshard_after_forward=False)",
                (layers - 1) * per_layer * wb,
                f"{layers - 1} layers x {fmt_int(per_layer)} params x {wb} B",
                "tensor",
                9 * (layers - 1),
            )
        )
    b.kept_unsharded_last.append(
        Item(
            "parameters",
            "FSDP2 unsharded last layer kept for backward (reshard_after_forward=False)",
            per_layer * wb,
            f"{fmt_int(per_layer)} params x {wb} B",
            "tensor",
            9,
        )
    )


def _fsdp2_units(
    ctx: Context, b: StateBudget, per_layer: int, root: int, grad_b: int, stage_layers: int = 1
) -> None:
    """FSDP2 ``fully_shard`` per layer and on the root (torchtitan's wrapping), as its trace shows.

    The unsharded parameters are a separate buffer beside the shard (the root's stay unsharded from the
    forward until its backward ends); the last all-gather output is held until the next all-gather
    (FSDP2's ``AllGatherState``, so the copy stream cannot reuse memory still read); in backward a layer is
    unsharded while the next one's all-gather is prefetched. Checked: docs/fidelity-parallel.md.
    """
    wb = gathered_weight_bytes(ctx)
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
    if ctx.par.reshard_after_forward:  # without it no all-gather output outlives its copy-out (traced)
        b.gathered.append(
            Item(
                "parameters",
                "FSDP2 all-gather output of the last unit (held until the next all-gather)",
                per_layer * wb,
                f"{fmt_int(per_layer)} params/layer x {wb} B",
                "tensor",
                1,
            )
        )
    b.gathered_grads.append(
        Item(
            "parameters",
            "FSDP2 unsharded parameters of the layer in backward",
            per_layer * wb,
            f"{fmt_int(per_layer)} params/layer x {wb} B",
            "tensor",
            9,
        )
    )
    if not ctx.par.reshard_after_forward:
        _kept_unsharded(b, per_layer, wb, stage_layers)
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


def _trainable_scopes(ctx: Context, groups: list[LocalGroup]) -> list[str]:
    """Scope of each trainable entry, aligned with the trainable list built in ``model_states``."""
    if ctx.full_training:
        return [g.group.scope for g in groups if g.group.stack not in ctx.frozen_stacks]
    out: list[str] = []
    for ad in ctx.adapters:
        out += [ad.base.scope, ad.base.scope]
    return out
