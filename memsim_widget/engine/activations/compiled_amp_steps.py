"""The buffers a compiled Llama-layout layer under autocast (amp-bf16) makes and frees, forward and backward, in the
order the compiled fake-tensor trace makes them (trace/compiled.py under ``inductor_passes``; read op by op on
``llama amp-bf16 sdpa b2 s512 compiled`` of tests/data/fidelity_cases.py; ``python benchmarks/
allocator_replay_compiled.py --inductor-passes -k amp``).

Under autocast the weights and the residual stream are fp32 and every matmul runs on 16-bit copies: the forward
saves each Linear weight's 16-bit copy (``compiled._amp_terms`` lists the saved tensors in the trace's order) and
makes, besides the norms' fp32 means, q_proj's and k_proj's outputs (read by the fused RoPE), RoPE's fp32 k (the
returned KV cache's k, held until the forward ends: ``HELD``), o_proj's output where the layer saves the fp32
residual after attention, and down_proj's output. In its backward, as in Gemma 3's (``compiled_gemma3_steps``),
the pre-norms' backward writes only a 16-bit gradient for the projections and a row sum: the fp32 residual
gradient is a pointwise sum Inductor computes inside the kernels that read it, so every layer's input gradients
(up_proj's, gate_proj's, v_proj's, k_proj's, q_proj's), its two row sums and what the kernel at the bottom reads
(the layer's input, the residual after attention, their rsqrts) live until the bottom (``KEEP``, ``KEEP_SAVED``).
Each weight gradient is made in 16 bits (a T-sized matmul's output) and cast to the fp32 parameter's gradient;
each 16-bit weight copy is freed once its input gradient is made; the norms' weight gradients are fp32 sums.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled import amp_layout, compiled_rule_applies
from memsim_widget.engine.activations.compiled_backward import FREE_SAVED, GRADS, TANGENT, _rope_backward
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED
from memsim_widget.engine.activations.forward import HELD, SAVED, Step

#: The layer's saved tensors in order (``compiled._amp_terms``' terms' tensors), without Qwen3's q/k norms.
PLACES = (
    "input", "rsqrt", "wq", "normed", "wk", "wv", "v", "k", "q", "attn", "lse", "wo", "resid", "rsqrt2", "wg",
    "mnormed", "gate", "wu", "up", "prod", "wd",
)  # fmt: skip
#: Qwen3's q/k norms' saved tensors and where they go among ``PLACES``: after the input norm's output and after
#: k_proj's weight copy.
QK_PLACES = (("qn", "qr"), ("kn", "kr"))


def compiled_amp_applies(ctx: Any) -> bool:
    """Whether these steps describe the layers of ``ctx``: a compiled step of the traced rule under autocast, the
    Llama layout (``compiled.amp_layout``), full training, no checkpointing."""
    return (
        compiled_rule_applies(ctx.scenario, ctx.arch) and amp_layout(ctx) and ctx.arch.facts.norm.qk is None
    )


def places(ctx: Any) -> dict[str, int]:
    """Each saved tensor's place among the layer's (``FREE_SAVED``'s index), Qwen3's q/k norms' among them."""
    names: list[str] = list(PLACES)
    if ctx.arch.facts.norm.qk == "head":
        names[4:4] = QK_PLACES[0]
        names[names.index("wk") + 1 : names.index("wk") + 1] = QK_PLACES[1]
    return {n: i for i, n in enumerate(names)}


def compiled_amp_forward(ctx: Any) -> tuple[Step, ...]:
    """One compiled autocast layer's forward buffers and saved terms in order (``forward.Step``; ``HELD``: held
    until the forward ends)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, e = D.T, D.h, 2
    q, kv = e * T * D.hq, e * T * D.hkv
    head = ctx.arch.facts.norm.qk == "head"
    mean = 4 * T
    qn: tuple[Step, ...] = (("qm", 4 * T * D.a), (SAVED, 1), ("qm", 0)) if head else (("q", q),)
    kn: tuple[Step, ...] = (("km", 4 * T * D.kv), (SAVED, 1), ("km", 0)) if head else (("k", kv),)
    return (
        (SAVED, 1), ("mean", mean), (SAVED, 1), ("mean", 0), (SAVED, 1), *qn, (SAVED, 1), *kn, (SAVED, 1),
        (f"{HELD}kf", 4 * T * D.hkv), *(() if head else (("k", 0),)), (SAVED, 1), *(() if head else (("q", 0),)),
        (SAVED, 1), ("o", e * T * h), (SAVED, 1), ("o", 0), ("mean", mean), (SAVED, 1), ("mean", 0), (SAVED, 1),
        ("down", e * T * h), ("down", 0),
    )  # fmt: skip


def compiled_amp_backward(ctx: Any) -> tuple[Step, ...]:
    """One compiled autocast layer's backward buffers in order (``compiled_backward``'s steps, ``KEEP``: kept to
    the bottom)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, 2
    q, kv = e * T * D.hq, e * T * D.hkv
    p = places(ctx)

    def free(*names: str) -> tuple[Step, ...]:
        return tuple((f"{FREE_SAVED}{p[n]}", 0) for n in names)

    def wgrad(param: int, n: int) -> tuple[Step, ...]:  # the 16-bit weight gradient, then the fp32 one
        return (("w16", e * n),)

    def cast(param: int) -> tuple[Step, ...]:
        return ((f"{GRADS}{param}", 0), ("w16", 0))

    mlp: tuple[Step, ...] = (
        ("g", e * T * h), *wgrad(6, h * I), *free("prod"), ("di", e * T * I), *free("wd"), ("g", 0), *cast(6),
        ("dm", e * T * I), *wgrad(5, h * I), (f"{KEEP}du", e * T * h), *free("wu"), ("dm", 0), *cast(5),
        ("dg", e * T * I), ("di", 0), *free("gate", "up"), *wgrad(4, h * I), *free("mnormed"),
        (f"{KEEP}dx", e * T * h), *free("wg"), ("dg", 0), *cast(4),
        (f"{GRADS}8", 0), (f"{KEEP}s", 4 * T),
    )  # fmt: skip
    attn: tuple[Step, ...] = (
        ("g2", e * T * h), *wgrad(3, D.hq * h), ("do", q), *free("wo"), ("g2", 0), *cast(3),
        ("dq", q), ("dk", kv), ("dv", kv), *free("v", "k", "q", "attn", "lse"), ("do", 0),
        *_rope_backward("k", kv), *_rope_backward("q", q),
        ("cv", kv), (TANGENT, 0), ("dv", 0), *wgrad(2, h * D.hkv), (f"{KEEP}xv", e * T * h), *free("wv"), ("cv", 0), *cast(2),
        ("ck", kv), (TANGENT, 0), ("dk", 0), ("k1", 0), ("k2", 0), *wgrad(1, h * D.hkv), (f"{KEEP}xk", e * T * h), *free("wk"),
        ("ck", 0), *cast(1),
        ("cq", q), ("dq", 0), ("q1", 0), ("q2", 0), *wgrad(0, h * D.hq), *free("normed"), (f"{KEEP}xq", e * T * h),
        *free("wq"), ("cq", 0), *cast(0),
        (f"{GRADS}7", 0), (f"{KEEP}s", 4 * T),
        *((f"{KEEP_SAVED}{p[n]}", 0) for n in ("resid", "rsqrt2", "input", "rsqrt")),
    )  # fmt: skip
    return mlp + attn
