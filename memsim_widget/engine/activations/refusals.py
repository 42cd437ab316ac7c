"""The combinations whose saved tensors no trace has checked: refused with a ScenarioError that names the field,
never a guess (Falcon's ALiBi and multi-query variants, T5 under per-op checkpointing, Mamba beyond its traces)."""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import check_compile_loss, check_tp_plan, profile, uses_autocast
from memsim_widget.errors import ScenarioError
from memsim_widget.rules import check
from memsim_widget.rules.model import SSM_WHY


def refuse_untraced(ctx: Context) -> None:
    """Raise ScenarioError for the Falcon and T5 combinations whose saved tensors no trace has checked (never a
    guess)."""
    arch, sc = ctx.arch, ctx.scenario
    check_tp_plan(sc)
    check_compile_loss(sc)
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
    """State-space layers (Mamba, Mamba-2, Jamba): only what a trace or mamba-ssm's source backs (docs/fidelity.md,
    "Mamba"): the HF activation rules, one rank's whole sequence, no per-op or Megatron-style selective
    checkpointing; full checkpointing, autocast and LoRA where a trace holds the rule (``SSM_TRACED``)."""
    sc, arch = ctx.scenario, ctx.arch
    kind = ssm_kind(arch)
    why = SSM_WHY
    ckpt = sc.activation_checkpointing
    if ckpt not in ("none", "full"):
        raise ScenarioError("activation_checkpointing", f"{ckpt} {why}; use none or full")
    if ckpt == "full" and "full checkpointing" not in SSM_TRACED[kind]:
        raise ScenarioError("activation_checkpointing", f"full {why} in {arch.facts.hf_class}; use none")
    if ckpt == "full" and kind == "mamba2":
        _check_mamba2_ckpt(ctx)
    if uses_autocast(ctx) and "autocast" not in SSM_TRACED[kind]:
        raise ScenarioError(
            "precision", f"{sc.precision} {why} in {arch.facts.hf_class}; use bf16, fp16 or fp32"
        )
    if sc.method != "full":
        _check_ssm_lora(ctx, kind)
    if profile(ctx).activation_model == "megatron":
        raise ScenarioError("framework", f"{sc.framework} {why}; use hf")
    check("ssm", ctx.rules_view)  # tensor and context parallelism (rules/model.py)


#: What a fake-tensor trace of transformers' torch path holds per state-space family (docs/fidelity.md, the
#: Mamba section: each combination's rows); anything else is refused by ``refuse_ssm``.
SSM_TRACED: dict[str, frozenset[str]] = {
    "mamba": frozenset({"autocast", "full checkpointing", "lora"}),
    "mamba2": frozenset({"autocast", "full checkpointing", "lora"}),  # checkpointing: MAMBA2_CKPT_TRACED
    "jamba": frozenset({"autocast", "full checkpointing", "lora"}),
}


#: Mamba-2 under full checkpointing, traced (docs/fidelity.md, Mamba-2): full training in bf16 (+0.01%, b2 s512),
#: fp32 (+0.01%, b2 s256) and under autocast (-0.00%, b2 s512 bf16 and fp16), LoRA on in_proj in bf16 (+0.02%),
#: fp32 (-0.04%) and under autocast (-0.08%); fp16 has bf16's sizes. Anything else (mixed-*, fp8) is refused
MAMBA2_CKPT_TRACED = ("bf16", "fp16", "fp32", "amp-bf16", "amp-fp16")


def _check_mamba2_ckpt(ctx: Context) -> None:
    """Mamba-2 full checkpointing only in the precisions a trace holds the rule in (``MAMBA2_CKPT_TRACED``)."""
    sc = ctx.scenario
    if sc.precision in MAMBA2_CKPT_TRACED:
        return
    raise ScenarioError(
        "activation_checkpointing", f"full with {sc.precision} {SSM_WHY} in Mamba-2; use none, or precision "
        f"{'/'.join(MAMBA2_CKPT_TRACED)}",
    )  # fmt: skip


def ssm_kind(arch: Architecture) -> str:
    """``mamba``, ``mamba2`` or ``jamba`` (the hybrid): which traced rules a state-space model has."""
    if arch.facts.hybrid is not None:
        return "jamba"
    return "mamba2" if arch.facts.ssm is not None and arch.facts.ssm.version == 2 else "mamba"


#: Modules peft refuses to wrap in Mamba-based models (peft 0.21 ``tuners/tuners_utils.py``
#: ``_check_lora_target_modules_mamba``: "incompatible with Mamba-based models", for model types mamba, mamba2,
#: falcon_mamba, falcon_h1 and nemotron_h; not jamba).
PEFT_MAMBA_REFUSED = ("out_proj", "conv1d")

#: Mamba (v1) Linears that peft wraps but ``MambaMixer`` never calls (transformers 5.24 ``modeling_mamba.py``):
#: the kernel path hands ``x_proj.weight`` and ``dt_proj.weight`` to ``mamba_inner_fn``, the torch path computes
#: ``dt_proj.weight @ time_step``; an adapter there never runs, gets no gradient and saves nothing.
MAMBA_BYPASSED = {"cuda": ("x_proj", "dt_proj"), "torch": ("dt_proj",)}


def _check_ssm_lora(ctx: Context, kind: str) -> None:
    """LoRA on a state-space model: traced for Mamba and Mamba-2 (any precision) and the Jamba hybrid (in_proj
    first), on the modules peft wraps there (it refuses out_proj and conv1d, so ``all-linear`` fails too) and
    that the mixer calls."""
    sc, arch = ctx.scenario, ctx.arch
    if sc.method == "qlora" or "lora" not in SSM_TRACED[kind]:
        raise ScenarioError("method", f"{sc.method} {SSM_WHY} in {arch.facts.hf_class}; use full")
    targets = set(sc.lora.targets)
    kernel = sc.ssm_kernel or "cuda"
    if kind == "jamba":
        _check_jamba_lora(ctx, targets)
        return
    # the Linears whose adapters run: in_proj, and x_proj on Mamba's torch path
    runs = "in_proj" + (" or x_proj" if kind == "mamba" and kernel == "torch" else "")
    bad = sorted(targets & {*PEFT_MAMBA_REFUSED, "all-linear"})
    if bad:
        raise ScenarioError(
            "lora.targets", f"peft refuses {', '.join(bad)} on Mamba-based models (out_proj and conv1d are "
            f"incompatible, and all-linear includes out_proj): name {runs}",
        )  # fmt: skip
    if kind == "mamba" and targets <= set(MAMBA_BYPASSED[kernel]):
        raise ScenarioError(
            "lora.targets", f"{', '.join(sorted(targets))}: MambaMixer ({kernel} path) reads "
            f"{' and '.join(n + '.weight' for n in MAMBA_BYPASSED[kernel])} directly, so peft's adapter never "
            f"runs and nothing trains; name {runs}",
        )  # fmt: skip


#: Jamba mixer modules whose adapters no trace checks (peft wraps them on Jamba): out_proj's and conv1d's, and
#: dt_proj's, which ``JambaMambaMixer`` never calls (it reads ``dt_proj.weight``, transformers 5.24
#: ``modeling_jamba.py``, unless the model is quantized); ``all-linear`` includes out_proj.
JAMBA_LORA_UNTRACED = ("out_proj", "conv1d", "dt_proj", "all-linear")


def _check_jamba_lora(ctx: Context, targets: set[str]) -> None:
    """LoRA on Jamba: traced with an adapter on in_proj, so that layer 0 (a Mamba layer in every preset) has one and
    every layer keeps what its input's gradient needs. With adapters only higher up (q_proj and v_proj: the first
    attention layer is layer 4 in the presets) the layers below keep nothing, which the averaged stack does not
    model (+34.4% traced with q/v)."""
    bad = sorted(targets & set(JAMBA_LORA_UNTRACED))
    if bad:
        raise ScenarioError(
            "lora.targets", f"{', '.join(bad)}: adapters on Jamba's out_proj and conv1d are not modelled (no "
            "trace checks them) and dt_proj's never runs (the mixer reads dt_proj.weight); name in_proj, x_proj "
            "and attention or MLP modules",
        )  # fmt: skip
    if "in_proj" not in targets or (
        ctx.arch.facts.hybrid is None or ctx.arch.facts.hybrid.layer_block_types[0] != "mamba"
    ):
        raise ScenarioError(
            "lora.targets", f"{', '.join(sorted(targets))}: on Jamba the layers below the first adapter keep "
            "nothing, which is not modelled (no trace checks it); add in_proj (layer 0's first Linear)",
        )  # fmt: skip
