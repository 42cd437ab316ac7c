"""The buffers a compiled Gemma 3 (text) layer makes and frees, forward and backward, in the order the compiled
fake-tensor trace makes them (trace/compiled.py under ``inductor_passes``; read op by op on ``gemma3_text bf16 sdpa
b2 s512 compiled`` of tests/data/fidelity_cases.py; ``python benchmarks/allocator_replay_compiled.py
--inductor-passes -k gemma3``).

Gemma 3 (transformers ``models/gemma3/modeling_gemma3.py``: ``Gemma3DecoderLayer.forward`` runs
``input_layernorm``, attention, ``post_attention_layernorm``, the residual sum, ``pre_feedforward_layernorm``, the
MLP, ``post_feedforward_layernorm``, the residual sum; ``Gemma3Attention`` normalises q and k per head) makes no
buffer in its forward but the norms' fp32 means of squares: every projection's output is saved. In its backward,
as in OLMo 2's (``compiled_olmo2_steps``), the residual gradient is a pointwise sum Inductor computes inside the
kernels that read it: the pre-norms' backward writes only their row sums, and every layer's input gradients
(up_proj's, gate_proj's, v_proj's, k_proj's, q_proj's), those row sums and what the pre-norms' backward reads (the
layer's input and the residual after attention, their rsqrts) live until the kernel at the bottom that writes the
embedding's gradient (``KEEP`` and ``KEEP_SAVED`` steps). The norms after attention and the MLP write their input's
gradient as OLMo 2's do.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled import compiled_rule_applies, gemma3_layout
from memsim_widget.engine.activations.compiled_backward import FREE_SAVED, GRADS, _rope_backward
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED, _norm_backward
from memsim_widget.engine.activations.forward import SAVED, Step


def compiled_gemma3_applies(ctx: Any) -> bool:
    """Whether these steps describe the layers of ``ctx``: a compiled Gemma 3 step of the traced rule in bf16 full
    training, no checkpointing (``compiled.gemma3_layout``)."""
    return compiled_rule_applies(ctx.scenario, ctx.arch) and gemma3_layout(ctx)


def _free(i: int) -> Step:
    """Free the layer's saved tensor ``i``: 0 the layer's input, 1 its norm's rsqrt, 2 that norm's output, 3 to 5
    q_proj's, k_proj's and v_proj's outputs, 6 and 7 q's and k's norm rsqrts, 8 and 9 q and k after RoPE, 10 the
    attention output, 11 the logsumexp, 12 o_proj's output, 13 its norm's rsqrt, 14 the residual after attention,
    15 its norm's rsqrt, 16 that norm's output, 17 to 19 gate's, up's outputs and their product, 20 down_proj's
    output, 21 its norm's rsqrt."""
    return (f"{FREE_SAVED}{i}", 0)


def _keep(i: int) -> Step:
    """Keep the layer's saved tensor ``i`` until the bottom layer's backward is done (``KEEP_SAVED``)."""
    return (f"{KEEP_SAVED}{i}", 0)


def _grad(i: int) -> Step:
    """Make the gradient of the layer's parameter ``i`` (q 0, k 1, v 2, o 3, gate 4, up 5, down 6, the norms:
    input 7, after attention 8, before the MLP 9, after it 10, q's 11, k's 12)."""
    return (f"{GRADS}{i}", 0)


def compiled_gemma3_forward(ctx: Any) -> tuple[Step, ...]:
    """One compiled Gemma 3 layer's forward buffers and saved terms in order (``forward.Step``)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    m = 4 * D.T

    def norm(rows: int) -> tuple[Step, ...]:
        return (("mean", m * rows), (SAVED, 1), ("mean", 0))

    return (
        (SAVED, 1), *norm(1), (SAVED, 1), *norm(D.a), *norm(D.kv), (SAVED, 1), *norm(1), (SAVED, 1), *norm(1),
        (SAVED, 1), *norm(1),
    )  # fmt: skip


def compiled_gemma3_backward(ctx: Any) -> tuple[Step, ...]:
    """One compiled Gemma 3 layer's backward buffers in order (``compiled_backward``'s steps)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, ctx.recipe.act_bytes
    q, kv, d = e * T * D.hq, e * T * D.hkv, D.hq // max(D.a, 1)
    mlp: tuple[Step, ...] = (
        *_norm_backward(4 * h, 10, T, "g", e * T * h, (21, 20)),
        _grad(6), _free(19), ("di", e * T * I), ("g", 0), ("dm", e * T * I), _grad(5), (f"{KEEP}du", e * T * h),
        ("dm", 0), ("dg", e * T * I), ("di", 0), _free(17), _free(18), _grad(4), _free(16), (f"{KEEP}dx", e * T * h),
        ("dg", 0),
        ("w", 4 * h), _grad(9), ("w", 0), (f"{KEEP}s", 4 * T), _keep(15), _keep(14),
    )  # fmt: skip
    attn: tuple[Step, ...] = (
        *_norm_backward(4 * h, 8, T, "g2", e * T * h, (13, 12)),
        _grad(3), ("do", q), ("g2", 0), ("dq", q), ("dk", kv), ("dv", kv), *(_free(i) for i in (5, 8, 9, 10, 11)),
        ("do", 0), *_rope_backward("k", kv), *_rope_backward("q", q),
        ("w", 4 * d), _grad(12), ("w", 0), ("sk", 4 * T * D.kv), ("w", 4 * d), _grad(11), ("w", 0),
        ("sq", 4 * T * D.a),
        ("cv", kv), ("dv", 0), _grad(2), (f"{KEEP}xv", e * T * h), ("cv", 0),
        ("ck", kv), _free(7), ("dk", 0), ("k1", 0), ("k2", 0), _free(4), ("sk", 0), _grad(1),
        (f"{KEEP}xk", e * T * h), ("ck", 0),
        ("cq", q), _free(6), ("dq", 0), ("q1", 0), ("q2", 0), _free(3), ("sq", 0), _grad(0), _free(2),
        (f"{KEEP}xq", e * T * h), ("cq", 0),
        ("w", 4 * h), _grad(7), ("w", 0), (f"{KEEP}s", 4 * T), _keep(1), _keep(0),
    )  # fmt: skip
    return mlp + attn
