"""Hugging Face Trainer: the ``TrainingArguments`` keys, the model's ``from_pretrained`` / PEFT setup, and the
DeepSpeed config when the layout needs one.

``training_args.yaml`` holds TrainingArguments keys only (``HfArgumentParser(TrainingArguments)
.parse_yaml_file`` refuses any other key); ``model_setup.yaml`` holds the ``from_pretrained`` keywords,
``BitsAndBytesConfig`` (QLoRA) and ``peft.LoraConfig`` keywords. Keys from transformers 5
(training_args.py: ``OptimizerNames``, ``fsdp_config``'s supported keys) and peft 0.21 (``LoraConfig``).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.export import deepspeed
from memsim_widget.export.common import (
    Draft,
    check_common,
    checkpoint_every,
    comment,
    framework_note,
    header_lines,
    hf_model_id,
    lora_exclude,
    lora_targets,
    refuse,
)
from memsim_widget.export.yamltext import to_yaml

#: memsim optimizer -> (transformers ``optim``, extra TrainingArguments keys). ``adam`` is AdamW without decay.
OPTIM: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("adamw_torch", {}),
    "adam": ("adamw_torch", {"weight_decay": 0.0}),
    "sgd": ("sgd", {}),
    "adafactor": ("adafactor", {}),
    "lion": ("lion_32bit", {}),
    "adamw-8bit": ("adamw_bnb_8bit", {}),
    "paged-adamw-8bit": ("paged_adamw_8bit", {}),
    "adamw-4bit": ("adamw_torch_4bit", {}),
}
#: memsim precision -> (``from_pretrained`` dtype, TrainingArguments bf16, fp16). ``mixed-*`` is DeepSpeed's.
PRECISION: dict[str, tuple[str, bool, bool]] = {
    "fp32": ("float32", False, False),
    "bf16": ("bfloat16", False, False),
    "fp16": ("float16", False, False),
    "amp-bf16": ("float32", True, False),
    "amp-fp16": ("float32", False, True),
    "mixed-bf16": ("bfloat16", True, False),
    "mixed-fp16": ("float16", False, True),
}


def uses_deepspeed(draft: Draft) -> bool:
    """DeepSpeed runs the step when the scenario says so, for ZeRO-1/2, and for DeepSpeed's mixed precision."""
    sc = draft.scenario
    return sc.framework == "deepspeed" or sc.parallel.zero in (1, 2) or sc.precision.startswith("mixed-")


def compute_dtype(precision: str) -> str:
    """The dtype the layers compute in (QLoRA's ``bnb_4bit_compute_dtype``)."""
    return "float32" if precision == "fp32" else ("float16" if "fp16" in precision else "bfloat16")


def training_args(draft: Draft) -> dict[str, Any]:
    """TrainingArguments keys of the scenario (refuses what the Trainer cannot run)."""
    sc, fmt = draft.scenario, draft.fmt
    p = sc.parallel
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(p, name) > 1:
            raise refuse(
                f"parallel.{name}", fmt, f"the Trainer has no {name} key; use torchtitan or set it to 1"
            )
    if sc.optimizer_in_backward:
        raise refuse("optimizer_in_backward", fmt, "the Trainer has no optimizer-in-backward key")
    if sc.loss == "chunked":
        raise refuse("loss", fmt, "the Trainer has no chunked cross-entropy key; use 'standard'")
    checkpoint_every(draft)
    check_common(draft)
    _, bf16, fp16 = PRECISION[sc.precision]
    args: dict[str, Any] = {
        "output_dir": "outputs",
        "per_device_train_batch_size": sc.micro_batch_size,
        "gradient_accumulation_steps": sc.grad_accum_steps,
        "bf16": bf16,
        "fp16": fp16,
        **optim_keys(draft),
        **_checkpointing(draft),
        "torch_compile": sc.compile,
    }
    framework_note(draft, "deepspeed" if uses_deepspeed(draft) else "hf")
    if uses_deepspeed(draft):
        args["deepspeed"] = deepspeed.FILE
    elif p.zero == 3:
        args.update(_fsdp(draft))
    elif p.dp > 1:
        draft.note(f"dp={p.dp} without ZeRO: launch with torchrun --nproc-per-node {p.dp} (DDP)")
    if sc.activation_offloading:
        draft.note(
            "activation_offloading: run the forward inside torch.autograd.graph.save_on_cpu(pin_memory=True)"
        )
    if sc.padding == "packed":
        draft.note("padding packed: pack samples to seq_len in your dataset (or TRL SFTConfig(packing=True))")
    return args


def optim_keys(draft: Draft) -> dict[str, Any]:
    """``optim`` and the keys that go with it; the fused kernel for AdamW is its own name."""
    sc = draft.scenario
    if sc.optimizer not in OPTIM:
        raise refuse(
            "optimizer", draft.fmt, f"{sc.optimizer!r} has no Trainer optim; allowed: {', '.join(OPTIM)}"
        )
    name, extra = OPTIM[sc.optimizer]
    if name == "adamw_torch" and sc.optimizer_impl == "fused":
        name = "adamw_torch_fused"
    elif sc.optimizer_impl == "for-loop" and sc.optimizer not in ("adafactor", "adamw-4bit"):
        draft.note(f"optimizer_impl for-loop: the Trainer's {name} has no key for it; pass "
                   "optimizers=(torch.optim.AdamW(..., foreach=False), None) to Trainer")  # fmt: skip
    return {"optim": name, **extra}


def _checkpointing(draft: Draft) -> dict[str, Any]:
    """Checkpointing: full only (transformers checkpoints whole layers). ``activation_checkpointing`` is the
    transformers 5.24 name; releases before it call the key ``gradient_checkpointing``."""
    ac = draft.scenario.activation_checkpointing
    if ac not in ("none", "full"):
        raise refuse("activation_checkpointing", draft.fmt, f"{ac!r}: transformers checkpoints whole layers; "
                     "use 'full' or 'none'")  # fmt: skip
    if ac == "none" or (draft.scenario.parallel.zero == 3 and not uses_deepspeed(draft)):
        return {
            "activation_checkpointing": False
        }  # under FSDP2, fsdp_config.activation_checkpointing does it
    return {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}}


def _fsdp(draft: Draft) -> dict[str, Any]:
    """FSDP2 for ZeRO-3: reshard after forward, CPU offload of params/grads/states, checkpointing."""
    sc, p = draft.scenario, draft.scenario.parallel
    if p.offload == "optimizer":
        raise refuse("parallel.offload", draft.fmt, "FSDP offloads parameters, gradients and optimizer "
                     "states together; use 'optimizer+params', or framework 'deepspeed'")  # fmt: skip
    return {
        "fsdp": "full_shard auto_wrap",
        "fsdp_config": {
            "version": 2,
            "reshard_after_forward": p.reshard_after_forward,
            "cpu_offload": p.offload == "optimizer+params",
            "activation_checkpointing": sc.activation_checkpointing == "full",
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "state_dict_type": "SHARDED_STATE_DICT",
            "cpu_ram_efficient_loading": True,
        },
    }


def model_setup(draft: Draft) -> dict[str, Any]:
    """``from_pretrained`` keywords, tokenizer length, and the QLoRA / LoRA configs."""
    sc = draft.scenario
    dtype = PRECISION[sc.precision][0]
    setup: dict[str, Any] = {
        "model_name_or_path": hf_model_id(draft),
        "from_pretrained": {"dtype": dtype, "attn_implementation": sc.attention},
        "tokenizer": {
            "model_max_length": sc.seq_len,
            "padding": "longest" if sc.padding == "longest" else "max_length",
            "truncation": True,
        },  # fmt: skip
    }
    if sc.method == "qlora":
        setup["quantization_config"] = {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": compute_dtype(sc.precision),
        }
    if sc.method != "full":
        setup["lora"] = {
            "r": sc.lora.rank,
            "lora_alpha": sc.lora.alpha,
            "target_modules": lora_targets(sc),
            "lora_dropout": 0.0,
            "task_type": "CAUSAL_LM",
        }
        if lora_exclude(sc):  # lora.target_scope language: the tower and projector keep no adapter
            setup["lora"]["exclude_modules"] = lora_exclude(sc)
    return setup


def render(draft: Draft) -> dict[str, str]:
    """``training_args.yaml``, ``model_setup.yaml`` and, for DeepSpeed, ``ds_config.json`` with its note."""
    args = training_args(draft)
    setup = model_setup(draft)
    ds = deepspeed.ds_config(draft, standalone=False) if uses_deepspeed(draft) else None
    files = {} if ds is None else deepspeed.files(draft, ds)
    head = comment(header_lines(draft))
    use = ("# Read with: HfArgumentParser(TrainingArguments).parse_yaml_file('training_args.yaml') (transformers "
           ">= 5.24; older releases name activation_checkpointing gradient_checkpointing)\n")  # fmt: skip
    setup_use = ("# AutoModelForCausalLM.from_pretrained(model_name_or_path, **from_pretrained, quantization_config="
                 "BitsAndBytesConfig(**quantization_config)); peft.get_peft_model(model, LoraConfig(**lora))\n")  # fmt: skip
    return {
        "training_args.yaml": head + use + to_yaml(args),
        "model_setup.yaml": head + setup_use + to_yaml(setup),
        **files,
    }
