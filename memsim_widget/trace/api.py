"""Trace a scenario: the same training step the engine simulates, run on fake tensors.

``trace_scenario(scenario)`` builds the scenario's model from its HF config (or a user's own module
factory) and returns a ``TraceResult``; ``trace_report`` turns it into the JSON the CLI prints, with
the same keys as ``memsim estimate --json`` where they apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memsim_widget.catalog.models import architecture_for, resolve_model_config
from memsim_widget.engine.frameworks import output_lifetime
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

#: Tracker roles -> breakdown categories (the engine's names).
ROLE_CATEGORY = {
    "parameter": "parameters",
    "buffer": "parameters",
    "gradient": "gradients",
    "optimizer_state": "optimizer_states",
    "activation": "activations",
    "input": "activations",
    "temporary": "temporaries",
    "unsharded_parameter": "parameters",
    "collective": "temporaries",
}
TRACEABLE_PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
TRACEABLE_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor")


def check_traceable(sc: Scenario) -> None:
    """Raise ScenarioError for what one CPU process cannot trace (naming the field and why).

    First what the engine refuses (an unknown model type, a bad config key, what it does not model): a trace
    is compared with the engine's estimate, so that is checked before anything is built or run (the engine is
    pure Python and caches its estimates)."""
    from memsim_widget.engine.core import estimate

    estimate(sc)
    if sc.method == "qlora":
        raise ScenarioError("method", "qlora cannot be traced: bitsandbytes' 4-bit kernels need CUDA")
    if architecture_for(sc.model).extra.get("ssm") and (sc.ssm_kernel or "cuda") == "cuda":
        raise ScenarioError(
            "ssm_kernel", "cuda (mamba-ssm's kernels) cannot run on a CPU: the trace runs transformers' torch "
            "path; set ssm_kernel to 'torch' to trace (and compare) that path",
        )  # fmt: skip
    if sc.precision not in TRACEABLE_PRECISIONS:
        raise ScenarioError(
            "precision", f"{sc.precision!r} cannot be traced; traceable: {', '.join(TRACEABLE_PRECISIONS)}"
        )
    if sc.optimizer not in TRACEABLE_OPTIMIZERS:
        raise ScenarioError(
            "optimizer",
            f"{sc.optimizer!r} cannot be traced (not in torch.optim); traceable: "
            f"{', '.join(TRACEABLE_OPTIMIZERS)}",
        )
    if (sc.parallel.world_size > 1 or sc.parallel.ep > 1) and architecture_for(sc.model).extra.get("vision"):
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
    if sc.optimizer_in_backward:
        raise ScenarioError("optimizer_in_backward", "not traced; set it to false")
    _check_model_kernels(sc)
    _check_objective(sc)
    if sc.grad_accum_steps > 1:
        raise ScenarioError("grad_accum_steps", "a trace runs single micro-batch steps; set it to 1")


#: Objectives whose training step the tracer runs (``trace/objectives.py``) (every objective; the rollout phase is not traced).
TRACEABLE_OBJECTIVES = ("sft", "dpo", "orpo", "kto", "grpo", "ppo")


def _check_objective(sc: Scenario) -> None:
    """Raise ScenarioError for an objective step the tracer does not run (the rollout phase is never traced:
    it is held to vLLM's documented arithmetic instead, ``engine/rollout.py``)."""
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
    if sc.attention == "sdpa" and arch.extra.get("attention_sinks"):
        raise ScenarioError(
            "attention",
            f"{arch.extra['hf_class']} has no SDPA path in transformers (attention sinks): trace it with 'eager' "
            "(the engine's 'sdpa' stands for the flash kernel with sinks used on GPUs)",
        )
    parts = arch.extra.get("mlp_parts")
    # every MoE family of transformers 5 but Llama 4 (torch.bmm) runs its experts with grouped_mm
    grouped = any(p.get("experts") and p.get("dispatch") != "dense" for p in parts) if parts else arch.is_moe
    if grouped and sc.precision != "bf16":
        raise ScenarioError(
            "precision",
            f"{sc.precision!r} cannot be traced for {arch.extra['hf_class']}: its grouped_mm experts run in bf16 "
            "only on CPU; trace bf16",
        )


def _check_multi_gpu(sc: Scenario) -> None:
    """Raise ScenarioError for a multi-GPU layout one traced rank cannot reproduce (pp goes to pipeline.py)."""
    from memsim_widget.trace.rank_layout import check_distributed  # torch-free

    if sc.parallel.pp == 1:
        check_distributed(sc)


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
    }
    if architecture_for(sc.model).extra.get("vision"):
        from memsim_widget.engine.context import Context

        ctx = Context(sc)
        kw["vision"] = {"images": ctx.images_per_sample, "freeze": ctx.freeze_vision}
    if sc.activation_checkpointing == "selective-op" or (sc.checkpoint_every or 1) > 1:
        kw["layer_checkpointing"] = (sc.activation_checkpointing, sc.checkpoint_every or 1)
    if sc.method != "full":
        kw["lora"] = {
            "r": sc.lora.rank,
            "lora_alpha": sc.lora.alpha,
            "target_modules": "all-linear" if "all-linear" in sc.lora.targets else list(sc.lora.targets),
            "adapter_dtype": sc.lora.adapter_dtype,
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


def trace_config(sc: Scenario, **extra: Any) -> Any:
    """Trace the scenario's HF model (the SFT step, or the objective's, ``trace/objectives.py``)."""
    kw = {**trace_kwargs(sc), **extra}
    cfg = dict(resolve_model_config(sc.model))
    if "objective" in kw:
        from memsim_widget.trace.objectives import trace_objective

        return trace_objective(cfg, **kw)
    from memsim_widget.trace.hf import trace_hf

    return trace_hf(cfg, **kw)


def trace_scenario(
    scenario: Scenario | dict,
    model_factory: Callable[[], Any] | None = None,
    input_factory: Callable[[], Any] | None = None,
    *,
    progress: bool = False,
    top_n: int = 20,
    rank: int | None = None,
) -> Any:
    """Trace two training steps of the scenario; a user's ``model_factory``/``input_factory`` replace the
    preset's transformers model (the factories' model must return a loss, or an output with ``.loss``).

    A multi-GPU layout traces one ``rank`` of the job (default: a rank of the stage the engine predicts
    highest): dp x tp in ``distributed.py``, pp > 1 in ``pipeline.py``."""
    sc = scenario if isinstance(scenario, Scenario) else Scenario.from_dict(scenario)
    check_traceable(sc)
    if sc.parallel.world_size > 1:
        if model_factory is not None or input_factory is not None:
            raise ScenarioError("parallel", "a user module is traced on one GPU: set dp, tp, pp and cp to 1")
        return _trace_rank(sc, rank, progress=progress, top_n=top_n)
    if rank not in (None, 0):
        raise ScenarioError("rank", f"must be 0 for 1 GPU, got {rank!r}")
    try:
        from memsim_widget.trace.hf import trace_hf
        from memsim_widget.trace.run import trace_training
    except ImportError as exc:  # torch, transformers or peft missing
        raise ScenarioError(
            "trace", f"needs the trace extra: pip install 'memsim-widget[trace]' ({exc.name} is missing)"
        ) from None
    kw = trace_kwargs(sc)
    if model_factory is not None:
        if input_factory is None:
            raise ScenarioError("trace", "a model_factory needs an input_factory")
        if "layer_checkpointing" in kw:
            raise ScenarioError(
                "activation_checkpointing", "selective-op and checkpoint_every trace HF models only"
            )
        return trace_training(
            model_factory,
            input_factory,
            precision=sc.precision,
            optimizer=sc.optimizer,
            optimizer_impl=sc.optimizer_impl,
            gradient_checkpointing=kw["gradient_checkpointing"],
            output_lifetime=kw["output_lifetime"],
            progress=progress,
            top_n=top_n,
        )
    if model_factory is None and sc.objective_name != "sft":
        return trace_config(sc, progress=progress, top_n=top_n)
    return trace_hf(dict(resolve_model_config(sc.model)), progress=progress, top_n=top_n, **kw)


def _trace_rank(sc: Scenario, rank: int | None, *, progress: bool, top_n: int) -> Any:
    """Trace one rank of a multi-GPU job: pipelines in ``pipeline.py``, the rest in ``distributed.py``."""
    try:
        from memsim_widget.trace import distributed
    except ImportError as exc:
        raise ScenarioError(
            "trace", f"needs the trace extra: pip install 'memsim-widget[trace]' ({exc.name} is missing)"
        ) from None
    rank = distributed.default_rank(sc) if rank is None else rank
    distributed.check_rank(sc, rank)
    if sc.parallel.pp == 1:
        return distributed.trace_distributed(
            sc,
            rank=rank,
            progress=progress,
            top_n=top_n,
            reshard_after_forward=sc.parallel.reshard_after_forward,
        )
    try:
        from memsim_widget.trace.pipeline import trace_pipeline
    except ModuleNotFoundError as exc:
        if exc.name != "memsim_widget.trace.pipeline":
            raise
        raise ScenarioError("parallel.pp", "pipeline tracing not available") from None
    return trace_pipeline(sc, rank=rank, progress=progress, top_n=top_n)


def traced_stage(sc: Scenario, rank: int) -> int:
    """The pipeline stage of a global rank (pp is the outermost mesh dimension)."""
    return rank // (sc.parallel.world_size // sc.parallel.pp)


def simulated_components(sc: Scenario, rank: int = 0) -> dict[str, Any]:
    """The engine's live tensor bytes for the same scenario and the traced rank's pipeline stage, at its
    moment with the most tensor bytes."""
    from memsim_widget.engine.core import estimate

    est = estimate(sc)
    stage = est.ranks[traced_stage(sc, rank)] if len(est.ranks) > 1 else est.ranks[0]
    moment = max(stage.moments, key=lambda m: m.tensor_bytes)
    comps: dict[str, int] = {}
    for i in moment.items:
        if i.level == "tensor":
            comps[i.category] = comps.get(i.category, 0) + i.bytes
    return {
        "peak_tensor_bytes": stage.peak_tensor_bytes,
        "peak_phase": moment.name,
        "stage": stage.stage.index,
        "role": est.role(stage),
        "components": {k: v for k, v in comps.items() if v},
    }


def trace_report(sc: Scenario, result: Any) -> dict[str, Any]:
    """The JSON form of a trace, with the keys ``memsim estimate --json`` uses where they apply, and the
    engine's simulation of the same step under ``simulated``."""
    components: dict[str, int] = {}
    for role, nbytes in result.by_role.items():
        cat = ROLE_CATEGORY.get(role, "temporaries")
        components[cat] = components.get(cat, 0) + nbytes
    return {
        "scenario": sc.to_dict(),
        "model": {"parameters": result.parameters, "trainable_parameters": result.trainable_parameters},
        "peak_tensor_bytes": result.peak_bytes,
        "peak_phase": result.peak_phase,
        "peak_op": result.peak_op,
        "peak_step": result.peak_step,
        "step1_peak_tensor_bytes": result.step1_peak_bytes,
        "components": components,
        "by_role": result.by_role,
        "timeline": result.timeline,
        "top": result.top,
        "notes": result.notes,
        "rank": result.rank,
        "world_size": result.world_size,
        "rank_role": result.rank_role,
        "layout": result.layout,
        "counter": "live tensor bytes on fake tensors (compare with peak_tensor_bytes of memsim estimate)",
        "simulated": simulated_components(sc, result.rank),
    }
