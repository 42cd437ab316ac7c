"""What the first stage holds before its first layer: the model's inputs (token ids and labels, or ViT's pixels),
the rotary cos/sin tables and Falcon's ALiBi bias (BERT's embedding LayerNorm is norms.py's)."""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer


def embeddings(st: HFLayer) -> None:
    """Position tables and ALiBi bias (``pre``), then the inputs."""
    ctx, arch, recipe, out, D, amp, ec, eager = (
        st.ctx,
        st.arch,
        st.recipe,
        st.out,
        st.D,
        st.amp,
        st.ec,
        st.eager,
    )
    b, s = D.b, D.s
    if arch.position == "rope":
        cb = 4 if amp else ec
        rd = (
            D.d if arch.facts.position.rotary_dim is None else arch.facts.position.rotary_dim
        )  # partial rotary: cos/sin cover the first rotary_dim channels
        kinds = arch.facts.position.rope_kinds  # one cos/sin pair per layer kind: Gemma 3, ModernBERT
        out.pre.append(
            Term(
                "rotary cos/sin" + (f" ({kinds} layer kinds, one RoPE base each)" if kinds > 1 else ""),
                kinds * 2 * cb * s * rd,
                (f"{kinds} x " if kinds > 1 else "") + f"2 x {cb} B x s x {rd}",
                2 * kinds,
            )
        )
    if arch.facts.position.alibi_bias_saved and not eager:
        # Falcon ALiBi: the model builds one (b, a, s, s) bias in the embeddings' dtype, the attention mask of every
        # layer, and the fused SDPA kernel saves it (one tensor for all layers; traced)
        out.pre.append(
            Term(
                "ALiBi attention bias (b, a, s, s) saved by SDPA",
                ec * b * D.a * s * D.s_full,
                f"{ec} B x b x a x s x s, b={b} a={D.a} s={s}",
                1,
            )
        )
    if (
        arch.facts.coverage.pixel_input
    ):  # pixels in the weight dtype; autocast saves a 16-bit copy for the patch conv
        patches = arch.facts.patches
        assert patches is not None  # a pixel-input model declares its patches (families/vit.py)
        C, img = patches.num_channels, patches.image_size
        px = b * C * img * img
        pb = recipe.weight_bytes
        # a trained patch conv under autocast: ``convolution``'s backward saves the 16-bit weight autocast gave it
        # as well as the 16-bit input (torch 2.13.0 tools/autograd/derivatives.yaml saves input and weight;
        # traced ViT h256 amp-bf16: the (256, 3, 16, 16) bf16 ``_to_copy``, 393,216 B, alive to the top of backward)
        conv_w = patch_conv_copy(arch, patches) if amp and st.full and not st.sc.compile else 0
        out.inputs.append(
            Term(
                "pixel values and labels"
                + (" (+ autocast 16-bit copy)" if amp else "")
                + (", the patch conv's 16-bit weight copy" if conv_w else ""),
                px * pb + (2 * px if amp else 0) + 8 * b + conv_w,
                f"b x {C} x {img} x {img} x ({pb}{' + 2' if amp else ''}) B + 8 B x b"
                + (f" + 2 B x {arch.hidden_size} x {C} x {patches.patch_size}^2" if conv_w else ""),
                3 if conv_w else 2,
            )
        )
    else:
        out.inputs.append(Term("input ids and labels", 16 * b * ctx.seq_len, "2 x 8 B x b x s (int64)", 2))


def patch_conv_copy(arch: Any, patches: Any) -> int:
    """Bytes of autocast's 16-bit copy of a patch conv's weight (hidden x channels x patch x patch), which the
    conv saves for its input's gradient."""
    return 2 * arch.hidden_size * patches.num_channels * patches.patch_size**2
