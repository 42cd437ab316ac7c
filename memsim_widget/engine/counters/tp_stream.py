"""A tensor-parallel rank's own buffers in the allocation stream (``alloc_stream``): DTensor TP as transformers'
plan (``tp_plan`` "hf") or torchtitan's (``tp_plan`` "torchtitan": pytorch/torchtitan
``torchtitan/models/llama3/infra/parallelize.py`` ``apply_tp``, commit 018740b7) applies it, one rank of a tp-way
group, with or without sequence parallel, alone or under FSDP2 on the dp dimension (``fsdp_stream`` writes
FSDP2's buffers over the TP shards).

Read in torch 2.13.0 and restated here (nothing copied):

- Which CUDA stream. The functional collectives DTensor calls (``torch/distributed/_functional_collectives.py``:
  ``all_reduce``, ``all_gather_tensor``, ``reduce_scatter_tensor``, through ``torch.ops._c10d_functional``)
  allocate their outputs in ``torch/csrc/distributed/c10d/Functional.cpp``: ``all_reduce`` clones its input
  (``input.clone(at::MemoryFormat::Contiguous)``) and reduces the clone in place, ``all_gather_into_tensor``
  makes ``at::empty`` of world x the input; both on the calling thread's current stream, the compute stream
  (NCCL runs the work on its own stream and records the tensors on it; the caching allocator caches a block
  on the stream it was allocated on). ``wait_tensor`` returns its input (no allocation on the device; its fake
  kernel makes a new tensor, which ``trace/tracker.py`` counts as the input, ``_ALIASING_WAITS``). So every TP
  buffer is on stream 0, as the trace of a TP rank shows.
- A rowwise Linear (``o_proj``, ``down_proj``: ``RowwiseParallel``, output ``Replicate``): its local matmul
  makes the partial sums (T x h), the redistribution Partial -> Replicate all-reduces a clone of them, the
  partial sums are freed once the clone is made, the clone is the layer's output
  (``engine/activations/forward.layer_forward_transients`` writes the pair).
- The head under the "hf" plan (``colwise_gather_output``: output ``Replicate`` on the last dimension): the
  local logits T x V/tp, the all-gather's output (tp x T x V/tp, gathered on dim 0), the logits T x V made by
  the concatenation that moves the gathered dimension last; the gather's output and the local logits freed
  then, before the loss upcasts. In backward the logits' gradient is cut back to the rank's columns: a
  contiguous copy T x V/tp (``clone``), the full gradient freed once it is made.

- torchtitan's plan: its layers are transformers' plan with sequence parallel (``SequenceParallel`` norms,
  ``PrepareModuleInput`` Shard(1) -> Replicate, rowwise outputs Shard(1)); its embedding ``RowwiseParallel``
  (vocab-sharded, untied: the whole table's Partial gradient, ``whole_table_grads``); its head keeps the
  logits vocab-sharded under loss parallel (nothing gathered; the loss's buffers are the engine's loss items at
  V/tp), else gathers them as above. ``SequenceParallel`` makes the norms' weights Replicate DTensors
  (``torch/distributed/tensor/parallel/style.py``, ``_replicate_module_fn``): ``optimizer_groups``.

Held to the fake-tensor trace of one TP rank (``trace/distributed.py``) replayed the same way
(``python benchmarks/allocator_replay_tp.py``, docs/allocator.md "Tensor parallel ranks").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memsim_widget.engine.items import ALLOCATED_LEVELS

#: The key of ``alloc_stream.step_stream``'s activation groups holding the head's gather under the "hf" plan:
#: ``(tp,)`` (``head_gather``); absent or empty: the head makes the logits itself.
HEAD_GATHER = "head_gather"
#: The key of the factor the input embedding's gradient has over its shard: ``(tp,)`` where TP shards the
#: embedding's vocabulary (``embedding_grad``); absent: 1.
EMBEDDING_GRAD = "embedding_grad"


def head_gather(ctx: Any) -> tuple[int, ...]:
    """``(tp,)`` when the rank's head gathers the full logits (tp > 1, the vocabulary not split: transformers'
    ``colwise_gather_output``), else ()."""
    from memsim_widget.engine.frameworks import vocab_split

    return (ctx.par.tp,) if ctx.par.tp > 1 and not vocab_split(ctx) else ()


def gather_logits(s: Any, at: int, tp: int) -> None:
    """Write the head's gather around the logits the stream ``s`` (``alloc_stream.StreamWriter``) has just
    allocated as event ``at``: before them the local logits (1/tp of their size) and the all-gather's output
    (their size), after them both freed, the gather's first (as the trace frees them)."""
    ev = s.events
    logits, rest = ev[at], ev[at + 1 :]
    del ev[at:]
    size = logits[1]
    local = s.alloc(max(size // tp, 1))
    gathered = s.alloc(size)
    ev.append(logits)
    s.free(gathered + local)
    ev += rest


def scatter_gradient(s: Any, grad_logits: list[int], tp: int) -> list[int]:
    """Backward of the gather: the logits' gradient cut to the rank's columns (a contiguous T x V/tp copy), the
    full gradient freed; the handles of the copy."""
    if not grad_logits:
        return grad_logits
    local = [h for g in grad_logits for h in s.alloc(max(s.size(g) // tp, 1))]
    s.free(grad_logits)
    return local


def embedding_grad(ctx: Any) -> tuple[int, ...]:
    """``(tp,)`` where TP shards the input embedding by vocabulary (``frameworks.embedding_split``: torchtitan's
    ``RowwiseParallel`` embedding, or transformers' plan on a tied one), else ``(1,)``. DTensor's
    ``embedding_dense_backward`` makes the gradient of the whole V x h table on every rank (traced: 501 MiB on
    llama-3.2-1b at tp 4, whose shard is 125 MiB); the rank's shard is a slice of it, so untied it holds the
    whole table's storage until ``zero_grad`` frees it, tied it is freed once added to the head's gradient."""
    from memsim_widget.engine.frameworks import embedding_split

    return (ctx.par.tp,) if ctx.par.tp > 1 and embedding_split(ctx) else (1,)


def whole_table_grads(ctx: Any, sg: dict[str, Sequence[Any]], numels: tuple[int, ...]) -> dict[str, Any]:
    """The state groups ``sg`` as the stream writes them for a rank whose untied embedding TP shards by
    vocabulary without FSDP (torchtitan's ``RowwiseParallel`` embedding): the gradients item beyond the shard
    (``states/gradients.PARTIAL_EMBEDDING_ITEM``, ``(tp - 1)`` shards) left out, so that the gradients are one
    tensor per parameter and the stream writes the embedding's as the whole V x h table it is
    (``EMBEDDING_GRAD``: ``embedding_dense_backward``'s Partial output, one tensor, ``tp`` shards: traced); the
    same bytes. ``sg`` unchanged where the rest is not one item of one tensor per parameter."""
    from memsim_widget.engine.states.gradients import PARTIAL_EMBEDDING_ITEM

    grads = sg.get("grads", ())
    rest = [i for i in grads if i.item != PARTIAL_EMBEDDING_ITEM]
    pooled = [i for i in rest if i.level in ALLOCATED_LEVELS and i.bytes > 0]
    if len(rest) == len(grads) or embedding_grad(ctx) == (1,):
        return sg
    if len(pooled) != 1 or pooled[0].tensors != len(numels):
        return sg
    return {**sg, "grads": rest}


def weights_by_param(s: Any, first: Sequence[Any], params: tuple[int, ...]) -> bool:
    """Write the weights ``first`` (the persistent items before the first optimizer step) into ``s`` one tensor
    at a time in the module's parameter order (``params``, each tensor's elements), as the model is built and
    DTensor's ``distribute_tensor`` makes each local shard: a layer's q, k, v and o shards, its MLP's, its
    norms, where the engine's items group them by kind (one size per item). Only where the items are the
    parameters at one width (their tensors one per parameter, their bytes a whole number per element); False,
    writing nothing, otherwise."""
    pooled = [i for i in first if i.level in ALLOCATED_LEVELS and i.bytes > 0]
    total = sum(params)
    if not pooled or not total or sum(max(i.tensors, 1) for i in pooled) != len(params):
        return False
    width, rest = divmod(sum(i.bytes for i in pooled), total)
    if rest:
        return False
    for x in params:
        s.alloc(x * width)
    return True


def tp_replayable(ctx: Any, sharded: bool = False) -> bool:
    """Whether the stream models the scenario's TP rank: tp > 1 and no other parallelism (dp = pp = cp = ep =
    1; ``sharded``: any dp, ``replayable.replayable`` asking ``fsdp2_replayable`` of the dp dimension),
    transformers' plan (``frameworks.tp_plan`` "hf": the head gathers the logits) or torchtitan's ("torchtitan",
    ``apply_tp``: the embedding vocab-sharded, the logits kept sharded under loss parallel, else gathered), with or
    without sequence parallel, one micro-batch a step, eager, full training of a Llama-style layer whose
    forward the stream writes (``activations/forward``'s layout, checkpointing none or full; Megatron's kernels
    are not written): the cases held to the trace of a TP rank within 1% (docs/allocator.md "Tensor parallel
    ranks")."""
    from memsim_widget.engine.activations.forward import llama_layout
    from memsim_widget.engine.frameworks import tp_plan

    p, sc = ctx.par, ctx.scenario
    return (
        p.tp > 1
        and p.pp * p.cp * p.ep == 1
        and (p.dp == 1 or sharded)
        and tp_plan(sc) in ("hf", "torchtitan")
        and sc.grad_accum_steps == 1
        and not sc.compile
        and ctx.full_training
        and sc.activation_checkpointing in ("none", "full")
        and llama_layout(ctx)
    )


def tp_note(ctx: Any) -> str:
    """What the replayed reserved's formula says of a TP rank's buffers (``alloc_stream.replayed_item``)."""
    from memsim_widget.engine.frameworks import loss_parallel

    if ctx.par.tp == 1:
        return ""
    head = (
        "the vocab-sharded logits and loss (loss parallel)"
        if loss_parallel(ctx.scenario)
        else "the head's gathered logits"
    )
    return (
        f" (TP's all-reduced Linear outputs and {head} on the compute stream: torch 2.13's functional "
        "collectives, traced on CPU)"
    )


def _sequence_parallel_norm(g: Any) -> bool:
    """A norm the traced plans wrap in ``SequenceParallel`` under sequence parallel (the layers' two and the final
    one: ``trace/tp_plan._layer_plan``, ``_root_plan``), which makes its weight a Replicate DTensor (torch 2.13
    ``tensor/parallel/style.py`` ``SequenceParallel._replicate_module_fn``); not Qwen3's per-head q/k norms,
    which the plans leave plain."""
    return g.kind == "norm" and not g.name.endswith(("q_norm.weight", "k_norm.weight"))


def optimizer_groups(ctx: Any, stage: Any) -> tuple[tuple[int, ...], ...]:
    """The optimizer's parameter groups of a TP rank as indices into the module's parameter order
    (``alloc_stream.grad_order``'s ``params``), where a foreach optimizer gets one group of DTensors and one of
    plain tensors (transformers' plan leaves an untied embedding and the norms plain; torch's foreach ops refuse
    a group that mixes them, so the traced run makes a group per kind in the order their first parameter comes:
    ``trace/run.param_groups``; the engine's step buffer is the larger group's, ``states/optimizer``): each
    group makes its states and runs its step in turn. () where the parameters are one group."""
    from memsim_widget.engine.states.budget import local_groups, tp_split

    p, sc = ctx.par, ctx.scenario
    fsdp = p.zero >= 3 and p.dp * p.cp > 1  # FSDP2 makes every parameter a DTensor
    if p.tp == 1 or fsdp or not ctx.full_training or sc.optimizer_impl != "foreach":
        return ()
    pre: list[bool] = []
    layer: list[bool] = []
    post: list[bool] = []
    layers = max(stage.layers, 1)
    sp = p.sequence_parallel
    for lg in local_groups(ctx, stage):
        g = lg.group
        split = tp_split(ctx, g) or (sp and _sequence_parallel_norm(g))
        if g.scope == "layer":
            layer += [split] * max(lg.count // layers, 1)
        else:
            (pre if g.scope == "pre" else post).extend([split] * lg.count)
    flags = pre + layer * stage.layers + post
    if all(flags) or not any(flags):
        return ()
    order = list(dict.fromkeys(flags))  # the kind of the first parameter first
    return tuple(tuple(j for j, f in enumerate(flags) if f == kind) for kind in order)
