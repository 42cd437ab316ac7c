"""The buffers a compiled Llama-layout layer with peft's LoRA on q_proj and v_proj makes and frees, forward and
backward, in the order the compiled fake-tensor trace makes them (trace/compiled.py under ``inductor_passes``;
read op by op on ``llama bf16 lora qv b2 s512 compiled`` of tests/data/fidelity_cases.py; ``python
benchmarks/allocator_replay_compiled.py --inductor-passes -k lora``).

None is saved, so they do not enter the engine's allocated figures, but they cut the caching allocator's segments,
so the allocation stream (``engine/counters/alloc_stream``) replays them. The frozen base weights need no
gradient, so the backward makes only input gradients and the four adapters' weight gradients. With e the
activations' bytes, T tokens, fp32 adapters (peft casts the adapter's input to their dtype, ``tuners/lora/layer.py``
``Linear.forward``) of rank r, per layer:

- forward: the attention norm's fp32 mean of squares and its 16-bit output (read by q_proj, k_proj, v_proj and,
  cast to fp32, by the two lora_A), q_proj's base output and its fp32 lora_B output (summed into q by the fused
  RoPE), k_proj's and v_proj's base outputs, v's fp32 lora_B output, o_proj's output (summed into the residual),
  the MLP norm's mean of squares and output, down_proj's input (the SwiGLU product: down_proj's weight is frozen, so
  the product is not saved) and output; the saved tensors go in between where ``SAVED`` steps say
  (``compiled._lora_qv_activations`` lists them in this order);
- backward, the MLP: as the full step's (engine/activations/compiled_backward.py) without weight gradients, the
  layer's output (the final norm's or the layer above's input) freed first;
- backward, the attention: o_proj's input gradient, SDPA's dq, dk, dv, RoPE's backward for k then q (into the
  shared zero buffers), then v: dv with its tangent (16-bit), dv times the LoRA scaling in fp32, lora_B's and
  lora_A's weight gradients, lora_A's output gradient (fp32 T x r), its input gradient (fp32 T x h) and v_proj's
  (e T h); k: dk as a contiguous copy and k_proj's input gradient; q as v, lora_A's input now the saved fp32 cast of
  the norm's output, freed there; the input norm's row sum and the residual gradient. Each layer's KV cache's zero
  gradients are freed where dv's product and dk's copy are made (``TANGENT``), RoPE's zero buffer for q where layer
  0's last scatter has read it (``RELEASE``).

With q/k norms per head (read op by op on ``qwen3 bf16 lora qv b2 s512 compiled`` and ``gemma3_text bf16 lora qv
b2 s512 compiled``; ``-k "qwen3 bf16 lora" "gemma3_text bf16 lora"``) the norm reads q_proj's whole output, the
frozen base's plus the adapter's (peft 0.21.2 ``Linear.forward`` adds ``lora_B(lora_A(x)) * scaling`` to the base
result; transformers 5.24.0 ``Qwen3Attention.forward`` normalises ``self.q_proj(...)`` and ``self.k_proj(...)`` as
each is made, ``Gemma3Attention.forward`` after all three projections), so the forward makes q's 16-bit sum, the
q norm's saved input, and frees the two parts; each norm saves its input and fp32 rsqrt around its fp32 mean
(Qwen3's before v_proj runs, Gemma 3's after), layer 0's k norm nothing (its k_proj output and mean live until
RoPE has read them: ``compiled_lora_first``). The backward makes each norm's fp32 row sum before its gradient's
copy (Gemma 3's both after RoPE's backward) and frees its input and rsqrt there; RoPE's backward stays in the
activations' dtype (the norm weights are frozen: no fp32 product as under autocast). Gemma 3's norms after
attention and the MLP save o_proj's and down_proj's outputs and rsqrts and write their input's gradient in the
backward (``compiled_gemma3_steps``' order), and its residual gradient is its full step's unreduced sum: the
layers' input gradients (lora_A's fp32 one too), the pre-norms' row sums, the residuals and the layer outputs with
their rsqrts are kept until layer 0's norm after attention has run (``RELEASE`` + ``KEEP``: no gradient flows
below it), the head's input gradient with them (``compiled_steps.kept_top``).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_backward import (
    CONSTANT,
    FREE_SAVED,
    GRADS,
    RELEASE,
    TANGENT,
    _rope_backward,
)
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED, _norm_backward
from memsim_widget.engine.activations.forward import SAVED, SAVED_AT, Step

#: The layer's saved tensors in order (``compiled._lora_qv_activations``' terms' tensors): the input norm's rsqrt,
#: its output cast to fp32, lora_A's outputs of q and v, v, q and k after RoPE, the attention output, the
#: logsumexp, the residual after attention, the MLP norm's rsqrt, gate's and up's outputs, the residual stream the
#: layer outputs (freed, or kept, as its backward starts: the trace frees it in the final norm's or the layer
#: above's backward).
PLACES = ("rsqrt", "cast", "Aq", "Av", "v", "q", "k", "attn", "lse", "resid", "rsqrt2", "gate", "up", "out")
#: Gemma 3's norms after attention and the MLP (``compiled.sandwich_norm_tensors``): o_proj's output, its rsqrt,
#: down_proj's output, its rsqrt; then the q/k norms' (``compiled.qk_norm_tensors``): q's input and rsqrt, k's,
#: which layer 0 does not save (the last places, so the others keep theirs there).
SANDWICH = ("o", "orsqrt", "down", "drsqrt")
QK = ("qn", "qr", "kn", "kr")


def _norms(ctx: Any) -> tuple[bool, bool]:
    """(per-head q/k norms: Qwen3, Gemma 3; norms after attention and the MLP: Gemma 3)."""
    nf = ctx.arch.facts.norm
    return nf.qk == "head", nf.per_layer == 4


def compiled_lora_applies(ctx: Any) -> bool:
    """Whether these steps describe the layers of ``ctx``: a compiled step of the traced rule
    (``compiled.compiled_rule_applies``: peft's default LoRA on q and v, fp32 adapters, a bf16 model) with the
    Llama layout's norms (two RMSNorms a layer: Llama, Mistral, Qwen2, Gemma), with Qwen3's per-head q/k norms, or
    Gemma 3's four norms a layer and q/k norms (no post-norms in 16 bits), no checkpointing."""
    from memsim_widget.engine.activations.compiled import compiled_rule_applies
    from memsim_widget.engine.activations.compiled_layernorm import layernorm_rule_applies

    a, sc = ctx.arch, ctx.scenario
    nf = a.facts.norm
    return (
        sc.method == "lora"
        and compiled_rule_applies(sc, a)
        and not layernorm_rule_applies(sc, a)
        and a.norm == "rmsnorm"
        and sc.activation_checkpointing == "none"
        and (nf.per_layer, nf.post_norms, nf.qk) in ((2, False, None), (2, False, "head"), (4, False, "head"))
    )


def compiled_lora_gemma3_applies(ctx: Any) -> bool:
    """A compiled LoRA Gemma 3 layer (``compiled_lora_applies`` with four norms a layer): its backward keeps the
    head's input gradient to the bottom (``compiled_steps.kept_top``)."""
    return compiled_lora_applies(ctx) and _norms(ctx)[1]


def places(ctx: Any) -> dict[str, int]:
    """Each saved tensor's place among the layer's (``FREE_SAVED``'s index), Gemma 3's and the q/k norms' among
    them."""
    head, sandwich = _norms(ctx)
    names = PLACES + (SANDWICH if sandwich else ()) + (QK if head else ())
    return {n: i for i, n in enumerate(names)}


def _saved(n: int) -> Step:
    """Make the next ``n`` of the layer's saved terms (``SAVED``)."""
    return (SAVED, n)


def compiled_lora_first(ctx: Any) -> tuple[Step, ...]:
    """Layer 0's forward where it differs (per-head q/k norms: k's norm needs no gradient, so k_proj's output and
    its norm's mean live until RoPE has read them; empty elsewhere: ``compiled_lora_forward``'s)."""
    return compiled_lora_forward(ctx, first=True) if _norms(ctx)[0] else ()


def compiled_lora_forward(ctx: Any, first: bool = False) -> tuple[Step, ...]:
    """One compiled LoRA layer's forward buffers and saved terms in order (``forward.Step``); ``first``: layer
    0's. With per-head q/k norms q_proj's output and its adapter's are summed into q (the norm's saved input) and
    each norm makes its fp32 mean before its rsqrt, Qwen3's before v_proj, Gemma 3's after v; Gemma 3's norms after
    attention and the MLP save o_proj's and down_proj's outputs and their rsqrts (``SAVED_AT``: each its own
    bytes)."""
    from memsim_widget.engine.activations.compiled import qk_norm_tensors, sandwich_norm_tensors
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, ctx.recipe.act_bytes
    q, kv = e * T * D.hq, e * T * D.hkv
    head, sandwich = _norms(ctx)
    p = places(ctx)

    def at(name: str, size: int) -> Step:
        return (f"{SAVED_AT}{p[name]}", size)

    if head:
        qn, qr, kn, kr = qk_norm_tensors(ctx, e)
        q_sum: tuple[Step, ...] = (at("qn", qn), ("qb", 0), ("qB", 0))
        k_out: tuple[Step, ...] = (("kb", kv),) if first else (at("kn", kn),)
        q_norm: tuple[Step, ...] = (("qm", qr), at("qr", qr), ("qm", 0))
        k_norm: tuple[Step, ...] = (("km", kr),) if first else (("km", kr), at("kr", kr), ("km", 0))
        late_q, late_k = (), ((("kb", 0), ("km", 0)) if first else ())
    else:
        q_sum, k_out, q_norm, k_norm = (), (("kb", kv),), (), ()
        late_q, late_k = (("qb", 0), ("qB", 0)), (("kb", 0),)
    before_v = q_sum + (k_out if sandwich else q_norm + k_out + k_norm)
    after_v = q_norm + k_norm if sandwich else ()
    attn: tuple[Step, ...] = (
        ("mean", 4 * T), _saved(1), ("mean", 0), ("n", e * T * h), ("qb", q), _saved(2), ("qB", 4 * T * D.hq),
        *before_v, ("vb", kv), ("n", 0), _saved(1), ("vB", 4 * T * D.hkv), _saved(1), ("vb", 0), ("vB", 0),
        *after_v, _saved(1), *late_q, _saved(1), *late_k, _saved(1),
    )  # fmt: skip
    if sandwich:
        o, orsqrt, down, drsqrt = sandwich_norm_tensors(ctx, e)
        out: tuple[Step, ...] = (at("o", o), ("mean", orsqrt), at("orsqrt", orsqrt), ("mean", 0), _saved(1))
        end: tuple[Step, ...] = (
            at("down", down), ("dm", 0), ("mean", drsqrt), at("drsqrt", drsqrt), ("mean", 0), _saved(1),
        )  # fmt: skip
    else:
        out, end = (
            (("o", e * T * h), _saved(1), ("o", 0)),
            (("dn", e * T * h), ("dm", 0), _saved(1), ("dn", 0)),
        )
    mlp: tuple[Step, ...] = (
        ("mean", 4 * T), _saved(1), ("mean", 0), ("mn", e * T * h), _saved(1), ("mn", 0), ("dm", e * T * I), *end,
    )  # fmt: skip
    return attn + out + mlp


def _frees(p: dict[str, int], prefix: str) -> Any:
    """``prefix`` steps (``FREE_SAVED``, ``KEEP_SAVED``) of the saved tensors named."""
    return lambda *names: tuple((f"{prefix}{p[n]}", 0) for n in names)


def _mlp_backward(ctx: Any, p: dict[str, int]) -> tuple[Step, ...]:
    """The MLP's backward: as the full step's (``compiled_backward``) without weight gradients, the layer's
    output freed first; with Gemma 3's norms the norm after the MLP writes its input's gradient and the input
    gradients, the norm's row sum, the residual after attention and its rsqrt and the layer's output are kept."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, I, e = D.T, D.h, D.I, ctx.recipe.act_bytes
    free, keep = _frees(p, FREE_SAVED), _frees(p, KEEP_SAVED)
    if _norms(ctx)[1]:
        top: tuple[Step, ...] = (
            *keep("out"), *_norm_backward(0, 0, T, "g", e * T * h, (p["drsqrt"], p["down"])), ("di", e * T * I),
            ("g", 0),
        )  # fmt: skip
        du, dx = f"{KEEP}du", f"{KEEP}dx"
        end: tuple[Step, ...] = ((f"{KEEP}s", 4 * T), *keep("rsqrt2", "resid"))
    else:
        top, du, dx = (("g", e * T * h), *free("out"), ("di", e * T * I)), "du", "dx"
        end = (
            ("s", 4 * T), ("g2", e * T * h), *free("resid", "rsqrt2"), ("g", 0), ("du", 0), ("dx", 0), ("s", 0),
        )  # fmt: skip
    return (
        *top, ("dm", e * T * I), (du, e * T * h), ("dm", 0), ("dg", e * T * I), ("di", 0), *free("gate", "up"),
        (dx, e * T * h), ("dg", 0), *end,
    )  # fmt: skip


def _released(steps: tuple[Step, ...], name: str) -> tuple[Step, ...]:
    """RoPE's backward steps of the bottom layer: its shared zero buffer freed after the second scatter, its last
    use (``RELEASE``)."""
    out: list[Step] = []
    for st in steps:
        out.append(st)
        if st[0] == f"{name}2" and st[1] > 0:
            out.append((f"{RELEASE}{CONSTANT}{name}", 0))
    return tuple(out)


def compiled_lora_backward(ctx: Any, bottom: bool = False) -> tuple[Step, ...]:
    """One compiled LoRA layer's backward buffers in order (``compiled_backward``'s steps; the adapters' gradients
    made at the first ``GRADS`` step; the KV cache's zero gradients freed where dv's and dk's gradients are read,
    ``TANGENT``). ``bottom``: layer 0, whose input is the frozen embedding's output, so no gradient flows below it
    (the trace's layer 0): the residual gradient is dropped once o_proj's input gradient is made, dk at once
    (k_proj is frozen: no RoPE backward for k), no input gradient of q_proj, v_proj or lora_A is made (nor dv's
    16-bit copy), and RoPE's zero buffer for q is freed after its last scatter. With Gemma 3's norms the residual
    gradient is never summed per layer, as in its full step (``compiled_gemma3_steps``): the input gradients, the
    pre-norms' row sums and what the kernel at the bottom reads are kept (``KEEP``, ``KEEP_SAVED``) until layer
    0's norm after attention has run (``RELEASE`` + ``KEEP``: no gradient flows further down), and the norm after
    attention writes its input's gradient; with per-head q/k norms each norm's fp32 row sum is made before its
    gradient's copy (Gemma 3's both after RoPE's backward), its input and rsqrt freed once the copy is made."""
    from memsim_widget.engine.activations.compiled import qk_norm_tensors
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, e, r = D.T, D.h, ctx.recipe.act_bytes, ctx.scenario.lora.rank
    q, kv = e * T * D.hq, e * T * D.hkv
    head, sandwich = _norms(ctx)
    p = places(ctx)
    free, keep = _frees(p, FREE_SAVED), _frees(p, KEEP_SAVED)
    _qn, qr, _kn, kr = qk_norm_tensors(ctx, e) if head else (0, 0, 0, 0)
    x = KEEP if sandwich else ""  # the input gradients: kept to the bottom, or freed at the layer's end

    def lora(m: str, n: int, done: tuple[Step, ...], cast: tuple[Step, ...] = ()) -> tuple[Step, ...]:
        """The adapter's backward on q or v (``m``) from its gradient's 16-bit copy (``n`` bytes; 0: none, layer 0)
        times the scaling in fp32: lora_B's and lora_A's gradients, lora_A's output gradient, its input's and the
        projection's input gradients (none in layer 0); ``done``: what is freed once the fp32 product is made."""
        width = D.hq if m == "q" else D.hkv
        copy: tuple[Step, ...] = ((f"c{m}", n),) if n else ()
        grads: tuple[Step, ...] = ((f"{GRADS}0", 0),) if m == "v" else ()
        inputs: tuple[Step, ...] = (
            ((f"{x}xa{m}", 4 * T * h), (f"a{m}", 0), (f"{x}x{m}", e * T * h), (f"c{m}", 0))
            if n
            else ((f"a{m}", 0),)
        )
        return (
            *copy, (f"m{m}", 4 * T * width), *done, *grads, *free(f"A{m}"), (f"a{m}", 4 * T * r), (f"m{m}", 0),
            *cast, *inputs,
        )  # fmt: skip

    norm: tuple[Step, ...] = ()
    if sandwich:  # the norm after attention: its input's gradient (layer 0: then what was kept is freed)
        norm = _norm_backward(0, 0, T, "g2", e * T * h, (p["orsqrt"], p["o"]))
        norm = norm[:-1] + (((f"{RELEASE}{KEEP}", 0),) if bottom else ()) + norm[-1:]
    opened: tuple[Step, ...] = (
        *norm, ("do", q), *((("g2", 0),) if sandwich or bottom else ()), ("dq", q), ("dk", kv), ("dv", kv),
        *free("v", "q", "k", "attn", "lse"), ("do", 0),
    )  # fmt: skip
    sk, sq = ((("sk", kr),), (("sq", qr),)) if head else ((), ())
    done_q: tuple[Step, ...] = (
        *free(*(("qn", "qr") if head else ())), ("dq", 0), ("q1", 0), ("q2", 0), *((("sq", 0),) if head else ()),
    )  # fmt: skip
    if bottom:
        k1: tuple[Step, ...] = (("k1", kv), (TANGENT, 0), (f"{RELEASE}{CONSTANT}k", 0)) if sandwich else ()
        return (
            _mlp_backward(ctx, p) + opened + (("dk", 0), *k1, *_released(_rope_backward("q", q), "q"))
            + (sq if sandwich else ())
            + lora("v", 0, ((TANGENT, 0), ("dv", 0), *((("k1", 0),) if sandwich else ())))
            + (() if sandwich else sq)
            + lora("q", 0, done_q, free("cast"))
        )  # fmt: skip
    k: tuple[Step, ...] = (
        *(() if sandwich else sk), ("ck", kv), *free(*(("kr",) if head else ())), (TANGENT, 0), ("dk", 0),
        ("k1", 0), ("k2", 0), *free(*(("kn",) if head else ())), *((("sk", 0),) if head else ()), (f"{x}xk", e * T * h),
        ("ck", 0),
    )  # fmt: skip
    end: tuple[Step, ...] = (
        ((f"{KEEP}s", 4 * T), *keep("rsqrt"))
        if sandwich
        else (
            ("s", 4 * T), ("g3", e * T * h), *free("rsqrt"), ("g2", 0), ("xav", 0), ("xv", 0), ("xk", 0),
            ("xaq", 0), ("xq", 0), ("s", 0), ("g3", 0),
        )
    )  # fmt: skip
    return (
        _mlp_backward(ctx, p) + opened + _rope_backward("k", kv) + _rope_backward("q", q)
        + (sk + sq if sandwich else ())
        + lora("v", kv, ((TANGENT, 0), ("dv", 0)))
        + k
        + (() if sandwich else sq)
        + lora("q", q, done_q, free("cast"))
        + end
    )  # fmt: skip
