"""Trace one rank of a data-parallel job (FSDP2 / ZeRO-3, DDP-style replicate, x TP) in this CPU process.

PyTorch's own distributed code runs for one rank under FakeTensorMode, on a fake process group and a CPU
device mesh (``fake_dist``; docs/memory-facts.md#tracing-one-rank-on-a-cpu): ``fully_shard`` on each decoder
layer and then the root
(torchtitan's ``apply_fsdp``), or FSDP2-based ``replicate`` for zero 0. Two of the section's pitfalls are
handled here: DTensor's sharding propagation gets a private FakeTensorMode (pitfall 1), and FSDP's
communication buffers and gathered units are labelled (the tracker follows ``UntypedStorage.resize_``,
pitfall 3; foreach optimizers get one param group per tensor kind, pitfall 4). Tensor parallelism is applied
by ``tp_plan.apply_tensor_parallel`` through ``_apply_tp`` (the seam), pipelines by ``pipeline.py``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from memsim_widget.catalog.models import resolve_model_config
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

from .fake_dist import cpu_mesh, fake_world, mesh_coords
from .hf import apply_lora, build_hf_config, build_hf_model, input_factory, loss_module, real_mode_shims
from .rank_layout import (  # noqa: F401 - re-exported: the trace's layout checks live there, torch-free
    CP_REFUSAL,
    MESH_ORDER,
    check_distributed,
    check_rank,
    default_rank,
    layout_shape,
    rank_role,
)
from .run import TraceResult, fakeify_meta, trace_training
from .torch_recipe import precision_dtypes
from .tracker import MemoryTracker

#: What FSDP2-based replicate misses of DDP (docs/memory-facts.md#tracing-one-rank-on-a-cpu, pitfall 7).
REPLICATE_NOTE = (
    "zero 0 traced with FSDP2-based replicate (torch.distributed._composable.replicate_with_fsdp), not DDP's "
    "C++ reducer: it all-reduces each unit's gradients through FSDP's reduce buffers, without DDP's flat "
    "gradient bucket buffer (25 MB buckets of views into one flat copy) -- that copy is not traced"
)


# ----- patches, each undone on exit --------------------------------------------------------------------
@contextlib.contextmanager
def private_sharding_fake_mode() -> Iterator[None]:
    """Give DTensor's sharding propagation its own FakeTensorMode for the block (pitfall 1).

    ``ShardingPropagator`` computes output metadata on global-shape fake tensors made in ``detect_fake_mode()``;
    reusing the trace's mode makes those shadow tensors visible to the tracker (+633 MiB on a toy).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import _sharding_prop

    orig = _sharding_prop.detect_fake_mode  # pyright: ignore[reportPrivateImportUsage]
    private = FakeTensorMode(allow_non_fake_inputs=True)
    _sharding_prop.detect_fake_mode = lambda *_a, **_k: private  # pyright: ignore[reportPrivateImportUsage]
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = orig  # pyright: ignore[reportPrivateImportUsage]


#: FSDP2 functions (as ``_fsdp_param_group`` calls them, or ``FSDPParamGroup`` methods) -> the role of
#: the storages they create: the all-gather and reduce-scatter buffers, and the unit's unsharded parameters
#: (copied out of the all-gather, or out of the local parameters where the shard group has one rank, as
#: under replicate).
_FSDP_ROLES = {
    "foreach_all_gather": "collective",
    "foreach_reduce": "collective",
    "FSDPParamGroup.wait_for_unshard": "unsharded_parameter",
}
#: ``FSDPCommContext``'s streams -> the stream number a storage allocated under them carries
#: (``engine/counters/fsdp_stream.FSDP_STREAMS``); the compute stream, and any stream not listed, is 0.
_COMM_STREAMS = {
    "all_gather_copy_in_stream": "all_gather_copy_in",
    "all_gather_stream": "all_gather",
    "reduce_scatter_stream": "reduce_scatter",
    "all_reduce_stream": "all_reduce",
}


@contextlib.contextmanager
def fsdp_roles(tracker: MemoryTracker) -> Iterator[None]:
    """Label the storages FSDP2's all-gather, copy-out and reduce-scatter create while the block runs, and give
    each storage the CUDA stream FSDP2 allocates it on (``fsdp_streams``)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    targets = []
    for path, role in _FSDP_ROLES.items():
        owner_name, _, name = path.rpartition(".")
        owner = getattr(group, owner_name) if owner_name else group
        targets.append((owner, name, getattr(owner, name), role))
    try:
        for owner, name, fn, role in targets:
            setattr(owner, name, _in_role(fn, tracker, role))
        with fsdp_streams(tracker):
            yield
    finally:
        for owner, name, fn, _role in targets:
            setattr(owner, name, fn)


@contextlib.contextmanager
def fsdp_streams(tracker: MemoryTracker) -> Iterator[None]:
    """Storages allocated while FSDP2 has one of its communication streams current carry that stream's number.

    FSDP2 enters its streams through the device module's ``stream`` context (``device_handle.stream(s)``,
    ``_get_device_handle(device.type)``); on the CPU mesh that is ``torch.cpu.stream``, whose context really
    switches ``torch.cpu.current_stream()``. So the trace records what a CUDA run allocates on which stream
    (torch 2.13.0, ``distributed/fsdp/_fully_shard``): ``_fsdp_collectives.foreach_all_gather`` allocates the
    all-gather output (the copy-in buffer is a view of it) and any cast inputs under the all-gather copy-in
    stream in forward and pre-backward (``FSDPCommContext.get_all_gather_streams``; else the current one);
    ``foreach_all_gather_copy_out`` allocates the unsharded parameters on the current (compute) stream;
    ``foreach_reduce`` allocates the reduce-scatter input on the compute stream (before entering the
    reduce-scatter stream), the reduce-scatter output (the gradient shard, or its reduce-dtype buffer) on the
    reduce-scatter stream, and the cast to the parameters' dtype on the post-reduce stream (reduce-scatter, or
    all-reduce under HSDP). A block returns to the cache of the stream it was allocated on (FSDP2 keeps
    references until the consuming stream waits instead of ``record_stream``), so blocks freed by one stream's
    requests never serve another's."""
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPCommContext

    from memsim_widget.engine.counters.fsdp_stream import FSDP_STREAMS

    numbers: dict[int, int] = {}
    orig_init, orig_stream = FSDPCommContext.lazy_init, torch.cpu.stream

    def lazy_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_init(self, *args, **kwargs)
        for attr, name in _COMM_STREAMS.items():
            if hasattr(self, attr):
                numbers[id(getattr(self, attr))] = FSDP_STREAMS[name]
        return out

    @contextlib.contextmanager
    def stream(s: Any) -> Iterator[None]:
        with orig_stream(s), tracker.role_scope(tracker.scope_role, numbers.get(id(s), 0)):
            yield

    FSDPCommContext.lazy_init = lazy_init
    torch.cpu.stream = stream  # pyright: ignore[reportAttributeAccessIssue]
    try:
        yield
    finally:
        FSDPCommContext.lazy_init = orig_init
        torch.cpu.stream = orig_stream


def _in_role(fn: Callable[..., Any], tracker: MemoryTracker, role: str) -> Callable[..., Any]:
    """``fn`` run inside ``tracker.role_scope(role)``."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with tracker.role_scope(role):
            return fn(*args, **kwargs)

    return wrapped


# ----- parallelising the model -----------------------------------------------------------------------
def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks (``...layers.N``, ``...h.N``) in order: FSDP's units below the root."""
    import re

    pat = re.compile(r"(?:^|\.)(?:layers|layer|h|block|blocks)\.\d+$")
    return [m for name, m in model.named_modules() if pat.search(name)]


def _mp_policy(sc: Scenario) -> Any:
    """FSDP2's MixedPrecisionPolicy for amp-* under a framework that means it (torchtitan), else None."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from memsim_widget.engine.frameworks import PROFILES

    if not sc.precision.startswith("amp") or not PROFILES[sc.framework].fsdp_mixed_precision:
        return None
    _w, amp = precision_dtypes(sc.precision)
    return MixedPrecisionPolicy(param_dtype=amp, reduce_dtype=torch.float32)


def _apply_tp(model: torch.nn.Module, mesh: Any, sc: Scenario, notes: list[str]) -> None:
    """The TP seam: ``tp_plan.apply_tensor_parallel`` on the mesh's tp dimension (imported lazily)."""
    try:
        from . import tp_plan
    except ImportError:
        raise ScenarioError("parallel.tp", "tensor-parallel tracing is not available") from None
    style, loss_parallel = tp_plan.tp_style_for(sc)
    notes += tp_plan.apply_tensor_parallel(
        model,
        mesh["tp"],
        sequence_parallel=sc.parallel.sequence_parallel,
        loss_parallel=loss_parallel,
        style=style,
    )


def parallelize(
    model: torch.nn.Module, mesh: Any, sc: Scenario, notes: list[str], *, reshard_after_forward: bool = True
) -> None:
    """Apply the scenario's layout to ``model`` (inside FakeTensorMode): TP first, then FSDP2 or replicate
    on the dp dimension (torchtitan's order)."""
    par = sc.parallel
    if par.tp > 1:
        _apply_tp(model, mesh, sc, notes)
    if par.dp == 1:
        return
    dp_mesh = mesh[HSDP_DIMS] if hybrid(sc) else mesh["dp"]
    if par.zero == 3:
        from torch.distributed.fsdp import fully_shard

        mp = _mp_policy(sc)
        kw: dict[str, Any] = {"mesh": dp_mesh, "reshard_after_forward": reshard_after_forward}
        if mp is not None:
            kw["mp_policy"] = mp
            notes.append(
                f"FSDP2 MixedPrecisionPolicy(param_dtype={mp.param_dtype}, reduce_dtype=fp32), no autocast"
            )
        for layer in decoder_layers(model):
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        over = (
            f"a {par.dp_replicate} x {par.dp_shard} (replicate x shard) mesh: HSDP"
            if hybrid(sc)
            else f"dp={par.dp}"
        )
        notes.append(
            f"FSDP2 fully_shard on each decoder layer then the root over {over}, "
            f"reshard_after_forward={reshard_after_forward}"
        )
    else:
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for layer in decoder_layers(model):
            replicate(layer, mesh=dp_mesh)
        replicate(model, mesh=dp_mesh)
        notes.append(REPLICATE_NOTE)


#: The data-parallel mesh dimensions of HSDP (torchtitan's names): replicas outer, the shard group inner.
HSDP_DIMS = ("dp_replicate", "dp_shard")


def hybrid(sc: Scenario) -> bool:
    """FSDP2 on a replicate x shard mesh (``parallel.dp_shard`` under zero 3, replicas > 1)."""
    return sc.parallel.zero == 3 and sc.parallel.dp_replicate > 1


def mesh_shape(sc: Scenario, shape: dict[str, int]) -> dict[str, int]:
    """The trace's mesh: the job's, with dp split into replicate x shard under HSDP (``hybrid``)."""
    if not hybrid(sc):
        return shape
    par = sc.parallel
    out: dict[str, int] = {}
    for k, v in shape.items():
        if k == "dp":
            out.update({HSDP_DIMS[0]: par.dp_replicate, HSDP_DIMS[1]: par.dp // par.dp_replicate})
        else:
            out[k] = v
    return out


# ----- the trace -------------------------------------------------------------------------------------
def _model_factory(
    sc: Scenario, cfg: Any, mesh: Any, notes: list[str], reshard_after_forward: bool
) -> Callable[[], torch.nn.Module]:
    """A factory building the scenario's model as fake cpu tensors, parallelised for this rank."""
    from .traceable import trace_kwargs

    lora = trace_kwargs(sc).get("lora")
    wdtype, _amp = precision_dtypes(sc.precision)

    def make() -> torch.nn.Module:
        with torch.device("meta"):
            model = build_hf_model(cfg, wdtype, cfg._attn_implementation)
            if lora:
                model = apply_lora(model, lora, notes)
        fakeify_meta(model)
        if sc.method == "qlora":
            nf4_base(model, notes)
        parallelize(model, mesh, sc, notes, reshard_after_forward=reshard_after_forward)
        if _loss_outside(sc):  # the loop computes the loss on the logits (torchtitan train.py)
            from .run import drop_labels

            model.register_forward_pre_hook(drop_labels, with_kwargs=True)
        return model

    return make


def nf4_base(model: torch.nn.Module, notes: list[str]) -> None:
    """QLoRA as torchtune makes it: the weight of each LoRA-wrapped Linear (peft's ``base_layer``) becomes a
    frozen torchao ``NF4Tensor`` (``to_nf4``: 64-element blocks, 256-block scaler groups; torchao 0.18.0
    ``quantization/quantize_/workflows/nf4/nf4_tensor.py``), which runs under FakeTensorMode, computes
    ``F.linear`` through ``linear_nf4`` (dequantised per call) and hands FSDP2 its three inner tensors to
    all-gather (``fsdp_pre_all_gather``: int8 scalers, fp32 factors, uint8 codes). The other Linears (the
    head) stay in the model's dtype (torchtune: only LoRALinear holds NF4)."""
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import to_nf4

    n = 0
    for module in model.modules():
        base = getattr(module, "base_layer", None)
        if isinstance(base, torch.nn.Linear) and hasattr(module, "lora_A"):
            base.weight = torch.nn.Parameter(to_nf4(base.weight.detach()), requires_grad=False)
            n += 1
    notes.append(f"QLoRA: {n} LoRA-wrapped Linear weights as torchao NF4Tensor (torchtune's QLoRA)")


def _loss_outside(sc: Scenario) -> bool:
    """The framework's loop computes the loss outside the model (engine/frameworks ``loss_outside_model``)."""
    from memsim_widget.engine.frameworks import PROFILES

    return PROFILES[sc.framework].loss_outside_model


def _micro_sync(sc: Scenario, notes: list[str]) -> Callable[[torch.nn.Module, bool], None] | None:
    """Under gradient accumulation, what the framework's loop does to FSDP2 before each micro-batch
    (``FrameworkProfile.fsdp2_accumulation``): nothing (``"reduce"``: every micro-batch reduce-scatters and adds
    its shard to the sharded gradient), or ``set_requires_gradient_sync(last)`` (``"no_sync"``, accelerate's
    ``no_sync`` on FSDP2 as HF Trainer enters it: the unsharded gradients accumulate until the last)."""
    from memsim_widget.engine.frameworks import PROFILES

    if sc.grad_accum_steps == 1 or sc.parallel.zero != 3:
        return None
    mode = PROFILES[sc.framework].fsdp2_accumulation
    if mode != "no_sync":
        notes.append(f"{sc.grad_accum_steps} micro-batches a step, each reduce-scattered (no no_sync)")
        return None
    notes.append(
        f"{sc.grad_accum_steps} micro-batches a step, set_requires_gradient_sync(False) on all but the last "
        "(accelerate's no_sync on FSDP2)"
    )

    def sync(model: torch.nn.Module, last: bool) -> None:
        model.set_requires_gradient_sync(last)  # pyright: ignore[reportCallIssue,reportAttributeAccessIssue]

    return sync


def trace_distributed(
    sc: Scenario,
    *,
    rank: int | None = None,
    progress: bool = False,
    top_n: int = 20,
    reshard_after_forward: bool = True,
) -> TraceResult:
    """Trace two training steps of one rank (default: the first rank of the stage the engine predicts
    highest) of the scenario's dp x tp job."""
    from .traceable import trace_kwargs

    check_distributed(sc)
    step_kw = trace_kwargs(sc)
    if "layer_checkpointing" in step_kw:
        raise ScenarioError(
            "activation_checkpointing", "selective-op and checkpoint_every are traced on one GPU only"
        )
    rank = default_rank(sc) if rank is None else rank
    check_rank(sc, rank)
    shape = layout_shape(sc)
    notes: list[str] = []
    layout_notes: list[str] = []  # filled while the factory parallelises the model
    cfg = build_hf_config(dict(resolve_model_config(sc.model)), trace_kwargs(sc)["attention"])
    wdtype, _amp = precision_dtypes(sc.precision)
    # Under FSDP2 mixed precision the parameters are fp32 and nothing is autocast.
    precision = "fp32" if _mp_policy(sc) is not None else sc.precision
    inputs = input_factory(cfg, sc.micro_batch_size, sc.seq_len, wdtype)
    loss_fn, tp_context = None, contextlib.nullcontext()
    if sc.parallel.tp > 1:  # global position_ids under SP; loss_fn and loss_parallel() under loss parallel
        from . import tp_plan

        inputs, loss_fn, tp_context = tp_plan.trace_hooks(sc, inputs)
    if loss_fn is None and _loss_outside(sc):
        from .tp_plan import loss_parallel_loss

        loss_fn = loss_parallel_loss  # the same cross-entropy on plain (or gathered) logits
        notes.append("loss computed outside the model on its logits (torchtitan train.py)")
    with (
        fake_world(rank, sc.parallel.world_size),
        private_sharding_fake_mode(),
        real_mode_shims(True, notes),
        tp_context,
    ):
        mesh = cpu_mesh({k: v for k, v in mesh_shape(sc, shape).items() if k != "pp"})
        result = trace_training(
            _model_factory(sc, cfg, mesh, layout_notes, reshard_after_forward),
            inputs,
            loss_fn=loss_fn,
            precision=precision,
            optimizer=sc.optimizer,
            optimizer_impl=sc.optimizer_impl,
            gradient_checkpointing=step_kw["gradient_checkpointing"],
            output_lifetime=step_kw.get("output_lifetime", "trainer"),
            loss_module=loss_module,
            notes=notes,
            cast_model=False,
            progress=progress,
            top_n=top_n,
            instrument=fsdp_roles,
            grad_accum_steps=sc.grad_accum_steps,
            micro_sync=_micro_sync(sc, notes),
        )
    result.notes[:0] = layout_notes
    result.rank = rank
    result.world_size = sc.parallel.world_size
    result.rank_role = rank_role(sc, rank)
    result.layout = {"mesh": shape, "coords": mesh_coords(rank, shape)}
    return result
