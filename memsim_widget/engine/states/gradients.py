"""Gradients on one rank: the step's gradients (ZeRO-2 sharded, or one at a time with the optimizer in
backward), DDP's flat buckets, the parts alive at each moment of backward, and DeepSpeed's ZeRO-1/2 reduce
bucket."""

from __future__ import annotations

from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import (
    embedding_split,
    one_eager_gpu,
    profile,
    reduce_bucket_elements,
    reduce_buffers,
    tied_head_grad_numel,
    tp_plan,
)
from memsim_widget.engine.items import Item
from memsim_widget.engine.states.budget import LocalGroup, StateBudget, shard_note, shard_why
from memsim_widget.engine.states.trained import Trained, trainable_scopes
from memsim_widget.units import fmt_int

#: The item of DDP's flat gradient buckets (``engine/counters/ddp_stream`` writes their allocations)
DDP_BUCKETS_ITEM = "DDP gradient buckets"
#: The item name of DeepSpeed ZeRO-1/2's ipg buffer (``reduce_bucket``; the replay writes it per backward)
ZERO_BUCKET_ITEM = "DeepSpeed gradient reduce bucket (reduce_bucket_size)"
#: The item of a vocab-sharded untied embedding's gradient beyond its shard (``partial_embedding_grad``): the
#: allocation stream writes the whole table's gradient as one tensor instead (``tp_stream.EMBEDDING_GRAD``).
PARTIAL_EMBEDDING_ITEM = "embedding gradient as a Partial DTensor (full vocabulary on every tp rank)"
#: The item of the rank's gradient partition that DeepSpeed keeps on the host under ``offload_optimizer``
HOST_GRADS_ITEM = "gradients (this rank's partition, on the host: DeepSpeed offload_optimizer)"
#: The item of ZeRO-3's bf16 gradient partitions (``grad_partitions_flat_buffer``), kept from the wrap
#: (``states/gathered._grad_partitions``; ``zero3_stream.Zero3Writer.wrap`` writes it)
ZERO3_GRAD_PARTITIONS_ITEM = "DeepSpeed ZeRO-3 gradient partitions (grad_partitions_flat_buffer)"
#: The item of DeepSpeed ZeRO-1/2's GPU staging buffer under ``offload_optimizer``
OFFLOAD_STAGING_ITEM = "DeepSpeed offload staging buffer (temp_grad_buffer_for_gpu_offload)"


def grads_on_host(ctx: Context) -> bool:
    """DeepSpeed ZeRO-2/3 with ``offload_optimizer`` (``parallel.offload: optimizer``) keeps the rank's gradient
    partition on the host, not on the GPU (deepspeed 0.19.8): ZeRO-1/2 (``stage_1_and_2.py``,
    ``copy_grads_in_partition``' ``cpu_offload`` branch) makes no ``grads_in_partition``: each reduced slice of the
    partition is cast and copied into the fp32 gradient of the host's master partition (and, between accumulation
    boundaries, added into a host buffer through ``temp_grad_buffer_for_gpu_offload``); ZeRO-3 (``stage3.py``)
    makes ``grad_partitions_flat_buffer`` on ``self.device``, the host. What stays on the GPU is transient: each
    parameter's bf16 ``.grad`` until the hook copies it into the ipg bucket (``reduce_bucket``, kept), the
    bucket's flat copy and the slices' casts (``engine/counters/zero_offload_stream`` writes them; traced on CPU).
    ZeRO-1's gradients stay whole on the GPU until its reduce (its items are not partitions) and
    ``optimizer+params`` (``offload_param`` too) keeps the fitted rule (its rows in docs/accuracy.md are measured
    on one GPU); the optimizer stepping in backward keeps its one gradient on the GPU."""
    par = ctx.par
    return (
        par.offload == "optimizer"
        and par.zero >= 2
        and profile(ctx).bucket_elements > 0
        and not ctx.scenario.optimizer_in_backward
    )


def gradients(ctx: Context, stage: Stage, groups: list[LocalGroup], tr: Trained, b: StateBudget) -> None:
    """The gradient items of ``b``, and the per-layer and pre/post gradient bytes the timeline reads."""
    sc, par = ctx.scenario, ctx.par
    # ZeRO/FSDP shard over the data-parallel (and context-parallel) group, or dp_shard x cp
    dp = par.shard_degree
    z = par.zero
    trainable, grad_b, what = tr.entries, tr.grad_b, tr.what
    n_train, tensors_train = tr.n, tr.tensors
    g_div = dp if z >= 2 else 1
    grad_total = n_train * grad_b // g_div
    on_host = grads_on_host(ctx)
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
    elif on_host:  # DeepSpeed offload_optimizer: the partition on the host, nothing of it kept on the GPU
        b.host.append(
            Item(
                "gradients",
                HOST_GRADS_ITEM,
                grad_total,
                f"{fmt_int(n_train)} {what} x {grad_b} B{shard_note(g_div, f'ZeRO-{z} dp shard')} (the fp32 "
                "gradient of the host's master partition)",
                "host",
                tensors_train,
            )
        )
    else:
        b.grads.append(
            Item(
                "gradients",
                "gradients",
                grad_total,
                f"{fmt_int(n_train)} {what} x {grad_b} B{shard_note(g_div, shard_why(par, 'ZeRO-2'))}",
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
                DDP_BUCKETS_ITEM,
                n_train * grad_b,
                f"{fmt_int(n_train)} x {grad_b} B (DDP flat buckets, gradient_as_bucket_view=False; "
                "allocated at wrap time)",
                "tensor",
                max(1, n_train * grad_b // (25 * 1024**2)),
            )
        )
    layer_train = sum(
        c * e for (_, c, e), g in zip(trainable, trainable_scopes(ctx, groups), strict=False) if g == "layer"
    )
    b.grad_bytes_per_layer = 0.0 if on_host else layer_train * grad_b / g_div / max(stage.layers, 1)
    b.pre_post_grad_bytes = 0 if on_host else max(0, grad_total - int(b.grad_bytes_per_layer * stage.layers))
    if not sc.optimizer_in_backward and ctx.full_training and not on_host:
        n_pre = sum(
            g.numel for g in groups if g.group.scope == "pre" and g.group.stack not in ctx.frozen_stacks
        )
        made = bottom_made_first(ctx, groups) * grad_b
        missing = int(b.grad_bytes_per_layer) - made + n_pre * grad_b // g_div
        b.grads_but_bottom = [
            *b.grads[1:],
            Item(
                "gradients",
                "gradients (all but the bottom layer's and the embeddings', still to come)",
                max(0, grad_total - missing),
                f"{fmt_int(n_train)} params x {grad_b} B - 1 layer"
                + (f" + its MLP output projection's {fmt_int(made)} B" if made else "")
                + f" - embeddings{shard_note(g_div, shard_why(par, 'ZeRO-2'))}",
                "tensor",
                max(1, tensors_train - 10),
            ),
        ]
        if stage.layers == 0:  # an end stage of only the embedding (its new gradient) or only the head
            b.grads_but_bottom = [*b.grads, *([_new_embedding_grad(n_pre, grad_b, g_div)] if n_pre else [])]
    else:
        b.grads_but_bottom = list(b.grads)
    partial_embedding_grad(ctx, stage, groups, grad_b, b)  # made at the bottom: not in grads_but_bottom
    tied_head_grad(ctx, stage, groups, grad_b, b)
    _loss_grads(ctx, stage, b)
    if ctx.full_training and not sc.optimizer_in_backward and not on_host:
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
    # no data parallelism (ZeRO-0: over dp; the planner's state key sees dp only, not cp, there)
    alone = (par.dp if z == 0 else par.dp * par.cp) == 1
    solo = one_eager_gpu(ctx)
    # one GPU: a layer's new gradients are freed (added in place) before its backward's largest transients
    # (traced: the top layer's SiLU backward, beside no new gradient), so only a pipeline stage counts one here
    if par.pp > 1 and alone and ctx.full_training and not sc.optimizer_in_backward and stage.layers:
        scopes = trainable_scopes(ctx, groups)
        largest_layer = max(
            (e for (_, _, e), g in zip(trainable, scopes, strict=False) if g == "layer"), default=0
        )
        b.new_grad = [new_gradient(largest_layer, grad_b)] if largest_layer else []
    if solo and ctx.full_training and not sc.optimizer_in_backward:
        one_gpu_backward(ctx, groups, grad_b, b)


def bottom_made_first(ctx: Context, groups: list[LocalGroup]) -> int:
    """Elements of the bottom layer's gradients made before its MLP's backward peaks: its output projection's
    weight and bias (``down_proj``, ``dense_4h_to_h``: the MLP's Linear split along its input, ``tp_dim`` 1).
    torch 2.13.0 runs a layer's backward in reverse of its forward (``torch/csrc/autograd/engine.cpp`` takes the
    ready node of the highest sequence number first), so the projection's ``MmBackward0``/``AddmmBackward0``
    makes both of its gradients before the activation's backward runs (traced at layer 0's SwiGLU ``mul`` /
    ``gelu_backward``: Llama h256 I688 gradients 352,256 B = 2 B x h x I above the rest, GPT-NeoX 524,800 B =
    2 B x (h x 4h + h)). One GPU (``one_eager_gpu``), one dense stack of layers; a post-norm block's output norm
    (made before the MLP's backward too) and MoE layers (whose experts' order varies) are not counted, nor the
    state-space families' (their layer backward carries the gradients made before the scan, ``ssm.py``)."""
    layer = [g for g in groups if g.group.scope == "layer"]
    if (
        not one_eager_gpu(ctx)
        or len({g.group.stack for g in layer}) != 1
        or any(g.group.expert for g in layer)
        or any(g.group.stack in ctx.frozen_stacks for g in layer)
        or ctx.arch.facts.norm.first_after_attention
        or ctx.arch.facts.ssm is not None
    ):
        return 0
    n = 0
    for i, g in enumerate(layer):
        grp = g.group
        if grp.kind != "mlp" or not grp.module or grp.tp_dim != 1 or len(grp.shape) != 2:
            continue
        n += g.numel_each
        nxt = layer[i + 1].group if i + 1 < len(layer) else None
        if nxt is not None and nxt.module is None and nxt.kind == "mlp" and nxt.shape == grp.shape[:1]:
            n += layer[i + 1].numel_each  # its bias, made by the same AddmmBackward0
    return n


def one_gpu_backward(ctx: Context, groups: list[LocalGroup], grad_b: int, b: StateBudget) -> None:
    """The embeddings' and the head's gradients as one GPU's backward makes them, where an earlier micro-batch's
    are carried or the head is untied (traced, docs/fidelity.md "Gradients at the head and the embeddings"); a
    tied head's part and the bottom's two parts beside their sum are ``tied_head_grad``'s. The head's weight
    gradient is made at the top beside the logits' gradient; from the second micro-batch of an accumulating step
    on it is a new tensor beside the accumulated ``.grad`` (``AccumulateGrad`` adds it in place,
    ``new_gradient``). A tied head's part waits in autograd's input buffer until the embedding's backward, which
    sums the two out of place (torch 2.13 ``autograd/input_buffer.cpp`` ``accumulate``: in place only into a
    tensor whose last reference it holds; a real CPU run allocates the sum too): in a later micro-batch that
    part is beside every accumulated gradient from the top to layer 0, and the sum a third V x h tensor beside
    them at the bottom. Untied, the embedding's backward makes a new gradient of its own there."""
    trained = [g for g in groups if g.group.stack not in ctx.frozen_stacks]
    emb = max(
        (g.numel_each for g in trained if g.group.kind == "embedding" and g.group.scope == "pre"), default=0
    )
    head = max(
        (g.numel_each for g in trained if g.group.kind == "head" and g.group.scope == "post"), default=0
    )
    tied = tied_head_grad_numel(ctx, True, True) > 0 and bool(b.tied_sum)
    part = _tied_part(emb, grad_b, "the head's part") if tied else None
    b.tied_head_part = (
        [part] if part else []
    )  # counted only where gradients are carried (post_grads holds it)
    b.head_made = list(b.post_grads)
    top = part or (new_gradient(head, grad_b, f"head param {fmt_int(head)} x {grad_b} B") if head else None)
    b.head_made_carried = [*b.grads, *([top] if top else [])]
    if tied:
        b.bottom_new_carried = [_tied_part(emb, grad_b, "their sum (out of place)")]
    elif emb:
        b.bottom_new_carried = [new_gradient(emb, grad_b, f"embedding param {fmt_int(emb)} x {grad_b} B")]
    b.grads_at_bottom_carried = list(b.grads)
    b.top_layer_made = _top_layer_made(ctx, groups, grad_b)
    b.top_down_new, b.top_down_made = _top_down(ctx, groups, grad_b)


def _top_layer_made(ctx: Context, groups: list[LocalGroup], grad_b: int) -> list[Item]:
    """The top layer's weight gradients that exist when its eager attention runs its softmax backward: torch
    2.13.0 runs the layer's backward in reverse of its forward (``torch/csrc/autograd/engine.cpp`` takes the
    ready node of the highest sequence number first), so the MLP's, the output projection's (the attention
    weights split along their input, ``tp_dim`` 1) and every norm's but the layer's first are made by then
    (traced: Llama h256 bf16 b2 s256, gradient bytes at ``_softmax_backward_data`` 1,700,864 = the head's and
    final norm's 512,512 + this layer's 1,188,352); in a post-norm block (BERT: ``first_after_attention``) both
    norms follow the attention, so both are made. Only a sequential block of one stack with the eager core;
    elsewhere (a parallel MLP runs its backward after the attention's; a fused kernel's backward is no larger
    than the MLP's) none is counted."""
    from memsim_widget.engine.activations.linears import before_attention_core
    from memsim_widget.engine.activations.mlp import parallel_mlp

    arch = ctx.arch
    layer = [g for g in groups if g.group.scope == "layer"]
    stacks = {g.group.stack for g in layer}
    eager = arch.attention_kernel(ctx.scenario.attention) == "eager"
    if not layer or len(stacks) != 1 or stacks & set(ctx.frozen_stacks) or not eager or parallel_mlp(arch):
        return []
    # the block's norms (a q/k norm inside the attention is differentiated after its core)
    norms = [g for g in layer if g.group.kind == "norm" and "attn" not in g.group.name]
    # the first norm module (weight and bias) runs before the attention, unless the block is post-norm (its first
    # norm reads the attention's output, so its backward runs before the core's too)
    first = "" if arch.facts.norm.first_after_attention or not norms else _module(norms[0].group.name)
    # the output projection: its weight split along its input (``tp_dim`` 1) and its bias, in the same module
    out_proj = {_module(g.group.name) for g in layer if g.group.kind == "attention" and g.group.tp_dim == 1}
    made = [
        g
        for g in layer
        if before_attention_core(g.group)
        or (g.group.kind == "attention" and _module(g.group.name) in out_proj)
        or (g in norms and _module(g.group.name) != first)
    ]
    n = sum(g.numel_each for g in made)
    if not n:
        return []
    return [
        Item(
            "gradients",
            "gradients of the top layer made before its attention's backward (o_proj, MLP, the norms after it)",
            n * grad_b,
            f"{fmt_int(n)} params x {grad_b} B",
            "tensor",
            len(made),
        )
    ]


def _top_down(ctx: Context, groups: list[LocalGroup], grad_b: int) -> tuple[list[Item], list[Item]]:
    """The top layer's MLP down projection's weight and bias gradients, the first of a layer's gradients its
    backward makes (torch 2.13.0 runs a layer's backward in reverse of its forward, ``torch/csrc/autograd/
    engine.cpp``): the matmul's output in the compute dtype (``addmm``'s backward: ``mm`` and ``sum``, alive as
    its backward ends), then the ``.grad`` it becomes (under autocast the fp32 cast ``_to_copy``'s backward makes;
    with gradients carried, added in place and gone). Traced on ViT and CLIP h256 (one GPU): bf16 the fc2 weight
    and bias gradients (524,800 B) at the bias's ``sum``; amp-bf16 the same in bf16 at ViT's ``sum``, their fp32
    ``.grad`` (1,049,600 B) at CLIP's quick_gelu ``mul``. One stack (the main model's) of dense layers; not the
    state-space families' (their layer backward carries the gradients made before the scan, ``ssm.py``: counted
    here too, Jamba's dense-MLP rows went past their traces by 1.2-1.4%)."""
    from memsim_widget.engine.activations.linears import MLP_OUT

    arch = ctx.arch
    layer = [g for g in groups if g.group.scope == "layer" and g.group.stack not in ctx.frozen_stacks]
    if arch.num_experts or arch.facts.ssm is not None or len({g.group.stack for g in layer}) != 1:
        return [], []
    down = {_module(g.group.name) for g in layer if g.group.module in MLP_OUT and not g.group.expert}
    made = [g for g in layer if _module(g.group.name) in down]
    n = sum(g.numel_each for g in made)
    if not n:
        return [], []
    ec = ctx.recipe.act_bytes
    what = "the top layer's MLP down projection's weight and bias gradients"
    new = Item("gradients", f"{what}, as its matmul makes them", n * ec, f"{fmt_int(n)} params x {ec} B",
               "tensor", len(made))  # fmt: skip
    grad = Item("gradients", f"{what}, made", n * grad_b, f"{fmt_int(n)} params x {grad_b} B", "tensor",
                len(made))  # fmt: skip
    return [new], [grad]


def _module(name: str) -> str:
    """A parameter's module: its name without the last component (``...LayerNorm.bias`` -> ``...LayerNorm``)."""
    return name.rpartition(".")[0]


def _tied_part(numel: int, grad_b: int, what: str) -> Item:
    """One tensor of the tied embeddings' gradient in autograd's input buffer (``one_gpu_backward``)."""
    return Item(
        "gradients",
        f"tied embeddings' gradient: {what}, in autograd's input buffer",
        numel * grad_b,
        f"{fmt_int(numel)} params x {grad_b} B",
        "tensor",
        1,
    )


def tied_head_grad(ctx: Context, stage: Stage, groups: list[LocalGroup], grad_b: int, b: StateBudget) -> None:
    """A tied embedding gets two gradients: the head's ``mm`` backward makes one at the top of backward, which
    autograd holds in the weight's input buffer until the embedding's backward makes the other at the bottom and
    sums them (docs/allocator.md, "Tied embeddings get two gradients"). So from the top of backward to layer 0's
    backward a V x h gradient the engine's gradient groups did not count is live (traced, Mamba-2 bf16 full
    checkpointing b1 s1000 tied: -0.82% -> +0.01%, the trace's [V, h] ``mm`` temporary at its peak); at the
    embedding's backward both stand beside their sum for a moment (``tied_sum``, 2 x V x h beside every
    gradient; traced at V=32000, op add: -11.70% -> +0.00%). Full size: autograd sums before any reduce-scatter;
    under accumulation the sum is then added in place to the carried gradient (one V x h more: not counted)."""
    n = tied_head_grad_numel(ctx, stage.first, stage.last)
    if not n or not any(g.group.kind == "embedding" for g in groups):
        return
    item = Item(
        "gradients",
        "the tied embedding's gradient made by the head (held by autograd until the embedding's backward)",
        n * grad_b,
        f"{fmt_int(n)} params x {grad_b} B (V x h, made at the top of backward)",
        "tensor",
        1,
    )
    b.post_grads.append(item)
    b.grads_but_bottom.append(item)
    b.tied_sum = [
        Item(
            "gradients",
            "the tied embedding's two gradients (the head's and its own) beside their sum",
            2 * n * grad_b,
            f"2 x {fmt_int(n)} params x {grad_b} B (summed out of place at the embedding's backward)",
            "tensor",
            2,
        )
    ]


def new_gradient(largest: int, grad_b: float, what: str = "") -> Item:
    """A layer's new gradient while an earlier micro-batch's is alive: ``AccumulateGrad`` makes it apart and
    adds it to the parameter's ``.grad`` in place, so the largest layer parameter's new gradient is a
    transient at the top of a backward whose gradients are carried (a pipeline stage's later micro-batches
    without data parallelism; under FSDP2 the unsharded ones: ``gathered._pipeline_new_grads``). Traced
    (docs/fidelity-parallel.md): the top layer's down-projection weight gradient (4,096 x 14,336 bf16), the
    first of its backward, beside the accumulation on a middle stage of a plain 1F1B [2, 2, 2] split and on
    stage 0 of pp 2 x dp 2 without reshard after forward."""
    return Item(
        "gradients",
        "a new gradient before it is added to the accumulated one",
        int(largest * grad_b),
        what or f"largest layer param {fmt_int(largest)} x {grad_b} B",
        "tensor",
        1,
    )


def _new_embedding_grad(n_pre: int, grad_b: int, g_div: int) -> Item:
    """A first stage of no layer (``parallel.pp_layers`` [0, ...]): the bottom of its backward is the
    embedding's, where ``embedding_dense_backward`` makes a new full gradient while the gradient of the earlier
    micro-batches is alive, then ``AccumulateGrad`` adds it in place (traced: tests/data
    fidelity_parallel_cases). The timeline keeps it only where more than one micro-batch runs backward
    in a step (the first one's is kept as ``.grad``)."""
    return Item(
        "gradients",
        "the embeddings' new gradient, before it is added to the accumulated one",
        n_pre * grad_b // g_div,
        f"{fmt_int(n_pre)} params x {grad_b} B{shard_note(g_div, 'ZeRO-2 dp shard')}",
        "tensor",
        1,
    )


def _loss_grads(ctx: Context, stage: Stage, b: StateBudget) -> None:
    """The gradients alive at the last stage's latest loss backward: on an interleaved rank whose other
    chunks run every backward after its last loss (``Context.loss_grad_layers``), all but those chunks'
    layers' gradients; every gradient otherwise."""
    missing = stage.layers - ctx.loss_grad_layers(stage)
    if missing <= 0 or not b.grads or ctx.scenario.optimizer_in_backward or grads_on_host(ctx):
        b.loss_grads = list(b.grads)
        return
    g = b.grads[0]
    gone = int(b.grad_bytes_per_layer * missing)
    b.loss_grads = [
        Item(
            g.category,
            "gradients of the chunks whose backward ran (the others' after the last loss)",
            max(0, g.bytes - gone),
            f"{g.formula} - {missing} layers' gradients (backward after the last loss)",
            g.level,
            max(1, g.tensors - g.tensors * missing // max(stage.layers, 1)),
        ),
        *b.grads[1:],
    ]


def partial_embedding_grad(
    ctx: Context, stage: Stage, groups: list[LocalGroup], grad_b: int, b: StateBudget
) -> None:
    """A vocab-sharded (DTensor ``Shard(0)``) untied input embedding gets a full-vocabulary gradient.

    DTensor's ``embedding_dense_backward`` has no strategy that shards the weight gradient by rows: it is
    ``Partial`` with a full V x h local tensor (torch 2.13 ``distributed/tensor/_ops/_embedding_ops.py``
    ``embedding_dense_backward_strategy``), and ``AccumulateGrad`` keeps it as the parameter's ``.grad``
    until ``zero_grad``. Without FSDP nothing redistributes it, so each rank holds ``tp`` times its shard's
    gradient (traced: docs/fidelity-parallel.md). Megatron's ``VocabParallelEmbedding`` is not a DTensor."""
    par = ctx.par
    fsdp = par.zero >= 3 and par.dp * par.cp > 1
    if not (
        stage.first
        and embedding_split(ctx)
        and tp_plan(ctx.scenario) != "megatron"
        and not fsdp
        and not ctx.arch.tied_embeddings
        and ctx.full_training
        and not ctx.scenario.optimizer_in_backward
    ):
        return
    emb = [g for g in groups if g.group.kind == "embedding" and g.group.stack not in ctx.frozen_stacks]
    local = sum(g.numel for g in emb)
    if local:
        b.grads.append(
            Item(
                "gradients",
                PARTIAL_EMBEDDING_ITEM,
                local * (par.tp - 1) * grad_b,
                f"{fmt_int(local)} params x ({par.tp} - 1) x {grad_b} B (beyond the Shard(0) share)",
                "tensor",
                1,
            )
        )


def reduce_bucket(ctx: Context, n_train: int, b: StateBudget) -> None:
    """DeepSpeed ZeRO-1/2's gradient reduce buffer: ``reduce_bucket_size`` elements in the weight dtype, whatever
    the number of trainable parameters (deepspeed 0.19.8 ``stage_1_and_2.setup_buckets``: ``torch.empty(
    int(self.reduce_bucket_size))`` at each backward's first gradient; a CPU run of the real optimizer on a 44M
    model allocates 1,000,000,000 B, ``benchmarks/zero_trace.py``); two of them under ``overlap_comm``
    (``reduce_buffers``; traced the same way: 2 x 1,000,000,000 B). ZeRO-3's ipg bucket, one, made at
    ``__init__`` and kept (``stage3.py``; traced the same way, ``zero_trace.py --stage 3``)."""
    sc, recipe = ctx.scenario, ctx.recipe
    bucket = reduce_bucket_elements(ctx) if n_train else 0
    if bucket and not sc.optimizer_in_backward:
        k = reduce_buffers(ctx)
        two = f"{k} buffers (overlap_comm) x " if k > 1 else ""
        b.persistent.append(
            Item(
                "gradients",
                ZERO_BUCKET_ITEM,
                k * bucket * recipe.weight_bytes,
                f"{two}{fmt_int(bucket)} elements (reduce_bucket_size, for any of the {fmt_int(n_train)} trainable "
                f"parameters) x {recipe.weight_bytes} B (ipg_buffer, traced on CPU)",
                "tensor",
                1,
            )
        )


def offload_staging(ctx: Context, tr: Trained, b: StateBudget) -> None:
    """DeepSpeed ZeRO-1/2 under ``offload_optimizer`` keeps ``temp_grad_buffer_for_gpu_offload`` on the GPU for
    good: the largest trainable parameter's elements in the model's dtype, made at ``__init__`` (deepspeed 0.19.8
    ``stage_1_and_2.py``; the accumulation copies the host's gradient back through it). Written by the stream too
    (``zero_offload_stream.ZeroOffloadWriter.wrap``, traced on CPU)."""
    par = ctx.par
    if not (par.offload == "optimizer" and par.zero in (1, 2) and profile(ctx).bucket_elements > 0):
        return
    if ctx.scenario.optimizer_in_backward or not tr.n:
        return
    largest = max(e for _, _, e in tr.entries)
    wb = ctx.recipe.weight_bytes if ctx.full_training else tr.grad_b
    b.persistent.append(
        Item(
            "gradients",
            OFFLOAD_STAGING_ITEM,
            largest * wb,
            f"largest trainable param {fmt_int(largest)} x {wb} B (kept from the wrap)",
            "tensor",
            1,
        )
    )
