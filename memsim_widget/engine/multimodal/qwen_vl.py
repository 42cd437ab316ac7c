"""The vision side of Qwen2-VL and Qwen2.5-VL (families/qwen2_vl.py): what the tower and the merger save.

The tower runs all the images' patches as one (T_v, e) sequence, T_v = images x (H/14)(W/14), attention split per
image (Qwen2.5-VL: per window, full attention in ``fullatt_block_indexes``; the same tensors either way). Its blocks
go through the HF encoder rules (engine/activations.py ``_hf``) on a context of b x images_per_sample samples of
one image's patches, with the tower's own layout (families/qwen2_vl.py ``_tower_architecture``): q and k leave the
fp32 2D RoPE as new 16-bit tensors, v stays a view of ``qkv``'s output (kept whole), the per-image outputs are
concatenated into a copy that ``proj`` saves. Beside the blocks (each held to a fake-tensor trace,
docs/fidelity.md):

- the rotary cos and sin (fp32, T_v x d each), saved by every block's q/k multiplies when q needs a gradient;
- the merger: ``ln_q`` (LayerNorm: its input and per-row mean and rstd; Qwen2.5-VL's RMSNorm: its fp32 input and
  rsqrt when the tower needs a gradient, the 16-bit normalised tensor when its weight trains), ``mlp.0``'s input
  (the normed rows viewed m^2 e wide), GELU's input and ``mlp.2``'s input, on N = images x tokens rows;
- the model output's ``image_outputs`` (the tower's last hidden state, the merged features), held until the
  loop drops the output (through the loss under HF Trainer);
- the inputs: pixel values (T_v x C t p p), the (3, b, s) int64 M-RoPE positions and the (T_v, 2) patch
  positions (Qwen2.5-VL: the window order too).

Known misses: the tower's own backward (a frozen tower's too under checkpointing: HF's
``enable_input_require_grads`` hooks the tower's patch embedding, transformers 5.24 ``modeling_utils.py``, so its
checkpointed blocks recompute and run backward after the language model's, every other gradient made -- the
trace's peak in Qwen2.5-VL's frozen-tower case); the patch and M-RoPE positions are held for the whole step (as the
trace's batch holds them) where the model frees its own after the forward.
"""

from __future__ import annotations

from collections.abc import Callable

from memsim_widget.architecture.facts import QwenVision
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.context import Context, tower_context
from memsim_widget.engine.frameworks import output_lifetime, uses_autocast
from memsim_widget.units import fmt_int


def qwen_vision_activations(
    ctx: Context, out: ActivationBudget, hf: Callable[[Context], ActivationBudget]
) -> None:
    """Add Qwen2(.5)-VL's tower, merger and image inputs to ``out``."""
    v = ctx.arch.facts.vision
    assert isinstance(v, QwenVision)  # the dispatcher calls this for Qwen2(.5)-VL only
    tower = v.tower
    sc, recipe = ctx.scenario, ctx.recipe
    amp = uses_autocast(ctx)
    ec = recipe.act_bytes
    r = 4 if amp else ec
    b, n_img = sc.micro_batch_size, ctx.images_per_sample
    bi = b * n_img
    full = ctx.full_training
    trained = full and not ctx.freeze_vision
    P = tower.fixed_seq_len
    Tv, e, d = bi * P, tower.hidden_size, tower.head_dim
    N = bi * v.tokens_per_image
    pb = recipe.weight_bytes
    S = ctx.seq_len
    out.inputs.append(Term("M-RoPE position ids", 24 * b * S, "8 B x 3 x b x s (int64)", 1))
    if not n_img:
        return
    px = Tv * v.pixels_per_patch
    copy = 2 * px if amp and trained else 0
    window = v.patches.window_size is not None
    out.inputs.append(
        Term(
            "pixel values" + (" (+ autocast 16-bit copy saved by the trained patch conv)" if copy else "")
            + ", patch positions" + (" and window order" if window else ""),
            px * pb + copy + 16 * Tv + (8 * N if window else 0),
            f"T_v={fmt_int(Tv)} patches x {v.pixels_per_patch} x ({pb}{' + 2' if copy else ''}) B + 16 B x T_v"
            + (" + 8 B x N" if window else ""),
            3 + bool(copy) + window,
        )
    )  # fmt: skip

    # ----- the tower's blocks -------------------------------------------------------------------------
    sub = tower_context(ctx, tower, bi)
    adapters = bool(sub.adapters) and not full
    tower_grad = trained or adapters
    if tower_grad:
        tb = hf(sub)
        ckpt = sc.activation_checkpointing == "full"
        kept = tb.checkpointed_layer if ckpt else tb.per_layer
        per = sum(t.bytes for t in kept)
        first = sum(t.first_bytes for t in kept if t.skip_first) if not ckpt else 0
        L = tower.num_layers
        out.pre.append(
            Term(
                f"vision tower: {'checkpointed inputs' if ckpt else 'saved tensors'} of {L} blocks"
                + ("" if trained else " (LoRA adapters, frozen base)"),
                per * L - first,
                f"{L} blocks x {fmt_int(per)} B (images={bi}, T_v={fmt_int(Tv)} patches, e={e})"
                + (f" - {fmt_int(first)} B not held by block 0" if first else ""),
                L * sum(t.tensors for t in kept),
            )
        )
        if adapters and "qkv" in {ad.base.module for ad in sub.adapters} and not ckpt:
            # the fused qkv Linear is no attention input the HF rules name: its adapter's input (the norm1 output,
            # cast to the adapter dtype) in every block, block 0's too
            cb = 2 if amp else ctx.adapter_bytes
            out.pre.append(
                Term("vision tower: qkv LoRA input", L * cb * Tv * e, f"{L} blocks x {cb} B x T_v x e", L)
            )
        out.pre.append(
            Term(
                "vision rotary cos and sin (fp32), saved by the blocks' q/k multiplies",
                8 * Tv * d,
                f"2 x 4 B x T_v x d, d={d}",
                2,
            )  # fmt: skip
        )
    kept = not tower_grad and sc.activation_checkpointing == "full"
    if kept:
        # a frozen tower under HF gradient checkpointing: its forward tensors stay referenced by the autograd graph
        # until backward ends (seen on real CPU tensors and in the trace; freed without checkpointing): the patch
        # embedding's output (Qwen2.5-VL: and its window-ordered copy) and every block's output, the last one
        # (the tower's output) included
        L = tower.num_layers
        n = L + 1 + window
        out.pre.append(
            Term(
                f"frozen vision tower under checkpointing: patch embedding and {L} block outputs kept by the graph",
                (2 if amp else ec) * Tv * e + (n - 1) * r * Tv * e,
                f"{2 if amp else ec} B x T_v x e + {n - 1} x {r} B x T_v x e",
                n,
            )
        )
    _merger(ctx, out, v, Tv, N, e, tower_grad, amp, ec, r, output_counted=kept)


def _merger(
    ctx: Context, out: ActivationBudget, v: QwenVision, Tv: int, N: int, e: int, tower_grad: bool, amp: bool, ec: int,
    r: int, output_counted: bool = False,
) -> None:  # fmt: skip
    """The merger's saved tensors (ln_q -> view m^2 e wide -> mlp.0 -> GELU -> mlp.2) and what the model output
    holds of the tower (its last hidden state, the merged features)."""
    pj = v.projector
    assert pj is not None  # the merger
    full = ctx.full_training
    w, ht = pj["merge"] * e, pj["hidden"]
    rms = pj["norm"] == "rmsnorm"
    nb, what = 0, []
    norm_keeps_input = False
    if full or tower_grad:
        if rms:  # fp32 input and rsqrt when its input needs a gradient; the 16-bit normalised tensor for w's
            if tower_grad:
                nb += 4 * Tv * e + 4 * Tv
                what.append("4 B x T_v x e + 4 B x T_v (ln_q fp32 input, rsqrt)")
                norm_keeps_input = r == 4
            if full:
                nb += r * Tv * e
                what.append(f"{r} B x T_v x e (ln_q normalised)")
        else:  # LayerNorm: input, mean, rstd
            nb += r * Tv * e + 8 * Tv
            what.append(f"{r} B x T_v x e + 8 B x T_v (ln_q input, mean, rstd)")
            norm_keeps_input = True
    if full:
        mm = 2 if amp else ec
        nb += mm * N * w + 2 * ec * N * w + (2 * (w * w + w * ht + w + ht) if amp else 0)
        what.append(
            f"{mm} B x N x {w} (mlp.0 input) + 2 x {ec} B x N x {w} (GELU input, mlp.2 input)"
            + (" + 2 B x merger weights (autocast copies)" if amp else "")
        )
    else:
        pj_targets = sorted(
            {ad.base.module for ad in ctx.adapters if ad.base.stack == "projector" and ad.base.module}
        )
        if tower_grad or "0" in pj_targets:
            nb += ec * N * w
            what.append(f"{ec} B x N x {w} (GELU input)")
        if (
            pj_targets
        ):  # adapters on mlp.0 / mlp.2: each A keeps its input (cast to the adapter dtype), B A's output
            cb, ab, rank = 2 if amp else ctx.adapter_bytes, ctx.adapter_bytes, ctx.scenario.lora.rank
            nb += len(pj_targets) * (cb * N * w + ab * N * rank)
            what.append(
                f"{len(pj_targets)} x ({cb} B x N x {w} + {ab} B x N x {rank}) (LoRA inputs and A outputs)"
            )
    if nb:
        out.pre.append(
            Term(
                "merger: " + ", ".join(x.split("(")[-1].rstrip(")") for x in what),
                nb,
                " + ".join(what) + f", N={fmt_int(N)} merged tokens, T_v={fmt_int(Tv)}",
                5,
            )  # fmt: skip
        )
    # the model output's image_outputs: the merged features (16-bit) and, unless ln_q saved it already, the
    # tower's last hidden state -- alive through the loss, and with output_lifetime "backward"/"step" beyond
    norm_keeps_input = norm_keeps_input or output_counted  # the tower's output counted already
    held = ec * N * ht + (0 if norm_keeps_input else r * Tv * e)
    t = Term(
        "vision tower output and merged features held by the model output (image_outputs)",
        held,
        f"{ec} B x N x {ht}" + ("" if norm_keeps_input else f" + {r} B x T_v x {e}"),
        2 - norm_keeps_input,
    )
    out.loss_forward.append(t)
    if output_lifetime(ctx.scenario) != "trainer":
        out.output_logits.append(t)
