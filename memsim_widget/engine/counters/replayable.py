"""Whether the allocation stream (``engine/counters/alloc_stream``) models a scenario's step: ``replayable`` decides
if the ``reserved`` counter is the replay of the step's stream or ``engine/counters/overhead``'s fitted rule, from
the per-framework predicates below (FSDP2, DDP, DeepSpeed ZeRO-1/2 and ZeRO-3 ranks, LoRA on each, compiled steps)
and the tensor-parallel, pipeline and saver ones of their streams' modules.

Kept apart from the stream so that deciding costs no import of the stream's writers or of the caching allocator:
``engine/core`` imports this module where the reserved model is the replay, and ``alloc_stream`` only where the
scenario replays (tests/cli/test_cli_startup_imports.py).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_steps import compiled_steps_written
from memsim_widget.engine.counters.offload_stream import savers_replayable
from memsim_widget.engine.counters.pp_stream import pp_replayable
from memsim_widget.engine.counters.tp_stream import tp_replayable
from memsim_widget.engine.frameworks import zero3_lora_modelled


def replayable(ctx: Any) -> bool:
    """Whether the scenario's reserved model is the replay (``Scenario.replays_reserved``: ``reserved_model``; unset,
    ``DEFAULT_RESERVED_MODEL``, the replay, but for ``padding: longest``, and compiled steps but
    where ``compiled_stream_held``) and the stream
    models its step: one GPU, any number of micro-batches per step (gradient accumulation: the
    later ones add each new gradient in place, ``alloc_stream.step_stream``), an FSDP2 rank
    (``fsdp2_replayable``: its gathered and communicated buffers on their CUDA streams, ``fsdp_stream``) or a DDP
    rank (``ddp_replayable``: its wrap-time broadcast and gradient buckets and their rebuild, ``ddp_stream``), a
    DeepSpeed ZeRO-1/2 rank (``zero12_replayable``: its flat weights, master partition, ipg buffer and partition
    gradients, ``zero_stream``; under peft's LoRA the adapters alone, beside the frozen base, ``zero_lora``), a
    DeepSpeed ZeRO-3 rank (``zero3_replayable``: full training or peft's LoRA, ``zero_lora``) or a
    tensor-parallel rank under transformers' or torchtitan's plan (``tp_replayable``: its all-reduces, gathered or
    vocab-sharded logits, ``tp_stream``), alone or under FSDP2 on the dp dimension, or a pipeline stage under
    GPipe or 1F1B (``pp_stream.pp_replayable``: its micro-batches in the schedule's order); on one GPU activation
    offloading of every layer and the optimizer in backward too (``offload_stream.savers_replayable``); no parameter
    offload (``optimizer+params``), and optimizer offload (``optimizer``) only on a DeepSpeed ZeRO-1/2 or ZeRO-3 rank
    (DeepSpeed's ``offload_optimizer``: ``zero_offload_stream`` writes the GPU's side of it, held to CPU traces).
    Elsewhere ``engine/counters/overhead`` keeps its fitted rule (docs/allocator.md lists what the stream still
    lacks)."""
    sc, p = ctx.scenario, ctx.par
    return (
        sc.replays_reserved
        and (
            p.dp * p.tp * p.pp * p.cp * p.ep == 1
            or fsdp2_replayable(ctx)
            or ddp_replayable(ctx)
            or zero12_replayable(ctx)
            or zero3_replayable(ctx)
            or tp_replayable(ctx)
            or (tp_replayable(ctx, sharded=True) and fsdp2_replayable(ctx, with_tp=True))
            or pp_replayable(ctx)
        )
        and savers_replayable(ctx)
        and (p.offload == "none" or zero12_replayable(ctx) or zero3_replayable(ctx))
        and compiled_stream_held(ctx)
    )


def compiled_stream_held(ctx: Any) -> bool:
    """Whether a compiled step's reserved counter replays when no ``reserved_model`` is named (an eager step: yes;
    a named ``replay``: yes): where the stream writes the compiled layers' own forward and backward buffers and is
    held to the compiled fake-tensor trace (``trace/compiled.inductor_passes``) within 1% on reserved
    (``compiled_steps.compiled_steps_written``: bf16 full training of the Llama layout, Llama, Mistral, Qwen2,
    Gemma, Qwen3, and its autocast (amp-bf16: Llama, Qwen2, Qwen3; ``compiled_amp_steps``); peft's LoRA on q and v
    of that layout, Qwen3's and Gemma 3's (``compiled_lora_steps``); OLMo 2 and Gemma 3 in bf16 full training;
    their traces' peak reserved to the byte, llama-3.2-1b at b4 x 1024 +0.52%: tests/engine/
    test_alloc_stream_compiled.py; the H200 run llama1b-bf16-compile: reserved +3.7%, nvidia-smi +2.1%, where the
    fitted rule is +22.5% and +19.9%). Elsewhere the fitted rule stays: the other compiled layers keep eager's
    backward items and are under their traces (benchmarks/allocator_replay_compiled.py --inductor-passes),
    and the LayerNorm families' compiled ViT-B H200 run is 12.6% under its replay (a CUDA-only gap the CPU trace
    does not show: docs/allocator.md), and so does a compiled step with activation offloading or the optimizer in
    backward (no compiled trace of them); but a compiled step whose terms are all eager's replays
    (``compiled_as_eager``: torchtitan's)."""
    sc = ctx.scenario
    if not sc.compile or sc.reserved_model == "replay":
        return True
    savers = sc.activation_offloading or sc.optimizer_in_backward
    return not savers and (compiled_steps_written(ctx) or compiled_as_eager(ctx))


def compiled_as_eager(ctx: Any) -> bool:
    """A compiled step every term of which is eager's, so that its stream is eager's stream and the replay gives the
    reserved counter of the same figures as the allocated one: the framework compiles its own blocks
    (``FrameworkProfile.compiles_blocks``: torchtitan compiles each block apart and leaves FSDP2's hooks and the loss
    eager), no traced compiled rule applies (``compiled.compiled_rule_applies``) nor HF's compiled loss terms
    (``compiled.compiled_loss_formula_applies``), on one GPU or a plain FSDP2 rank. Not transformers' compiled
    steps (its compiled ViT-B ran 12.6% above its replay on the H200: a CUDA-only gap in its mask), not under
    tensor parallelism (compiled DTensor collectives and async TP hold their buffers otherwise: untraced), not a
    pipeline. Against torchtitan's published compiled FSDP rows (held out, nothing fitted) the replay is 5-8% over
    where the fitted rule was 8-12% under (docs/allocator.md, "Compiled FSDP2 ranks")."""
    from memsim_widget.engine.activations.compiled import compiled_loss_formula_applies, compiled_rule_applies
    from memsim_widget.engine.frameworks import profile

    p = ctx.par
    return (
        profile(ctx).compiles_blocks
        and p.tp * p.pp * p.cp * p.ep == 1
        and not compiled_rule_applies(ctx.scenario, ctx.arch)
        and not compiled_loss_formula_applies(ctx)
    )


def fsdp2_replayable(ctx: Any, with_tp: bool = False) -> bool:
    """Whether the stream models the scenario's FSDP2 rank (``fsdp_stream``): ``fully_shard`` over dp > 1 ranks
    (zero 3 under a framework whose ZeRO-3 is FSDP2, parameters on the GPU), no other parallelism, full training
    or LoRA (``_fsdp2_lora_modelled``), one micro-batch a step or several where the framework's accumulation is read
    (``_fsdp2_accumulation_modelled``), gathered in the weights' dtype or bf16 (FSDP2 mixed precision), or the
    Linear weights in fp8 as torchao gathers them (``fp8_all_gather``, ``Fsdp2Writer._fp8_casts``; not with TP),
    eager or compiled with eager's terms (``compiled_as_eager``), its gradients freed by ``zero_grad``
    (``frameworks.grads_kept``: FSDP2's kept sharded gradients are not modelled); ``with_tp``: over TP ranks too
    (FSDP2 on the dp dimension of a dp x tp mesh, ``replayable`` asks ``tp_replayable`` of them). Under HSDP
    (``parallel.dp_shard``) the units shard over the shard group, as the stream writes them: FSDP2's all-reduce
    keeps the reduce-scatter output that is the gradient already (``fsdp_stream``'s docstring); under an
    accumulation that reduces every micro-batch a later micro-batch's held all-reduce output is not written (a
    caveat says so: ``caveats.hybrid_caveat``; a CPU trace of a 2 x 4 mesh peaked where it is not held)."""
    from memsim_widget.engine.frameworks import grads_kept, parameters_fetched_from_host, profile

    sc, p = ctx.scenario, ctx.par
    return (
        p.dp > 1
        and p.zero >= 3
        and p.shard_degree > 1
        and (p.tp == 1 or with_tp)
        and p.pp * p.cp * p.ep == 1
        and profile(ctx).zero3 == "fsdp2"
        and not parameters_fetched_from_host(ctx)
        and (ctx.full_training or _fsdp2_lora_modelled(ctx))
        and (sc.grad_accum_steps == 1 or _fsdp2_accumulation_modelled(ctx))
        and not (sc.fp8_all_gather and p.tp > 1)  # torchao's float8 TP styles: not written
        and (not sc.compile or compiled_as_eager(ctx))  # no TP rank: it asks tp == 1
        and not grads_kept(sc)
    )


def _fsdp2_lora_modelled(ctx: Any) -> bool:
    """LoRA on an FSDP2 rank as the stream writes it (``fsdp_stream.fsdp2_units``): peft's adapters inside each
    unit beside the frozen base, gathered with it, the only tensors with gradients, so the only ones
    reduce-scattered; no frozen tower (multimodal), the base in the weights' dtype (not QLoRA's NF4), and no
    FSDP2 mixed precision (its cast of the shards is not written per dtype)."""
    from memsim_widget.engine.frameworks import profile

    return ctx.scenario.method == "lora" and not ctx.frozen_stacks and not profile(ctx).fsdp_mixed_precision


def _fsdp2_accumulation_modelled(ctx: Any) -> bool:
    """Gradient accumulation on an FSDP2 rank as the stream writes it (``fsdp_stream.Fsdp2Units.accumulation``,
    held to traces of the framework's loop): every micro-batch reduce-scattered (``"reduce"``: torchtitan), or
    ``no_sync`` on all but the last with the unsharded gradients in the parameters' dtype (``"no_sync"``: HF
    Trainer; under FSDP2 mixed precision ``to_accumulated_grad_if_needed`` would keep an fp32 copy instead, not
    modelled). A framework whose loop was not read (``""``) keeps the fitted rule."""
    from memsim_widget.engine.frameworks import profile

    prof = profile(ctx)
    return prof.fsdp2_accumulation == "reduce" or (
        prof.fsdp2_accumulation == "no_sync" and not prof.fsdp_mixed_precision
    )


def ddp_replayable(ctx: Any) -> bool:
    """Whether the stream models the scenario's DDP rank (``ddp_stream``): data parallelism over dp > 1 ranks
    without ZeRO under a framework that wraps with torch DDP (``profile.ddp_buckets``: HF Trainer / accelerate),
    no other parallelism, full training, LoRA or QLoRA (``_ddp_lora_modelled``), no frozen stack, eager (a compiled
    step's DDPOptimizer splits the graph at the buckets: not modelled), any number of micro-batches
    (``no_sync``). Not over TP ranks: torch 2.13 DDP takes a TP-sharded module (a 1-D ``device_mesh`` sliced from
    a larger one: ``tensor/parallel/ddp._pre_dp_module_transform``), but no modelled framework wraps one so
    (transformers 5.24 puts FSDP2 beside TP, accelerate 1.16 skips DDP under TP, torchtitan 018740b7 refuses
    DDP with another dimension: docs/allocator.md "Tensor parallel ranks")."""
    from memsim_widget.engine.frameworks import profile

    p = ctx.par
    return (
        p.dp > 1
        and p.zero == 0
        and p.tp * p.pp * p.cp * p.ep == 1
        and profile(ctx).ddp_buckets
        and (ctx.full_training or _ddp_lora_modelled(ctx))
        and not ctx.frozen_stacks
        and not ctx.scenario.compile
    )


def zero12_replayable(ctx: Any) -> bool:
    """Whether the stream models the scenario's DeepSpeed ZeRO-1/2 rank (``zero_stream``): zero 1 or 2 over dp > 1
    ranks under the framework whose ZeRO is DeepSpeed's (``profile.bucket_elements``: its ipg buffer), no other
    parallelism, full training or peft's LoRA (``zero_lora_modelled``, nothing offloaded) of a bf16 model with an
    fp32 master copy (``mixed-bf16``: DeepSpeed's ``bf16.enabled``), any number of micro-batches a step
    (``ZeroWriter.micro``: ZeRO-1 keeps the gradients until the boundary, ZeRO-2 reduces each micro-batch's),
    nothing offloaded or the optimizer to the host (``parallel.offload: optimizer``, DeepSpeed's
    ``offload_optimizer``: ``zero_offload_stream``, held to its CPU trace), eager."""
    from memsim_widget.engine.frameworks import profile

    p, sc = ctx.par, ctx.scenario
    return (
        p.dp > 1
        and p.zero in (1, 2)
        and p.dp_replicate == 1  # DeepSpeed ZeRO-1/2 shards over every dp rank (no hybrid written)
        and p.tp * p.pp * p.cp * p.ep == 1
        and profile(ctx).bucket_elements > 0
        and (ctx.full_training or zero_lora_modelled(ctx))
        and not ctx.frozen_stacks
        and sc.precision == "mixed-bf16"
        and p.offload in ("none", "optimizer")
        and not sc.compile
    )


def zero3_replayable(ctx: Any) -> bool:
    """Whether the stream models the scenario's DeepSpeed ZeRO-3 rank (``zero3_stream``): zero 3 over dp > 1 ranks
    under the framework whose ZeRO-3 is DeepSpeed's (``profile.zero3``), no other parallelism, full training of a
    bf16 model with an fp32 master copy (``mixed-bf16``), tied or untied embeddings, no or full activation
    checkpointing, or selective checkpointing of an eager attention core (``_selective_core_written``: the core's
    recompute written op by op, held to its CPU trace within 0.2%; over SDPA not written), any number of
    micro-batches a step (the coordinator
    resets at every forward), nothing offloaded or the optimizer to the host (``parallel.offload: optimizer``,
    DeepSpeed's ``offload_optimizer``, the parameters on the GPU: ``zero_offload_stream``, held to its CPU trace;
    ``optimizer+params``' ``offload_param`` keeps the fitted rule), eager; or the same rank under peft's LoRA
    instead of full training (``zero3_lora_modelled``, nothing offloaded)."""
    from memsim_widget.engine.frameworks import profile

    p, sc = ctx.par, ctx.scenario
    return (
        p.dp > 1
        and p.zero >= 3
        and p.dp_replicate == 1  # MiCS' sub-group partitions and hierarchical all-gather: not written
        and p.tp * p.pp * p.cp * p.ep == 1
        and profile(ctx).zero3 == "deepspeed"
        and (ctx.full_training or zero3_lora_modelled(ctx))
        and not ctx.frozen_stacks
        and sc.precision == "mixed-bf16"
        and (sc.activation_checkpointing in ("none", "full") or _selective_core_written(ctx))
        and p.offload in ("none", "optimizer")
        and not sc.compile
    )


def _selective_core_written(ctx: Any) -> bool:
    """Megatron's selective checkpointing on an eager-attention Llama layer whose core the stream writes op by op,
    its recompute in the backward (``activations/eager_core_steps``): the core touches no parameter, so the
    coordinator fetches nothing for it."""
    from memsim_widget.engine.activations import eager_core_steps

    return ctx.scenario.activation_checkpointing == "selective" and eager_core_steps.applies(ctx)


def zero_lora_modelled(ctx: Any) -> bool:
    """LoRA on a DeepSpeed ZeRO-1/2 rank as ``zero_lora`` writes it: peft's LoRA (not QLoRA's NF4 base), nothing
    offloaded (not traced together), its adapters in any dtype (DeepSpeed casts them to the model's bf16 at the wrap), the only flat group. Held to
    the real optimizer's CPU run (benchmarks/zero_trace.py --lora 16): q,v within 1% (-0.25%, without the cuBLAS
    workspaces a CPU run lacks), all-linear -1.75% and -0.38% (allocated +0.01%; the activations run the adapters in bf16 as
    the cast leaves them, ``context.deepspeed_casts_adapters``); the fitted rule was +29% to +34% over the same runs."""
    return ctx.scenario.method == "lora" and ctx.par.offload == "none"


def _ddp_lora_modelled(ctx: Any) -> bool:
    """LoRA on a DDP rank as ``ddp_stream.rank_buckets`` writes it: peft's adapters the only parameters that
    require a gradient, so the only ones bucketed; the base weights fp32 (fp32, autocast) or pure bf16 / fp16
    (``ddp_stream.weight_dtype``: the broadcast's flat buffers are per dtype); under QLoRA the NF4 base is
    broadcast as its uint8 codes (``ddp_stream._tensors``)."""
    sc = ctx.scenario
    return sc.method in ("lora", "qlora") and (
        ctx.recipe.weight_bytes == 4 or sc.precision in ("bf16", "fp16")
    )
