"""The combinations whose saved tensors no trace has checked: refused with a ScenarioError that names the field,
never a guess (Falcon's ALiBi and multi-query variants, T5 under per-op checkpointing, Mamba beyond its traces)."""

from __future__ import annotations

from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import check_tp_plan, profile, uses_autocast
from memsim_widget.errors import ScenarioError
from memsim_widget.rules import check
from memsim_widget.rules.model import SSM_WHY


def refuse_untraced(ctx: Context) -> None:
    """Raise ScenarioError for the Falcon and T5 combinations whose saved tensors no trace has checked (never a
    guess)."""
    arch, sc = ctx.arch, ctx.scenario
    check_tp_plan(sc)
    if arch.facts.ssm is not None:
        refuse_ssm(ctx)
    if arch.facts.coverage.encoder_decoder and sc.activation_checkpointing == "selective-op":
        raise ScenarioError(
            "activation_checkpointing", "selective-op (torchtitan's per-op policy) is not modelled for T5: "
            "torchtitan has no encoder-decoder model and no trace checks it; use none, selective or full",
        )  # fmt: skip
    amp = uses_autocast(ctx)
    if arch.facts.attention.sdpa_math_fallback and sc.activation_checkpointing == "selective-op":
        # traced +4.5% (b2 s512): the per-op policy finds no SDPA op in the math fallback (bmm, softmax) and the
        # recomputed layer's transients differ from the rule's llama-shaped layer
        raise ScenarioError(
            "activation_checkpointing", "selective-op with Falcon's multi-query attention (SDPA's math fallback) "
            "is not modelled; use none or full",
        )  # fmt: skip
    if arch.position == "alibi" and amp:
        # traced: the fp32 bias lives through the whole forward beside a 16-bit cast per layer that SDPA saves; the
        # forward's peak then exceeds the engine's moments by 3-5%
        raise ScenarioError(
            "precision", f"{sc.precision} with alibi is not modelled: Falcon's fp32 ALiBi bias and its per-layer "
            "16-bit casts peak inside the forward; use bf16/fp16/fp32",
        )  # fmt: skip
    if arch.position == "alibi" and sc.attention == "eager":
        raise ScenarioError(
            "attention", "eager with alibi is not modelled: Falcon's ALiBi eager path keeps several b x a x s x s "
            "fp32 tensors during the forward; use sdpa",
        )  # fmt: skip
    if arch.position == "alibi" and arch.attention_dropout > 0:
        raise ScenarioError(
            "model.attention_dropout", f"{arch.attention_dropout} with alibi is not modelled (SDPA drops the "
            "probabilities; not traced): set it to 0",
        )  # fmt: skip


def refuse_ssm(ctx: Context) -> None:
    """State-space layers (Mamba): only what a trace or mamba-ssm's source backs -- full training in one
    precision (bf16, fp16, fp32), no checkpointing, the HF activation rules, one rank's whole sequence."""
    sc = ctx.scenario
    why = SSM_WHY
    if uses_autocast(ctx):
        raise ScenarioError("precision", f"{sc.precision} {why}; use bf16, fp16 or fp32")
    if sc.method != "full":
        _check_ssm_lora(ctx)
    if sc.activation_checkpointing != "none":
        raise ScenarioError("activation_checkpointing", f"{sc.activation_checkpointing} {why}; use none")
    if profile(ctx).activation_model == "megatron":
        raise ScenarioError("framework", f"{sc.framework} {why}; use hf")
    check("ssm", ctx.rules_view)  # tensor and context parallelism (rules/model.py)


#: Modules peft refuses to wrap in Mamba-based models (peft 0.21 ``tuners/lora/model.py``: "incompatible with
#: Mamba-based models").
PEFT_MAMBA_REFUSED = ("out_proj", "conv1d")


def _check_ssm_lora(ctx: Context) -> None:
    """LoRA on a state-space model: traced for Mamba and Mamba-2 (not the Jamba hybrid), in bf16, on the modules
    peft wraps there (it refuses out_proj and conv1d, so ``all-linear`` fails too)."""
    sc, arch = ctx.scenario, ctx.arch
    if sc.method == "qlora" or arch.facts.hybrid is not None:
        raise ScenarioError("method", f"{sc.method} {SSM_WHY} in {arch.facts.hf_class}; use full")
    targets = set(sc.lora.targets)
    bad = sorted(targets & {*PEFT_MAMBA_REFUSED, "all-linear"})
    if bad:
        raise ScenarioError(
            "lora.targets", f"peft refuses {', '.join(bad)} on Mamba-based models (out_proj and conv1d are "
            "incompatible, and all-linear includes out_proj): name in_proj"
            + (", x_proj or dt_proj" if arch.facts.ssm is not None and arch.facts.ssm.version == 1 else ""),
        )  # fmt: skip
    if ctx.recipe.act_bytes != 2:
        raise ScenarioError("precision", f"{sc.precision} with LoRA {SSM_WHY}; use bf16 or fp16")
