"""What one CPU process can trace, and the tracer's arguments for a scenario's step.

``check_traceable`` refuses, by field, what the tracer cannot run (torch-free: the widget runs it on every edit);
``trace_kwargs`` turns a scenario into the arguments of ``trace_hf`` / ``trace_objective``. The single-GPU
(``api``), distributed and pipeline tracers all start from these two.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.catalog.gpus import compute_capability, resolve_gpu
from memsim_widget.catalog.models import architecture_for
from memsim_widget.engine.frameworks import output_lifetime
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

TRACEABLE_PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
TORCH_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor")
#: torch.optim's, and bitsandbytes' by their states (trace/bnb_states.py: its update is a CUDA kernel writing in place)
TRACEABLE_OPTIMIZERS = (
    *TORCH_OPTIMIZERS,
    "adamw-8bit",
    "paged-adamw-8bit",
    "paged-adamw",
)


def check_traceable(sc: Scenario) -> None:
    """Raise ScenarioError for what one CPU process cannot trace (naming the field and why).

    First what the engine refuses (an unknown model type, a bad config key, what it does not model): a trace
    is compared with the engine's estimate, so that is checked before anything is built or run (the engine is
    pure Python and caches its estimates)."""
    from memsim_widget.engine.core import estimate

    estimate(sc)
    if sc.method == "qlora" and not torchao_qlora(sc):
        raise ScenarioError(
            "method", "qlora is traced only as torchtune shards it (torchao's NF4Tensor under FSDP2: framework "
            "torchtune, zero 3, dp > 1): bitsandbytes' 4-bit Params4bit cannot wrap a fake tensor",
        )  # fmt: skip
    if sc.framework in ("liger", "unsloth"):
        raise ScenarioError("framework", f"{sc.framework} cannot be traced: its Triton kernels need a GPU")
    if sc.framework == "litgpt" and (sc.parallel.world_size > 1 or sc.parallel.ep > 1):
        raise ScenarioError(
            "parallel", "litgpt's step is traced on one GPU (trace/litgpt.py): set dp, tp, pp, cp and ep to 1"
        )
    if architecture_for(sc.model).facts.ssm is not None and (sc.ssm_kernel or "cuda") == "cuda":
        raise ScenarioError(
            "ssm_kernel", "cuda (mamba-ssm's kernels) cannot run on a CPU: the trace runs transformers' torch "
            "path; set ssm_kernel to 'torch' to trace (and compare) that path",
        )  # fmt: skip
    if sc.zero_grad == "zeros":
        raise ScenarioError(
            "zero_grad", "zeros cannot be traced: the traced steps free the gradients (zero_grad(set_to_none="
            "True)); unset it to trace",
        )  # fmt: skip
    if sc.precision not in TRACEABLE_PRECISIONS:
        raise ScenarioError(
            "precision", f"{sc.precision!r} cannot be traced; traceable: {', '.join(TRACEABLE_PRECISIONS)}"
        )
    if sc.optimizer not in TRACEABLE_OPTIMIZERS:
        raise ScenarioError(
            "optimizer",
            f"{sc.optimizer!r} cannot be traced (neither torch.optim nor bitsandbytes' states); traceable: "
            f"{', '.join(TRACEABLE_OPTIMIZERS)}",
        )
    if sc.optimizer not in TORCH_OPTIMIZERS and (sc.parallel.world_size > 1 or sc.parallel.ep > 1):
        raise ScenarioError(
            "optimizer",
            f"{sc.optimizer!r} (bitsandbytes' states, trace/bnb_states.py) is traced on one GPU only",
        )
    if (sc.parallel.world_size > 1 or sc.parallel.ep > 1) and architecture_for(
        sc.model
    ).facts.vision is not None:
        raise ScenarioError(
            "parallel", "a multimodal model is traced on one GPU only (the multi-GPU tracer feeds no images and "
            "freezes no tower): set dp, tp, pp, cp and ep to 1",
        )  # fmt: skip
    if sc.parallel.world_size > 1 or sc.parallel.ep > 1:
        _check_multi_gpu(sc)
    if sc.activation_checkpointing == "selective":
        raise ScenarioError(
            "activation_checkpointing",
            "HF models have no Megatron selective checkpointing to trace; use none, full or selective-op",
        )
    if sc.loss == "chunked":
        raise ScenarioError("loss", "HF models compute the standard loss; the chunked loss cannot be traced")
    if sc.compile and (sc.parallel.world_size > 1 or sc.parallel.ep > 1 or sc.objective_name != "sft"):
        raise ScenarioError(
            "compile", "a compiled step is traced for one GPU's SFT step only (trace/compiled.py; objectives and "
            "multi-GPU layouts are not traced compiled yet): set compile to false",
        )  # fmt: skip
    if sc.compile and (sc.activation_checkpointing not in ("none", "full") or (sc.checkpoint_every or 1) > 1):
        # HF's full checkpointing traces compiled (trace/compiled.py runs the rng higher-order ops AOTAutograd
        # wraps the recomputed random ops in); selective-op and checkpoint_every wrap layers by hand, not traced
        raise ScenarioError(
            "activation_checkpointing", "a compiled step is traced with full checkpointing or none (selective-op "
            "and checkpoint_every are not traced compiled): use none or full, or set compile to false",
        )  # fmt: skip
    _check_torchtune_savers(sc)
    _check_model_kernels(sc)
    _check_objective(sc)
    if sc.grad_accum_steps > 1 and (
        (sc.parallel.world_size > 1 and not _fsdp2_only(sc))
        or sc.compile
        or sc.objective_name != "sft"
        or sc.optimizer_in_backward
    ):  # trace/run._train_step runs the micro-batches of one GPU's or one FSDP2 rank's eager SFT step
        raise ScenarioError(
            "grad_accum_steps", "accumulation is traced for one GPU's or one FSDP2 rank's (dp > 1, zero 3, no "
            "other parallelism) eager SFT step only; set it to 1",
        )  # fmt: skip
    _check_fp8(sc)


def _fsdp2_only(sc: Scenario) -> bool:
    """``fully_shard`` over dp > 1 ranks and nothing else (trace/distributed.py runs its micro-batches with the
    framework's ``fsdp2_accumulation``)."""
    p = sc.parallel
    return p.dp > 1 and p.zero == 3 and p.tp * p.pp * p.cp * p.ep == 1


def _check_fp8(sc: Scenario) -> None:
    """An fp8 recipe is traced as torchao runs it: tensorwise or rowwise, one GPU's eager SFT step."""
    fp8 = sc.fp8
    if fp8 is None:
        return
    if fp8.framework != "torchao":
        raise ScenarioError(
            "fp8_recipe", f"{fp8.name!r} is TransformerEngine's (CUDA kernels only): not traced; traceable: "
            "tensorwise, rowwise (torchao)",
        )  # fmt: skip
    if (sc.parallel.world_size > 1 or sc.parallel.ep > 1 or sc.objective_name != "sft" or sc.compile
            or sc.method != "full"):  # fmt: skip
        raise ScenarioError(
            "fp8_recipe", "torchao's float8 is traced for one GPU's eager full-training SFT step only: set dp, tp, "
            "pp, cp and ep to 1, method full, objective sft and compile false",
        )  # fmt: skip


def torchao_qlora(sc: Scenario) -> bool:
    """Whether the scenario's QLoRA is torchtune's under FSDP2, which the distributed trace runs
    (``distributed.nf4_base``): torchao's ``NF4Tensor`` on the LoRA-wrapped Linears (``qlora_quantises``
    "targets"), sharded by ``fully_shard`` over dp > 1 ranks, no other parallelism."""
    from memsim_widget.engine.frameworks import PROFILES

    p = sc.parallel
    return (
        sc.method == "qlora"
        and PROFILES[sc.framework].qlora_quantises == "targets"
        and PROFILES[sc.framework].zero3 == "fsdp2"
        and p.zero == 3
        and p.dp > 1
        and p.tp * p.pp * p.cp * p.ep == 1
    )


def _check_torchtune_savers(sc: Scenario) -> None:
    """Raise ScenarioError where torchtune's activation offloading or optimizer in backward cannot be traced:
    trace/torchtune_memory.py runs them in the single-GPU HF step, eager, SFT only."""
    for key in ("optimizer_in_backward", "activation_offloading"):
        if not getattr(sc, key):
            continue
        if sc.parallel.world_size > 1 or sc.parallel.ep > 1 or sc.framework == "litgpt":
            raise ScenarioError(
                key, "traced for one GPU's transformers step only: set dp, tp, pp, cp, ep to 1"
            )
        if sc.compile or sc.objective_name != "sft":
            raise ScenarioError(
                key, "traced for an eager SFT step only: set compile to false and the objective to sft"
            )


#: Objectives whose training step the tracer runs (``trace/objectives.py``) (every objective; the rollout phase is not traced).
TRACEABLE_OBJECTIVES = ("sft", "dpo", "orpo", "kto", "grpo", "ppo")


def _check_objective(sc: Scenario) -> None:
    """Raise ScenarioError for an objective step the tracer does not run (the rollout phase is never traced:
    it is held to vLLM's documented arithmetic instead, ``engine/rl/rollout.py``)."""
    obj = sc.objective_name
    if obj not in TRACEABLE_OBJECTIVES:
        raise ScenarioError(
            "objective", f"{obj!r} is formula-only (not traced); traced: {', '.join(TRACEABLE_OBJECTIVES)}"
        )
    if obj != "sft" and sc.reference == "offload":
        raise ScenarioError(
            "rl.reference", "an offloaded reference is formula-only; trace 'gpu' or 'precomputed'"
        )
    if obj != "sft" and sc.rl_config.rollout != "none":
        raise ScenarioError(
            "rl.rollout",
            "the rollout phase is formula-only (vLLM's documented arithmetic); set it to 'none' to trace the step",
        )
    if obj != "sft" and sc.parallel.world_size > 1:
        raise ScenarioError("parallel", f"a {obj} step is traced on one GPU: set dp, tp, pp and cp to 1")
    if obj != "sft" and sc.activation_checkpointing not in ("none", "full"):
        raise ScenarioError("activation_checkpointing", f"a {obj} step traces 'none' or 'full'")


def _check_model_kernels(sc: Scenario) -> None:
    """Raise ScenarioError for a model path transformers or torch's CPU kernels cannot run (GPT-OSS has no
    SDPA path; grouped_mm experts accept bf16 only on CPU)."""
    try:
        arch = architecture_for(sc.model)
    except ScenarioError:  # the engine names a bad model itself; nothing to add here
        return
    if sc.attention == "sdpa" and arch.facts.attention.sinks:
        raise ScenarioError(
            "attention",
            f"{arch.facts.hf_class} has no SDPA path in transformers (attention sinks): trace it with 'eager' "
            "(the engine's 'sdpa' stands for the flash kernel with sinks used on GPUs)",
        )
    parts = arch.facts.mlp.parts
    # every MoE family of transformers 5 but Llama 4 (torch.bmm) runs its experts with grouped_mm
    grouped = any(p.experts and p.dispatch != "dense" for p in parts) if parts else arch.is_moe
    if grouped and sc.precision != "bf16":
        raise ScenarioError(
            "precision",
            f"{sc.precision!r} cannot be traced for {arch.facts.hf_class}: its grouped_mm experts run in bf16 "
            "only on CPU; trace bf16",
        )


def _check_multi_gpu(sc: Scenario) -> None:
    """Raise ScenarioError for a multi-GPU layout one traced rank cannot reproduce (pp goes to pipeline.py)."""
    from memsim_widget.trace.rank_layout import check_distributed  # torch-free

    if sc.parallel.pp == 1:
        check_distributed(sc)


def cuda_sm(sc: Scenario) -> tuple[int, int] | None:
    """The compute capability of the scenario's card (``catalog.gpus.compute_capability``), None when it is not an
    NVIDIA GPU: the tracer then chooses SDPA's kernel as CUDA does on it (trace/cuda_sdpa.py)."""
    return compute_capability(resolve_gpu(sc.gpu))


def trace_kwargs(sc: Scenario) -> dict[str, Any]:
    """The tracer's arguments for the same training step as ``sc``."""
    kw: dict[str, Any] = {
        "micro_batch_size": sc.micro_batch_size,
        "seq_len": sc.seq_len,
        "precision": sc.precision,
        "optimizer": sc.optimizer,
        "optimizer_impl": sc.optimizer_impl,
        # what transformers runs: Gemma 2 has no SDPA path and runs eager (Architecture.attention_kernel)
        "attention": architecture_for(sc.model).attention_kernel(sc.attention),
        "gradient_checkpointing": sc.activation_checkpointing == "full" and (sc.checkpoint_every or 1) == 1,
        "output_lifetime": output_lifetime(sc),
        "sdpa_device": cuda_sm(sc),  # SDPA's kernel as CUDA chooses it on the card (trace/cuda_sdpa.py)
    }
    if architecture_for(sc.model).facts.vision is not None:
        from memsim_widget.engine.context import Context

        ctx = Context(sc)
        kw["vision"] = {"images": ctx.images_per_sample, "freeze": ctx.freeze_vision}
    for key in ("activation_offloading", "optimizer_in_backward"):  # torchtune's (trace/torchtune_memory.py)
        if getattr(sc, key):
            kw[key] = True
    if sc.grad_accum_steps > 1:  # micro-batches per step, each loss scaled (trace/run._train_step)
        kw["grad_accum_steps"] = sc.grad_accum_steps
    if sc.fp8 is not None:  # torchao's float8 Linears (trace/float8.py); check_traceable refuses the rest
        kw["float8"] = sc.fp8.name
    if (
        sc.compile
    ):  # torch.compile: Inductor's partitioner at the scenario's budget, torch's default 1.0 unset
        b = sc.activation_memory_budget
        kw["compile_budget"] = 1.0 if b is None else b
        from memsim_widget.engine.frameworks import PROFILES, loss_compiled_apart

        if PROFILES[sc.framework].compiles_blocks:  # torchtitan: each block apart, its loss apart or eager
            kw["compile_blocks"] = True
            kw["compile_loss"] = loss_compiled_apart(sc)
    if sc.activation_checkpointing == "selective-op" or (sc.checkpoint_every or 1) > 1:
        kw["layer_checkpointing"] = (sc.activation_checkpointing, sc.checkpoint_every or 1)
    if sc.method != "full":
        kw["lora"] = {
            "r": sc.lora.rank,
            "lora_alpha": sc.lora.alpha,
            "target_modules": "all-linear" if "all-linear" in sc.lora.targets else list(sc.lora.targets),
            "adapter_dtype": sc.lora.adapter_dtype,
            "target_scope": sc.lora.target_scope,
        }
    if sc.objective_name != "sft":
        rl = sc.rl_config
        kw.pop("output_lifetime")  # the objective's step returns the loss only
        kw.pop("layer_checkpointing", None)
        kw.update(
            objective=sc.objective_name,
            reference=sc.reference,
            num_generations=rl.num_generations,
            completion_len=rl.completion_len,
            sequences=sc.sequences_per_micro_batch,
        )
    return kw
