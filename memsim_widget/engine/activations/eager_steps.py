"""The buffers an eager Llama-layout step makes and frees that ``forward.py`` does not list, op by op: the rotary
embedding's at each forward, the final RMSNorm's backward, and a layer's backward (its norms' included).

None of them is saved, so they do not enter the engine's allocated figures (the budget keeps its terms: ``final
RMSNorm backward (fp32)``, the layer's ``activation gradients``), but they cut the caching allocator's segments,
so the allocation stream (``engine/counters/alloc_stream``) replays them in place of those terms. At h <= 512
most of them are 1 MiB or less (the small pool, 2 MiB segments): the final norm's term, four equal tensors of
6 B x T x h, went to the large pool, and the layers' three T x I gradients stayed alive for the whole layer, so
the step's small pool was two to three segments short of the fake-tensor trace's (the 4-layer h 256 Llama at
2 x 512 tokens: 48 against 52 MiB, -2.56% reserved; checkpointed -4.84%).

Read from transformers 5.24.0 ``models/llama/modeling_llama.py`` (``LlamaRotaryEmbedding.forward``,
``LlamaRMSNorm.forward``: ``x.to(float32)``, ``variance = x.pow(2).mean(-1, keepdim=True)``, ``x *
torch.rsqrt(variance + eps)``, ``weight * x.to(dtype)``; ``rotate_half``, ``LlamaMLP.forward``) and torch 2.13.0's
derivative formulas (``tools/autograd/derivatives.yaml``: ``mul`` -> ``grad * other`` and ``grad * self``,
``_to_copy`` -> a cast back, ``rsqrt`` -> ``-0.5 * grad * result.pow(3)``, ``mean`` -> ``grad.expand(...) / n``,
``pow`` -> ``pow_backward``: ``grad * (exponent * self.pow(exponent - 1))``, ``silu`` -> ``silu_backward``, ``cat``
and ``slice`` -> ``slice_backward``; autograd sums a tensor's gradients with an ``add``), and held op by op to the
fake-tensor trace of the 4-layer Llama (b2 s512 bf16, ``tests/data/fidelity_cases.LLAMA``) in the order it lists
them (``tests/data/stream_vs_trace.py`` replays both).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.compiled_backward import FREE_SAVED, GRADS
from memsim_widget.engine.activations.forward import IN, OUT, SAVED, SAVED_AT, Step, llama_layout

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
    """One of a layer's two RMSNorms' backward (``input_layernorm``, ``post_attention_layernorm``) for the layers
    whose backward is not written op by op (``eager_layer_backward_transients``: LoRA, Qwen3's q/k norms, a TP
    rank), where ``final_norm_backward_transients`` writes the final norm's, else empty: ``_rmsnorm``'s steps, the
    saved tensors left to the layer's end (where the stream frees the layer's). The stream writes them once the
    layer's gradient items are released (autograd runs a norm's backward after the MLP's or the attention's)."""
    if not _applies(ctx):
        return ()
    return _rmsnorm(ctx, "", ())


def _applies(ctx: Any) -> bool:
    """A Llama-style layout (``forward.llama_layout``, any checkpointing) in 16-bit weights, on one GPU or a
    pipeline stage: the data- and tensor-parallel streams (DDP, ZeRO, FSDP2, TP) keep their items, held to their
    own traces (tests/engine/test_*_stream.py) and not yet compared with these steps. Not compiled: Inductor fuses
    these ops (``compiled_steps`` writes a compiled layer's own buffers)."""
    p, sc = ctx.par, ctx.scenario
    return llama_layout(ctx) and sc.precision != "fp32" and not sc.compile and p.dp * p.tp * p.cp * p.ep == 1


def _bytes(ctx: Any) -> tuple[int, int, int]:
    """(e T h, 4 T h, 4 T): a 16-bit T x h tensor, an fp32 one, an fp32 row statistic."""
    from memsim_widget.engine.activations.dims import Dims

    T, h = Dims(ctx).T, ctx.arch.hidden_size
    return 2 * T * h, 4 * T * h, 4 * T  # bf16 or fp16 weights (``_applies``)


def _rmsnorm(
    ctx: Any, arriving: str, saved: tuple[int, ...], grad: int | None = None, keep: bool = False
) -> tuple[Step, ...]:
    """An RMSNorm's backward from the gradient of its output: the weight's mul backward (e T h each; the product
    with ``x`` only where the weight trains: not under LoRA), the cast up (4 T h), ``x * rsqrt``'s two products
    (4 T h) and the row sum (4 T), rsqrt's three T x 1 buffers, mean's ``div`` and pow's three fp32 T x h
    buffers, their ``add`` and the cast back to the layers' dtype (e T h). ``arriving``: the step name of the
    output's gradient, freed once the weight's backward has read it ('' : not the norm's to free); ``saved``:
    the 16-bit cast, the rsqrt and the fp32 input, freed where autograd releases them (empty: not freed here);
    ``grad``: the weight's place among the layer's parameters, its gradient made after ``grad * x`` (None: made
    elsewhere); ``keep``: the gradient it leaves (``down``) not freed (the layer's residual add frees it)."""
    x, f, t = _bytes(ctx)
    trains = ctx.scenario.method == "full"  # LoRA freezes the norm's weight: no grad * x
    free = [(FREE_SAVED + str(i), 0) for i in saved] or [("", 0)] * 3
    return tuple(
        step
        for step in (
            ("gx", x),  # weight * x: grad * weight
            *((("gw", x),) if trains else ()),  # grad * x, summed into the weight's gradient
            (GRADS + str(grad), 0) if trains and grad is not None else ("", 0),
            ("gw", 0) if trains else ("", 0),
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
            ("", 0) if keep else ("down", 0),
        )
        if step[0]
    )


#: The places of a Llama layer's saved tensors among the stream's (its ``saved`` items' tensors in order,
#: ``StreamWriter.items``): the two norms' fp32 inputs and rsqrts, their 16-bit casts, the attention's and the MLP's
#: input (the norms' outputs), SDPA's q, k, v, its output and logsumexp, gate's, up's and act's outputs, down's input.
IN_FP32, IN_RSQRT, POST_FP32, POST_RSQRT, IN_CAST, POST_CAST, ATTN_IN, MLP_IN = range(8)
SDPA_Q, SDPA_K, SDPA_V, SDPA_OUT, SDPA_LSE, GATE, UP, ACT, DOWN_IN = range(8, 17)
#: The step name of the gradient arriving at a layer's backward from above: a later pipeline stage's top layer
#: reads its receive buffer in place (torch 2.13 ``stage.py`` ``backward_one_chunk``: ``stage_backward`` of the
#: output with the received gradient), so the stream drops it there (``alloc_stream._layers_backward``).
ARRIVING = "gout"
#: The step name of a layer's input gradient (the residual add of its two branches' gradients, made last): the
#: next layer's arriving gradient; on a later pipeline stage the bottom layer's is the gradient the stage sends,
#: kept in ``bwd_cache`` and the send ops instead of freed (``alloc_stream.backward_layer``'s ``handed``).
INPUT_GRADIENT = "res2"
#: The step of a layer's backward where SDPA's CUDA kernel runs, once it has made dq, dk and dv: the stream makes
#: the layer's CUDA-only scratch there (the ``layer_backward`` items of level ``allocator``: flash attention's fp32
#: dq accumulator) and frees it at once (``alloc_stream.backward_layer``). Read in torch 2.13.0
#: ``aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp`` ``mha_bwd``: the gradients dq, dk and dv
#: are made first, then ``softmax_d`` and the fp32 ``dq_accum``, which live only while the kernel runs and are
#: released when ``mha_bwd`` returns, before autograd drops the output's gradient it read (``trace/cuda_sdpa.py``
#: ``_Flash.backward`` emulates the same order). Until 2026-12-06 the stream made the scratch at the start of the
#: layer's backward and kept it to the layer's end: a GPipe first stage at pp 2 and 2 x 512 tokens replayed 2.52%
#: under its trace (the trace with CUDA's flash kernel, sm80: the same reserved as the CPU op's).
CUDA_SCRATCH = "cuda scratch"
#: The layer's parameters as ``compiled_backward.GRADS`` numbers them.
Q, K, V, O, GATE_W, UP_W, DOWN_W, IN_NORM_W, POST_NORM_W = range(9)


def eager_layer_backward_transients(ctx: Any) -> tuple[Step, ...]:
    """A Llama layer's eager backward op by op (``forward.llama_layout``, no q/k norms, one GPU or a pipeline stage,
    full training of 16-bit weights, every layer checkpointed or none: a checkpointed layer's saved tensors are
    its recompute's, the same tensors in the same order), in the ``compiled_backward`` step format the stream's
    ``backward_layer`` writes: each buffer made and freed, each saved tensor freed and each parameter's gradient
    made where autograd does, from the top (the gradient arriving from above, made at the start and freed at the
    residual add that consumes it: the step before freed its copy). Read op by op from the trace of the 4-layer
    Llama (b2 s512 bf16): the MLP (down's input gradient, SwiGLU's two products and ``silu_backward``, up's and
    gate's input gradients summed), the norm after attention (``_rmsnorm``), the residual add; o_proj's input
    gradient, SDPA's dq, dk, dv, RoPE's backward for k then q (``rotate_half``: a product, the negated half, two
    ``slice_backward`` outputs, their sum, the second product and the sum with SDPA's), v's, k's and q's
    projections (k's and q's gradients made contiguous by a ``clone``), the input norm, the residual add. Else
    empty (the ``layer_backward`` items)."""
    sc = ctx.scenario
    ckpt = sc.activation_checkpointing
    if (
        not _applies(ctx)
        or not (ckpt == "none" or (ckpt == "full" and sc.checkpoint_every in (None, 1)))
        or sc.method != "full"
        or ctx.arch.facts.norm.qk is not None
    ):
        return ()
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    q, kv = 2 * D.T * D.hq, 2 * D.T * D.hkv  # bf16 or fp16 weights (``_applies``)
    sdpa = (
        ("dq", q), ("dk", kv), ("dv", kv), (CUDA_SCRATCH, 0), ("oin", 0),
        *((FREE_SAVED + str(p), 0) for p in (SDPA_K, SDPA_Q, SDPA_V, SDPA_LSE, SDPA_OUT)),
    )  # fmt: skip
    return layer_backward(ctx, sdpa)


def layer_backward(ctx: Any, attention: tuple[Step, ...], shift: int = 0) -> tuple[Step, ...]:
    """``eager_layer_backward_transients``' steps with ``attention`` between o_proj's input gradient (``oin``,
    which it frees) and RoPE's backward: the attention kernel's backward, leaving the gradients of q (``dq``),
    k and v (``dk``, ``dv``: k/v-sized) and freeing its saved tensors; ``shift``: how many more saved tensors
    the attention keeps than SDPA's five (the MLP's places move by as many)."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    e = 2  # bf16 or fp16 weights
    x, i, q, kv = e * D.T * ctx.arch.hidden_size, e * D.T * D.I, e * D.T * D.hq, e * D.T * D.hkv
    down_in, up, act, gate = (p + shift for p in (DOWN_IN, UP, ACT, GATE))

    def free(*names: str) -> tuple[Step, ...]:
        return tuple((n, 0) for n in names)

    def saved(*places: int) -> tuple[Step, ...]:
        return tuple((FREE_SAVED + str(p), 0) for p in places)

    def grad(w: int) -> Step:
        return (GRADS + str(w), 0)

    def rope(n: str, size: int, sdpa: str) -> tuple[Step, ...]:
        return (
            (n + "m", size), (n + "n", size // 2), (n + "s1", size), *free(n + "n"), (n + "s2", size),
            *free(n + "m"), (n + "a", size), *free(n + "s1", n + "s2"), (n + "m2", size), *free(sdpa),
            (n + "g", size), *free(n + "a", n + "m2"),
        )  # fmt: skip

    return (
        (ARRIVING, x),  # the gradient arriving from above
        grad(DOWN_W), ("dd", i), *saved(down_in), ("gu", i), ("ga", i), *free("dd"), *saved(up, act),
        grad(UP_W), ("upin", x), *free("gu"), ("sb", i), *free("ga"), *saved(gate),
        grad(GATE_W), ("gatein", x), *free("sb"), *saved(MLP_IN), ("sum", x), *free("upin", "gatein"),
        *_rmsnorm(ctx, "sum", (POST_CAST, POST_RSQRT, POST_FP32), POST_NORM_W, keep=True),
        ("res", x), *free("down", ARRIVING),
        grad(O), ("oin", x), *attention,
        *rope("k", kv, "dk"), *rope("q", q, "dq"),
        grad(V), ("vin", x), *free("dv"), ("kc", kv), *free("kg"), grad(K), ("kin", x), *free("kc"),
        ("s1", x), *free("vin", "kin"), ("qc", q), *free("qg"), grad(Q), ("qin", x), *free("qc"),
        *saved(ATTN_IN), ("s2", x), *free("s1", "qin"),
        *_rmsnorm(ctx, "s2", (IN_CAST, IN_RSQRT, IN_FP32), IN_NORM_W, keep=True),
        # the layer's input gradient: the next layer's arriving one (a later pipeline stage's bottom layer: sent)
        (INPUT_GRADIENT, x), *free("res", "down", INPUT_GRADIENT),
    )  # fmt: skip


def eager_layer_forward_transients(ctx: Any) -> tuple[Step, ...]:
    """A Llama layer's eager forward op by op on a pipeline stage where ``eager_layer_backward_transients``
    writes its backward (no activation checkpointing), each saved tensor made by the op that saves it
    (``SAVED_AT``, at the places the backward frees them from) instead of all at once after the second norm
    (``forward.layer_forward_transients``, which one GPU and the other layouts keep: on one GPU these steps move
    llama-3.1-8b b1 x 2048's reserved by -0.64%, not yet held to its measured runs). Each RMSNorm (transformers
    5.24.0 ``LlamaRMSNorm.forward``): ``x.to(float32)``
    (saved), ``x.pow(2)`` and its ``mean`` (fp32 T x 1, freed last), ``+ eps`` then ``rsqrt`` (saved), ``x *
    rsqrt`` (fp32, freed once cast), ``.to(bf16)`` (saved) and ``weight *`` it (saved: the projections' input);
    the attention (``LlamaAttention.forward``): q, k, v projections (v saved by SDPA as made; q, k freed after
    RoPE), ``apply_rotary_pos_emb`` per ``rotate_half`` (``q * cos``, the negated half, ``cat``, ``* sin``, their
    sum saved by SDPA), SDPA's output and logsumexp, o_proj's output freed at the residual add; the MLP
    (``LlamaMLP.forward``): gate's output, ``silu``, up's, their product (all saved), down's output freed at the
    residual add. Held op by op to the fake-tensor trace of a pipeline stage of the h 512 Llama
    (tests/engine/test_pp_stream.py). Else empty (``forward.layer_forward_transients``)."""
    if ctx.par.pp == 1 or ctx.scenario.activation_checkpointing != "none":
        return ()
    if not eager_layer_backward_transients(ctx):
        return ()
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    x = _bytes(ctx)[0]
    q, kv = 2 * D.T * D.hq, 2 * D.T * D.hkv  # bf16 or fp16 weights (``_applies``)

    def at(*places: int) -> tuple[Step, ...]:
        return tuple((SAVED_AT + str(p), 0) for p in places)

    return (
        *norm_forward(ctx, IN_FP32, IN_RSQRT, IN_CAST, ATTN_IN),
        ("q", q), ("k", kv), *at(SDPA_V), *rope_forward(q, at(SDPA_Q)), *rope_forward(kv, at(SDPA_K)),
        ("q", 0), ("k", 0), *at(SDPA_OUT, SDPA_LSE), ("o", x), ("res", x), ("o", 0),
        *norm_forward(ctx, POST_FP32, POST_RSQRT, POST_CAST, MLP_IN),
        *at(GATE, ACT, UP, DOWN_IN), ("down", x), (OUT, x), ("down", 0), ("res", 0), (IN, 0),
    )  # fmt: skip


def norm_forward(ctx: Any, fp32: int, rsqrt: int, cast: int, normed: int) -> tuple[Step, ...]:
    """An RMSNorm's forward (transformers 5.24.0 ``LlamaRMSNorm.forward``) with its saved tensors at their places:
    ``x.to(float32)`` (``fp32``), ``x.pow(2)`` and its ``mean`` (fp32 T x 1, freed last), ``+ eps`` then ``rsqrt``
    (``rsqrt``), ``x * rsqrt`` (fp32, freed once cast), ``.to(bf16)`` (``cast``) and ``weight *`` it
    (``normed``)."""
    _, f, t = _bytes(ctx)
    at = [(SAVED_AT + str(p), 0) for p in (fp32, rsqrt, cast, normed)]
    return (
        at[0], ("pow", f), ("mean", t), ("pow", 0), ("eps", t), at[1], ("eps", 0), ("xr", f), at[2], at[3],
        ("xr", 0), ("mean", 0),
    )  # fmt: skip


def rope_forward(size: int, embed: tuple[Step, ...]) -> tuple[Step, ...]:
    """``apply_rotary_pos_emb`` of q or k (``size`` bytes) per ``rotate_half``: ``x * cos``, the negated half,
    ``cat``, ``* sin``, then ``embed`` where their sum is made (a saved tensor, or a transient)."""
    return (
        ("m1", size), ("neg", size // 2), ("cat", size), ("neg", 0), ("m2", size), ("cat", 0), *embed,
        ("m1", 0), ("m2", 0),
    )  # fmt: skip


def rotary_transients(ctx: Any) -> tuple[Step, ...]:
    """The rotary embedding's forward at the start of each model forward (``LlamaRotaryEmbedding.forward`` on
    position ids of one row: ``inv_freq @ position_ids.float()``, ``cat``, ``cos`` and ``sin`` each times
    ``attention_scaling``, cast to the layers' dtype) on a Llama-style layout in 16-bit weights, else empty: the
    positions (``arange``, int64, alive until the layers have run: the ``forward.OUT`` of these steps), their
    fp32 copy, the fp32 frequencies (s x d/2), ``cat`` (s x d) and the four fp32 s x d products, ``forward.SAVED``
    where the 16-bit cos and sin are made, then the fp32 buffers freed. A pipeline stage runs it every
    micro-batch (``trace/pipeline.StageModule``), while the earlier micro-batches' tensors are alive."""
    if not _applies(ctx):
        return ()
    from memsim_widget.engine.activations.dims import Dims

    s, d = ctx.scenario.seq_len, Dims(ctx).d
    f = 4 * s * d
    return (
        (OUT, 8 * s), ("pos", 4 * s), ("freqs", 2 * s * d), ("pos", 0), ("emb", f), ("cos", f), ("cs", f),
        ("cos", 0), ("sin", f), ("sn", f), ("sin", 0), (SAVED, -1), ("freqs", 0), ("emb", 0), ("cs", 0),
        ("sn", 0),
    )  # fmt: skip
