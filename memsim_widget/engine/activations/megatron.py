"""Megatron-LM's fused kernels: the per-layer activations of Korthikanti et al. 2022 Table 2 (arXiv 2205.05198),
generalised to any MLP width, instead of the HF rules."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.context import Context


def megatron_activations(ctx: Context) -> ActivationBudget:
    """Megatron-LM with fused kernels: Korthikanti et al. 2022 Table 2, generalised to any MLP width.

    Per layer s*b*h*(18 + 4*I/h) for a GELU MLP (34 at I = 4h); a gated MLP (SwiGLU) keeps one more
    T x I tensor of 2 bytes, hence 18 + 6*I/h. Without sequence parallelism 10*s*b*h (norm inputs,
    dropout masks) stay outside the tensor-parallel regions. Flash attention and selective
    recomputation drop the 5*a*s^2*b/t attention-score term. Under a TransformerEngine fp8 recipe the four
    Linear inputs are saved quantised (``Fp8Recipe.saved_input_bytes``: TE ``_Linear.forward`` saves the fp8
    input; memsim_widget/fp8.py), not at 2 B.
    """
    arch, sc = ctx.arch, ctx.scenario
    D = Dims(ctx)
    t = D.tp
    s, b, h = D.s, D.b, arch.hidden_size
    gated = arch.mlp_activation in ("swiglu", "geglu")
    mlp = 18 + (6 if gated else 4) * arch.intermediate_size / h
    out = ActivationBudget()
    sel = sc.activation_checkpointing in ("selective", "full") or sc.attention == "sdpa"
    if D.sp:
        per = s * b * h * mlp / t
        f = f"s x b x h x ({mlp:.1f})/t"
    else:
        per = s * b * h * (10 + (mlp - 10) / t)
        f = f"s x b x h x (10 + {mlp - 10:.1f}/t)"
    name = "layer activations (Korthikanti Table 2)"
    fp8 = sc.fp8
    if fp8 is not None and fp8.saved_input_bytes:  # TransformerEngine saves each Linear input quantised
        q, i = fp8.saved_input_bytes, arch.intermediate_size
        # the 4 Linear inputs of Table 2 (QKV, projection, fc1: h wide; fc2: I wide), 2 B each there; without
        # sequence parallelism the QKV and fc1 inputs sit outside the tensor-parallel regions
        wide = (3 * h + i) / t if D.sp else 2 * h + (h + i) / t
        per -= (2 - q) * s * b * wide
        f += f" - (2 - {q:g}) B x s x b x (Linear inputs: 3h + I{'' if D.sp else ', QKV and fc1 not /t'})"
        name += f", Linear inputs saved at {q:g} B ({fp8.name})"
    out.per_layer.append(Term(name, per, f, 10))
    if not sel:
        att = 5 * arch.num_heads * s * s * b / t
        out.per_layer.append(Term("attention scores, softmax, dropout", att, "5 x a x s^2 x b / t", 3))
    if sc.activation_checkpointing == "full":
        out.checkpointed_layer = [
            Term("checkpointed layer inputs", 2 * s * b * h / (t if D.sp else 1), "2 B x s x b x h", 1)
        ]
    out.inputs.append(Term("input ids and labels", 16 * b * ctx.seq_len, "2 x 8 B x b x s", 2))
    V = D.V
    out.post.append(Term("logits (fp32, vocab-parallel cross-entropy)", 4 * D.T * V, "4 B x T x V/t", 1))
    out.loss_backward.append(Term("cross-entropy backward buffer", 4 * D.T * V, "4 B x T x V/t", 1))
    out.layer_backward.append(
        Term(
            "activation gradients of the layer in backward",
            4 * D.T * h + 2 * D.T * D.I,
            "4 B x T x h + 2 B x T x I",
            3,
        )
    )
    return out
