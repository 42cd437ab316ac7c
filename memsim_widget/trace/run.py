"""Run training steps under FakeTensorMode (or for real) with a MemoryTracker and summarise the memory."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .cuda_autocast import cuda_like_autocast, recompute_context
from .cuda_sdpa import CudaSdpaDevice, cuda_kernels
from .torch_recipe import make_optimizer, precision_dtypes, probe_optimizer
from .tracker import ROLES, MemoryTracker


@dataclass
class TraceResult:
    """Memory measured by a traced training run. Peak fields describe the steady state (step 2 on)."""

    peak_bytes: int
    peak_phase: str
    peak_step: int
    peak_op: str
    by_role: dict[str, int]
    step1_peak_bytes: int
    timeline: list[dict[str, Any]]
    top: list[dict[str, Any]]
    parameters: int
    trainable_parameters: int
    notes: list[str] = field(default_factory=list)
    peak_module: str = ""
    step1_peak_phase: str = ""
    step1_peak_op: str = ""
    phase_peaks: dict[str, int] = field(default_factory=dict)
    marks: list[dict[str, Any]] = field(default_factory=list)
    model_state_bytes: dict[str, int] = field(default_factory=dict)
    optimizer_impl_used: str = ""
    ops: int = 0
    seconds: float = 0.0
    rank: int = 0
    world_size: int = 1
    rank_role: str = ""
    layout: dict[str, Any] = field(default_factory=dict)
    tracker: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data (JSON-able) view without the tracker."""
        return {k: v for k, v in self.__dict__.items() if k != "tracker"}


def steady_peak(tracker: MemoryTracker) -> tuple[int, dict[str, Any]]:
    """The steady state's peak: the step with the largest peak of steps 2 on (step 1 when only one ran), and
    that peak's record."""
    steady = [s for s in tracker.step_peaks if s >= 2] or [1]
    step = max(steady, key=lambda s: tracker.step_peaks[s]["bytes"])
    return step, tracker.step_peaks[step]


def traced_result(
    tracker: MemoryTracker,
    step: int,
    by_role: dict[str, int],
    *,
    top_n: int,
    timeline_points: int = 2000,
    **fields: Any,
) -> TraceResult:
    """The ``TraceResult`` of a traced run whose steady-state peak is in ``step`` (``steady_peak``), with the
    bytes ``by_role`` at that peak; ``fields``: the tracer's own (parameters, notes, model state, ...)."""
    sp = tracker.step_peaks[step]
    s1 = tracker.step_peaks.get(1, sp)
    return TraceResult(
        peak_bytes=sp["bytes"],
        peak_phase=sp["phase"],
        peak_step=step,
        peak_op=sp["op"],
        peak_module=sp["module"],
        by_role={k: by_role.get(k, 0) for k in ROLES},
        step1_peak_bytes=s1["bytes"],
        step1_peak_phase=s1["phase"],
        step1_peak_op=s1["op"],
        timeline=tracker.timeline(timeline_points),
        top=tracker.top_at(sp["seq"], top_n),
        phase_peaks={f"{s}/{p}": v for (s, p), v in tracker.phase_peaks.items() if p not in ("setup", "end")},
        marks=tracker.marks,
        ops=tracker.op_count,
        tracker=tracker,
        **fields,
    )


def param_groups(params: list[torch.nn.Parameter]) -> list[Any]:
    """``params`` as one group of DTensors and one of plain tensors when they mix (else the plain list).

    Foreach optimizers refuse a group that mixes DTensor and plain tensors
    (docs/memory-facts.md#tracing-one-rank-on-a-cpu, pitfall 4).
    """
    by_kind: dict[bool, list[torch.nn.Parameter]] = {}
    for p in params:
        by_kind.setdefault(hasattr(p, "_local_tensor"), []).append(p)
    if len(by_kind) <= 1:
        return params
    return [{"params": ps} for ps in by_kind.values()]


def cast_floating(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast floating parameters and buffers in place via ``.data`` (``Module.to`` cannot swap fake parameters)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point() and t.dtype != dtype:
                t.data = t.data.to(dtype)


def fakeify_meta(model: torch.nn.Module, device: str = "cpu") -> None:
    """Replace meta parameters/buffers by empty tensors on ``device`` (call inside FakeTensorMode); keeps ties."""
    memo: dict[int, torch.Tensor] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or p.device.type != "meta":
                continue
            if id(p) not in memo:
                memo[id(p)] = torch.nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype, device=device), requires_grad=p.requires_grad
                )
            mod._parameters[name] = memo[id(p)]  # pyright: ignore[reportArgumentType]  (a Parameter)
        for name, b in list(mod._buffers.items()):
            if b is None or b.device.type != "meta":
                continue
            if id(b) not in memo:
                memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device=device)
            mod._buffers[name] = memo[id(b)]


def _tensors_in(obj: Any) -> list[torch.Tensor]:
    """All tensors inside a (nested) container."""
    from torch.utils._pytree import tree_flatten

    if hasattr(obj, "items") and not isinstance(obj, dict):
        obj = dict(obj.items())
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _extract_loss(out: Any) -> torch.Tensor:
    """The loss from a model output (HF ModelOutput .loss, dict['loss'], tuple[0] or a scalar tensor)."""
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None and isinstance(out, (tuple, list)):
        loss = out[0]
    if loss is None:
        raise ValueError("model output has no loss; pass loss_fn")
    return loss


def _build_model(
    model_factory: Callable[[], torch.nn.Module],
    *,
    fake: bool,
    precision: str,
    wdtype: torch.dtype,
    cast_model: bool,
    gradient_checkpointing: bool,
    notes: list[str],
) -> torch.nn.Module:
    """``model_factory()`` in training mode: meta tensors made fake, cast to a 16-bit precision's dtype, with
    HF gradient checkpointing on when asked (in the current mode)."""
    model = model_factory()
    if fake and any(t.device.type == "meta" for t in list(model.parameters()) + list(model.buffers())):
        fakeify_meta(model)
    fdts = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if cast_model and fdts and fdts != {wdtype} and precision in ("bf16", "fp16"):
        cast_floating(model, wdtype)
    elif fdts and precision.startswith("amp") and fdts != {torch.float32}:
        notes.append(f"amp: model parameters are {sorted(map(str, fdts))}, not all fp32")
    model.train()
    if gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None) or getattr(
            model, "gradient_checkpointing_enable", None
        )
        if enable is not None and precision.startswith("amp"):
            # HF's default (use_reentrant=False, one checkpoint per layer) with CUDA's fp32 ops in the recompute
            enable(
                {"use_reentrant": False, "context_fn": recompute_context}
            )  # the kwargs, positional in both names
        elif enable is not None:
            enable()  # HF default: torch.utils.checkpoint with use_reentrant=False, one checkpoint per layer
        else:
            notes.append(
                "gradient_checkpointing requested but the model has no gradient_checkpointing_enable"
            )
    return model


def _usable_impl(
    optimizer: str,
    optimizer_impl: str,
    trainable: list[torch.nn.Parameter],
    wdtype: torch.dtype,
    lr: float,
    fake: bool,
    notes: list[str],
) -> str:
    """The optimizer implementation that runs here: ``optimizer_impl``, else the fallback (fused -> foreach ->
    for-loop) after a probe step fails on a trainable dtype; "n/a" for optimizers without the choice."""
    impl_used = optimizer_impl
    if optimizer in ("adamw", "adam", "sgd", "sgd-momentum"):
        tdts = sorted({p.dtype for p in trainable}, key=str) or [wdtype]
        for dt in tdts:
            err = probe_optimizer(optimizer, impl_used, dt, lr)
            if err is None:
                continue
            fallback = "foreach" if impl_used == "fused" else "for-loop"
            notes.append(
                f"optimizer_impl={impl_used} failed on {'fake ' if fake else ''}cpu {dt}: {err}; "
                f"fell back to {fallback}"
            )
            impl_used = fallback
            if probe_optimizer(optimizer, impl_used, dt, lr) is not None and impl_used != "for-loop":
                notes.append("foreach also failed; using for-loop")
                impl_used = "for-loop"
    elif optimizer_impl != "foreach":
        notes.append(f"optimizer_impl ignored for {optimizer}")
        impl_used = "n/a"
    return impl_used


def _role_hooks(
    tracker: MemoryTracker,
    model: torch.nn.Module,
    trainable: list[torch.nn.Parameter],
    loss_module: Callable[[torch.nn.Module], torch.nn.Module | None] | None,
) -> list[Any]:
    """Hooks that label each gradient as it is accumulated and, after ``loss_module(model)``'s forward, turn
    the phase to "loss"."""
    hooks: list[Any] = []
    for p in trainable:
        hooks.append(p.register_post_accumulate_grad_hook(lambda q: tracker.relabel(q.grad, "gradient")))
    lm = loss_module(model) if loss_module is not None else None
    if lm is not None:

        def _to_loss(_m: Any, _a: Any, _o: Any) -> None:
            # under torch.compile Dynamo would bake the tracker's mutations into the graph (and guard on them):
            # a compiled step has no "loss" phase
            if torch.compiler.is_compiling():
                return
            if tracker.phase == "forward":
                tracker.set_phase("loss")

        hooks.append(lm.register_forward_hook(_to_loss))
    return hooks


def drop_labels(_module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: call the HF model without labels, so that it returns logits and computes no loss (the
    loop computes it: loss parallel, torchtitan's ``loss_fn``)."""
    return args, {k: v for k, v in kwargs.items() if k != "labels"}


@contextlib.contextmanager
def _maybe_compiled(
    model: torch.nn.Module, budget: float | None, notes: list[str], blocks: bool = False
) -> Any:
    """``model`` itself, or compiled (trace/compiled.py) when ``budget`` is a float: whole, or ``blocks``: each
    decoder layer apart (torchtitan's ``apply_compile``)."""
    if budget is None:
        yield model
        return
    from .compiled import compiled_blocks, compiled_model

    if blocks:
        notes.append(
            f"torch.compile on each decoder layer apart (torchtitan's apply_compile), the rest eager; Inductor's "
            f"decompositions and min-cut partitioner (activation_memory_budget {budget:g}), its fusion emulated"
        )
        with compiled_blocks(model, budget) as compiled:
            yield compiled
        return

    notes.append(
        f"torch.compile: Inductor's decompositions and min-cut partitioner (activation_memory_budget {budget:g}), "
        "Inductor's fusion emulated (pointwise, view and reduction nodes feeding only such nodes get no buffer)"
    )
    with compiled_model(model, budget) as compiled:
        yield compiled


def _train_step(
    tracker: MemoryTracker,
    model: torch.nn.Module,
    input_factory: Callable[[], Any],
    opt: torch.optim.Optimizer,
    trainable: list[torch.nn.Parameter],
    step: int,
    *,
    amp_dtype: torch.dtype | None,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    output_lifetime: str,
    forward_ctx: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    grad_accum_steps: int = 1,
    micro_sync: Callable[[torch.nn.Module, bool], None] | None = None,
) -> None:
    """One step, phase by phase: forward (and loss), backward, optimizer step, zero_grad; the model output
    dies where ``output_lifetime`` says. The forward runs inside ``forward_ctx()`` (activation offloading).
    ``grad_accum_steps`` micro-batches run forward and backward before the optimizer step, each loss divided
    by their number (HF Trainer's ``training_step``); from the second on, ``AccumulateGrad`` adds each new
    gradient to the parameter's ``.grad`` in place. ``micro_sync(model, last)`` runs before each micro-batch
    (FSDP2's gradient sync turned off but on the last: ``trace/distributed.py``)."""
    out: Any = None
    batch: Any = None
    n = max(grad_accum_steps, 1)
    for _micro in range(n):
        out = batch = None  # the loop drops the previous micro-batch's output and batch as it makes the next
        if micro_sync is not None:
            micro_sync(model, _micro == n - 1)
        tracker.set_phase("forward", step)
        batch = input_factory()
        tracker.relabel(_tensors_in(batch), "input")
        with cuda_like_autocast(amp_dtype), forward_ctx():
            out = model(**batch) if isinstance(batch, dict) else model(*batch)
        if loss_fn is not None:
            tracker.set_phase("loss")
            loss = loss_fn(out, batch)
        else:
            loss = _extract_loss(out)
        if grad_accum_steps > 1:
            loss = loss / grad_accum_steps
        if output_lifetime == "trainer":
            out = None
        tracker.set_phase("backward")
        loss.backward()
        del loss
        if output_lifetime == "backward":
            out = None
    tracker.relabel([p.grad for p in trainable if p.grad is not None], "gradient")
    tracker.set_phase("optimizer_step")
    opt.step()
    tracker.relabel(_tensors_in(list(opt.state.values())), "optimizer_state")
    if output_lifetime == "step":
        out = None
    tracker.set_phase("zero_grad")
    opt.zero_grad(set_to_none=True)
    del batch, out


def _torchtune_savers(
    tracker: MemoryTracker,
    model: torch.nn.Module,
    trainable: list[torch.nn.Parameter],
    optimizer: str,
    impl_used: str,
    lr: float,
    offloading: bool,
    in_backward: bool,
    notes: list[str],
) -> tuple[Any, Callable[[], contextlib.AbstractContextManager]]:
    """The step's optimizer (one per parameter, stepped in backward, with ``in_backward``) and the forward's
    context (torchtune's activation offloading, with ``offloading``): trace/torchtune_memory.py."""
    from .torchtune_memory import OptimizerInBackward, offloaded_forward

    impl = impl_used if impl_used != "n/a" else "foreach"
    if in_backward:  # the per-parameter hooks run after _role_hooks' relabelling ones
        opt: Any = OptimizerInBackward(
            trainable, lambda ps: make_optimizer(optimizer, impl, ps, lr, tracker.on_host)
        )
        notes.append(
            "optimizer in backward: one optimizer per parameter, stepped by its post-accumulate-grad hook"
        )
    else:
        opt = make_optimizer(optimizer, impl, param_groups(trainable), lr, tracker.on_host)
    if not offloading:
        return opt, contextlib.nullcontext
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    head = head if isinstance(head, torch.nn.Module) else None
    notes.append(
        "activation offloading: torchtune's OffloadActivations (streams, 5-tensor forward stash, >= 1024 B), "
        f"output head {'not offloaded' if head is not None else 'not found: offloaded'}; host copies count 0 B"
    )
    return opt, lambda: offloaded_forward(tracker, head)


def _model_state_bytes(tracker: MemoryTracker, steps: int) -> dict[str, int]:
    """Parameters, buffers, gradients and optimizer states just before the last step's zero_grad."""
    state_seq = tracker.mark_seq(steps, "zero_grad")
    model_state = tracker.by_role_at(state_seq - 1) if state_seq else {}
    return {k: model_state.get(k, 0) for k in ("parameter", "buffer", "gradient", "optimizer_state")}


def _summary_notes(
    tracker: MemoryTracker,
    sp: dict[str, Any],
    by_role: dict[str, int],
    optimizer: str,
    impl_used: str,
    amp_dtype: torch.dtype | None,
    notes: list[str],
) -> None:
    """Add the notes on what the numbers include: a by-role check, storages first seen as op inputs, Adam's
    step counters, autocast's CPU op lists."""
    if sum(by_role.values()) != sp["bytes"]:
        notes.append(f"internal: by_role sum {sum(by_role.values())} != peak {sp['bytes']}")
    untracked = [r for r in tracker.records if r.op == "<untracked input>" and r.nbytes]
    if untracked:
        notes.append(
            f"{len(untracked)} storages ({sum(r.nbytes for r in untracked)} B) were first seen as op inputs "
            "(e.g. torch.tensor scalars); counted from first use"
        )
    if optimizer in ("adam", "adamw") and impl_used != "fused":
        notes.append(
            "Adam 'step' counters (4 B fp32 scalars per tensor) are counted as optimizer_state; on CUDA they"
        )
        notes[-1] += " live on the host unless fused/capturable"
    if amp_dtype is not None:
        notes.append(
            "autocast traced with CPU autocast op lists, pow in fp32 as on CUDA (CUDA lists also differ "
            "for norms/softmax/losses)"
        )


def _result(
    tracker: MemoryTracker,
    *,
    n_params: int,
    n_trainable: int,
    model_state: dict[str, int],
    impl_used: str,
    optimizer: str,
    amp_dtype: torch.dtype | None,
    notes: list[str],
    top_n: int,
    timeline_points: int,
    t0: float,
) -> TraceResult:
    """The traced run's summary: the steady-state peak (the largest of steps 2 on), step 1's, and the notes."""
    s_best, sp = steady_peak(tracker)
    by_role = tracker.by_role_at(sp["seq"])
    _summary_notes(tracker, sp, by_role, optimizer, impl_used, amp_dtype, notes)
    return traced_result(
        tracker, s_best, by_role, top_n=top_n, timeline_points=timeline_points, parameters=n_params,
        trainable_parameters=n_trainable, notes=notes, model_state_bytes=model_state,
        optimizer_impl_used=impl_used, seconds=round(time.perf_counter() - t0, 3),
    )  # fmt: skip


def trace_training(
    model_factory: Callable[[], torch.nn.Module],
    input_factory: Callable[[], Any],
    *,
    precision: str = "fp32",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    steps: int = 2,
    gradient_checkpointing: bool = False,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    fake: bool = True,
    lr: float = 1e-3,
    top_n: int = 20,
    output_lifetime: str = "trainer",
    loss_module: Callable[[torch.nn.Module], torch.nn.Module | None] | None = None,
    mark_saved: bool = False,
    progress: bool = True,
    timeline_points: int = 2000,
    notes: list[str] | None = None,
    cast_model: bool = True,
    instrument: Callable[[MemoryTracker], contextlib.AbstractContextManager] | None = None,
    compile_budget: float | None = None,
    compile_blocks: bool = False,
    activation_offloading: bool = False,
    optimizer_in_backward: bool = False,
    grad_accum_steps: int = 1,
    sdpa_device: tuple[int, int] | None = None,
    micro_sync: Callable[[torch.nn.Module, bool], None] | None = None,
) -> TraceResult:
    """Trace ``steps`` training steps of ``model_factory()`` on ``input_factory()`` batches.

    The model and inputs are built inside FakeTensorMode (device cpu) unless ``fake=False``; a factory may also
    return a model on the meta device, whose tensors are then replaced by fake cpu ones. ``output_lifetime``:
    "trainer" drops the model output before backward (HF Trainer keeps only the loss), "backward" keeps it until
    after backward, "step" until after the optimizer step. ``loss_module(model)`` may name the module after whose
    forward the phase becomes "loss". ``cast_model=False`` keeps the factory's dtypes for bf16/fp16 (default: cast
    all floating tensors to the precision's dtype). ``instrument(tracker)`` is a context entered around the
    steps, inside the tracker (e.g. to give FSDP's communication buffers their role). ``compile_budget`` (a
    float): the step runs ``torch.compile``d with Inductor's decompositions and partitioner at that
    ``activation_memory_budget`` (1.0 is torch's default), its fusion emulated (trace/compiled.py);
    ``compile_blocks``: each decoder layer compiled apart, the rest eager (torchtitan's ``apply_compile``).
    ``activation_offloading`` and ``optimizer_in_backward``: torchtune's (trace/torchtune_memory.py).
    ``grad_accum_steps``: micro-batches per step, each loss scaled, ``micro_sync`` run before each
    (``_train_step``). ``sdpa_device`` (a CUDA
    compute capability): SDPA runs as that CUDA device runs it (trace/cuda_sdpa.py; not under
    ``compile_budget``: the compiled graph keeps the CPU's op).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    t0 = time.perf_counter()
    notes = list(notes or [])
    wdtype, amp_dtype = precision_dtypes(precision)
    if output_lifetime not in ("trainer", "backward", "step"):
        raise ValueError("output_lifetime must be 'trainer', 'backward' or 'step'")
    mode = FakeTensorMode(allow_non_fake_inputs=False) if fake else contextlib.nullcontext()
    with mode:
        model = _build_model(
            model_factory, fake=fake, precision=precision, wdtype=wdtype, cast_model=cast_model,
            gradient_checkpointing=gradient_checkpointing, notes=notes,
        )  # fmt: skip
        params = list(dict.fromkeys(model.parameters()))
        trainable = [p for p in params if p.requires_grad]
        n_params = sum(p.numel() for p in params)
        n_trainable = sum(p.numel() for p in trainable)
        impl_used = _usable_impl(optimizer, optimizer_impl, trainable, wdtype, lr, fake, notes)
        tracker = MemoryTracker(model, mark_saved=mark_saved, progress=progress)
        hooks = _role_hooks(tracker, model, trainable, loss_module)
        opt, forward_ctx = _torchtune_savers(
            tracker,
            model,
            trainable,
            optimizer,
            impl_used,
            lr,
            activation_offloading,
            optimizer_in_backward,
            notes,
        )
        hooks += [opt] if optimizer_in_backward else []
        try:
            with (
                tracker,
                instrument(tracker) if instrument else contextlib.nullcontext(),
                cuda_kernels(
                    None
                    if compile_budget is not None or sdpa_device is None
                    else CudaSdpaDevice(sdpa_device),
                    notes,
                ),
                _maybe_compiled(model, compile_budget, notes, compile_blocks) as runner,
            ):
                tracker.register(params, "parameter")
                tracker.register(list(model.buffers()), "buffer")
                for step in range(1, steps + 1):
                    _train_step(
                        tracker, runner, input_factory, opt, trainable, step,
                        amp_dtype=amp_dtype, loss_fn=loss_fn, output_lifetime=output_lifetime,
                        forward_ctx=forward_ctx, grad_accum_steps=grad_accum_steps, micro_sync=micro_sync,
                    )  # fmt: skip
                tracker.set_phase("end")
        finally:
            for h in hooks:
                h.remove()
        model_state = _model_state_bytes(tracker, steps)
        tracker.close()
        del opt, model, params, trainable

    return _result(
        tracker, n_params=n_params, n_trainable=n_trainable, model_state=model_state, impl_used=impl_used,
        optimizer=optimizer, amp_dtype=amp_dtype, notes=notes, top_n=top_n, timeline_points=timeline_points,
        t0=t0,
    )  # fmt: skip
