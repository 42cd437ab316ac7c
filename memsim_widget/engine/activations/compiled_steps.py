"""A layer's forward and backward steps as the allocation stream (``engine/counters/alloc_stream``) writes them,
one table (``WRITERS``) choosing among the per-layout lists: a compiled LoRA layer's (``compiled_lora_steps``), a
compiled OLMo 2 layer's (``compiled_olmo2_steps``), a compiled Gemma 3 layer's (``compiled_gemma3_steps``), a
compiled autocast layer's (``compiled_amp_steps``), the Llama layout's in bf16 full training (``forward.layer_forward_transients``, ``compiled_backward.
compiled_layer_backward_transients``), read in one place (``writer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memsim_widget.engine.activations.compiled_amp_steps import (
    compiled_amp_applies,
    compiled_amp_backward,
    compiled_amp_bottom,
    compiled_amp_final,
    compiled_amp_first,
    compiled_amp_forward,
)
from memsim_widget.engine.activations.compiled_backward import compiled_layer_backward_transients
from memsim_widget.engine.activations.compiled_gemma3_steps import (
    compiled_gemma3_applies,
    compiled_gemma3_backward,
    compiled_gemma3_forward,
)
from memsim_widget.engine.activations.compiled_lora_steps import (
    compiled_lora_applies,
    compiled_lora_backward,
    compiled_lora_first,
    compiled_lora_forward,
    compiled_lora_gemma3_applies,
)
from memsim_widget.engine.activations.compiled_olmo2_steps import (
    compiled_olmo2_applies,
    compiled_olmo2_backward,
    compiled_olmo2_forward,
)
from memsim_widget.engine.activations.forward import Step, compiled_applies, layer_forward_transients
from memsim_widget.fast_dataclass import dataclass

Steps = Callable[[Any], tuple[Step, ...]]


def _none(ctx: Any) -> tuple[Step, ...]:
    """No steps of its own: the layer's ``backward`` ones."""
    return ()


def _lora_bottom(ctx: Any) -> tuple[Step, ...]:
    """A compiled LoRA layer 0's backward (``compiled_lora_backward(bottom=True)``)."""
    return compiled_lora_backward(ctx, bottom=True)


@dataclass(frozen=True)
class Writer:
    """One compiled layout's steps: whether they describe the layers of a context (``applies``), a layer's forward
    and backward steps (``forward``, ``backward``), the bottom layer's backward where it differs (``bottom``;
    empty: ``backward``'s), ``kept_top`` (``kept_top``'s places) and whether the stream is ``held`` to its traces."""

    applies: Callable[[Any], bool]
    forward: Steps
    backward: Steps
    bottom: Steps = _none
    kept_top: tuple[int, ...] = ()
    #: layer 0's forward where it differs (empty: ``forward``'s)
    first: Steps = _none
    #: the buffers kept to the bottom are freed in the trace's order (``alloc_stream._bottom_freed``)
    bottom_order: bool = False
    #: the final norm's forward (empty: ``forward.final_norm_transients``')
    final: Steps = _none
    #: the weights made one tensor at a time in the module's order, as the model is built (``alloc_stream.
    #: step_stream``'s ``per_param``), where the engine's items group them by kind
    weights_by_param: bool = False
    #: the stream is held to its compiled traces within 1% on reserved (``compiled_steps_written``)
    held: bool = True


#: The compiled layouts whose layers' own buffers the stream writes, the first that applies chosen; the last (the
#: Llama layout's) also writes what is not covered (its writers give eager's forward steps, or none, there).
WRITERS: tuple[Writer, ...] = (
    Writer(
        compiled_lora_gemma3_applies,
        compiled_lora_forward,
        compiled_lora_backward,
        _lora_bottom,
        kept_top=(0,),
        first=compiled_lora_first,
    ),
    Writer(
        compiled_lora_applies,
        compiled_lora_forward,
        compiled_lora_backward,
        _lora_bottom,
        first=compiled_lora_first,
    ),
    Writer(compiled_olmo2_applies, compiled_olmo2_forward, compiled_olmo2_backward),
    Writer(compiled_gemma3_applies, compiled_gemma3_forward, compiled_gemma3_backward, kept_top=(0, 1, 3)),
    Writer(
        compiled_amp_applies,
        compiled_amp_forward,
        compiled_amp_backward,
        bottom=compiled_amp_bottom,
        kept_top=(0, 1, 2, 3),
        first=compiled_amp_first,
        bottom_order=True,
        final=compiled_amp_final,
        weights_by_param=True,
    ),
    Writer(compiled_applies, layer_forward_transients, compiled_layer_backward_transients),
)


def writer(ctx: Any) -> Writer:
    """The steps' writer of ``ctx``'s layers: the first of ``WRITERS`` that applies, else the last."""
    return next((w for w in WRITERS if w.applies(ctx)), WRITERS[-1])


def layer_forward_steps(ctx: Any) -> tuple[Step, ...]:
    """A layer's forward steps (``forward.Step``)."""
    return writer(ctx).forward(ctx)


def first_layer_forward_steps(ctx: Any) -> tuple[Step, ...]:
    """Layer 0's forward steps where they differ from ``layer_forward_steps``' (a compiled autocast layer 0 saves
    o_proj's 16-bit output instead of the fp32 residual after attention); empty elsewhere."""
    return writer(ctx).first(ctx)


def final_norm_steps(ctx: Any) -> tuple[Step, ...]:
    """The final norm's forward steps of a compiled layout that lists them (autocast's); empty elsewhere."""
    return writer(ctx).final(ctx)


def layer_backward_steps(ctx: Any) -> tuple[Step, ...]:
    """A layer's backward steps (empty: the eager ``layer_backward`` items)."""
    return writer(ctx).backward(ctx)


def bottom_layer_backward_steps(ctx: Any) -> tuple[Step, ...]:
    """The bottom layer's backward steps where they differ from ``layer_backward_steps``' (a compiled LoRA layer
    0: ``compiled_lora_backward(bottom=True)``; a compiled autocast layer 0: ``compiled_amp_bottom``); empty
    elsewhere."""
    return writer(ctx).bottom(ctx)


def kept_top(ctx: Any) -> tuple[int, ...]:
    """The places, among the top's backward tensors (the final norm's: one, the head's input gradient) and then
    the ``post`` ones (the last layer's output, the final norm's output, its rsqrt), of those a compiled Gemma 3
    backward keeps until the bottom layer is done (its trace: the residual gradient is never summed per layer, and
    the kernel at the bottom that writes the embedding's gradient reads them); a compiled autocast backward keeps
    the head's input gradient, the final norm's row sum, the last layer's output and the rsqrt (its top: two
    tensors); empty elsewhere. OLMo 2's trace
    keeps them too, but its stream replays the trace's peak reserved to the byte without (one small segment over
    with them, +1.33%: the order in which the trace frees the bottom's buffers is not followed), so they are not
    kept there."""
    return writer(ctx).kept_top


def bottom_order(ctx: Any) -> tuple[int, ...]:
    """``(1,)`` where the buffers a compiled backward keeps to the bottom are freed in the trace's order
    (``Writer.bottom_order``: autocast's), empty elsewhere (a tuple: the stream's groups are sequences)."""
    return (1,) if writer(ctx).bottom_order else ()


def weights_in_module_order(ctx: Any) -> bool:
    """Whether the stream writes the weights one tensor at a time in the module's order (``Writer.
    weights_by_param``: the compiled autocast layers', whose traces the grouped weights miss by one small segment:
    the small Llama -1.09%, Qwen3 -0.76%; +0.00% written so)."""
    return writer(ctx).weights_by_param


def compiled_steps_written(ctx: Any) -> bool:
    """A compiled step whose layers' own forward and backward buffers are written and held to their traces within
    1% (``compiled_stream_held`` in alloc_stream reads it): one of ``WRITERS`` applies (bf16 full training of the
    Llama layout and its autocast, its LoRA on q and v, Qwen3's and Gemma 3's too, OLMo 2, Gemma 3)."""
    return any(w.held and w.applies(ctx) for w in WRITERS)
