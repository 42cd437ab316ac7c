"""The model's head on the last stage: the MLM head's transform (BERT-style encoders) and what the LM head keeps
(its input, or autocast's 16-bit copies of its input and weight)."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer


def head(st: HFLayer) -> None:
    """The MLM head transform and the LM head's saved input or autocast copies (``post``)."""
    arch, out, D, amp, ec, full, nout = st.arch, st.out, st.D, st.amp, st.ec, st.full, st.nout
    T, h, V = D.T, D.h, D.V
    if arch.facts.output.mlm_head:  # the MLM head's dense -> gelu -> LayerNorm (its input: "final norm")
        # gelu saves the dense output; the decoder saves the LayerNorm output only if its weight trains (traced)
        # (under autocast the dense keeps a 16-bit copy of its weight, trained or frozen)
        n_mlm = 2 if full else 1
        wcopy = 2 * h * h if amp else 0
        out.post.append(
            Term(
                "MLM head transform: dense output"
                + (" and LayerNorm output" if full else " (frozen decoder)")
                + (", autocast weight copy" if amp else ""),
                n_mlm * ec * T * h + wcopy,
                f"{n_mlm} x {ec} B x T x h" + (" + 2 B x h x h" if amp else ""),
                n_mlm + (1 if amp else 0),
            )
        )
    if V and amp and not full:  # a frozen head keeps the 16-bit copy of its weight for the input's gradient
        out.post.append(Term("head: autocast 16-bit weight copy (frozen head)", 2 * V * h, "2 B x V x h", 1))
    if V and full:  # the head reads the final norm's output
        if amp:
            out.post.append(
                Term(
                    "head: autocast input and weight copies",
                    2 * T * h + 2 * V * h,
                    "2 B x T x h + 2 B x V x h",
                    2,
                )
            )
        else:
            out.post.append(Term("head input", nout * T * h, f"{nout} B x T x h", 1))
    elif V and st.zero3_linear:  # DeepSpeed ZeRO-3's linear keeps a frozen head's input too (layer.HFLayer)
        out.post.append(Term("head input (DeepSpeed ZeRO-3 linear)", nout * T * h, f"{nout} B x T x h", 1))
