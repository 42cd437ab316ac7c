"""LLaMA-Factory training YAML (``llamafactory-cli train``) -> scenario keys: stage, fine-tuning type and LoRA,
quantisation, cutoff and packing, batch, precision (``pure_bf16``), checkpointing, attention, DeepSpeed.

Keys and defaults as LLaMA-Factory 0.9.x parses them (src/llamafactory/hparams/model_args.py,
finetuning_args.py, data_args.py, on transformers' ``Seq2SeqTrainingArguments``): ``finetuning_type`` lora,
``lora_rank`` 8, ``lora_alpha`` None (= 2 x rank), ``lora_target`` all, ``cutoff_len`` 2048, ``flash_attn``
auto, gradient checkpointing on unless ``disable_gradient_checkpointing``. The trainable parameters are upcast to
fp32 unless ``pure_bf16`` (model/adapter.py): a full fine-tune with ``bf16`` is memsim's ``amp-bf16``. Batches
are padded to their longest sample unless packed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from memsim_widget.errors import ScenarioError
from memsim_widget.importers import deepspeed, hf
from memsim_widget.importers.common import (
    Reading,
    file_error,
    get_bool,
    get_choice,
    get_int,
    get_number,
    get_str,
    resolve_model,
)

#: ``flash_attn`` (extras/constants.py ``AttentionFunction``) -> memsim attention.
ATTENTION = {"auto": "sdpa", "disabled": "eager", "sdpa": "sdpa", "fa2": "sdpa", "fa3": "sdpa"}
#: ``stage`` -> memsim objective (``pt`` pre-training trains like SFT).
STAGES = {"sft": None, "pt": None, "dpo": "dpo", "kto": "kto", "ppo": "ppo"}


def looks_like(data: dict[str, Any]) -> bool:
    return any(k in data for k in ("stage", "finetuning_type", "cutoff_len", "template", "lora_target"))


def read(reading: Reading, path: Path, data: dict[str, Any], companion: Callable[[Path, str], Any]) -> None:
    """A LLaMA-Factory config (and its DeepSpeed JSON) into ``reading``."""
    name = path.name
    reading.set("framework", "hf")
    if "model_name_or_path" in data:
        resolve_model(reading, path, "model_name_or_path", data["model_name_or_path"])
    _stage(reading, path, data)
    method = _method(reading, path, data)
    reading.set("attention", get_choice(path, data, "flash_attn", ATTENTION, "sdpa"))
    off = get_bool(path, data, "disable_gradient_checkpointing", False)
    reading.set("activation_checkpointing", "none" if off else "full")
    # use_unsloth_gc: the checkpointed layers' inputs kept in host memory (export/llamafactory.py)
    reading.set("activation_offloading", not off and bool(get_bool(path, data, "use_unsloth_gc", False)))
    reading.set("seq_len", get_int(path, data, "cutoff_len", 2048))
    if get_bool(path, data, "packing", False) or get_bool(path, data, "neat_packing", False):
        reading.set("padding", "packed")
    else:
        reading.assume("padding", "longest", name, "LLaMA-Factory's collator pads each batch to its longest "
                       "sample: memsim assumed batches as long as cutoff_len")  # fmt: skip
    reading.set("micro_batch_size", get_int(path, data, "per_device_train_batch_size", hf.DEFAULT_BATCH))
    reading.set("grad_accum_steps", get_int(path, data, "gradient_accumulation_steps", 1))
    keys = {k: data[k] for k in ("optim", "weight_decay") if k in data}
    hf._optim(reading, path, keys)
    reading.set("compile", bool(get_bool(path, data, "torch_compile", False)))
    if get_bool(path, data, "enable_liger_kernel", False):
        reading.miss("loss", f"{name}: enable_liger_kernel", "Liger's fused kernels are not modelled; memsim "
                     "assumed the standard cross-entropy (more memory)", keep=True)  # fmt: skip
    ds = False
    ref = get_str(path, data, "deepspeed")
    reading.set("parallel.zero", 0)
    reading.set("parallel.offload", "none")
    if ref:
        ds = deepspeed.read_referenced(reading, path, "deepspeed", ref, companion) is not None
    _precision(reading, path, data, method, ds)
    if "parallel.dp" not in reading.values:
        reading.miss("parallel.dp", name, "the launch (FORCE_TORCHRUN=1 NPROC_PER_NODE=N) sets the GPU count; "
                     "memsim assumed one (pass --dp)")  # fmt: skip


def _stage(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """``stage``: SFT and pre-training, or the preference / RL objectives."""
    stage = get_str(path, data, "stage", "sft")
    if stage not in STAGES:
        raise file_error(path, "stage", f"{stage!r} is not modelled; memsim reads {', '.join(STAGES)}")
    objective = STAGES[stage]
    if stage == "dpo" and get_str(path, data, "pref_loss", "sigmoid") == "orpo":
        objective = "orpo"
    if objective is not None:
        reading.set("objective", objective)
        reading.miss("rl", f"{path.name}: stage", f"{stage}: memsim assumed its default reference model and "
                     "generation settings", keep=True)  # fmt: skip


def _method(reading: Reading, path: Path, data: dict[str, Any]) -> str:
    """``finetuning_type`` (lora by default), its LoRA keys, and 4-bit quantisation (QLoRA)."""
    kind = get_choice(
        path, data, "finetuning_type", {"lora": "lora", "full": "full", "freeze": "freeze"}, "lora"
    )
    if kind == "freeze":
        raise file_error(
            path, "finetuning_type", "'freeze' (some layers trained) is not modelled; use full or lora"
        )
    bits = get_int(path, data, "quantization_bit")
    if bits not in (None, 4):
        reading.miss("method", f"{path.name}: quantization_bit", f"{bits}-bit weights are not modelled; read as "
                     "16-bit", keep=True)  # fmt: skip
    if kind == "full":
        reading.set("method", "full")
        return "full"
    reading.set("method", "qlora" if bits == 4 else "lora")
    rank = get_int(path, data, "lora_rank", 8)
    reading.set("lora.rank", rank)
    reading.set("lora.alpha", get_number(path, data, "lora_alpha", rank * 2))
    _scope(reading, path, data)
    target = data.get("lora_target", "all")
    if isinstance(target, str) and target.strip() == "all":
        reading.set("lora.targets", ["all-linear"])
    else:
        reading.set("lora.targets", hf.lora_targets(path, "lora_target", target))
    return "lora"


def _scope(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """A multimodal model's ``freeze_vision_tower`` / ``freeze_multi_modal_projector`` (both true by default:
    LoRA skips the tower and projector, ``lora.target_scope`` "language"; export/llamafactory.py ``_method``)."""
    from memsim_widget.catalog.models import architecture_for

    try:
        vision = architecture_for(reading.values.get("model", "")).facts.vision is not None
    except ScenarioError:  # no model read yet, or one the catalog cannot name: nothing to scope
        return
    if not vision:
        return
    tower = get_bool(path, data, "freeze_vision_tower", True)
    projector = get_bool(path, data, "freeze_multi_modal_projector", True)
    if tower != projector:
        reading.miss("lora.target_scope", f"{path.name}: freeze_vision_tower / freeze_multi_modal_projector",
                     "adapters on only one of the tower and the projector are not modelled; memsim assumed both "
                     "(more memory)")  # fmt: skip
    reading.set("lora.target_scope", "language" if tower and projector else "model")


def _precision(reading: Reading, path: Path, data: dict[str, Any], method: str, ds: bool) -> None:
    """``bf16`` / ``fp16`` / ``pure_bf16`` (export/llamafactory.py ``_precision`` inverted)."""
    bf16 = bool(get_bool(path, data, "bf16", False))
    fp16 = bool(get_bool(path, data, "fp16", False))
    pure = bool(get_bool(path, data, "pure_bf16", False))
    if method != "full":
        reading.set("lora.adapter_dtype", "bf16" if pure else "fp32")
    if ds and "precision" in reading.values:
        return
    if method == "full":
        prec = "bf16" if pure else ("amp-bf16" if bf16 else ("amp-fp16" if fp16 else "fp32"))
        if ds and not pure:
            prec = {"amp-bf16": "mixed-bf16", "amp-fp16": "mixed-fp16"}.get(prec, prec)
    else:
        prec = "bf16" if (pure or bf16) else ("fp16" if fp16 else "fp32")
    reading.set("precision", prec)
