"""Trace a scenario: the same training step the engine simulates, run on fake tensors.

``trace_scenario(scenario)`` builds the scenario's model from its HF config (or a user's own module
factory) and returns a ``TraceResult``; ``trace_report`` turns it into the JSON the CLI prints, with
the same keys as ``memsim estimate --json`` where they apply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memsim_widget.catalog.models import resolve_model_config
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
}
TRACEABLE_PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
TRACEABLE_OPTIMIZERS = ("adamw", "adam", "sgd", "sgd-momentum", "adafactor")


def check_traceable(sc: Scenario) -> None:
    """Raise ScenarioError for what one CPU process cannot trace (naming the field and why)."""
    if sc.method == "qlora":
        raise ScenarioError("method", "qlora cannot be traced: bitsandbytes' 4-bit kernels need CUDA")
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
    if sc.parallel.world_size > 1 or sc.parallel.ep > 1:
        raise ScenarioError("parallel", "a trace runs one process: set dp, tp, pp, cp and ep to 1")
    if sc.activation_checkpointing == "selective":
        raise ScenarioError(
            "activation_checkpointing", "HF models have no selective checkpointing to trace; use none or full"
        )
    if sc.loss == "chunked":
        raise ScenarioError("loss", "HF models compute the standard loss; the chunked loss cannot be traced")
    if sc.optimizer_in_backward:
        raise ScenarioError("optimizer_in_backward", "not traced; set it to false")
    if sc.grad_accum_steps > 1:
        raise ScenarioError("grad_accum_steps", "a trace runs single micro-batch steps; set it to 1")


def trace_kwargs(sc: Scenario) -> dict[str, Any]:
    """The tracer's arguments for the same training step as ``sc``."""
    kw: dict[str, Any] = {
        "micro_batch_size": sc.micro_batch_size,
        "seq_len": sc.seq_len,
        "precision": sc.precision,
        "optimizer": sc.optimizer,
        "optimizer_impl": sc.optimizer_impl,
        "attention": sc.attention,
        "gradient_checkpointing": sc.activation_checkpointing == "full",
    }
    if sc.method != "full":
        kw["lora"] = {
            "r": sc.lora.rank,
            "lora_alpha": sc.lora.alpha,
            "target_modules": "all-linear" if "all-linear" in sc.lora.targets else list(sc.lora.targets),
            "adapter_dtype": sc.lora.adapter_dtype,
        }
    return kw


def trace_scenario(
    scenario: Scenario | dict,
    model_factory: Callable[[], Any] | None = None,
    input_factory: Callable[[], Any] | None = None,
    *,
    progress: bool = False,
    top_n: int = 20,
) -> Any:
    """Trace two training steps of the scenario; a user's ``model_factory``/``input_factory`` replace the
    preset's transformers model (the factories' model must return a loss, or an output with ``.loss``)."""
    sc = scenario if isinstance(scenario, Scenario) else Scenario.from_dict(scenario)
    check_traceable(sc)
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
        return trace_training(
            model_factory,
            input_factory,
            precision=sc.precision,
            optimizer=sc.optimizer,
            optimizer_impl=sc.optimizer_impl,
            gradient_checkpointing=kw["gradient_checkpointing"],
            progress=progress,
            top_n=top_n,
        )
    return trace_hf(dict(resolve_model_config(sc.model)), progress=progress, top_n=top_n, **kw)


def simulated_components(sc: Scenario) -> dict[str, Any]:
    """The engine's live tensor bytes for the same scenario, at its moment with the most tensor bytes."""
    from memsim_widget.engine.core import estimate

    est = estimate(sc)
    moment = max(est.worst.moments, key=lambda m: m.tensor_bytes)
    comps: dict[str, int] = {}
    for i in moment.items:
        if i.level == "tensor":
            comps[i.category] = comps.get(i.category, 0) + i.bytes
    return {
        "peak_tensor_bytes": est.peak_tensor_bytes,
        "peak_phase": moment.name,
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
        "counter": "live tensor bytes on fake tensors (compare with peak_tensor_bytes of memsim estimate)",
        "simulated": simulated_components(sc),
    }
