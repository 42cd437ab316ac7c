"""Trace a scenario: the same training step the engine simulates, run on fake tensors.

``trace_scenario(scenario)`` builds the scenario's model from its HF config (or a user's own module
factory) and returns a ``TraceResult``; ``trace_report`` turns it into the JSON the CLI prints, with
the same keys as ``memsim estimate --json`` where they apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memsim_widget.catalog.models import resolve_model_config
from memsim_widget.engine.items import Category, Level
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario
from memsim_widget.trace.traceable import check_traceable, trace_kwargs

#: Tracker roles -> breakdown categories (the engine's names).
ROLE_CATEGORY = {
    "parameter": Category.PARAMETERS,
    "buffer": Category.PARAMETERS,
    "gradient": Category.GRADIENTS,
    "optimizer_state": Category.OPTIMIZER_STATES,
    "activation": Category.ACTIVATIONS,
    "input": Category.ACTIVATIONS,
    "temporary": Category.TEMPORARIES,
    "unsharded_parameter": Category.PARAMETERS,
    "collective": Category.TEMPORARIES,
}


def trace_config(sc: Scenario, **extra: Any) -> Any:
    """Trace the scenario's HF model (the SFT step, or the objective's, ``trace/objectives.py``)."""
    kw = {**trace_kwargs(sc), **extra}
    cfg = dict(resolve_model_config(sc.model))
    if sc.framework == "litgpt":  # litgpt's own model and finetune loop (trace/litgpt.py)
        return _trace_litgpt(cfg, kw)
    if "objective" in kw:
        from memsim_widget.trace.objectives import trace_objective

        return trace_objective(cfg, **kw)
    from memsim_widget.trace.hf import trace_hf

    return trace_hf(cfg, **kw)


def _trace_litgpt(cfg: dict[str, Any], kw: dict[str, Any]) -> Any:
    """litgpt's step on the preset's dimensions: the HF tracer's arguments it shares (no attention or
    output-lifetime choice: litgpt's loop fixes both)."""
    from memsim_widget.trace.litgpt import trace_litgpt

    if "layer_checkpointing" in kw or "objective" in kw or "compile_budget" in kw:
        raise ScenarioError(
            "framework", "litgpt traces the plain SFT step (no compile, selective-op or objective)"
        )
    keep = ("micro_batch_size", "seq_len", "precision", "optimizer", "optimizer_impl", "gradient_checkpointing",
            "lora", "progress", "top_n")  # fmt: skip
    return trace_litgpt(cfg, **{k: v for k, v in kw.items() if k in keep})


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
            compile_budget=kw.get("compile_budget"),
            progress=progress,
            top_n=top_n,
        )
    if model_factory is None and (sc.objective_name != "sft" or sc.framework == "litgpt"):
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
    stage = est.ranks[traced_stage(sc, rank)] if len(est.ranks) > 1 else est.ranks[0]  # pyright: ignore[reportGeneralTypeIssues]
    moment = max(stage.moments, key=lambda m: m.tensor_bytes)
    comps: dict[str, int] = {}
    for i in moment.items:
        if i.level == Level.TENSOR:
            comps[i.category] = comps.get(i.category, 0) + i.bytes
    return {
        "peak_tensor_bytes": stage.peak_tensor_bytes,
        "peak_allocated_bytes": stage.peak_allocated_bytes,
        "peak_reserved_bytes": stage.peak_reserved_bytes,
        "device_total_bytes": stage.device_total_bytes,
        "peak_phase": moment.name,
        "stage": stage.stage.index,
        "role": est.role(stage),
        "components": {k: v for k, v in comps.items() if v},
    }


def trace_report(sc: Scenario, result: Any) -> dict[str, Any]:
    """The JSON form of a trace, with the keys ``memsim estimate --json`` uses where they apply, and the
    engine's simulation of the same step under ``simulated``."""
    from memsim_widget.trace.replay import traced_counters

    components: dict[str, int] = {}
    for role, nbytes in result.by_role.items():
        cat = ROLE_CATEGORY.get(role, Category.TEMPORARIES)
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
        # the three GPU counters of the traced run: its allocations and frees replayed through PyTorch's caching
        # allocator (engine/counters/allocator.py), nvidia-smi adding the context and NCCL as the engine models them
        "counters": traced_counters(sc, result),
        "simulated": simulated_components(sc, result.rank),
    }
