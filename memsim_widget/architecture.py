"""Model architecture: the shapes and parameter counts of a model, per module kind, from an HF config.

The engine reads only this object; it never looks at raw HF config keys. Each model family
(llama, mistral, qwen2, mixtral, gemma2, phi3, gpt2, bert, t5, vit) is one builder function in
``FAMILIES`` taking an HF config mapping; register a new family with ``register_family``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Parameter kinds of the breakdown, in display order.
PARAM_KINDS = ("embedding", "position", "attention", "mlp", "experts", "router", "norm", "head", "other")


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
    set for models whose sequence is fixed by the input (ViT: patches + 1), else None.
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
    position: str = "rope"  # rope | learned | relative | none
    num_experts: int = 0
    experts_per_token: int = 0
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    encoder_layers: int = 0
    decoder_layers: int = 0
    causal: bool = True
    fixed_seq_len: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def parameters(self) -> int:
        """Total parameters, tied weights counted once (as ``sum(p.numel())`` in PyTorch)."""
        return sum(g.numel for g in self.params)

    def parameters_by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(PARAM_KINDS, 0)
        for g in self.params:
            out[g.kind] = out.get(g.kind, 0) + g.numel
        return out

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


FamilyBuilder = Callable[[Mapping[str, Any]], Architecture]
FAMILIES: dict[str, FamilyBuilder] = {}


def register_family(*model_types: str) -> Callable[[FamilyBuilder], FamilyBuilder]:
    """Decorator registering a builder for one or more HF ``model_type`` values."""

    def deco(fn: FamilyBuilder) -> FamilyBuilder:
        for mt in model_types:
            FAMILIES[mt] = fn
        return fn

    return deco
