"""Backward transients: what one layer's backward allocates beside the saved tensors (the attention's softmax
gradients, the MLP's activation gradients, flash attention's dq accumulator, QLoRA's dequantised weight) and the
final norm's backward at the top of the stack.

Checked on traces (docs/fidelity.md): in the MLP's backward the layer holds the gradient of the product and the
two gradients the product's backward makes (d act(gate), d up), each T x I, while the down-projection input, if it
was saved, has just been released; plus the residual gradient. Under checkpointing the same happens inside the
recomputed layer. The final RMSNorm's backward works in fp32: about 24 B x T x h at the top of backward.
"""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.activations.linears import MLP_OUT
from memsim_widget.engine.activations.mlp import parallel_mlp
from memsim_widget.engine.activations.ssm import ssm_backward
from memsim_widget.units import fmt_int


def backward_transients(st: HFLayer) -> None:
    """The attention's backward transients, then the layer's and the top's."""
    attention_backward(st)
    layer_backward(st)


def attention_backward(st: HFLayer) -> None:
    """While the attention runs backward: eager/math softmax gradients (less what the layer has released), T5's
    decoder softmax backward, sequence parallel's all-gather of the output gradient."""
    arch, sc, D, out, L, ec, r, eager = st.arch, st.sc, st.D, st.out, st.L, st.ec, st.r, st.eager
    T, h, b, s, hq, hkv, a_loc = D.T, D.h, D.b, D.s, D.hq, D.hkv, D.a
    softmax_fp32, t5_sm, ao_from, ao_to = st.softmax_fp32, st.t5_sm, st.ao_from, st.ao_to
    mlp_from, mlp_to = st.mlp_from, st.mlp_to
    if eager:
        # softmax backward: the gradient of the probabilities and of the scores, s x s per head (measured:
        # about 6 B x b a s^2 in bf16 with the fp32 softmax). Under selective recompute the layer's core has
        # just run again (torch 2.13.0 torch/utils/checkpoint.py, non-reentrant: the recompute is triggered by the
        # core's first saved tensor its backward reads): its softmax and the q and k its scores' product reads
        # are alive beside them
        sm_b = 4 if softmax_fp32 else ec
        tau_attn = (sm_b + ec) * b * a_loc * s * D.s_full + st.recomputed
        # by then o_proj's input is released and, in a sequential block, the MLP has run its backward: what they
        # saved is gone (every saved tensor of the layer is still counted at this moment). A parallel MLP (NeoX,
        # Phi, Cohere) runs its backward after the attention's, so its tensors are still there (traced)
        mlp_done = L[mlp_from:mlp_to] if not parallel_mlp(arch) else []
        freed = sum(t.bytes for t in L[ao_from:ao_to] + mlp_done)
        late, held = _mlp_side_released(st)
        out.attention_backward.append(
            Term(
                "attention softmax backward (s x s gradients)"
                + (", the core's recomputed tensors" if st.recomputed else "")
                + (", the residual's and v's gradients" if held else "")
                + ", less the layer's MLP and o_proj input freed"
                + (" and the norms after it" if late else ""),
                max(tau_attn + held - freed - late, 0),
                f"({sm_b} + {ec}) B x b x a x s x s"
                + (f" + {fmt_int(st.recomputed)} B recomputed" if st.recomputed else "")
                + (f" + {fmt_int(held)} B ({r} B x T x h + {ec} B x T x a*d)" if held else "")
                + f" - {fmt_int(freed + late)} B",
                2,
            )
        )
    if t5_sm[0] and sc.activation_checkpointing != "selective":
        # T5's math-path softmax backward in the last decoder block (the first one differentiated): the fp32
        # gradients of the probabilities and scores, while its feed-forward has released what it saved
        out.attention_backward.append(
            Term("T5 decoder self-attention softmax backward (math SDPA)", max(t5_sm[0], 0), t5_sm[1], 2)
        )
    math_sdpa = not eager and arch.facts.attention.sdpa_math_fallback
    if math_sdpa and sc.activation_checkpointing != "selective":
        # the math fallback's softmax backward: fp32 gradients of the probabilities and of the scores, while the
        # layer's MLP and out-projection (run after attention, so differentiated first) have released what they
        # saved, and the gradients of the layer output, of the MLP's input, of dense's input and of the expanded
        # v are alive (traced)
        freed = sum(
            t.bytes
            for t in L
            if t.name.startswith(
                ("MLP activation internals", "MLP down-projection input", "attention output")
            )
        )
        held = r * T * h + ec * T * h + ec * T * hq + 4 * T * (hq if b > 1 else hkv)
        sm_bytes = 8 * b * a_loc * s * D.s_full
        out.attention_backward.append(
            Term(
                "math SDPA softmax backward (fp32 s x s gradients), less the layer's released MLP tensors",
                max(sm_bytes + held - freed, 0),
                f"(4 + 4) B x b x a x s x s + {fmt_int(held)} B of gradients - {fmt_int(freed)} B released",
                2,
            )
        )
    if D.sp:
        # the backward of a sequence-parallel block starts by all-gathering its output gradient (Shard(1) ->
        # Replicate): the collective's output, its wait and the (b, s, h) cat live together (traced). Kept
        # beside the eager softmax terms (a different instant: the sum errs high).
        out.attention_backward.append(
            Term(
                "sequence-parallel all-gather of the block's output gradient",
                3 * ec * T * h,
                f"3 x {ec} B x T x h (gather, wait, cat)",
                3,
            )
        )


def _mlp_side_released(st: HFLayer) -> tuple[float, float]:
    """A sequential block at its eager softmax's backward: what the layer still counts that the MLP side's
    backward has released, and the gradients held beside the s x s ones. torch 2.13.0 runs a layer's backward in
    reverse of its forward (``torch/csrc/autograd/engine.cpp``), so the MLP's Linears and every norm after the
    attention core ran theirs first: those norms' saved tensors (``st.late_norm``: a pre-norm block's MLP norm,
    Gemma 2/3's and GLM-4's post-norms too, both of OLMo 2's and BERT's), the MLP input the gate and up
    projections kept, under autocast the 16-bit copies of the MLP's and o_proj's weights, and ``repeat_kv``'s
    copy of v the forward saved (the probabilities' product with v ran its backward first; recomputed under
    selective, where ``st.recomputed`` leaves it out) are released. Held: the residual stream's gradient
    (r B x T x h) and the product's gradient of v at every head (e B x T x a*d, summed over the repeats only
    later). Traced at ``_softmax_backward_data``: Llama h256 bf16, amp-bf16, fp32 Qwen2, GQA and MHA, with and
    without the core checkpointed, StarCoder2 fp32 and Gemma 2 bf16 b2 s512 meet the trace's live bytes less its
    small tensors (``tests/engine/test_selective_gqa.py``, ``tests/families/test_family_gemma3.py``). Where the
    released bytes exceed the s x s ones (small s in fp32, GPT-2's 16-bit softmax) the term stops at zero and the
    moment stays over its trace. Parallel blocks (NeoX, Phi, Cohere, Falcon: their MLP runs its backward after the
    attention's) and T5 keep the rule before it."""
    arch, D, L, ec, r = st.arch, st.D, st.L, st.ec, st.r
    if parallel_mlp(arch) or arch.facts.coverage.encoder_decoder:
        return 0.0, 0.0
    v_repeat = 0
    if st.sc.activation_checkpointing != "selective" and D.hkv != D.hq:
        v_repeat = ec * D.T * D.hq  # the forward's repeat of v, saved by its product with the probabilities
    mlp_input = sum(t.bytes for t in L[st.mi_from : st.mi_to])
    late = st.late_norm + mlp_input + st.late_copies + v_repeat
    held = r * D.T * D.h + ec * D.T * D.hq
    return late, held


def layer_backward(st: HFLayer) -> None:
    """While one layer runs backward (its activation gradients, kernel scratch, QLoRA's dequantised weight) and
    the final norm's backward."""
    arch, sc, D, out, ec, r, eager = st.arch, st.sc, st.D, st.out, st.ec, st.r, st.eager
    T, Tout, h, hq = D.T, D.Tout, D.h, D.hq
    full, modules, targets, Tm, I, t5_sm = st.full, st.modules, st.targets, st.Tm, st.I, st.t5_sm
    math_sdpa = not eager and arch.facts.attention.sdpa_math_fallback
    down_saved = bool(full or (MLP_OUT & modules & targets))
    n_ti = (3 if arch.mlp_activation in ("swiglu", "geglu") else 2) - (1 if down_saved else 0)
    if arch.mlp_activation == "gelu_tanh" and arch.facts.mlp.parallel_attn_mlp:
        n_ti += 1  # Phi: gelu_new's pointwise chain holds one more T x I gradient in its backward (traced)
    if arch.mlp_activation == "quick_gelu":
        n_ti += 1  # CLIP: x * sigmoid(1.702 x) -- the product's two input gradients beside fc2's (traced)
    # by then the down projection's backward has released the 16-bit weight copy autocast gave its matmul
    copy = _down_copy(st)
    out.layer_backward.append(
        Term(
            "activation gradients of the layer in backward"
            + (", less the down projection's released 16-bit weight copy" if copy else ""),
            n_ti * ec * Tm * I + r * T * h - copy,
            f"{n_ti} x {ec} B x T x I + {r} B x T x h" + (f" - {fmt_int(copy)} B" if copy else ""),
            n_ti + 1,
            # the MLP's T x I gradients (differentiated first), then the layer input's
            shares=tuple(x / (n_ti * ec * Tm * I + r * T * h) for x in (ec * Tm * I,) * n_ti + (r * T * h,)),
        )
    )
    mlp_out_backward(st)
    # grouped_mm's backward makes the merged expert weight's gradient, one adapted parameter at a time
    adapted = [ad for n, ad in st.expert_adapters.items() if n != "gate.weight"]
    merged = max((ad.in_features * ad.out_features for ad in adapted), default=0)
    if merged:
        wb = st.recipe.weight_bytes
        out.layer_backward.append(
            Term(
                "LoRA on the fused experts: the merged weight's gradient",
                wb * arch.num_experts * merged / D.etp,
                f"{wb} B x E x out x in, E={arch.num_experts} (the largest adapted parameter)",
                1,
            )
        )
    if arch.norm == "rmsnorm":
        out.top_backward.append(Term("final RMSNorm backward (fp32)", 24 * Tout * h, "24 B x T x h", 4))
    else:
        out.top_backward.append(Term("final LayerNorm backward", 3 * r * Tout * h, f"3 x {r} B x T x h", 3))
    if not eager and not math_sdpa and not t5_sm[0]:
        out.layer_backward.append(
            Term(
                "flash-attention backward dq accumulator (fp32)",
                4 * T * hq,
                "4 B x T x a*d (CUDA kernel scratch)",
                1,
                "allocator",
            )
        )
    if st.ssm:
        out.layer_backward[:] = [ssm_backward(st.ctx, D, st.ssm, ec, r)]
        out.mlp_out_backward.clear()
    if sc.method == "qlora":
        biggest = max(
            (g.numel_each for g in arch.params if g.module and g.kind not in ("head", "embedding")), default=0
        )
        out.layer_backward.append(
            Term(
                "QLoRA dequantised weight of the layer in use",
                ec * biggest // D.tp,
                f"{ec} B x largest Linear {fmt_int(biggest)}",
                1,
            )
        )


def _down_copy(st: HFLayer) -> float:
    """Bytes of the 16-bit copy of the MLP down projection's weight that autocast gave its matmul, which the
    matmul saved for its input's gradient (``autocast_weight_copies``: every trained weight's, or a frozen one's
    where the layer's copies are counted); 0 without autocast or a dense down projection, or compiled (its graph's
    backward frees what its partitioner saved on its own schedule)."""
    arch, sc = st.arch, st.sc
    if not st.amp or not (st.full or sc.activation_checkpointing != "full") or arch.num_experts or sc.compile:
        return 0.0
    n = sum(g.numel for g in arch.params if g.scope == "layer" and g.module in MLP_OUT and not g.expert)
    return 2 * (n // max(arch.num_layers, 1) // st.D.tp)


def mlp_out_backward(st: HFLayer) -> None:
    """A layer's transients as its MLP down projection's backward (``addmm``'s: ``mm``, ``mm``, ``sum``) ends, the
    first of the layer's (torch 2.13.0 runs a layer's backward in reverse of its forward, ``torch/csrc/autograd/
    engine.cpp``): the residual gradient (r B x T x h), under autocast its 16-bit copy that the down projection's
    16-bit output receives (``validate_outputs`` casts a gradient to its input's dtype, ``torch/csrc/autograd/
    engine.cpp``), and the product's input gradient (e B x T x I); the down projection's input and weight copy are
    still saved, its weight gradient is the state side's (``states/gradients._top_down``). Larger than
    ``layer_backward``'s later instant where one T x I gradient follows (GELU) under autocast: ViT h256 amp-bf16
    b8 traced at the bias gradient's ``sum``, 5,648,384 B of activation gradients (1 x 2 B x T x I + 4 B x T x h
    + 2 B x T x h, T = 1576). Dense layers of an eager transformer block (a state-space layer, MoE, compiled: none)."""
    arch, D, ec, r = st.arch, st.D, st.ec, st.r
    if st.ssm or arch.num_experts or st.sc.compile:
        return
    T, h = D.T, D.h
    cast = ec * T * h if st.amp else 0
    st.out.mlp_out_backward.append(
        Term(
            "activation gradients at the down projection's backward"
            + (" (the residual gradient's 16-bit copy too)" if cast else ""),
            ec * st.Tm * st.I + r * T * h + cast,
            f"{ec} B x T x I + {r} B x T x h" + (f" + {ec} B x T x h" if cast else ""),
            3 if cast else 2,
        )
    )
