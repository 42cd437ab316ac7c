"""Activations of a model calibrated from traces (a transformers type no family models): fitted, not derived.

The architecture's ``facts.calibration`` (``memsim_widget/calibrate``, outside the engine) returns plain
coefficients of the non-state bytes a real HF training step keeps, fitted on tiny fake-tensor traces of a
shrunk copy of the model: per block and outside the blocks, at the start of backward (``saved``) and at the
forward's and the backward's peaks. This module only evaluates them at the scenario's (b, s) and refuses what a
per-block count cannot stand for (tensor, pipeline, context or expert parallelism, sequence parallel, other
frameworks' models, partial or selective checkpointing, offloading, the chunked loss, QLoRA).
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.context import Context
from memsim_widget.errors import ScenarioError

#: Precisions a trace runs (the fit traces the scenario's own recipe).
CALIBRATED_PRECISIONS = ("fp32", "bf16", "fp16", "amp-bf16", "amp-fp16")
#: The terms a fit may use, by the label the fit names them with (``fit["basis"]``).
TERMS = {
    "": lambda b, s: 1,
    "s": lambda b, s: s,
    "b*s": lambda b, s: b * s,
    "b*s^2": lambda b, s: b * s * s,
    "s^2": lambda b, s: s * s,
}
_BASIS = ("", "s", "b*s", "b*s^2", "s^2")  # the order calibrate.fit.BASIS uses


def recipe_key(arch: Any, sc: Any) -> tuple:
    """What the fit depends on: precision, attention kernel run, LoRA (targets, rank, alpha, dtype), checkpointing."""
    lora = None
    if sc.method != "full":
        lora = (tuple(sorted(sc.lora.targets)), sc.lora.rank, float(sc.lora.alpha), sc.lora.adapter_dtype)
    return (sc.precision, arch.attention_kernel(sc.attention), lora, sc.activation_checkpointing == "full")


def refuse(ctx: Context) -> None:
    """Raise ScenarioError for a scenario a fitted per-block count cannot answer (naming the field and why)."""
    sc, p = ctx.scenario, ctx.par
    why = "needs the module structure, which a calibrated model does not describe"
    for name, deg in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp), ("ep", p.ep)):
        if deg > 1:
            raise ScenarioError(
                f"parallel.{name}", f"{name}={deg} {why}; a calibrated model takes dp/zero only"
            )
    if p.sequence_parallel:
        raise ScenarioError("parallel.sequence_parallel", f"sequence parallel {why}")
    if sc.framework != "hf":
        raise ScenarioError(
            "framework", f"{sc.framework!r}: a calibrated model is traced as HF transformers runs it; use hf"
        )
    if sc.method == "qlora":
        raise ScenarioError(
            "method", "qlora is not calibrated (bitsandbytes' 4-bit kernels cannot be traced on a CPU)"
        )
    if sc.precision not in CALIBRATED_PRECISIONS:
        raise ScenarioError(
            "precision", f"{sc.precision!r} is not calibrated; traced: {', '.join(CALIBRATED_PRECISIONS)}"
        )
    if sc.activation_checkpointing not in ("none", "full") or sc.checkpoint_every not in (None, 1):
        raise ScenarioError(
            "activation_checkpointing", "a calibrated model is traced without checkpointing or with HF's full "
            "per-block checkpointing only",
        )  # fmt: skip
    if sc.activation_offloading:
        raise ScenarioError("activation_offloading", "not calibrated for a calibrated model; set it to false")
    if sc.loss != "standard":
        raise ScenarioError("loss", "a calibrated model computes transformers' own loss; use standard")
    if ctx.scenario.output_lifetime not in (None, "trainer"):
        raise ScenarioError(
            "output_lifetime", "a calibrated model is traced with HF Trainer's loop; use trainer"
        )


def formula(coef: list[float]) -> str:
    """A fitted amount in words: ``c0 + c1 x s + c2 x b*s + c3 x b*s^2 + c4 x s^2`` bytes, tiny terms left out."""
    parts = []
    for c, term in zip(coef, _BASIS, strict=True):
        if abs(c) < 0.5:
            continue
        parts.append(f"{c:,.0f}" + (f" x {term}" if term else ""))
    return " + ".join(parts).replace("+ -", "- ") + " B" if parts else "0 B"


def raw(coef: list[float], b: int, s: int) -> float:
    """A fitted polynomial at (b, s) (a part of an amount: may be negative)."""
    return sum(c * TERMS[t](b, s) for c, t in zip(coef, _BASIS, strict=True))


def value(coef: list[float], b: int, s: int) -> float:
    """A fitted amount at (b, s), never below zero."""
    return max(raw(coef, b, s), 0.0)


def fit_for(arch: Any, scenario: Any) -> dict[str, Any]:
    """The architecture's fit for this scenario's recipe (traced outside the engine on its first use)."""
    return arch.facts.calibration.fit(recipe_key(arch, scenario))


def calibrated_activations(ctx: Context) -> ActivationBudget:
    """The fitted amounts as the timeline's terms: a block's saved bytes, the rest at the loss, and the forward's
    and backward's transients above the saved level (the phases' fitted peaks less the saved bytes, L blocks)."""
    refuse(ctx)
    fit = fit_for(ctx.arch, ctx.scenario)
    b, s, L = ctx.scenario.micro_batch_size, ctx.seq_len, ctx.arch.num_layers
    per = value(fit["per_layer"], b, s)
    saved = max(raw(fit["rest"], b, s) + L * per, per)
    rest = saved - L * per
    out = ActivationBudget()
    what = "calibrated from a trace, fitted"
    kept = (
        "checkpointed block input ("
        if ctx.scenario.activation_checkpointing == "full"
        else "saved by one block ("
    )
    out.per_layer.append(Term(f"{kept}{what})", per, formula(fit["per_layer"]), 1))
    if ctx.scenario.activation_checkpointing == "full":
        out.checkpointed_layer = list(out.per_layer)
        out.recomputed_layer = [Term("recomputed block (in the fitted backward peak)", 0, "0 B", 0)]
    out.post.append(Term(f"saved outside the blocks: embeddings, final norm, loss, inputs ({what})", rest,
                         formula(fit["rest"]), 1))  # fmt: skip
    for phase, bucket, less, less_text in (
        ("forward", out.loss_forward, saved, " - saved bytes"),
        ("backward", out.loss_backward, saved, " - saved bytes"),
        ("blocks", out.layer_backward, L * per, f" - {L} x block"),
        ("attention", out.attention_backward, L * per, f" - {L} x block"),
        ("bottom", out.bottom_backward, 0.0, ""),
    ):
        f = fit[phase]
        peak = max(raw(f["rest"], b, s) + L * raw(f["per_layer"], b, s), 0.0)
        label = {
            "forward": "forward transients above the saved bytes",
            "backward": "loss backward transients above the saved bytes",
            "blocks": "blocks' backward: transients and what is saved outside the blocks",
            "attention": "blocks' attention backward: transients and what is saved outside the blocks",
            "bottom": "embedding backward: its buffers and what is left saved",
        }[phase]
        bucket.append(
            Term(
                f"{label} ({what})",
                max(peak - less, 0.0),
                f"({formula(f['rest'])}) + {L} x ({formula(f['per_layer'])}){less_text}",
                1,
            )
        )
    return out


def caveat(arch: Any, scenario: Any) -> str:
    """The label every output carries: the fitted formula with its numbers and the held-out check."""
    fit = fit_for(arch, scenario)
    ho = fit["held_out"]
    return (
        f"calibrated from a trace: {arch.model_type!r} has no family in memsim, so its activations are "
        f"fitted on fake-tensor traces of a 2- and 3-block copy (fitted: saved bytes/layer = "
        f"{formula(fit['per_layer'])}, outside the blocks {formula(fit['rest'])}; b micro-batch, s sequence; "
        f"held-out b={ho['b']} s={ho['s']} {ho['blocks']} blocks within {fit['residual']:.2%}); parameters counted exactly on the meta device"
    )
