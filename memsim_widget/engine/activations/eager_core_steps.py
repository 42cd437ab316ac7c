"""A Llama layer with transformers' eager attention, op by op: its forward and backward as
``engine/activations/eager_steps`` writes an SDPA layer's, with the eager attention core (the T x T scores,
softmax and context) in place of SDPA's kernel, for the allocation stream of a DeepSpeed ZeRO-3 rank
(``engine/counters/zero3_stream``; ``alloc_stream.layer_steps`` decides where these steps are used).

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
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_backward import FREE_SAVED
from memsim_widget.engine.activations.eager_steps import (
    ATTN_IN,
    IN_CAST,
    IN_FP32,
    IN_RSQRT,
    MLP_IN,
    POST_CAST,
    POST_FP32,
    POST_RSQRT,
    layer_backward,
    norm_forward,
    rope_forward,
)
from memsim_widget.engine.activations.forward import IN, OUT, SAVED_AT, Step

#: The places of an eager Llama layer's saved tensors among the stream's (its ``saved`` items' tensors in order,
#: ``alloc_stream.StreamWriter.items``), after the norms' eight (``eager_steps.IN_FP32`` .. ``MLP_IN``): the
#: query's copy, ``repeat_kv``'s k and v, the fp32 probabilities, their 16-bit cast, o_proj's input (the context
#: made contiguous), gate's, up's and act's outputs, down's input. One more than SDPA's (its output and
#: logsumexp are two, the softmax, its cast and the context three): the MLP's places move by ``SHIFT``.
Q, K, V, PROBS, PROBS_CAST, CONTEXT, GATE, UP, ACT, DOWN_IN = range(8, 18)
SHIFT = 1


def applies(ctx: Any) -> bool:
    """A transformers Llama-style layer (two RMSNorms of 16-bit weights, SwiGLU, grouped k/v, no q/k norms) with
    eager attention, as HF builds it under HF's Trainer or DeepSpeed's engine, its activations 16-bit (a bf16 or
    fp16 model, or DeepSpeed's ``mixed-bf16``: the model cast to bf16, no autocast), full training, no
    checkpointing, not compiled, a causal additive mask and no dropout, the softmax in fp32 cast back (Llama's):
    the layer these steps describe. Where the stream uses them is ``alloc_stream.layer_steps``' choice (a
    DeepSpeed ZeRO-3 rank)."""
    a, sc = ctx.arch, ctx.scenario
    af, nf = a.facts.attention, a.facts.norm
    return (
        sc.framework in ("hf", "deepspeed")
        and not sc.compile
        and a.attention_kernel(sc.attention) == "eager"
        and ctx.recipe.act_bytes == 2
        and sc.method == "full"
        and sc.activation_checkpointing == "none"
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


def core_forward(ctx: Any) -> tuple[Step, ...]:
    """The eager attention core's forward (``eager_attention_forward``), its saved tensors at their places."""
    _, q, _, ss = _sizes(ctx)

    def at(*places: int) -> tuple[Step, ...]:
        return tuple((SAVED_AT + str(p), 0) for p in places)

    return (
        *at(K, V, Q), ("s1", ss), ("s2", ss), ("s1", 0), ("s3", ss), ("s2", 0), ("f", 2 * ss), *at(PROBS),
        ("f", 0), *at(PROBS_CAST), ("s3", 0), ("ctx", q), *at(CONTEXT), ("ctx", 0),
    )  # fmt: skip


def layer_forward(ctx: Any) -> tuple[Step, ...]:
    """An eager Llama layer's forward op by op (``forward.Step``s, saved tensors by place), where ``applies``;
    else empty."""
    if not applies(ctx):
        return ()
    x, q, kv, _ = _sizes(ctx)

    def at(*places: int) -> tuple[Step, ...]:
        return tuple((SAVED_AT + str(p), 0) for p in places)

    return (
        *norm_forward(ctx, IN_FP32, IN_RSQRT, IN_CAST, ATTN_IN),
        ("q", q), ("k", kv), ("v", kv), *rope_forward(q, (("qe", q),)), *rope_forward(kv, (("ke", kv),)),
        ("q", 0), ("k", 0), *core_forward(ctx), ("o", x), ("v", 0), ("qe", 0), ("ke", 0), ("res", x), ("o", 0),
        *norm_forward(ctx, POST_FP32, POST_RSQRT, POST_CAST, MLP_IN),
        *at(GATE, ACT, UP, DOWN_IN), ("down", x), (OUT, x), ("down", 0), ("res", 0), (IN, 0),
    )  # fmt: skip


def core_backward(ctx: Any) -> tuple[Step, ...]:
    """The eager attention core's backward from o_proj's input gradient (``oin``, freed here) to the gradients
    of q (``dq``), k and v (``dk``, ``dv``) that RoPE's and the projections' backward read."""
    _, q, kv, ss = _sizes(ctx)

    def saved(*places: int) -> tuple[Step, ...]:
        return tuple((FREE_SAVED + str(p), 0) for p in places)

    return (
        *saved(CONTEXT), ("gc", q), ("oin", 0), ("dvr", q), ("gp", ss), *saved(V, PROBS_CAST), ("gc", 0),
        ("g32", 2 * ss), ("gp", 0), ("gs", 2 * ss), *saved(PROBS), ("g32", 0), ("g16", ss), ("gs", 0),
        ("gm", ss), ("g16", 0), ("dkr", q), ("dq", q), *saved(Q, K), ("gm", 0),
        ("dv", kv), ("dvr", 0), ("dk", kv), ("dkr", 0),
    )  # fmt: skip


def layer_backward_steps(ctx: Any) -> tuple[Step, ...]:
    """An eager Llama layer's backward op by op (``eager_steps.layer_backward`` with ``core_backward``), where
    ``applies``; else empty."""
    if not applies(ctx):
        return ()
    return layer_backward(ctx, core_backward(ctx), SHIFT)
