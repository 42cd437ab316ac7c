"""accelerate config YAML (``accelerate launch --config_file``): FSDP2 for ZeRO-3, DeepSpeed for ZeRO-1/2.

Keys as ``accelerate config`` writes them in accelerate 1.x (commands/config/config_args.py ``ClusterConfig``;
``fsdp_config`` keys as ``accelerate launch`` reads them, commands/launch.py, with ``fsdp_version: 2`` for
FSDP2; https://huggingface.co/docs/accelerate/usage_guides/fsdp). The training script sets the batch, the
accumulation and the model's dtype: the header lists them under "set by hand".
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
    refuse,
)
from memsim_widget.export.yamltext import to_yaml

FILE = "accelerate_config.yaml"
#: memsim precision -> accelerate ``mixed_precision`` (autocast); pure 16-bit is the model's own dtype.
MIXED = {"amp-bf16": "bf16", "amp-fp16": "fp16", "mixed-bf16": "bf16", "mixed-fp16": "fp16"}


def config(draft: Draft) -> dict[str, Any]:
    """The accelerate config of the scenario."""
    sc, p = draft.scenario, draft.scenario.parallel
    if p.pp > 1:
        raise refuse("parallel.pp", draft.fmt, "accelerate has no pipeline-parallel key; use torchtitan")
    if p.ep > 1:
        raise refuse("parallel.ep", draft.fmt, "accelerate has no expert-parallel key; use torchtitan")
    if p.sequence_parallel:
        raise refuse("parallel.sequence_parallel", draft.fmt, "accelerate's tp has no sequence-parallel key")
    checkpoint_every(draft)
    check_common(draft)
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": _distributed_type(draft),
        "mixed_precision": MIXED.get(sc.precision, "no"),
        "num_machines": 1,
        "num_processes": p.world_size,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if cfg["distributed_type"] == "DEEPSPEED":
        cfg["deepspeed_config"] = {"deepspeed_config_file": deepspeed.FILE}
    elif cfg["distributed_type"] == "FSDP":
        cfg["fsdp_config"] = _fsdp(draft)
    hsdp = p.zero == 3 and p.dp_replicate > 1  # FSDP2 on a replicate x shard mesh
    if (p.tp > 1 or p.cp > 1 or hsdp) and cfg[
        "distributed_type"
    ] != "DEEPSPEED":  # DeepSpeed: AutoTP in its file
        cfg["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": p.dp if p.zero == 0 else p.dp_replicate,
            "parallelism_config_dp_shard_size": p.dp // p.dp_replicate if p.zero == 3 else 1,
            "parallelism_config_tp_size": p.tp,
            "parallelism_config_cp_size": p.cp,
        }
    if sc.compile:
        cfg["dynamo_config"] = {"dynamo_backend": "INDUCTOR"}
    _notes(draft, cfg["distributed_type"])
    return cfg


def _distributed_type(draft: Draft) -> str:
    """NO (one GPU), MULTI_GPU (DDP), DEEPSPEED (ZeRO-1/2, DeepSpeed's ZeRO-3 or mixed precision) or FSDP."""
    p = draft.scenario.parallel
    if hf.uses_deepspeed(draft):
        return "DEEPSPEED"
    if p.zero == 3:
        return "FSDP"
    return "MULTI_GPU" if p.world_size > 1 else "NO"


def _fsdp(draft: Draft) -> dict[str, Any]:
    """FSDP2 keys: reshard after forward, parameter offload (with grads and states), checkpointing."""
    sc, p = draft.scenario, draft.scenario.parallel
    if p.offload == "optimizer":
        raise refuse("parallel.offload", draft.fmt, "FSDP offloads parameters, gradients and optimizer "
                     "states together; use 'optimizer+params', or framework 'deepspeed'")  # fmt: skip
    if sc.activation_checkpointing not in ("none", "full"):
        raise refuse("activation_checkpointing", draft.fmt, f"{sc.activation_checkpointing!r}: FSDP checkpoints "
                     "whole layers; use 'full' or 'none'")  # fmt: skip
    return {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": p.reshard_after_forward,
        "fsdp_offload_params": p.offload == "optimizer+params",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",
        "fsdp_activation_checkpointing": sc.activation_checkpointing == "full",
    }


def _notes(draft: Draft, kind: str) -> None:
    """What the training script sets: batch, accumulation, dtype, checkpointing outside FSDP, LoRA."""
    sc = draft.scenario
    framework_note(draft, "deepspeed" if kind == "DEEPSPEED" else "hf")
    draft.note(f"micro_batch_size {sc.micro_batch_size}: DataLoader(batch_size={sc.micro_batch_size}); "
               f"seq_len {sc.seq_len} (padding {sc.padding}): your tokenizer/collator")  # fmt: skip
    if kind != "DEEPSPEED":
        draft.note(f"grad_accum_steps {sc.grad_accum_steps}: Accelerator(gradient_accumulation_steps="
                   f"{sc.grad_accum_steps}) with accelerator.accumulate(model)")  # fmt: skip
        draft.note(f"optimizer {sc.optimizer} ({sc.optimizer_impl}): create it in your script")
    dtype = hf.PRECISION[sc.precision][0]
    draft.note(f"precision {sc.precision}: from_pretrained(dtype=torch.{dtype}, attn_implementation="
               f"{sc.attention!r})")  # fmt: skip
    if sc.activation_checkpointing == "full" and kind != "FSDP":
        draft.note("activation_checkpointing full: model.gradient_checkpointing_enable()")
    elif sc.activation_checkpointing not in ("none", "full"):
        raise refuse("activation_checkpointing", draft.fmt, f"{sc.activation_checkpointing!r} has no key; "
                     "use 'full' or 'none'")  # fmt: skip
    if sc.method != "full":
        draft.note(f"method {sc.method}: peft LoraConfig(r={sc.lora.rank}, lora_alpha={sc.lora.alpha:g}, "
                   f"target_modules={list(sc.lora.targets)})" + (" on a 4-bit NF4 model" if sc.method == "qlora" else ""))  # fmt: skip
    for flag, text in (("loss", sc.loss == "chunked"), ("activation_offloading", sc.activation_offloading)):
        if text:
            draft.note(f"{flag}: set in your training loop (no accelerate key)")
    if sc.optimizer_in_backward:
        raise refuse("optimizer_in_backward", draft.fmt, "accelerate has no optimizer-in-backward key")


def render(draft: Draft) -> dict[str, str]:
    """``accelerate_config.yaml`` (and ``ds_config.json`` when DeepSpeed runs the step)."""
    cfg = config(draft)
    ds = deepspeed.ds_config(draft, standalone=False) if cfg["distributed_type"] == "DEEPSPEED" else None
    files = {FILE: comment(header_lines(draft)) + "# Run: accelerate launch --config_file accelerate_config.yaml "
             "train.py\n" + to_yaml(cfg)}  # fmt: skip
    return files if ds is None else {**files, **deepspeed.files(draft, ds)}
