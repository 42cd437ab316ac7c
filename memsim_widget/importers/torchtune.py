"""torchtune: a recipe config YAML, or a ``tune run`` command line (a shell script) with ``key=value``
overrides on a shipped config -> scenario keys.

Keys as torchtune 0.6 recipes read them (recipes/full_finetune_distributed.py, lora_finetune_distributed.py;
recipes/configs/*): ``model._component_`` (the builder names the model and LoRA/QLoRA), ``lora_attn_modules``,
``apply_lora_to_mlp``, ``lora_rank``, ``lora_alpha``, ``batch_size``, ``gradient_accumulation_steps``, ``dtype``,
``tokenizer.max_seq_len`` (null: batches padded to their longest sample), ``dataset.packed``,
``enable_activation_checkpointing``, ``enable_activation_offloading``, ``compile``, ``optimizer_in_bwd``,
``fsdp_cpu_offload``, ``fsdp_reshard_after_forward``, ``loss._component_``, ``optimizer._component_``.
Overrides merge as OmegaConf's dotlist does (``~key`` removes one). A shipped config named by ``--config`` is
not bundled: its keys that no override sets are listed as unread. LoRA adapters take the model's dtype.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from memsim_widget.export.torchtune import ATTN, MLP, MODELS
from memsim_widget.importers.common import (
    Reading,
    dig,
    file_error,
    get_bool,
    get_choice,
    get_int,
    get_number,
    get_str,
    load_mapping,
    read_text,
    resolve_model,
)

#: ``optimizer._component_`` -> memsim optimizer.
OPTIMIZERS = {"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam", "torch.optim.SGD": "sgd",
              "bitsandbytes.optim.AdamW8bit": "adamw-8bit", "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit",
              "bitsandbytes.optim.PagedAdamW": "adamw", "torchao.optim.AdamW8bit": "adamw-8bit"}  # fmt: skip
CHUNKED = ("CEWithChunkedOutputLoss", "LinearCrossEntropyLoss")
SHIPPED = "not overridden: the shipped config --config {config} sets it; memsim assumed its default"


def looks_like_config(data: dict[str, Any]) -> bool:
    return isinstance(data.get("model"), dict) and "_component_" in data["model"]


def looks_like_script(text: str) -> bool:
    return re.search(r"(^|\s)tune\s+run\s", text) is not None


def command(path: Path, text: str) -> list[str]:
    """The ``tune run`` argv of a shell script (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        if line.lstrip().startswith("#") or not looks_like_script(line + " "):
            continue
        try:
            argv = shlex.split(line, comments=True)
        except ValueError as exc:
            raise file_error(path, "tune run", f"cannot split the command line: {exc}") from None
        return argv[argv.index("tune") :] if "tune" in argv else argv
    raise file_error(path, "tune run", "no 'tune run' command line in the file")


def read_script(reading: Reading, path: Path, text: str) -> None:
    """A ``tune run`` script: the recipe, the GPU count, the config (a local file is read) and the overrides."""
    argv = command(path, text)
    nproc, config, overrides, recipe = 1, None, [], None
    i = 2
    while i < len(argv):
        arg = argv[i]
        if arg in ("--nproc_per_node", "--nproc-per-node") and i + 1 < len(argv):
            nproc = _int_arg(path, arg, argv[i + 1])
            i += 2
            continue
        if arg == "--config" and i + 1 < len(argv):
            config = argv[i + 1]
            i += 2
            continue
        if "=" in arg or arg.startswith("~"):
            overrides.append(arg)
        elif not arg.startswith("-") and recipe is None:
            recipe = arg
        i += 1
    if config is None:
        raise file_error(path, "--config", "the tune run line names no --config")
    local = (path.parent / config).expanduser()
    data = (
        load_mapping(local, read_text(local)) if local.suffix in (".yaml", ".yml") and local.is_file() else {}
    )
    shipped = not data
    data = merge_overrides(path, data, overrides)
    if shipped:
        _shipped_model(reading, config, data)
    read_config(reading, path, data, nproc=nproc, shipped=config if shipped else None)


def _int_arg(path: Path, flag: str, text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise file_error(path, flag, f"must be a positive integer, got {text!r}")
    return int(text)


def merge_overrides(path: Path, data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``key=value`` (YAML values, as OmegaConf parses them) and ``~key`` merged into a copy of ``data``."""
    out = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        remove = item.startswith("~")
        key, _, raw = item.lstrip("~").partition("=")
        *parents, leaf = key.split(".")
        target = out
        for p in parents:
            target = target.setdefault(p, {})
            if not isinstance(target, dict):
                raise file_error(path, key, "overrides a key inside a value that is not a mapping")
        if remove:
            target.pop(leaf, None)
            continue
        try:
            target[leaf] = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            target[leaf] = raw
    return out


def _shipped_model(reading: Reading, config: str, data: dict[str, Any]) -> None:
    """The preset and method a shipped config's name gives (``llama3_1/8B_lora``), unless overridden."""
    for preset, (prefix, _, builder, _) in MODELS.items():
        if config in (f"{prefix}_lora", f"{prefix}_full", f"{prefix}_qlora", f"{prefix}_lora_single_device",
                      f"{prefix}_full_single_device", f"{prefix}_qlora_single_device"):  # fmt: skip
            kind = config[len(prefix) + 1 :].removesuffix("_single_device")
            if "_component_" not in data.setdefault("model", {}):
                name = builder if kind == "full" else f"{kind}_{builder}"
                data["model"]["_component_"] = f"torchtune.models.{MODELS[preset][1]}.{name}"
            return
    reading.miss("model", f"--config {config}", "a shipped config memsim does not know; pass --model")


def _builder(reading: Reading, path: Path, data: dict[str, Any]) -> str:
    """The model and the method from ``model._component_``; returns the method."""
    component = get_str(path, data, "model._component_", "")
    name = component.rsplit(".", 1)[-1]
    method = "qlora" if name.startswith("qlora_") else ("lora" if name.startswith("lora_") else "full")
    builder = name.removeprefix("qlora_").removeprefix("lora_")
    presets = [p for p, (_, _, b, _) in MODELS.items() if b == builder]
    if presets:
        reading.set("model", presets[0])
    elif get_str(path, data, "checkpointer.checkpoint_dir"):
        resolve_model(reading, path, "checkpointer.checkpoint_dir", data["checkpointer"]["checkpoint_dir"])
    else:
        reading.miss("model", f"{path.name}: model._component_", f"{component!r} is no builder memsim maps to a "
                     "preset; pass --model")  # fmt: skip
    reading.set("method", method)
    return method


def read_config(
    reading: Reading,
    path: Path,
    data: dict[str, Any],
    *,
    nproc: int | None = None,
    shipped: str | None = None,
) -> None:
    """A torchtune recipe config (merged with its overrides) into ``reading``."""
    where = f"--config {shipped}" if shipped else path.name
    reading.set("framework", "torchtune")
    method = _builder(reading, path, data)

    def key(name: str, scenario_key: str, read: Any) -> None:
        if dig(data, name) is None and shipped:
            reading.miss(scenario_key, where, SHIPPED.format(config=shipped))
        else:
            reading.set(scenario_key, read)

    key("batch_size", "micro_batch_size", get_int(path, data, "batch_size", 1))
    key(
        "gradient_accumulation_steps",
        "grad_accum_steps",
        get_int(path, data, "gradient_accumulation_steps", 1),
    )
    dtype = get_choice(path, data, "dtype", {"bf16": "bf16", "fp32": "fp32"}, "bf16")
    key("dtype", "precision", dtype)
    ckpt = get_bool(path, data, "enable_activation_checkpointing", False)
    key("enable_activation_checkpointing", "activation_checkpointing", "full" if ckpt else "none")
    key(
        "enable_activation_offloading",
        "activation_offloading",
        bool(get_bool(path, data, "enable_activation_offloading", False)),
    )
    key("compile", "compile", bool(get_bool(path, data, "compile", False)))
    key("optimizer_in_bwd", "optimizer_in_backward", bool(get_bool(path, data, "optimizer_in_bwd", False)))
    loss = get_str(path, data, "loss._component_", "")
    key("loss._component_", "loss", "chunked" if loss.endswith(CHUNKED) else "standard")
    length = get_int(path, data, "tokenizer.max_seq_len")
    if length is None:
        reading.miss(
            "seq_len", where, "tokenizer.max_seq_len is null: the longest sample decides; pass --seq-len"
        )
    else:
        reading.set("seq_len", length)
    if get_bool(path, data, "dataset.packed", False):
        reading.set("padding", "packed")
    else:
        reading.assume(
            "padding", "longest", where, "torchtune's collator pads each batch to its longest sample"
        )
    _optimizer(reading, path, data, key)
    if method != "full":
        _lora(reading, path, data, dtype)
    if nproc is None:  # a config file alone: tune run --nproc_per_node decides
        reading.miss("parallel.dp", path.name, "tune run --nproc_per_node N sets the GPU count (the distributed "
                     "recipes shard with FSDP2 over them); memsim assumed one GPU (pass --dp N --zero 3)")  # fmt: skip
        nproc = 1
    else:
        reading.set("parallel.dp", nproc)
    reading.set("parallel.zero", 3 if nproc > 1 else 0)
    offload = nproc > 1 and bool(get_bool(path, data, "fsdp_cpu_offload", False))
    reading.set("parallel.offload", "optimizer+params" if offload else "none")
    reading.set(
        "parallel.reshard_after_forward", bool(get_bool(path, data, "fsdp_reshard_after_forward", True))
    )


def _optimizer(reading: Reading, path: Path, data: dict[str, Any], key: Any) -> None:
    """``optimizer._component_`` and its kernel (``fused``, ``foreach``)."""
    component = get_str(path, data, "optimizer._component_")
    if component is None:
        key("optimizer._component_", "optimizer", "adamw")
        return
    if component not in OPTIMIZERS:
        reading.miss("optimizer", f"{path.name}: optimizer._component_", f"{component!r} is not modelled; memsim "
                     "assumed AdamW")  # fmt: skip
        return
    opt = OPTIMIZERS[component]
    if opt == "sgd" and (get_number(path, data, "optimizer.momentum", None) or 0) > 0:
        opt = "sgd-momentum"
    reading.set("optimizer", opt)
    if opt in ("adamw", "adam"):
        fused = get_bool(path, data, "optimizer.fused", False)
        foreach = get_bool(path, data, "optimizer.foreach", True)
        reading.set("optimizer_impl", "fused" if fused else ("foreach" if foreach else "for-loop"))


def _lora(reading: Reading, path: Path, data: dict[str, Any], dtype: str) -> None:
    """LoRA rank, alpha and targets (torchtune's module names as HF's); adapters in the model's dtype."""
    attn = dig(data, "model.lora_attn_modules", ["q_proj", "v_proj"])
    back = {v: k for k, v in ATTN.items()}
    if not isinstance(attn, list) or any(a not in back for a in attn):
        raise file_error(
            path, "model.lora_attn_modules", f"must list q_proj, k_proj, v_proj, output_proj, got {attn!r}"
        )
    targets = [back[a] for a in attn]
    if get_bool(path, data, "model.apply_lora_to_mlp", False):
        targets += sorted(MLP)
    if get_bool(path, data, "model.apply_lora_to_output", False):
        reading.miss("lora.targets", f"{path.name}: model.apply_lora_to_output", "a LoRA adapter on the output "
                     "projection is not modelled", keep=True)  # fmt: skip
    if not targets:
        raise file_error(path, "model.lora_attn_modules", "no module is adapted")
    every = [*ATTN, *sorted(MLP)]
    reading.set("lora.targets", ["all-linear"] if sorted(targets) == sorted(every) else targets)
    reading.set("lora.rank", get_int(path, data, "model.lora_rank", 8))
    reading.set("lora.alpha", get_number(path, data, "model.lora_alpha", 16))
    reading.set("lora.adapter_dtype", "bf16" if dtype == "bf16" else "fp32")
