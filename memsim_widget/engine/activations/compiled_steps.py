"""A layer's forward and backward steps as the allocation stream (``engine/counters/alloc_stream``) writes them,
one place choosing among the per-layout lists: a compiled LoRA layer's (``compiled_lora_steps``), a compiled OLMo 2
layer's (``compiled_olmo2_steps``), a compiled Gemma 3 layer's (``compiled_gemma3_steps``), else the Llama layout's (``forward.layer_forward_transients``,
``compiled_backward.compiled_layer_backward_transients``)."""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_backward import compiled_layer_backward_transients
from memsim_widget.engine.activations.compiled_gemma3_steps import (
    compiled_gemma3_applies,
    compiled_gemma3_backward,
    compiled_gemma3_forward,
)
from memsim_widget.engine.activations.compiled_lora_steps import (
    compiled_lora_applies,
    compiled_lora_backward,
    compiled_lora_forward,
)
from memsim_widget.engine.activations.compiled_olmo2_steps import (
    compiled_olmo2_applies,
    compiled_olmo2_backward,
    compiled_olmo2_forward,
)
from memsim_widget.engine.activations.forward import Step, layer_forward_transients


def layer_forward_steps(ctx: Any) -> tuple[Step, ...]:
    """A layer's forward steps (``forward.Step``)."""
    if compiled_lora_applies(ctx):
        return compiled_lora_forward(ctx)
    if compiled_olmo2_applies(ctx):
        return compiled_olmo2_forward(ctx)
    if compiled_gemma3_applies(ctx):
        return compiled_gemma3_forward(ctx)
    return layer_forward_transients(ctx)


def layer_backward_steps(ctx: Any) -> tuple[Step, ...]:
    """A layer's backward steps (empty: the eager ``layer_backward`` items)."""
    if compiled_lora_applies(ctx):
        return compiled_lora_backward(ctx)
    if compiled_olmo2_applies(ctx):
        return compiled_olmo2_backward(ctx)
    if compiled_gemma3_applies(ctx):
        return compiled_gemma3_backward(ctx)
    return compiled_layer_backward_transients(ctx)


def bottom_layer_backward_steps(ctx: Any) -> tuple[Step, ...]:
    """The bottom layer's backward steps where they differ from ``layer_backward_steps``' (a compiled LoRA layer
    0: ``compiled_lora_backward(bottom=True)``); empty elsewhere."""
    return compiled_lora_backward(ctx, bottom=True) if compiled_lora_applies(ctx) else ()


def kept_top(ctx: Any) -> tuple[int, ...]:
    """The places, among the top's backward tensors (the final norm's: one, the head's input gradient) and then
    the ``post`` ones (the last layer's output, the final norm's output, its rsqrt), of those a compiled Gemma 3
    backward keeps until the bottom layer is done (its trace: the residual gradient is never summed per layer, and
    the kernel at the bottom that writes the embedding's gradient reads them); empty elsewhere. OLMo 2's trace
    keeps them too, but its stream replays the trace's peak reserved to the byte without (one small segment over
    with them, +1.33%: the order in which the trace frees the bottom's buffers is not followed), so they are not
    kept there."""
    return (0, 1, 3) if compiled_gemma3_applies(ctx) else ()


def compiled_steps_written(ctx: Any) -> bool:
    """A compiled step whose layers' own forward and backward buffers are written (``compiled_stream_held`` in
    alloc_stream reads it): bf16 full training of the Llama layout (``forward.compiled_applies``), its LoRA on q
    and v, OLMo 2."""
    from memsim_widget.engine.activations.forward import compiled_applies

    return (
        compiled_applies(ctx)
        or compiled_lora_applies(ctx)
        or compiled_olmo2_applies(ctx)
        or compiled_gemma3_applies(ctx)
    )
