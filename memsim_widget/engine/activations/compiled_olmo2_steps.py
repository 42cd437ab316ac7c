"""The buffers a compiled OLMo 2 layer makes and frees, forward and backward, in the order the compiled fake-tensor
trace makes them (trace/compiled.py under ``inductor_passes``; read op by op on ``olmo2 bf16 sdpa b2 s512
compiled`` of tests/data/fidelity_cases.py; ``python benchmarks/allocator_replay_compiled.py --inductor-passes -k
olmo2``).

OLMo 2 (transformers ``models/olmo2/modeling_olmo2.py``: ``Olmo2DecoderLayer.forward`` normalises the attention's
and the MLP's outputs, ``residual + post_attention_layernorm(attn)``, no norm before them; ``Olmo2Attention``
normalises q_proj's and k_proj's whole outputs) has no norm on the residual stream, so nothing in its backward
reduces the residual gradient: Inductor keeps that gradient as a pointwise sum, computed inside the kernels that
read it, and every term of the sum, each layer's input gradients of up_proj, gate_proj, v_proj, k_proj and q_proj
(e T h each), lives until the kernel at the bottom that writes the embedding's gradient (``KEEP`` steps). With e
the dtype's bytes, T tokens, per layer:

- forward: each norm's fp32 mean of squares (four: q's, k's, after attention, after the MLP); the layer's saved
  terms between them, in the order ``compiled._olmo2_terms`` lists them (the layer's input first);
- backward: per norm its weight's fp32 gradient sum, its row sum and the gradient of its input (e bytes), freeing
  its input and rsqrt; the MLP's input gradients as the full step's (compiled_backward.py); o_proj's, SDPA's and
  RoPE's as the full step's; v's contiguous copy; each projection's weight gradient where the trace makes it.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled import compiled_rule_applies, olmo2_layout
from memsim_widget.engine.activations.compiled_backward import FREE_SAVED, GRADS, _rope_backward
from memsim_widget.engine.activations.forward import SAVED, Step

#: The prefix of a backward step that allocates a buffer kept until the bottom layer's backward is done (freed
#: with the ``CONSTANT`` buffers): a term of the residual gradient Inductor never sums per layer.
KEEP = "keep "
#: The prefix of a backward step that keeps one of the layer's saved tensors (by its place, as ``FREE_SAVED``)
#: until the bottom layer's backward is done: what the unreduced residual gradient's kernel at the bottom reads.
KEEP_SAVED = "keep saved "
#: The suffix of a ``KEEP_SAVED`` step whose tensor the kernel at the bottom frees among the kept gradients, where
#: the step stands (``alloc_stream._bottom_freed``; a compiled autocast layer 0's o_proj output).
LATE = " late"


def compiled_olmo2_applies(ctx: Any) -> bool:
    """Whether these steps describe the layers of ``ctx``: a compiled OLMo 2 step of the traced rule
    (``compiled.compiled_rule_applies``) in bf16 full training, no checkpointing (post-norms in the weights'
    16-bit dtype, q/k norms over the whole projection)."""
    return compiled_rule_applies(ctx.scenario, ctx.arch) and olmo2_layout(ctx)


def _saved(n: int) -> Step:
    """Make the next ``n`` of the layer's saved terms (``SAVED``)."""
    return (SAVED, n)


def _free(i: int) -> Step:
    """Free the layer's saved tensor ``i``: 0 the layer's input, 1 q_proj's output, 2 its rsqrt, 3 k_proj's output, 4
    its rsqrt, 5 v, 6 q after RoPE, 7 k after RoPE, 8 the attention output, 9 the logsumexp, 10 o_proj's output, 11
    its norm's rsqrt, 12 the residual after attention, 13 to 15 gate's, up's outputs and their product, 16
    down_proj's output, 17 its norm's rsqrt."""
    return (f"{FREE_SAVED}{i}", 0)


def _grad(i: int) -> Step:
    """Make the gradient of the layer's parameter ``i`` (q 0, k 1, v 2, o 3, gate 4, up 5, down 6, the norm after
    attention 7, after the MLP 8, q's norm 9, k's norm 10)."""
    return (f"{GRADS}{i}", 0)


def compiled_olmo2_forward(ctx: Any) -> tuple[Step, ...]:
    """One compiled OLMo 2 layer's forward buffers and saved terms in order (``forward.Step``)."""
    from memsim_widget.engine.activations.dims import Dims

    mean = 4 * Dims(ctx).T
    return (
        _saved(1), ("mean", mean), _saved(1), ("mean", 0), _saved(1), ("mean", mean), _saved(1), ("mean", 0),
        _saved(1), ("mean", mean), _saved(1), ("mean", 0), _saved(1), ("mean", mean), _saved(1), ("mean", 0),
    )  # fmt: skip


def _norm_backward(w: int, param: int, T: int, grad: str, n: int, frees: tuple[int, ...]) -> tuple[Step, ...]:
    """A norm's backward: its weight's fp32 gradient sum (``w`` bytes; 0: a frozen weight, LoRA's, none), the
    16-bit gradient, its row sum, the gradient of its input (``grad``, ``n`` bytes), its rsqrt and input freed."""
    weight: tuple[Step, ...] = (("w", w), _grad(param), ("w", 0)) if w else ()
    return (*weight, ("s", 4 * T), (grad, n), *(_free(i) for i in frees), ("s", 0))


def compiled_olmo2_backward(ctx: Any) -> tuple[Step, ...]:
    """One compiled OLMo 2 layer's backward buffers in order (``compiled_backward``'s steps, ``KEEP``: kept to the
    bottom)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, ctx.recipe.act_bytes
    q, kv = e * T * D.hq, e * T * D.hkv
    mlp: tuple[Step, ...] = (
        *_norm_backward(4 * h, 8, T, "g", e * T * h, (17, 16)),
        _grad(6), _free(15), ("di", e * T * I), ("g", 0), ("dm", e * T * I), _grad(5), (f"{KEEP}du", e * T * h),
        ("dm", 0), ("dg", e * T * I), ("di", 0), _free(13), _free(14), _grad(4), _free(12), (f"{KEEP}dx", e * T * h),
        ("dg", 0),
    )  # fmt: skip
    attn: tuple[Step, ...] = (
        *_norm_backward(4 * h, 7, T, "g2", e * T * h, (11, 10)),
        _grad(3), ("do", q), ("g2", 0), ("dq", q), ("dk", kv), ("dv", kv), *(_free(i) for i in (5, 6, 7, 8, 9)),
        ("do", 0), *_rope_backward("k", kv), *_rope_backward("q", q),
        ("cv", kv), ("dv", 0), _grad(2), (f"{KEEP}xv", e * T * h), ("cv", 0),
        *_norm_backward(4 * D.hkv, 10, T, "ck", kv, (4,)),
        ("dk", 0), ("k1", 0), ("k2", 0), _free(3), _grad(1), (f"{KEEP}xk", e * T * h), ("ck", 0),
        *_norm_backward(4 * D.hq, 9, T, "cq", q, (2,)),
        ("dq", 0), ("q1", 0), ("q2", 0), _free(1), _grad(0), _free(0), (f"{KEEP}xq", e * T * h), ("cq", 0),
    )  # fmt: skip
    return mlp + attn
