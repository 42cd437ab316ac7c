"""A Llama layer with transformers' eager attention, op by op: its forward and backward as
``engine/activations/eager_steps`` writes an SDPA layer's, with the eager attention core (the T x T scores,
softmax and context) in place of SDPA's kernel, for the allocation stream of a DeepSpeed ZeRO-3 rank
(``engine/counters/zero3_stream``) and of an FSDP2 rank (``fsdp_stream``; there under full checkpointing too:
``checkpointed_forward``, ``recompute_steps``, held to ``tests/data/stream_traces/fsdp2-dp4-eager-ckpt.json.gz``);
``alloc_stream.layer_steps`` decides where these steps are used.

The core's T x T buffers (b x a x s x s: 8 MiB in bf16 and 16 MiB in fp32 for the 4-layer h 512 Llama at 2 x 512)
are the largest a layer makes; written as the engine's items (all of a layer's saved tensors at once, the
softmax backward's gradients made together at the layer's start) they split the large pool otherwise than a real
run, and the stream of a ZeRO-3 rank replayed 5.22% over its CPU trace (``benchmarks/zero_trace.py --stage 3
--eager``). Read from transformers 5.24.0 ``models/llama/modeling_llama.py`` (``eager_attention_forward``:
``repeat_kv`` of k and v, ``matmul(query, key.transpose(2, 3)) * scaling``, ``+ attention_mask``,
``softmax(..., dtype=float32).to(query.dtype)``, ``dropout`` (p = 0 in training here: torch's ``dropout``
returns its input), ``matmul(weights, value)``, ``transpose(1, 2).contiguous()``) and torch 2.13.0's derivative
formulas (``tools/autograd/derivatives.yaml``: ``bmm`` -> ``grad.bmm(mat2^T)`` and ``self^T.bmm(grad)``,
``_softmax`` -> ``_softmax_backward_data`` on its saved output, ``_to_copy`` -> a cast back, ``mul`` by a
scalar -> ``grad * scalar``, ``expand`` -> a sum to the k/v heads), and held event by event to the recorded CPU
trace of that rank (``tests/data/zero_traces/zero3-attentioneager.json.gz``), in the order it lists them:

- forward: the two RMSNorms and RoPE as ``eager_steps.eager_layer_forward_transients`` (RoPE's q and k sums are
  transients here, freed as the attention returns); the core makes ``repeat_kv``'s k and v and the query's copy for
  the batched matmul (all three saved), the scores (16-bit), their scaled copy, the masked copy, the fp32 copy
  ``softmax`` converts its input to (``softmax`` with a dtype casts first and runs ``_softmax`` on the copy: on the
  CPU and for bf16 on CUDA, whose half-to-float fast path is for fp16 only), the fp32 probabilities (saved), their
  16-bit cast (saved), the context (freed once made contiguous: the contiguous copy is o_proj's saved input);
- backward: o_proj's input gradient made contiguous for the batched matmul's backward, the repeated value's and
  the probabilities' gradients, the cast's backward to fp32, ``_softmax_backward_data`` (fp32), the cast back to
  16 bits, the scaling's product, the query's and the repeated key's gradients, each repeated gradient summed to
  the k/v heads; each saved tensor freed where its node has run.

Under Megatron's selective checkpointing (the core under a non-reentrant ``torch.utils.checkpoint`` of its own,
``benchmarks/zero_trace.py --selective``, held to ``zero3-selective.json.gz``) the forward makes the same core
saving only the checkpoint's inputs and o_proj's input, and the backward recomputes it (``core_backward``).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_backward import FREE_SAVED
from memsim_widget.engine.activations.eager_steps import (
    ACT,
    ATTN_IN,
    DOWN_IN,
    GATE,
    IN_CAST,
    IN_FP32,
    IN_RSQRT,
    MLP_IN,
    POST_CAST,
    POST_FP32,
    POST_RSQRT,
    UP,
    layer_backward,
    norm_forward,
    rope_forward,
)
from memsim_widget.engine.activations.forward import IN, OUT, SAVED_AT, Step

#: The places of an eager Llama layer's saved tensors among the stream's (its ``saved`` items' tensors in order,
#: ``alloc_stream.StreamWriter.items``), after the norms' eight (``eager_steps.IN_FP32`` .. ``MLP_IN``): the
#: query's copy, ``repeat_kv``'s k and v, the fp32 probabilities, their 16-bit cast, o_proj's input (the context
#: made contiguous), then the MLP's (gate's, up's and act's outputs, down's input): one more than SDPA's (its
#: output and logsumexp are two, the softmax, its cast and the context three), so the MLP's places move by
#: ``SHIFT``. Under selective checkpointing the checkpoint's inputs (q and k after RoPE, v) at ``Q``, ``K``,
#: ``V``, then o_proj's input (``SELECTIVE_CONTEXT``): one fewer than SDPA's.
Q, K, V, PROBS, PROBS_CAST, CONTEXT = range(8, 14)
SELECTIVE_CONTEXT = 11
SHIFT, SELECTIVE_SHIFT = 1, -1


def applies(ctx: Any) -> bool:
    """A transformers Llama-style layer (``_layer``) without checkpointing or under Megatron's selective one (the
    core under a non-reentrant checkpoint of its own): the layer these steps describe. Where the stream uses them
    is ``alloc_stream.layer_steps``' choice (a DeepSpeed ZeRO-3 or an FSDP2 rank)."""
    return _layer(ctx) and ctx.scenario.activation_checkpointing in ("none", "selective")


def applies_full(ctx: Any) -> bool:
    """The same layer under full checkpointing of every layer (HF's, non-reentrant): its forward saving nothing
    but its input (``checkpointed_forward``), its recompute in the backward (``recompute_steps``) and the
    unchecked layer's backward (``checkpointed_backward``)."""
    sc = ctx.scenario
    return _layer(ctx) and sc.activation_checkpointing == "full" and sc.checkpoint_every in (None, 1)


def _layer(ctx: Any) -> bool:
    """A transformers Llama-style layer (two RMSNorms of 16-bit weights, SwiGLU, grouped k/v, no q/k norms) with
    eager attention, as HF builds it under HF's Trainer or DeepSpeed's engine, its activations 16-bit (a bf16 or
    fp16 model, or DeepSpeed's ``mixed-bf16``: the model cast to bf16, no autocast), full training, not compiled,
    a causal additive mask and no dropout, the softmax in fp32 cast back (Llama's)."""
    a, sc = ctx.arch, ctx.scenario
    af, nf = a.facts.attention, a.facts.norm
    return (
        sc.framework in ("hf", "deepspeed")
        and not sc.compile
        and a.attention_kernel(sc.attention) == "eager"
        and ctx.recipe.act_bytes == 2
        and sc.method == "full"
        and a.norm == "rmsnorm"
        and a.mlp_activation == "swiglu"
        and (nf.per_layer, nf.qk, nf.one_plus_weight, nf.weight_fp32, nf.post_norms)
        == (2, None, False, False, False)
        and not (a.facts.mlp.parallel_attn_mlp or a.facts.ssm or a.num_experts)
        and 0 < a.num_kv_heads < a.num_heads
        and a.attention_dropout == 0
        and af.softmax_upcast
        and not (af.logit_softcapping or af.sinks or af.sdpa_math_fallback)
    )


def _sizes(ctx: Any) -> tuple[int, int, int, int]:
    """(e T h, e T a d, e T kv d, e b a s s): a 16-bit T x h tensor, a query-sized one, a k/v-sized one, the
    16-bit scores (bf16 or fp16 weights: ``applies``)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    e = 2
    return e * D.T * D.h, e * D.T * D.hq, e * D.T * D.hkv, e * D.b * D.a * D.s * D.s_full


def _selective(ctx: Any) -> bool:
    """Megatron's selective checkpointing: the core under a checkpoint of its own."""
    return bool(ctx.scenario.activation_checkpointing == "selective")


def _places(ctx: Any) -> tuple[int, int, int, int, int]:
    """o_proj's saved input and the MLP's four (gate's, act's, up's outputs, down's input) in the order the
    forward makes them."""
    s = SELECTIVE_SHIFT if _selective(ctx) else SHIFT
    return (SELECTIVE_CONTEXT if _selective(ctx) else CONTEXT), GATE + s, ACT + s, UP + s, DOWN_IN + s


def _scores(ctx: Any, forward: bool) -> tuple[Step, ...]:
    """The core up to the probabilities' 16-bit cast under selective checkpointing, nothing saved: ``repeat_kv``'s
    k and v, the query's copy (freed once the scores are made in the forward, which saves nothing; kept for the
    backward in the recompute), the scores, scaled, masked, the fp32 copy, the probabilities and their cast."""
    _, q, _, ss = _sizes(ctx)
    return (
        ("kr", q), ("vr", q), ("qc", q), ("s1", ss), *((("qc", 0),) if forward else ()), ("s2", ss), ("s1", 0),
        ("s3", ss), ("s2", 0), ("f", 2 * ss), ("sm", 2 * ss), ("f", 0), ("cast", ss), ("s3", 0),
    )  # fmt: skip


def core_forward(ctx: Any) -> tuple[Step, ...]:
    """The eager attention core's forward (``eager_attention_forward``), its saved tensors at their places; under
    selective checkpointing ``_scores`` saving nothing, the probabilities freed once cast, the cast alive (the
    attention returns it: the decoder layer drops it as it returns), o_proj's saved input."""
    _, q, _, ss = _sizes(ctx)
    context = _places(ctx)[0]

    def at(*places: int) -> tuple[Step, ...]:
        return tuple((SAVED_AT + str(p), 0) for p in places)

    if _selective(ctx):
        return (
            *_scores(ctx, True), ("sm", 0), ("ctx", q), *at(context), ("kr", 0), ("vr", 0), ("ctx", 0),
        )  # fmt: skip
    return (
        *at(K, V, Q), ("s1", ss), ("s2", ss), ("s1", 0), ("s3", ss), ("s2", 0), ("f", 2 * ss), *at(PROBS),
        ("f", 0), *at(PROBS_CAST), ("s3", 0), ("ctx", q), *at(context), ("ctx", 0),
    )  # fmt: skip


def layer_forward(ctx: Any) -> tuple[Step, ...]:
    """An eager Llama layer's forward op by op (``forward.Step``s, saved tensors by place), where ``applies``;
    else empty. Under selective checkpointing the checkpoint saves its inputs (v as made, q and k after RoPE:
    their own sizes, k/v-sized for k and v, where the engine's item counts k and v repeated)."""
    return _forward(ctx) if applies(ctx) else ()


def _forward(ctx: Any) -> tuple[Step, ...]:
    """``layer_forward``'s steps (under full checkpointing: the unchecked layer's, which the recompute repeats)."""
    x, q, kv, _ = _sizes(ctx)
    mlp = _places(ctx)[1:]

    def at(*places: int) -> tuple[Step, ...]:
        return tuple((SAVED_AT + str(p), 0) for p in places)

    sel = _selective(ctx)
    v, qe, ke = (((SAVED_AT + str(V), kv),), at(Q), ((SAVED_AT + str(K), kv),)) if sel else (
        (("v", kv),), (("qe", q),), (("ke", kv),))  # fmt: skip
    freed = ("cast",) if sel else ("v", "qe", "ke")
    return (
        *norm_forward(ctx, IN_FP32, IN_RSQRT, IN_CAST, ATTN_IN),
        ("q", q), ("k", kv), *v, *rope_forward(q, qe), *rope_forward(kv, ke),
        ("q", 0), ("k", 0), *core_forward(ctx), ("o", x), *(() if sel else ((n, 0) for n in freed)),
        ("res", x), ("o", 0),
        *norm_forward(ctx, POST_FP32, POST_RSQRT, POST_CAST, MLP_IN),
        *at(*mlp), ("down", x), (OUT, x), ("down", 0), *(((n, 0) for n in freed) if sel else ()),
        ("res", 0), (IN, 0),
    )  # fmt: skip


def core_backward(ctx: Any) -> tuple[Step, ...]:
    """The eager attention core's backward from o_proj's input gradient (``oin``, freed here) to the gradients
    of q (``dq``), k and v (``dk``, ``dv``) that RoPE's and the projections' backward read. Under selective
    checkpointing the checkpoint's recompute (``_scores``, stopped once the last tensor the backward needs is
    saved: torch 2.13.0 ``utils/checkpoint.py``'s early stop, so the context is not made again) runs when the
    context's matmul unpacks its saved tensors, after o_proj's input gradient is made contiguous; its tensors
    are freed where the eager layer's saved ones are, and the checkpoint's inputs once the scores' matmul has
    run."""
    _, q, kv, ss = _sizes(ctx)

    def saved(*places: int) -> tuple[Step, ...]:
        return tuple((FREE_SAVED + str(p), 0) for p in places)

    sel = _selective(ctx)
    probs, cast, vr, qk = (
        (("sm", 0),), (("cast", 0),), (("vr", 0),), (*saved(K, Q, V), ("kr", 0), ("qc", 0))
    ) if sel else (saved(PROBS), saved(PROBS_CAST), saved(V), saved(Q, K))  # fmt: skip
    return (
        *saved(_places(ctx)[0]), ("gc", q), ("oin", 0), *(_scores(ctx, False) if sel else ()),
        ("dvr", q), ("gp", ss), *vr, *cast, ("gc", 0),
        ("g32", 2 * ss), ("gp", 0), ("gs", 2 * ss), *probs, ("g32", 0), ("g16", ss), ("gs", 0),
        ("gm", ss), ("g16", 0), ("dkr", q), ("dq", q), *qk, ("gm", 0),
        ("dv", kv), ("dvr", 0), ("dk", kv), ("dkr", 0),
    )  # fmt: skip


def layer_backward_steps(ctx: Any) -> tuple[Step, ...]:
    """An eager Llama layer's backward op by op (``eager_steps.layer_backward`` with ``core_backward``), where
    ``applies``; else empty."""
    if not applies(ctx):
        return ()
    return layer_backward(ctx, core_backward(ctx), SELECTIVE_SHIFT if _selective(ctx) else SHIFT)


def _place_sizes(ctx: Any) -> dict[int, int]:
    """The bytes of the unchecked layer's saved tensors by place (the norms' as ``eager_steps.norm_forward`` makes
    them; q's copy and ``repeat_kv``'s k and v query-sized)."""
    from memsim_widget.engine.activations.dims import Dims
    from memsim_widget.engine.activations.eager_steps import POST_CAST, POST_FP32, POST_RSQRT

    D = Dims(ctx)
    x, q, _, ss = _sizes(ctx)
    f, r, i = 2 * x, 4 * D.T, 2 * D.T * D.I
    sizes = {IN_FP32: f, POST_FP32: f, IN_RSQRT: r, POST_RSQRT: r, IN_CAST: x, POST_CAST: x, ATTN_IN: x}
    sizes |= {MLP_IN: x, Q: q, K: q, V: q, PROBS: 2 * ss, PROBS_CAST: ss, CONTEXT: q}
    return sizes | {p + SHIFT: i for p in (GATE, ACT, UP, DOWN_IN)}


def recompute_steps(ctx: Any) -> tuple[Step, ...]:
    """A fully checkpointed layer's recompute in the backward (torch 2.13.0 ``utils/checkpoint.py``,
    non-reentrant): the unchecked layer's forward (``_forward``), each saved tensor at its place with its own size,
    stopped once the last one is made (the checkpoint's early stop: down's projection and the residual add are not
    run again), the transients still alive then freed; the input is the checkpoint's (no ``IN``). Where
    ``applies_full``; else empty."""
    if not applies_full(ctx):
        return ()
    sizes = _place_sizes(ctx)
    steps = [st for st in _forward(ctx) if st[0] != IN]
    last = max(k for k, (name, _) in enumerate(steps) if name.startswith(SAVED_AT))
    out: list[Step] = []
    live: list[str] = []
    for name, size in steps[: last + 1]:
        if name.startswith(SAVED_AT):
            out.append((name, sizes[int(name[len(SAVED_AT) :])]))
            continue
        out.append((name, size))
        if size > 0:
            live.append(name)
        elif name in live:
            live.remove(name)
    return (*out, *((n, 0) for n in live))


def checkpointed_backward(ctx: Any) -> tuple[Step, ...]:
    """A fully checkpointed layer's backward once ``recompute_steps`` has run: the unchecked layer's
    (``eager_steps.layer_backward`` with ``core_backward``) on the recomputed tensors. Where ``applies_full``."""
    return layer_backward(ctx, core_backward(ctx), SHIFT) if applies_full(ctx) else ()


def checkpointed_forward(ctx: Any) -> tuple[Step, ...]:
    """A fully checkpointed layer's forward (HF's non-reentrant ``checkpoint``: nothing saved but its input, the
    checkpoint's saved term, made as the layer starts while its input is freed), each tensor freed where Python
    drops its last reference (transformers 5.24.0 ``LlamaDecoderLayer.forward``, ``LlamaAttention.forward``,
    ``eager_attention_forward``, ``LlamaRMSNorm.forward``, ``LlamaMLP.forward``): each norm's fp32 input and rsqrt
    once ``x * rsqrt`` is made, its 16-bit cast once the weight's product is, ``x * rsqrt`` and the mean as it
    returns; the input norm's output alive until the attention returns; the core's scores, each freed as the
    next is made, its fp32 probabilities once cast and the masked scores after (one statement), the cast (the
    attention's returned weights) to the layer's end, ``repeat_kv``'s k and v as the core returns, the context
    once made contiguous and that copy once o_proj has run, q, k, v after RoPE to the attention's return; the
    MLP's gate output once ``silu`` has run, ``silu``'s and up's once multiplied, their product once down has run,
    the post norm's output as the MLP returns. Where ``applies_full``; else empty."""
    if not applies_full(ctx):
        return ()
    from memsim_widget.engine.activations.dims import Dims
    from memsim_widget.engine.activations.forward import SAVED

    x, q, kv, ss = _sizes(ctx)
    f, r, i = 2 * x, 4 * Dims(ctx).T, 2 * Dims(ctx).T * Dims(ctx).I

    def norm(n: str) -> tuple[Step, ...]:
        return (
            ("fp", f), ("pow", f), ("mean", r), ("pow", 0), ("eps", r), ("rs", r), ("eps", 0), ("xr", f),
            ("fp", 0), ("rs", 0), ("cast16", x), (n, x), ("cast16", 0), ("xr", 0), ("mean", 0),
        )  # fmt: skip

    return (
        (SAVED, -1), (IN, 0), *norm("ain"),
        ("q", q), ("k", kv), ("v", kv), *rope_forward(q, (("qe", q),)), *rope_forward(kv, (("ke", kv),)),
        ("q", 0), ("k", 0), ("kr", q), ("vr", q), ("qc", q), ("s1", ss), ("qc", 0), ("s2", ss), ("s1", 0),
        ("s3", ss), ("s2", 0), ("f", 2 * ss), ("sm", 2 * ss), ("f", 0), ("cast", ss), ("sm", 0), ("s3", 0),
        ("ctx", q), ("ctxc", q), ("ctx", 0),
        ("kr", 0), ("vr", 0), ("o", x), ("ctxc", 0), ("v", 0), ("qe", 0), ("ke", 0), ("ain", 0),
        ("res", x), ("o", 0), *norm("min"),
        ("g", i), ("a", i), ("g", 0), ("u", i), ("p", i), ("a", 0), ("u", 0), ("down", x), ("p", 0), ("min", 0),
        (OUT, x), ("down", 0), ("cast", 0), ("res", 0),
    )  # fmt: skip
