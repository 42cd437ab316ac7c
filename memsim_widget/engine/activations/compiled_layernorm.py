"""``compile: true`` for the LayerNorm + GeLU families: GPT-2, BERT (and RoBERTa, the same encoder) and ViT, traced.

Dynamo captures the HF model, AOTAutograd splits forward and backward with Inductor's decompositions and min-cut
partitioner (trace/compiled.py); what each saves: ``benchmarks/compiled_saved.py "<case>"``. Per layer, with e the
compute dtype's bytes, r the residual stream's (4 under autocast), T tokens, h hidden, I the MLP width:

- the residual stream twice (2 r T h): each LayerNorm's input in 16 bits (the residual after attention and the
  layer's output, which the next layer's, or the final, norm reads), or under autocast (amp-bf16 or amp-fp16: the
  same bytes, another 16-bit dtype) each LayerNorm's fp32 normalised tensor instead (the same size); BERT,
  post-norm, saves its two pre-norm sums;
- each LayerNorm's output as the Linears read it (2 e T h: under autocast one 16-bit cast shared by q, k and v,
  eager casts it three times), or for BERT each norm's output (the attention output norm feeds the MLP, the output
  norm the next layer);
- q, k, v, the attention output (4 e T h, SDPA's; GPT-2's q is a view of the fused c_attn output, which stays alive
  whole, and k and v are contiguous copies: 2 e T h more) and SDPA's fp32 logsumexp (4 T a);
- the MLP's input to the GeLU and its output (2 e T I; the GeLU output is what the down projection's weight
  gradient reads, so it exists in backward; GPT-2's tanh-GeLU chain, which eager keeps in fp32 pieces, is
  recomputed);
- each LayerNorm's statistics: mean and rstd in 16 bits (2 x 2 e T), under autocast one fp32 1/(h sigma) (2 x 4 T);
- with hidden dropout (GPT-2's resid_pdrop, BERT's hidden_dropout_prob) the boolean mask of each of the two
  dropouts (2 x 1 B x T h): Inductor decomposes ``native_dropout`` to ``rand_like(x) > p`` and the min-cut
  partitioner never recomputes a random op (torch 2.13 ``torch/_functorch/partitioners.py``,
  ``should_ban_recomputation``: "random op"; ``functionalize_rng_ops``, which would let it replay the generator,
  is off by default), so it saves the smallest tensor downstream of the ``rand_like``, the mask;
- under autocast the 16-bit casts of the layer's Linear weights (2 B per weight).

Before the layers the embedding output (r T h: ViT's patch and position sum, BERT's embedding sum and the dropout's
copy of its LayerNorm output, GPT-2's token and position embeddings; under autocast GPT-2's fp32 sum and BERT's
embedding norm's fp32 normalised tensor and 1/sigma) and the embedding dropout's mask (T h); after them the final
norm's (or the MLM head's) terms, under autocast also the head weights' 16-bit casts. The loss keeps the e-byte
logits and its fp32 row max and log-sum-exp (GPT-2, BERT: the compiled loss of the Llama-layout decoders); the top
of backward holds one T x V gradient buffer (fp32 for GPT-2 and under autocast) and the zero gradients AOTAutograd
makes for the unused logits. GPT-2 returns its KV cache, which the loop holds with the output (2 e T h a layer),
and its top of backward is the larger of two traced instants: the loss's backward (the fp32 T x V buffer beside a
second copy of the logits) and, once both are freed, the head's (the 16-bit logits gradient, the zero gradients of
the returned KV cache, 16-bit since no RoPE upcasts k, and of the hidden output, the head weight's gradient); the
head's is larger at a small vocabulary, the loss's at GPT-2's 50,257. The layers' backward transients stay
eager's.

Attention dropout runs inside CUDA's fused SDPA kernels, which save their Philox seed and offset instead of a mask
(``_scaled_dot_product_efficient_attention`` and ``_flash_attention`` return them, torch 2.13
``native_functions.yaml``): the rule takes the saved set without attention dropout and the caveat says it is
untraced, since on a CPU SDPA sends attention dropout down the math kernel (s^2 fp32 tensors).

With HF's full checkpointing (GPT-2 in bf16, ``CKPT_TRACED``) every layer keeps its input (e T h) and the backward
recomputes one layer's set above (Dynamo's checkpoint higher-order op; dropout's masks regenerated from the saved
generator state); HF turns the KV cache off. Its peak is the loss's backward at a real vocabulary (+0.3%) and the
bottom layer's backward at V 1000, with eager's layer-backward transients (+0.8%). BERT's checkpointed rule was
+8.4% over its trace (which peaks in the optimizer step), no closer than the formula (+7.0%): BERT, RoBERTa and
autocast keep the formula under checkpointing.

**ViT under autocast on CUDA** (``CUDA_MATH_SDPA``, traced on fake CUDA tensors:
``benchmarks/compiled_fake_cuda.py --mask-517``): transformers 5.17 (the H200 runs') builds HF's bidirectional
mask even when there is no padding mask, because ``masking_utils._ignore_bidirectional_mask_sdpa`` declines to skip
it whenever ``is_tracing`` holds, as it does under ``torch.compile`` (transformers issue 48925; 5.24 skips it). For
ViT that mask is an all-visible (b, 1, s, s) boolean, an expand of a (1, 1, s, 1) column: its last dim has stride
0. CUDA's SDPA chooser refuses every fused kernel for a mask whose last dim does not have stride 1
(``check_last_dim_stride_equals_1_dense``, torch 2.13.0 ``ATen/native/transformers/sdp_utils_cpp.h``: the CPU's
is exempt, which is why the CPU trace runs its flash kernel), so the compiled step runs SDPA's math composite:
q, k and v upcast to fp32, fp32 scores and probabilities of b x heads x s x s. The partitioner saves per layer the
fp32 probabilities instead of the logsumexp (4 b a s^2: in one layer the scores with their row max and sum and the
mask's row, 9 T a, instead), q, k and v as 16-bit copies (the same bytes as the kernel's), and the backward of one
layer's attention holds the fp32 gradients of the probabilities and of the scores (8 b a s^2). Eager (mask
skipped) takes the fused kernels. 12 layers of ViT-B at b 64: 1.43 GB of fp32 probabilities, the 15% the H200's
compiled run allocated over eager (``math_sdpa=True``; held back from the default: ``HELD_BACK``).

Traced pairs (docs/fidelity.md): GPT-2, BERT and RoBERTa in bf16, amp-bf16 and amp-fp16, with hidden dropout or
without; GPT-2 in bf16 with HF's full checkpointing; ViT in bf16 without dropout (the CPU trace), ViT in amp-bf16
(the CPU trace, and on fake CUDA tensors with transformers 5.17's compile mask; held back: ``HELD_BACK``); full
training, SDPA, one GPU. BERT and RoBERTa build
the same bidirectional mask under transformers 5.17 when no padding mask is given; their rule keeps the CPU trace's
fused kernel (no compiled GPU run of theirs is measured).
"""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.activations.tangents import LOGITS_TANGENT, LOSS_GRADIENT
from memsim_widget.engine.context import Context
from memsim_widget.scenario import Scenario

#: The families this rule covers and the (precision, method) pairs traced compiled for each.
_AMP = (("bf16", "full"), ("amp-bf16", "full"), ("amp-fp16", "full"))
TRACED: dict[str, tuple[tuple[str, str], ...]] = {
    "gpt2": _AMP,
    "bert": _AMP,
    "roberta": _AMP,
    "vit": (("bf16", "full"),),
}
#: Families traced compiled with hidden dropout (GPT-2's resid_pdrop and embd_pdrop, BERT's hidden_dropout_prob):
#: the partitioner saves each dropout's boolean mask (``native_dropout`` decomposes to ``rand_like(x) > p``; a random
#: op is never recomputed, torch 2.13 ``partitioners.py`` ``should_ban_recomputation``: "random op"), 1 B per element,
#: and nothing else changes. Attention dropout runs inside CUDA's fused SDPA kernel (its Philox seed and offset
#: saved, a few bytes); a CPU trace cannot show it (SDPA falls back to the math kernel on a CPU), said in the caveat.
DROPOUT_TRACED = frozenset({"gpt2", "bert", "roberta"})
#: (family, precision) pairs whose compiled step runs SDPA's math composite on CUDA under transformers 5.17 (module
#: docstring: its stride-0 bidirectional mask under compile, refused by CUDA's fused kernels): traced on fake CUDA
#: tensors (benchmarks/compiled_fake_cuda.py --mask-517), applied with ``layernorm_activations(..., math_sdpa=True)``.
CUDA_MATH_SDPA: frozenset[tuple[str, str]] = frozenset({("vit", "amp-bf16")})
#: Traced but held back: ViT in amp-bf16. The H200's compiled ViT-B (transformers 5.17) allocated 15% more than eager
#: because of the math SDPA above; transformers 5.24 (the project's traces) skips the mask and saves the CPU trace's
#: set (9% under eager), and timm's ViT (the torchao ViT-H rows, compiled) passes no mask at all. The scenario does not
#: say which transformers runs, so the engine keeps eager's layers there (between the two). With the math-SDPA rule
#: (issue 26): H200 vitb-amp-compile allocated -13.9% -> +1.2%, its reserved +4.2% -> +23.3% and nvidia-smi +0.7% ->
#: +18.0% (the fitted fragmentation grows with the activations), the torchao ViT-H rows +0.7..+2.9% -> +7.1..+13.0%;
#: with the CPU trace's rule -19.9%. tests/engine/test_compiled.py holds both branches to their traces.
HELD_BACK: dict[str, tuple[tuple[str, str], ...]] = {"vit": (("amp-bf16", "full"),)}


def layernorm_rule_applies(sc: Scenario, arch: Architecture) -> bool:
    """A compiled step of GPT-2, BERT/RoBERTa or ViT as traced: the traced precision, full training, SDPA, dropout
    where traced (``DROPOUT_TRACED``; ViT without), no checkpointing, the standard loss in HF's loop, one GPU's
    layout (tp = cp = ep = 1); no checkpointing but where traced (``CKPT_TRACED``)."""
    p = sc.parallel
    return bool(
        sc.compile
        and arch.family in TRACED
        and (sc.precision, sc.method) in TRACED[arch.family]
        and arch.norm == "layernorm"
        and not arch.is_moe
        and (arch.family in DROPOUT_TRACED or not has_dropout(arch))
        and (sc.activation_checkpointing == "none" or _full_ckpt_traced(sc, arch))
        and sc.attention == "sdpa"
        and sc.loss == "standard"
        and sc.framework == "hf"
        and sc.objective_name == "sft"
        and p.tp == p.cp == p.ep == 1
    )


#: (family, precision) pairs traced compiled under HF's full checkpointing of every layer.
CKPT_TRACED: frozenset[tuple[str, str]] = frozenset({("gpt2", "bf16")})


def _full_ckpt_traced(sc: Scenario, arch: Architecture) -> bool:
    """HF's full checkpointing of every layer, compiled, where traced (``CKPT_TRACED``)."""
    return (
        sc.activation_checkpointing == "full"
        and (sc.checkpoint_every or 1) == 1
        and (arch.family, sc.precision) in CKPT_TRACED
    )


def has_dropout(arch: Architecture) -> bool:
    """Any dropout in the model: hidden, attention or GPT-2's embedding dropout (``embd_pdrop``)."""
    return bool(arch.hidden_dropout or arch.attention_dropout or embedding_dropout(arch))


def embedding_dropout(arch: Architecture) -> float:
    """The dropout after the embeddings: GPT-2's ``embd_pdrop``; BERT's and RoBERTa's embeddings use
    ``hidden_dropout_prob`` (HF ``BertEmbeddings``)."""
    if arch.family in ("bert", "roberta"):
        return arch.hidden_dropout
    return arch.facts.dropout.embedding


def layernorm_activations(
    ctx: Context, out: ActivationBudget, weight_numel: int, math_sdpa: bool = False
) -> None:
    """Replace the eager terms of ``out`` by the compiled step's (module docstring). ``weight_numel``: one layer's
    Linear weights (their 16-bit casts under autocast); ``math_sdpa``: SDPA runs CUDA's math composite
    (``CUDA_MATH_SDPA``)."""
    D = Dims(ctx)
    T, h, I, a = D.T, D.h, D.I, D.a
    amp = ctx.scenario.precision in ("amp-bf16", "amp-fp16")
    e = 2 if amp else ctx.recipe.act_bytes
    r = 4 if amp else e
    fam = ctx.arch.family
    stats = (2 * 4 * T, "2 x 4 B x T") if amp else (2 * 2 * e * T, f"2 x 2 x {e} B x T")
    ckpt = ctx.scenario.activation_checkpointing == "full"
    qkv_extra = fam == "gpt2"  # q's view keeps the fused c_attn output whole; k and v are copied
    out.per_layer[:] = [
        Term("compiled: residual stream (LayerNorm inputs, or fp32 normalised tensors under autocast)",
             2 * r * T * h, f"2 x {r} B x T x h (h={h})", 2),
        Term("compiled: LayerNorm outputs as the Linears read them", 2 * e * T * h, f"2 x {e} B x T x h", 2),
        Term("compiled: q, k, v and the attention output", 4 * e * T * h, f"4 x {e} B x T x h", 4),
        *([Term("compiled: fused c_attn output kept whole by q, k and v copied", 2 * e * T * h,
                f"2 x {e} B x T x h", 2),
           *([Term("compiled: the returned KV cache (k and v), held with the model's output", 2 * e * T * h,
                   f"2 x {e} B x T x h", 2)] if not ckpt else [])] if qkv_extra else []),
        attention_softmax_term(ctx, a, math_sdpa),
        Term("compiled: GeLU input and output", 2 * e * T * I, f"2 x {e} B x T x I, I={I}", 2),
        Term("compiled: LayerNorm statistics", stats[0], stats[1], 2 if amp else 4),
    ]  # fmt: skip
    if ctx.arch.hidden_dropout > 0:  # the boolean masks of the dropouts after attention and after the MLP
        out.per_layer.append(Term("compiled: hidden dropout masks (bool)", 2 * T * h, "2 x 1 B x T x h", 2))
    if amp:
        n = 4 if fam == "gpt2" else 6
        out.per_layer.append(Term("compiled autocast: 16-bit copies of the layer's Linear weights", 2 * weight_numel,
                                  f"2 B x {weight_numel:,} weights", n))  # fmt: skip
    # HF's full checkpointing compiled (traced): each layer keeps its input, the backward recomputes one layer's set
    out.checkpointed_layer[:] = (
        [Term("compiled checkpointed layer input (residual stream)", r * T * h, f"{r} B x T x h", 1)]
        if ckpt
        else []
    )
    out.recomputed_layer[:] = list(out.per_layer) if ckpt else []
    out.cache_per_layer[:] = []
    if fam == "vit":
        _vit_ends(ctx, out, e, r)
    elif fam == "gpt2":
        _gpt2_ends(ctx, out, e, r)
    else:
        _bert_ends(ctx, out, e, r)
    if embedding_dropout(ctx.arch) > 0:
        out.pre.append(Term("compiled: embedding dropout mask (bool)", T * h, "1 B x T x h", 1))
    if math_sdpa:
        _math_sdpa_ends(ctx, out)


def attention_softmax_term(ctx: Context, a: int, math_sdpa: bool) -> Term:
    """What the partitioner saves of SDPA's softmax per layer: the fused kernel's fp32 logsumexp (4 T a), or under
    CUDA's math composite (``CUDA_MATH_SDPA``) the fp32 probabilities, b x heads x s x s."""
    D = Dims(ctx)
    if math_sdpa:
        return Term("compiled CUDA math SDPA: fp32 attention probabilities (transformers 5.17's stride-0 mask)",
                    4 * D.b * a * D.s * D.s_full, f"4 B x b x heads x s x s, heads={a}", 1)  # fmt: skip
    return Term("compiled: SDPA logsumexp (fp32)", 4 * D.T * a, f"4 B x T x heads, heads={a}", 1)


def _math_sdpa_ends(ctx: Context, out: ActivationBudget) -> None:
    """CUDA's math SDPA compiled (module docstring): one layer saves its fp32 scores with their fp32 row max and sum
    and the mask's boolean row (9 B x T x heads) where the others save probabilities; one layer's attention backward
    holds the fp32 gradients of its probabilities and scores (8 B x b x heads x s x s) beside the saved set."""
    D = Dims(ctx)
    out.post.append(Term("compiled CUDA math SDPA: one layer's row max and sum (fp32) and mask row (bool)",
                         9 * D.T * D.a, "(4 + 4 + 1) B x T x heads", 3))  # fmt: skip
    out.attention_backward[:] = [Term("compiled CUDA math SDPA backward: fp32 gradients of probabilities and scores",
                                      8 * D.b * D.a * D.s * D.s_full, "(4 + 4) B x b x heads x s x s", 2)]  # fmt: skip


def _vit_ends(ctx: Context, out: ActivationBudget, e: int, r: int) -> None:
    """ViT: the patch and position embedding sum (layer 0's norm input, r T h; under autocast layer 0's norm
    saves it instead of its normalised tensor and the final norm saves its normalised tensor, the same bytes), the
    final norm's output (bf16; under autocast only the class token's 16-bit cast, b h) and statistics; the
    classifier's loss is b x labels, a few bytes."""
    D = Dims(ctx)
    T, h, b = D.T, D.h, ctx.scenario.micro_batch_size
    out.pre[:] = [
        Term("compiled: embedding output (layer 0's LayerNorm input)", r * T * h, f"{r} B x T x h", 1)
    ]
    if r == 4:
        out.post[:] = [Term("compiled: final LayerNorm 1/sigma (fp32), class token's 16-bit cast", 4 * T + 2 * b * h,
                            "4 B x T + 2 B x b x h", 2)]  # fmt: skip
    else:
        out.post[:] = [Term("compiled: final LayerNorm output and statistics", e * T * h + 2 * e * T,
                            f"{e} B x T x h + 2 x {e} B x T", 3)]  # fmt: skip


def _gpt2_ends(ctx: Context, out: ActivationBudget, e: int, r: int) -> None:
    """GPT-2: the token and position embeddings (e T h + e s h; their sum recomputed; under autocast the fp32 sum,
    r T h), the final norm's output (the head's input) and statistics (under autocast its fp32 normalised tensor,
    the 16-bit cast the head reads, its fp32 1/(h sigma) and the head weight's 16-bit cast); the loss is the compiled
    causal-LM loss (compiled.compiled_formula, traced on the Llama-layout decoders and the same aten graph after the
    head)."""
    D = Dims(ctx)
    T, h, s, V = D.T, D.h, D.s, D.V
    if r == 4:
        out.pre[:] = [Term("compiled autocast: embedding sum (fp32)", r * T * h, f"{r} B x T x h", 1)]
        out.post[:] = [
            Term("compiled autocast: final LayerNorm fp32 normalised tensor, its 16-bit cast, 1/sigma (fp32)",
                 r * T * h + e * T * h + 4 * T, f"{r} B x T x h + {e} B x T x h + 4 B x T", 3),
            Term("compiled autocast: 16-bit copy of the head's weight", 2 * V * h, "2 B x V x h", 1),
        ]  # fmt: skip
    else:
        out.pre[:] = [Term("compiled: token and position embeddings", e * T * h + e * s * h,
                           f"{e} B x T x h + {e} B x s x h", 2)]  # fmt: skip
        out.post[:] = [Term("compiled: final LayerNorm output (head input) and statistics", e * T * h + 2 * e * T,
                            f"{e} B x T x h + 2 x {e} B x T", 3)]  # fmt: skip
    L = ctx.arch.num_layers
    cache = (
        2 * e * T * h * L if ctx.scenario.activation_checkpointing == "none" else 0
    )  # HF: no cache under ckpt
    out.loss_forward[:] = []
    out.loss_saved[:] = [
        Term("compiled loss: logits", e * T * V, f"{e} B x T x V, V={V}", 1),
        Term("compiled loss: row max, log-sum-exp, label index and mask", 17 * T, "17 B x T", 4),
    ]
    # traced: the loss's backward (its fp32 buffer beside a second copy of the logits), then the head's backward
    # (the 16-bit logits gradient, the zero gradients of the returned KV cache and hidden output, the head weight's
    # gradient) once that copy and the buffer are freed: the larger of the two, the head's at a small vocabulary
    loss_top = 4 * T * V + e * T * V
    head = e * T * V + cache + e * T * h + e * V * h
    out.loss_backward[:] = [
        Term("compiled loss backward: one fp32 T x V gradient buffer and a second copy of the logits", loss_top,
             f"4 B x T x V + {e} B x T x V", 2),
        *([Term("compiled head backward beyond it: the 16-bit logits gradient, the zero gradients of the returned "
                "KV cache and hidden output, the head weight's gradient", head - loss_top,
                f"{e} B x T x V + 2 x {e} B x T x h x {L} + {e} B x T x h + {e} B x V x h - ({4 + e} B x T x V)",
                2 * L + 3)] if head > loss_top else []),
    ]  # fmt: skip


def _bert_ends(ctx: Context, out: ActivationBudget, e: int, r: int) -> None:
    """BERT/RoBERTa (post-norm, MLM head): the embedding sum (the embedding LayerNorm's input), its statistics and
    the dropout's copy of its output (layer 0's input), under autocast the norm's fp32 normalised tensor and 1/sigma
    instead; the MLM head's dense output (its erf GeLU and LayerNorm input recomputed) and LayerNorm output and
    statistics (under autocast also the 16-bit cast of the last layer's output the dense reads, and the dense's and
    decoder's weight casts); the loss keeps the e-byte logits and its fp32 row max and log-sum-exp (8 T; no e-byte
    log-softmax), and the top of backward one T x V buffer (in the logits' dtype; fp32 under autocast) and the
    logits' zero gradient. Under autocast the compiled trace runs the loss as CUDA autocast does (traced:
    trace/cuda_autocast.py, ``cuda_fp32_ops_when_autocast``): a 16-bit log-softmax (computed in fp32 inside the
    fused kernel, rounded to 16 bits), then nll_loss on its fp32 copy (CUDA's fp32 list), all fused, so nothing T x V
    is saved but the logits; the backward's buffer is nll_loss's fp32 gradient (zeros scattered at the labels),
    fp32 because nll_loss runs in fp32, the whole log-softmax backward fused into the logits' 16-bit gradient. The
    CPU policy (the logits cast to fp32 first, the loss all fp32) gives the same buffers under Inductor: the compiled
    cases' peaks did not move when the trace changed policy."""
    D = Dims(ctx)
    T, h, V = D.T, D.h, D.V
    if r == 4:
        out.pre[:] = [Term("compiled autocast: embedding LayerNorm fp32 normalised tensor and 1/sigma (fp32)",
                           r * T * h + 4 * T, f"{r} B x T x h + 4 B x T", 2)]  # fmt: skip
        out.post[:] = [
            Term("compiled autocast: MLM head dense input (16-bit cast) and output, LayerNorm output and statistics",
                 3 * e * T * h + 2 * e * T, f"3 x {e} B x T x h + 2 x {e} B x T", 5),
            Term("compiled autocast: 16-bit copies of the head's dense and decoder weights", 2 * (h + V) * h,
                 "2 B x (h + V) x h", 2),
        ]  # fmt: skip
    else:
        out.pre[:] = [Term("compiled: embedding sum and the dropout's copy of its LayerNorm output, statistics",
                           2 * e * T * h + 2 * e * T, f"2 x {e} B x T x h + 2 x {e} B x T", 4)]  # fmt: skip
        out.post[:] = [Term("compiled: MLM head dense output, LayerNorm output and statistics",
                            2 * e * T * h + 2 * e * T, f"2 x {e} B x T x h + 2 x {e} B x T", 4)]  # fmt: skip
    g = 4 if r == 4 else e  # nll_loss's gradient dtype (autocast runs nll_loss in fp32 on CUDA and CPU alike)
    out.loss_forward[:] = []
    out.loss_saved[:] = [
        Term("compiled loss: logits", e * T * V, f"{e} B x T x V, V={V}", 1),
        Term("compiled loss: row max, log-sum-exp (fp32)", 8 * T, "8 B x T", 2),
    ]
    out.loss_backward[:] = [  # nll_loss's gradient: g bytes (fp32 under autocast, else the logits' dtype)
        Term(f"compiled loss backward: one {LOSS_GRADIENT}", g * T * V, f"{g} B x T x V", 1),
        Term(f"zero gradients AOTAutograd makes for the {LOGITS_TANGENT}", e * T * V, f"{e} B x T x V", 1),
    ]
