"""Axolotl config YAML -> scenario keys: model, adapter, batch, sequence and packing, precision, optimizer,
checkpointing and offloading, attention, loss, DeepSpeed / FSDP2 and the parallel sizes.

Keys and defaults as axolotl 0.19.0 validates them (axolotl/utils/schemas/config.py ``AxolotlInputConfig``:
``sequence_len`` 512, ``micro_batch_size`` 1, ``optimizer`` ``adamw_torch_fused``, ``bf16`` 'auto' -- bf16 on a
card that has it --, ``gradient_checkpointing`` false or 'offload'; schemas/fsdp.py ``FSDPConfig``;
https://docs.axolotl.ai/docs/config-reference.html). ``bf16: true`` loads the weights in bf16 and trains in
them (memsim ``bf16``; with DeepSpeed its own section decides). LoRA's rank and alpha default to peft's 8.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from memsim_widget.importers import deepspeed, hf
from memsim_widget.importers.common import Reading, dig, file_error, get_bool, get_int, get_str, resolve_model

ATTENTION_FLAGS = {"flash_attention": "sdpa", "sdp_attention": "sdpa", "flex_attention": "sdpa",
                   "xformers_attention": "sdpa", "eager_attention": "eager"}  # fmt: skip


def looks_like(data: dict[str, Any]) -> bool:
    return "base_model" in data or ("micro_batch_size" in data and "sequence_len" in data)


def read(reading: Reading, path: Path, data: dict[str, Any], companion: Callable[[Path, str], Any]) -> None:
    """An axolotl config (and its DeepSpeed JSON) into ``reading``."""
    name = path.name
    reading.set("framework", "hf")
    if "base_model" in data:
        resolve_model(reading, path, "base_model", data["base_model"])
    else:
        reading.miss("model", name, "no base_model key; memsim assumed its default")
    _adapter(reading, path, data)
    reading.set("seq_len", get_int(path, data, "sequence_len", 512))
    if get_bool(path, data, "sample_packing", False):
        reading.set("padding", "packed")
    else:
        pad = get_bool(path, data, "pad_to_sequence_len", False)
        reading.set("padding", "max_length" if pad else "longest")
    reading.set("micro_batch_size", get_int(path, data, "micro_batch_size", 1))
    reading.set("grad_accum_steps", get_int(path, data, "gradient_accumulation_steps", 1))
    if "batch_size" in data and "gradient_accumulation_steps" not in data:
        reading.miss("grad_accum_steps", f"{name}: batch_size", "the global batch_size needs the GPU count; "
                     "memsim assumed accumulation 1")  # fmt: skip
    hf_keys = {"optim": data.get("optimizer", hf.DEFAULT_OPTIM)}
    if "weight_decay" in data:
        hf_keys["weight_decay"] = data["weight_decay"]
    hf._optim(reading, path, hf_keys)
    _checkpointing(reading, path, data)
    _attention(reading, path, data)
    compile_ = dig(data, "torch_compile")
    if compile_ == "auto":
        reading.miss("compile", f"{name}: torch_compile", "'auto' compiles where torch supports it; memsim "
                     "assumed eager", keep=True)  # fmt: skip
    reading.set("compile", compile_ is True)
    reading.set("loss", "chunked" if get_bool(path, data, "chunked_cross_entropy", False) else "standard")
    _layout(reading, path, data, companion)


def _adapter(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """``adapter`` lora/qlora with ``load_in_4bit``, rank, alpha and targets."""
    adapter = get_str(path, data, "adapter")
    if get_bool(path, data, "load_in_8bit", False):
        reading.miss(
            "method",
            f"{path.name}: load_in_8bit",
            "8-bit base weights are not modelled; read as 16-bit",
            keep=True,
        )
    if adapter is None:
        reading.set("method", "full")
        return
    if adapter not in ("lora", "qlora"):
        raise file_error(path, "adapter", f"{adapter!r} is not modelled; memsim reads lora and qlora")
    q4 = adapter == "qlora" or bool(get_bool(path, data, "load_in_4bit", False))
    reading.set("method", "qlora" if q4 else "lora")
    reading.set("lora.rank", get_int(path, data, "lora_r", 8))
    reading.set("lora.alpha", get_int(path, data, "lora_alpha", 8))
    if get_bool(path, data, "lora_target_linear", False):
        reading.set("lora.targets", ["all-linear"])
    elif data.get("lora_target_modules") is not None:
        reading.set("lora.targets", hf.lora_targets(path, "lora_target_modules", data["lora_target_modules"]))
    else:
        reading.miss("lora.targets", path.name, "no lora_target_modules: peft's defaults for the model type; "
                     "memsim assumed q_proj, v_proj")  # fmt: skip
    hf.read_scope(reading, data.get("lora_exclude_modules"))  # axolotl hands it to peft's exclude_modules


def _checkpointing(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """``gradient_checkpointing`` (true, or 'offload': checkpoints kept in host memory) and activation offload."""
    gc = dig(data, "gradient_checkpointing", False)
    if gc not in (True, False, None, "offload", "offload_disk"):
        raise file_error(path, "gradient_checkpointing", f"must be true, false or 'offload', got {gc!r}")
    fsdp_ac = get_bool(path, data, "fsdp_config.activation_checkpointing", False)
    reading.set("activation_checkpointing", "full" if gc or fsdp_ac else "none")
    offload = dig(data, "activation_offloading", False)
    if offload not in (True, False, None, "legacy", "disk", "hidden_states"):
        raise file_error(path, "activation_offloading", f"must be true, false or 'legacy', got {offload!r}")
    reading.set("activation_offloading", bool(offload) or gc in ("offload", "offload_disk"))


def _attention(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """``attn_implementation`` (0.19), else the older boolean flags; transformers' sdpa by default."""
    impl = get_str(path, data, "attn_implementation")
    if impl is not None:
        reading.set("attention", hf.ATTENTION.get(impl, "sdpa"))
        if impl not in ("sdpa", "eager"):
            reading.miss("attention", f"{path.name}: attn_implementation", f"{impl!r} read as sdpa (the same "
                         "memory: no score matrix kept)", keep=True)  # fmt: skip
        return
    for key, value in ATTENTION_FLAGS.items():
        if get_bool(path, data, key, False):
            reading.set("attention", value)
            return
    reading.set("attention", "sdpa")


def _precision(reading: Reading, path: Path, data: dict[str, Any], ds: bool) -> None:
    """bf16 ('auto': bf16) or fp16, else fp32; under DeepSpeed its own section decides."""
    bf16 = dig(data, "bf16", "auto")
    bf16 = (
        bf16 == "auto"
        or bool(get_bool(path, data, "bf16", False))
        or bool(get_bool(path, data, "bfloat16", False))
    )
    fp16 = bool(get_bool(path, data, "fp16", False)) or bool(get_bool(path, data, "float16", False))
    if dig(data, "bf16", "auto") == "auto" and not fp16:
        reading.miss(
            "precision",
            f"{path.name}: bf16",
            "'auto' (the default) read as bf16 (a card with bf16)",
            keep=True,
        )
    if ds:
        if "precision" not in reading.values:
            reading.set("precision", "mixed-bf16" if bf16 else ("mixed-fp16" if fp16 else "fp32"))
        return
    reading.set("precision", "fp16" if fp16 else ("bf16" if bf16 else "fp32"))


def _layout(
    reading: Reading, path: Path, data: dict[str, Any], companion: Callable[[Path, str], Any]
) -> None:
    """DeepSpeed JSON, FSDP2, tensor / context parallel sizes; the GPU count from ``dp_shard_size`` or unread."""
    ds_ref = data.get("deepspeed")
    ds = False
    reading.set("parallel.zero", 0)
    reading.set("parallel.offload", "none")
    if isinstance(ds_ref, dict):
        deepspeed.read(reading, path, ds_ref)
        ds = True
    elif isinstance(ds_ref, str):
        ds = deepspeed.read_referenced(reading, path, "deepspeed", ds_ref, companion) is not None
    elif get_int(path, data, "fsdp_version") == 2 or data.get("fsdp_config") or data.get("fsdp"):
        reading.set("parallel.zero", 3)
        offload = get_bool(path, data, "fsdp_config.offload_params", None)
        if offload is None:  # FSDP1's name (fsdp_config keys prefixed fsdp_)
            offload = get_bool(path, data, "fsdp_config.fsdp_offload_params", False)
        reading.set("parallel.offload", "optimizer+params" if offload else "none")
        reading.set(
            "parallel.reshard_after_forward",
            bool(get_bool(path, data, "fsdp_config.reshard_after_forward", True)),
        )
        if get_int(path, data, "fsdp_version", 1) != 2:
            reading.miss("fsdp_version", path.name, "FSDP1 read as FSDP2")
    _precision(reading, path, data, ds)
    if "tensor_parallel_size" in data or "parallel.tp" not in reading.values:  # DeepSpeed's AutoTP may set it
        reading.set("parallel.tp", get_int(path, data, "tensor_parallel_size", 1))
    reading.set("parallel.cp", get_int(path, data, "context_parallel_size", 1))
    shard = get_int(path, data, "dp_shard_size")
    rep = get_int(path, data, "dp_replicate_size", 1)
    if shard is not None:
        reading.set("parallel.dp", shard * rep)
        if (
            rep > 1 and shard > 1 and reading.values.get("parallel.zero") == 3
        ):  # FSDP2 HSDP (replicate x shard)
            reading.set("parallel.dp_shard", shard)
    else:
        reading.miss("parallel.dp", path.name, "the launch (axolotl train --num-processes N) sets the GPU count; "
                     "memsim assumed one data-parallel rank (pass --dp)")  # fmt: skip
