"""The model-state items of one rank (``StateBudget``, sorted by when they are alive) and the parameter groups a
rank holds after tensor and expert parallelism (``LocalGroup``)."""

from __future__ import annotations

import math
from dataclasses import field

from memsim_widget.architecture import ParamGroup
from memsim_widget.engine.context import Context, Stage
from memsim_widget.engine.frameworks import embedding_split, head_copy
from memsim_widget.engine.items import Item
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.scenario import ParallelConfig


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
    # a tied embedding's backward: its own and the head's gradient beside their sum (states/gradients.tied_head_grad)
    tied_sum: list[Item] = field(default_factory=list)
    # those alive at the last stage's latest loss backward (an interleaved rank: its loss chunk's only)
    loss_grads: list[Item] = field(default_factory=list)
    gathered: list[Item] = field(default_factory=list)  # ZeRO-3 gathered units (forward/backward)
    # ... while the loss runs, where it differs (DeepSpeed's coordinator: frameworks.deepspeed_zero3_coordinated)
    gathered_loss: list[Item] = field(default_factory=list)
    gathered_grads: list[Item] = field(default_factory=list)  # ZeRO-3 unsharded grads of a unit (backward)
    # FSDP2's reduce-scatter of the root unit (last in backward): its unsharded gradients and the reduce
    # input, beside every gradient but the root's own shard (empty without FSDP2 on a root)
    root_reduce: list[Item] = field(default_factory=list)
    # FSDP2's root unit re-gathered at the start of backward (resharded after forward): the unsharded root
    # and its all-gather output, before the next all-gather frees the latter
    root_regather: list[Item] = field(default_factory=list)
    grads_but_root: list[Item] = field(default_factory=list)
    root_reduce_out: list[Item] = field(default_factory=list)  # ... later: the input and the output
    # FSDP2 at the bottom of backward: the root unit's unsharded gradients, all made
    root_made: list[Item] = field(default_factory=list)
    # FSDP2 without reshard after forward: the unsharded layers kept from their forward to their backward --
    # all but the last layer (which becomes the layer in backward) and that last one
    kept_unsharded: list[Item] = field(default_factory=list)
    kept_unsharded_last: list[Item] = field(default_factory=list)
    # a pipeline over FSDP2 (gathered.pipeline_fsdp2): the stage's unsharded gradients accumulated over the
    # micro-batches (the gradients of every backward moment; ``grads`` stays the step's sharded ones) and
    # the layers kept gathered after their backward (at the bottom of backward)
    accumulated_grads: list[Item] = field(default_factory=list)
    kept_after_backward: list[Item] = field(default_factory=list)
    gathered_next: list[Item] = field(default_factory=list)  # ... GPipe's later backwards: all still gathered
    prefetched: list[Item] = field(default_factory=list)  # ... the next layer's all-gather output (top only)
    # ... the new gradient before AccumulateGrad adds it: at a carried backward's top, at GPipe's later ones
    new_grad: list[Item] = field(default_factory=list)
    new_grad_next: list[Item] = field(default_factory=list)
    chunk_gathered: list[Item] = field(default_factory=list)  # ... a chunk's layer and the other chunks'
    # one GPU (gradients.one_gpu_backward): the gradients alive when the head's weight gradient is made (one
    # micro-batch a step, and a later one of an accumulating step); the tied head's part of the embeddings'
    # gradient, waiting in autograd's buffer from the head to the embeddings; the tensors the bottom of
    # backward makes beside every gradient (one micro-batch, a later one); every gradient at layer 0's backward
    # of a later micro-batch
    head_made: list[Item] = field(default_factory=list)
    head_made_carried: list[Item] = field(default_factory=list)
    #: one GPU, eager attention: the top layer's gradients made before its attention's backward runs
    top_layer_made: list[Item] = field(default_factory=list)
    #: one GPU: the top layer's MLP down projection's weight and bias gradients, as its matmul makes them (the
    #: compute dtype: ``top_down_new``) and as its ``.grad`` once made (the gradient's dtype: ``top_down_made``)
    top_down_new: list[Item] = field(default_factory=list)
    top_down_made: list[Item] = field(default_factory=list)
    tied_head_part: list[Item] = field(default_factory=list)
    bottom_new: list[Item] = field(default_factory=list)
    bottom_new_carried: list[Item] = field(default_factory=list)
    grads_at_bottom_carried: list[Item] = field(default_factory=list)
    step_temps: list[Item] = field(default_factory=list)
    # ... as the step's moment meets them where it steps apart (DeepSpeed ZeRO-3: the inner optimizer on one sub
    # group's flat partition at a time, states/gathered._grad_partitions); empty: ``step_temps``
    step_temps_sub: list[Item] = field(default_factory=list)
    host: list[Item] = field(default_factory=list)
    grad_bytes_per_layer: float = 0.0
    pre_post_grad_bytes: int = 0
    largest_grad_bytes: int = 0
    trainable_local: int = 0
    params_local: int = 0


def tp_split(ctx: Context, g: ParamGroup) -> bool:
    """Whether the tensor-parallel plan splits this parameter group (a DTensor sharded over tp; experts only
    when expert parallelism leaves part of the TP group to split them: ``ParallelConfig.expert_tp``)."""
    ways = ctx.par.expert_tp if g.expert else ctx.par.tp
    return g.tp_dim is not None and ways > 1 and (g.kind != "embedding" or embedding_split(ctx))


def fused_experts(count: int, shape: list[int], experts: int, ep: int) -> tuple[int, list[int]]:
    """A routed-experts group's ``count`` tensors of ``shape`` (MoE layers x ``experts`` on the stage, one tensor
    per expert as the Architecture lists them) as the rank holds them: one fused tensor per MoE layer of its
    ``experts / ep`` experts, [E/ep, *shape]. transformers 5.24.0 stores a layer's routed experts as one
    ``nn.Parameter`` per projection (``models/qwen3_moe/modeling_qwen3_moe.py`` ``Qwen3MoeExperts``:
    ``gate_up_proj`` [E, 2I, h], ``down_proj`` [E, h, I]; ``models/mixtral/modeling_mixtral.py`` the same), so its
    gradient, optimizer states and their step temporaries are one tensor each, not E. Where the count is not
    whole layers of experts (a pipeline stage cutting the MoE layers unevenly), per expert, ``ep`` dividing the
    count."""
    if experts and count % experts == 0 and experts % ep == 0:
        return count // experts, [experts // ep, *shape]
    return count // ep, shape


def per_layer_tensors(numel: int, count: int, layers: int) -> list[int]:
    """One layer's share of a layer group's ``count`` tensors of ``numel`` elements over ``layers`` layers: its
    whole tensors, and where the count is not a multiple of the layers (a hybrid stack: MoE at every other layer,
    Mamba at three of four, a dense first layer) the rest spread over the layers as one tensor of that share, so
    that the layers hold the group's elements, not a whole tensor each (the fused experts of two MoE layers of
    four were written as four)."""
    whole, rest = divmod(count, layers)
    return [numel] * whole + ([numel * rest // layers] if rest else [])


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
        shape = list(g.shape)
        if tp_split(ctx, g) and g.tp_dim is not None:  # tp_split holds only with a tp_dim
            ways = par.expert_tp if g.expert else par.tp  # EP folded over the TP group: whole experts
            shape[g.tp_dim] = -(-shape[g.tp_dim] // ways)
        if g.expert:
            count, shape = fused_experts(count, shape, arch.num_experts, par.ep)
        if count:
            out.append(LocalGroup(g, count, math.prod(shape), tuple(shape)))
    # Tied input/output embeddings with pp > 1 (the last stage keeps its own copy for the head), or a framework
    # that unties them (engine/frameworks.head_copy)
    if head_copy(ctx, stage.first, stage.last):
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


def shard_why(par: ParallelConfig, stage: str) -> str:
    """The words of a ZeRO shard note: "ZeRO-3 dp shard", or under hybrid sharding the shard group and its
    replicas ("ZeRO-3 shard group, dp_shard 4 x 2 replicas")."""
    if par.dp_replicate > 1:
        return f"{stage} shard group, dp_shard {par.dp_shard} x {par.dp_replicate} replicas"
    return f"{stage} dp shard"


def shard_note(divisor: int, why: str) -> str:
    """`` / N (why)`` for a formula when a state is sharded N ways, else nothing."""
    return f" / {divisor} ({why})" if divisor > 1 else ""
