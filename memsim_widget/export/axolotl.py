"""Axolotl config YAML (``axolotl train axolotl.yaml``): adapter, batch, precision, checkpointing, sharding.

Keys as axolotl 0.19 validates them (axolotl/utils/schemas/config.py ``AxolotlInputConfig``, schemas/fsdp.py
``FSDPConfig``; https://docs.axolotl.ai/docs/config-reference.html). Optimizer names are transformers'
``optim`` names. ``bf16: true`` loads the model in bf16 (utils/config/__init__.py ``resolve_dtype``) and
turns on the Trainer's autocast: memsim's pure ``bf16``. The dataset is a placeholder to replace.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.export import deepspeed, hf
from memsim_widget.export.common import (
    Draft,
    check_common,
    checkpoint_every,
    comment,
    framework_note,
    header_lines,
    hf_model_id,
    lora_exclude,
    refuse,
)
from memsim_widget.export.yamltext import to_yaml

FILE = "axolotl.yaml"


def config(draft: Draft) -> dict[str, Any]:
    """The axolotl config of the scenario."""
    sc, fmt, p = draft.scenario, draft.fmt, draft.scenario.parallel
    for name in ("pp", "ep"):
        if getattr(p, name) > 1:
            raise refuse(f"parallel.{name}", fmt, f"axolotl has no {name} key; use torchtitan or set it to 1")
    if sc.optimizer_in_backward:
        raise refuse("optimizer_in_backward", fmt, "axolotl has no optimizer-in-backward key")
    if p.sequence_parallel:
        raise refuse(
            "parallel.sequence_parallel", fmt, "axolotl's tensor_parallel_size has no sequence-parallel key"
        )
    if sc.activation_checkpointing not in ("none", "full"):
        raise refuse("activation_checkpointing", fmt, f"{sc.activation_checkpointing!r}: axolotl checkpoints "
                     "whole layers; use 'full' or 'none'")  # fmt: skip
    checkpoint_every(draft)
    check_common(draft)
    if sc.precision.startswith("amp-"):
        raise refuse("precision", fmt, f"{sc.precision!r}: axolotl's bf16/fp16 load the weights in 16 bits "
                     "(memsim 'bf16'/'fp16'); fp32 weights under autocast have no key")  # fmt: skip
    cfg: dict[str, Any] = {
        "base_model": hf_model_id(draft),
        **_adapter(draft),
        "datasets": [{"path": "REPLACE/WITH/YOUR/DATASET", "type": "alpaca"}],
        "output_dir": "./outputs",
        "sequence_len": sc.seq_len,
        "sample_packing": sc.padding == "packed",
        "pad_to_sequence_len": sc.padding != "longest",
        "micro_batch_size": sc.micro_batch_size,
        "gradient_accumulation_steps": sc.grad_accum_steps,
        "num_epochs": 1,
        "learning_rate": 0.0002,
        **{"optimizer" if k == "optim" else k: v for k, v in hf.optim_keys(draft).items()},
        "bf16": "bf16" in sc.precision,  # bf16, or DeepSpeed's mixed-bf16 (the weights bf16, masters fp32)
        "fp16": "fp16" in sc.precision,
        "gradient_checkpointing": sc.activation_checkpointing == "full" and not _fsdp_on(draft),
        "activation_offloading": sc.activation_offloading,
        "attn_implementation": sc.attention,
        "torch_compile": sc.compile,
        "chunked_cross_entropy": sc.loss == "chunked",
    }
    _layout(draft, cfg)
    return cfg


def _adapter(draft: Draft) -> dict[str, Any]:
    """LoRA / QLoRA keys (``lora_target_linear`` for all-linear)."""
    sc = draft.scenario
    if sc.method == "full":
        return {}
    keys: dict[str, Any] = {"adapter": sc.method, "load_in_4bit": sc.method == "qlora"}
    keys.update(lora_r=sc.lora.rank, lora_alpha=sc.lora.alpha, lora_dropout=0.0)
    if list(sc.lora.targets) == ["all-linear"]:
        keys["lora_target_linear"] = True
    else:
        keys["lora_target_modules"] = list(sc.lora.targets)
    if lora_exclude(sc):  # lora.target_scope language: axolotl passes lora_exclude_modules to peft
        keys["lora_exclude_modules"] = lora_exclude(sc)
    return keys


def _fsdp_on(draft: Draft) -> bool:
    """FSDP2 shards the model: ZeRO-3 without DeepSpeed."""
    return draft.scenario.parallel.zero == 3 and not hf.uses_deepspeed(draft)


def _layout(draft: Draft, cfg: dict[str, Any]) -> None:
    """DeepSpeed (ZeRO-1/2), FSDP2 (ZeRO-3), tensor and context parallel sizes."""
    sc, p = draft.scenario, draft.scenario.parallel
    framework_note(draft, "deepspeed" if hf.uses_deepspeed(draft) else "hf")
    if hf.uses_deepspeed(draft):
        cfg["deepspeed"] = deepspeed.FILE
    elif _fsdp_on(draft):
        if p.offload == "optimizer":
            raise refuse("parallel.offload", draft.fmt, "FSDP offloads parameters, gradients and optimizer "
                         "states together; use 'optimizer+params'")  # fmt: skip
        cfg["fsdp_version"] = 2
        cfg["fsdp_config"] = {
            "offload_params": p.offload == "optimizer+params",
            "reshard_after_forward": p.reshard_after_forward,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT",
            "activation_checkpointing": sc.activation_checkpointing == "full",
        }
    if _fsdp_on(draft) and p.dp_replicate > 1:  # FSDP2 HSDP (axolotl 0.19 dp_shard_size / dp_replicate_size)
        cfg["dp_shard_size"] = p.dp // p.dp_replicate
        cfg["dp_replicate_size"] = p.dp_replicate
    if p.tp > 1:
        cfg["tensor_parallel_size"] = p.tp
    if p.cp > 1:
        cfg["context_parallel_size"] = p.cp
    if p.world_size > 1:
        draft.note(f"launch on {p.world_size} GPUs: axolotl train {FILE} --num-processes {p.world_size}")


def render(draft: Draft) -> dict[str, str]:
    """``axolotl.yaml`` (and ``ds_config.json`` when DeepSpeed runs the step)."""
    cfg = config(draft)
    ds = deepspeed.ds_config(draft, standalone=False) if hf.uses_deepspeed(draft) else None
    files = {FILE: comment(header_lines(draft)) + to_yaml(cfg)}
    return files if ds is None else {**files, **deepspeed.files(draft, ds)}
