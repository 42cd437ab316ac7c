"""DeepSpeed config JSON -> scenario keys: ZeRO stage and offload, precision, micro-batch, accumulation, AutoTP,
optimizer, and ZeRO-1/2's ``overlap_comm`` and ``reduce_bucket_size``; the other bucket sizes and DeepSpeed's own
activation checkpointing, which memsim does not vary, are listed.

Keys and defaults as DeepSpeed 0.19.8 reads them (deepspeed/runtime/config.py, runtime/zero/config.py
``DeepSpeedZeroConfig``, runtime/precision_config.py; https://www.deepspeed.ai/docs/config-json/): no
``bf16``/``fp16`` section trains in fp32; ``bf16.enabled`` keeps fp32 master weights (memsim ``mixed-bf16``)
unless ``bf16_master_weights_and_grads`` and ``bf16_optimizer_states`` (pure ``bf16``); ``"auto"`` values are
filled by the HF integration from the trainer's arguments. The data-parallel size comes from the launcher.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from memsim_widget.engine.frameworks import DEEPSPEED_BUCKET_ELEMENTS
from memsim_widget.importers.common import (
    Reading,
    dig,
    file_error,
    get_bool,
    get_choice,
    get_int,
    get_str,
)
from memsim_widget.scenario import MAX_BUCKET_ELEMENTS

#: DeepSpeed 0.19.8 defaults of the ZeRO sizes memsim holds at these values (runtime/zero/config.py); a file
#: setting another value is listed as unread (memsim's prediction assumes the default).
ZERO_SIZES: dict[str, int] = {
    "reduce_bucket_size": DEEPSPEED_BUCKET_ELEMENTS,
    "allgather_bucket_size": DEEPSPEED_BUCKET_ELEMENTS,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
}
#: ``optimizer.type`` (case-insensitive, runtime/config.py) -> memsim optimizer.
OPTIMIZERS = {"adamw": "adamw", "adam": "adam", "lion": "lion", "fusedadam": "adam", "cpuadam": "adam"}


def looks_like(data: dict[str, Any]) -> bool:
    """A DeepSpeed config: one of its top-level keys."""
    keys = (
        "zero_optimization",
        "train_micro_batch_size_per_gpu",
        "train_batch_size",
        "zero_allow_untested_optimizer",
    )
    return any(k in data for k in keys)


def read(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """Every memory key of a DeepSpeed config into ``reading``."""
    name = path.name
    reading.set("framework", "deepspeed")
    micro = get_int(path, data, "train_micro_batch_size_per_gpu")
    if micro is not None:
        reading.set("micro_batch_size", micro)
    accum = get_int(path, data, "gradient_accumulation_steps")
    if accum is not None:
        reading.set("grad_accum_steps", accum)
    _precision(reading, path, data)
    _zero(reading, path, data)
    _optimizer(reading, path, data)
    tp = get_int(path, data, "tensor_parallel.autotp_size")
    if tp is not None:
        reading.set("parallel.tp", tp)
    if dig(data, "activation_checkpointing") is not None:
        reading.miss("activation_checkpointing", f"{name}: activation_checkpointing", "DeepSpeed's own "
                     "checkpointing (Megatron models) is not read; memsim reads the trainer's flag")  # fmt: skip
    reading.miss("parallel.dp", name, "the launcher's process count (deepspeed --num_gpus, torchrun) sets the "
                 "data-parallel size; memsim assumed 1 GPU unless another file says (pass --dp)")  # fmt: skip


def read_referenced(
    reading: Reading, path: Path, key: str, ref: str, companion: Callable[[Path, str], Any]
) -> tuple[Path, dict[str, Any]] | None:
    """The DeepSpeed JSON a launch config names under ``key`` (``ref``), read into ``reading`` and listed with
    its files; None, with the setting listed as unread, when it was neither given nor beside the config."""
    found = companion(path, ref)
    if found is None:
        reading.miss("parallel.zero", f"{path.name}: {key}", f"{ref!r} was not given and is not beside the "
                     "config: pass it too")  # fmt: skip
        return None
    read(reading, *found)
    reading.files.append(found[0])
    return found


def _precision(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """fp32, pure bf16, DeepSpeed's mixed bf16/fp16, or torch autocast."""
    bf16 = dig(data, "bf16") or dig(data, "bfloat16")  # DeepSpeed reads both names
    fp16 = dig(data, "fp16")
    autocast = dig(data, "torch_autocast")
    section = "bf16" if "bf16" in data else "bfloat16"
    if isinstance(autocast, dict) and get_bool(path, data, "torch_autocast.enabled", False):
        dtype = get_choice(path, data, "torch_autocast.dtype", {"bfloat16": "amp-bf16", "float16": "amp-fp16",
                           "torch.bfloat16": "amp-bf16", "torch.float16": "amp-fp16"}, "amp-bf16")  # fmt: skip
        reading.set("precision", dtype)
    elif isinstance(bf16, dict) and _enabled(path, data, f"{section}.enabled"):
        pure = get_bool(path, data, f"{section}.bf16_master_weights_and_grads", False) and get_bool(
            path, data, f"{section}.bf16_optimizer_states", False
        )
        reading.set("precision", "bf16" if pure else "mixed-bf16")
    elif isinstance(fp16, dict) and _enabled(path, data, "fp16.enabled"):
        reading.set("precision", "mixed-fp16")
    elif isinstance(bf16, dict) or isinstance(fp16, dict):
        if "auto" in (dig(data, f"{section}.enabled"), dig(data, "fp16.enabled")):
            reading.miss(
                "precision", f"{path.name}: bf16.enabled", "'auto': the trainer's bf16/fp16 flag decides"
            )
        else:
            reading.set("precision", "fp32")
    else:
        reading.set("precision", "fp32")


def _enabled(path: Path, data: dict[str, Any], key: str) -> bool:
    """A section's ``enabled``: true, false, or 'auto' (the trainer decides: read as not enabled here)."""
    if dig(data, key) == "auto":
        return False
    return bool(get_bool(path, data, key, False))


def _zero(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """Stage, offload devices, and the sizes memsim holds at DeepSpeed's defaults."""
    zero = dig(data, "zero_optimization", {})
    if not isinstance(zero, dict):
        raise file_error(path, "zero_optimization", "must be an object")
    stage = get_int(path, data, "zero_optimization.stage", 0, minimum=0)
    if stage not in (0, 1, 2, 3):
        raise file_error(path, "zero_optimization.stage", f"must be 0, 1, 2 or 3, got {stage}")
    reading.set("parallel.zero", stage)
    devices = {"cpu": True, "nvme": True, "none": False}
    opt = get_choice(path, data, "zero_optimization.offload_optimizer.device", devices, False)
    par = get_choice(path, data, "zero_optimization.offload_param.device", devices, False)
    if get_bool(path, data, "zero_optimization.cpu_offload", False):  # the pre-0.3 name, still read
        opt = True
    if par and not opt:
        raise file_error(path, "zero_optimization.offload_param", "memsim models parameter offload together with "
                         "optimizer offload (offload_optimizer), not alone")  # fmt: skip
    reading.set("parallel.offload", "optimizer+params" if par else ("optimizer" if opt else "none"))
    if "nvme" in (dig(zero, "offload_optimizer.device"), dig(zero, "offload_param.device")):
        reading.miss("parallel.offload", f"{path.name}: zero_optimization.offload_*.device", "nvme read as "
                     "'cpu' (both leave the GPU); host memory is not modelled", keep=True)  # fmt: skip
    if stage in (1, 2):
        _buckets(reading, path, data)
    if stage == 3:
        _zero3_groups(reading, path, data)
    for key, default in ZERO_SIZES.items():
        value = dig(zero, key)
        if value is None or value == default or (key in ZERO12_READ and stage in (1, 2)):
            continue
        why = ("'auto': the HF integration sets it from the model's hidden size" if value == "auto"
               else f"{value!r} differs from DeepSpeed's default {default:,}")  # fmt: skip
        reading.miss(f"zero_optimization.{key}", path.name, why + "; memsim assumed the default")


def _zero3_groups(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """ZeRO-3 over sub-groups: MiCS' ``mics_shard_size`` (the states sharded over groups of that many ranks,
    replicated across them: ``parallel.dp_shard``; DeepSpeed 0.19.8 removed MiCS and refuses the key,
    ``runtime/config.py`` ``_REMOVED_ZERO_CONFIG_KEYS``, so it is read for the releases before), and ZeRO++ hpZ's
    ``zero_hpz_partition_size`` (a secondary copy of the weights partitioned within groups of that many ranks,
    beside the primary partition over every rank: not modelled, listed)."""
    mics = get_int(path, data, "zero_optimization.mics_shard_size", -1, minimum=-1)
    if mics > 0:
        reading.set("parallel.dp_shard", mics)
        reading.miss("zero_optimization.mics_shard_size", path.name, "MiCS read as ZeRO-3 "
                     "sharded over groups of mics_shard_size ranks (its hierarchical all-gather buffers are not "
                     "modelled); DeepSpeed 0.19.8 refuses the key (MiCS removed)", keep=True)  # fmt: skip
    hpz = get_int(path, data, "zero_optimization.zero_hpz_partition_size", 1, minimum=0)
    if hpz > 1:
        reading.miss("zero_optimization.zero_hpz_partition_size", path.name, f"ZeRO++ hpZ keeps a secondary copy "
                     f"of the weights partitioned over groups of {hpz} ranks (about the weights' bytes / {hpz} more on "
                     "each GPU): not modelled, the estimate is below the run's")  # fmt: skip


#: The ZeRO sizes a ZeRO-1/2 rank reads into the scenario (``_buckets``), not listed as held at the default.
ZERO12_READ = frozenset({"reduce_bucket_size"})


def _buckets(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """ZeRO-1/2's ``overlap_comm`` (two reduce buckets) and ``reduce_bucket_size`` (elements; "auto" kept: the
    engine resolves it as HF Trainer and accelerate do, hidden_size x hidden_size), when the file sets them to
    other than DeepSpeed's defaults (false, 5e8: the scenario's unset keys, so a config memsim wrote reads back
    to the scenario it came from)."""
    if get_bool(path, data, "zero_optimization.overlap_comm", False):
        reading.set("parallel.overlap_comm", True)
    key = "zero_optimization.reduce_bucket_size"
    if dig(data, key) == "auto":
        reading.set("parallel.reduce_bucket_size", "auto")
        return
    size = get_int(path, data, key)
    if size is not None and size != DEEPSPEED_BUCKET_ELEMENTS:
        if size > MAX_BUCKET_ELEMENTS:
            raise file_error(path, key, f"must be at most {MAX_BUCKET_ELEMENTS:,} elements, got {size:,}")
        reading.set("parallel.reduce_bucket_size", size)


def _optimizer(reading: Reading, path: Path, data: dict[str, Any]) -> None:
    """DeepSpeed's own optimizer and its kernel; no section means the script's (client) optimizer."""
    kind = get_str(path, data, "optimizer.type")
    if kind is None:
        reading.miss("optimizer", path.name, "no optimizer section: the training script's optimizer is used")
        return
    low = kind.lower()
    if low not in OPTIMIZERS:
        reading.miss(
            "optimizer", f"{path.name}: optimizer.type", f"{kind!r} is not modelled; memsim assumed AdamW"
        )
        return
    opt = OPTIMIZERS[low]
    if low == "adam" and get_bool(path, data, "optimizer.params.adam_w_mode", True):
        opt = "adamw"  # DeepSpeed's Adam is AdamW unless adam_w_mode is false
    reading.set("optimizer", opt)
    if opt == "lion":
        return
    torch_adam = get_bool(path, data, "optimizer.params.torch_adam", False)
    foreach = get_bool(path, data, "optimizer.params.foreach", True)
    reading.set("optimizer_impl", "fused" if not torch_adam else ("foreach" if foreach else "for-loop"))
