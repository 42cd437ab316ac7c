"""Hugging Face Trainer: ``TrainingArguments`` as JSON or YAML (TRL's ``SFTConfig`` keys too), memsim's
``model_setup.yaml`` (``from_pretrained`` keywords, bitsandbytes and PEFT configs), and the DeepSpeed JSON the
arguments name.

Keys and defaults as transformers 5.24 ``TrainingArguments`` has them (training_args.py: batch 8 per device,
``optim`` ``adamw_torch_fused``, no bf16/fp16, ``activation_checkpointing`` -- ``gradient_checkpointing`` before
5.24 --, ``fsdp`` / ``fsdp_config``), TRL 0.2x ``SFTConfig`` (``max_length`` 1024, ``packing``), peft 0.21
``LoraConfig`` (``r`` 8, ``lora_alpha`` 8, targets per model type). The Trainer pads to each batch's longest
sample unless the tokenizer pads to ``max_length``; the model's dtype is the script's ``from_pretrained(dtype=)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memsim_widget.importers.common import (
    Reading,
    dig,
    file_error,
    get_bool,
    get_choice,
    get_int,
    get_number,
    get_str,
    resolve_model,
)

#: transformers ``optim`` -> memsim (optimizer, implementation or None: the optimizer's only kernel).
OPTIM: dict[str, tuple[str, str | None]] = {
    "adamw_torch": ("adamw", "foreach"),
    "adamw_torch_fused": ("adamw", "fused"),
    "adamw_hf": ("adamw", "for-loop"),
    "sgd": ("sgd", None),
    "adafactor": ("adafactor", None),
    "lion_32bit": ("lion", None),
    "adamw_bnb_8bit": ("adamw-8bit", None),
    "adamw_8bit": ("adamw-8bit", None),
    "paged_adamw_8bit": ("paged-adamw-8bit", None),
    "adamw_torch_4bit": ("adamw-4bit", None),
}
#: transformers 5.24 TrainingArguments defaults memsim reads.
DEFAULT_BATCH = 8
DEFAULT_OPTIM = "adamw_torch_fused"
#: TRL ``SFTConfig.max_length`` default.
TRL_MAX_LENGTH = 1024
#: (from_pretrained dtype, bf16, fp16) -> memsim precision without DeepSpeed (export/hf.py PRECISION inverted).
PRECISION: dict[tuple[str, bool, bool], str] = {
    ("float32", False, False): "fp32",
    ("bfloat16", False, False): "bf16",
    ("float16", False, False): "fp16",
    ("float32", True, False): "amp-bf16",
    ("float32", False, True): "amp-fp16",
    ("bfloat16", True, False): "bf16",  # autocast to bf16 of bf16 weights changes nothing
    ("float16", False, True): "fp16",
}
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16", "torch.bfloat16": "bfloat16", "torch.float16": "float16",
          "torch.float32": "float32", "auto": "auto"}  # fmt: skip
ATTENTION = {"sdpa": "sdpa", "eager": "eager", "flash_attention_2": "sdpa", "flash_attention_3": "sdpa",
             "flex_attention": "sdpa", "kernels-community/flash-attn": "sdpa"}  # fmt: skip


def is_training_args(data: dict[str, Any]) -> bool:
    keys = ("per_device_train_batch_size", "output_dir", "gradient_accumulation_steps", "optim", "fsdp")
    return any(k in data for k in keys)


def is_model_setup(data: dict[str, Any]) -> bool:
    return "from_pretrained" in data or (
        "model_name_or_path" in data and ("lora" in data or "tokenizer" in data)
    )


def read_args(reading: Reading, path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """TrainingArguments keys into ``reading``; returns what the precision needs (bf16, fp16, deepspeed)."""
    reading.set("framework", "hf")
    reading.set("micro_batch_size", get_int(path, data, "per_device_train_batch_size", DEFAULT_BATCH))
    reading.set("grad_accum_steps", get_int(path, data, "gradient_accumulation_steps", 1))
    _optim(reading, path, data)
    ckpt = get_bool(path, data, "activation_checkpointing", None)
    if ckpt is None:
        ckpt = get_bool(path, data, "gradient_checkpointing", False)
    reading.set("activation_checkpointing", "full" if ckpt else "none")
    reading.set("compile", bool(get_bool(path, data, "torch_compile", False)))
    if "max_length" in data or "max_seq_length" in data:  # TRL SFTConfig
        key = "max_length" if "max_length" in data else "max_seq_length"
        reading.set("seq_len", get_int(path, data, key, TRL_MAX_LENGTH))
    if get_bool(path, data, "packing", False):
        reading.set("padding", "packed")
    _fsdp(reading, path, data)
    return {
        "bf16": bool(get_bool(path, data, "bf16", False)),
        "fp16": bool(get_bool(path, data, "fp16", False)),
        "deepspeed": data.get("deepspeed"),
        "dtype": _model_config(reading, path, data),
    }


def _model_config(reading: Reading, path: Path, data: dict[str, Any]) -> str | None:
    """TRL's ``ModelConfig`` keys that ``TrlParser`` reads from the same YAML (trl/trainer/model_config.py:
    ``model_name_or_path``, ``dtype``/``torch_dtype``, ``attn_implementation``, ``use_peft``, ``lora_r`` 16,
    ``lora_alpha`` 32, ``lora_target_modules``, ``load_in_4bit``); returns the load dtype, None when absent."""
    if "model_name_or_path" not in data:
        return None
    resolve_model(reading, path, "model_name_or_path", data["model_name_or_path"])
    attn = get_choice(path, data, "attn_implementation", ATTENTION)
    if attn is not None:
        reading.set("attention", attn)
    if get_bool(path, data, "use_peft", False):
        q4 = bool(get_bool(path, data, "load_in_4bit", False))
        reading.set("method", "qlora" if q4 else "lora")
        reading.set("lora.rank", get_int(path, data, "lora_r", 16))
        reading.set("lora.alpha", get_number(path, data, "lora_alpha", 32))
        if data.get("lora_target_modules") is not None:
            reading.set(
                "lora.targets", lora_targets(path, "lora_target_modules", data["lora_target_modules"])
            )
    else:
        reading.set("method", "full")
    return get_choice(path, data, "dtype", DTYPES) or get_choice(path, data, "torch_dtype", DTYPES)


def _optim(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """``optim`` (AdamW with ``weight_decay: 0.0`` written is Adam: the same memory)."""
    name = get_str(path, data, "optim", DEFAULT_OPTIM)
    if name not in OPTIM:
        reading.miss("optimizer", f"{path.name}: optim", f"{name!r} is not modelled; memsim assumed AdamW")
        return
    opt, impl = OPTIM[name]
    decay = data.get("weight_decay")
    if opt == "adamw" and type(decay) in (int, float) and decay == 0:
        opt = "adam"
    reading.set("optimizer", opt)
    if impl is not None:
        reading.set("optimizer_impl", impl)


def _fsdp(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """``fsdp`` (options as a string or list) and ``fsdp_config``: FSDP2 full shard is ZeRO-3."""
    opts = data.get("fsdp") or ""
    words = set(opts.split() if isinstance(opts, str) else [str(o) for o in opts]) if opts else set()
    if not words:
        return
    if not words & {"full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"}:
        raise file_error(path, "fsdp", f"{opts!r} names no sharding strategy (full_shard, shard_grad_op)")
    reading.set("parallel.zero", 3 if words & {"full_shard", "hybrid_shard"} else 2)
    if words & {"hybrid_shard", "hybrid_shard_zero2"}:
        reading.miss("parallel.dp_shard", f"{path.name}: fsdp", "hybrid sharding shards within a node, whose GPU "
                     "count is the launch's: read as sharding over every GPU (pass --dp-shard GPUS_PER_NODE)",
                     keep=True)  # fmt: skip
    offload = "offload" in words or get_bool(path, data, "fsdp_config.cpu_offload", False)
    reading.set("parallel.offload", "optimizer+params" if offload else "none")
    reshard = get_bool(path, data, "fsdp_config.reshard_after_forward", True)
    reading.set("parallel.reshard_after_forward", bool(reshard))
    if get_bool(path, data, "fsdp_config.activation_checkpointing", False):
        reading.set("activation_checkpointing", "full")
    if get_int(path, data, "fsdp_config.version", 1) != 2:
        reading.miss("fsdp_config.version", path.name, "FSDP1 (the default before version: 2) read as FSDP2")


def read_setup(reading: Reading, path: Path, data: dict[str, Any]) -> str | None:
    """memsim's model_setup.yaml: model, dtype, attention, tokenizer length, QLoRA and LoRA; returns the dtype."""
    if "model_name_or_path" in data:
        resolve_model(reading, path, "model_name_or_path", data["model_name_or_path"])
    dtype = get_choice(path, data, "from_pretrained.dtype", DTYPES) or get_choice(
        path, data, "from_pretrained.torch_dtype", DTYPES
    )
    attn = get_choice(path, data, "from_pretrained.attn_implementation", ATTENTION)
    if attn is not None:
        reading.set("attention", attn)
    length = get_int(path, data, "tokenizer.model_max_length")
    if length is not None:
        reading.set("seq_len", length)
    padding = get_choice(path, data, "tokenizer.padding", {"longest": "longest", "max_length": "max_length",
                         True: "longest"})  # fmt: skip
    if padding == "longest" and reading.values.get("padding") != "packed":
        reading.set("padding", padding)
    elif padding == "max_length" and reading.values.get("padding") != "packed":
        reading.assume("padding", "max_length", f"{path.name}: tokenizer.padding", "max_length, unless your dataset "
                       "packs samples (the same shapes every step)")  # fmt: skip
    read_lora(reading, path, data)
    return dtype


def read_lora(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """``quantization_config`` (4-bit: QLoRA) and ``lora`` (peft LoraConfig keywords)."""
    q4 = get_bool(path, data, "quantization_config.load_in_4bit", False)
    if get_bool(path, data, "quantization_config.load_in_8bit", False):
        reading.miss("method", f"{path.name}: quantization_config.load_in_8bit", "8-bit LoRA is not modelled; "
                     "read as LoRA on a 16-bit base", keep=True)  # fmt: skip
    lora = data.get("lora")
    if lora is None:
        reading.set("method", "qlora" if q4 else "full")
        return
    if not isinstance(lora, dict):
        raise file_error(path, "lora", "must be a mapping of LoraConfig keywords")
    reading.set("method", "qlora" if q4 else "lora")
    reading.set("lora.rank", get_int(path, data, "lora.r", 8))
    reading.set("lora.alpha", get_number(path, data, "lora.lora_alpha", 8))
    targets = dig(data, "lora.target_modules")
    if targets is not None:
        reading.set("lora.targets", lora_targets(path, "lora.target_modules", targets))
    read_scope(reading, dig(data, "lora.exclude_modules"))


def read_scope(reading: Reading, exclude: Any) -> None:
    """PEFT's ``exclude_modules`` (a regex or names): modules kept free of adapters, read as
    ``lora.target_scope`` "language" (export/common.py ``lora_exclude`` writes the tower's and projector's)."""
    if exclude:
        reading.set("lora.target_scope", "language")


def lora_targets(path: Path, key: str, targets: Any) -> list[str]:
    """PEFT's ``target_modules``: a list of names, ``all-linear``, or one name."""
    if isinstance(targets, str):
        return ["all-linear"] if targets in ("all-linear", "all") else [t.strip() for t in targets.split(",")]
    if isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets):
        return list(targets)
    raise file_error(path, key, f"must be a list of module names or 'all-linear', got {targets!r}")


def precision(
    reading: Reading, where: str, dtype: str | None, flags: dict[str, Any], deepspeed: bool
) -> None:
    """The scenario's precision from the load dtype and the Trainer's bf16/fp16 (DeepSpeed's section wins)."""
    bf16, fp16 = flags["bf16"], flags["fp16"]
    if deepspeed:
        if "precision" not in reading.values:  # the DeepSpeed section said 'auto': the Trainer's flags decide
            reading.set("precision", "mixed-bf16" if bf16 else ("mixed-fp16" if fp16 else "fp32"))
        return
    if dtype in (None, "auto"):
        dtype = "bfloat16"
        reading.miss("precision", where, "the model's load dtype (from_pretrained dtype) is your script's; memsim "
                     "assumed bfloat16 weights (checkpoints' usual 'auto' dtype)", keep=True)  # fmt: skip
    key = (dtype, bf16, fp16)
    if key not in PRECISION:
        raise file_error(where, "bf16", f"bf16={bf16}, fp16={fp16} on {dtype} weights is not a precision memsim "
                         "models")  # fmt: skip
    reading.set("precision", PRECISION[key])
