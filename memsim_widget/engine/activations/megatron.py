"""Megatron-LM's fused kernels: the per-layer activations of Korthikanti et al. 2022 Table 2 (arXiv 2205.05198),
generalised to any MLP width, instead of the HF rules."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.context import Context


def megatron_activations(ctx: Context) -> ActivationBudget:
    """Megatron-LM with fused kernels: Korthikanti et al. 2022 Table 2, generalised to any MLP width, to grouped
    key/value heads and to models without hidden dropout.

    Table 2 counts, per layer and token, in units of h bytes: outside the tensor-parallel regions the two norm
    inputs (4), the QKV and fc1 inputs (4) and two 1-B dropout masks (2); inside them Q, K, V and the attention
    output (8) and the MLP (4*I/h for GELU, 6*I/h for a gated MLP's one more T x I tensor), 34 at I = 4h. The
    Table assumes multi-head attention and dropout: with ``num_kv_heads`` < heads K and V are 2 B x kv_heads x
    head_dim wide each (Megatron-Core ``SelfAttention.get_query_key_value_tensors`` splits a GQA QKV output), and
    with ``hidden_dropout`` 0 no mask is saved (``bias_dropout_add`` calls ``F.dropout``, which returns its input
    at p = 0 and keeps no mask: PyTorch ``aten/src/ATen/native/Dropout.cpp``, fused only for 0 < p < 1; Llama
    runs Megatron with hidden and attention dropout 0: Megatron-Bridge ``src/megatron/bridge/models/llama/
    llama_provider.py``, commit 00b7660be025; Megatron-LM ``fusions/fused_bias_dropout.py``). Without sequence
    parallelism the outside terms stay unsplit. Flash attention and selective recomputation drop the
    5*a*s^2*b/t attention-score term. Under a TransformerEngine fp8 recipe the QKV, fc1 and fc2 inputs are saved
    quantised (``Fp8Recipe.saved_input_bytes``: TE ``_Linear.forward`` saves the fp8 input; memsim_widget/fp8.py)
    instead of at 2 B; the projection's quantised input is a copy beside the attention output flash attention
    saves for its own backward (``out`` in TE ``FusedAttnFunc.forward``), so it adds ``q`` B there, and replaces
    the 2 B only where the attention output is not otherwise saved (eager attention, selective recomputation).
    """
    arch, sc = ctx.arch, ctx.scenario
    D = Dims(ctx)
    t = D.tp
    s, b, h = D.s, D.b, arch.hidden_size
    gated = arch.mlp_activation in ("swiglu", "geglu")
    qo = (
        arch.num_heads * arch.head_dim / h
    )  # Q and the attention output, over h (1 when heads x head_dim = h)
    kv = arch.num_kv_heads * arch.head_dim / h  # K and V each, over h (1 for multi-head attention)
    masks = 2 if arch.hidden_dropout > 0 else 0
    outside = 8 + masks
    inside = 4 * qo + 4 * kv + (6 if gated else 4) * arch.intermediate_size / h
    out = ActivationBudget()
    sel = sc.activation_checkpointing in ("selective", "full") or sc.attention == "sdpa"
    if D.sp:
        per = s * b * h * (outside + inside) / t
        f = f"s x b x h x ({outside + inside:.2f})/t"
    else:
        per = s * b * h * (outside + inside / t)
        f = f"s x b x h x ({outside} + {inside:.2f}/t)"
    name = "layer activations (Korthikanti Table 2, K/V at kv heads, dropout masks only with hidden dropout)"
    fp8 = sc.fp8
    if fp8 is not None and fp8.saved_input_bytes:  # TransformerEngine saves each Linear input quantised
        q, i = fp8.saved_input_bytes, arch.intermediate_size
        # QKV and fc1 inputs (h wide, outside the tensor-parallel regions without sequence parallelism), fc2's (I)
        wide = (2 * h + i) / t if D.sp else 2 * h + i / t
        per -= (2 - q) * s * b * wide
        f += f" - (2 - {q:g}) B x s x b x (QKV, fc1, fc2 inputs: 2h + I{'' if D.sp else ', 2h not /t'})"
        proj = qo * h / t
        if sc.attention == "sdpa" and sc.activation_checkpointing != "selective":
            per += q * s * b * proj
            f += f" + {q:g} B x s x b x h/t (projection input copy)"
        else:
            per -= (2 - q) * s * b * proj
            f += f" - (2 - {q:g}) B x s x b x h/t (projection input)"
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
