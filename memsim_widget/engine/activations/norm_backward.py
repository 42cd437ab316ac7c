"""The final RMSNorm's backward as eager autograd runs it, op by op: the buffers it makes and frees, and where it
frees the tensors the norm and the head saved.

None of them is saved, so they do not enter the engine's allocated figures (the budget keeps its ``final RMSNorm
backward (fp32)`` term), but they cut the caching allocator's segments, so the allocation stream
(``engine/counters/alloc_stream``) replays them in place of that term. At h <= 512 every one of them is 1 MiB or
less (the small pool, 2 MiB segments): the term's four equal tensors of 6 B x T x h went to the large pool, and
the step's small pool was two to three segments short of the fake-tensor trace's (the 4-layer h 256 Llama at 2 x
512 tokens: 48 against 52 MiB; ``python benchmarks/allocator_replay_small_pool.py``).

Read from transformers 5.24.0 ``models/llama/modeling_llama.py`` ``LlamaRMSNorm.forward`` (``x.to(float32)``,
``variance = x.pow(2).mean(-1, keepdim=True)``, ``x * torch.rsqrt(variance + eps)``, ``weight * x.to(dtype)``)
and torch 2.13.0's derivative formulas (``tools/autograd/derivatives.yaml``: ``mul`` -> ``grad * other`` and
``grad * self``, ``_to_copy`` -> a cast back, ``rsqrt`` -> ``-0.5 * grad * result.pow(3)``, ``mean`` -> ``grad.
expand(...) / n``, ``pow`` -> ``pow_backward``: ``grad * (exponent * self.pow(exponent - 1))``; autograd sums the
two gradients of ``x`` with an ``add``), and held op by op to the fake-tensor trace of the 4-layer Llama (b2 s512
bf16, ``tests/data/fidelity_cases.LLAMA``) in the order it lists them.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_backward import FREE_SAVED
from memsim_widget.engine.activations.forward import Step, llama_layout

#: The tensors the stream's final norm and head keep for backward, in the order ``final_norm_transients`` makes
#: them (the ``post`` items: the norm's fp32 input, its rsqrt, its 16-bit cast, the head's input): a step
#: ``FREE_SAVED + str(i)`` frees the i-th.
FP32_INPUT, RSQRT, CAST, HEAD_INPUT = range(4)
SAVED_COUNT = 4
#: The step where the head's backward node has run: the logits' gradient it read is released then.
HEAD_DONE = "head done"


def final_norm_backward_transients(ctx: Any) -> tuple[Step, ...]:
    """The final norm's backward (``model.norm``) after the head's matmuls, on a Llama-style layout
    (``forward.llama_layout``: the final norm is not checkpointed, so under checkpointing too) in 16-bit weights,
    else empty (the stream keeps the budget's term): the head's input gradient (e T h), the norm's own steps
    (``_rmsnorm``) with the saved tensors freed where autograd releases them, the gradient the norm leaves freed
    last: the gradient the top layer reads is the layers' own term (``layer_backward``)."""
    if not _applies(ctx):
        return ()
    x = _bytes(ctx)[0]
    return (
        ("gin", x),  # the head's input gradient (its mm)
        (HEAD_DONE, 0),
        (FREE_SAVED + str(HEAD_INPUT), 0),
        *_rmsnorm(ctx, "gin", (CAST, RSQRT, FP32_INPUT)),
    )


def layer_norm_backward_transients(ctx: Any) -> tuple[Step, ...]:
    """One of a layer's two RMSNorms' backward (``input_layernorm``, ``post_attention_layernorm``), where
    ``final_norm_backward_transients`` writes the final norm's, else empty: ``_rmsnorm``'s steps, the saved tensors
    left to the layer's end (where the stream frees the layer's), the gradient arriving freed by the layer."""
    if not _applies(ctx):
        return ()
    return _rmsnorm(ctx, "", ())


def _applies(ctx: Any) -> bool:
    """A Llama-style layout (``forward.llama_layout``, any checkpointing) in 16-bit weights."""
    return llama_layout(ctx) and ctx.scenario.precision != "fp32"


def _bytes(ctx: Any) -> tuple[int, int, int]:
    """(e T h, 4 T h, 4 T): a 16-bit T x h tensor, an fp32 one, an fp32 row statistic."""
    from memsim_widget.engine.activations.dims import Dims

    T, h = Dims(ctx).T, ctx.arch.hidden_size
    return 2 * T * h, 4 * T * h, 4 * T  # bf16 or fp16 weights (``_applies``)


def _rmsnorm(ctx: Any, arriving: str, saved: tuple[int, ...]) -> tuple[Step, ...]:
    """An RMSNorm's backward from the gradient of its output: the weight's mul backward (e T h each; the product
    with ``x`` only where the weight trains: not under LoRA), the cast up (4 T h), ``x * rsqrt``'s two products
    (4 T h) and the row sum (4 T), rsqrt's three T x 1 buffers, mean's ``div`` and pow's three fp32 T x h
    buffers, their ``add`` and the cast back to the layers' dtype (e T h). ``arriving``: the step name of the
    output's gradient, freed once the weight's backward has read it ('' : not the norm's to free); ``saved``:
    the 16-bit cast, the rsqrt and the fp32 input, freed where autograd releases them (empty: not freed here)."""
    x, f, t = _bytes(ctx)
    trains = ctx.scenario.method == "full"  # LoRA freezes the norm's weight: no grad * x
    free = [(FREE_SAVED + str(i), 0) for i in saved] or [("", 0)] * 3
    return tuple(
        step
        for step in (
            ("gx", x),  # weight * x: grad * weight
            *((("gw", x), ("gw", 0)) if trains else ()),  # grad * x, summed into the weight's gradient
            (arriving, 0),
            free[0],  # the 16-bit cast
            ("up", f),  # x.to(dtype)'s backward: the gradient cast up to fp32
            ("gx", 0),
            ("a", f),  # x * rsqrt: grad * rsqrt
            ("b", f),  # grad * x, summed over h for rsqrt's gradient
            ("s", t),
            ("b", 0),
            ("up", 0),
            ("p", t),  # rsqrt's backward: result.pow(3), two products
            ("m1", t),
            ("m2", t),
            ("m1", 0),
            ("p", 0),
            ("s", 0),
            free[1],  # the rsqrt
            ("div", f),  # mean's backward
            ("m2", 0),
            ("pw", f),  # pow's backward: self.pow(1), two products
            ("pm1", f),
            ("pm2", f),
            ("pm1", 0),
            ("pw", 0),
            ("div", 0),
            free[2],  # the fp32 input
            ("add", f),  # the two gradients of the fp32 input summed
            ("a", 0),
            ("pm2", 0),
            ("down", x),  # x.to(float32)'s backward: the gradient cast back
            ("add", 0),
            ("down", 0),
        )
        if step[0]
    )
