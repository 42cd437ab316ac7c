"""Trace one rank of a pipeline-parallel job: its stage(s) of an HF decoder under a real pipelining schedule.

The model is cut the way torchtitan's manual pipeline split does it (``pipeline_module_split``): the first stage
keeps the token embeddings and its layers, the last its layers, the final norm and the head, the others only
their layers; the deleted modules are set to None and the layer container keeps its original indices. Each
stage is a :class:`StageModule` that computes its own rotary embeddings and runs SDPA with ``is_causal`` (no
mask travels between stages). PyTorch's ``PipelineStage`` and ``Schedule1F1B`` / ``ScheduleGPipe`` /
``ScheduleInterleaved1F1B`` run under the fake process group (``fake_dist.fake_world``), where sends and receives
are no-ops with correct shapes and their receive buffers are ordinary, counted allocations
(docs/memory-facts.md#tracing-one-rank-on-a-cpu).
Under pp x dp (pp the outer mesh dimension, as in torchtitan) each stage module is first wrapped by
``distributed.parallelize`` (FSDP2 for zero 3, FSDP2-based replicate for zero 0) on the dp dimension.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from memsim_widget.catalog.models import architecture_for
from memsim_widget.errors import ScenarioError
from memsim_widget.rules.pipeline_split import chunk_layers
from memsim_widget.scenario import Scenario

from .cuda_autocast import cuda_like_autocast
from .run import TraceResult, fakeify_meta, steady_peak, traced_result
from .torch_recipe import make_optimizer, precision_dtypes, probe_optimizer
from .tracker import MemoryTracker

SCHEDULE_NAMES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "interleaved 1F1B"}
#: HF decoders whose ``model`` holds embed_tokens, layers, norm and rotary_emb (the stage module's pieces).
_DECODER_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage (model chunk) a rank runs: its stage id and the decoder layers it holds."""

    index: int
    num_stages: int
    layers: range

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.num_stages - 1

    def describe(self) -> str:
        """The modules of the stage in words, e.g. 'layers 6-7, final norm, head and loss'."""
        parts = ["embeddings"] if self.first else []
        if self.layers:  # a first or last stage may hold none (only the embeddings, only the head)
            lo, hi = self.layers[0], self.layers[-1]
            parts.append(f"layer {lo}" if lo == hi else f"layers {lo}-{hi}")
        if self.last:
            parts.append("final norm, head and loss")
        return ", ".join(parts)


def stage_plans(sc: Scenario, rank: int, num_layers: int) -> list[StagePlan]:
    """The stages ``rank`` runs: stage ``rank`` (and ``rank + pp``, ... for interleaved, the looped placement of
    ``ScheduleInterleaved1F1B``), each with the layers the engine gives it (``rules/pipeline_split``: even,
    torchtitan's or Megatron's split, or ``parallel.pp_layers``). Uneven chunks, interleaved or not, are what
    torchtitan's own split hands ``PipelineStage``; the schedules run them as they run even ones."""
    par = sc.parallel
    chunks = chunk_layers(num_layers, par.pp, par.virtual_stages, par.pp_split, par.pp_layers)
    starts = [sum(chunks[:s]) for s in range(len(chunks))]
    return [
        StagePlan(s, len(chunks), range(starts[s], starts[s] + chunks[s]))
        for s in range(rank, len(chunks), par.pp)
    ]


def default_rank(sc: Scenario) -> int:
    """The rank of the stage the engine predicts the most live tensor bytes for (the first such stage)."""
    from memsim_widget.engine.core import estimate

    ranks = estimate(sc).ranks
    best = max(ranks, key=lambda r: r.peak_tensor_bytes)
    return best.stage.index * (sc.parallel.world_size // sc.parallel.pp)


def rank_role(sc: Scenario, plans: list[StagePlan], rank: int) -> str:
    """The rank's part in words, e.g. 'pipeline stage 3 of 4: layers 6-7, final norm, head and loss; 1F1B, 8
    micro-batches' (under pp x dp prefixed by the global rank and followed by its data-parallel place)."""
    par = sc.parallel
    how = f"{SCHEDULE_NAMES[par.pp_schedule]}, {par.pp_microbatches} micro-batches"
    if par.dp > 1:
        how += f"; dp rank {rank % par.dp} of {par.dp} ({'FSDP2' if par.zero == 3 else 'replicate'})"
        return f"rank {rank} of {par.world_size}: " + _stages_role(sc, plans, how)
    return _stages_role(sc, plans, how)


def _stages_role(sc: Scenario, plans: list[StagePlan], how: str) -> str:
    """The stages of a rank in words, then ``how`` they run."""
    par = sc.parallel
    if len(plans) == 1:
        p = plans[0]
        return f"pipeline stage {p.index} of {p.num_stages}: {p.describe()}; {how}"
    chunks = "; ".join(f"stage {p.index}: {p.describe()}" for p in plans)
    return f"pipeline rank {plans[0].index} of {par.pp} ({len(plans)} of {plans[0].num_stages} stages) {chunks}; {how}"


def check_pipeline(sc: Scenario) -> None:
    """Raise ScenarioError for what this pipeline trace cannot run (naming the field and why)."""
    from .traceable import check_traceable

    par = sc.parallel
    if par.pp < 2:
        raise ScenarioError("parallel.pp", "a pipeline trace needs pp >= 2")
    if par.tp * par.cp * par.ep > 1:
        raise ScenarioError("parallel", "the pipeline trace runs pp or pp x dp: set tp, cp and ep to 1")
    if par.dp > 1:
        from .distributed import check_distributed

        check_distributed(sc)
    check_traceable(
        sc.replace(
            parallel={
                "pp": 1,
                "pp_schedule": "1f1b",
                "virtual_stages": 1,
                "pp_layers": None,
                "pp_split": None,
            }
        )
    )
    if sc.attention != "sdpa":
        raise ScenarioError(
            "attention", "pipeline stages run SDPA with is_causal (no mask passes between stages); use sdpa"
        )
    arch = architecture_for(sc.model)
    if arch.attention_kernel(sc.attention) != "sdpa":
        raise ScenarioError(
            "attention",
            "pipeline stages run SDPA with is_causal (no mask passes between stages), but "
            f"{arch.facts.attention.note}: not traced as a pipeline",
        )
    if par.pp_schedule == "1f1b" and par.pp_microbatches < par.pp:
        raise ScenarioError(
            "parallel.pp_microbatches",
            f"Schedule1F1B needs pp_microbatches >= pp ({par.pp_microbatches} < {par.pp})",
        )


class StageModule(torch.nn.Module):
    """One stage of an HF decoder: [embeddings ->] its layers [-> final norm -> head].

    Built from a whole ``*ForCausalLM`` by deleting what the stage does not hold (torchtitan's manual split:
    modules set to None, layers kept under their original indices, so module names match the whole model's).
    The stage computes its own rotary embeddings for positions 0..s-1 and calls each layer without a mask, so
    SDPA runs with ``is_causal``; under ``autocast_dtype`` the stage's forward runs in CPU autocast.
    """

    def __init__(
        self, causal_lm: torch.nn.Module, plan: StagePlan, autocast_dtype: torch.dtype | None
    ) -> None:
        super().__init__()
        lm: Any = causal_lm  # a transformers causal LM: torch's stubs type its submodules as Tensor | Module
        decoder = lm.model
        if not all(hasattr(decoder, part) for part in _DECODER_PARTS):
            raise ScenarioError(
                "model",
                f"{type(causal_lm).__name__} is not a Llama-style decoder (model.embed_tokens, layers, norm, "
                "rotary_emb); the pipeline trace cannot cut it",
            )
        decoder.layers = torch.nn.ModuleDict({str(i): decoder.layers[i] for i in plan.layers})
        if not plan.first:
            decoder.embed_tokens = None
        if not plan.last:
            decoder.norm = None
        self.model = decoder
        self.lm_head = lm.lm_head if plan.last else None
        self.autocast_dtype = autocast_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or hidden states in; hidden states or logits (last stage) out."""
        d = self.model
        with cuda_like_autocast(self.autocast_dtype):
            h = d.embed_tokens(x) if d.embed_tokens is not None else x
            pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
            pe = d.rotary_emb(h, position_ids=pos)
            for layer in d.layers.values():
                h = layer(h, attention_mask=None, position_embeddings=pe, position_ids=pos)
                h = h[0] if isinstance(h, tuple) else h
            if self.lm_head is None:
                return h
            return self.lm_head(d.norm(h))


def causal_lm_loss(vocab_size: int, autocast_dtype: torch.dtype | None) -> Callable[..., torch.Tensor]:
    """The schedule's loss: transformers' ``ForCausalLMLoss`` (fp32 upcast of the logits, labels shifted by
    one, mean over tokens), in the same autocast as the model's forward."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with cuda_like_autocast(autocast_dtype):
            return ForCausalLMLoss(logits, labels, vocab_size)

    return loss_fn


class PipelineTracker(MemoryTracker):
    """A tracker for interleaved micro-batches: a forward tensor is an activation when it is still alive at
    the first backward after it was made (the base tracker looks at the step's first backward only)."""

    def _backward_marks(self) -> list[int]:
        """Sequence numbers of every 'backward' mark, in order."""
        cached = getattr(self, "_bwd_cache", None)
        if cached is None or cached[0] != len(self.marks):
            cached = (len(self.marks), [m["seq"] for m in self.marks if m["phase"] == "backward"])
            self._bwd_cache = cached
        return cached[1]

    def final_role(self, rec: Any) -> str:
        """The base role, with forward temporaries freed before the next backward called temporary."""
        role = super().final_role(rec)
        if role != "activation" or rec.free_seq is None:
            return role
        marks = self._backward_marks()
        i = bisect.bisect_right(marks, rec.alloc_seq)
        return role if i == len(marks) or rec.free_seq > marks[i] else "temporary"


def _stage_modules(sc: Scenario, cfg: Any, plans: list[StagePlan], notes: list[str]) -> list[StageModule]:
    """The rank's stage modules on the meta device (one whole model built and cut per stage)."""
    from .hf import apply_lora, build_hf_model
    from .traceable import trace_kwargs

    wdtype, amp = precision_dtypes(sc.precision)
    lora = trace_kwargs(sc).get("lora")
    mods = []
    for plan in plans:
        with torch.device("meta"):
            lm: Any = build_hf_model(
                cfg, wdtype, "sdpa"
            )  # a transformers model (its methods are not Module's)
            if lora:
                wrapped: Any = apply_lora(lm, lora, notes if plan is plans[0] else [])  # a peft.PeftModel
                lm = wrapped.get_base_model()
        if sc.activation_checkpointing == "full":
            lm.activation_checkpointing_enable({"use_reentrant": False})
        mods.append(StageModule(lm, plan, amp))
    return mods


def _pipeline_stages(
    sc: Scenario, cfg: Any, mods: list[StageModule], plans: list[StagePlan], group: Any
) -> list[Any]:
    """``PipelineStage`` objects over the pp ``group`` with static input/output shapes (one micro-batch), so no
    metadata is sent."""
    from torch.distributed.pipelining import PipelineStage

    wdtype, amp = precision_dtypes(sc.precision)
    b, s = sc.micro_batch_size, sc.seq_len
    hidden = (b, s, cfg.hidden_size)

    def act() -> torch.Tensor:
        return torch.empty(hidden, dtype=wdtype, requires_grad=True)  # the residual stream (fp32 under amp)

    out = []
    for mod, plan in zip(mods, plans, strict=True):
        inp = torch.empty(b, s, dtype=torch.long) if plan.first else act()
        res = (
            torch.empty(b, s, cfg.vocab_size, dtype=amp or wdtype, requires_grad=True) if plan.last else act()
        )
        out.append(
            PipelineStage(
                mod,
                plan.index,
                plan.num_stages,
                torch.device("cpu"),
                input_args=(inp,),
                output_args=(res,),
                group=group,
            )
        )
    return out


def _static_vote(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
    """Set every stage to static metadata, what every rank votes when all stages were given their shapes.

    The schedule's warm-up vote receives the other ranks' votes and reads one with ``.item()``, which a fake
    process group cannot answer (the receive is a no-op) and FakeTensorMode refuses.
    """
    from torch.distributed.pipelining._utils import InferenceMode

    for st in stages:
        st._inference_mode = InferenceMode.STATIC


def _schedule(sc: Scenario, stages: list[Any], loss_fn: Callable[..., torch.Tensor]) -> Any:
    """The scenario's pipelining schedule over this rank's stages, with micro-batches = pp_microbatches."""
    from torch.distributed import pipelining as pl

    par = sc.parallel
    if par.pp_schedule == "interleaved":
        sched = pl.ScheduleInterleaved1F1B(stages, par.pp_microbatches, loss_fn=loss_fn)
    else:
        cls = pl.Schedule1F1B if par.pp_schedule == "1f1b" else pl.ScheduleGPipe
        sched = cls(stages[0], par.pp_microbatches, loss_fn=loss_fn)
    sched._warmup_p2p = _static_vote  # an attribute of this schedule object only
    return sched


def _mark_phases(stage: Any, tracker: MemoryTracker) -> list[Any]:
    """Make the stage's forward and backward of each micro-batch mark the tracker's phase ('loss' after the
    last stage's forward); returns the hook handles."""
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def forward_one_chunk(*args: Any, **kwargs: Any) -> Any:
        tracker.set_phase("forward")
        return fwd(*args, **kwargs)

    def backward_one_chunk(*args: Any, **kwargs: Any) -> Any:
        tracker.set_phase("backward")
        out = bwd(*args, **kwargs)
        tracker.relabel(_unsharded_grads(stage.submod), "gradient")
        return out

    stage.forward_one_chunk = forward_one_chunk  # attributes of this stage object only
    stage.backward_one_chunk = backward_one_chunk
    if not stage.is_last:
        return []
    return [stage.submod.register_forward_hook(lambda *_: tracker.set_phase("loss"))]


def _keeps_outputs(sc: Scenario, notes: list[str]) -> bool:
    """Whether the schedule returns the last stage's outputs (``return_outputs``, PyTorch's default): only for
    output_lifetime 'step', where every micro-batch's logits stay alive until the next step. Otherwise each is
    held (in the stage's forward cache) until its own backward, as torchtitan's ``return_outputs=False`` does."""
    from .traceable import trace_kwargs

    keep = trace_kwargs(sc).get("output_lifetime") == "step"
    notes.append(f"schedule.step(return_outputs={keep})")
    return keep


def _unsharded_grads(module: torch.nn.Module) -> list[torch.Tensor]:
    """FSDP2's unsharded gradients, which accumulate over the micro-batches until the last one reduce-scatters
    them (the schedule turns gradient sync off before it); none without FSDP2."""
    out = []
    for m in module.modules():
        get_state = getattr(m, "_get_fsdp_state", None)  # FSDP2's modules only
        state = get_state() if get_state is not None else None
        group = getattr(state, "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", None) or []:
            unsharded = getattr(fp, "_unsharded_param", None)
            out += [
                g for g in (getattr(unsharded, "grad", None), fp.unsharded_accumulated_grad) if g is not None
            ]
    return out


def _recv_buffers(stage: Any) -> list[torch.Tensor]:
    """The stage's receive buffers (activations from the previous stage, gradients from the next), one per
    micro-batch, allocated when the schedule first runs."""
    infos = [i for chunk in stage.args_recv_info.values() for i in chunk]
    infos += [i for chunk in stage.grad_recv_info.values() for i in chunk]
    return [i.buffer for i in infos if getattr(i, "buffer", None) is not None]


@contextlib.contextmanager
def _dp_patches(sc: Scenario) -> Iterator[None]:
    """Under pp x dp, DTensor's sharding propagation in its own FakeTensorMode
    (docs/memory-facts.md#tracing-one-rank-on-a-cpu, pitfall 1)."""
    if sc.parallel.dp == 1:
        yield
        return
    from .distributed import private_sharding_fake_mode

    with private_sharding_fake_mode():
        yield


def _dp_roles(sc: Scenario, tracker: MemoryTracker) -> Any:
    """Under pp x dp, FSDP2's communication buffers and unsharded units labelled as ``distributed`` does."""
    if sc.parallel.dp == 1:
        return contextlib.nullcontext()
    from .distributed import fsdp_roles

    return fsdp_roles(tracker)


def _optimizer(sc: Scenario, trainable: list[torch.nn.Parameter], notes: list[str]) -> tuple[Any, str]:
    """The scenario's optimizer over the rank's trainable parameters, falling back as ``trace_training`` does
    when an implementation fails on fake cpu tensors; returns it and the implementation used."""
    impl = sc.optimizer_impl
    if sc.optimizer not in ("adamw", "adam", "sgd", "sgd-momentum"):
        return make_optimizer(sc.optimizer, "foreach", trainable, 1e-3), "n/a"
    for dt in sorted({p.dtype for p in trainable}, key=str):
        err = probe_optimizer(sc.optimizer, impl, dt, 1e-3)
        if err is not None:
            fallback = "foreach" if impl == "fused" else "for-loop"
            notes.append(f"optimizer_impl={impl} failed on fake cpu {dt}: {err}; fell back to {fallback}")
            impl = fallback
    return make_optimizer(sc.optimizer, impl, trainable, 1e-3), impl


def _batch(sc: Scenario, vocab: int, plans: list[StagePlan]) -> tuple[tuple, torch.Tensor | None]:
    """One schedule step's inputs: token ids for the first stage, labels for the last (b x m rows each)."""
    rows = sc.micro_batch_size * sc.parallel.pp_microbatches
    args = (torch.randint(0, vocab, (rows, sc.seq_len)),) if plans[0].first else ()
    target = torch.randint(0, vocab, (rows, sc.seq_len)) if plans[-1].last else None
    return args, target


def trace_pipeline(
    sc: Scenario, *, rank: int | None = None, progress: bool = False, top_n: int = 20, steps: int = 2
) -> TraceResult:
    """Trace ``steps`` training steps of one pipeline rank (default: the stage the engine predicts highest).

    Each step is one ``schedule.step`` over ``pp_microbatches`` micro-batches of ``micro_batch_size`` rows
    (forward, loss and backward of each, marked as they happen), then the optimizer step and
    ``zero_grad(set_to_none=True)``; the result describes the steady state (step 2), as ``trace_training``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memsim_widget.catalog.models import resolve_model_config

    from .fake_dist import cpu_mesh, fake_world
    from .hf import build_hf_config

    t0 = time.perf_counter()
    check_pipeline(sc)
    world = sc.parallel.world_size
    rank = default_rank(sc) if rank is None else rank
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
        raise ScenarioError(
            "rank", f"must be an integer in 0..{world - 1} for {world} pipeline ranks, got {rank!r}"
        )
    notes: list[str] = []
    cfg = build_hf_config(dict(resolve_model_config(sc.model)), "sdpa")
    plans = stage_plans(sc, rank // sc.parallel.dp, cfg.num_hidden_layers)
    mods = _stage_modules(sc, cfg, plans, notes)
    with fake_world(rank, world), _dp_patches(sc):
        mesh = cpu_mesh({"pp": sc.parallel.pp, "dp": sc.parallel.dp})
        with FakeTensorMode(allow_non_fake_inputs=False):
            run = _run_steps(sc, cfg, plans, mods, mesh, notes, progress, steps)
    result = _summarise(*run, notes, top_n)
    result.rank, result.world_size, result.rank_role = rank, world, rank_role(sc, plans, rank)
    result.layout = {
        "pp": sc.parallel.pp,
        "dp": sc.parallel.dp,
        "zero": sc.parallel.zero,
        "schedule": sc.parallel.pp_schedule,
        "microbatches": sc.parallel.pp_microbatches,
        "virtual_stages": sc.parallel.virtual_stages,
        "stages": [p.index for p in plans],
        "layers": [list(p.layers) for p in plans],
    }
    result.seconds = round(time.perf_counter() - t0, 3)
    return result


def _run_steps(
    sc: Scenario,
    cfg: Any,
    plans: list[StagePlan],
    mods: list[StageModule],
    mesh: Any,
    notes: list[str],
    progress: bool,
    steps: int,
) -> tuple[PipelineTracker, dict[str, Any]]:
    """Build the rank's stages on fake tensors and run the training steps under the tracker (call inside the
    fake world and FakeTensorMode)."""
    for mod in mods:
        fakeify_meta(mod)
        mod.train()
        if sc.parallel.dp > 1:
            from .distributed import parallelize

            parallelize(
                mod,
                mesh,
                sc,
                notes if mod is mods[0] else [],
                reshard_after_forward=sc.parallel.reshard_after_forward,
            )
    root = (
        mods[0]
        if len(mods) == 1
        else torch.nn.ModuleDict({f"stage{p.index}": m for p, m in zip(plans, mods, strict=True)})
    )
    stages = _pipeline_stages(sc, cfg, mods, plans, mesh["pp"].get_group())
    schedule = _schedule(sc, stages, causal_lm_loss(cfg.vocab_size, precision_dtypes(sc.precision)[1]))
    params = list(dict.fromkeys(root.parameters()))
    trainable = [p for p in params if p.requires_grad]
    opt, impl = _optimizer(sc, trainable, notes)
    tracker = PipelineTracker(root, progress=progress)
    keep_outputs = _keeps_outputs(sc, notes)
    hooks = [
        p.register_post_accumulate_grad_hook(lambda q: tracker.relabel(q.grad, "gradient")) for p in trainable
    ]
    for st in stages:
        hooks += _mark_phases(st, tracker)
    try:
        with tracker, _dp_roles(sc, tracker):
            tracker.register(params, "parameter")
            tracker.register(list(root.buffers()), "buffer")
            for step in range(1, steps + 1):
                tracker.set_phase("forward", step)
                args, target = _batch(sc, cfg.vocab_size, plans)
                tracker.relabel([*args, *([target] if target is not None else [])], "input")
                losses: list | None = [] if plans[-1].last else None
                # a loop that keeps the model output (output_lifetime "step") keeps what step returns: the
                # concatenation of the last stage's outputs, beside the chunks the stage keeps
                output = schedule.step(*args, target=target, losses=losses, return_outputs=keep_outputs)
                del args, target, losses
                tracker.relabel([b for st in stages for b in _recv_buffers(st)], "input")
                tracker.relabel([p.grad for p in trainable if p.grad is not None], "gradient")
                tracker.set_phase("optimizer_step")
                opt.step()
                del output
                tracker.relabel(
                    [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)],
                    "optimizer_state",
                )
                tracker.set_phase("zero_grad")
                opt.zero_grad(set_to_none=True)
            tracker.set_phase("end")
    finally:
        for h in hooks:
            h.remove()
    state_seq = tracker.mark_seq(steps, "zero_grad")
    state = tracker.by_role_at(state_seq - 1) if state_seq else {}
    info = {
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in trainable),
        "model_state": {k: state.get(k, 0) for k in ("parameter", "buffer", "gradient", "optimizer_state")},
        "impl": impl,
        "recv_buffers": [
            (tuple(b.shape), b.untyped_storage().nbytes()) for st in stages for b in _recv_buffers(st)
        ],
    }
    tracker.close()
    return tracker, info


def _summarise(tracker: PipelineTracker, info: dict[str, Any], notes: list[str], top_n: int) -> TraceResult:
    """The steady-state (step 2 on) peak, its roles and largest tensors, as ``trace_training`` reports them."""
    s_best, sp = steady_peak(tracker)
    by_role = tracker.by_role_at(sp["seq"])
    if sum(by_role.values()) != sp["bytes"]:
        notes.append(f"internal: by_role sum {sum(by_role.values())} != peak {sp['bytes']}")
    bufs = info["recv_buffers"]
    if bufs:
        notes.append(
            f"{len(bufs)} pipeline receive buffers ({sum(n for _, n in bufs):,} B; activations from the previous "
            "stage and gradients from the next, one per micro-batch) are counted as input"
        )
    return traced_result(
        tracker, s_best, by_role, top_n=top_n, parameters=info["parameters"],
        trainable_parameters=info["trainable"], notes=notes, model_state_bytes=info["model_state"],
        optimizer_impl_used=info["impl"],
    )  # fmt: skip
