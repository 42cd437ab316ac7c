"""Shared checks for the family tests (tests/test_family_*.py): transformers' own meta-device build.

``meta_counts`` instantiates the family's training class (``model_class``: ``AutoModelForMaskedLM`` for the
masked-LM encoders, else ``AutoModelForCausalLM``) on the meta device (no memory, no download) and counts its parameters (shared tensors once) and their shapes; ``assert_matches_transformers`` holds an
Architecture to it tensor for tensor. Helper, not a test module (pytest collects only ``test_*.py``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch
import transformers

from memsim_widget.architecture import Architecture

logging.getLogger("transformers").setLevel(logging.ERROR)


#: Model types trained as ``*ForMaskedLM`` (the class their builders document).
MASKED_LM_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "modernbert"})


def model_class(model_type: str) -> Any:
    """The transformers auto class a family trains with: masked-LM encoders or causal LMs."""
    if model_type in MASKED_LM_TYPES:
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModelForCausalLM


def meta_model(cfg: dict[str, Any]) -> torch.nn.Module:
    """The training-head transformers model of an HF config dict, built on the meta device."""
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        return model_class(cfg["model_type"]).from_config(hf_cfg)


def meta_counts(cfg: dict[str, Any]) -> tuple[int, Counter[tuple[int, ...]]]:
    """Total parameters (tied tensors once, as ``model.parameters()`` yields them) and their shape multiset."""
    model = meta_model(cfg)
    shapes: Counter[tuple[int, ...]] = Counter(tuple(p.shape) for p in model.parameters())
    return sum(p.numel() for p in model.parameters()), shapes


def arch_shapes(arch: Architecture) -> Counter[tuple[int, ...]]:
    """Shape multiset of an Architecture's parameter groups (count copies of each shape)."""
    out: Counter[tuple[int, ...]] = Counter()
    for g in arch.params:
        out[g.shape] += g.count
    return out


def assert_matches_transformers(arch: Architecture, cfg: dict[str, Any]) -> None:
    """The Architecture has exactly transformers' parameters: same total, same tensor shapes."""
    total, shapes = meta_counts(cfg)
    assert arch.parameters == total
    assert arch_shapes(arch) == shapes
