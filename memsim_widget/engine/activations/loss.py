"""The loss on the last stage: the logits and their fp32 copies while the loss runs, what it saves until its
backward and the T x V buffers its backward allocates (standard, torchtune's fp32 logits, loss parallel, chunked),
and the fp32 final hidden state an autocast model's output holds meanwhile."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.frameworks import loss_parallel

#: Chunks of the fused linear + cross-entropy loss (torchtune / Liger style) when loss="chunked".
LOSS_CHUNKS = 8
#: The name of the term of the head's final-logit softcapping (its tanh output, saved until its backward).
SOFTCAP_SAVED = "final logit softcapping"


def V_final_fp32(arch: object) -> bool:  # noqa: N802
    """Autocast models whose final hidden state stays fp32 while the loss runs (all HF decoders)."""
    return bool(getattr(arch, "vocab_size", 0))


def final_hidden_fp32(st: HFLayer) -> None:
    """Under autocast the model output holds the fp32 final hidden state while the loss runs."""
    arch, out, Tout, h = st.arch, st.out, st.D.Tout, st.D.h
    if st.amp and V_final_fp32(arch):
        out.loss_forward.append(
            Term("final hidden states (fp32) held by the model output", 4 * Tout * h, "4 B x T x h", 1)
        )


def loss(st: HFLayer) -> None:
    """The loss's terms (none without a vocabulary); records the logits' bytes and whether the loss upcasts."""
    arch, sc, recipe, prof, out, amp = st.arch, st.sc, st.recipe, st.prof, st.out, st.amp
    T, V = st.D.T, st.D.V
    if not V:
        return
    le = 4 if recipe.fp32_compute else 2
    # a loss on the logits as they are (BERT, T5, ViT) runs in fp32 under autocast all the same: cross_entropy
    # and log_softmax are on autocast's fp32 list (torch.amp docs), so it saves and frees as an upcast loss (traced)
    upcast_loss = arch.facts.output.loss_upcast or amp
    if sc.loss == "chunked":
        chunk = T * V / LOSS_CHUNKS
        out.loss_backward.append(
            Term(
                f"one loss chunk's logits and fp32 log-softmax (1/{LOSS_CHUNKS})",
                (le + 8) * chunk,
                f"({le} + 2 x 4) B x T x V / {LOSS_CHUNKS}",
                3,
            )
        )
        out.loss_forward.append(
            Term(
                f"one loss chunk's logits (1/{LOSS_CHUNKS})",
                (le + 4) * chunk,
                f"({le} + 4) B x T x V / {LOSS_CHUNKS}",
                2,
            )
        )
    elif upcast_loss and prof.fp32_logits_output:
        # torchtune (2024): the model returns fp32 logits (output(h).float(): the 16-bit matmul output
        # dies at once); the recipe shifts them with .contiguous() (a second fp32 T x V, which replaces
        # the first) and keeps that copy referenced through loss.backward().
        shift = " (shifted .contiguous() copy)" if prof.shift_copy else ""
        out.loss_forward.append(
            Term(
                "fp32 logits returned by the model" + shift,
                4 * T * V,
                "4 B x T x V (the copy and the original never both meet the log-softmax)"
                if prof.shift_copy
                else "4 B x T x V",
                1,
            )
        )
        out.loss_saved.append(Term("fp32 log-softmax saved by the loss", 4 * T * V, "4 B x T x V", 1))
        out.loss_backward.append(
            Term("loss backward: two fp32 T x V gradient buffers", 8 * T * V, "2 x 4 B x T x V", 2)
        )
    elif upcast_loss:
        # HF causal LMs (ForCausalLMLoss): logits = lm_head(h) in the compute dtype; the loss upcasts them
        # (.float()) and log_softmax saves its fp32 output. The trainer drops the logits before backward.
        out.loss_forward.append(
            Term(
                "logits" + (" and their fp32 upcast" if le != 4 else ""),
                (le + (4 if le != 4 else 0)) * T * V,
                f"({le}{' + 4' if le != 4 else ''}) B x T x V, V={V}",
                1 if le == 4 else 2,
                shares=() if le == 4 else (le / (le + 4), 4 / (le + 4)),
            )
        )
        out.loss_saved.append(Term("fp32 log-softmax saved by the loss", 4 * T * V, "4 B x T x V", 1))
        if loss_parallel(sc):  # DTensor's fused nll + log-softmax backward: one buffer (traced)
            out.loss_backward.append(
                Term(
                    "loss-parallel backward: one fp32 T x V/tp gradient buffer",
                    4 * T * V,
                    "4 B x T x V",
                    1,
                )
            )
        else:
            out.loss_backward.append(
                Term("loss backward: two fp32 T x V gradient buffers", 8 * T * V, "2 x 4 B x T x V", 2)
            )
    else:
        # BERT, T5, ViT: nn.CrossEntropyLoss straight on the logits, in the compute dtype
        out.loss_forward.append(Term("logits", le * T * V, f"{le} B x T x V, V={V}", 1))
        out.loss_saved.append(Term("log-softmax saved by the loss", le * T * V, f"{le} B x T x V", 1))
        out.loss_backward.append(
            Term("loss backward: two T x V gradient buffers", 2 * le * T * V, f"2 x {le} B x T x V", 2)
        )
    if sc.loss != "chunked" and not loss_parallel(sc):
        # the gradient the head's matmuls read, in the logits' dtype (an upcast loss casts it back), freed once
        # the head's backward has made its weight gradient (traced: the `mm` of lm_head's weight gradient)
        out.logits_grad.append(Term("logits' gradient (head backward)", le * T * V, f"{le} B x T x V", 1))
    cap = arch.facts.output.final_logit_softcapping
    if cap and sc.loss != "chunked":
        # Gemma 2/3: logits = tanh(logits / cap) x cap; tanh saves its output (compute dtype) until its
        # backward, right after the loss's (traced); the scalar division and product save nothing
        out.loss_saved.append(
            Term(f"{SOFTCAP_SAVED} ({cap:g}): tanh output", le * T * V, f"{le} B x T x V", 1)
        )
    st.le, st.upcast_loss = le, upcast_loss
