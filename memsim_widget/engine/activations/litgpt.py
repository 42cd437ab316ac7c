"""``framework: "litgpt"``: what litgpt's own model, LoRA layers and chunked loss save, where a trace backs it.

Source: litgpt 0.5.13 (pip ``litgpt==0.5.13``), traced by running that code on fake tensors
(trace/litgpt.py, docs/fidelity.md). Per decoder layer in ``bf16`` (Fabric's ``bf16-true``), with e = 2 B:

- ``RMSNorm.forward`` (model.py): ``x = x.float()`` (the fp32 copy ``x * x`` saves, 4 T h), ``x_normed = x *
  rsqrt(...)`` (the fp32 rsqrt, 4 T), ``(x_normed * weight.float()).to(dtype)``: the product saves the fp32
  ``x_normed`` (4 T h) when the weight trains and the fp32 weight copy (4 h); its e-byte output is what the next
  Linear saves. Twice per layer (``norm_1``, ``norm_2``). HF's LlamaRMSNorm multiplies in the 16-bit dtype.
- ``CausalSelfAttention.forward``: one ``qkv`` Linear; RoPE through ``torch.cat`` gives new q and k; under GQA k
  and v are ``repeat_interleave``d to ``n_head`` before SDPA, which saves q, k, v (3 e T a d), its output
  (e T a d) and the fp32 logsumexp (4 T a); ``y.reshape`` copies the transposed output for ``proj`` (e T a d).
- ``LLaMAMLP.forward``: fc_1's and fc_2's outputs, the SiLU output and the product (4 e T I).
- LoRA (lora.py, ``LoRAQKVLinear`` on q and v): the frozen Linears save no input and ``norm_2`` no fp32
  ``x_normed``; the adapters save ``norm_1``'s output (for lora_A), lora_A's output (e T 2r), the grouped
  conv1d's output at the adapted widths (e T (a d + kv d)) and two int64 index vectors of those widths;
  the MLP saves fc_1's, fc_2's and the SiLU's outputs (3 e T I), not the product (``proj`` is frozen).
- After the layers: ``ln_f`` as above (its fp32 ``x_normed`` only when the head trains); its backward holds
  16 B x T x h of fp32 transients and gradients, 20 with a trainable weight, and small fp32 reductions (traced).
- The loss (utils.py ``chunked_cross_entropy`` on the list ``GPT.forward(..., lm_head_chunk_size=128)``
  returns): the e-byte logits (e T V, kept by the loop through the step) and the e-byte log-softmax every
  chunk's ``cross_entropy`` saves (e T V: chunking frees nothing before backward); backward runs one chunk at a
  time: its two e-byte gradient buffers (2 e x B x 128 x V).

Under amp-bf16 (``bf16-mixed``) the layers keep HF's autocast rule but for litgpt's LoRA differences, and the head and
loss are litgpt's (``_amp_head_and_loss``: a frozen head is recast for every chunk; each chunk's cross-entropy as
CUDA's autocast runs it, a bf16 log-softmax and nll_loss's fp32 copy saved, ``loss.autocast_ce_saved``). Other
litgpt configurations (fp32, LoRA on other weights, checkpointing) keep HF's rules, said in the estimate's caveats
(``litgpt_rule_applies``).
"""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.activations.loss import autocast_ce_backward, autocast_ce_saved
from memsim_widget.engine.context import Context
from memsim_widget.scenario import Scenario

#: Tokens per LM-head chunk in litgpt's finetune scripts (``model(input_ids, lm_head_chunk_size=128)``).
LITGPT_HEAD_CHUNK = 128


def litgpt_rule_applies(sc: Scenario, arch: Architecture) -> bool:
    """The traced litgpt rule covers the scenario: a Llama-layout decoder litgpt's config reproduces (its family
    declares ``coverage.litgpt``; trace/litgpt.py builds them) in bf16, full training or LoRA on q and v,
    no checkpointing, the standard loss, SDPA, no tensor or context parallelism (data and
    pipeline parallelism change no layer's or loss's saved set)."""
    return bool(
        sc.framework == "litgpt"
        and arch.facts.coverage.litgpt
        and arch.norm == "rmsnorm"
        and arch.mlp_activation == "swiglu"
        and not arch.is_moe
        and arch.facts.vision is None
        and arch.facts.calibration is None
        and sc.precision in ("bf16", "amp-bf16")
        and not sc.compile
        and (sc.method == "full" or (sc.method == "lora" and set(sc.lora.targets) == {"q_proj", "v_proj"}))
        and sc.activation_checkpointing == "none"
        and sc.loss == "standard"
        and sc.attention == "sdpa"
        and sc.objective_name == "sft"
        and sc.parallel.tp == sc.parallel.cp == sc.parallel.ep == 1
    )


def litgpt_layers_apply(sc: Scenario) -> bool:
    """The layer rule is traced in bf16 (``bf16-true``); under amp-bf16 (``bf16-mixed``) only the head and loss are
    litgpt's and the layers keep HF's autocast rules (traced: within 0.01% at Llama 3.2 1B's dimensions)."""
    return sc.precision == "bf16"


def _norm(T: int, h: int, e: int, trains: bool, what: str) -> list[Term]:
    """One litgpt RMSNorm's saved tensors: the fp32 input copy and rsqrt, the fp32 weight copy, and the fp32
    ``x_normed`` when the weight trains."""
    terms = [Term(f"litgpt {what}: fp32 input copy and rsqrt, fp32 weight copy", 4 * T * h + 4 * T + 4 * h,
                  f"4 B x T x h + 4 B x T + 4 B x h (h={h})", 3)]  # fmt: skip
    if trains:
        terms.append(
            Term(f"litgpt {what}: fp32 x_normed (weight.float() product)", 4 * T * h, "4 B x T x h", 1)
        )
    return terms


def litgpt_activations(ctx: Context, out: ActivationBudget) -> None:
    """Replace the HF terms of ``out`` by litgpt's (see the module docstring)."""
    if not litgpt_layers_apply(ctx.scenario):
        _amp_head_and_loss(ctx, out)
        return
    D = Dims(ctx)
    T, h, hq, hkv, a, I, V = D.T, D.h, D.hq, D.hkv, D.a, D.I, D.V
    e = ctx.recipe.act_bytes
    lora = ctx.scenario.method == "lora"
    full = not lora
    # k and v: repeat_interleave'd copies at n_head under GQA; under MHA v is a view of the qkv output
    gqa = hkv != hq
    kv_term = (
        Term("litgpt attention: k and v repeat_interleave'd to n_head", 2 * e * T * hq, f"2 x {e} B x T x a*d", 2)
        if gqa
        else Term("litgpt attention: k after RoPE, v (a view holding the whole qkv output)",
                  e * T * hq + e * T * (hq + 2 * hkv), f"{e} B x T x a*d + {e} B x T x (a*d + 2 kv*d)", 2)
    )  # fmt: skip
    layer = [
        *_norm(T, h, e, full, "norm_1"),
        Term("litgpt norm_1 output (qkv's or lora_A's input)", e * T * h, f"{e} B x T x h", 1),
        *_norm(T, h, e, full, "norm_2"),
        Term(
            "litgpt attention: q after RoPE (torch.cat), SDPA output",
            2 * e * T * hq,
            f"2 x {e} B x T x a*d",
            2,
        ),
        kv_term,
        Term("litgpt attention: SDPA logsumexp (fp32)", 4 * T * a, f"4 B x T x heads, heads={a}", 1),
    ]
    if full:
        layer += [
            Term("litgpt norm_2 output (fc_1/fc_2 input)", e * T * h, f"{e} B x T x h", 1),
            Term("litgpt attention: proj input (reshaped SDPA output)", e * T * hq, f"{e} B x T x a*d", 1),
            Term("litgpt LLaMAMLP: fc_1, fc_2, SiLU outputs and their product", 4 * e * T * I,
                 f"4 x {e} B x T x I, I={I}", 4),
        ]  # fmt: skip
    else:
        r = ctx.scenario.lora.rank
        width = hq + hkv  # the adapted q and v widths
        layer += [
            Term("litgpt LoRAQKVLinear: lora_A output", e * T * 2 * r, f"{e} B x T x 2r, r={r}", 1),
            Term("litgpt LoRAQKVLinear: grouped conv1d output at the q and v widths", e * T * width,
                 f"{e} B x T x (a*d + kv*d)", 1),
            Term("litgpt LoRAQKVLinear: lora_ind index vectors (int64)", 2 * 8 * width, "2 x 8 B x (a*d + kv*d)", 2),
            Term("litgpt LLaMAMLP (frozen): fc_1, fc_2 and SiLU outputs", 3 * e * T * I,
                 f"3 x {e} B x T x I, I={I}", 3),
        ]  # fmt: skip
    out.per_layer[:] = layer
    out.post[:] = _norm(T, h, e, full, "ln_f") + (
        [Term("litgpt ln_f output (lm_head input)", e * T * h, f"{e} B x T x h", 1)] if full else []
    )
    # ln_f's backward in fp32: the incoming gradient's fp32 copy and the products of RMSNorm's backward (12 B x T x h
    # of fp32 transients at its peak, traced) beside the head's input gradient; one more fp32 T x h with a
    # trainable weight (its gradient's product). Traced on the small Llama: full +0.00% (384 B over), LoRA +0.01% at this moment.
    k = 20 if full else 16
    out.top_backward[:] = [
        Term("litgpt final RMSNorm backward (fp32)", k * T * h, f"{k} B x T x h", 4),
        Term(
            "litgpt final RMSNorm backward: fp32 row and weight reductions",
            4 * T + 8 * h,
            "4 B x T + 8 B x h",
            3,
        ),
    ]
    if not V:
        return
    chunk = D.b * LITGPT_HEAD_CHUNK
    out.loss_forward[:] = [Term("litgpt logits (the lm_head chunks)", e * T * V, f"{e} B x T x V, V={V}", 1)]
    out.loss_saved[:] = [
        Term("litgpt chunked_cross_entropy: every chunk's log-softmax", e * T * V, f"{e} B x T x V", 1)
    ]
    out.loss_backward[:] = [
        Term(f"litgpt loss backward, one {LITGPT_HEAD_CHUNK}-token chunk: two gradient buffers",
             2 * e * chunk * V, f"2 x {e} B x b x {LITGPT_HEAD_CHUNK} x V, b={D.b}", 2)
    ]  # fmt: skip


def _amp_head_and_loss(ctx: Context, out: ActivationBudget) -> None:
    """amp-bf16 (``bf16-mixed``): each 128-token chunk runs ``lm_head`` under autocast. Autocast caches the bf16
    cast of a weight only for a leaf that requires grad (torch ``autocast`` cache), so a frozen head (LoRA) is cast
    again for every chunk and each copy is saved by its matmul: chunks x 2 B x V x h, where HF's one call keeps one
    (traced: Llama 3.2 1B dims, s1024, 8 chunks, 4.2 GB). The loss is ``F.cross_entropy`` on each chunk's bf16
    logits as CUDA's autocast runs it (``loss.autocast_ce_saved``): every chunk saves its bf16 log-softmax and
    nll_loss's fp32 copy of it (6 B x T x V over the chunks, all alive until backward); nothing of the loss is
    transient in forward. Backward runs the chunks one at a time, the last first: its start holds one chunk's fp32
    nll_loss gradient (``loss.autocast_ce_backward``); each chunk then frees 6 B and leaves a 2 B gradient per
    logit, so later chunks hold less. The loop holds the bf16 logits throughout. Traced (trace/litgpt.py under
    trace/cuda_autocast.py, Llama 3.2 1B dims s1024): the peak is the last chunk's ``nll_loss_backward``."""
    D = Dims(ctx)
    T, h, V, s = D.T, D.h, D.V, D.s
    if not V:
        return
    chunks = -(-s // LITGPT_HEAD_CHUNK)
    if ctx.scenario.method != "full":
        _amp_lora_layer(ctx, out)
        _replace_post(out, "head: autocast 16-bit weight copy (frozen head)",
                      Term(f"litgpt frozen head: autocast's bf16 weight copy per lm_head chunk ({chunks})",
                           chunks * 2 * V * h, f"ceil(s / {LITGPT_HEAD_CHUNK}) = {chunks} x 2 B x V x h", chunks))  # fmt: skip
    rows = D.b * min(s, LITGPT_HEAD_CHUNK)  # one chunk's tokens (a shorter last chunk runs first: less)
    out.loss_forward[:] = [Term("litgpt logits (the lm_head chunks)", 2 * T * V, f"2 B x T x V, V={V}", 1)]
    out.loss_saved[:] = autocast_ce_saved(T, V, 2, chunks, what="litgpt chunked_cross_entropy: ")
    out.loss_backward[:] = [
        autocast_ce_backward(rows, V, f"b x {min(s, LITGPT_HEAD_CHUNK)}", what="litgpt, one chunk's ")
    ]


def _amp_lora_layer(ctx: Context, out: ActivationBudget) -> None:
    """amp-bf16 LoRA on q and v (traced): one fused lora_A casts norm_1's fp32 output to bf16 once (peft's two
    adapters cast it twice), ``LoRAQKVLinear``'s grouped conv1d output at the q and v widths and its index vectors
    are saved, and SDPA saves k and v ``repeat_interleave``d to n_head; the rest is HF's autocast LoRA rule."""
    D = Dims(ctx)
    T, h, hq, hkv = D.T, D.h, D.hq, D.hkv
    width = hq + hkv
    for i, t in enumerate(out.per_layer):
        if t.name == "attention input: LoRA input copies":
            out.per_layer[i] = Term("litgpt lora_A input: one bf16 copy of norm_1's output", 2 * T * h,
                                    f"2 B x T x h (h={h})", 1)  # fmt: skip
        elif t.name == "attention q, k, v saved by SDPA" and hkv != hq:
            out.per_layer[i] = Term("litgpt attention: q, and k and v repeat_interleave'd to n_head", 3 * 2 * T * hq,
                                    f"3 x 2 B x T x a*d, a*d={hq}", 3)  # fmt: skip
    out.per_layer += [
        Term("litgpt LoRAQKVLinear: grouped conv1d output at the q and v widths", 2 * T * width,
             "2 B x T x (a*d + kv*d)", 1),
        Term("litgpt LoRAQKVLinear: lora_ind index vectors (int64)", 2 * 8 * width, "2 x 8 B x (a*d + kv*d)", 2),
    ]  # fmt: skip


def _replace_post(out: ActivationBudget, name: str, term: Term) -> None:
    """Put ``term`` where the post-layer term called ``name`` was."""
    for i, t in enumerate(out.post):
        if t.name == name:
            out.post[i] = term
            return
