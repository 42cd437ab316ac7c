"""``framework: "liger"``: an HF model with Liger Kernel's patches (``apply_liger_kernel_to_llama`` and its siblings,
or ``use_liger_kernel=True`` in HF Trainer / TRL): fused linear cross-entropy, RMSNorm, SwiGLU and RoPE.

Formula only, **not traced**: Liger's kernels are Triton programs that need a GPU, so no CPU fake-tensor trace can
run them; every term below is read from Liger-Kernel's source (linkedin/Liger-Kernel) and the estimate's caveats say
so. With e the compute dtype's bytes and r the residual stream's:

- Fused linear cross-entropy (``src/liger_kernel/ops/fused_linear_cross_entropy.py`` at commit 00eba634,
  ``fused_linear_cross_entropy_forward``): the model returns no logits; the loss runs the head chunk by chunk with
  ``chunk_size = next_power_of_2(ceil(BT / ceil(V / H)))`` tokens (at most BT), one chunk's logits alive at a time
  (e x chunk x V; the kernel writes the logits' gradient into them in place), and computes the gradients in forward:
  ``grad_input = zeros_like(_input)`` (r T h) and, when the head trains, ``grad_weight = zeros_like(weight)``
  (the head's gradient, V x h in the weight dtype), both kept until backward, which only returns them; a fp32
  per-token loss (4 T).
- RMSNorm (``ops/rms_norm.py``, ``LigerRMSNormFunction``): saves its input X, the weight and a fp32 rstd per row
  (llama casting mode); the output is what the next Linear saves. HF's saves the fp32 input copy, the rsqrt and the
  normalised product instead. Its backward writes dX into dY in place (fp32 dW partial sums per SM: small).
- SwiGLU (``ops/swiglu.py``, ``LigerSiLUMulFunction``): saves gate's and up's outputs only (2 e T I) and recomputes
  the SiLU in backward, writing both gradients in place; HF's saves the SiLU output too.
- RoPE (``ops/rope.py``): cos and sin only, as HF's (no change to the saved set).

Applied per layer in ``bf16`` (the layer terms of HF's rule replaced by name); under other precisions only the
loss is Liger's and the caveat says the layers keep HF's rules.
"""

from __future__ import annotations

import math

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.context import Context
from memsim_widget.scenario import Scenario


def liger_applies(sc: Scenario, arch: Architecture) -> bool:
    """The Liger formula covers the scenario: a decoder Liger patches with its RMSNorm, SwiGLU and RoPE (its family
    declares ``coverage.liger``: ``apply_liger_kernel_to_llama`` / ``_mistral`` / ``_qwen2`` / ``_qwen3``), the standard loss, no compile, SFT, no tensor or
    context parallelism (data and pipeline parallelism change no layer's or loss's saved set)."""
    return bool(
        sc.framework == "liger"
        and arch.facts.coverage.liger
        and arch.norm == "rmsnorm"
        and arch.mlp_activation == "swiglu"
        and not arch.is_moe
        and arch.facts.vision is None
        and arch.facts.calibration is None
        and arch.vocab_size
        and sc.loss == "standard"
        and not sc.compile
        and sc.objective_name == "sft"
        and sc.parallel.tp == sc.parallel.cp == sc.parallel.ep == 1
    )


def liger_layers_apply(sc: Scenario) -> bool:
    """Liger's RMSNorm and SwiGLU replace HF's saved set (bf16, no checkpointing); else only the loss is Liger's."""
    return sc.precision == "bf16" and sc.activation_checkpointing == "none"


def flce_chunk(T: int, V: int, h: int) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy: ``next_power_of_2(ceil(BT / ceil(V / H)))``, at
    most BT (``fused_linear_cross_entropy_forward``, ``chunk_mem_const`` 1)."""
    inc = -(-V // h)
    per = -(-T // inc)
    return min(1 << max(0, math.ceil(math.log2(per))), T)


def _replace(terms: list[Term], name: str, new: list[Term]) -> None:
    """Put ``new`` where the term called ``name`` was (drop it when ``new`` is empty)."""
    for i, t in enumerate(terms):
        if t.name == name:
            terms[i : i + 1] = new
            return


def liger_activations(ctx: Context, out: ActivationBudget) -> None:
    """Replace HF's loss (and, in bf16, its RMSNorm and SwiGLU terms) by Liger's (see the module docstring)."""
    D = Dims(ctx)
    T, h, I, V = D.T, D.h, D.I, D.V
    sc = ctx.scenario
    e = ctx.recipe.act_bytes if sc.precision != "amp-bf16" else 2
    r = 4 if sc.precision.startswith("amp") else ctx.recipe.act_bytes
    if liger_layers_apply(sc):
        norm = Term("Liger RMSNorm: input X and fp32 rstd", 2 * (e * T * h + 4 * T),
                    f"2 norms x ({e} B x T x h + 4 B x T)", 4)  # fmt: skip
        _replace(out.per_layer, "RMSNorm fp32 inputs and rsqrt", [norm])
        _replace(out.per_layer, "RMSNorm normalised tensors", [])
        _replace(out.per_layer, "MLP activation internals (swiglu)",
                 [Term("Liger SwiGLU: gate and up outputs", 2 * e * T * I, f"2 x {e} B x T x I, I={I}", 2)])  # fmt: skip
        _replace(out.post, "final norm", [Term("Liger final RMSNorm: input X and fp32 rstd", e * T * h + 4 * T,
                                               f"{e} B x T x h + 4 B x T", 2)])  # fmt: skip
        out.top_backward[:] = [
            Term(
                "Liger final RMSNorm backward: the incoming gradient, overwritten by dX",
                e * T * h,
                f"{e} B x T x h",
                1,
            )
        ]
    chunk = flce_chunk(T, V, h)
    out.loss_forward[:] = [
        Term(f"Liger fused linear CE: one chunk's logits ({chunk} tokens; the gradient written in place)",
             e * chunk * V, f"{e} B x {chunk} x V, chunk = next_pow2(ceil(T / ceil(V / h)))", 1),
        Term("Liger fused linear CE: fp32 per-token loss", 4 * T, "4 B x T", 1),
    ]  # fmt: skip
    saved = [Term("Liger fused linear CE: the hidden state's gradient, made in forward", r * T * h,
                  f"{r} B x T x h", 1)]  # fmt: skip
    head_trains = sc.method == "full"
    if head_trains:
        w = ctx.recipe.weight_bytes
        saved.append(Term("Liger fused linear CE: the head's gradient, made in forward", w * V * h,
                          f"{w} B x V x h", 1))  # fmt: skip
    out.loss_saved[:] = saved
    out.loss_backward[:] = []
    out.output_logits[:] = []  # the patched forward returns no logits in training
