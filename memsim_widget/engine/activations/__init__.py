"""Activations: the tensors each implementation saves for backward, per layer and per micro-batch.

Built from what a fake-tensor trace of a real HF transformers training step keeps alive
(docs/memory-facts.md#activations), not from the textbook s*b*h*(34 + 5as/h) of Korthikanti et al. 2022
(arXiv 2205.05198), which is 30-40% off on modern models; Megatron-style fused kernels use that
paper's Table 2 instead. Notation: T tokens of the micro-batch on this rank, h hidden, I MLP width,
hkv = kv heads x head dim, a heads, s sequence, e bytes per compute element.

One module per block or concern:

- ``dispatch``: ``activations``, the entry point (calibrated, Megatron or HF; vision; pipeline stage I/O);
- ``hf``: the HF rules assembled, block by block, on the shared state of ``layer`` (``HFLayer``);
- ``budget`` (``Term``, ``ActivationBudget``), ``dims`` (per-rank sizes), ``refusals`` (untraced combinations);
- the blocks: ``norms``, ``attention`` (and ``mla``), ``mlp`` (dense and MoE), ``ssm`` (Mamba), ``t5``
  (encoder-decoder blocks), ``linears`` (Linear names, autocast weight copies, LoRA internals);
- around the layers: ``embeddings``, ``head``, ``loss``, ``output`` (the KV cache and what the loop holds),
  ``checkpointing``, ``backward`` (transients); ``megatron`` (Korthikanti's Table 2);
- whole model kinds beside the per-block rules: ``hybrid`` (Jamba's attention and Mamba layers over the stack) and
  ``calibrated`` (a model fitted from traces).
"""

from __future__ import annotations

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dispatch import activations

__all__ = ["ActivationBudget", "Term", "activations"]
