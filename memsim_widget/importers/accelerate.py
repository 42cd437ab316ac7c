"""accelerate config YAML (``accelerate launch --config_file``) -> the layout, precision and sharding; with
DeepSpeed, the JSON its ``deepspeed_config_file`` names (or accelerate's inline DeepSpeed keys).

Keys as accelerate 1.x writes and reads them (commands/config/config_args.py ``ClusterConfig``,
commands/launch.py; https://huggingface.co/docs/accelerate/usage_guides/fsdp): ``mixed_precision`` is autocast
over the weights the script loads; ``fsdp_version: 2`` with ``fsdp_reshard_after_forward``, FSDP1's
``fsdp_sharding_strategy`` (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD); ``parallelism_config_*`` sizes.
The training script sets the batch, the sequence, the optimizer, the model and its dtype: listed as unread.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from memsim_widget.importers import deepspeed
from memsim_widget.importers.common import Reading, dig, file_error, get_bool, get_choice, get_int, get_str

KINDS = ("NO", "MULTI_GPU", "DEEPSPEED", "FSDP")
#: FSDP1 ``fsdp_sharding_strategy`` (name or accelerate's number) -> (ZeRO stage, reshard after forward).
SHARDING = {"FULL_SHARD": (3, True), "SHARD_GRAD_OP": (2, False), "NO_SHARD": (0, True), "HYBRID_SHARD": (3, True),
            "HYBRID_SHARD_ZERO2": (2, False), "_HYBRID_SHARD_ZERO2": (2, False),
            1: (3, True), 2: (2, False), 3: (0, True), 4: (3, True), 5: (2, False), "1": (3, True), "2": (2, False),
            "3": (0, True), "4": (3, True), "5": (2, False)}  # fmt: skip
#: FSDP1's hybrid strategies (accelerate 1.16.0 ``utils/constants.py`` ``FSDP_SHARDING_STRATEGY``, numbered from 1):
#: FULL_SHARD / SHARD_GRAD_OP within a node, replicated across nodes (torch ``fsdp/api.py`` ``ShardingStrategy``).
HYBRID = frozenset({"HYBRID_SHARD", "HYBRID_SHARD_ZERO2", "_HYBRID_SHARD_ZERO2", 4, 5, "4", "5"})
#: accelerate's inline ``deepspeed_config`` offload devices.
DEVICES = {"none": "none", "cpu": "cpu", "nvme": "cpu"}
SCRIPT = "the training script sets it (no accelerate key)"


def looks_like(data: dict[str, Any]) -> bool:
    return "distributed_type" in data or "compute_environment" in data


def read(reading: Reading, path: Path, data: dict[str, Any], companion: Callable[[Path, str], Any]) -> None:
    """An accelerate config (and its DeepSpeed JSON, found by ``companion``) into ``reading``."""
    kind = get_choice(path, data, "distributed_type", {k: k for k in KINDS}, "NO")
    # num_processes is the job's total (accelerate 1.16.0 commands/launch.py "--num_processes: The total number of
    # processes"; utils/launch.py: nproc_per_node = num_processes // num_machines)
    world = get_int(path, data, "num_processes", 1)
    machines = get_int(path, data, "num_machines", 1)
    mixed = get_choice(path, data, "mixed_precision", {"no": "no", "bf16": "bf16", "fp16": "fp16"}, "no")
    reading.set("framework", "deepspeed" if kind == "DEEPSPEED" else "hf")
    if get_str(path, data, "dynamo_config.dynamo_backend", "NO").upper() not in ("NO", ""):
        reading.set("compile", True)
    tp = cp = 1
    if kind == "DEEPSPEED":
        tp = _deepspeed(reading, path, data, companion, mixed)
    else:
        if mixed == "no":
            reading.miss("precision", path.name, "mixed_precision 'no': the model's dtype is your script's "
                         "from_pretrained(dtype=); memsim assumed its default")  # fmt: skip
        else:
            reading.set("precision", f"amp-{mixed}")
            reading.miss("precision", f"{path.name}: mixed_precision", f"{mixed} autocast read over fp32 weights "
                         "(amp); weights your script loads in 16 bits train as pure 16-bit", keep=True)  # fmt: skip
        reading.set("parallel.zero", 0)
        if kind == "FSDP":
            _fsdp(reading, path, data, world // max(machines, 1) if machines > 1 else 0)
        for key in ("grad_accum_steps", "optimizer"):
            reading.miss(key, path.name, SCRIPT)
        tp = get_int(path, data, "parallelism_config.parallelism_config_tp_size", 1)
        cp = get_int(path, data, "parallelism_config.parallelism_config_cp_size", 1)
    if world % (tp * cp):
        raise file_error(path, "num_processes", f"{world} GPUs do not split into tp={tp} x cp={cp}")
    reading.set("parallel.dp", world // (tp * cp))
    _hybrid_sizes(reading, path, data, world // (tp * cp))
    reading.set("parallel.tp", tp)
    reading.set("parallel.cp", cp)
    for key in ("micro_batch_size", "seq_len", "method", "attention", "model"):
        reading.miss(key, path.name, SCRIPT + "; memsim assumed its default (pass the flag)")


def _hybrid_sizes(reading: Reading, path: Path, data: dict[str, Any], dp: int) -> None:
    """FSDP2's HSDP as accelerate's ``parallelism_config`` says it: ``dp_replicate_size`` x ``dp_shard_size``
    (accelerate 1.16.0 ``parallelism_config.py``: both > 1 is HSDP)."""
    rep = get_int(path, data, "parallelism_config.parallelism_config_dp_replicate_size", 1)
    shard = get_int(path, data, "parallelism_config.parallelism_config_dp_shard_size", 1)
    if rep > 1 and shard > 1 and reading.values.get("parallel.zero") == 3:
        if rep * shard != dp:
            raise file_error(path, "parallelism_config", f"dp_replicate_size {rep} x dp_shard_size {shard} is not "
                             f"the {dp} data-parallel GPUs of num_processes")  # fmt: skip
        reading.set("parallel.dp_shard", shard)


def _fsdp(reading: Reading, path: Path, data: dict[str, Any], per_node: int) -> None:
    """``fsdp_config``: version 2's reshard flag or FSDP1's strategy (its hybrid ones shard within a node:
    ``per_node`` GPUs, 0 for one machine), parameter offload, checkpointing."""
    version = get_int(path, data, "fsdp_config.fsdp_version", 1)
    if version == 2:
        zero, reshard = 3, get_bool(path, data, "fsdp_config.fsdp_reshard_after_forward", True)
    else:
        zero, reshard = get_choice(path, data, "fsdp_config.fsdp_sharding_strategy", SHARDING, (3, True))
        reading.miss("fsdp_config.fsdp_version", path.name, "FSDP1 read as FSDP2 with the same sharding")
        if dig(data, "fsdp_config.fsdp_sharding_strategy") in HYBRID:
            if per_node:
                reading.set("parallel.dp_shard", per_node)  # one node's GPUs (FSDP1's intra-node group)
            else:
                reading.miss("parallel.dp_shard", f"{path.name}: fsdp_sharding_strategy", "hybrid sharding within "
                             "a node on num_machines 1: the node's GPUs are every GPU, read as full sharding",
                             keep=True)  # fmt: skip
    reading.set("parallel.zero", zero)
    reading.set("parallel.reshard_after_forward", bool(reshard))
    offload = get_bool(path, data, "fsdp_config.fsdp_offload_params", False)
    reading.set("parallel.offload", "optimizer+params" if offload else "none")
    if get_bool(path, data, "fsdp_config.fsdp_activation_checkpointing", False):
        reading.set("activation_checkpointing", "full")
    else:
        reading.miss("activation_checkpointing", path.name, "outside FSDP, model.gradient_checkpointing_enable() "
                     "in your script decides")  # fmt: skip


def _deepspeed(reading: Reading, path: Path, data: dict[str, Any], companion: Callable[[Path, str], Any],
               mixed: str) -> int:  # fmt: skip
    """The DeepSpeed JSON named by ``deepspeed_config_file``, else accelerate's inline DeepSpeed keys; returns tp."""
    file = get_str(path, data, "deepspeed_config.deepspeed_config_file")
    if file:
        found = deepspeed.read_referenced(
            reading, path, "deepspeed_config.deepspeed_config_file", file, companion
        )
        if found is None:
            return 1
        ds_path, ds_data = found
        if "precision" not in reading.values:
            reading.set("precision", {"bf16": "mixed-bf16", "fp16": "mixed-fp16"}.get(mixed, "fp32"))
        return get_int(ds_path, ds_data, "tensor_parallel.autotp_size", 1)
    stage = get_int(path, data, "deepspeed_config.zero_stage", 0, minimum=0)
    reading.set("parallel.zero", stage)
    opt = get_choice(path, data, "deepspeed_config.offload_optimizer_device", DEVICES, "none")
    par = get_choice(path, data, "deepspeed_config.offload_param_device", DEVICES, "none")
    reading.set(
        "parallel.offload",
        "optimizer+params" if par != "none" else ("optimizer" if opt != "none" else "none"),
    )
    reading.set("grad_accum_steps", get_int(path, data, "deepspeed_config.gradient_accumulation_steps", 1))
    reading.set("precision", {"bf16": "mixed-bf16", "fp16": "mixed-fp16"}.get(mixed, "fp32"))
    reading.set("framework", "deepspeed")
    # zero3_init_flag is read by nobody here: it changes how the model loads, not the training step's memory
    reading.miss("optimizer", path.name, SCRIPT)
    return 1
