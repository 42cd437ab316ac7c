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

Where the trace differs layer by layer, the stream follows it: layer 0 saves o_proj's 16-bit output for the
residual after attention (``compiled_amp_first``); the bottom layer frees RoPE's two shared zero buffers at their
last use and the kernel at the bottom writes an fp32 sum of the residual gradient (``compiled_amp_bottom``), then
frees what was kept in the trace's order (``alloc_stream._bottom_freed``); down_proj's output is freed after the
next layer's input (``LATER``); the final norm's fp32 mean comes and goes around its rsqrt (``compiled_amp_final``).
Qwen2's q/k/v biases' 16-bit copies live around their matmuls, and their gradients are 16-bit sums cast to fp32;
Qwen3's q/k norms save their inputs and rsqrts, and RoPE's backward runs in fp32 after them. With the weights
written one tensor at a time in the module's order (``compiled_steps.weights_in_module_order``) the stream
replays the traces' peak reserved to the byte on the small Llama, Qwen2, the 64-token Llama and Qwen3.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled import amp_layout, compiled_rule_applies
from memsim_widget.engine.activations.compiled_backward import (
    CONSTANT,
    FREE_SAVED,
    GRADS,
    RELEASE,
    TANGENT,
    _rope_backward,
)
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED, LATE
from memsim_widget.engine.activations.forward import HELD, LATER, SAVED, SAVED_BYTES, Step

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
    return compiled_rule_applies(ctx.scenario, ctx.arch) and amp_layout(ctx)


def places(ctx: Any) -> dict[str, int]:
    """Each saved tensor's place among the layer's (``FREE_SAVED``'s index), Qwen3's q/k norms' among them."""
    names: list[str] = list(PLACES)
    if ctx.arch.facts.norm.qk == "head":
        names[4:4] = QK_PLACES[0]
        names[names.index("wk") + 1 : names.index("wk") + 1] = QK_PLACES[1]
    return {n: i for i, n in enumerate(names)}


def compiled_amp_first(ctx: Any) -> tuple[Step, ...]:
    """Layer 0's forward: o_proj's 16-bit output saved in place of the fp32 residual after attention."""
    return compiled_amp_forward(ctx, first=True)


def params(ctx: Any) -> dict[str, int]:
    """Each of the layer's parameters' place among its gradients (``GRADS``' index: the layer's parameters in
    order, ``grad_order``'s), by module (a bias, Qwen2's q/k/v ones, as ``<module> bias``; the norms as ``norm 0``,
    ``norm 1``)."""
    out: dict[str, int] = {}
    last, norms = "", 0
    for i, g in enumerate(x for x in ctx.arch.params if x.scope == "layer"):
        if g.module:
            last = g.module
            out[g.module] = i
        elif g.kind == "norm":
            out[f"norm {norms}"] = i
            norms += 1
        elif last:
            out[f"{last} bias"] = i
    return out


def _bias(ctx: Any, module: str, n: int) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """A bias's 16-bit copy for one matmul (``n`` output features): made before the weight's copy, freed after the
    matmul; none without a bias."""
    if f"{module} bias" not in params(ctx):
        return (), ()
    return (("b", 2 * n),), (("b", 0),)


def compiled_amp_forward(ctx: Any, first: bool = False) -> tuple[Step, ...]:
    """One compiled autocast layer's forward buffers and saved terms in order (``forward.Step``; ``HELD``: held
    until the forward ends); ``first``: layer 0's, which saves o_proj's 16-bit output instead of the fp32 residual
    after attention (each its own size: ``SAVED_BYTES``). Each q/k/v bias's 16-bit copy (Qwen2) lives around its
    matmul."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, e = D.T, D.h, 2
    q, kv = e * T * D.hq, e * T * D.hkv
    head = ctx.arch.facts.norm.qk == "head"
    mean = 4 * T
    resid: tuple[Step, ...] = (
        ((SAVED_BYTES, e * T * h),) if first else (("o", e * T * h), (SAVED_BYTES, 4 * T * h), ("o", 0))
    )
    b = [_bias(ctx, m, n) for m, n in (("q_proj", D.hq), ("k_proj", D.hkv), ("v_proj", D.hkv))]
    qn: tuple[Step, ...] = ((SAVED, 1), ("qm", 4 * T * D.a), (SAVED, 1), ("qm", 0)) if head else (("q", q),)
    kn: tuple[Step, ...] = ((SAVED, 1), ("km", 4 * T * D.kv), (SAVED, 1), ("km", 0)) if head else (("k", kv),)
    return (
        (SAVED, 1), ("mean", mean), (SAVED, 1), ("mean", 0), *b[0][0], (SAVED, 1), *qn, *b[0][1],
        *b[1][0], (SAVED, 1), *kn, *b[1][1], *b[2][0], (SAVED, 1), *b[2][1],
        (f"{HELD}kf", 4 * T * D.hkv), *(() if head else (("k", 0),)), (SAVED, 1), *(() if head else (("q", 0),)),
        (SAVED, 1), *resid, ("mean", mean), (SAVED, 1), ("mean", 0), (SAVED, 1),
        ("down", e * T * h), (f"{LATER}down", 0),
    )  # fmt: skip


def compiled_amp_backward(ctx: Any) -> tuple[Step, ...]:
    """One compiled autocast layer's backward buffers in order (``compiled_backward``'s steps, ``KEEP``: kept to
    the bottom). A projection's weight gradient is made in 16 bits (``w16``) and cast to the fp32 parameter's
    gradient; with a bias (Qwen2's q, k, v) the input gradient comes first, then the weight's and the bias's
    16-bit sums, each cast to fp32 (the trace's order)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, 2
    q, kv = e * T * D.hq, e * T * D.hkv
    p, w = places(ctx), params(ctx)

    def free(*names: str) -> tuple[Step, ...]:
        return tuple((f"{FREE_SAVED}{p[n]}", 0) for n in names)

    def grad(module: str) -> Step:
        return (f"{GRADS}{w[module]}", 0)

    def proj(m: str, c: str, n: int, out: int, x: str, then: tuple[str, ...] = ()) -> tuple[Step, ...]:
        """A q/k/v projection's backward from its gradient's copy ``c``: its 16-bit weight gradient (``n``
        elements), its input gradient ``x`` kept, its weight copy freed, the fp32 gradients."""
        if f"{m} bias" in w:
            return (
                (f"{KEEP}{x}", e * T * h), *free(f"w{m[0]}"), ("w16", e * n), *free(*then), ("b16", e * out),
                (c, 0), grad(m), ("w16", 0), grad(f"{m} bias"), ("b16", 0),
            )  # fmt: skip
        return (
            ("w16", e * n), *free(*then), (f"{KEEP}{x}", e * T * h), *free(f"w{m[0]}"), (c, 0), grad(m),
            ("w16", 0),
        )  # fmt: skip

    mlp: tuple[Step, ...] = (
        ("g", e * T * h), ("w16", e * h * I), *free("prod"), ("di", e * T * I), *free("wd"), ("g", 0),
        grad("down_proj"), ("w16", 0),
        ("dm", e * T * I), ("w16", e * h * I), (f"{KEEP}du", e * T * h), *free("wu"), ("dm", 0), grad("up_proj"),
        ("w16", 0),
        ("dg", e * T * I), ("di", 0), *free("gate", "up"), ("w16", e * h * I), *free("mnormed"),
        (f"{KEEP}dx", e * T * h), *free("wg"), ("dg", 0), grad("gate_proj"), ("w16", 0),
        grad("norm 1"), (f"{KEEP}s", 4 * T),
    )  # fmt: skip
    head = ctx.arch.facts.norm.qk == "head"
    r = 4 if head else e  # RoPE's backward: fp32 after Qwen3's norms (an fp32 weight times a 16-bit input)

    def norm(x: str, heads: int, param: str, n: int) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
        """Qwen3's per-head norm's backward around the copy of d``x``: its weight's fp32 sum and row sum before,
        its rsqrt and input freed after."""
        if not head:
            return (), ()
        return (grad(param), (f"s{x}", 4 * T * heads)), (*free(f"{x}n"), (f"s{x}", 0))

    (kb, ka), (qb, qa) = norm("k", D.kv, "norm 3", kv), norm("q", D.a, "norm 2", q)
    kr, qr = (
        ((f"{FREE_SAVED}{p['kr']}", 0),) if head else (),
        ((f"{FREE_SAVED}{p['qr']}", 0),) if head else (),
    )
    attn: tuple[Step, ...] = (
        ("g2", e * T * h), ("w16", e * D.hq * h), ("do", q), *free("wo"), ("g2", 0), grad("o_proj"), ("w16", 0),
        ("dq", q), ("dk", kv), ("dv", kv), *free("v", "k", "q", "attn", "lse"), ("do", 0),
        *_rope_backward("k", r * T * D.hkv), *_rope_backward("q", r * T * D.hq),
        ("cv", kv), (TANGENT, 0), ("dv", 0), *proj("v_proj", "cv", h * D.hkv, D.hkv, "xv"),
        *kb, ("ck", kv), *kr, (TANGENT, 0), ("dk", 0), ("k1", 0), ("k2", 0), *ka,
        *proj("k_proj", "ck", h * D.hkv, D.hkv, "xk"),
        *qb, ("cq", q), *qr, ("dq", 0), ("q1", 0), ("q2", 0), *qa,
        *proj("q_proj", "cq", h * D.hq, D.hq, "xq", ("normed",)),
        grad("norm 0"), (f"{KEEP}s", 4 * T),
        *((f"{KEEP_SAVED}{p[n]}", 0) for n in ("rsqrt2", "resid", "rsqrt", "input")),
    )  # fmt: skip
    return mlp + attn


def compiled_amp_bottom(ctx: Any) -> tuple[Step, ...]:
    """The bottom layer's backward: a layer's, o_proj's 16-bit output (what layer 0 saves for the residual after
    attention) kept ``LATE``, RoPE's two zero buffers freed once its scatters are made (their last use), then the
    fp32 sum of the residual gradient the kernel at the bottom writes (4 B x T x h, the embedding's
    output gradient), freed with the kept buffers."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    resid = f"{KEEP_SAVED}{places(ctx)['resid']}"
    out: list[Step] = []
    for name, size in compiled_amp_backward(ctx):
        if name == resid:  # o_proj's 16-bit output: freed among the gradients, after the MLP's
            continue
        out.append((name, size))
        if name in ("k2", "q2") and size > 0:
            out.append((f"{RELEASE}{CONSTANT}{name[0]}", 0))
        if name == f"{KEEP}dx":
            out.append((f"{resid}{LATE}", 0))
    return (*out, (f"{KEEP}sum", 4 * D.T * D.h))


def compiled_amp_final(ctx: Any) -> tuple[Step, ...]:
    """The final norm's forward: the last layer's output (its first saved term), the norm's fp32 mean made and
    freed around its rsqrt, then the head's weight copy and the norm's output (``compiled._amp_terms``' post)."""
    from memsim_widget.engine.activations.dims import Dims

    mean = 4 * Dims(ctx).T
    return ((SAVED, 1), ("mean", mean), (SAVED, 1), ("mean", 0), (SAVED, -1))
