"""The entry point of the activation rules: a context in, one micro-batch's ``ActivationBudget`` out -- fitted terms
for a calibrated model, Megatron's fused-kernel formula or the HF rules, plus a multimodal model's vision side and
the tensors a pipeline stage exchanges."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.compiled import (
    compiled_activations,
    compiled_formula,
    compiled_formula_applies,
    compiled_rule_applies,
)
from memsim_widget.engine.activations.compiled_kept import compiled_backward_kept
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.activations.hf import hf_activations
from memsim_widget.engine.activations.liger import liger_activations, liger_applies
from memsim_widget.engine.activations.litgpt import litgpt_activations, litgpt_rule_applies
from memsim_widget.engine.activations.megatron import megatron_activations
from memsim_widget.engine.activations.refusals import refuse_untraced
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import effective_recipe, profile, uses_autocast
from memsim_widget.units import fmt_int


def activations(ctx: Context) -> ActivationBudget:
    """Saved and transient activations of one micro-batch on one rank."""
    if ctx.arch.facts.calibration is not None:  # a transformers type no family models: fitted terms
        from memsim_widget.engine.activations.calibrated import calibrated_activations

        out = calibrated_activations(ctx)
        stage_io(ctx, out)
        return out
    refuse_untraced(ctx)
    # attention and Mamba layers in one stack (Jamba; engine/activations/hybrid.py)
    if ctx.arch.facts.hybrid is not None:
        from memsim_widget.engine.activations.hybrid import hybrid_activations

        out = hybrid_activations(ctx, hf_activations)
    else:
        out = (
            megatron_activations(ctx) if profile(ctx).activation_model == "megatron" else hf_activations(ctx)
        )
        if compiled_rule_applies(ctx.scenario, ctx.arch):  # torch.compile's saved set (traced)
            compiled_activations(ctx, out)
            compiled_backward_kept(ctx, out)  # a compiled autocast backward, from the stream's steps
        elif compiled_formula_applies(ctx.scenario, ctx.arch):  # the rest of compile: a formula, untraced
            compiled_formula(ctx, out)
        if litgpt_rule_applies(ctx.scenario, ctx.arch):  # litgpt's own modules and chunked loss (traced)
            litgpt_activations(ctx, out)
        if liger_applies(ctx.scenario, ctx.arch):  # Liger Kernel's patches (formula, untraced)
            liger_activations(ctx, out)
    if (
        ctx.arch.facts.vision is not None
    ):  # a multimodal model's vision tower and projector (engine/multimodal/tower.py)
        from memsim_widget.engine.multimodal.tower import vision_activations

        vision_activations(ctx, out, hf_activations)
    stage_io(ctx, out)
    return out


def stage_io(ctx: Context, out: ActivationBudget) -> None:
    """The tensors a pipeline stage exchanges, one micro-batch each (engine/parallel/pipeline.py says how many live):
    hidden states in the residual dtype (fp32 under autocast), logits in the compute dtype."""
    D = Dims(ctx)
    amp = uses_autocast(ctx)
    ec = effective_recipe(ctx).act_bytes
    r = 4 if amp else ec
    hidden = r * D.Tout * D.h
    what = f"{r} B x T x h, T={fmt_int(D.Tout)}"
    out.pp_buffer.append(
        Term("pipeline receive/send buffers (hidden states or their gradient)", hidden, what)
    )
    out.pp_output.append(Term("stage outputs kept by the schedule until their backward", hidden, what))
    if D.V:
        le = 2 if amp else ec
        out.pp_logits.append(
            Term(
                "logits (the last stage's output) kept by the schedule until their backward",
                le * D.T * D.V,
                f"{le} B x T x V, V={D.V}",
            )  # fmt: skip
        )
