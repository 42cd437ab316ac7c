"""torchtune launch: ``tune run`` of a distributed recipe with the recipe config's keys overridden.

torchtune 0.6 reads ``key=value`` overrides (OmegaConf dotlist, ``~key`` removes one) on top of a shipped
config (torchtune/config/_utils.py ``_merge_yaml_and_cli_args``). Keys from recipes/configs/llama3_1/8B_lora.yaml
and the recipes' ``cfg`` reads (recipes/full_finetune_distributed.py, lora_finetune_distributed.py):
``batch_size``, ``gradient_accumulation_steps``, ``dtype``, ``enable_activation_checkpointing``,
``enable_activation_offloading``, ``compile``, ``optimizer_in_bwd``, ``fsdp_cpu_offload``,
``fsdp_reshard_after_forward``, ``tokenizer.max_seq_len``, ``dataset.packed``, ``loss._component_``, ``model.*``.
"""

from __future__ import annotations

import shlex
from typing import Any

from memsim_widget.export.common import (
    Draft,
    check_common,
    checkpoint_every,
    comment,
    framework_note,
    header_lines,
    refuse,
)

FILE = "torchtune_run.sh"
#: memsim preset -> (config prefix in recipes/configs, model package, builder suffix, has a ``_full`` config).
MODELS: dict[str, tuple[str, str, str, bool]] = {
    "llama-3.1-8b": ("llama3_1/8B", "llama3_1", "llama3_1_8b", True),
    "llama-3.1-70b": ("llama3_1/70B", "llama3_1", "llama3_1_70b", True),
    "llama-3.2-1b": ("llama3_2/1B", "llama3_2", "llama3_2_1b", True),
    "llama-3.2-3b": ("llama3_2/3B", "llama3_2", "llama3_2_3b", True),
    "llama-2-7b": ("llama2/7B", "llama2", "llama2_7b", True),
    "llama-2-13b": ("llama2/13B", "llama2", "llama2_13b", True),
    "mistral-7b": ("mistral/7B", "mistral", "mistral_7b", True),
    "gemma-2-2b": ("gemma2/2B", "gemma2", "gemma2_2b", True),
    "gemma-2-9b": ("gemma2/9B", "gemma2", "gemma2_9b", True),
    "gemma-2-27b": ("gemma2/27B", "gemma2", "gemma2_27b", True),
    "phi-3-mini": ("phi3/mini", "phi3", "phi3_mini", True),
}
#: memsim optimizer -> its ``optimizer._component_``.
OPTIMIZERS = {
    "adamw": "torch.optim.AdamW",
    "adam": "torch.optim.Adam",
    "sgd": "torch.optim.SGD",
    "sgd-momentum": "torch.optim.SGD",
    "adamw-8bit": "bitsandbytes.optim.AdamW8bit",
    "paged-adamw-8bit": "bitsandbytes.optim.PagedAdamW8bit",
}
#: HF module names -> torchtune's attention projections (``lora_attn_modules``).
ATTN = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "o_proj": "output_proj"}
MLP = {"gate_proj", "up_proj", "down_proj"}


def overrides(draft: Draft) -> dict[str, Any]:
    """The recipe-config keys the scenario sets, as dotted keys (a value None removes the key: ``~key``)."""
    sc, fmt, p = draft.scenario, draft.fmt, draft.scenario.parallel
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(p, name) > 1:
            raise refuse(
                f"parallel.{name}", fmt, f"the torchtune recipes here run FSDP only; set {name} to 1"
            )
    if p.world_size > 1 and p.zero != 3:
        raise refuse("parallel.zero", fmt, "torchtune's distributed recipes shard with FSDP2 (zero 3)")
    if p.offload == "optimizer":
        raise refuse("parallel.offload", fmt, "FSDP offloads parameters, gradients and states together; use "
                     "'optimizer+params'")  # fmt: skip
    if sc.precision not in ("bf16", "fp32"):
        raise refuse("precision", fmt, f"torchtune trains in pure bf16 or fp32, got {sc.precision!r}")
    if sc.attention != "sdpa":
        raise refuse("attention", fmt, "torchtune's attention is SDPA")
    if sc.activation_checkpointing not in ("none", "full"):
        raise refuse(
            "activation_checkpointing", fmt, f"{sc.activation_checkpointing!r}: use 'full' or 'none'"
        )
    checkpoint_every(draft)
    check_common(draft, peft=False)
    keys: dict[str, Any] = {
        "batch_size": sc.micro_batch_size,
        "gradient_accumulation_steps": sc.grad_accum_steps,
        "dtype": sc.precision,
        "tokenizer.max_seq_len": sc.seq_len,
        "dataset.packed": sc.padding == "packed",
        "enable_activation_checkpointing": sc.activation_checkpointing == "full",
        "enable_activation_offloading": sc.activation_offloading,
        "compile": sc.compile,
        "optimizer_in_bwd": sc.optimizer_in_backward,
        "loss._component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"
        if sc.loss == "chunked"
        else "torch.nn.CrossEntropyLoss",  # fmt: skip
        **_optimizer(draft),
        **_model(draft),
    }
    if p.world_size > 1:
        keys["fsdp_cpu_offload"] = p.offload == "optimizer+params"
        keys["fsdp_reshard_after_forward"] = p.reshard_after_forward
    if sc.padding == "max_length":
        draft.note("padding max_length: torchtune pads each batch to its longest sample; pad to seq_len in "
                   "your dataset (or set dataset.packed=True)")  # fmt: skip
    return keys


def _optimizer(draft: Draft) -> dict[str, Any]:
    """``optimizer._component_`` and its kernel (the shipped configs say ``fused: True``)."""
    sc = draft.scenario
    if sc.optimizer not in OPTIMIZERS:
        raise refuse("optimizer", draft.fmt, f"{sc.optimizer!r}; allowed: {', '.join(OPTIMIZERS)}")
    keys: dict[str, Any] = {"optimizer._component_": OPTIMIZERS[sc.optimizer]}
    if sc.optimizer in ("adamw", "adam"):
        keys["optimizer.fused"] = sc.optimizer_impl == "fused"
        if sc.optimizer_impl == "for-loop":
            keys["optimizer.foreach"] = False
    else:
        keys["optimizer.fused"] = None  # the constructor takes no ``fused``
    if sc.optimizer == "sgd-momentum":
        keys["optimizer.momentum"] = 0.9
    return keys


def _model(draft: Draft) -> dict[str, Any]:
    """LoRA rank, alpha and targets; QLoRA's builder."""
    sc = draft.scenario
    if sc.method == "full":
        return {}
    _, package, builder, _ = MODELS[str(sc.model)]
    targets = set(sc.lora.targets)
    if targets == {"all-linear"}:
        targets = set(ATTN) | MLP
    unknown = targets - set(ATTN) - MLP
    if unknown or (targets & MLP and targets & MLP != MLP):
        raise refuse("lora.targets", draft.fmt, "torchtune adapts q/k/v/o projections and the whole MLP "
                     f"(gate, up and down together), got {sorted(sc.lora.targets)}")  # fmt: skip
    if sc.lora.adapter_dtype != "bf16" and sc.precision == "bf16":
        draft.note(f"lora.adapter_dtype: torchtune keeps adapters in the model's bf16, memsim assumed "
                   f"{sc.lora.adapter_dtype}; re-estimate with lora.adapter_dtype bf16 for this file")  # fmt: skip
    keys: dict[str, Any] = {
        "model.lora_attn_modules": [ATTN[t] for t in ATTN if t in targets],
        "model.apply_lora_to_mlp": bool(targets & MLP),
        "model.apply_lora_to_output": False,
        "model.lora_rank": sc.lora.rank,
        "model.lora_alpha": sc.lora.alpha,
    }
    if sc.method == "qlora":
        keys["model._component_"] = f"torchtune.models.{package}.qlora_{builder}"
    return keys


def command(draft: Draft) -> list[str]:
    """``tune run`` with its recipe, config and overrides, as argv."""
    sc = draft.scenario
    if not isinstance(sc.model, str) or sc.model not in MODELS:
        raise refuse("model", draft.fmt, f"no torchtune config for it here; presets: {', '.join(MODELS)}")
    prefix, _, _, has_full = MODELS[sc.model]
    kind = "full" if sc.method == "full" else "lora"
    if kind == "full" and not has_full:
        raise refuse("method", draft.fmt, f"torchtune ships no full-finetune config for {sc.model}")
    argv = ["tune", "run", "--nproc_per_node", str(sc.parallel.world_size), f"{kind}_finetune_distributed",
            "--config", f"{prefix}_{kind}"]  # fmt: skip
    keys = overrides(draft)
    framework_note(draft, "torchtune")
    return argv + [f"~{k}" if v is None else f"{k}={_value(v)}" for k, v in keys.items()]


def _value(value: Any) -> str:
    """A value as OmegaConf's dotlist reads it (Python-style booleans, ``[a,b]`` lists)."""
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def render(draft: Draft) -> dict[str, str]:
    """``torchtune_run.sh``: the ``tune run`` line, one override per line."""
    argv = command(draft)
    body = " \\\n  ".join([" ".join(shlex.quote(a) for a in argv[:7]), *(shlex.quote(a) for a in argv[7:])])
    return {FILE: "#!/usr/bin/env bash\n" + comment(header_lines(draft)) + body + "\n"}
