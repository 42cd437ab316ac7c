"""Run DeepSpeed's ZeRO-1/2 or ZeRO-3 optimizer for real on the CPU (deepspeed's CPU accelerator, PyTorch's fake
process group at world size 4, so every collective is a no-op with the right shapes and the rank's partitions are
a quarter) under a logging dispatch mode, and hold the engine's ZeRO streams (``engine/counters/zero_stream.py``,
``zero3_stream.py``) to it. Under ZeRO-3 the model is built under ``deepspeed.zero.Init`` in bf16, as HF's
``from_pretrained`` does (each weight partitioned as it is made), and DeepSpeed's stage-3 defaults stay
(``overlap_comm`` true, prefetch 5e7, persistence 1e5, live and reuse 1e9 elements).

The model is the 4-layer Llama of ``LLAMA_H512_V32K`` in bf16 (DeepSpeed's ``bf16.enabled``), HF Trainer's two
optimizer groups (the weights that decay, the norms) on torch AdamW (foreach), two steps of 2 x 512 through
``engine.backward`` / ``engine.step``; DeepSpeed's defaults for stages 1 and 2 (``contiguous_gradients`` true,
``overlap_comm`` false, ``reduce_bucket_size`` 5e8) unless ``--bucket N`` / ``--overlap``. Storages are logged
as the DDP trace does (``benchmarks/ddp_trace.py``: allocation at the op that makes them, free from a weak
reference swept before each op; meta tensors are not memory). Printed per case: the traced run's peak reserved
and allocated by replay beside the engine's stream (``rank_stream(traced_only=True)``, as the other layouts'
comparisons: its cuBLAS workspaces stay, the CPU run has none), the same without the workspaces
(``without_workspaces``), and the large allocations of both in order.

    python benchmarks/zero_trace.py               # ZeRO-1 and ZeRO-2, DeepSpeed's defaults
    python benchmarks/zero_trace.py --bucket 20000000 --overlap   # parallel.reduce_bucket_size, overlap_comm
    python benchmarks/zero_trace.py --accum 2 --bucket 20000000   # gradient accumulation
    python benchmarks/zero_trace.py --stage 3 [--world 2] [--bucket 20000000]   # ZeRO-3 (stage3.py)
    python benchmarks/zero_trace.py --stage 3 --ckpt [--batch 4 --seq 512]   # full gradient checkpointing
    python benchmarks/zero_trace.py --stage 3 --tied   # tie_word_embeddings
    python benchmarks/zero_trace.py --stage 3 --eager | --selective   # eager attention; its core recomputed
    python benchmarks/zero_trace.py --lora 16 [--targets qv|all] [--adapter fp32|bf16]   # peft LoRA
    python benchmarks/zero_trace.py --stage 3 --lora 16 --targets qv --adapter bf16   # ZeRO-3 under LoRA
    python benchmarks/zero_trace.py --offload optimizer [--accum 2 --bucket 20000000]   # offload_optimizer
    python benchmarks/zero_trace.py --stage 3 --offload optimizer+params   # offload_param too (ZeRO-3)

Needs deepspeed (0.19.8 here), torch and transformers; no network. About a minute per case on 2 cores.

The tests compare the engine's streams with recorded traces (``tests/data/zero_traces``: one gzip'd JSON a case,
its events, phases and host events, with the versions of deepspeed, torch, transformers (peft: LoRA) it ran under;
``recorded`` refuses another version's) and run DeepSpeed for real once per kind of run (ZeRO-1/2, ZeRO-3,
offload, LoRA), asserting the fresh run is its recording event for event. After an upgrade of any of them:

    python benchmarks/zero_trace.py --record tests/data/zero_traces   # every recording there, run again
    python benchmarks/zero_trace.py --record tests/data/zero_traces --stage 3 --tied   # one more case
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))

import cpu_products  # noqa: E402
from fidelity_cases import LLAMA_H512_V32K  # noqa: E402

from memsim_widget.engine.counters.allocator import FREE, CachingAllocator  # noqa: E402

STEPS = 2
BATCH, SEQ = 2, 512
WORLD = 4
#: DeepSpeed's default ``reduce_bucket_size`` (deepspeed/runtime/zero/config.py)
BUCKET = 500_000_000
#: peft's targets for the LoRA case: every Linear of the layers (the engine's ``all-linear``)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
#: ``--targets``: the two target sets traced (LLaMA-Factory's default ``q_proj,v_proj`` and ``all-linear``)
TARGET_SETS = {"qv": ["q_proj", "v_proj"], "all": LORA_TARGETS}


def traced_run(
    zero: int,
    world: int = WORLD,
    bucket: int = BUCKET,
    overlap: bool = False,
    accum: int = 1,
    lora: int = 0,
    ckpt: bool = False,
    tied: bool = False,
    batch: int = BATCH,
    seq: int = SEQ,
    offload: str = "none",
    targets: tuple[str, ...] = tuple(LORA_TARGETS),
    adapter_dtype: str = "fp32",
    attention: str = "sdpa",
    selective: bool = False,
) -> dict[str, Any]:
    """Two steps of the small Llama under DeepSpeed ZeRO-``zero`` as rank 0 of ``world`` (``accum`` micro-batches
    a step through ``engine.backward`` / ``engine.step`` each, DeepSpeed's ``gradient_accumulation_steps``;
    ``lora``: peft LoRA of that rank on the Linears ``targets``, the base frozen, its adapters made in
    ``adapter_dtype`` (peft's ``autocast_adapter_dtype``: fp32 by default; ZeRO-1/2's engine casts every
    parameter to bf16 at ``deepspeed.initialize``, ``_cast_module_mixed_precision``), under ZeRO-3 made after
    the base's ``zero.Init`` as HF's ``from_pretrained`` then ``get_peft_model`` do, so partitioned by
    ``deepspeed.initialize`` (``parameter_offload._convert_to_zero_parameters``); ``ckpt``: HF gradient checkpointing on every layer, as HF Trainer enables it (``use_reentrant`` False);
    ``tied``: the head shares the embeddings' weight, ``tie_word_embeddings``; ``batch`` x ``seq`` tokens a
    micro-batch; ``offload``: ``optimizer`` (``offload_optimizer`` to the cpu) or ``optimizer+params``
    (``offload_param`` too, ZeRO-3), DeepSpeed's torch-optimizer path (``zero_force_ds_cpu_optimizer`` false);
    ``attention`` transformers' implementation, ``sdpa`` or ``eager``; ``selective``: Megatron's selective
    recompute, the attention core (eager's scores, softmax and context) under a non-reentrant
    ``torch.utils.checkpoint`` of its own, ``_selective_attention``): the allocation events (handle, bytes or
    FREE, stream 0) and the event index where each phase begins; under offload the GPU's alone (``host_handles``:
    the host's left out, ``host`` their events)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.update(LOCAL_RANK="0", RANK="0", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    import torch
    import torch.distributed as dist
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    events: list[tuple[int, int, int]] = []
    live: dict[int, tuple[Any, int]] = {}
    counter = [0]
    host: set[int] = set()  # the handles of host memory (offload)
    on_host = [False]  # inside the inner optimizer's step: every storage it makes is the host's
    phases: list[tuple[int, str]] = []

    def sweep() -> None:
        for key, (ref, handle) in list(live.items()):
            if ref.expired():
                events.append((handle, FREE, 0))
                del live[key]

    def log(t: Any) -> None:
        st = t.untyped_storage()
        key = st.data_ptr()
        if st.nbytes() and t.device.type != "meta" and key not in live:
            counter[0] += 1
            live[key] = (StorageWeakRef(st), counter[0])
            events.append((counter[0], st.nbytes(), 0))
            if on_host[0]:
                host.add(counter[0])

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            sweep()
            out = cpu_products.call(func, args, kwargs or {})
            if func is not torch.ops.aten.detach.default:
                for o in out if isinstance(out, (list, tuple)) else [out]:
                    if isinstance(o, torch.Tensor):
                        log(o)
            return out

    def mark(label: str) -> None:
        sweep()
        phases.append((len(events), label))

    if offload != "none":
        _host_copies(on_host, lambda t: _handle(t, live) in host)
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process")
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        import deepspeed
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        cfg = {k: v for k, v in LLAMA_H512_V32K.items() if k != "model_type"}
        cfg["tie_word_embeddings"] = tied
        cfg["attn_implementation"] = _selective_attention() if selective else attention
        zero_cfg: dict[str, Any] = {"stage": zero, "contiguous_gradients": True, "reduce_bucket_size": bucket}
        if zero < 3 or overlap:  # ZeRO-3's default is true: left to DeepSpeed
            zero_cfg["overlap_comm"] = overlap
        if offload != "none":  # unpinned: the CPU accelerator's pin_memory is a no-op either way
            zero_cfg["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
            if offload == "optimizer+params":
                zero_cfg["offload_param"] = {"device": "cpu", "pin_memory": False}
        config = {
            "train_micro_batch_size_per_gpu": batch,
            "gradient_accumulation_steps": accum,
            "bf16": {"enabled": True},
            "gradient_clipping": 1.0,
            "zero_optimization": zero_cfg,
        }
        if offload != "none":  # torch's AdamW on the host's fp32 partitions (no DeepSpeedCPUAdam op build)
            config["zero_force_ds_cpu_optimizer"] = False
        if zero < 3:
            model = LlamaForCausalLM(LlamaConfig(**cfg, use_cache=False)).to(torch.bfloat16)
            if lora:
                model = _peft(model, lora, targets, adapter_dtype)
        mode = Log()
        mode.__enter__()
        try:
            if zero == 3:  # as HF's from_pretrained(dtype=bf16) under ZeRO-3: each weight made in bf16 (its
                # default dtype while the model is built), then partitioned
                mark("weights")
                default = torch.get_default_dtype()
                torch.set_default_dtype(torch.bfloat16)
                try:
                    with deepspeed.zero.Init(config_dict_or_path=config, dtype=torch.bfloat16):
                        model = LlamaForCausalLM(LlamaConfig(**cfg, use_cache=False))
                finally:
                    torch.set_default_dtype(default)
                if ckpt:
                    model.gradient_checkpointing_enable()
                if lora:
                    mark("LoRA adapters")
                    model = _peft(model, lora, targets, adapter_dtype)
            else:
                for p in model.parameters():  # the weights, in module order, as the stream writes them first
                    log(p)
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            decay = [p for n, p in named if "norm" not in n and "bias" not in n]
            rest = [p for n, p in named if "norm" in n or "bias" in n]
            opt = torch.optim.AdamW(
                [{"params": decay, "weight_decay": 0.0}, {"params": rest, "weight_decay": 0.0}],
                lr=1e-4,
                foreach=True,
            )
            mark("ZeRO wrap")
            engine, *_ = deepspeed.initialize(
                model=model, optimizer=opt, config=config, dist_init_required=False
            )
            if offload != "none":
                _host_side(engine.optimizer, opt, on_host, lambda t: _handle(t, live), host)
            ids = torch.randint(0, cfg["vocab_size"], (batch, seq))
            for step in range(1, STEPS + 1):
                for micro in range(accum):
                    at = f"step {step}" + (f" micro-batch {micro + 1}" if accum > 1 else "")
                    mark(f"{at} forward")
                    loss = engine(input_ids=ids, labels=ids).loss
                    mark(f"{at} backward")
                    engine.backward(loss)
                    del loss
                    if offload != "none":
                        _host_buffers(engine.optimizer, lambda t: _handle(t, live), host)
                    mark(f"{at} optimizer step")
                    engine.step()
            sweep()
        finally:
            mode.__exit__(None, None, None)
    finally:
        dist.destroy_process_group()
    if host:  # the GPU's events alone; the phases' indices moved to match
        at = [0]
        for e in events:
            at.append(at[-1] + (e[0] not in host))
        phases = [(at[i], label) for i, label in phases]
        kept = [e for e in events if e[0] not in host]
        return {"events": kept, "phases": phases, "host": [e for e in events if e[0] in host]}
    return {"events": events, "phases": phases}


def _selective_attention() -> str:
    """Register transformers' eager attention core run under a non-reentrant checkpoint (what Megatron's selective
    recompute keeps out of the saved tensors: the scores, softmax and context, recomputed in the backward; the
    core has no parameters) and return its name for ``attn_implementation``; with eager's causal mask (transformers
    5.24.0 ``masking_utils._preprocess_mask_arguments`` gives an implementation it has no mask function for no
    mask at all: until 2026-12-06 the recording's attention was not causal, without eager's additive mask and its
    sum)."""
    import torch.utils.checkpoint as ckpt
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def core(module: Any, *args: Any, **kw: Any) -> Any:
        return ckpt.checkpoint(eager_attention_forward, module, *args, use_reentrant=False, **kw)

    AttentionInterface.register("memsim_selective", core)
    AttentionMaskInterface.register("memsim_selective", eager_mask)
    return "memsim_selective"


def _peft(model: Any, rank: int, targets: Sequence[str], adapter_dtype: str) -> Any:
    """peft's LoRA of ``rank`` on ``targets`` (no dropout, so no dropout mask), adapters in ``adapter_dtype``
    (``autocast_adapter_dtype``: peft upcasts bf16 adapters to fp32 unless told not to)."""
    from peft import LoraConfig, get_peft_model

    config_lora = LoraConfig(r=rank, target_modules=list(targets), lora_dropout=0.0)
    return get_peft_model(model, config_lora, autocast_adapter_dtype=adapter_dtype == "fp32")


def _host_copies(on_host: list[bool], is_host: Any) -> None:
    """Make a CPU run allocate what a GPU run does when DeepSpeed moves host memory to the device or makes it there
    (this process only: ``traced_apart`` runs each trace in a fresh one). ZeRO-3's ``_create_fp32_partitions`` and
    ``initialize_optimizer_states`` under ``offload_optimizer`` make only host tensors (``self.device`` is 'cpu':
    the fp32 partitions, their cast, the zero gradients), transients too, so they run with ``on_host`` set; and a
    host tensor's ``.to(device)`` (``stage3.partition_grads``: ``grad_buffer.to(grad_partition.device)``, the
    gradient partition brought back to the GPU), a no-op between two CPU tensors, returns a copy, the GPU's."""
    import torch
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3 as Stage3

    for name in ("_create_fp32_partitions", "initialize_optimizer_states"):
        method = getattr(Stage3, name)

        def host_only(self: Any, *a: Any, _m: Any = method, **k: Any) -> Any:
            on_host[0] = bool(self.offload_optimizer)
            try:
                return _m(self, *a, **k)
            finally:
                on_host[0] = False

        setattr(Stage3, name, host_only)
    to = torch.Tensor.to

    def device_copy(self: Any, *a: Any, **k: Any) -> Any:
        out = to(self, *a, **k)
        moved = "device" in k or any(isinstance(x, (str, torch.device)) for x in a)
        if moved and out is self and not on_host[0] and is_host(self):
            return out.clone()
        return out

    torch.Tensor.to = device_copy  # type: ignore[method-assign]


def _handle(t: Any, live: dict[int, tuple[Any, int]]) -> int | None:
    """The trace's handle of tensor ``t``'s storage (None when not logged)."""
    got = live.get(t.untyped_storage().data_ptr())
    return got[1] if got else None


def _host_side(zopt: Any, inner: Any, on_host: list[bool], handle: Any, host: set[int]) -> None:
    """Under offload, tell the host's storages apart from the GPU's on a CPU run, where both are CPU memory: the
    buffers DeepSpeed makes on ``self.device`` = 'cpu' (``stage_1_and_2.py`` ``__init__``,
    ``initialize_optimizer_states``: the fp32 master partitions and their gradients, the bit16 staging copies,
    ``temp_grad_buffer_for_cpu_offload``; ``stage3.py``: the same names for its sub groups) by identity once
    wrapped, and whatever the inner optimizer's ``step`` makes (its states and temporaries, on the host's
    partitions) by wrapping it; the gradients kept on the host for accumulation (``accumulated_grads_in_cpu``)
    after each backward (``_host_buffers``)."""
    step = inner.step

    def host_step(*a: Any, **k: Any) -> Any:
        on_host[0] = True
        try:
            return step(*a, **k)
        finally:
            on_host[0] = False

    inner.step = host_step
    _host_buffers(zopt, handle, host)


def _host_buffers(zopt: Any, handle: Any, host: set[int]) -> None:
    """Add to ``host`` the handles of ``zopt``'s host buffers (``_host_side``)."""
    import torch

    found: list[Any] = []
    for name in (
        "single_partition_of_fp32_groups",
        "fp32_partitioned_groups_flat",
        "param_buffer_of_bit16_for_cpu_offload_groups",
        "param_groups_fp16_flat_cpu_memory",
    ):
        for t in getattr(zopt, name, None) or []:
            found += [t, getattr(t, "grad", None)]
    found.append(getattr(zopt, "temp_grad_buffer_for_cpu_offload", None))
    if getattr(zopt, "offload_optimizer", False):  # ZeRO-3: the gradient partitions on self.device, the host
        found.append(getattr(zopt, "grad_partitions_flat_buffer", None))
    if getattr(zopt, "offload_param", False):  # ZeRO-3: each parameter's partition (ds_tensor) on the host
        found += [getattr(p, "ds_tensor", None) for g in getattr(zopt, "fp16_groups", []) for p in g]
    found += list((getattr(zopt, "accumulated_grads_in_cpu", None) or {}).values())
    for t in found:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            h = handle(t)
            if h is not None:
                host.add(h)


def traced_apart(
    zero: int, world: int = WORLD, bucket: int = BUCKET, *args: Any, **kw: Any
) -> dict[str, Any]:
    """``traced_run`` in a fresh process (DeepSpeed keeps its process groups in module globals, so a second run
    in one process finds the first one's groups destroyed)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(traced_run, zero, world, bucket, *args, **kw).result()


#: the packages whose code a trace runs, pinned in each recording (``recorded`` refuses another version's); peft
#: only where the run makes LoRA adapters
PINNED = ("deepspeed", "torch", "transformers", "peft")
#: where the tests' recorded traces live, from the repository's root
RECORDING_FOLDER = "tests/data/zero_traces"
RECORDINGS = Path(__file__).resolve().parents[1] / RECORDING_FOLDER
#: the command that records one more case (the flags of the case, as above)
RECORD_ONE = f"python benchmarks/zero_trace.py --record {RECORDING_FOLDER} --stage N ..."


def versions(call: dict[str, Any]) -> dict[str, str]:
    """The installed versions of the ``PINNED`` packages that the run of ``call`` imports (package metadata: no
    import), without a local label (torch's ``+cpu``: the build, not the version)."""
    from importlib.metadata import version

    names = [n for n in PINNED if n != "peft" or call.get("lora")]
    return {name: version(name).split("+")[0] for name in names}


def trace_call(zero: int, world: int = WORLD, bucket: int = BUCKET, *args: Any, **kw: Any) -> dict[str, Any]:
    """``traced_run``'s arguments as keywords, those left at their default dropped (tuples as lists): the key of
    a recording, the same however the call spells them."""
    import inspect

    sig = inspect.signature(traced_run)
    bound = sig.bind(zero, world, bucket, *args, **kw)
    out: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        value, default = (
            list(v) if isinstance(v, (tuple, list)) else v for v in (value, sig.parameters[name].default)
        )
        if value != default:
            out[name] = value
    return out


def recording_name(call: dict[str, Any]) -> str:
    """The file of a recorded trace: its arguments in ``traced_run``'s order (target sets by their
    ``TARGET_SETS`` name), e.g. ``zero3-bucket20000000-accum2.json.gz``."""
    parts = []
    for name, value in call.items():
        if name == "targets":
            value = next((k for k, v in TARGET_SETS.items() if v == list(value)), "-".join(value))
        parts.append(name if value is True else f"{name}{value}".replace("+", "-"))
    return "-".join(parts) + ".json.gz"


def write_recording(folder: Path, call: dict[str, Any], trace: dict[str, Any]) -> Path:
    """Write ``trace`` (``traced_run(**call)``'s result) to ``folder`` as gzip'd JSON, with the versions it ran
    under; byte for byte the same for the same trace (no time stamp in the gzip header, keys in order)."""
    import gzip
    import json

    body = {"versions": versions(call), "call": call, **{k: trace[k] for k in sorted(trace)}}
    text = json.dumps(body, separators=(",", ":")).encode()
    path = Path(folder) / recording_name(call)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text, 9, mtime=0))
    return path


def _read(path: Path) -> dict[str, Any]:
    import gzip
    import json

    return json.loads(gzip.decompress(Path(path).read_bytes()))


def record(folder: Path, calls: Sequence[dict[str, Any]]) -> None:
    """Run each of ``calls`` (``trace_call``'s keywords) in a fresh process and write its recording to
    ``folder``, printing the file, the run's seconds and its number of events."""
    import time

    for call in calls:
        began = time.perf_counter()
        trace = traced_apart(**call)
        path = write_recording(folder, call, trace)
        print(f"{path}: {time.perf_counter() - began:.0f} s, {len(trace['events']):,} events", flush=True)


def difference(fresh: dict[str, Any], kept: dict[str, Any]) -> str:
    """Where a fresh run's trace (``traced_apart``) parts from its recording (``recorded``): '' when they are the
    same, event for event (handles, bytes, streams), phase for phase and host event for host event."""
    if sorted(fresh) != sorted(kept):
        return f"the fresh run has {sorted(fresh)}, the recording {sorted(kept)}"
    for key in sorted(fresh):
        a, b = [tuple(e) for e in fresh[key]], [tuple(e) for e in kept[key]]
        if a != b:
            i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return (
                f"{key} differ from entry {i} ({len(a):,} fresh, {len(b):,} recorded): "
                f"fresh {a[i : i + 3]}, recorded {b[i : i + 3]}"
            )
    return ""


class StaleRecording(RuntimeError):
    """A recorded trace made under other versions of the ``PINNED`` packages than those installed."""


def recorded(zero: int, world: int = WORLD, bucket: int = BUCKET, *args: Any, **kw: Any) -> dict[str, Any]:
    """The recorded trace of ``traced_apart(zero, world, bucket, *args, **kw)`` (``RECORDINGS``): its events,
    phases and host events as lists of tuples, as the run returns them. Refuses (``StaleRecording``) a recording
    made under other versions of deepspeed, torch, transformers or peft than the installed ones, and a missing
    one (FileNotFoundError), naming the command that writes them."""
    call = trace_call(zero, world, bucket, *args, **kw)
    path = RECORDINGS / recording_name(call)
    again = f"python benchmarks/zero_trace.py --record {RECORDING_FOLDER} writes them again"
    if not path.exists():
        raise FileNotFoundError(f"no recorded trace {path.name}: add it with {RECORD_ONE}")
    body = _read(path)
    if body["versions"] != versions(call):
        raise StaleRecording(
            f"{path.name} was recorded under {body['versions']}, not the installed {versions(call)}: {again}"
        )
    if body["call"] != call:
        raise StaleRecording(f"{path.name} records {body['call']}, not {call}")
    return {k: [tuple(e) for e in v] for k, v in body.items() if k not in ("versions", "call")}


def replayed(events: list[tuple[int, int, int]]) -> int:
    """Peak reserved of ``events`` through the caching allocator (PyTorch's defaults)."""
    a = CachingAllocator(None)
    a.run(events)
    return a.peak_reserved


def engine_stream(
    zero: int,
    world: int = WORLD,
    bucket: int = BUCKET,
    overlap: bool = False,
    accum: int = 1,
    cpu: bool = False,
    ckpt: bool = False,
    tied: bool = False,
    batch: int = BATCH,
    seq: int = SEQ,
    offload: str = "none",
    lora: int = 0,
    targets: tuple[str, ...] = tuple(LORA_TARGETS),
    adapter_dtype: str = "fp32",
    attention: str = "sdpa",
    selective: bool = False,
) -> Any:
    """The engine's stream of the same rank (``traced_only``: what a CPU trace can see), ``bucket`` elements in
    its ipg buffer, ``overlap`` its ``overlap_comm`` (``parallel.reduce_bucket_size``, ``parallel.overlap_comm``),
    ``accum`` micro-batches a step; ``cpu``: without the cuBLAS workspaces too (``without_workspaces``); ``ckpt``,
    ``tied``, ``batch``, ``seq``, ``offload``, ``lora``, ``targets``, ``adapter_dtype``, ``attention``,
    ``selective`` as ``traced_run``'s (``parallel.offload``; the engine's ``method: lora``, ``lora.rank``,
    ``lora.targets``, ``lora.adapter_dtype``, ``attention``, ``activation_checkpointing: selective``, whose
    attention is eager)."""
    import memsim_widget.engine.counters.alloc_stream as alloc_stream
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.core import estimate

    sc = {
        "model": {**LLAMA_H512_V32K, "tie_word_embeddings": tied}, "micro_batch_size": batch, "seq_len": seq,
        "precision": "mixed-bf16", "activation_checkpointing": "full" if ckpt else "none",
        "framework": "deepspeed", "optimizer": "adamw", "optimizer_impl": "foreach", "reserved_model": "replay",
        "grad_accum_steps": accum,
        "parallel": {"dp": world, "zero": zero, "reduce_bucket_size": bucket, "overlap_comm": overlap,
                     "offload": offload},
    }  # fmt: skip
    sc["attention"] = "eager" if selective else attention
    if selective:
        sc["activation_checkpointing"] = "selective"
    if lora:
        sc["method"] = "lora"
        sc["lora"] = {"rank": lora, "targets": list(targets), "adapter_dtype": adapter_dtype}
    ctx = Context(estimate(sc).scenario)
    stream = alloc_stream.rank_stream(ctx, ctx.stages[0], traced_only=True)
    return without_workspaces(stream, ctx) if cpu else stream


def without_workspaces(stream: Any, ctx: Any) -> Any:
    """``stream`` less the cuBLAS workspaces (``overhead.WORKSPACE_ITEM``: the forward thread's and the autograd
    thread's, made at their first matmul and never freed), which a CPU run never makes: the first allocations of
    the item's size, as many as it has tensors, and nothing else. Used where the workspaces, not a ZeRO buffer,
    decide the comparison (a small ipg buffer under accumulation: the kept gradients and the two workspaces
    outgrow the cached blocks that a 1 GB ipg buffer leaves)."""
    from memsim_widget.engine.counters.alloc_stream import StreamWriter
    from memsim_widget.engine.counters.overhead import WORKSPACE_ITEM

    sg = {i.item: i for i in _overhead_items(ctx)}
    ws = sg.get(WORKSPACE_ITEM)
    if ws is None or ws.bytes <= 0:
        return stream
    size, left = ws.bytes // max(ws.tensors, 1), max(ws.tensors, 1)
    drop: set[int] = set()
    for h, n, _ in stream.events:
        if n == size and left:
            drop.add(h)
            left -= 1
    out = StreamWriter()
    at = [0]  # the new index of each old event
    for e in stream.events:
        at.append(at[-1] + (e[0] not in drop))
        if e[0] not in drop:
            out.events.append(e)
    out.marks = [(at[i], label) for i, label in stream.marks]
    return out


def _overhead_items(ctx: Any) -> list[Any]:
    """The rank's overhead items (``cached_state_groups``' ``overhead`` group)."""
    from memsim_widget.engine.caches.parts_cache import cached_state_groups

    groups, _ = cached_state_groups(ctx, ctx.stages[0])
    return list(groups["overhead"].entries)


def _large(events: list[tuple[int, int, int]], at: int = 4 << 20) -> list[int | str]:
    """The allocations of ``at`` bytes or more in order, and the frees of them ('-' + bytes)."""
    size = {h: n for h, n, _ in events if n != FREE}
    out: list[int | str] = []
    for h, n, _ in events:
        if size[h] >= at:
            out.append(n if n != FREE else f"-{size[h]}")
    return out


def main() -> None:
    """Print the traced and the engine's replay for ZeRO-1 and ZeRO-2 (``--bucket N``, ``--overlap``, ``--accum
    N``), or ZeRO-3 (``--stage 3``, ``--world N``); ``--lora R``: peft's LoRA of rank R on ``--targets`` (``qv``:
    q_proj, v_proj; ``all``: every Linear of the layers, the default), its adapters made in ``--adapter`` (fp32,
    peft's default, or bf16), both written by the engine's ZeRO-3 stream (``zero3_lora_modelled``)."""
    from memsim_widget.engine.counters.alloc_stream import replay_stream
    from memsim_widget.engine.counters.allocator import AllocatorConf

    def arg(flag: str, default: int) -> int:
        return int(sys.argv[sys.argv.index(flag) + 1]) if flag in sys.argv else default

    bucket, accum, lora, stage = (
        arg("--bucket", BUCKET),
        arg("--accum", 1),
        arg("--lora", 0),
        arg("--stage", 0),
    )
    world = arg("--world", WORLD)
    overlap = "--overlap" in sys.argv
    shape: dict[str, Any] = {"ckpt": "--ckpt" in sys.argv, "tied": "--tied" in sys.argv}
    shape.update(attention="eager" if "--eager" in sys.argv else "sdpa", selective="--selective" in sys.argv)
    shape.update(batch=arg("--batch", BATCH), seq=arg("--seq", SEQ))
    offload = sys.argv[sys.argv.index("--offload") + 1] if "--offload" in sys.argv else "none"
    peft: dict[str, Any] = {}
    if lora:
        names = sys.argv[sys.argv.index("--targets") + 1] if "--targets" in sys.argv else "all"
        dtype = sys.argv[sys.argv.index("--adapter") + 1] if "--adapter" in sys.argv else "fp32"
        peft = {"targets": tuple(TARGET_SETS[names]), "adapter_dtype": dtype}
    if "--record" in sys.argv:
        folder = Path(sys.argv[sys.argv.index("--record") + 1])
        if len(sys.argv) == 3:  # every recording already in the folder, run again
            calls = [_read(p)["call"] for p in sorted(folder.glob("*.json.gz"))]
        else:
            calls = [
                trace_call(zero, world, bucket, overlap, accum, lora, **shape, offload=offload, **peft)
                for zero in ((stage,) if stage else (1, 2))
            ]
        record(folder, calls)
        return
    for zero in (stage,) if stage else (1, 2):
        t = traced_apart(zero, world, bucket, overlap, accum, lora, **shape, offload=offload, **peft)
        a = CachingAllocator(None)
        a.run(t["events"])
        print(
            f"ZeRO-{zero}, world {world}, reduce_bucket_size {bucket:,}"
            + (", overlap_comm" if overlap else "")
            + (f", {accum} micro-batches a step" if accum > 1 else "")
            + (f", LoRA rank {lora} on {','.join(peft['targets'])} ({peft['adapter_dtype']})" if lora else "")
            + (", full checkpointing" if shape["ckpt"] else "")
            + (", tied embeddings" if shape["tied"] else "")
            + (", eager attention" if shape["attention"] == "eager" else "")
            + (", selective recompute of the attention core" if shape["selective"] else "")
            + f", {shape['batch']} x {shape['seq']}"
            + (f", offload {offload} (the GPU's allocations)" if offload != "none" else "")
        )
        print(f"  trace replay: reserved {a.peak_reserved:,} B, allocated {a.peak_allocated:,} B")
        print(f"  traced, >= 4 MiB in order: {_large(t['events'])}")
        for cpu in (False, True):
            s = engine_stream(
                zero, world, bucket, overlap, accum, cpu, **shape, offload=offload, lora=lora, **peft
            )
            e = replay_stream(s, AllocatorConf())
            print(
                "  engine stream" + (" without the cuBLAS workspaces" if cpu else "") + f": reserved "
                f"{e.peak_reserved:,} B ({e.peak_reserved / a.peak_reserved - 1:+.2%}), allocated "
                f"{e.peak_allocated:,} B ({e.peak_allocated / a.peak_allocated - 1:+.2%}), peak at {e.at}"
            )
        print(f"  engine, >= 4 MiB in order: {_large(s.events)}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
