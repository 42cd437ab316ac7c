"""Activation checkpointing: what each checkpointed layer keeps (its input; under torchtitan's per-op policy the
outputs of every other matmul and of SDPA) and what recomputing one layer adds."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.context import Context
from memsim_widget.units import fmt_int


def checkpointing(st: HFLayer) -> None:
    """The checkpointed layer's terms under ``full`` and ``selective-op`` (``selective`` keeps the layer whole)."""
    ctx, sc, D, out, r, Tout, h = st.ctx, st.sc, st.D, st.out, st.r, st.D.Tout, st.D.h
    amp, ec, eager = st.amp, st.ec, st.eager
    # an fp32 residual stream (fp32, autocast) is saved by the first norm as is: no separate copy; so is any
    # stream by a pre-norm block's LayerNorm (``native_layer_norm`` saves its input, torch 2.13.0
    # ``tools/autograd/derivatives.yaml``; traced: GPT-NeoX h256 bf16 ckpt, layer 0's recompute holds the
    # embedding output once); not under compile, whose fused graph the compiled rules hold to their own traces
    # (GPT-2 compiled with full checkpointing: its trace holds the copy, the engine stays above it)
    nf = st.arch.facts.norm
    pre_layernorm = (
        st.arch.norm == "layernorm"
        and not sc.compile
        and not (nf.first_after_attention or nf.post_norms or st.frozen_first)
        and nf.first_layer == nf.per_layer
    )
    out.ckpt_input_shared = r == 4 or pre_layernorm
    if sc.activation_checkpointing in ("full", "selective-op"):
        out.checkpointed_layer = [
            Term("checkpointed layer inputs", r * Tout * h, f"{r} B x T x h per layer", 1)
        ]
    if sc.activation_checkpointing == "selective-op":
        selective_op(ctx, D, out, r, 2 if amp else ec, eager, amp)


#: Leaf Linears whose output the layer itself saves for backward when nothing changes it first: SDPA keeps v
#: (a view of v_proj's output), SwiGLU's activation keeps gate_proj's output.
SAVED_AS_IS = {"v_proj": "sdpa", "gate_proj": "gated"}


def layer_matmuls(ctx: Context, D: Dims, ec: int) -> list[tuple[str, float, int]]:
    """The ``aten.mm`` calls of one layer's forward, in order: (name, output bytes, width).

    HF Linears without a bias run ``mm`` (with a bias, ``addmm``); a LoRA-wrapped Linear runs its base, then
    A and B (peft ``LoraLayer.forward``). Expert weights (grouped matmuls) are not ``mm``.
    """
    groups = [g for g in ctx.arch.params if g.scope == "layer"]
    ranks = {ad.base.module: ad.rank for ad in ctx.adapters if ad.base.scope == "layer"}
    out: list[tuple[str, float, int]] = []
    for i, g in enumerate(groups):
        if not g.module or g.expert or len(g.shape) != 2:
            continue
        nxt = groups[i + 1] if i + 1 < len(groups) else None
        bias = nxt is not None and nxt.module is None and nxt.kind == g.kind and nxt.shape == g.shape[:1]
        width = g.shape[0] // D.tp if g.tp_dim == 0 else g.shape[0]
        if not bias:
            out.append((g.module, ec * D.T * width, width))
        if g.module in ranks:
            rank = ranks[g.module]
            out += [
                (f"{g.module}.lora_A", ec * D.T * rank, rank),
                (f"{g.module}.lora_B", ec * D.T * width, width),
            ]
    return out


def selective_op(
    ctx: Context, D: Dims, out: ActivationBudget, r: int, ec: int, eager: bool, amp: bool
) -> None:
    """torchtitan's per-op selective checkpointing (``selective_ac_option="op"``, trace/checkpointing.py):
    each layer keeps, besides its input, the outputs of its 1st, 3rd, 5th... ``mm``, of SDPA and of
    reduce-scatter; recomputing a layer then allocates what the layer saves less what the cache holds.
    Under autocast the 16-bit copies of trained weights stay in autocast's cache until the forward and loss
    end (traced: 2 B per Linear weight at the loss), though no layer saves them."""
    if amp and ctx.full_training:
        wl = sum(g.numel for g in ctx.arch.params if g.scope == "layer" and g.module)
        wl = wl // max(ctx.arch.num_layers, 1) // D.tp
        out.cache_per_layer.append(
            Term(
                "autocast cache: 16-bit Linear weight copies (until autocast exits)",
                2 * wl,
                f"2 B x {fmt_int(wl)} Linear weights per layer",
                7,
            )
        )
    mms = layer_matmuls(ctx, D, ec)
    kept = mms[::2]
    if kept:
        names = ", ".join(n for n, _, _ in kept)
        widths = " + ".join(str(w) for _, _, w in kept)
        out.checkpointed_layer.append(
            Term(
                "selective-op: outputs of every other matmul",
                sum(b for _, b, _ in kept),
                f"{ec} B x T x ({widths}): {names} (the 1st, 3rd, ... mm of the layer)",
                len(kept),
            )
        )
    shared = 0.0
    if not eager:
        sdpa = ec * D.T * D.hq + 4 * D.b * D.a * D.s
        out.checkpointed_layer.append(
            Term("selective-op: SDPA output and logsumexp", sdpa, f"{ec} B x T x a*d + 4 B x b x a x s", 2)
        )
        shared += sdpa
    gated = ctx.arch.mlp_activation in ("swiglu", "geglu")
    adapted = {ad.base.module for ad in ctx.adapters}  # a LoRA sum, not the base mm output, flows on
    for name, nbytes, _ in kept:
        why = None if name in adapted else SAVED_AS_IS.get(name)
        if (why == "sdpa" and not eager) or (why == "gated" and gated):
            shared += nbytes
    rowwise = sum(1 for g in ctx.arch.params if g.scope == "layer" and g.module and g.tp_dim == 1)
    if D.sp and rowwise:
        out.checkpointed_layer.append(
            Term(
                "selective-op: reduce-scatter outputs",
                rowwise * ec * D.Tout * D.h,
                f"{rowwise} x {ec} B x T/tp x h",
                rowwise,
            )
        )
    if r == 4:  # the first norm saves the fp32 layer input itself
        shared += 4 * D.Tout * D.h
    layer = sum(t.bytes for t in out.per_layer)
    out.ckpt_input_shared = False
    out.recomputed_layer = [
        Term(
            "recomputed layer (less the tensors the selective-op cache already holds)",
            layer - shared,
            f"{fmt_int(layer)} B saved by one layer - {fmt_int(shared)} B it shares with the cache",
            sum(t.tensors for t in out.per_layer),
        )
    ]
