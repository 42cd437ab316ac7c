"""``compile: true`` for the LayerNorm + GeLU families: GPT-2, BERT (and RoBERTa, the same encoder) and ViT, traced.

Dynamo captures the HF model, AOTAutograd splits forward and backward with Inductor's decompositions and min-cut
partitioner (trace/compiled.py); what each saves: ``benchmarks/compiled_saved.py "<case>"``. Per layer, with e the
compute dtype's bytes, r the residual stream's (4 under autocast), T tokens, h hidden, I the MLP width:

- the residual stream twice (2 r T h): each LayerNorm's input in 16 bits (the residual after attention and the
  layer's output, which the next layer's, or the final, norm reads), or under autocast (amp-bf16, ViT) each
  LayerNorm's fp32 normalised tensor instead (the same size); BERT, post-norm, saves its two pre-norm sums;
- each LayerNorm's output as the Linears read it (2 e T h: under autocast one 16-bit cast shared by q, k and v,
  eager casts it three times), or for BERT each norm's output (the attention output norm feeds the MLP, the output
  norm the next layer);
- q, k, v, the attention output (4 e T h, SDPA's; GPT-2's q is a view of the fused c_attn output, which stays alive
  whole, and k and v are contiguous copies: 2 e T h more) and SDPA's fp32 logsumexp (4 T a);
- the MLP's input to the GeLU and its output (2 e T I; the GeLU output is what the down projection's weight
  gradient reads, so it exists in backward; GPT-2's tanh-GeLU chain, which eager keeps in fp32 pieces, is
  recomputed);
- each LayerNorm's statistics: mean and rstd in 16 bits (2 x 2 e T), under autocast one fp32 1/(h sigma) (2 x 4 T);
- under autocast the 16-bit casts of the layer's Linear weights (2 B per weight).

Before the layers the embedding output (r T h: ViT's patch and position sum, BERT's embedding sum and the dropout's
copy of its LayerNorm output, GPT-2's token and position embeddings); after them the final norm's (or the MLM
head's) terms. The loss keeps the e-byte logits and its fp32 row max and log-sum-exp (GPT-2, BERT: the compiled
loss of the Llama-layout decoders); the top of backward holds one T x V gradient buffer (fp32 for GPT-2) and the zero gradients
AOTAutograd makes for the unused logits (and GPT-2's returned KV cache). The layers' backward transients stay
eager's. Traced pairs (docs/fidelity.md): GPT-2 and BERT in bf16, ViT in bf16 (and amp-bf16, held back:
`HELD_BACK`), full training, SDPA, no dropout, no checkpointing, one GPU.
"""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.activations.tangents import LOGITS_TANGENT
from memsim_widget.engine.context import Context
from memsim_widget.scenario import Scenario

#: The families this rule covers and the (precision, method) pairs traced compiled for each.
TRACED: dict[str, tuple[tuple[str, str], ...]] = {
    "gpt2": (("bf16", "full"),),
    "bert": (("bf16", "full"),),
    "roberta": (("bf16", "full"),),
    "vit": (("bf16", "full"),),
}
#: Traced but held back: ViT in amp-bf16. Its CPU trace saves 9% less than eager, while the compiled ViT-B on an
#: H200 allocated 15% more than eager (docs/accuracy.md); until that CUDA-only path is understood the engine keeps
#: eager's layers there (closer to the GPU, and above the trace), and the amp branch of `layernorm_activations`
#: (the traced saved set) is held by tests/engine/test_compiled.py against the trace's counts.
HELD_BACK: dict[str, tuple[tuple[str, str], ...]] = {"vit": (("amp-bf16", "full"),)}


def layernorm_rule_applies(sc: Scenario, arch: Architecture) -> bool:
    """A compiled step of GPT-2, BERT/RoBERTa or ViT as traced: the traced precision, full training, SDPA, no
    dropout (the traces ran without; a compiled dropout's masks are untraced), no checkpointing, the standard loss
    in HF's loop, one GPU's layout (tp = cp = ep = 1)."""
    p = sc.parallel
    return bool(
        sc.compile
        and arch.family in TRACED
        and (sc.precision, sc.method) in TRACED[arch.family]
        and arch.norm == "layernorm"
        and not arch.is_moe
        and arch.hidden_dropout == 0
        and arch.attention_dropout == 0
        and sc.activation_checkpointing == "none"
        and sc.attention == "sdpa"
        and sc.loss == "standard"
        and sc.framework == "hf"
        and sc.objective_name == "sft"
        and p.tp == p.cp == p.ep == 1
    )


def layernorm_activations(ctx: Context, out: ActivationBudget, weight_numel: int) -> None:
    """Replace the eager terms of ``out`` by the compiled step's (module docstring). ``weight_numel``: one layer's
    Linear weights (their 16-bit casts under autocast)."""
    D = Dims(ctx)
    T, h, I, a = D.T, D.h, D.I, D.a
    amp = ctx.scenario.precision == "amp-bf16"
    e = 2 if amp else ctx.recipe.act_bytes
    r = 4 if amp else e
    fam = ctx.arch.family
    stats = (2 * 4 * T, "2 x 4 B x T") if amp else (2 * 2 * e * T, f"2 x 2 x {e} B x T")
    qkv_extra = fam == "gpt2"  # q's view keeps the fused c_attn output whole; k and v are copied
    out.per_layer[:] = [
        Term("compiled: residual stream (LayerNorm inputs, or fp32 normalised tensors under autocast)",
             2 * r * T * h, f"2 x {r} B x T x h (h={h})", 2),
        Term("compiled: LayerNorm outputs as the Linears read them", 2 * e * T * h, f"2 x {e} B x T x h", 2),
        Term("compiled: q, k, v and the attention output", 4 * e * T * h, f"4 x {e} B x T x h", 4),
        *([Term("compiled: fused c_attn output kept whole by q, k and v copied", 2 * e * T * h,
                f"2 x {e} B x T x h", 2)] if qkv_extra else []),
        Term("compiled: SDPA logsumexp (fp32)", 4 * T * a, f"4 B x T x heads, heads={a}", 1),
        Term("compiled: GeLU input and output", 2 * e * T * I, f"2 x {e} B x T x I, I={I}", 2),
        Term("compiled: LayerNorm statistics", stats[0], stats[1], 2 if amp else 4),
    ]  # fmt: skip
    if amp:
        out.per_layer.append(Term("compiled autocast: 16-bit copies of the layer's Linear weights", 2 * weight_numel,
                                  f"2 B x {weight_numel:,} weights", 6))  # fmt: skip
    out.checkpointed_layer[:] = []
    out.recomputed_layer[:] = []
    out.cache_per_layer[:] = []
    if fam == "vit":
        _vit_ends(ctx, out, e, r)
    elif fam == "gpt2":
        _gpt2_ends(ctx, out, e)
    else:
        _bert_ends(ctx, out, e)


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


def _gpt2_ends(ctx: Context, out: ActivationBudget, e: int) -> None:
    """GPT-2: the token and position embeddings (e T h + e s h; their sum recomputed), the final norm's output (the
    head's input) and statistics; the loss is the compiled causal-LM loss (compiled.compiled_formula, traced on
    the Llama-layout decoders and the same aten graph after the head)."""
    D = Dims(ctx)
    T, h, s = D.T, D.h, D.s
    out.pre[:] = [Term("compiled: token and position embeddings", e * T * h + e * s * h,
                       f"{e} B x T x h + {e} B x s x h", 2)]  # fmt: skip
    out.post[:] = [Term("compiled: final LayerNorm output (head input) and statistics", e * T * h + 2 * e * T,
                        f"{e} B x T x h + 2 x {e} B x T", 3)]  # fmt: skip
    # traced: the peak is the head's backward matmuls, the loss's fp32 gradient and its 16-bit cast still alive
    V = D.V
    out.loss_backward.append(Term("compiled head backward: hidden-state gradient and the head weight's gradient",
                                  e * T * h + e * V * h, f"{e} B x T x h + {e} B x V x h", 2))  # fmt: skip


def _bert_ends(ctx: Context, out: ActivationBudget, e: int) -> None:
    """BERT/RoBERTa (post-norm, MLM head): the embedding sum (the embedding LayerNorm's input), its statistics and
    the dropout's copy of its output (layer 0's input); the MLM head's dense output (its erf GeLU and LayerNorm
    input recomputed) and LayerNorm output and statistics; the loss keeps the e-byte logits and its fp32 row max and
    log-sum-exp (8 T; no e-byte log-softmax), and the top of backward one e-byte T x V buffer (the loss runs in the
    logits' dtype) and the logits' zero gradient."""
    D = Dims(ctx)
    T, h, V = D.T, D.h, D.V
    out.pre[:] = [Term("compiled: embedding sum and the dropout's copy of its LayerNorm output, statistics",
                       2 * e * T * h + 2 * e * T, f"2 x {e} B x T x h + 2 x {e} B x T", 4)]  # fmt: skip
    out.post[:] = [Term("compiled: MLM head dense output, LayerNorm output and statistics", 2 * e * T * h + 2 * e * T,
                        f"2 x {e} B x T x h + 2 x {e} B x T", 4)]  # fmt: skip
    out.loss_forward[:] = []
    out.loss_saved[:] = [
        Term("compiled loss: logits", e * T * V, f"{e} B x T x V, V={V}", 1),
        Term("compiled loss: row max, log-sum-exp (fp32)", 8 * T, "8 B x T", 2),
    ]
    out.loss_backward[
        :
    ] = [  # the MLM loss runs in the logits' dtype (no fp32 upcast): its gradient is e bytes
        Term("compiled loss backward: one T x V gradient buffer", e * T * V, f"{e} B x T x V", 1),
        Term(f"zero gradients AOTAutograd makes for the {LOGITS_TANGENT}", e * T * V, f"{e} B x T x V", 1),
    ]
