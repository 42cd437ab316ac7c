"""Checkpoint HF decoder layers the way torchtitan does: per-op selective (``op``) or every N-th layer.

Facts from torchtitan (``torchtitan/models/llama3/infra/parallelize.py`` ``_save_list`` and
``torchtitan/distributed/activation_checkpoint.py`` ``_apply_ac_to_transformer_block``, 2024-2025):

- ``selective_ac_option="op"``: each transformer block runs under ``torch.utils.checkpoint`` with a
  selective-checkpoint policy that saves the outputs of ``aten.mm`` -- all but every second one, counted
  per block and per pass (the 1st, 3rd, 5th... are saved) -- of the scaled-dot-product attention kernels,
  of ``reduce_scatter_tensor`` and of ``aten.max``; everything else is recomputed in backward.
- ``selective_ac_option="N"``: full checkpointing of every N-th block (a counter from 1; blocks with
  ``count % N == 0``), the others keep all their activations.

The CPU trace runs SDPA as ``_scaled_dot_product_flash_attention_for_cpu``, the CPU counterpart of the
CUDA flash kernel in the list, so it is saved too. HF Linears with a bias run ``addmm``, not ``mm``:
they are neither saved nor counted, as under torchtitan's rule.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

MM = torch.ops.aten.mm.default
#: Ops whose outputs the ``op`` policy saves (every second ``mm`` excepted).
SAVED_OPS = frozenset(
    op
    for op in (
        MM,
        torch.ops.aten._scaled_dot_product_efficient_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention.default,
        torch.ops.aten._scaled_dot_product_cudnn_attention.default,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops.aten.max.default,
    )
)


def op_policy(counts: dict[str, int]) -> Callable[..., CheckpointPolicy]:
    """torchtitan's per-op rule for one block; ``counts`` holds its mm count per pass (forward/recompute)."""

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        key = "recompute" if ctx.is_recompute else "forward"
        if func == MM:
            counts[key] += 1
        save = func in SAVED_OPS and not (func == MM and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def _op_context() -> Any:
    """A fresh selective-checkpoint context per block call (torchtitan: ``meta = defaultdict(int)``)."""
    return create_selective_checkpoint_contexts(op_policy(defaultdict(int)))


def _checkpointed(forward: Callable[..., Any], context_fn: Callable[[], Any] | None) -> Callable[..., Any]:
    """``forward`` run under non-reentrant ``torch.utils.checkpoint`` (with a selective context if given)."""

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        extra = {"context_fn": context_fn} if context_fn is not None else {}
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return run


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF model, in order (transformers' ``GradientCheckpointingLayer``s)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_layer_checkpointing(model: torch.nn.Module, policy: str, every: int = 1) -> int:
    """Checkpoint ``model``'s blocks: ``policy`` "selective-op" (every block, torchtitan's op rule) or
    "full" (every ``every``-th block, counted from 1 as torchtitan does); returns the blocks wrapped."""
    if policy not in ("selective-op", "full") or every < 1:
        raise ValueError(f"unknown layer checkpointing {policy!r} every {every}")
    wrapped = 0
    for i, layer in enumerate(decoder_layers(model), start=1):
        if policy == "full" and i % every:
            continue
        layer.forward = _checkpointed(layer.forward, _op_context if policy == "selective-op" else None)
        wrapped += 1
    return wrapped
