"""LLaMA-Factory training YAML (``llamafactory-cli train llamafactory.yaml``): SFT stage, LoRA/QLoRA, batch,
precision (``pure_bf16`` for pure bf16), checkpointing (on unless ``disable_gradient_checkpointing``).

Keys as LLaMA-Factory 0.9.5 parses them: llamafactory/hparams/{model,data,finetuning,training}_args.py, on top
of transformers' ``Seq2SeqTrainingArguments`` (examples/train_lora/llama3_lora_sft.yaml). LLaMA-Factory turns
gradient checkpointing on by default, so ``none`` is written as ``disable_gradient_checkpointing: true``.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.export import deepspeed, hf
from memsim_widget.export.common import (
    Draft,
    comment,
    header_lines,
    hf_model_id,
    refuse,
    vision_scope_modules,
)
from memsim_widget.export.yamltext import to_yaml

FILE = "llamafactory.yaml"
#: memsim attention -> LLaMA-Factory ``flash_attn`` (extras/constants.py ``AttentionFunction``).
ATTENTION = {"sdpa": "sdpa", "eager": "disabled"}


def config(draft: Draft) -> dict[str, Any]:
    """The LLaMA-Factory config of the scenario (the HF Trainer keys come from the ``hf`` writer)."""
    sc, p = draft.scenario, draft.scenario.parallel
    if p.zero == 3 and not hf.uses_deepspeed(draft):
        raise refuse("parallel.zero", draft.fmt, "LLaMA-Factory shards with DeepSpeed here; set framework "
                     "'deepspeed' for ZeRO-3 (FSDP needs an accelerate config beside it)")  # fmt: skip
    if sc.activation_offloading and sc.activation_checkpointing != "full":
        # use_unsloth_gc (model_args): its checkpoint function copies each layer's input to the host
        # (model/model_utils/checkpointing.py UnslothGradientCheckpointing) -- offloading with full checkpointing
        raise refuse("activation_offloading", draft.fmt, "LLaMA-Factory offloads activations through "
                     "use_unsloth_gc, which needs activation_checkpointing 'full'")  # fmt: skip
    if sc.padding == "max_length":
        draft.note(f"padding max_length: LLaMA-Factory pads each batch to its longest sample; pad to cutoff_len "
                   f"{sc.seq_len} in your data or set packing")  # fmt: skip
    args = hf.training_args(draft)  # refuses tp/pp/cp/ep, chunked loss, selective checkpointing
    cfg: dict[str, Any] = {
        "model_name_or_path": hf_model_id(draft),
        "flash_attn": ATTENTION[sc.attention],
        "disable_gradient_checkpointing": sc.activation_checkpointing == "none",
        **({"use_unsloth_gc": True} if sc.activation_offloading else {}),
        "stage": "sft",
        "do_train": True,
        **_method(draft),
        "dataset": "REPLACE_WITH_YOUR_DATASET",
        "template": "default",
        "cutoff_len": sc.seq_len,
        "packing": sc.padding == "packed",
        "output_dir": args["output_dir"],
        "per_device_train_batch_size": args["per_device_train_batch_size"],
        "gradient_accumulation_steps": args["gradient_accumulation_steps"],
        "optim": args["optim"],
        **({"weight_decay": args["weight_decay"]} if "weight_decay" in args else {}),
        "learning_rate": 1.0e-4,
        "num_train_epochs": 1.0,
        **_precision(draft),
        "torch_compile": args["torch_compile"],
    }
    if "deepspeed" in args:
        cfg["deepspeed"] = args["deepspeed"]
    return cfg


def _precision(draft: Draft) -> dict[str, bool]:
    """``bf16`` / ``fp16`` / ``pure_bf16``. LLaMA-Factory loads the model in the compute dtype, then upcasts the
    trainable parameters to fp32 unless ``pure_bf16`` (hparams/parser.py, model/adapter.py): a full fine-tune
    with ``bf16`` is memsim's ``amp-bf16``, with ``pure_bf16`` its ``bf16``; LoRA keeps the base in bf16 and the
    adapters in fp32 (``bf16``) or bf16 (``pure_bf16``)."""
    sc, zero3 = draft.scenario, draft.scenario.parallel.zero == 3
    prec, adapters = sc.precision, sc.lora.adapter_dtype
    if sc.method == "full":
        table = {"amp-bf16": "bf16", "bf16": "pure_bf16", "amp-fp16": "fp16", "mixed-bf16": "bf16",
                 "mixed-fp16": "fp16", "fp32": ""}  # fmt: skip
    else:
        pure = adapters == "bf16"
        table = {"bf16": "pure_bf16" if pure else "bf16", "fp16": "fp16", "fp32": ""}
        if prec == "fp16" and adapters != "fp32":
            raise refuse("lora.adapter_dtype", draft.fmt, "LLaMA-Factory keeps fp16 models' adapters in fp32")
    if prec not in table:
        raise refuse("precision", draft.fmt, f"{prec!r}: LLaMA-Factory loads the "
                     f"{'base model' if sc.method != 'full' else 'model'} in the compute dtype; allowed here: "
                     f"{', '.join(table)}")  # fmt: skip
    key = table[prec]
    if key == "pure_bf16" and zero3:
        raise refuse("precision", draft.fmt, "LLaMA-Factory refuses pure_bf16 with DeepSpeed ZeRO-3")
    return {"bf16": key == "bf16", "fp16": key == "fp16", "pure_bf16": key == "pure_bf16"}


def _method(draft: Draft) -> dict[str, Any]:
    """``finetuning_type`` with the LoRA keys, and 4-bit bitsandbytes quantisation for QLoRA."""
    sc = draft.scenario
    if sc.method == "full":
        return {"finetuning_type": "full"}
    targets = list(sc.lora.targets)
    keys: dict[str, Any] = {
        "finetuning_type": "lora",
        "lora_rank": sc.lora.rank,
        "lora_alpha": sc.lora.alpha,
        "lora_dropout": 0.0,
        "lora_target": "all" if targets == ["all-linear"] else ",".join(targets),
    }
    if sc.method == "qlora":
        keys.update(
            quantization_bit=4, quantization_method="bnb", quantization_type="nf4", double_quantization=True
        )
    if not float(sc.lora.alpha).is_integer():
        raise refuse(
            "lora.alpha", draft.fmt, f"LLaMA-Factory's lora_alpha is an integer, got {sc.lora.alpha}"
        )
    keys["lora_alpha"] = int(sc.lora.alpha)
    if vision_scope_modules(sc):
        # model/model_utils/visual.py patch_target_modules: LoRA skips the modules get_forbidden_modules names,
        # the tower under freeze_vision_tower and the projector under freeze_multi_modal_projector (both default
        # true): lora.target_scope "language"; both false: peft's match everywhere ("model")
        language = sc.lora.target_scope == "language"
        keys.update(freeze_vision_tower=language, freeze_multi_modal_projector=language)
    return keys


def render(draft: Draft) -> dict[str, str]:
    """``llamafactory.yaml`` (and ``ds_config.json`` when DeepSpeed runs the step)."""
    cfg = config(draft)
    ds = deepspeed.ds_config(draft, standalone=False) if "deepspeed" in cfg else None
    p = draft.scenario.parallel
    if p.world_size > 1:
        draft.note(f"launch on {p.world_size} GPUs: FORCE_TORCHRUN=1 NPROC_PER_NODE={p.world_size} "
                   f"llamafactory-cli train {FILE}")  # fmt: skip
    files = {FILE: comment(header_lines(draft)) + to_yaml(cfg)}
    return files if ds is None else {**files, **deepspeed.files(draft, ds)}
