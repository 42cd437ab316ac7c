"""Resolve a scenario once into the objects the engine formulas read, and check model-dependent limits."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from memsim_widget.architecture import Architecture, ParamGroup
from memsim_widget.architecture.moe import expert_lora_ranks, peft_parameter
from memsim_widget.catalog.gpus import GPU, resolve_gpu
from memsim_widget.catalog.models import architecture_for
from memsim_widget.engine.caches.model_rules_cache import check_once
from memsim_widget.engine.parallel.schedule import in_flight
from memsim_widget.errors import ScenarioError
from memsim_widget.fast_dataclass import dataclass
from memsim_widget.optimizers import OPTIMIZERS, OptimizerSpec
from memsim_widget.precision import PRECISIONS, PrecisionRecipe
from memsim_widget.rules import ScenarioView, check
from memsim_widget.rules.pipeline_split import chunk_layers, rank_chunks, rank_layers
from memsim_widget.scenario import Scenario

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Linear modules PEFT's "all-linear" skips: the output head.
#: Parameter stacks of a multimodal model's vision side (tower, its unused layers, projector).
TOWER_STACKS = ("vision", "vision_unused", "projector")
_HEAD_MODULES = {"lm_head", "classifier", "cls", "decoder", "head"}
#: The precisions memsim writes as DeepSpeed's ``bf16.enabled`` / ``fp16.enabled`` (``export/deepspeed._precision``)
DEEPSPEED_16BIT = ("mixed-bf16", "bf16", "mixed-fp16")


def deepspeed_casts_adapters(scenario: Scenario) -> bool:
    """Whether DeepSpeed's engine casts peft's adapters to the model's 16-bit dtype at ``deepspeed.initialize``
    (deepspeed 0.19.8 ``runtime/engine.py``: ``_configure_distributed_model`` under ``bf16.enabled`` or
    ``fp16.enabled`` calls ``_cast_module_mixed_precision``, which sets ``p.data = p.data.to(param_dtype)`` for
    every floating parameter not in it, whatever dtype peft made it in; a ``zero.Init`` model, HF's
    ``from_pretrained`` under ZeRO-3, is skipped): LoRA or QLoRA under the ``deepspeed`` framework, ZeRO 0-2,
    a precision in ``DEEPSPEED_16BIT``. The adapters then run, save and train in that dtype
    (``Context.adapter_bytes``); ``lora.adapter_dtype`` only names what peft makes before the cast
    (``Context.peft_adapter_bytes``, the ZeRO-1/2 stream's ``zero_lora``)."""
    return (
        scenario.method != "full"
        and scenario.framework == "deepspeed"
        and scenario.precision in DEEPSPEED_16BIT
        and scenario.parallel.zero < 3
    )


def deepspeed_zero3_linear(scenario: Scenario) -> bool:
    """Whether every Linear of a LoRA (or QLoRA) model saves its input, frozen or not: under DeepSpeed's ZeRO-3
    (the ``deepspeed`` framework, ``parallel.zero`` 3, any dp) ``zero.Init``, which HF's ``from_pretrained``
    builds the model under, and ``deepspeed.initialize``'s own ``Init(module=...)`` both replace
    ``torch.nn.functional.linear`` for the rest of the process by ``zero3_linear_wrap`` (deepspeed 0.19.8
    ``runtime/zero/partition_parameters.py``, ``_enable_mem_efficient_linear``, under the stage-3 default
    ``memory_efficient_linear`` true). Its autograd Function (``runtime/zero/linear.py``,
    ``LinearFunctionForZeroStage3.setup_context``) saves the input, weight and bias whatever needs a gradient,
    where torch's own linear keeps the input only for a weight that trains: a frozen base Linear whose input
    needs a gradient (any Linear after the first adapter) keeps that input too, as does the frozen head.
    Nothing changes in full training, where every Linear keeps its input anyway."""
    return scenario.method != "full" and scenario.framework == "deepspeed" and scenario.parallel.zero >= 3


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter pair on ``count`` copies of a targeted Linear (``A``: r x in, ``B``: out x r)."""

    base: ParamGroup
    in_features: int
    out_features: int
    rank: int

    @property
    def numel(self) -> int:
        return (self.in_features + self.out_features) * self.rank * self.base.count


@dataclass(frozen=True)
class Stage:
    """One pipeline stage (rank position along pp): which layers and ends it holds."""

    index: int
    num_stages: int
    layers: int
    first: bool
    last: bool

    @property
    def label(self) -> str:
        return f"stage {self.index}" if self.num_stages > 1 else "rank 0"


class Context:
    """A scenario resolved against the catalogs: architecture, recipe, optimizer, GPU, stages."""

    #: Set on a tower's context only (``tower_context``): the parent's frozen stacks (no default: read by getattr)
    frozen_override: frozenset[str]

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.arch: Architecture = architecture_for(scenario.model)
        self.recipe: PrecisionRecipe = PRECISIONS[scenario.precision]
        self.opt: OptimizerSpec = OPTIMIZERS[scenario.optimizer]
        self.gpu: GPU = resolve_gpu(scenario.gpu)
        self.par = scenario.parallel
        self._validate()

    # ----- checks that need the architecture ---------------------------------------------------
    def _validate(self) -> None:
        """The rules against the model (``rules/model.py``, ``rules/multimodal.py``; once per
        ``model_rules_cache.model_rules_key``), then the images' bound."""
        check_once(self.scenario, lambda: check("model", self.rules_view))
        self._validate_images()

    @property
    def rules_view(self) -> ScenarioView:
        """The scenario as the rules read it, with the model, its Linear modules, the LoRA adapters and the
        images per sample resolved."""
        return ScenarioView(
            self.scenario,
            arch=self.arch,
            linear_modules=self.linear_modules,
            adapters=self.adapters,
            **{"context.images_per_sample": self.images_per_sample},
        )

    def _validate_images(self) -> None:
        """The images of one micro-batch stay a sane count (``MAX_MICRO_BATCH``, the scenario's bound)."""
        from memsim_widget.scenario import MAX_MICRO_BATCH

        if self.scenario.micro_batch_size * self.images_per_sample > MAX_MICRO_BATCH:
            raise ScenarioError(
                "images_per_sample",
                f"micro_batch_size x images_per_sample must be at most {MAX_MICRO_BATCH:,} images per micro-batch",
            )

    # ----- derived facts -----------------------------------------------------------------------
    @property
    def images_per_sample(self) -> int:
        """Images per sample of a multimodal model (the scenario's, else the model's default); 0 for text models."""
        v = self.arch.facts.vision
        if v is None:
            return 0
        n = self.scenario.images_per_sample
        return v.images_default if n is None else n

    @property
    def freeze_vision(self) -> bool:
        """The vision tower is frozen (the scenario's ``freeze_vision``, else the model's recipe)."""
        v = self.arch.facts.vision
        if v is None:
            return False
        f = self.scenario.freeze_vision
        return v.freeze_default if f is None else f

    @property
    def frozen_stacks(self) -> frozenset[str]:
        """Parameter stacks that train neither fully nor through adapters: under full training a frozen vision
        tower; under LoRA the tower and projector when ``lora.target_scope`` is ``language`` (under peft's
        ``model`` scope they get adapters wherever a target name matches, as ``get_peft_model`` puts them)."""
        override = getattr(self, "frozen_override", None)  # a tower's context (engine/multimodal/tower.py)
        if override is not None:
            return override
        unused = (
            {"vision_unused"} if self.arch.facts.vision is not None else set()
        )  # LLaVA's tower past the layer read (peft's adapters there get no gradient: not counted)
        if unused and not self.images_per_sample:
            # no image: the tower and projector never run, so they get no gradient and AdamW no state (traced)
            return frozenset({"vision", "projector", *unused})
        if not unused:
            return frozenset()
        if not self.full_training:
            return frozenset(TOWER_STACKS if self.scenario.lora.target_scope == "language" else unused)
        return frozenset({"vision", *unused} if self.freeze_vision else unused)

    @property
    def vision_grad(self) -> bool:
        """Under LoRA, the image features need a gradient (adapters in the tower or projector): the language
        model's input then does too, so its first layer saves what every other layer saves."""
        if self.full_training or not self.images_per_sample:
            return False
        return any(ad.base.stack in ("vision", "projector") for ad in self.adapters)

    @property
    def image_tokens(self) -> int:
        """Tokens the images of one sample add to the language model's sequence (LLaVA; 0 for CLIP and text)."""
        v = self.arch.facts.vision
        return self.images_per_sample * v.tokens_per_image if v else 0

    @property
    def seq_len(self) -> int:
        """The sequence the model sees (ViT: fixed by patches; LLaVA: text tokens + image tokens)."""
        return self.arch.fixed_seq_len or self.scenario.seq_len + self.image_tokens

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch on one rank before tp/cp division (b * s)."""
        return self.scenario.micro_batch_size * self.seq_len

    @property
    def full_training(self) -> bool:
        return self.scenario.method == "full"

    @property
    def trainable_parameters(self) -> int:
        """Parameters the optimizer updates: all of them, or the LoRA adapters'."""
        if self.full_training:
            return sum(g.numel for g in self.arch.params if g.stack not in self.frozen_stacks)
        return sum(ad.numel for ad in self.adapters)

    @cached_property
    def linear_modules(self) -> list[str]:
        """The Linear modules of the engine's layer stack: a multimodal model's tower and projector have their own
        rules (engine/multimodal/tower.py), so their names (CLIP's fc1, out_proj) never count as the language model's."""
        towers = TOWER_STACKS if self.arch.facts.vision is not None else ()
        return sorted({g.module for g in self.arch.params if g.module and g.stack not in towers})

    @cached_property
    def adapters(self) -> tuple[Adapter, ...]:
        """LoRA adapters implied by the targets (``all-linear`` = every Linear but the head)."""
        if self.scenario.method == "full":
            return ()
        targets = set(self.scenario.lora.targets)
        out = []
        frozen = self.frozen_stacks
        # peft moves the checkpoint's expert names to ``target_parameters`` on the fused experts (a Linear of
        # the same name, a dense layer's or a shared expert's, then gets none; traced on Qwen3-MoE and DeepSeek)
        # (``all-linear`` adds them all, the router's ``gate`` too: ``_resolve_string_target_modules``)
        expert_names = self.arch.facts.limits.lora_expert_targets
        named = targets | set(expert_names) if "all-linear" in targets else targets
        experts = expert_lora_ranks(named, expert_names)
        rank = self.scenario.lora.rank
        for g in self.arch.params:
            fused = peft_parameter(g)
            if experts and fused and len(g.shape) == 2:
                # [out, in] per expert: lora_A [r' E, in], lora_B [out, r' E] (the router: E = 1)
                if fused in experts:
                    out.append(Adapter(g, g.shape[1], g.shape[0], rank * experts[fused]))
                continue
            if not g.module or len(g.shape) != 2 or g.kind == "embedding" or g.stack in frozen:
                continue
            hit = g.module in targets or (
                "all-linear" in targets and g.module not in _HEAD_MODULES and g.kind != "head"
            )
            if not hit or g.module in expert_names:
                continue
            if self.arch.facts.linear.conv1d:
                fan_in, fan_out = g.shape
            else:
                fan_out, fan_in = g.shape
            out.append(Adapter(g, fan_in, fan_out, self.scenario.lora.rank))
        return tuple(out)

    @property
    def peft_adapter_bytes(self) -> int:
        """Bytes per element of the adapters as peft makes them (``lora.adapter_dtype``)."""
        return DTYPE_BYTES[self.scenario.lora.adapter_dtype]

    @property
    def adapter_bytes(self) -> int:
        """Bytes per element of the adapters as they train: the model's 16-bit dtype where DeepSpeed casts them
        at its wrap (``deepspeed_casts_adapters``), else as peft makes them."""
        if deepspeed_casts_adapters(self.scenario):
            return self.recipe.weight_bytes
        return self.peft_adapter_bytes

    @cached_property
    def chunks(self) -> tuple[int, ...]:
        """The layers of each model chunk, in stage order (``rules/pipeline_split.chunk_layers``)."""
        par = self.par
        return chunk_layers(self.arch.num_layers, par.pp, par.virtual_stages, par.pp_split, par.pp_layers)

    @cached_property
    def stages(self) -> tuple[Stage, ...]:
        p = self.par.pp
        split = rank_layers(self.chunks, p)
        return tuple(Stage(i, p, split[i], i == 0, i == p - 1) for i in range(p))

    def held_layers(self, stage: Stage, at_loss: bool = False) -> float:
        """Layer x micro-batch activation sets a stage holds at its peak: its layers times its micro-batches
        in flight, or, where an interleaved rank's chunks differ in size, the chunks' own layers summed in the
        schedule's order (``interleaved_held_layers``; ``at_loss``: the last stage's peak while a loss runs)."""
        par = self.par
        held = uneven_held_layers(
            par.pp_schedule, par.pp, par.pp_microbatches, stage.index, self.chunks, at_loss
        )
        return stage.layers * self.in_flight(stage) if held is None else held

    def loss_grad_layers(self, stage: Stage) -> int:
        """Layers of the last stage whose gradients exist at its latest loss backward: on an interleaved rank
        only its chunks whose backward ran before (``interleaved_loss_grad_chunks``), counted from its last
        chunk; every layer of the stage otherwise."""
        par = self.par
        if not (stage.last and par.pp > 1 and par.pp_schedule == "interleaved" and par.virtual_stages > 1):
            return stage.layers
        mine = rank_chunks(self.chunks, par.pp, par.pp - 1)  # the loss is on the last rank
        n = interleaved_loss_grad_chunks(par.pp, par.pp_microbatches, len(mine))
        return sum(mine[len(mine) - n :])

    def in_flight(self, stage: Stage) -> float:
        """Micro-batches whose activations a stage holds at once (``engine/parallel/schedule.in_flight``)."""
        par = self.par
        return in_flight(par.pp, par.pp_microbatches, par.pp_schedule, par.virtual_stages, stage.index)

    def seen_as(self, arch: Architecture, scenario: Scenario | None = None) -> Context:
        """This context for another view of its model (a vision tower, LLaVA-NeXT's crops, a hybrid stack without
        its state-space layers): ``arch`` (and ``scenario``) in place of its own, the recipe, optimizer, GPU and
        layout kept; nothing validated again, nothing cached carried over."""
        sub = object.__new__(Context)
        sub.__dict__.update({k: v for k, v in self.__dict__.items() if k not in _CACHED})
        sub.arch = arch
        sub.scenario = self.scenario if scenario is None else scenario
        return sub


#: The names of ``Context``'s cached properties (what ``seen_as`` leaves to the new view to compute).
_CACHED = frozenset(k for k, x in vars(Context).items() if isinstance(x, cached_property))


def tower_context(ctx: Context, arch: Architecture, batch: int) -> Context:
    """``ctx`` seen from a tower: its architecture, ``batch`` samples of its own fixed sequence."""
    sc = ctx.scenario.replace(micro_batch_size=batch, images_per_sample=None, freeze_vision=None)
    sub = ctx.seen_as(arch, sc)
    sub.frozen_override = ctx.frozen_stacks  # the tower has no "vision" entry: the parent decides
    return sub


def interleaved_loss_grad_chunks(p: int, m: int, v: int) -> int:
    """Model chunks of the last rank of an interleaved 1F1B schedule, counted from its last (the loss's), whose
    backward ran before its latest loss backward, so whose gradients exist then (from step 2 on
    ``zero_grad`` left none). Backward ``j`` runs on local chunk ``v - 1 - (j // m_r) % v``
    (torch.distributed.pipelining ``ScheduleInterleaved1F1B.backward_stage_index``, micro-batches in
    rounds of ``m_r = m / max(1, m // p)``): with one round (``m < 2p``) every loss backward comes before
    any other chunk's backward, so only the loss chunk's gradients (after its first micro-batch) exist."""
    per_round = m // max(1, m // p)
    last = max(j for j in range(m * v) if (j // per_round) % v == 0)
    return len({(j // per_round) % v for j in range(last)})


def uneven_held_layers(
    schedule: str, p: int, m: int, rank: int, chunks: Sequence[int], at_loss: bool = False
) -> float | None:
    """The layer x micro-batch sets ``rank`` holds (``interleaved_held_layers``) where it runs an interleaved
    schedule over chunks that differ in size (``chunks``: the pipeline's, ``rules/pipeline_split``; ``at_loss``:
    on the last rank, while a loss runs); None elsewhere, where it holds its layers times its micro-batches in
    flight (``Context.held_layers``; ``plan/vector`` for many candidate stages)."""
    if schedule != "interleaved" or p == 1:
        return None
    mine = rank_chunks(chunks, p, rank)
    if len(set(mine)) == 1:
        return None
    return interleaved_held_layers(p, m, rank, mine, at_loss and rank == p - 1)


def interleaved_held_layers(
    p: int, m: int, rank: int, chunks: tuple[int, ...], at_loss: bool = False
) -> float:
    """Layer x micro-batch activation sets ``rank`` of an interleaved 1F1B schedule holds at its peak when its
    chunks hold ``chunks`` layers (first to last): the schedule's own order of forwards and backwards, the
    warm-up forwards then one forward and one backward per step, forward ``i`` on local chunk
    ``(i // m_r) % v`` and backward ``j`` on ``v - 1 - (j // m_r) % v`` (torch.distributed.pipelining
    ``ScheduleInterleaved1F1B``: ``forward_stage_index`` / ``backward_stage_index``). With equal chunks it is
    ``interleaved_in_flight`` times the rank's layers. ``at_loss`` (the last rank): the peak over the
    steps whose forward or backward runs the last chunk, where the loss's forward or backward runs with
    that step's holding (every warm-up forward runs an earlier chunk)."""
    v = len(chunks)
    per_round = m // max(1, m // p)
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), total)
    held = sum(chunks[(i // per_round) % v] for i in range(warmup))
    peak = 0 if at_loss else held
    for step in range(total - warmup):
        forward, backward = ((warmup + step) // per_round) % v, v - 1 - (step // per_round) % v
        held += chunks[forward]
        if not at_loss or v - 1 in (forward, backward):
            peak = max(peak, held)
        held -= chunks[backward]
    return float(peak)
