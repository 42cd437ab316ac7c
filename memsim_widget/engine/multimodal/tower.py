"""The vision side of a multimodal model (CLIP, LLaVA, Gemma 3): what its tower and projector save for backward.

The tower is an Architecture of its own (``arch.facts.vision.tower``, architecture/vision.py); its layers go
through the same HF rules as any encoder (engine/activations/hf.py), run on a context whose micro-batch is
the step's images (b x images_per_sample) and whose sequence is the tower's (patches + CLS). The totals land in
the language model's ``pre`` terms: they are made before its first layer and live until the tower's backward,
which runs last. Rules (each held to a fake-tensor trace, docs/fidelity.md):

- a frozen tower (``freeze_vision``) reads pixels that need no gradient, so autograd saves nothing in it; its
  outputs exist only while the forward uses them;
- a trained tower saves per layer what a trained encoder layer saves, for the layers whose output is used
  (LLaVA's ``vision_feature_layer`` -2: the last layer runs, and what it saved lives only as long as the model
  output, which holds the tower's output: through the loss, freed before backward by HF Trainer), plus ``pre_layrnorm``'s input and, under autocast, the patch conv's
  16-bit pixel copy;
- LoRA adapters in an unfrozen tower follow the HF LoRA rules (layer 0's first norm saves nothing);
- LLaVA's projector (linear_1 -> gelu -> linear_2) trains with the language model under full training: linear_1
  keeps the selected hidden state (a view of the tower's whole hidden state, CLS row included), gelu its input
  and linear_2 its input, at the image tokens;
- Gemma 3's projector (average pool to ``mm_tokens_per_image``, Gemma RMSNorm, projection) saves the norm's fp32
  tensors and the projection's input when it trains, the norm's fp32 input when only the tower has adapters;
  its language model gets a mask in every layer (token_type_ids; engine/activations/attention.py);
- CLIP's contrastive head (pooled rows, projections, b x b logits) is a few b x h tensors.

Known misses: the tower's own backward transients (the language model's, computed first, are larger in every
preset); the tower under tensor/pipeline/context parallelism (refused in engine/context.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memsim_widget.architecture.facts import LlavaNextVision, QwenVision, VisionFacts
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.embeddings import patch_conv_copy
from memsim_widget.engine.context import Context, tower_context
from memsim_widget.engine.frameworks import output_lifetime, uses_autocast
from memsim_widget.units import fmt_int


def vision_activations(
    ctx: Context, out: ActivationBudget, hf: Callable[[Context], ActivationBudget]
) -> None:
    """Add the vision tower's (and projector's) saved tensors and the pixel inputs to ``out``."""
    v = ctx.arch.facts.vision
    assert v is not None  # the dispatcher calls this for a multimodal model only
    # Qwen2-VL / Qwen2.5-VL: any image size, the merger (engine/multimodal/qwen_vl.py)
    if isinstance(v, QwenVision):
        from memsim_widget.engine.multimodal.qwen_vl import qwen_vision_activations

        qwen_vision_activations(ctx, out, hf)
        return
    if isinstance(v, LlavaNextVision):  # LLaVA's rules on every anyres crop (engine/multimodal/llava_next.py)
        from memsim_widget.engine.multimodal.llava_next import llava_next_activations

        llava_next_activations(ctx, out, hf, vision_activations)
        return
    tower = v.tower
    sc, recipe = ctx.scenario, ctx.recipe
    amp = uses_autocast(ctx)
    ec = recipe.act_bytes
    r = 4 if amp else ec
    b, n_img = sc.micro_batch_size, ctx.images_per_sample
    bi = b * n_img
    full = ctx.full_training
    trained = full and not ctx.freeze_vision
    C, img = v.patches.num_channels, v.patches.image_size
    px = bi * C * img * img
    pb = recipe.weight_bytes  # pixels come in the weights' dtype (fp32 under autocast)

    # ----- inputs: the pixels (and, for CLIP, input ids without labels) -----------------------------------
    if v.contrastive_head:
        out.inputs[:] = [Term("input ids", 8 * b * sc.seq_len, "8 B x b x s (int64)", 1)]
    if n_img:
        # the trained patch conv under autocast saves its 16-bit input and weight (embeddings.patch_conv_copy)
        conv_w = patch_conv_copy(tower, v.patches) if amp and trained and v.patches.patch_size else 0
        out.inputs.append(
            Term(
                "pixel values"
                + (" (+ autocast 16-bit copy saved by the trained patch conv" if amp and trained else "")
                + (", and its 16-bit weight copy)" if conv_w else ")" if amp and trained else ""),
                px * pb + (2 * px if amp and trained else 0) + conv_w,
                f"b x images={bi} x {C} x {img} x {img} x ({pb}{' + 2' if amp and trained else ''}) B"
                + (f" + 2 B x {tower.hidden_size} x {C} x {v.patches.patch_size}^2" if conv_w else ""),
                (2 if amp and trained else 1) + (1 if conv_w else 0),
            )
        )
    if not n_img:
        return

    # ----- the tower ------------------------------------------------------------------------------------
    sub = tower_context(ctx, tower, bi)
    adapters = bool(sub.adapters) and not full
    T = bi * tower.fixed_seq_len
    h = tower.hidden_size
    if trained or adapters:
        _tower(ctx, out, hf(sub), T, trained, r)
    else:
        _frozen_tower_outputs(ctx, out, T, r)
        if v.graph_keeps_frozen_tower and sc.activation_checkpointing == "full":
            _frozen_tower_under_checkpointing(out, v, bi, T, h, r, 2 if amp else ec)
    pj = v.projector
    if (
        v.projector_layout == "pixel-shuffle"
    ):  # Llama 4's pixel-shuffle adapter and one-Linear projector (engine/multimodal/llama4.py)
        from memsim_widget.engine.multimodal.llama4 import llama4_adapter_terms

        llama4_adapter_terms(ctx, out, trained=trained)
    elif pj and v.projector_layout == "norm-linear":  # Gemma 3
        _gemma3_projector(ctx, out, bi * v.tokens_per_image, pj, trained or adapters, amp, ec)
    elif pj:
        _llava_projector(ctx, out, bi, pj, adapters, amp, pb)
    if v.contrastive_head:
        _clip_head(ctx, out, trained, r, h, T)


def _tower(ctx: Context, out: ActivationBudget, tb: ActivationBudget, T: int, trained: bool, r: int) -> None:
    """A tower with a gradient (trained, or LoRA adapters in it): what the layers whose output is used save (``tb``,
    the HF rules run on the tower), what the layers past the one read keep, and the trained tower's edge norm."""
    v = ctx.arch.facts.vision
    assert v is not None
    tower, sc = v.tower, ctx.scenario
    bi, h = sc.micro_batch_size * ctx.images_per_sample, tower.hidden_size
    used = v.layers_used
    if sc.activation_checkpointing == "full":
        kept = tb.checkpointed_layer
        what = "checkpointed inputs"
    else:
        kept = tb.per_layer
        what = "saved tensors"
    per = sum(t.bytes for t in kept)
    first = sum(t.first_bytes for t in kept if t.skip_first) if kept is tb.per_layer else 0
    nbytes = per * used - first
    out.pre.append(
        Term(
            f"vision tower: {what} of {used} layers" + ("" if trained else " (LoRA adapters, frozen base)"),
            nbytes,
            f"{used} layers x {fmt_int(per)} B (images={bi}, T={fmt_int(T)} tokens, h={h})"
            + (f" - {fmt_int(first)} B not held by layer 0" if first else ""),
            used * sum(t.tensors for t in kept),
        )
    )
    unused = tower.num_layers - used
    if unused:
        # the layers past the one read: their output is unused, but the model output holds the tower's output
        # (``image_outputs``), so what they saved lives while the model output does -- through the loss, and
        # with output_lifetime "backward"/"step" beyond (traced)
        t = Term(
            f"vision tower: saved tensors of the {unused} layer(s) past vision_feature_layer (held by the "
            "model output's image_outputs)",
            per * unused,
            f"{unused} x {fmt_int(per)} B",
            unused * sum(x.tensors for x in kept),
        )
        out.loss_forward.append(t)
        if output_lifetime(sc) != "trainer":
            out.output_logits.append(t)
    if trained:  # CLIP's pre_layrnorm on the embeddings, SigLIP's post_layernorm: (b, s, h) input, mean, rstd
        out.pre.append(
            Term(
                f"vision tower: {v.edge_norm} input, mean and rstd",
                r * T * h + 8 * T,
                f"{r} B x T x h + 8 B x T",
                3,
            )
        )


def _frozen_tower_under_checkpointing(
    out: ActivationBudget, v: VisionFacts, bi: int, T: int, h: int, r: int, cb: int
) -> None:
    """Under HF gradient checkpointing a frozen CLIP tower's forward tensors stay referenced by the autograd graph
    until backward ends (seen on real CPU tensors and in the fake trace; without checkpointing they are freed):
    the patch conv's output, the embeddings, pre_layrnorm's output and the outputs of the layers before the one
    the projector reads (that one is counted with the projector or the model output)."""
    n, kept = v.patches.num_patches, v.layers_used - 1
    out.pre.append(
        Term(
            "frozen vision tower under checkpointing: conv output, embeddings, pre_layrnorm output and "
            f"{kept} layer outputs kept by the graph until backward ends",
            cb * bi * n * h + (2 + kept) * r * T * h,
            f"{cb} B x images x {n} x {h} + {2 + kept} x {r} B x T x h, T={fmt_int(T)}",
            3 + kept,
        )
    )


def _frozen_tower_outputs(ctx: Context, out: ActivationBudget, T: int, r: int) -> None:
    """A frozen tower saves nothing, but the model output keeps its output (``image_outputs``)."""
    v = ctx.arch.facts.vision
    assert v is not None
    tower, sc, full = v.tower, ctx.scenario, ctx.full_training
    h = tower.hidden_size
    # a frozen tower saves nothing, but the model output keeps the tower's output (``image_outputs``): LLaVA's
    # last hidden state and the one the projector read, Gemma 3's last one (traced: the earlier hidden states
    # are gone by the loss) -- alive through the loss, and with output_lifetime "backward"/"step" beyond (the
    # projector's input, saved when it trains, is counted with the projector)
    n_hs = (1 if full else 2) if v.output_holds_feature_layer else 1
    if v.output_holds_tower_states and n_hs > 0:  # Llama 4: engine/multimodal/llama4.py
        t = Term(
            "vision tower hidden states held by the model output (image_outputs)",
            n_hs * r * T * h,
            f"{n_hs} x {r} B x images x {tower.fixed_seq_len} x {h}",
            n_hs,
        )
        out.loss_forward.append(t)
        if output_lifetime(sc) != "trainer":
            out.output_logits.append(t)


def _llava_projector(
    ctx: Context, out: ActivationBudget, bi: int, pj: Mapping[str, Any], adapters: bool, amp: bool, pb: int
) -> None:
    """LLaVA's projector (linear_1 -> gelu -> linear_2) at the image tokens: trained with the language model, or
    LoRA adapters on it or in the tower."""
    v = ctx.arch.facts.vision
    assert v is not None
    tower, sc, full, ec = v.tower, ctx.scenario, ctx.full_training, ctx.recipe.act_bytes
    N = bi * v.tokens_per_image
    rows_all = bi * tower.fixed_seq_len  # the hidden state the selected rows are a view of
    hv, ht = pj["in"], pj["hidden"]
    pj_targets = {ad.base.module for ad in ctx.adapters if ad.base.stack == "projector" and ad.base.module}
    if full:
        add_amp = 2 * N * hv if amp else 0
        w = hv * ht + ht * ht
        out.pre.append(
            Term(
                "projector: linear_1 input (the tower's hidden state it views), gelu input, linear_2 input"
                + (", autocast copies of its input and weights" if amp else ""),
                (pb if amp else ec) * rows_all * hv + 2 * ec * N * ht + add_amp + (2 * w if amp else 0),
                f"{pb if amp else ec} B x {fmt_int(rows_all)} x {hv} + 2 x {ec} B x N x {ht}, N={fmt_int(N)} image tokens"
                + (f" + 2 B x N x {hv} + 2 B x {fmt_int(w)} weights" if amp else ""),
                3 + (3 if amp else 0),
            )
        )
    elif pj_targets or adapters:
        ab = ctx.adapter_bytes
        rank = sc.lora.rank
        n1 = "linear_1" in pj_targets
        n2 = "linear_2" in pj_targets
        cb = 2 if amp else ab
        nbytes = (cb * N * hv + ab * N * rank if n1 else 0) + (cb * N * ht + ab * N * rank if n2 else 0)
        nbytes += ec * N * ht  # gelu's input (linear_1's output needs a gradient through an adapter)
        out.pre.append(
            Term(
                "projector: LoRA input copies and A outputs, gelu input",
                nbytes,
                f"adapters on {sorted(pj_targets)}: {cb} B x N x width + {ab} B x N x rank; {ec} B x N x {ht}",
                3,
            )
        )


def _clip_head(ctx: Context, out: ActivationBudget, trained: bool, r: int, h: int, T: int) -> None:
    """CLIP's contrastive head: pooled rows, projections, normalised embeddings and the b x b logits. The vision
    side's saved tensors live until the vision tower's backward (``pre``): ``CLIPModel.forward`` runs the vision
    tower first (transformers 5.24 ``models/clip/modeling_clip.py`` 783-794), so autograd, which takes the ready
    node of the highest sequence number first (torch 2.13.0 ``torch/csrc/autograd/engine.cpp``), runs the whole
    text tower's backward before ``visual_projection``'s. ``post_layernorm`` saves its input, the view
    ``last_hidden_state[:, 0, :]`` (lines 640-641), which keeps the tower's whole last hidden state (r B x T x h)
    alive; under autocast ``visual_projection`` keeps its 16-bit weight copy. Traced (h256 b8 s77) at the text
    tower's top layer's backward: the vision layer 3 output, post_layernorm's mean and rstd, the projection's
    input and (amp-bf16) its (64, 256) weight copy."""
    b, ec = ctx.scenario.micro_batch_size, ctx.recipe.act_bytes
    ht = ctx.arch.hidden_size
    proj = ctx.arch.facts.output.projection_dim
    assert proj is not None  # CLIP declares its projection width
    copy = 2 * proj * h if uses_autocast(ctx) and ctx.full_training else 0
    vision = (r * T * h + 8 * b if trained else 0) + ec * b * h + copy
    out.pre.append(
        Term(
            "contrastive head, vision side: post_layernorm's input (a view of the last hidden state), mean and "
            "rstd, visual_projection's input" + (" and 16-bit weight copy" if copy else ""),
            vision,
            (f"{r} B x T x h + 8 B x b + " if trained else "")
            + f"{ec} B x b x h"
            + (f" + 2 B x {proj} x {h}" if copy else "")
            + f", T={fmt_int(T)}, b={b}",
            (3 if trained else 0) + 1 + (1 if copy else 0),
        )
    )
    out.post.append(
        Term(
            "contrastive head, text side: text_projection's input, normalised embeddings, b x b logits",
            ec * b * ht + 3 * ec * b * proj + 3 * 4 * b * b,
            f"{ec} B x b x (h_t + 3 x proj) and 3 x 4 B x b x b, b={b}",
            7,
        )
    )


def _gemma3_projector(
    ctx: Context, out: ActivationBudget, N: int, pj: Mapping[str, Any], tower_grad: bool, amp: bool, ec: int
) -> None:
    """Gemma 3's projector on N pooled image tokens: Gemma's RMSNorm (fp32 input and rsqrt whenever its input or
    weight needs a gradient; the fp32 normalised tensor and fp32 (1 + w) when w trains) and the matmul by
    ``mm_input_projection_weight`` (its input saved when the weight trains; a 16-bit copy under autocast)."""
    hv, ht = pj["in"], pj["hidden"]
    trained = ctx.full_training
    if not (trained or tower_grad):
        return
    nb = 4 * N * hv + 4 * N + 4 * hv
    what = f"4 B x N x {hv} + 4 B x N + 4 B x {hv}"
    if trained:
        mm = 2 if amp else ec
        nb += 4 * N * hv + mm * N * hv + (2 * hv * ht if amp else 0)
        what += f" + 4 B x N x {hv} + {mm} B x N x {hv}" + (f" + 2 B x {hv} x {ht}" if amp else "")
    out.pre.append(
        Term(
            "projector: soft-embedding RMSNorm (fp32) and the projection's input",
            nb,
            what + f", N={fmt_int(N)} image tokens",
            5,
        )
    )
