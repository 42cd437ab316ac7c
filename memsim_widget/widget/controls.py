"""Which controls apply to a scenario: resetting inapplicable ones, disabling them, and the ``options`` trait."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from memsim_widget import charts as charts_mod
from memsim_widget.catalog.gpus import GPUS
from memsim_widget.catalog.models import PRESET_INFO, architecture_for, preset_ids
from memsim_widget.engine.items import CATEGORIES
from memsim_widget.optimizers import OPTIMIZERS
from memsim_widget.precision import PRECISIONS
from memsim_widget.scenario import (
    ADAPTER_DTYPES,
    ATTENTIONS,
    CHECKPOINTING,
    FRAMEWORKS,
    LOSSES,
    METHODS,
    OBJECTIVES,
    OFFLOADS,
    OPTIMIZER_IMPLS,
    OUTPUT_LIFETIMES,
    PP_SCHEDULES,
    REFERENCES,
    ROLLOUTS,
    ZERO_STAGES,
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
    """The architecture of a model input, or None when it cannot be resolved."""
    try:
        return architecture_for(model)
    except Exception:  # any unresolvable input: the scenario check reports it
        return None


def _linear_modules(arch: Any) -> list[str]:
    """Names of the Linear modules of an architecture (LoRA targets)."""
    return sorted({g.module for g in arch.params if g.module}) if arch is not None else []


def normalize(data: Mapping[str, Any], changed: set[str]) -> dict[str, Any]:
    """Reset controls that a change made inapplicable to their neutral value, unless they changed themselves.

    E.g. tp back to 1 turns sequence parallelism off; ZeRO 0 turns offload off; an optimizer without the
    current implementation switches to one it has. A value set explicitly in the same change is kept, so an
    impossible combination typed on purpose still reports its error.
    """
    out = merge(data, {})
    par = out.get("parallel") if isinstance(out.get("parallel"), dict) else {}
    lora = out.get("lora") if isinstance(out.get("lora"), dict) else {}
    rl = _normalize_objective(out, changed)

    def fix(key: str, ok: bool, value: Any) -> None:
        if ok or key in changed:
            return
        section, _, sub = key.partition(".")
        if sub:
            {"parallel": par, "lora": lora, "rl": rl}[section][sub] = value
        else:
            out[key] = value

    tp, zero, pp = par.get("tp", 1), par.get("zero", 0), par.get("pp", 1)
    fix("parallel.sequence_parallel", tp != 1 or not par.get("sequence_parallel"), False)
    offload = par.get("offload", "none")
    fix("parallel.offload", zero != 0 or offload == "none", "none")
    offload = par.get("offload", "none")
    fix("parallel.offload", zero in (0, 3) or offload != "optimizer+params", "optimizer")
    schedule = par.get("pp_schedule", "1f1b")
    fix("parallel.pp_schedule", pp != 1 or schedule == "1f1b", "1f1b")
    schedule = par.get("pp_schedule", "1f1b")
    vs = par.get("virtual_stages", 1)
    if schedule == "interleaved":
        fix("parallel.virtual_stages", not isinstance(vs, int) or vs >= 2, 2)
    else:
        fix("parallel.virtual_stages", vs == 1, 1)
    spec = _optimizer_spec(out.get("optimizer"))
    if spec is not None and spec.impls and out.get("optimizer") != "none":
        fix("optimizer_impl", out.get("optimizer_impl") in spec.impls, spec.impls[0])
    megatron_op = out.get("framework") == "megatron" and out.get("activation_checkpointing") == "selective-op"
    fix("activation_checkpointing", not megatron_op, "selective")
    every = out.get("checkpoint_every")
    fix("checkpoint_every", out.get("activation_checkpointing") == "full" or every in (None, 1), None)
    gas = out.get("grad_accum_steps", 1)
    fix(
        "optimizer_in_backward",
        not out.get("optimizer_in_backward") or (gas == 1 and out.get("optimizer") != "none"),
        False,
    )
    obj = out.get("objective") or "sft"
    if obj != "sft":
        online = obj in ("grpo", "ppo")
        fix("rl.rollout", online or rl.get("rollout", "none") == "none", "none")
        ref = rl.get("reference")
        needs_ref = obj in ("dpo", "kto", "ppo")
        fix("rl.reference", not (obj == "orpo" and ref not in (None, "none")), None)
        fix("rl.reference", not (needs_ref and ref == "none"), None)
        fix("rl.reference", not (ref == "shared_base" and out.get("method") == "full"), None)
        seq, comp = out.get("seq_len"), rl.get("completion_len")
        too_long = online and isinstance(seq, int) and isinstance(comp, int) and comp >= seq
        fix("rl.completion_len", not too_long, max(1, seq // 2) if isinstance(seq, int) else comp)
    arch = _arch(out.get("model"))
    if arch is not None:
        fix("parallel.ep", arch.is_moe or par.get("ep", 1) == 1, 1)
        # a model with a learned position table (GPT-2, BERT) picked at a longer sequence: the table's length
        limit, seq = getattr(arch, "max_seq_len", None), out.get("seq_len")
        fix("seq_len", limit is None or not isinstance(seq, int) or seq <= limit, limit)
        modules = _linear_modules(arch)
        targets = lora.get("targets")
        if out.get("method") != "full" and isinstance(targets, list | tuple) and targets:
            kept = [t for t in targets if t in modules or t == "all-linear"]
            fix("lora.targets", kept == list(targets), kept or ["all-linear"])
    return out


def _normalize_objective(out: dict[str, Any], changed: set[str]) -> dict[str, Any]:
    """The ``rl`` block of ``out`` (in place): dropped when the objective becomes sft (unless edited in the same
    change, so the error shows), filled with its defaults when an objective needs it and has none."""
    rl = out.get("rl") if isinstance(out.get("rl"), dict) else None
    edited = any(k == "rl" or k.startswith("rl.") for k in changed)
    if (out.get("objective") or "sft") == "sft":
        if rl is not None and not edited:
            out.pop("rl")
        return {}
    if rl is None:
        if out.get("rl") is not None:  # not an object: the scenario check names it
            return {}
        rl = out["rl"] = RLConfig().to_dict()
    return rl


def _optimizer_spec(name: Any) -> Any:
    """The catalog entry of an optimizer name; None for anything else (a list or dict typed into the JSON)."""
    return OPTIMIZERS.get(name) if isinstance(name, str) else None


def disabled_controls(data: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, list[Any]]]:
    """Controls that do not apply to ``data`` (key -> reason) and per-control values that are not offered."""
    par = data.get("parallel") if isinstance(data.get("parallel"), Mapping) else {}
    off: dict[str, str] = {}
    values: dict[str, list[Any]] = {}
    model = data.get("model")
    if not isinstance(model, Mapping):
        for dim in CUSTOM_DIMS:
            off[f"model.{dim}"] = "pick 'custom' as the model to edit its dimensions"
    if not isinstance(data.get("gpu"), Mapping):
        off["gpu.memory_gib"] = "pick 'custom' as the GPU to set its memory"
    if data.get("method", "full") == "full":
        for key in ("lora.rank", "lora.alpha", "lora.targets", "lora.adapter_dtype"):
            off[key] = "LoRA settings apply to method lora or qlora"
    if par.get("tp", 1) == 1:
        off["parallel.sequence_parallel"] = "sequence parallelism needs tp > 1"
    if par.get("zero", 0) != 3 or par.get("dp", 1) * par.get("cp", 1) == 1:
        off["parallel.reshard_after_forward"] = "resharding after forward is FSDP's (ZeRO-3 with dp > 1)"
    if par.get("zero", 0) == 0:
        off["parallel.offload"] = "offload needs ZeRO stage >= 1"
    elif par.get("zero") != 3:
        values["parallel.offload"] = ["optimizer+params"]
    if par.get("pp", 1) == 1:
        for key in ("parallel.pp_schedule", "parallel.pp_microbatches", "parallel.virtual_stages"):
            off[key] = "pipeline settings need pp > 1"
    elif par.get("pp_schedule") != "interleaved":
        off["parallel.virtual_stages"] = "virtual stages need the interleaved schedule"
    optimizer = data.get("optimizer")
    spec = _optimizer_spec(optimizer)
    if optimizer == "none":
        off["optimizer_impl"] = "no optimizer step"
        off["optimizer_in_backward"] = "no optimizer step"
    elif spec is not None:
        missing = [impl for impl in OPTIMIZER_IMPLS if impl not in spec.impls]
        if missing:
            values["optimizer_impl"] = missing
    if data.get("activation_checkpointing") != "full":
        off["checkpoint_every"] = "checkpointing every N-th layer applies to full checkpointing"
    if data.get("framework") == "megatron":
        values["activation_checkpointing"] = ["selective-op"]
        off["output_lifetime"] = "Megatron's schedule keeps only the loss of the model output"
    if data.get("grad_accum_steps", 1) != 1:
        off["optimizer_in_backward"] = "stepping in backward cannot accumulate gradients"
    _disabled_objective(data, off)
    arch = _arch(model)
    if arch is not None:
        if not arch.is_moe:
            off["parallel.ep"] = "expert parallelism needs a mixture-of-experts model"
        if arch.fixed_seq_len:
            off["seq_len"] = f"the model's sequence is fixed ({arch.fixed_seq_len} tokens)"
    return off, values


#: The objective's controls (the ``rl`` block) and the objectives each applies to.
RL_CONTROLS = {
    "rl.num_generations": ("grpo",),
    "rl.completion_len": ("grpo", "ppo"),
    "rl.reference": ("dpo", "kto", "grpo", "ppo"),
    "rl.rollout": ("grpo", "ppo"),
    "rl.gpu_memory_utilization": ("grpo", "ppo"),
    "rl.sleep_mode": ("grpo", "ppo"),
}


def _disabled_objective(data: Mapping[str, Any], off: dict[str, str]) -> None:
    """The ``rl`` controls that do not apply to the scenario's objective (and rollout engine)."""
    obj = data.get("objective") or "sft"
    rl = data.get("rl") if isinstance(data.get("rl"), Mapping) else {}
    for key, objectives in RL_CONTROLS.items():
        if obj not in objectives:
            off[key] = f"applies to objective {' or '.join(objectives)}"
    if obj in ("grpo", "ppo") and rl.get("rollout", "none") != "vllm_colocate":
        off["rl.sleep_mode"] = "sleep mode applies to a colocated vLLM engine (rollout vllm_colocate)"
        if rl.get("rollout", "none") == "none":
            off["rl.gpu_memory_utilization"] = "applies to a vLLM rollout engine"


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
            "rl.reference": {"null": "objective's default"},
            "rl.sleep_mode": {"0": "off", "1": "level 1: weights to host", "2": "level 2: discard weights"},
        },
        "descriptions": {
            "precision": {k: v.description for k, v in PRECISIONS.items()},
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


def build_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ``options`` trait for a (possibly invalid) scenario dict: choices plus what is disabled now."""
    disabled, disabled_values = disabled_controls(data)
    arch = _arch(data.get("model"))
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
