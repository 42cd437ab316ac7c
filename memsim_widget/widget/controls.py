"""Which controls apply to a scenario: resetting inapplicable ones, disabling them (both read the rules table,
``memsim_widget.rules``), and the ``options`` trait."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from memsim_widget import charts as charts_mod
from memsim_widget.catalog.gpus import GPUS
from memsim_widget.catalog.models import PRESET_INFO, architecture_for, preset_ids
from memsim_widget.engine.items import CATEGORIES
from memsim_widget.fp8 import FP8_RECIPES
from memsim_widget.optimizers import OPTIMIZER_IMPLS, OPTIMIZERS
from memsim_widget.precision import PRECISIONS
from memsim_widget.rules import RULES, UNJUDGED
from memsim_widget.scenario import (
    ADAPTER_DTYPES,
    ATTENTIONS,
    CHECKPOINTING,
    DEFAULTS,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    OBJECTIVES,
    OFFLOADS,
    OPTIONAL_KEYS,
    OUTPUT_LIFETIMES,
    PP_SCHEDULES,
    REFERENCES,
    ROLLOUTS,
    ZERO_STAGES,
    LoraConfig,
    ParallelConfig,
    RLConfig,
)
from memsim_widget.widget.scenario_edits import merge

#: Keys of a llama-style inline model config that the "custom" model controls edit.
CUSTOM_DIMS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)

#: Every control the front end draws, in order: (scenario key, dotted for nested keys; label; kind, the input
#: it is drawn as; fieldset). Sent once per ``options`` as ``controls`` (dicts), so the front end renders the
#: controls from data. Kinds: ``model`` (preset name or "custom"), ``dim`` (a custom model dimension), ``gpu``,
#: ``number`` (a float), ``headroom`` (a percent slider), ``log`` (a slider over ``stops``), ``int``, ``select``
#: (one of ``choices``), ``bool`` (a checkbox), ``targets`` (LoRA target checkboxes).
CONTROLS: tuple[tuple[str, str, str, str], ...] = (
    ("model", "model", "model", "Model"),
    ("model.hidden_size", "hidden size", "dim", "Model"),
    ("model.num_hidden_layers", "layers", "dim", "Model"),
    ("model.num_attention_heads", "heads", "dim", "Model"),
    ("model.num_key_value_heads", "kv heads", "dim", "Model"),
    ("model.intermediate_size", "intermediate", "dim", "Model"),
    ("model.vocab_size", "vocab", "dim", "Model"),
    ("gpu", "GPU", "gpu", "Hardware"),
    ("gpu.memory_gib", "memory (GiB)", "number", "Hardware"),
    ("headroom", "headroom", "headroom", "Hardware"),
    ("micro_batch_size", "micro-batch", "log", "Batch"),
    ("seq_len", "sequence length", "log", "Batch"),
    ("grad_accum_steps", "grad accumulation", "int", "Batch"),
    ("precision", "precision", "select", "Training"),
    ("fp8_recipe", "fp8 recipe", "select", "Training"),
    ("optimizer", "optimizer", "select", "Training"),
    ("optimizer_impl", "implementation", "select", "Training"),
    ("optimizer_in_backward", "optimizer in backward", "bool", "Training"),
    ("activation_checkpointing", "checkpointing", "select", "Training"),
    ("checkpoint_every", "checkpoint every N layers", "int", "Training"),
    ("attention", "attention", "select", "Training"),
    ("loss", "loss", "select", "Training"),
    ("framework", "framework", "select", "Training"),
    ("output_lifetime", "outputs kept", "select", "Training"),
    ("method", "method", "select", "Method"),
    ("lora.rank", "LoRA rank", "int", "Method"),
    ("lora.alpha", "LoRA alpha", "number", "Method"),
    ("lora.adapter_dtype", "adapter dtype", "select", "Method"),
    ("lora.targets", "LoRA targets", "targets", "Method"),
    ("objective", "objective", "select", "Objective"),
    ("rl.num_generations", "G (completions per prompt)", "int", "Objective"),
    ("rl.completion_len", "completion length", "int", "Objective"),
    ("rl.reference", "reference model", "select", "Objective"),
    ("rl.rollout", "rollout engine", "select", "Objective"),
    ("rl.gpu_memory_utilization", "vLLM gpu_memory_utilization", "number", "Objective"),
    ("rl.sleep_mode", "vLLM sleep mode", "select", "Objective"),
    ("parallel.dp", "dp", "int", "Parallel"),
    ("parallel.tp", "tp", "int", "Parallel"),
    ("parallel.pp", "pp", "int", "Parallel"),
    ("parallel.cp", "cp", "int", "Parallel"),
    ("parallel.ep", "ep", "int", "Parallel"),
    ("parallel.zero", "ZeRO stage", "select", "Parallel"),
    ("parallel.sequence_parallel", "sequence parallel", "bool", "Parallel"),
    ("parallel.reshard_after_forward", "reshard after forward", "bool", "Parallel"),
    ("parallel.offload", "offload", "select", "Parallel"),
    ("parallel.pp_schedule", "pp schedule", "select", "Parallel"),
    ("parallel.pp_microbatches", "pp micro-batches", "int", "Parallel"),
    ("parallel.virtual_stages", "virtual stages", "int", "Parallel"),
)  # fmt: skip

#: Error fields that name no control, and the control that sets them (``num_gpus`` follows dp).
CONTROL_ALIASES = {"num_gpus": "parallel.dp"}


def _arch(model: Any) -> Any:
    """The architecture of a model input, or None when it cannot be resolved, or not at once (a calibrated
    model's first build runs in the background: ``calibration_panel.resolves_at_once``)."""
    from memsim_widget.widget.calibration_panel import resolves_at_once

    try:
        if not resolves_at_once(model):
            return None
        return architecture_for(model)
    except Exception:  # any unresolvable input: the scenario check reports it
        return None


def _linear_modules(arch: Any) -> list[str]:
    """Names of the Linear modules of an architecture (LoRA targets)."""
    return sorted({g.module for g in arch.params if g.module}) if arch is not None else []


_UNRESOLVED = object()


def rules_view(data: Mapping[str, Any], arch: Any = _UNRESOLVED) -> dict[str, Any]:
    """What the controls show, as a rules view (``memsim_widget.rules``): every dotted key, its default where
    unset (values are raw: the rules a bad value cannot answer are left to the scenario check), ``objective``
    resolved, and the model's ``arch`` and ``linear_modules`` when the model resolves (``arch``: the model's
    architecture already resolved by the caller, None where it does not resolve)."""
    view: dict[str, Any] = {**DEFAULTS, **OPTIONAL_KEYS, **data}
    for section, defaults in (
        ("parallel", ParallelConfig().to_dict()),
        ("lora", LoraConfig().to_dict()),
        ("rl", RLConfig().to_dict()),
    ):
        given = data.get(section)
        for key, value in {**defaults, **(given if isinstance(given, Mapping) else {})}.items():
            view[f"{section}.{key}"] = value
    view["objective"] = data.get("objective") or "sft"
    if arch is _UNRESOLVED:
        arch = _arch(data.get("model"))
    if arch is not None:
        view.update(arch=arch, linear_modules=_linear_modules(arch))
    return view


def normalize(data: Mapping[str, Any], changed: set[str]) -> dict[str, Any]:
    """Reset controls that a change made inapplicable to their neutral value, unless they changed themselves.

    Each rule of ``memsim_widget.rules`` that the change broke and that has a reset applies it, in table order:
    e.g. tp back to 1 turns sequence parallelism off; ZeRO 0 turns offload off; an optimizer without the current
    implementation switches to one it has. A value set explicitly in the same change is kept, so an impossible
    combination typed on purpose still reports its error.
    """
    out = merge(data, {})
    _normalize_objective(out, changed)
    arch = _arch(out.get("model"))  # resolved once: a reset never sets the model
    view = rules_view(out, arch)
    for rule in RULES:
        if rule.reset is None or rule.field in changed:
            continue
        if rule.judge(rule.broken, view):
            _set(out, rule.field, rule.reset(view))
            view = rules_view(out, _arch(out.get("model")) if rule.field == "model" else arch)
    return out


def _set(out: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key of a scenario dict (nothing where its section is not an object)."""
    section, _, sub = key.partition(".")
    if not sub:
        out[key] = value
    elif isinstance(out.get(section), dict):
        out[section][sub] = value


def _normalize_objective(out: dict[str, Any], changed: set[str]) -> None:
    """The ``rl`` block of ``out`` (in place): dropped when the objective becomes sft (unless edited in the same
    change, so the error shows), filled with its defaults when an objective needs it and has none (a block that
    is not an object is left for the scenario check to name)."""
    edited = any(k == "rl" or k.startswith("rl.") for k in changed)
    if (out.get("objective") or "sft") == "sft":
        if isinstance(out.get("rl"), dict) and not edited:
            out.pop("rl")
    elif out.get("rl") is None:
        out["rl"] = RLConfig().to_dict()


def disabled_controls(
    data: Mapping[str, Any], arch: Any = _UNRESOLVED
) -> tuple[dict[str, str], dict[str, list[Any]]]:
    """Controls that do not apply to ``data`` (key -> reason) and per-control values that are not offered: each
    rule of ``memsim_widget.rules`` that disables its control now, with its message (the first rule wins).
    ``arch``: the model's architecture already resolved (as ``rules_view``)."""
    off: dict[str, str] = {}
    values: dict[str, list[Any]] = {}
    if not isinstance(data.get("model"), Mapping):
        for dim in CUSTOM_DIMS:
            off[f"model.{dim}"] = "pick 'custom' as the model to edit its dimensions"
    if not isinstance(data.get("gpu"), Mapping):
        off["gpu.memory_gib"] = "pick 'custom' as the GPU to set its memory"
    view = rules_view(data, arch)
    for rule in RULES:
        if rule.field not in off and rule.judge(rule.disabled, view):
            try:
                off[rule.field] = rule.text(view)
            except UNJUDGED:  # a message the typed values cannot fill: the rule's name says why
                off[rule.field] = rule.name
    for rule in RULES:
        if rule.refused is None or rule.field in off:
            continue
        try:
            refused = rule.refused(view)
        except UNJUDGED:
            continue
        if refused:
            values[rule.field] = refused
    return off, values


@functools.cache
def _static_options() -> dict[str, Any]:
    """The parts of ``options`` that never change: controls, presets, GPUs, choices, slider stops, descriptions."""
    presets = []
    for pid in preset_ids():
        info = PRESET_INFO.get(pid, {})
        presets.append(
            {
                "id": pid,
                "params": info.get("params_label", ""),
                "description": info.get("description", ""),
                "label": f"{pid} ({info.get('params_label', '?')}): {info.get('description', '')}",
            }
        )
    return {
        "presets": presets,
        "gpus": [{"id": g.id, "name": g.name, "memory_gib": round(g.memory_gib, 2)} for g in GPUS.values()],
        "choices": {
            "method": list(METHODS),
            "precision": list(PRECISIONS),
            "fp8_recipe": [None, *FP8_RECIPES],  # None: unset (te-delayed under precision fp8, else no fp8)
            "optimizer": list(OPTIMIZERS),
            "optimizer_impl": list(OPTIMIZER_IMPLS),
            "activation_checkpointing": list(CHECKPOINTING),
            "attention": list(ATTENTIONS),
            "loss": list(LOSSES),
            "framework": list(FRAMEWORKS),
            "output_lifetime": [None, *OUTPUT_LIFETIMES],  # None: unset, the framework's own
            "lora.adapter_dtype": list(ADAPTER_DTYPES),
            "parallel.zero": list(ZERO_STAGES),
            "parallel.pp_schedule": list(PP_SCHEDULES),
            "parallel.offload": list(OFFLOADS),
            "objective": [None, *OBJECTIVES],  # None: unset, sft
            "rl.reference": [None, *REFERENCES],  # None: the objective's default
            "rl.rollout": list(ROLLOUTS),
            "rl.sleep_mode": [0, 1, 2],
        },
        "choice_labels": {  # the text of a choice where its value alone says too little ("null": None)
            "output_lifetime": {
                "null": "framework's own",
                "trainer": "trainer: dropped before backward",
                "backward": "backward: kept until backward ends",
                "step": "step: kept through optimizer.step",
            },
            "objective": {"null": "sft (unset)"},
            "fp8_recipe": {"null": "none (te-delayed under fp8)"},
            "rl.reference": {"null": "objective's default"},
            "rl.sleep_mode": {"0": "off", "1": "level 1: weights to host", "2": "level 2: discard weights"},
        },
        "descriptions": {
            "precision": {k: v.description for k, v in PRECISIONS.items()},
            "fp8_recipe": {k: v.description for k, v in FP8_RECIPES.items()},
            "optimizer": {k: v.description for k, v in OPTIMIZERS.items()},
        },
        "stops": {
            "micro_batch_size": list(charts_mod.MICRO_BATCH_STOPS),
            "seq_len": list(charts_mod.SEQ_LEN_STOPS),
        },
        "controls": [dict(zip(("key", "label", "kind", "group"), c, strict=True)) for c in CONTROLS],
        "control_aliases": dict(CONTROL_ALIASES),
        "custom_dims": list(CUSTOM_DIMS),
        "categories": list(CATEGORIES),
    }


def build_options(data: Mapping[str, Any], arch: Any = _UNRESOLVED) -> dict[str, Any]:
    """The ``options`` trait for a (possibly invalid) scenario dict: choices plus what is disabled now. ``arch``: the
    model's architecture already resolved (as ``rules_view``)."""
    if arch is _UNRESOLVED:
        arch = _arch(data.get("model"))
    disabled, disabled_values = disabled_controls(data, arch)
    dims = {}
    if arch is not None:
        dims = {
            "hidden_size": arch.hidden_size,
            "num_hidden_layers": arch.num_layers,
            "num_attention_heads": arch.num_heads,
            "num_key_value_heads": arch.num_kv_heads,
            "intermediate_size": arch.intermediate_size,
            "vocab_size": arch.vocab_size,
        }
    return {
        **_static_options(),
        "disabled": disabled,
        "disabled_values": disabled_values,
        "model_dims": dims,
        "lora_targets": ["all-linear", *_linear_modules(arch)],
        "num_experts": arch.num_experts if arch is not None else 0,
        "fixed_seq_len": arch.fixed_seq_len if arch is not None else None,
    }
