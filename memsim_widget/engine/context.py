"""Resolve a scenario once into the objects the engine formulas read, and check model-dependent limits."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from memsim_widget.architecture import Architecture, ParamGroup
from memsim_widget.catalog.gpus import GPU, resolve_gpu
from memsim_widget.catalog.models import architecture_for
from memsim_widget.errors import ScenarioError
from memsim_widget.optimizers import OPTIMIZERS, OptimizerSpec
from memsim_widget.precision import PRECISIONS, PrecisionRecipe
from memsim_widget.scenario import Scenario

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Linear modules PEFT's "all-linear" skips: the output head.
#: Parameter stacks of a multimodal model's vision side (tower, its unused layers, projector).
TOWER_STACKS = ("vision", "vision_unused", "projector")
_HEAD_MODULES = {"lm_head", "classifier", "cls", "decoder", "head"}


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
        a, p, s = self.arch, self.par, self.scenario
        if a.num_heads % p.tp:
            raise ScenarioError(
                "parallel.tp", f"{a.num_heads} attention heads are not divisible by tp={p.tp}"
            )
        if p.tp > 1 and a.num_kv_heads % p.tp and p.tp % a.num_kv_heads:
            raise ScenarioError(
                "parallel.tp", f"{a.num_kv_heads} key/value heads and tp={p.tp}: one must divide the other"
            )
        chunks = p.pp * p.virtual_stages
        if a.num_layers % chunks:
            raise ScenarioError(
                "parallel.pp",
                f"{a.num_layers} layers are not divisible by pp*virtual_stages = {chunks}",
            )
        if p.ep > 1 and (not a.is_moe or a.num_experts % p.ep):
            raise ScenarioError(
                "parallel.ep",
                f"ep={p.ep} needs an MoE model with experts divisible by ep "
                f"(this model has {a.num_experts} experts)",
            )
        if a.fixed_seq_len is None and a.max_seq_len is not None and s.seq_len > a.max_seq_len:
            raise ScenarioError(
                "seq_len",
                f"must be at most {a.max_seq_len} for this model (the longest sequence its learned position "
                f"table can index), got {s.seq_len}",
            )
        if p.ep > 1 and a.extra.get("expert_parallel_error"):  # Llama 4: every expert takes every token
            raise ScenarioError("parallel.ep", a.extra["expert_parallel_error"])
        if a.fixed_seq_len is None and s.seq_len % p.cp:
            raise ScenarioError("parallel.cp", f"seq_len={s.seq_len} is not divisible by cp={p.cp}")
        if self.opt.impls and s.optimizer_impl not in self.opt.impls and s.optimizer != "none":
            raise ScenarioError(
                "optimizer_impl",
                f"{s.optimizer} has no {s.optimizer_impl!r} implementation; allowed: {', '.join(self.opt.impls)}",
            )
        if s.method != "full" and not self.adapters:
            raise ScenarioError(
                "lora.targets",
                f"{list(s.lora.targets)} match no Linear module of this model; "
                f"modules: {', '.join(sorted({g.module for g in a.params if g.module}))}",
            )
        broken = a.extra.get("lora_all_linear_error")  # Llama 4: peft's all-linear breaks the model's forward
        if s.method != "full" and "all-linear" in s.lora.targets and broken:
            raise ScenarioError("lora.targets", broken)
        self._validate_vision()
        if p.pp_microbatches < p.pp and p.pp > 1 and p.pp_schedule == "interleaved":
            raise ScenarioError(
                "parallel.pp_microbatches", "the interleaved schedule needs pp_microbatches >= pp"
            )

    def _validate_vision(self) -> None:
        """The multimodal keys against the model: refused on a text model; what is not modelled is named."""
        a, p, s = self.arch, self.par, self.scenario
        v = a.extra.get("vision")
        if v is None:
            if s.images_per_sample:
                raise ScenarioError(
                    "images_per_sample",
                    f"{a.model_type!r} is a text model (no vision tower): leave it unset or 0",
                )
            if s.freeze_vision is not None:
                raise ScenarioError("freeze_vision", f"{a.model_type!r} has no vision tower: leave it unset")
            return
        from memsim_widget.scenario import MAX_MICRO_BATCH

        if s.micro_batch_size * self.images_per_sample > MAX_MICRO_BATCH:
            raise ScenarioError(
                "images_per_sample",
                f"micro_batch_size x images_per_sample must be at most {MAX_MICRO_BATCH:,} images per micro-batch",
            )
        if v["kind"] == "clip" and self.images_per_sample != 1:
            raise ScenarioError(
                "images_per_sample",
                "CLIP trains image-text pairs: one image per sample (leave it unset or 1)",
            )
        for key, value in (("parallel.tp", p.tp), ("parallel.pp", p.pp), ("parallel.cp", p.cp)):
            if value > 1:
                raise ScenarioError(
                    key, f"{a.model_type!r}: tensor, pipeline and context parallelism are not modelled for "
                    "multimodal models (where the vision tower runs and how it splits); use dp / zero / FSDP",
                )  # fmt: skip
        if s.activation_checkpointing in ("selective", "selective-op") or (s.checkpoint_every or 1) > 1:
            raise ScenarioError(
                "activation_checkpointing",
                f"{a.model_type!r}: only none and full (HF gradient checkpointing, every layer of both stacks) are "
                "modelled for multimodal models",
            )
        if s.activation_checkpointing == "full" and v["kind"] == "clip":
            # traced: the engine came out 14% low (b8 s77), the checkpointed towers' recompute not modelled yet
            raise ScenarioError(
                "activation_checkpointing", "full checkpointing is not modelled for CLIP (its two checkpointed "
                "towers recompute in an order no rule follows yet; a trace showed the estimate 14% low): use none",
            )  # fmt: skip
        # (loss "chunked" changes nothing for CLIP: its contrastive loss has no vocabulary logits to chunk)
        if s.framework not in ("hf",):
            raise ScenarioError(
                "framework", f"{a.model_type!r} is modelled as transformers runs it (framework 'hf') only"
            )
        if s.method == "qlora":
            raise ScenarioError(
                "method", f"qlora is not modelled for {a.model_type!r} (no trace can check it)"
            )
        if getattr(s, "objective_name", "sft") != "sft":
            raise ScenarioError(
                "objective",
                f"{s.objective_name!r} is not modelled for the multimodal {a.model_type!r} (sft only)",
            )

    # ----- derived facts -----------------------------------------------------------------------
    @property
    def images_per_sample(self) -> int:
        """Images per sample of a multimodal model (the scenario's, else the model's default); 0 for text models."""
        v = self.arch.extra.get("vision")
        if v is None:
            return 0
        n = self.scenario.images_per_sample
        return v["images_default"] if n is None else n

    @property
    def freeze_vision(self) -> bool:
        """The vision tower is frozen (the scenario's ``freeze_vision``, else the model's recipe)."""
        v = self.arch.extra.get("vision")
        if v is None:
            return False
        f = self.scenario.freeze_vision
        return v["freeze_default"] if f is None else f

    @property
    def frozen_stacks(self) -> frozenset[str]:
        """Parameter stacks that train neither fully nor through adapters (a frozen vision tower)."""
        override = getattr(self, "frozen_override", None)  # a tower's context (engine/vision.py)
        if override is not None:
            return override
        unused = (
            {"vision_unused"} if self.arch.extra.get("vision") else set()
        )  # LLaVA's tower past the layer read
        if unused and not self.images_per_sample:
            # no image: the tower and projector never run, so they get no gradient and AdamW no state (traced)
            return frozenset({"vision", "projector", *unused})
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
        v = self.arch.extra.get("vision")
        return self.images_per_sample * v["tokens_per_image"] if v else 0

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
        rules (engine/vision.py), so their names (CLIP's fc1, out_proj) never count as the language model's."""
        towers = TOWER_STACKS if self.arch.extra.get("vision") else ()
        return sorted({g.module for g in self.arch.params if g.module and g.stack not in towers})

    @cached_property
    def adapters(self) -> tuple[Adapter, ...]:
        """LoRA adapters implied by the targets (``all-linear`` = every Linear but the head)."""
        if self.scenario.method == "full":
            return ()
        targets = set(self.scenario.lora.targets)
        out = []
        frozen = self.frozen_stacks
        for g in self.arch.params:
            if not g.module or len(g.shape) != 2 or g.kind == "embedding" or g.stack in frozen:
                continue
            hit = g.module in targets or (
                "all-linear" in targets and g.module not in _HEAD_MODULES and g.kind != "head"
            )
            if not hit:
                continue
            if self.arch.extra.get("conv1d"):
                fan_in, fan_out = g.shape
            else:
                fan_out, fan_in = g.shape
            out.append(Adapter(g, fan_in, fan_out, self.scenario.lora.rank))
        return tuple(out)

    @property
    def adapter_bytes(self) -> int:
        return DTYPE_BYTES[self.scenario.lora.adapter_dtype]

    @cached_property
    def stages(self) -> tuple[Stage, ...]:
        p = self.par.pp
        per = self.arch.num_layers // p
        return tuple(Stage(i, p, per, i == 0, i == p - 1) for i in range(p))

    def in_flight(self, stage: Stage) -> float:
        """Micro-batches whose activations a stage holds at once (REFERENCE.md section 4)."""
        p, m = self.par.pp, self.par.pp_microbatches
        if p == 1:
            return 1.0
        if self.par.pp_schedule == "gpipe":
            return float(m)
        if self.par.pp_schedule == "interleaved":
            return interleaved_in_flight(p, self.par.virtual_stages, m, stage.index)
        return float(min(m, p - stage.index))


def interleaved_in_flight(p: int, v: int, m: int, rank: int) -> float:
    """Micro-batches in flight on ``rank`` of an interleaved 1F1B schedule, in units of the rank's ``v`` model
    chunks: the warm-up forwards plus the one whose backward comes first, ``min(w + 1, m v) / v`` with
    ``w = (v - 1) m_r + 2 (p - 1 - rank)`` and ``m_r = m / max(1, m // p)`` micro-batches per round
    (torch.distributed.pipelining ``ScheduleInterleaved1F1B`` / ``_get_warmup_ops``; Megatron's interleaved
    schedule warms up alike, Narayanan et al. 2021, arXiv 2104.04473)."""
    per_round = m // max(1, m // p)
    warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), m * v)
    return min(warmup + 1, m * v) / v
