"""The Architecture an engine reads and the ParamGroups it is made of; the registry of family builders.

``FAMILIES`` maps an HF ``model_type`` to its builder (HF config mapping -> Architecture); a family module in
``memsim_widget/families/`` adds itself with ``@register_family("<model_type>")``, and is imported the first time
one of its types is asked for (``registry.LazyRegistry``; the table of modules is ``families.MODEL_TYPES``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import field
from typing import Any

from memsim_widget.architecture.facts import ModelFacts, PatchFacts, model_facts
from memsim_widget.architecture.registry import LazyRegistry
from memsim_widget.fast_dataclass import dataclass

#: Parameter kinds of the breakdown, in display order.
PARAM_KINDS = (
    "embedding", "position", "attention", "ssm", "mlp", "experts", "router", "norm", "head", "other"
)  # fmt: skip


@dataclass(frozen=True)
class ParamGroup:
    """``count`` identical parameter tensors of one role (e.g. every layer's q_proj weight).

    ``scope`` says where the tensors live for pipeline splitting: ``"layer"`` (one per transformer
    block, ``count`` a multiple of the block count), ``"pre"`` (before the blocks: embeddings, on the
    first pipeline stage) or ``"post"`` (after: final norm, head, on the last stage).
    ``tp_dim`` is the dimension tensor parallelism splits (None: replicated on every TP rank).
    ``module`` is the leaf ``nn.Linear`` name LoRA targets match (``"q_proj"``), None if not a Linear weight.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    count: int = 1
    scope: str = "layer"
    tp_dim: int | None = None
    module: str | None = None
    expert: bool = False
    stack: str = "decoder"

    @property
    def numel_each(self) -> int:
        return math.prod(self.shape)

    @property
    def numel(self) -> int:
        return self.numel_each * self.count


@dataclass(frozen=True)
class Architecture:
    """Everything the engine needs to know about a model's shape.

    ``num_layers`` counts all transformer blocks (encoder + decoder for T5). ``fixed_seq_len`` is
    set for models whose sequence is fixed by the input (ViT: patches + 1), else None. ``max_seq_len``
    is the longest sequence a learned absolute position table can index (BERT, GPT-2: its rows;
    RoBERTa: its rows less the padding offset), None where positions do not bound it (RoPE, relative).
    """

    family: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    params: tuple[ParamGroup, ...]
    mlp_activation: str = "swiglu"  # swiglu | geglu | gelu | gelu_tanh | relu
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    position: str = "rope"  # rope | learned | relative | alibi (Falcon) | none
    num_experts: int = 0
    experts_per_token: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    encoder_layers: int = 0
    decoder_layers: int = 0
    causal: bool = True
    fixed_seq_len: int | None = None
    max_seq_len: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: ``extra`` read into typed facts (architecture/facts.py): what the engine, planner and rules read
    facts: ModelFacts = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", model_facts(self.extra, self.model_type))

    def extra_with(self, *, drop: Collection[str] = (), **entries: Any) -> dict[str, Any]:
        """This model's ``extra`` less ``drop``, updated with ``entries``: the ``extra`` of a model a family builds
        on this one (a VLM on its language model, Gemma 3 on the shared decoder). A key keeps its place."""
        return {**{k: v for k, v in self.extra.items() if k not in drop}, **entries}

    @property
    def patches(self) -> PatchFacts:
        """A vision model's pixel input and patch grid (ViT, a multimodal model's tower); ValueError on a text model."""
        if self.facts.patches is None:
            raise ValueError(f"{self.model_type} has no pixel input (no image_size)")
        return self.facts.patches

    def with_facts(self, **groups: Any) -> Architecture:
        """This model seen with some fact groups replaced (the engine's views: a hybrid stack without its
        state-space layers, LLaVA-NeXT's crops as LLaVA images); ``extra`` is left as the family wrote it."""
        new = dataclasses.replace(self)
        object.__setattr__(new, "facts", dataclasses.replace(self.facts, **groups))
        return new

    @property
    def parameters(self) -> int:
        """Total parameters, tied weights counted once (as ``sum(p.numel())`` in PyTorch)."""
        return sum(g.numel for g in self.params)

    def parameters_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = dict.fromkeys(PARAM_KINDS, 0)
        for g in self.params:
            out[g.kind] = out.get(g.kind, 0) + g.numel
        return out

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def attention_kernel(self, requested: str) -> str:
        """The attention transformers runs when ``requested`` is asked for: a model class without an SDPA path
        (``facts.attention.sdpa`` False, Gemma 2) falls back to eager, as ``PreTrainedModel`` does by default."""
        return "eager" if requested == "sdpa" and not self.facts.attention.sdpa else requested


FamilyBuilder = Callable[[Mapping[str, Any]], Architecture]
FAMILIES: LazyRegistry[FamilyBuilder] = LazyRegistry()


def register_family(*model_types: str) -> Callable[[FamilyBuilder], FamilyBuilder]:
    """Decorator registering a builder for one or more HF ``model_type`` values."""

    def deco(fn: FamilyBuilder) -> FamilyBuilder:
        for mt in model_types:
            FAMILIES[mt] = fn
        return fn

    return deco
