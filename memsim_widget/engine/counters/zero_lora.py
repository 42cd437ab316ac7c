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
- **ZeRO-3** (written by ``lora_zero3_units``, replayed by default with bf16 adapters:
  ``replayable.zero3_lora_modelled``): HF's
  ``from_pretrained`` partitions the base under ``zero.Init`` and peft adds the adapters after it as ordinary
  tensors, which ``deepspeed.initialize`` partitions (``runtime/zero/parameter_offload.py``,
  ``DeepSpeedZeRoOffload._convert_to_zero_parameters``, before ``mark_persistent_parameters``: the adapters,
  under ``stage3_param_persistence_threshold`` elements at these ranks, persist); the engine does not cast a
  ``zero.Init`` model (``_cast_module_mixed_precision`` skips it), so peft's fp32 adapters stay fp32: their partitions,
  flat buffer, gathers and gradients fp32, their master the fp32 partitions' clone alone, the ipg bucket and the
  gradient partitions' buffer bf16 (``Zero3Units.train_bytes``; held to ``--adapter fp32`` runs). ``stage3.py`` (``_create_fp16_partitions_with_
  defragmentation``, ``_setup_for_real_optimizer``: the optimizer's parameters, the adapters, alone) flattens the
  adapters' partitions into ``fp16_partitioned_groups_flat`` and the gradient partitions' buffer, with masters
  and states for them alone; ``create_reduce_and_remove_grad_hooks`` gathers only them; the frozen base keeps
  its per-parameter partitions (``ds_tensor``) and is gathered and released as a full model's. Autograd never
  reaches a frozen embedding, so its module has no backward: the coordinator's recorded order has it in the
  forward alone, released after it and not fetched again (``Zero3Units.bottom_backward``). ZeRO-3's replaced
  ``F.linear`` keeps every Linear's input, a frozen one's too (``context.deepspeed_zero3_linear``): an activation
  rule (``activations/layer.HFLayer.frozen_input``), not this module's.

The engine's activations and states run the adapters in the dtype the cast leaves them
(``context.deepspeed_casts_adapters``, ``Context.adapter_bytes``: no fp32 copy of an adapter's input); only the
wrap here writes them as peft makes them (``Context.peft_adapter_bytes``) and the cast. Not modelled (the fitted
rule stays): QLoRA under DeepSpeed, LoRA with the optimizer offloaded under ZeRO-3, a frozen stack.
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


def lora_zero12(ctx: Any, stage: Any) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], Any]:
    """A ZeRO-1/2 rank under LoRA as ``alloc_stream.step_stream`` takes it: the adapters' tensors in module order
    (the only parameters with gradients, so ``numels``), the fields of their ``alloc_stream.GradOrder`` (the output
    side's on top, one layer's in backward order, the input side's at the bottom, the module order) and the
    ``ZeroRank`` of one optimizer group of them (HF Trainer's no-decay group is empty: the norms are frozen), the
    adapters made in ``lora.adapter_dtype`` (``Context.peft_adapter_bytes``) and cast to the model's dtype at the
    wrap (``ZeroRank.cast_from``)."""
    from memsim_widget.engine.counters.zero_stream import zero_rank
    from memsim_widget.engine.frameworks import reduce_bucket_elements, reduce_buffers

    pre, layer, post, back = adapter_tensors(ctx, stage)
    module = pre + layer * stage.layers + post
    order = (tuple(post[::-1]), tuple(layer[j] for j in back), tuple(pre[::-1]), tuple(module))
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
    return tuple(module), order, replace(z, cast_from=ctx.peft_adapter_bytes)


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


def lora_zero3_units(ctx: Any, stage: Any) -> Any:
    """``zero3_stream.Zero3Units`` of ``stage``'s ZeRO-3 rank under LoRA: every tensor in module order, each
    targeted Linear's base then its adapters (A, then B), the one optimizer group the adapters (HF Trainer's
    no-decay group is empty once the norms are frozen): the coordinator gathers and releases the base and the
    adapters alike, the writer makes gradients, flat buffers and masters for the group alone."""
    from memsim_widget.engine.counters.zero3_stream import zero3_units
    from memsim_widget.engine.states.budget import local_groups

    full = zero3_units(ctx, stage)
    adapters = {ad.base.name: ad for ad in ctx.adapters}
    layers = max(stage.layers, 1)
    sides: dict[str, list[tuple[int, bool]]] = {"pre": [], "layer": [], "post": []}
    for lg in local_groups(ctx, stage):
        ad = adapters.get(lg.group.name)
        one = [(lg.numel_each, False)]
        if ad is not None:
            one += [(ad.rank * ad.in_features, True), (ad.out_features * ad.rank, True)]
        count = max(lg.count // layers, 1) if lg.group.scope == "layer" else lg.count
        sides[lg.group.scope if lg.group.scope in sides else "post"] += one * count
    module = sides["pre"] + sides["layer"] * stage.layers + sides["post"]
    group = tuple(i for i, (_, trains) in enumerate(module) if trains)
    return replace(
        full,
        pre=tuple(n for n, _ in sides["pre"]),
        layer=tuple(n for n, _ in sides["layer"]),
        post=tuple(n for n, _ in sides["post"]),
        groups=(group,) if group else (),
        bottom_backward=any(trains for _, trains in sides["pre"]) or full.tied,
        train_bytes=ctx.adapter_bytes,
    )
