"""Framework profiles: how each training framework holds memory beyond what the model's maths needs.

The scenario's ``framework`` key picks one profile. A profile is a handful of facts, each a field below
with the source it comes from; the engine's formulas read them through the small rule functions at the
end of this module (one docstring per rule). ``hf`` is the engine's reference behaviour, checked against
fake-tensor traces (docs/fidelity.md); the others differ from it only where a field says so.

``suggested`` holds what a recipe of that framework typically sets (precision, optimizer, checkpointing,
sharding): documentation and a starting point for a front end, never applied behind the user's back --
the scenario's own keys always win.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from memsim_widget.alloc_conf import AllocatorConf, parse_alloc_conf
from memsim_widget.engine.context import Context
from memsim_widget.errors import ScenarioError
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.optimizers import OPTIMIZERS, OptimizerSpec, register_optimizer
from memsim_widget.precision import PRECISIONS, PrecisionRecipe
from memsim_widget.scenario import Scenario

#: DeepSpeed's default ``reduce_bucket_size`` / ``allreduce_bucket_size`` (elements): ZeRO-1/2 flatten
#: gradients into a buffer this size before reducing (deepspeed/runtime/zero/stage_1_and_2.py, ipg_buffer).
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000


@dataclass(frozen=True)
class FrameworkProfile:
    """The memory-relevant habits of one training framework (see the module docstring).

    ``activation_model``: ``"hf"`` (the tensors HF-style modules save, traced) or ``"megatron"``
    (Korthikanti et al. 2022, Table 2, for Megatron's fused kernels).
    ``training_kv_cache``: the model builds a KV cache in training and returns it with the outputs
    (transformers: ``use_cache`` defaults to true unless gradient checkpointing is on).
    ``fp32_logits_output``: the model itself returns fp32 logits (torchtune ``TransformerDecoder``:
    ``output = self.output(h).float()``), instead of compute-dtype logits upcast inside the loss.
    ``shift_copy``: the recipe shifts the logits with ``logits[..., :-1, :].contiguous()``, a copy of
    T x V (torchtune recipes up to mid-2024; transformers 5 shifts the labels instead).
    ``output_lifetime``: how long the loop holds the model output when the scenario leaves
    ``output_lifetime`` unset: ``"trainer"`` (dropped before backward: HF Trainer's ``compute_loss`` returns
    the loss only, torchtitan ``del pred``), ``"backward"`` (still referenced while ``loss.backward()`` runs:
    torchtune recipes until ``del logits`` came in mid-2024) or ``"step"`` (through ``optimizer.step()``).
    ``loss_outside_model``: the loop computes the loss on the model's output, outside its forward
    (torchtitan ``train.py``: ``pred = model(inputs); loss = loss_fn(pred, labels)``), so under FSDP2 the
    root's post-forward has resharded it before the loss runs; else the HF model computes it in its forward.
    ``ddp_buckets``: data parallelism is DDP with ``gradient_as_bucket_view=False`` (HF Trainer/Accelerate
    default): a second, flat copy of the gradients in 25 MB buckets.
    ``qlora_quantises``: which Linears QLoRA stores in NF4: ``"all-linear"`` (bitsandbytes via
    transformers quantises every Linear but the head) or ``"targets"`` (torchtune quantises only the
    LoRA-wrapped ones, docs/memory-facts.md#quantised-fine-tuning).
    ``fsdp_mixed_precision``: an ``amp-*`` precision means FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)`` rather than autocast: fp32 sharded parameters, gradients and states, the
    gathered unit in bf16, and the modules compute in bf16 throughout (no autocast copies, no fp32
    residual stream) -- torchtitan's ``apply_fsdp``.
    ``expandable_segments``: the launcher sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
    (torchtitan's ``run_train.sh``): the replay grows one segment per stream (engine/counters/allocator.py);
    blocks freed inside it stay mapped, so reserved is still well above allocated where a step's largest
    requests outgrow the free blocks (docs/allocator.md, "The fitted rule under expandable segments").
    ``bucket_elements``: a persistent gradient reduce buffer of this many elements (weight dtype) under
    ZeRO-1/2 with dp > 1 (DeepSpeed's ``reduce_bucket_size``, default 5e8).
    ``zero3``: who implements ZeRO-3: ``"fsdp2"`` (PyTorch ``fully_shard``, traced: docs/fidelity-parallel.md)
    or ``"deepspeed"`` (DeepSpeed's stage-3 parameter coordinator, formula only).
    ``separate_head``: the framework holds the LM head as its own tensor even for a model whose checkpoint ties
    it to the input embedding (litgpt: ``convert_hf_checkpoint`` copies ``wte.weight`` into ``lm_head.weight``
    and ``GPT`` never ties them), so the head is a second V x h parameter that trains on its own.
    ``fsdp2_accumulation``: what FSDP2 does with the gradients of the micro-batches before the last of a step
    (``grad_accum_steps`` > 1): ``"reduce"`` reduce-scatters every micro-batch and adds each new shard to the
    sharded gradient (the loop calls nothing between micro-batches: torchtitan's ``train_step``; torch 2.13
    ``_fully_shard/_fsdp_collectives.foreach_reduce``: ``sharded_param.grad._local_tensor += new_sharded_grad``,
    the new reduce-scatter output freed once added), ``"no_sync"`` turns the sync off on every micro-batch but
    the last (``FSDPModule.set_requires_gradient_sync(False)``: the unsharded gradients are kept and accumulated,
    reduced once; transformers 5.24 ``Trainer`` enters ``accelerator.no_sync``, which accelerate 1.16 runs as
    ``set_requires_gradient_sync(False)`` on FSDP2), ``""`` not read from the framework's source.
    ``tp_plan``: the tensor-parallel plan at tp > 1 (what ``trace/tp_plan.tp_style_for`` traces):
    ``"hf"`` (the model's transformers ``base_model_tp_plan``: an untied embedding stays replicated, the LM
    head is colwise with its output gathered, so every rank holds the full-vocabulary logits and loss),
    ``"torchtitan"`` (vocab-sharded embedding, loss parallel: logits and loss at V/tp) or ``"megatron"``
    (vocab-parallel embedding and cross-entropy).
    ``compiles_blocks``: ``compile`` means the framework's own code compiles each transformer block apart on its own
    model (torchtitan ``apply_compile``: ``torch.compile`` per ``TransformerBlock``, FSDP2's hooks and the loss left
    eager), not transformers' modelling code under a whole-model compile (whose compiled mask sends CUDA's SDPA to
    the math kernel on ViT-B: docs/allocator.md, "Compiled steps"); read by ``replayable.compiled_as_eager``.
    ``compiles_loss``: under ``compile`` the loop's loss function, computed outside the model
    (``loss_outside_model``), is compiled on its own too, unless the scenario's ``compile_loss`` says otherwise
    (torchtitan ``components/loss.py`` ``build_cross_entropy_loss``: ``torch.compile(loss_fn)`` under
    ``training.compile`` since 2025, today ``compile.components = ["model", "loss"]``; torchtitan of December 2024,
    9dec370, left it eager); read by ``loss_compiled_apart``.
    """

    name: str
    description: str
    activation_model: str = "hf"
    training_kv_cache: bool = False
    fp32_logits_output: bool = False
    shift_copy: bool = False
    output_lifetime: str = "trainer"
    ddp_buckets: bool = False
    qlora_quantises: str = "all-linear"
    fsdp_mixed_precision: bool = False
    expandable_segments: bool = False
    loss_outside_model: bool = False
    bucket_elements: int = 0
    zero3: str = "fsdp2"
    fsdp2_accumulation: str = ""
    tp_plan: str = "hf"
    separate_head: bool = False
    compiles_blocks: bool = False
    compiles_loss: bool = False
    sources: tuple[str, ...] = ()
    suggested: Mapping[str, Any] = field(default_factory=dict)


PROFILES: dict[str, FrameworkProfile] = {}


def register_profile(profile: FrameworkProfile) -> FrameworkProfile:
    """Add or replace a framework profile."""
    PROFILES[profile.name] = profile
    return profile


register_profile(
    FrameworkProfile(
        "hf",
        "transformers model, the usual loop (HF Trainer / Accelerate): forward and loss, outputs dropped, "
        "backward, step, zero_grad(set_to_none=True)",
        training_kv_cache=True,
        ddp_buckets=True,
        fsdp2_accumulation="no_sync",
        sources=(
            "docs/fidelity.md: every activation rule checked on fake-tensor traces of transformers 5",
            "transformers Trainer.compute_loss returns the loss only; the outputs die before backward",
        ),
        suggested=MappingProxyType(
            {"precision": "amp-bf16", "optimizer": "adamw", "optimizer_impl": "foreach", "padding": "longest"}
        ),
    )
)
register_profile(
    FrameworkProfile(
        "torchtune",
        "torchtune recipes (2024): pure bf16, its own Llama modules, fp32 logits shifted by a copy",
        fp32_logits_output=True,
        shift_copy=True,
        output_lifetime="backward",
        qlora_quantises="targets",
        sources=(
            "torchtune/modules/transformer.py TransformerDecoder.forward: output = self.output(h).float()",
            "recipes/full_finetune_single_device.py (2024-05): logits[..., :-1, :].contiguous(), "
            "loss.backward() with logits still in scope (del logits came later)",
            "torchtune QLoRA: only LoRALinear modules hold NF4 weights (docs/memory-facts.md#quantised-fine-tuning)",
        ),
        suggested=MappingProxyType(
            {
                "precision": "bf16",
                "optimizer": "adamw",
                "optimizer_impl": "fused",
                "activation_checkpointing": "full",
                "loss": "chunked",
                "padding": "packed",
            }
        ),
    )
)
register_profile(
    FrameworkProfile(
        "torchtitan",
        "torchtitan: FSDP2 with bf16 compute and fp32 sharded master state, per-op selective checkpointing, "
        "expandable allocator segments",
        fsdp_mixed_precision=True,
        expandable_segments=True,
        tp_plan="torchtitan",
        loss_outside_model=True,
        fsdp2_accumulation="reduce",
        compiles_blocks=True,
        compiles_loss=True,
        sources=(
            "torchtitan parallelize_llama.apply_fsdp: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)",
            "torchtitan run_train.sh: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            "torchtitan train.py: pred = model(...); loss = loss_fn(pred.float(), labels); del pred",
            "torchtitan train.py (pytorch/torchtitan 000204a4) train_step: forward_backward_step per micro-batch, "
            "no set_requires_gradient_sync: FSDP2 reduce-scatters every micro-batch",
            "torchtitan parallelize_llama.apply_compile: torch.compile on each TransformerBlock, fullgraph",
            "torchtitan components/loss.py (e7c0cae, June 2025) build_cross_entropy_loss: "
            "loss_fn = torch.compile(cross_entropy_loss) when training.compile",
        ),
        suggested=MappingProxyType(
            {
                "precision": "amp-bf16",
                "optimizer": "adamw",
                "optimizer_impl": "fused",
                "activation_checkpointing": "selective",
                "parallel": {"zero": 3},
                "padding": "packed",
            }
        ),
    )
)
register_profile(
    FrameworkProfile(
        "megatron",
        "Megatron-LM with TransformerEngine fused kernels: Korthikanti et al. activations, fp32 main "
        "gradients, distributed optimizer as ZeRO-1",
        activation_model="megatron",
        tp_plan="megatron",
        sources=(
            "Korthikanti et al. 2022, arXiv 2205.05198, Table 2 (activations per layer)",
            "Megatron-LM --use-distributed-optimizer: 6 + 12/d_p bytes per parameter (docs/memory-facts.md#bytes-per-parameter)",
        ),
        suggested=MappingProxyType(
            {
                "precision": "mixed-bf16",
                "optimizer": "adam",
                "optimizer_impl": "fused",
                "activation_checkpointing": "selective",
                "parallel": {"zero": 1},
                "padding": "packed",
            }
        ),
    )
)
register_profile(
    FrameworkProfile(
        "deepspeed",
        "DeepSpeed ZeRO with HF models: mixed precision with fp32 master weights, gradient reduce buckets",
        bucket_elements=DEEPSPEED_BUCKET_ELEMENTS,
        zero3="deepspeed",
        sources=(
            "deepspeed/runtime/zero/stage_1_and_2.py: ipg_buffer of reduce_bucket_size elements (default 5e8)",
            "DeepSpeed ZeRO-3 fetches each submodule's parameters to the GPU before it runs, also from "
            "CPU with offload_param (stage3 parameter coordinator)",
        ),
        suggested=MappingProxyType(
            {
                "precision": "mixed-bf16",
                "optimizer": "adamw",
                "optimizer_impl": "fused",
                "parallel": {"zero": 2},
            }
        ),
    )
)

register_profile(
    FrameworkProfile(
        "litgpt",
        "litgpt 0.5.13 finetune scripts: its own GPT (fused qkv, fp32 RMSNorm product, repeat_interleave GQA), "
        "its LoRA layers, the LM head in 128-token chunks with chunked_cross_entropy, logits kept through the step",
        output_lifetime="step",
        separate_head=True,
        sources=(
            "litgpt 0.5.13 scripts/convert_hf_checkpoint.py: a tied checkpoint's wte.weight is copied into "
            "lm_head.weight; model.py GPT keeps transformer.wte and lm_head as two parameters",
            "litgpt 0.5.13 finetune/lora.py, finetune/full.py: logits = model(input_ids, lm_head_chunk_size=128); "
            "loss = chunked_cross_entropy(logits, targets[..., 1:]); the loop's logits binding lives until the "
            "next step's forward returns",
            "litgpt 0.5.13 model.py: GPT, Block, CausalSelfAttention (one qkv Linear, k and v repeat_interleave'd "
            "to n_head under GQA), RMSNorm ((x_normed * weight.float()).to(dtype)), LLaMAMLP",
            "litgpt 0.5.13 lora.py: LoRALinear, LoRAQKVLinear (grouped conv1d for B, zero_pad to the qkv width); "
            "adapters in the model's dtype",
            "litgpt 0.5.13 utils.py: chunked_cross_entropy (per-chunk cross_entropy, reduction='none', then cat "
            "and sum); get_default_supported_precision(training=True) = 'bf16-mixed'",
            "traced: memsim_widget/trace/litgpt.py runs litgpt's own modules on fake tensors (docs/fidelity.md)",
        ),
        suggested=MappingProxyType(
            {"precision": "bf16", "optimizer": "adamw", "optimizer_impl": "foreach", "padding": "longest"}
        ),
    )
)

register_profile(
    FrameworkProfile(
        "liger",
        "transformers model with Liger Kernel's patches (use_liger_kernel=True / apply_liger_kernel_to_*): fused "
        "linear cross-entropy (no logits), RMSNorm, SwiGLU, RoPE; formula from Liger's source, untraced (Triton)",
        training_kv_cache=True,
        ddp_buckets=True,
        fsdp2_accumulation="no_sync",  # HF Trainer's loop
        sources=(
            "linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py @00eba634: chunked head, "
            "gradients computed in forward (grad_input, grad_weight), no logits returned",
            "linkedin/Liger-Kernel src/liger_kernel/ops/rms_norm.py: saves X, W and a fp32 rstd (llama casting)",
            "linkedin/Liger-Kernel src/liger_kernel/ops/swiglu.py: LigerSiLUMulFunction saves gate and up only",
            "untraced: Liger's kernels are Triton programs that need a GPU (engine/activations/liger.py)",
        ),
        suggested=MappingProxyType(
            {"precision": "bf16", "optimizer": "adamw", "optimizer_impl": "fused", "padding": "longest"}
        ),
    )
)

register_profile(
    FrameworkProfile(
        "unsloth",
        "Unsloth (transformers model, its patches): offloaded gradient checkpointing as the engine's full "
        "checkpointing with activation offloading; its fused kernels not modelled (HF's rules); formula, untraced",
        training_kv_cache=True,
        ddp_buckets=True,
        fsdp2_accumulation="no_sync",  # HF Trainer's loop
        sources=(
            "unslothai/unsloth-zoo unsloth_zoo/gradient_checkpointing.py (first in unsloth/models/_utils.py, "
            "2024-04): Unsloth_Offloaded_Gradient_Checkpointer copies each layer's input to the host "
            "(hidden_states.to('cpu', non_blocking=True)), runs the layer under no_grad and saves only that copy; "
            "backward brings it back, recomputes the layer and backpropagates through it",
            "untraced: Unsloth's kernels are Triton programs that need a GPU",
        ),
        suggested=MappingProxyType(
            {
                "precision": "bf16",
                "method": "qlora",
                "optimizer": "adamw-8bit",
                "activation_checkpointing": "full",
                "activation_offloading": True,
            }
        ),
    )
)


#: bitsandbytes PagedAdamW with 32-bit states (torchtune's low-memory recipe). The 8-bit variant is in
#: the optimizer catalog; the 32-bit one keeps fp32 states whatever the parameter dtype (bitsandbytes
#: Optimizer2State with optim_bits=32) and, like every paged optimizer, allocates them in CUDA unified
#: memory outside PyTorch's caching allocator.
@dataclass(frozen=True)
class Fp32StateOptimizerSpec(OptimizerSpec):
    """An optimizer whose states are fp32 whatever the parameter dtype (bitsandbytes 32-bit optimizers)."""

    def state_bytes(self, shape: tuple[int, ...], param_state_bytes: int) -> int:
        """Bytes of the fp32 states of one parameter tensor of ``shape``."""
        return super().state_bytes(shape, 4)

    def state_formula(self, param_state_bytes: int) -> str:
        """The bytes-per-element formula, always 4 B per state."""
        return super().state_formula(4)


PAGED_ADAMW = Fp32StateOptimizerSpec(
    "paged-adamw",
    2,
    "bitsandbytes PagedAdamW (32-bit): fp32 states in unified memory that can spill to the host",
    paged=True,
    temp_foreach=0.0,
    temp_for_loop=0.0,
    impls=("fused",),
)
if PAGED_ADAMW.name not in OPTIMIZERS:
    register_optimizer(PAGED_ADAMW)


# ----- rules the engine reads ---------------------------------------------------------------------------
def profile(ctx: Context) -> FrameworkProfile:
    """The profile of the scenario's framework."""
    return PROFILES[ctx.scenario.framework]


def head_copy(ctx: Context, first: bool, last: bool) -> bool:
    """Whether a stage holds its own copy of a tied LM head: the last stage of a pipeline whose first stage holds
    the embedding, or any last stage under a framework that unties the head (``separate_head``: litgpt)."""
    if not ctx.arch.tied_embeddings or not last:
        return False
    return not first or profile(ctx).separate_head


def one_eager_gpu(ctx: Context) -> bool:
    """No data, tensor, pipeline or expert parallelism, and an eager backward: where one GPU's head and embedding
    gradients were traced (``states/gradients.one_gpu_backward``, trace/run ``_train_step``, with or without
    accumulation). Context parallelism without ZeRO counts too (each rank runs the same backward on its share
    of the sequence; untraced there): the planner's state key sees dp alone under ZeRO-0, not cp. A compiled
    backward is one graph, which sums a tied weight's two gradients inside it (the compiled GPT-2 trace holds
    no third V x h tensor)."""
    p = ctx.par
    dp = p.dp if p.zero == 0 else p.dp * p.cp
    return dp * p.tp * p.pp * p.ep == 1 and not ctx.scenario.compile


def tied_head_grad_numel(ctx: Context, first: bool, last: bool) -> int:
    """Elements of the tied embedding gradient the head makes at the top of backward (``states/gradients.
    tied_head_grad``): on a rank holding both ends of the tie (no head copy, ``head_copy``), the embedding trained
    in full; else 0 (autograd sums the two before any optimizer-in-backward hook runs). Held to traces on the state-space families
    (``arch.facts.ssm``: Mamba, Mamba-2, Jamba) and, on one GPU with the optimizer stepping after backward, on the
    transformer families (``states/gradients.one_gpu_backward``, docs/fidelity.md "Gradients at the head and the
    embeddings"); elsewhere the transformer families' tensor moments do not count it yet (the allocator stream
    counts it for every family)."""
    arch = ctx.arch
    if not (arch.tied_embeddings and first and last and ctx.full_training):
        return 0
    if arch.facts.ssm is None and not (one_eager_gpu(ctx) and not ctx.scenario.optimizer_in_backward):
        return 0
    if head_copy(ctx, first, last):
        return 0
    emb = (g for g in arch.params if g.kind == "embedding" and g.stack not in ctx.frozen_stacks)
    return max((g.numel for g in emb), default=0)


def tp_plan(scenario: Scenario) -> str:
    """The tensor-parallel plan: ``parallel.tp_plan``, else the framework's (``FrameworkProfile.tp_plan``)."""
    return scenario.parallel.tp_plan or PROFILES[scenario.framework].tp_plan


def vocab_parallel_loss(scenario: Scenario) -> bool:
    """Whether the logits and the loss stay vocab-sharded (V/tp per rank) at tp > 1: ``parallel.loss_parallel``,
    else on under the torchtitan plan (its default, ``disable_loss_parallel=False``) and the megatron plan
    (Megatron-Core's vocab-parallel cross-entropy), off under "hf", whose head gathers the full logits
    (transformers ``colwise_gather_output``; torchtitan without loss parallel gathers them too:
    ``output_layouts=Replicate()`` in its plan)."""
    if scenario.parallel.tp == 1:
        return False
    lp = scenario.parallel.loss_parallel
    return tp_plan(scenario) != "hf" if lp is None else lp


def check_tp_plan(scenario: Scenario) -> None:
    """Refuse a loss parallel the plan cannot run: the "hf" plan gathers the logits on every rank (nothing
    vocab-sharded to run it on); Megatron's cross-entropy is always vocab-parallel."""
    lp, plan = scenario.parallel.loss_parallel, tp_plan(scenario)
    if scenario.parallel.tp == 1:  # both keys are inert without tensor parallelism
        return
    if lp and plan == "hf":
        raise ScenarioError(
            "parallel.loss_parallel",
            "needs a plan whose head keeps the vocabulary sharded (parallel.tp_plan torchtitan or megatron); "
            "transformers' plan gathers the full logits on every rank",
        )
    if lp is False and plan == "megatron":
        raise ScenarioError("parallel.loss_parallel", "Megatron's cross-entropy is always vocab-parallel")


def check_compile_loss(scenario: Scenario) -> None:
    """Refuse ``compile_loss`` under a framework whose model computes its own loss (transformers: the loss is part
    of the model's compiled graph, so there is no loss function to compile apart)."""
    if scenario.compile_loss is not None and not PROFILES[scenario.framework].loss_outside_model:
        raise ScenarioError(
            "compile_loss",
            "applies where the loop computes the loss outside the model (framework torchtitan); under "
            f"{scenario.framework} the loss is part of the model's compiled graph: unset it",
        )


def vocab_split(ctx: Context) -> bool:
    """Whether tensor parallelism splits the vocabulary of the logits and the loss (``vocab_parallel_loss``)."""
    return vocab_parallel_loss(ctx.scenario)


def embedding_split(ctx: Context) -> bool:
    """Whether tensor parallelism splits the input embedding's vocabulary: the "hf" plan leaves an untied
    embedding replicated (it is not in ``base_model_tp_plan``); a tied one is sharded with the head."""
    return ctx.par.tp > 1 and (tp_plan(ctx.scenario) != "hf" or bool(ctx.arch.tied_embeddings))


def loss_parallel(scenario: Scenario) -> bool:
    """torch's loss parallel (tp > 1): the loop computes the cross-entropy on the vocab-sharded DTensor
    logits outside the model (``loss_parallel()`` context, torchtitan ``train.py``); DTensor plans only
    (Megatron's vocab-parallel cross-entropy is its own kernel)."""
    return vocab_parallel_loss(scenario) and tp_plan(scenario) == "torchtitan"


def loss_compiled_apart(scenario: Scenario) -> bool:
    """Whether the loop's loss, computed outside the model, runs as its own compiled graph
    (``FrameworkProfile.compiles_loss``, or the scenario's ``compile_loss``): a compiled step of a framework whose
    loop computes the loss (torchtitan), not under loss parallel (DTensor's cross-entropy compiled: untraced; the
    eager loss-parallel kernels' buffers are counted, a caveat says so)."""
    if not scenario.compile:
        return False
    prof = PROFILES[scenario.framework]
    wanted = prof.compiles_loss if scenario.compile_loss is None else scenario.compile_loss
    return bool(wanted and prof.loss_outside_model and not loss_parallel(scenario))


def root_resharded_for_loss(scenario: Scenario, last: bool) -> bool:
    """Whether FSDP2's gathered units are gone while the loss runs and its backward starts: with the loss
    outside the model (loss parallel, or a loop that computes it outside: torchtitan; no pipeline), the root's
    post-forward with ``reshard_after_forward=True``
    reshards the root unit and frees the last all-gather output before the loss; backward re-gathers the
    root only when the gradient reaches the logits (torch ``_fsdp_state._post_forward``; traced)."""
    par = scenario.parallel
    outside = loss_parallel(scenario) or PROFILES[scenario.framework].loss_outside_model
    return last and par.pp == 1 and par.reshard_after_forward and outside


def output_lifetime(scenario: Scenario) -> str:
    """How long the loop holds the model output: the scenario's ``output_lifetime``, else the framework's.

    Source: docs/memory-facts.md#the-training-loop -- HF Trainer drops the outputs before backward; the
    hand-written loop
    ``outputs = model(**batch); outputs.loss.backward(); optimizer.step()`` keeps the logits (and any KV
    cache) alive through backward and the step.
    """
    return scenario.output_lifetime or PROFILES[scenario.framework].output_lifetime


def grads_kept(scenario: Scenario) -> bool:
    """Whether ``zero_grad`` keeps the gradients as zero-filled tensors through the next step (``zero_grad:
    zeros``: PyTorch before 2.0, whose ``zero_grad()`` zeroed in place, pytorch#92731; HF Trainer called it so
    until transformers#22136, v4.27) rather than freeing them (``set_to_none``, the default when unset)."""
    return scenario.zero_grad == "zeros"


def fsdp2_unsynced_grads(scenario: Scenario) -> bool:
    """Whether a rank keeps its FSDP2 units' UNSHARDED gradients through the micro-batches of a step
    (``unsynced_grads`` of the scenario's keys): the one bit of ``grad_accum_steps`` the model states read
    (``caches/parts_cache.states_key``; the planner's state key "unsynced", ``plan/vector.STATE_KEY``)."""
    p = scenario.parallel
    return bool(
        unsynced_grads(
            scenario.framework, scenario.optimizer_in_backward, scenario.grad_accum_steps, p.zero, p.dp, p.cp,
            p.pp, p.offload == "optimizer+params",
        )
    )  # fmt: skip


def unsynced_grads(
    framework: str, in_backward: bool, accum: Any, zero: Any, dp: Any, cp: Any, pp: Any, params_on_host: Any
) -> Any:
    """Whether FSDP2 keeps each unit's unsharded gradients over the micro-batches: more than one micro-batch
    (``accum``), a loop that turns the sync off on all but the last (``fsdp2_accumulation == "no_sync"``: HF
    Trainer), an FSDP2 rank (ZeRO-3 over dp x cp > 1 under ``zero3 == "fsdp2"``, parameters on the GPU), no
    pipeline (``states/gathered.pipeline_fsdp2`` counts a pipeline's own accumulation) and no optimizer in
    backward. Written with ``&`` so that it takes the planner's numpy columns as well as one scenario's
    integers (a plain False where the framework or ``in_backward`` rules it out)."""
    prof = PROFILES[framework]
    if prof.fsdp2_accumulation != "no_sync" or prof.zero3 != "fsdp2" or in_backward:
        return False
    return (accum > 1) & (zero >= 3) & (dp * cp > 1) & (pp == 1) & ~params_on_host


def fsdp_wraps(zero: Any, dp: Any, cp: Any) -> Any:
    """Whether FSDP wraps the model as torchtitan decides it: ZeRO-3 over more than one dp x cp rank, or context
    parallelism (which it runs under FSDP). Written with ``&`` and ``|`` so that it takes the planner's numpy
    columns as well as one scenario's integers."""
    return ((zero >= 3) & (dp * cp > 1)) | (cp > 1)


def no_mixed_precision(ctx: Context) -> bool:
    """torchtitan with tensor parallelism and no FSDP: its ``maybe_enable_amp`` runs neither FSDP2's
    ``MixedPrecisionPolicy`` (no FSDP) nor ``torch.autocast`` ("Mixed precision training with TP or PP is only
    supported when FSDP/HSDP/CP is enabled"), so an ``amp-*`` recipe computes in fp32 (torchtitan
    ``distributed/utils.py``; traced). Pipelines alone are left out: the pipeline tracer does not run it so."""
    par = ctx.par
    fsdp = fsdp_wraps(par.zero, par.dp, par.cp)
    return ctx.recipe.autocast and profile(ctx).fsdp_mixed_precision and par.tp > 1 and not fsdp


def effective_recipe(ctx: Context) -> PrecisionRecipe:
    """The recipe the step computes in: fp32 where ``no_mixed_precision``, else the scenario's."""
    return PRECISIONS["fp32"] if no_mixed_precision(ctx) else ctx.recipe


def uses_autocast(ctx: Context) -> bool:
    """Autocast is on: an ``amp-*`` recipe, unless the framework means FSDP2 mixed precision by it.

    Source: torchtitan casts parameters to bf16 when FSDP2 gathers them (``MixedPrecisionPolicy``) and
    runs no autocast, so no 16-bit weight or input copies are cached and the residual stream is bf16.
    """
    return ctx.recipe.autocast and not profile(ctx).fsdp_mixed_precision


def gathered_weight_bytes(ctx: Context) -> int:
    """Bytes per element of a ZeRO-3/FSDP unit while gathered: bf16 under FSDP2 mixed precision (torchtitan's
    ``param_dtype=bf16``), else the weight dtype of the recipe."""
    return 2 if ctx.recipe.autocast and profile(ctx).fsdp_mixed_precision else ctx.recipe.weight_bytes


def quantises_module(ctx: Context, module: str | None) -> bool:
    """Whether QLoRA stores this Linear in NF4: every Linear (bitsandbytes through transformers) or only
    LoRA-wrapped ones (torchtune, docs/memory-facts.md#quantised-fine-tuning)."""
    if not module:
        return False
    if profile(ctx).qlora_quantises == "all-linear":
        return True
    return module in {ad.base.module for ad in ctx.adapters}


def allocator_conf(ctx: Context) -> AllocatorConf:
    """The run's ``PYTORCH_CUDA_ALLOC_CONF``: the scenario's ``allocator_conf``, else the framework launcher's
    (torchtitan's ``expandable_segments:True``, the others PyTorch's defaults)."""
    text = ctx.scenario.allocator_conf
    if text is None:
        text = "expandable_segments:True" if profile(ctx).expandable_segments else ""
    return _parsed_conf(text)


@lru_cache(maxsize=64)
def _parsed_conf(text: str) -> AllocatorConf:
    return parse_alloc_conf(text)


def expandable_segments(ctx: Context) -> bool:
    """The caching allocator maps memory in expandable segments (``allocator_conf``; torchtitan's default)."""
    return allocator_conf(ctx).expandable_segments


def reduce_bucket_elements(ctx: Context) -> int:
    """Elements of each of DeepSpeed's ZeRO-1/2 gradient reduce (ipg) buffers on this rank (0 if none), or of its
    ZeRO-3 ipg bucket (deepspeed 0.19.8 ``stage3.py``: ``bucket.buffer``, ``torch.empty(reduce_bucket_size)`` made
    at ``__init__`` and kept; traced on CPU, ``benchmarks/zero_trace.py --stage 3``):
    ``parallel.reduce_bucket_size``, unset DeepSpeed's default (5e8, ``deepspeed/runtime/zero/config.py``), "auto"
    hidden_size x hidden_size as HF Trainer fills it (transformers 5.24.0
    ``integrations/deepspeed.py``, ``HfTrainerDeepSpeedConfig.trainer_config_finalize``: the model config's
    ``hidden_size``, else its text config's) and accelerate does (accelerate 1.16.0 ``accelerator.py``,
    ``Accelerator._prepare_deepspeed``)."""
    par = ctx.par
    if par.zero not in (1, 2, 3) or par.dp * par.cp == 1 or not profile(ctx).bucket_elements:
        return 0
    if par.zero == 3 and profile(ctx).zero3 != "deepspeed":
        return 0
    size = par.reduce_bucket_size
    if size is None:
        return profile(ctx).bucket_elements
    if size == "auto":
        return ctx.arch.hidden_size * ctx.arch.hidden_size
    return int(size)


def reduce_buffers(ctx: Context) -> int:
    """How many ipg buffers of ``reduce_bucket_elements`` DeepSpeed ZeRO-1/2 keeps through a backward: two under
    ``overlap_comm`` (deepspeed 0.19.8 ``stage_1_and_2.setup_buckets``: a second ``torch.empty(reduce_bucket_size)``
    to fill while the first is reduced, both cleared by ``_release_ipg_buffers``), else one; ZeRO-3 keeps one
    whatever ``overlap_comm`` (``stage3.py``: one bucket per communication dtype)."""
    return 2 if ctx.par.overlap_comm and ctx.par.zero in (1, 2) else 1


def parameters_fetched_from_host(ctx: Context) -> bool:
    """ZeRO-3 with parameter offload copies each unit to the GPU to compute it, even on a single rank
    (DeepSpeed offload_param, FSDP CPUOffload)."""
    return ctx.par.zero >= 3 and ctx.par.offload == "optimizer+params"


def fp8_gathered(ctx: Context) -> bool:
    """FSDP2 gathers the layers' Linear weights in fp8 (``fp8_all_gather``: torchao's float8 weights), not
    Megatron FSDP's fp8 parameters (their transposes: ``megatron_fp8_params``)."""
    return bool(ctx.scenario.fp8_all_gather) and not megatron_fp8_params(ctx)


def fp8_linear_weight(scope: str, module: str | None, kind: str) -> bool:
    """A parameter group that ``fp8_all_gather`` gathers in fp8: a decoder layer's Linear weight (torchao's
    ``convert_to_float8_training`` swaps the layers' ``nn.Linear``s; norms and embeddings stay as they are)."""
    return scope == "layer" and bool(module) and kind != "embedding"


def megatron_fp8_params(ctx: Context) -> bool:
    """Megatron FSDP with fp8 parameters (``fp8_all_gather`` under ``framework: megatron``, ZeRO-3): the weights
    are TransformerEngine fp8 tensors gathered per unit, so no whole-model fp8 weight cache is kept beside them
    (``memsim_widget/fp8.py``, ``MEGATRON_FP8_PARAM_RECIPES``)."""
    sc = ctx.scenario
    return bool(sc.fp8_all_gather) and sc.framework == "megatron" and ctx.par.zero >= 3


def zero3_lora_modelled(ctx: Context) -> bool:
    """LoRA on a DeepSpeed ZeRO-3 rank as ``zero_lora.lora_zero3_units`` writes it: peft's LoRA, nothing offloaded,
    its adapters in the model's dtype (``lora.adapter_dtype`` bf16) or in fp32 (peft's default,
    ``autocast_adapter_dtype``: ``zero.Init``'s model is not cast, deepspeed 0.19.8 ``runtime/engine.py``
    ``_cast_module_mixed_precision``, so they stay fp32 and peft 0.21.2 ``lora/layer.py`` ``Linear.forward`` casts
    each adapter's input to fp32: the activations' ``Context.adapter_bytes``), every Linear keeping its input
    (``context.deepspeed_zero3_linear``). Held to the real optimizer's CPU runs (benchmarks/zero_trace.py --stage 3
    --lora 16 [--adapter bf16], q,v at world 4 and all-linear at world 2), without the cuBLAS workspaces a CPU run
    lacks: bf16 adapters reserved -0.24% to -0.38%, allocated +0.07% to +0.08%; fp32 adapters reserved -0.25% and
    -0.11%, allocated +0.07% and +0.10% (the fitted rule before), their own tensors fp32 and the ipg bucket and
    gradient partitions' buffer bf16 as the runs make them (``Zero3Units.train_bytes``)."""
    sc = ctx.scenario
    return (
        sc.method == "lora"
        and ctx.adapter_bytes in (ctx.recipe.weight_bytes, 4)  # the model's dtype, or peft's fp32 adapters
        and ctx.par.offload == "none"
    )


def deepspeed_zero3_coordinated(ctx: Context) -> bool:
    """Whether a DeepSpeed ZeRO-3 rank's items read its gathered parameters off the coordinator that writes its
    stream (``counters/zero3_gathered``, ``states/gathered._deepspeed_coordinator``): the ranks ``zero3_stream``
    writes (``replayable.zero3_replayable``) whatever their activation checkpointing, compilation and
    micro-batches (the planner's state rows are built without them: ``plan/vector``), partitioned over dp x cp
    (the states see dp x cp alone; the stream writes no cp > 1 rank); any other keeps
    ``states/gathered._deepspeed_units``' formula."""
    p = ctx.par
    return (
        p.dp * p.cp > 1  # the states see dp x cp alone (the planner's state rows fold cp into dp)
        and p.dp_replicate == 1
        and p.tp * p.pp * p.ep == 1
        and profile(ctx).zero3 == "deepspeed"
        and (ctx.full_training or zero3_lora_modelled(ctx))
        and not ctx.frozen_stacks
        and ctx.scenario.precision == "mixed-bf16"
        and p.offload in ("none", "optimizer")
        and gathered_weight_bytes(ctx) == ctx.recipe.weight_bytes
    )
