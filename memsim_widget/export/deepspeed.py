"""DeepSpeed config JSON: ZeRO stage, offload, bucket sizes, precision, micro-batch, accumulation, AutoTP.

Keys as DeepSpeed 0.19 reads them (deepspeed/runtime/config.py, runtime/zero/config.py,
runtime/precision_config.py; https://www.deepspeed.ai/docs/config-json/). JSON has no comments and DeepSpeed
keeps unknown keys, so the provenance note is a sibling ``ds_config.memsim.txt``. ``train_batch_size`` is left
for DeepSpeed to derive (micro-batch x accumulation x its data-parallel size, which AutoTP divides by tp).
"""

from __future__ import annotations

import json
from typing import Any

from memsim_widget.engine.frameworks import DEEPSPEED_BUCKET_ELEMENTS
from memsim_widget.export.common import (
    Draft,
    check_common,
    checkpoint_every,
    framework_note,
    header_lines,
    note_text,
    refuse,
)

FILE = "ds_config.json"
#: memsim optimizer -> DeepSpeed's ``optimizer.type`` (runtime/config.py DEEPSPEED_OPTIMIZERS) and params.
OPTIMIZERS: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("AdamW", {}),
    "adam": ("Adam", {"adam_w_mode": False}),
    "lion": ("Lion", {}),
}


def ds_config(draft: Draft, standalone: bool = True) -> dict[str, Any]:
    """The DeepSpeed config of the scenario (refuses what DeepSpeed cannot run from its config);
    ``standalone``: no other file of the export sets the model up, so its settings become notes."""
    sc, fmt = draft.scenario, draft.fmt
    p = sc.parallel
    for name, value in (("pp", p.pp), ("cp", p.cp), ("ep", p.ep)):
        if value > 1:
            raise refuse(f"parallel.{name}", fmt, f"{name}={value} needs model code (PipelineModule, "
                         "Ulysses or MoE layers), not a config key; use torchtitan or set it to 1")  # fmt: skip
    if p.sequence_parallel:
        raise refuse("parallel.sequence_parallel", fmt, "AutoTP has no sequence-parallel key")
    if p.zero == 3 and not p.reshard_after_forward:
        raise refuse(
            "parallel.reshard_after_forward", fmt, "DeepSpeed ZeRO-3 always re-partitions after forward"
        )
    checkpoint_every(draft)
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": sc.micro_batch_size,
        "gradient_accumulation_steps": sc.grad_accum_steps,
        **_precision(draft),
        "zero_optimization": _zero(draft),
    }
    optimizer = _optimizer(draft)
    if optimizer:
        cfg["optimizer"] = optimizer
    if p.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": p.tp}
    if standalone:
        framework_note(draft, "deepspeed")
        _notes(draft)
    return cfg


def _precision(draft: Draft) -> dict[str, Any]:
    """bf16/fp16 sections: DeepSpeed's bf16 keeps fp32 masters (memsim ``mixed-bf16``); pure bf16 adds
    ``bf16_master_weights_and_grads`` and ``bf16_optimizer_states`` (ZeRO >= 1); ``amp-*`` is torch autocast."""
    prec, zero = draft.scenario.precision, draft.scenario.parallel.zero
    if prec == "fp32":
        return {}
    if prec == "mixed-bf16":
        return {"bf16": {"enabled": True}}
    if prec == "mixed-fp16":
        return {"fp16": {"enabled": True}}
    if prec == "bf16":
        if zero == 0:
            raise refuse("precision", draft.fmt, "pure bf16 (bf16 master weights and states) needs zero >= 1; "
                         "at zero 0 DeepSpeed's bf16 keeps fp32 masters: precision 'mixed-bf16'")  # fmt: skip
        return {
            "bf16": {"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}
        }
    if prec in ("amp-bf16", "amp-fp16"):
        dtype = "bfloat16" if prec == "amp-bf16" else "float16"
        return {"torch_autocast": {"enabled": True, "dtype": dtype}}
    check_common(draft)  # fp8 refuses there
    raise refuse("precision", draft.fmt, f"{prec!r} has no DeepSpeed precision section")


def _zero(draft: Draft) -> dict[str, Any]:
    """``zero_optimization``: stage, offload devices, and the bucket sizes memsim assumed: ZeRO-1/2's
    ``reduce_bucket_size`` and ``overlap_comm`` as the scenario says them (``parallel.*``; unset, DeepSpeed's
    defaults; "auto" written as "auto", for HF Trainer / accelerate to fill), the rest DeepSpeed's defaults."""
    p = draft.scenario.parallel
    zero: dict[str, Any] = {"stage": p.zero}
    if p.zero in (1, 2):
        bucket = DEEPSPEED_BUCKET_ELEMENTS if p.reduce_bucket_size is None else p.reduce_bucket_size
        zero.update(
            reduce_bucket_size=bucket,
            allgather_bucket_size=DEEPSPEED_BUCKET_ELEMENTS,
            contiguous_gradients=True,
            overlap_comm=bool(p.overlap_comm),
        )
    if p.zero == 3:
        zero.update(
            reduce_bucket_size=DEEPSPEED_BUCKET_ELEMENTS,
            stage3_prefetch_bucket_size=50_000_000,
            stage3_param_persistence_threshold=100_000,
            stage3_max_live_parameters=1_000_000_000,
            stage3_max_reuse_distance=1_000_000_000,
        )
    if p.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if p.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def _optimizer(draft: Draft) -> dict[str, Any] | None:
    """DeepSpeed's own optimizer for AdamW/Adam/Lion; any other is the training script's (a client optimizer),
    noted by hand. ``torch_adam`` builds ``torch.optim.AdamW``/``Adam`` with the params' ``foreach``
    (runtime/engine.py ``get_optimizer_configuration``); without it DeepSpeed's FusedAdam (CPUAdam offloaded)."""
    sc = draft.scenario
    if sc.optimizer not in OPTIMIZERS:
        draft.note(f"optimizer {sc.optimizer!r} ({sc.optimizer_impl}): create it in your script and pass it to "
                   "deepspeed.initialize(optimizer=...); add \"zero_allow_untested_optimizer\": true")  # fmt: skip
        return None
    kind, params = OPTIMIZERS[sc.optimizer]
    params = dict(params)
    if kind != "Lion":
        params["torch_adam"] = sc.optimizer_impl != "fused"
        if sc.optimizer_impl == "for-loop":
            params["foreach"] = False
    return {"type": kind, "params": params}


def _notes(draft: Draft) -> None:
    """What a DeepSpeed config cannot say but the training script must: checkpointing, LoRA, attention..."""
    sc = draft.scenario
    check_common(draft)
    if sc.activation_checkpointing == "full":
        draft.note("activation_checkpointing full: call model.gradient_checkpointing_enable() "
                   "(HF) or wrap each layer in torch.utils.checkpoint")  # fmt: skip
    elif sc.activation_checkpointing != "none":
        raise refuse("activation_checkpointing", draft.fmt,
                     f"{sc.activation_checkpointing!r} has no DeepSpeed key for HF models; use 'full' or 'none'")  # fmt: skip
    if sc.method != "full":
        draft.note(f"method {sc.method}: wrap the model with peft LoraConfig(r={sc.lora.rank}, "
                   f"lora_alpha={sc.lora.alpha:g}, target_modules={list(sc.lora.targets)})"
                   + (", loaded in 4-bit NF4 (BitsAndBytesConfig)" if sc.method == "qlora" else ""))  # fmt: skip
    draft.note(f"seq_len {sc.seq_len}, padding {sc.padding}: your tokenizer/collator; attention {sc.attention}: "
               "from_pretrained(attn_implementation=...)")  # fmt: skip
    if sc.loss == "chunked":
        draft.note("loss chunked: your script computes a chunked cross-entropy")
    if sc.activation_offloading:
        draft.note("activation_offloading: wrap forward in torch.autograd.graph.save_on_cpu(pin_memory=True)")
    if sc.compile:
        draft.note("compile: call torch.compile on the model (DeepSpeed: engine.compile())")
    if sc.optimizer_in_backward:
        raise refuse("optimizer_in_backward", draft.fmt, "DeepSpeed has no optimizer-in-backward key")


def render(draft: Draft) -> dict[str, str]:
    """``ds_config.json`` and its provenance note."""
    return files(draft, ds_config(draft))


def files(draft: Draft, cfg: dict[str, Any]) -> dict[str, str]:
    """The config as JSON and the note beside it (call after every note is collected)."""
    note = note_text(header_lines(draft))
    return {FILE: json.dumps(cfg, indent=2) + "\n", FILE.replace(".json", ".memsim.txt"): note}
