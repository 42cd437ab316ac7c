"""What the activation rules produce: a ``Term`` per kind of saved tensor, gathered in an ``ActivationBudget``
by when it is alive (per layer, before and after the layers, around the loss, in backward)."""

from __future__ import annotations

from dataclasses import field

from memsim_widget.engine.items import Level
from memsim_widget.fast_dataclass import dataclass


@dataclass
class Term:
    """One kind of saved tensor: ``bytes`` per layer per micro-batch, explained by ``formula``."""

    name: str
    bytes: float
    formula: str
    tensors: int = 1
    level: Level | str = Level.TENSOR  # a plain name too: the Item made of it converts it
    skip_first: bool = False  # absent in layer 0 (e.g. the first norm when embeddings are frozen)
    first_bytes: float = 0.0  # bytes layer 0 does not hold when ``skip_first``
    #: each tensor's share of ``bytes`` where they differ (the allocator stream, engine/counters/alloc_stream);
    #: empty: ``tensors`` equal tensors
    shares: tuple[float, ...] = ()


@dataclass
class ActivationBudget:
    """Saved and transient activation memory of one rank, per micro-batch."""

    per_layer: list[Term] = field(default_factory=list)  # saved by each layer (one micro-batch)
    checkpointed_layer: list[Term] = field(default_factory=list)  # kept per layer under checkpointing
    recomputed_layer: list[Term] = field(
        default_factory=list
    )  # what recomputing one layer adds (default per_layer)
    cache_per_layer: list[Term] = field(default_factory=list)  # held by the output's KV cache until the loss
    ckpt_input_shared: bool = False  # the recomputed layer's first norm saves the checkpointed input itself
    pre: list[Term] = field(default_factory=list)  # before the layers (first stage)
    post: list[Term] = field(default_factory=list)  # final norm, loss's saved log-softmax (last stage)
    loss_forward: list[Term] = field(default_factory=list)  # logits and their fp32 copy, alive in the loss
    # the top of the forward, the head and loss not run yet: what the stack's forward holds to its end and the
    # last layers' own transients at their largest instant (T5: engine/activations/t5._forward_top)
    forward_top: list[Term] = field(default_factory=list)
    loss_saved: list[Term] = field(default_factory=list)  # saved by the loss until its backward
    loss_backward: list[Term] = field(default_factory=list)  # transients at the start of backward
    # the logits' gradient in their dtype, alive while the head's backward makes its weight gradient
    logits_grad: list[Term] = field(default_factory=list)
    layer_backward: list[Term] = field(default_factory=list)  # transients while one layer runs backward
    # ... at the end of its MLP down projection's backward (activations/backward.mlp_out_backward)
    mlp_out_backward: list[Term] = field(default_factory=list)
    top_backward: list[Term] = field(default_factory=list)  # transients of the final norm's backward
    attention_backward: list[Term] = field(default_factory=list)  # transients of the attention's backward
    bottom_backward: list[Term] = field(
        default_factory=list
    )  # transients of the embedding's backward (calibrated)
    # a compiled autocast backward (activations/compiled_kept): per layer the KV cache's zero gradients, alive
    # until the layer's backward; per layer what its backward keeps until the bottom layer is done; what the top
    # of the backward keeps until then
    cache_tangent_layer: list[Term] = field(default_factory=list)
    bottom_layer_backward: list[Term] = field(
        default_factory=list
    )  # the bottom layer's (empty: layer_backward)
    kept_backward: list[Term] = field(default_factory=list)
    kept_top_backward: list[Term] = field(default_factory=list)
    inputs: list[Term] = field(default_factory=list)
    # the model output the loop still holds after the loss (output_lifetime "backward" or "step"):
    output_logits: list[Term] = field(default_factory=list)  # its logits (last stage)
    output_cache: list[Term] = field(default_factory=list)  # per layer: the whole KV cache it references
    output_cache_extra: list[Term] = field(
        default_factory=list
    )  # per layer: the part the layer does not save
    output_through_step: bool = False  # held through the optimizer step too ("step")
    pp_buffer: list[Term] = field(default_factory=list)  # one pipeline receive/send buffer (one micro-batch)
    pp_output: list[Term] = field(default_factory=list)  # a non-last stage's output kept for its backward
    pp_logits: list[Term] = field(default_factory=list)  # the last stage's output (logits) kept likewise

    def layer_bytes(self) -> float:
        return sum(t.bytes for t in self.per_layer)

    def loss_buffer_names(self) -> set[str]:
        """Names of the loss's T x V buffers (the allocator's variable-shape waste is a multiple of them)."""
        return {t.name for t in self.loss_forward + self.loss_saved + self.loss_backward + self.output_logits}
