"""peft's LoRA under DeepSpeed ZeRO-1/2 and ZeRO-3, for the allocation stream (``engine/counters/alloc_stream.py``):
the frozen base beside the adapters, the only parameters that require a gradient. The ZeRO writers
(``zero_stream.ZeroWriter``, ``zero3_stream.Zero3Writer``) run unchanged on what this module hands them.

Source: deepspeed 0.19.8 (restated, nothing copied) and peft's ``LoraLayer`` (``lora_A`` registered before
``lora_B``, both after ``base_layer``; A is r x in, B out x r), held to CPU runs of the real engine with a peft
model (``benchmarks/zero_trace.py --lora 16 --targets qv|all``, PyTorch's fake process group; docs/allocator.md):

- **ZeRO-1/2** (``runtime/zero/stage_1_and_2.py``, ``DeepSpeedZeroOptimizer.__init__``: ``trainable_parameters``
  of each group are those with ``requires_grad``; an empty group, HF Trainer's no-decay group once the norms
  are frozen, gets no flat buffer): the frozen base stays as the module's bf16 parameters, unpartitioned and
  untouched; only the adapters are flattened into the group's buffer and partitioned, with their fp32 master
  partition, ipg buffer, ``grads_in_partition`` and step, as ``zero_stream`` writes a full model's. Before
  that ``runtime/engine.py`` (``_configure_distributed_model``, ``_cast_module_mixed_precision``) casts every
  parameter not yet in bf16 to bf16 (``p.data = p.data.to(bf16)``): peft's fp32 adapters
  (``autocast_adapter_dtype``, the default) are copied to bf16 one by one in module order, each fp32 one freed.
  Only the adapters' gradients are made (autograd's ``AccumulateGrad`` runs for parameters that require one),
  in backward order: the output side, each layer's from the top in reverse forward use, the input side.
- **ZeRO-3** (read, not written yet: ``zero3_replayable`` keeps the fitted rule under LoRA): HF's
  ``from_pretrained`` partitions the base under ``zero.Init`` and peft adds the adapters after it as ordinary
  tensors, which ``deepspeed.initialize`` partitions (``runtime/zero/parameter_offload.py``,
  ``DeepSpeedZeRoOffload._convert_to_zero_parameters``); the engine does not cast them (a ``zero.Init`` model:
  ``_cast_module_mixed_precision`` skips it), so peft's fp32 adapters stay fp32 and their flat buffer
  (``fp16_partitioned_groups_flat``) is fp32 too; ``create_reduce_and_remove_grad_hooks`` gathers only the
  adapters; the frozen base keeps its per-parameter partitions and is gathered and released as a full model's;
  the adapters, under ``stage3_param_persistence_threshold`` elements at these ranks, are persisted (traced:
  ``benchmarks/zero_trace.py --stage 3 --lora 16``).

Not modelled (the fitted rule stays): ZeRO-3 (above), QLoRA under DeepSpeed, a frozen stack. The engine's
activations still count peft's fp32 input copies of fp32 adapters (``activations/layer.py``), which
DeepSpeed's cast removes under ZeRO-1/2: +1.75% on reserved for all-linear LoRA against its trace.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

#: the engine's item of the adapters' weights (``engine/states/trained.trainable``)
ADAPTER_ITEM = "LoRA adapter weights"


def adapter_tensors(ctx: Any, stage: Any) -> tuple[list[int], list[int], list[int], list[int]]:
    """The adapters' tensors (elements, A then B of each targeted Linear) of ``stage``'s rank: the input side's,
    one layer's and the output side's in module order, and the indices into the layer's of the order backward
    makes their gradients (the reverse of forward use, ``ddp_stream.layer_use_order``; B before A)."""
    from memsim_widget.engine.counters.ddp_stream import layer_use_order
    from memsim_widget.engine.states.budget import local_groups

    adapters = {ad.base.name: ad for ad in ctx.adapters}
    layers = max(stage.layers, 1)
    pre: list[int] = []
    post: list[int] = []
    body: list[tuple[str, list[int]]] = []
    for lg in local_groups(ctx, stage):
        ad = adapters.get(lg.group.name)
        ab = [ad.rank * ad.in_features, ad.out_features * ad.rank] if ad is not None else []
        if lg.group.scope == "layer":
            body.append((lg.group.name, ab * max(lg.count // layers, 1)))
        else:
            (pre if lg.group.scope == "pre" else post).extend(ab * lg.count)
    starts = [sum(len(ab) for _, ab in body[:i]) for i in range(len(body))]
    use = [starts[i] + j for i in layer_use_order([n for n, _ in body]) for j in range(len(body[i][1]))]
    return pre, [t for _, ab in body for t in ab], post, use[::-1]


def lora_zero12(ctx: Any, stage: Any) -> tuple[tuple[int, ...], Any, Any]:
    """A ZeRO-1/2 rank under LoRA as ``alloc_stream.step_stream`` takes it: the adapters' tensors in module order
    (the only parameters with gradients, so ``numels``), their ``GradOrder`` (the output side's on top, each
    layer's, the input side's at the bottom) and the ``ZeroRank`` of one optimizer group of them (HF Trainer's
    no-decay group is empty: the norms are frozen), the adapters made in ``lora.adapter_dtype`` and cast to the
    model's dtype at the wrap (``ZeroRank.cast_from``)."""
    from memsim_widget.engine.counters.alloc_stream import GradOrder
    from memsim_widget.engine.counters.zero_stream import zero_rank
    from memsim_widget.engine.frameworks import reduce_bucket_elements, reduce_buffers

    pre, layer, post, back = adapter_tensors(ctx, stage)
    module = pre + layer * stage.layers + post
    order = GradOrder(tuple(post[::-1]), tuple(layer[j] for j in back), tuple(pre[::-1]), 0, tuple(module))
    at = len(pre) + stage.layers * len(layer)  # the output side's first
    ready = [at + j for j in range(len(post) - 1, -1, -1)]
    for k in range(stage.layers - 1, -1, -1):
        ready += [len(pre) + k * len(layer) + j for j in back]
    ready += list(range(len(pre) - 1, -1, -1))
    z = zero_rank(
        [module],
        [(0, t) for t in ready],
        ctx.par.dp,
        ctx.recipe.weight_bytes,
        0,
        reduce_bucket_elements(ctx),
        reduce_buffers(ctx),
        ctx.par.zero >= 2,
    )
    return tuple(module), order, replace(z, cast_from=ctx.adapter_bytes)


def lora_cast(s: Any, z: Any, made: list[list[int]]) -> list[int]:
    """``_cast_module_mixed_precision`` on the adapters ``made`` (handles, one tensor each in module order, in
    ``z.cast_from`` bytes per element): each not in the model's dtype copied to it, the old one freed; the
    adapters' handles after it."""
    if z.cast_from == z.model_bytes:
        return [h for hs in made for h in hs]
    out: list[int] = []
    for n, old in zip(z.groups[0], made, strict=True):
        out += s.alloc(n * z.model_bytes)
        s.free(old)
    return out
