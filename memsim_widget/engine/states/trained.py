"""What trains on one rank: every parameter of the unfrozen stacks under full training, else the LoRA adapters
(whose weights are an item of their own), with the bytes per element of their gradient, optimizer state and
master copy."""

from __future__ import annotations

from memsim_widget.engine.context import Context, Stage, deepspeed_casts_adapters
from memsim_widget.engine.items import Item
from memsim_widget.engine.states.budget import LocalGroup, StateBudget, tp_split
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.units import fmt_int

#: The adapter weights' formula note where DeepSpeed casts them (``context.deepspeed_casts_adapters``)
_DEEPSPEED_CAST = (
    ", cast from peft's {} to the model's 16-bit dtype by DeepSpeed's engine at the wrap "
    "(deepspeed 0.19.8 runtime/engine.py _cast_module_mixed_precision, whatever lora.adapter_dtype says)"
)


@dataclass
class Trained:
    """The trained tensors as (shape, count, elements each), and the bytes per element of their gradient,
    optimizer state and master copy; ``what`` names them in formulas."""

    entries: list[tuple[tuple[int, ...], int, int]]
    grad_b: int
    state_b: int
    master_b: int
    what: str
    #: Trained elements the tensor-parallel plan leaves as plain tensors (tp > 1 without FSDP): a foreach
    #: optimizer refuses a param group mixing them with DTensors, so they are a group of their own
    unsplit: int = 0

    @property
    def n(self) -> int:
        """Trained elements on this rank."""
        return sum(c * e for _, c, e in self.entries)

    @property
    def tensors(self) -> int:
        """Trained tensors on this rank."""
        return sum(c for _, c, _ in self.entries)


def trained(ctx: Context, stage: Stage, groups: list[LocalGroup], b: StateBudget) -> Trained:
    """What trains on this rank of ``stage``; adds the LoRA adapters' weights to ``b``."""
    sc, recipe = ctx.scenario, ctx.recipe
    if ctx.full_training:
        # a frozen stack (a VLM's vision tower) has weights but no gradient or optimizer state
        trainable = [
            (g.shape, g.count, g.numel_each) for g in groups if g.group.stack not in ctx.frozen_stacks
        ]
        grad_b, state_b, master_b = recipe.grad_bytes, recipe.state_bytes, recipe.master_bytes
        what = "params"
    else:
        a_bytes, cast = ctx.adapter_bytes, deepspeed_casts_adapters(sc)
        frac = stage.layers / ctx.arch.num_layers
        trainable = []
        E = ctx.arch.num_experts
        for ad in ctx.adapters:
            cnt = max(1, round(ad.base.count * frac)) if ad.base.scope == "layer" else ad.base.count
            # peft's adapter on a layer's fused experts is one pair over all of them: lora_A [r E, in] and
            # lora_B [out, r E] (``ParamWrapper.update_layer``), not E pairs
            n = E if ad.base.expert and E and cnt % E == 0 else 1
            r = ad.rank * n
            trainable.append(((r, ad.in_features), cnt // n, r * ad.in_features))
            trainable.append(((ad.out_features, r), cnt // n, r * ad.out_features))
        n_ad = sum(c * e for _, c, e in trainable)
        shard = _adapter_shard(ctx, trainable)
        partitioned = _deepspeed_partitions_adapters(ctx)
        if partitioned:  # ZeRO-3's flat bf16 partition of the adapters (ceil(numel / dp) each)
            shard = sum(c * -(-e // ctx.par.shard_degree) for _, c, e in trainable)
        b.persistent.append(
            Item(
                "parameters",
                "LoRA adapter weights",
                (shard or n_ad) * a_bytes,
                f"{fmt_int(n_ad)} adapter params x {a_bytes} B "
                f"(rank {sc.lora.rank}, targets {','.join(sc.lora.targets)})"
                + (_DEEPSPEED_CAST.format(sc.lora.adapter_dtype) if cast else "")
                + (
                    f", {'ZeRO-3 partitions' if partitioned else 'FSDP2 shards'}: {fmt_int(shard)} params on this rank"
                    if shard
                    else ""
                ),
                "tensor",
                sum(c for _, c, _ in trainable),
            )
        )
        grad_b = a_bytes
        state_b = 4 if recipe.master_bytes else a_bytes
        # DeepSpeed's optimizer keeps an fp32 master (partition) of the cast adapters, as of a full model's weights
        # ... and of ZeRO-3's partitioned bf16 adapters (stage3.py ``_create_fp32_partitions``)
        master_b = recipe.master_bytes if cast or partitioned else 0
        what = "adapter params"
    unsplit = 0
    par = ctx.par
    fsdp = par.zero >= 3 and par.dp * par.cp > 1  # FSDP2 makes every parameter a DTensor
    if ctx.full_training and par.tp > 1 and not fsdp:
        unsplit = sum(
            g.numel for g in groups if g.group.stack not in ctx.frozen_stacks and not tp_split(ctx, g.group)
        )
    return Trained(trainable, grad_b, state_b, master_b, what, unsplit)


def _deepspeed_partitions_adapters(ctx: Context) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions peft's adapters like any parameter of a ``zero.Init`` model (deepspeed
    0.19.8 ``stage3.py``: each trained parameter's ``ceil(numel / dp)``-element partition in the flat bf16 buffer,
    ``fp16_partitioned_groups_flat``, and its fp32 master partition): the ZeRO-3 LoRA rank whose items read its
    coordinator (``frameworks.deepspeed_zero3_coordinated``: bf16 adapters, ``zero_lora.lora_zero3_units``, held
    to the CPU traces through the stream)."""
    from memsim_widget.engine.frameworks import deepspeed_zero3_coordinated

    return not ctx.full_training and ctx.par.zero >= 3 and deepspeed_zero3_coordinated(ctx)


def _adapter_shard(ctx: Context, trainable: list[tuple[tuple[int, ...], int, int]]) -> int:
    """Adapter elements on this rank where FSDP2 shards them (``fully_shard`` after peft: each adapter a
    parameter of its unit, dim 0 padded to the shard group, ``fsdp_stream.padded_shard``); 0 elsewhere."""
    from memsim_widget.engine.counters.fsdp_stream import padded_shard
    from memsim_widget.engine.frameworks import profile

    par = ctx.par
    world = par.shard_degree
    if par.zero < 3 or par.dp * par.cp == 1 or profile(ctx).zero3 != "fsdp2" or par.tp > 1:
        return 0
    return sum(c * padded_shard(shape, world) for shape, c, _ in trainable)


def trainable_scopes(ctx: Context, groups: list[LocalGroup]) -> list[str]:
    """Scope of each trainable entry, aligned with the trainable list built in ``model_states``."""
    if ctx.full_training:
        return [g.group.scope for g in groups if g.group.stack not in ctx.frozen_stacks]
    out: list[str] = []
    for ad in ctx.adapters:
        out += [ad.base.scope, ad.base.scope]
    return out
