"""``compile: true``: what a ``torch.compile``d step saves, where a trace of the compiled step backs it.

Dynamo captures the HF model and AOTAutograd splits forward and backward with Inductor's min-cut partitioner
(``min_cut_rematerialization_partition`` at torch's default ``activation_memory_budget``), which saves the
cheapest set of tensors to rebuild the backward from and recomputes the pointwise rest; Inductor fuses the
pointwise ops, so their intermediates never get a buffer. Traced (trace/compiled.py, docs/fidelity.md) on HF
Llama, Mistral, Qwen2, Gemma, Gemma 3, Qwen3 and OLMo 2 decoders (RMSNorm, SwiGLU or GeGLU, RoPE, SDPA; what each saves:
``benchmarks/compiled_saved.py``), the partitioner keeps per layer, with e the dtype's bytes:

- the residual stream at the layer's input and after attention (2 r T h) and each RMSNorm's output (the
  normalised tensor times its weight, what q/k/v and gate/up read: 2 e T h) and its fp32 rsqrt (2 x 4 T);
- q after RoPE and the attention output (2 e T a d), k after RoPE and v as contiguous copies at the KV width
  (2 e T kv d; the KV cache HF returns is these), SDPA's fp32 logsumexp (4 T a);
- gate_proj's and up_proj's outputs and down_proj's input (3 e T I), the SiLU (Gemma: the tanh GeLU) recomputed
  in backward;
- with q/k norms (Qwen3 per head, OLMo 2 over the whole projection) each norm's input, q_proj's and k_proj's outputs
  (e T (a d + kv d)), and its fp32 rsqrt per row (4 T (a + kv) per head, 2 x 4 T whole); the normalised q and k are
  recomputed. OLMo 2's norms after attention and MLP save as many T x h tensors as the pre-norms (the layer input,
  o_proj's and down_proj's outputs, the residual after attention); Gemma 3's norms after attention and MLP, besides
  its pre-norms, save their inputs (o_proj's and down_proj's outputs, 2 e T h) and rsqrts;
- after the layers: the last layer's down_proj output and the final norm's output (2 e T h), its rsqrt (4 T);
- under autocast (amp-bf16: the residual stream is fp32, r = 4 instead of e) the 16-bit casts of every Linear weight,
  which the partitioner saves for the backward's matmuls (2 B per weight; the output layer's too); the Llama
  layout's terms in the trace's order (``_amp_terms``: layer 0 saves o_proj's 16-bit output where the others save
  the fp32 residual after attention, the last layer's output is fp32, RoPE's fp32 k lives until the forward ends,
  the final norm's backward leaves the head's 16-bit input gradient and a row sum: traced on the small Llama and
  on Qwen3, whose h = 256 is not 2 kv*d = 1024);
- the loss: the e-byte logits (e T V), not the fp32 log-softmax eager keeps: the row max and log-sum-exp (2 x 4 T),
  the labels' int64 gather index and valid mask (9 T), recomputing the softmax in backward.

With HF's full checkpointing (traced in bf16 full training) each layer keeps its input, the residual stream
(e T h), and the backward recomputes one layer's set above; HF turns the KV cache off.

At the top of backward the loss's backward fills one fp32 T x V buffer (zeros and a scatter at the labels, one
fused buffer) and AOTAutograd materialises zero gradients for the outputs the loss does not use: the logits
(e T V) and, with HF's training KV cache, each layer's k and v (2 e T kv d). With these the engine equals the
compiled trace to the byte on the small Llama and Llama 3.2 1B (b4 s1024) and is 3.5% over the H200 run's
``max_memory_allocated``. The layers' backward transients stay eager's (but under autocast in the Llama layout:
``compiled_kept``, read from the stream's steps) and the final norm's backward holds one hidden-state gradient: not
traced moment by moment (the compiled traces peak at the loss's backward, also with a
64-token vocabulary, where the engine is 0.02% over).
"""

from __future__ import annotations

from dataclasses import replace

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.compiled_layernorm import layernorm_activations, layernorm_rule_applies
from memsim_widget.engine.activations.compiled_modernbert import (
    modernbert_activations,
    modernbert_rule_applies,
)
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.activations.tangents import CACHE_TANGENTS, LOGITS_TANGENT, LOSS_GRADIENT
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import output_lifetime
from memsim_widget.scenario import Scenario

#: The families whose compiled step a trace backs declare ``coverage.compiled`` (architecture/facts.py): the HF
#: Llama-layout decoders (llama, mistral, qwen2: Qwen2's q/k/v biases change nothing the partitioner saves), Gemma
#: (its GeGLU saves what SwiGLU does, the tanh-GeLU recomputed), Qwen3's per-head and OLMo 2's whole-projection q/k
#: norms (their inputs and rsqrts), OLMo 2's post-norms (as many T x h tensors as pre-norms), Gemma 3: traced,
#: benchmarks/compiled_saved.py. Where a family's rule is narrower than the layout's (traced against it,
#: docs/fidelity.md) it declares ``coverage.compiled_recipes``: Gemma's autocast step saves 0.5% more than the rule
#: (its fp32 scaled embedding), OLMo 2's autocast and LoRA steps differ by +5.0% and -1.1%; those get the untraced
#: formula.


def compiled_rule_applies(sc: Scenario, arch: Architecture) -> bool:
    """The scenario compiles a step the traced rule covers: an HF Llama-layout decoder (``coverage.compiled``),
    bf16 or amp-bf16, full training (or peft's default LoRA on q/v in bf16), no checkpointing, the standard loss, SDPA,
    HF Trainer's output lifetime, one GPU (or its data-parallel replicas: ``_one_replica``); or GPT-2, BERT/RoBERTa
    or ViT as traced (compiled_layernorm.py), or ModernBERT as traced (compiled_modernbert.py)."""
    if layernorm_rule_applies(sc, arch) or modernbert_rule_applies(sc, arch):
        return True
    return bool(
        sc.compile
        and arch.facts.coverage.compiled
        and arch.norm == "rmsnorm"
        and arch.mlp_activation in ("swiglu", "geglu")
        and arch.position == "rope"
        and not arch.is_moe
        and arch.facts.vision is None
        and arch.facts.calibration is None
        and sc.precision in ("bf16", "amp-bf16")
        and (sc.method == "full" or _lora_qv(sc))
        and _recipe_traced(sc, arch)
        and not arch.facts.output.final_logit_softcapping
        and not arch.facts.attention.logit_softcapping
        and not _masked_sliding(sc, arch)
        and (sc.activation_checkpointing == "none" or _full_ckpt(sc))
        and sc.loss == "standard"
        and sc.attention == "sdpa"
        and sc.framework == "hf"
        and output_lifetime(sc) == "trainer"
        and sc.objective_name == "sft"
        and _one_replica(sc)
    )


def _one_replica(sc: Scenario) -> bool:
    """One GPU's step, or data-parallel replicas of it (each rank compiles the same step and saves the same
    activations; under DDP Dynamo's DDPOptimizer splits the graph at gradient-bucket boundaries and FSDP gathers
    weights around it: untraced, said in the caveats), or a pipeline stage of it (each rank compiles its own
    stage's submodule: untraced, said in the caveats). Not ``world_size``: the activation terms may not read the
    data-parallel layout (engine/caches/parts_cache.ACTIVATIONS_IGNORE_PARALLEL), nor ``pp``: the planner builds each
    candidate's activation terms at pp = 1 and applies the schedule's micro-batches in flight to them."""
    p = sc.parallel
    return p.tp == p.cp == p.ep == 1


def _masked_sliding(sc: Scenario, arch: Architecture) -> bool:
    """Sliding-window layers whose window is shorter than the sequence (their SDPA takes a mask and repeated k/v:
    not traced compiled)."""
    af = arch.facts.attention  # Qwen2/3 carry a window they do not use (use_sliding_window false)
    return bool(af.sliding_window and af.sliding_window < sc.seq_len and af.sliding_window_used)


def _recipe_traced(sc: Scenario, arch: Architecture) -> bool:
    """The (precision, method) pair is one the family was traced compiled with (``coverage.compiled_recipes``,
    None: every pair the layout's rule takes)."""
    recipes = arch.facts.coverage.compiled_recipes
    return recipes is None or (sc.precision, sc.method) in recipes


def _full_ckpt(sc: Scenario) -> bool:
    """HF's full checkpointing compiled, as traced: every layer, full training in bf16 (Dynamo's checkpoint
    higher-order op; the partitioner saves the layer's input and the backward recomputes the layer)."""
    return (
        sc.activation_checkpointing == "full"
        and (sc.checkpoint_every or 1) == 1
        and sc.method == "full"
        and sc.precision == "bf16"
    )


def _lora_qv(sc: Scenario) -> bool:
    """peft's default LoRA, the one traced compiled: fp32 adapters on q_proj and v_proj of a pure-bf16 model."""
    return (
        sc.method == "lora"
        and set(sc.lora.targets) == {"q_proj", "v_proj"}
        and sc.lora.adapter_dtype == "fp32"
        and sc.precision == "bf16"
    )


def _lora_qv_activations(ctx: Context, out: ActivationBudget) -> None:
    """Compiled LoRA on q and v (traced, docs/fidelity.md): the frozen projections' inputs are not saved; per layer
    the residual stream in and after attention (2 e T h), the attention norm's output cast to fp32 for the two
    adapters' lora_A (4 T h), their fp32 outputs (2 x 4 T r), q after RoPE, k, v and the attention output, the
    logsumexp, gate's and up's outputs (down_proj's input is not: its weight is frozen) and the rsqrts (Qwen3: its
    q/k norms' inputs and rsqrts, but layer 0's k norm's); nothing after the layers (the final norm and head are
    frozen). The zero gradients of the returned KV cache exist only
    for what needs a gradient: every v, and k from layer 1 on (layer 0's k reads the frozen embedding through a
    frozen k_proj). The terms are listed in the order the compiled forward makes them (trace/compiled.py under
    ``inductor_passes``, llama LoRA q,v b2 s512), one term per run of tensors made together, so the allocation
    stream writes them in that order (``compiled_lora_steps``): the residual stream a layer saves is its output
    (the next layer's input; the last layer's, the final norm's), where the trace makes it; layer 0's input, the
    frozen embedding's output, is freed in its forward (no gradient flows to it). Gemma 3's post-norm tensors come
    before the q/k norms' (the stream's places, ``compiled_lora_steps.places``)."""
    D = Dims(ctx)
    T, h, I, hkv, a, V = D.T, D.h, D.I, D.hkv, D.a, D.V
    e, r, L = ctx.recipe.act_bytes, ctx.scenario.lora.rank, ctx.arch.num_layers
    out.per_layer[:] = [
        Term("compiled LoRA: attention norm rsqrt (fp32)", 4 * T, "4 B x T", 1),
        Term("compiled LoRA: attention norm output cast to fp32 for lora_A", 4 * T * h, "4 B x T x h", 1),
        Term("compiled LoRA: lora_A output of q (fp32)", 4 * T * r, f"4 B x T x r, r={r}", 1),
        Term("compiled LoRA: lora_A output of v (fp32)", 4 * T * r, f"4 B x T x r, r={r}", 1),
        Term("compiled LoRA: v (KV width)", e * T * hkv, f"{e} B x T x kv*d, kv*d={hkv}", 1),
        Term("compiled LoRA: q after RoPE", e * T * D.hq, f"{e} B x T x a*d", 1),
        Term("compiled LoRA: k after RoPE (KV width)", e * T * hkv, f"{e} B x T x kv*d", 1),
        Term("compiled LoRA: attention output, SDPA logsumexp (fp32)", e * T * D.hq + 4 * T * a,
             f"{e} B x T x a*d + 4 B x T x heads", 2, shares=_shares(e * T * D.hq, 4 * T * a)),
        Term("compiled LoRA: residual stream after attention", e * T * h, f"{e} B x T x h (h={h})", 1),
        Term("compiled LoRA: MLP norm rsqrt (fp32)", 4 * T, "4 B x T", 1),
        Term("compiled LoRA: gate and up outputs", 2 * e * T * I, f"2 x {e} B x T x I, I={I}", 2),
        Term("compiled LoRA: residual stream the layer outputs (the next layer's or the final norm's input)",
             e * T * h, f"{e} B x T x h", 1),
    ]  # fmt: skip
    # Gemma 3's post-norms before the q/k norms: k's, which layer 0 does not save, are the layer's last tensors,
    # so layer 0's others keep the places of the layers above (``compiled_lora_steps.places``)
    _sandwich_norms(ctx, out, e)
    _qk_norms(ctx, out, e, frozen_first_k=True)
    out.post[:] = []
    tangents = (2 * L - 1) * e * T * hkv if ctx.arch.facts.attention.use_cache else 0
    out.loss_backward[:] = [
        Term(f"compiled loss backward: one fp32 {LOSS_GRADIENT}", 4 * T * V, "4 B x T x V", 1),
        Term(f"zero gradients AOTAutograd makes for the {LOGITS_TANGENT}", e * T * V, f"{e} B x T x V", 1),
        *([Term(f"zero gradients for the {CACHE_TANGENTS} (every v, k from layer 1 on)", tangents,
                f"(2 x {L} - 1) x {e} B x T x kv*d", 2 * L - 1)] if tangents else []),
    ]  # fmt: skip


def _shares(*parts: float) -> tuple[float, ...]:
    """Each tensor's share of a term's bytes (``Term.shares``)."""
    total = sum(parts)
    return tuple(x / total for x in parts)


def _layer_weight_numel(ctx: Context) -> int:
    """Elements of one decoder layer's Linear weights (what autocast casts to 16 bits per layer)."""
    return sum(
        g.shape[0] * g.shape[1] // max(ctx.par.tp if g.tp_dim is not None else 1, 1)
        for g in ctx.arch.params
        if g.scope == "layer" and g.module and len(g.shape) == 2 and g.kind != "embedding"
    )


def compiled_activations(ctx: Context, out: ActivationBudget) -> None:
    """Replace the eager HF terms of ``out`` by the compiled step's (see the module docstring; GPT-2, BERT and ViT:
    compiled_layernorm.py, GPT-2's loss the compiled causal-LM loss)."""
    if layernorm_rule_applies(ctx.scenario, ctx.arch):
        compiled_formula(ctx, out)
        layernorm_activations(ctx, out, _layer_weight_numel(ctx))
        return
    if modernbert_rule_applies(ctx.scenario, ctx.arch):
        modernbert_activations(ctx, out)
        return
    D = Dims(ctx)
    T, h, I, hkv, hq, a, V = D.T, D.h, D.I, D.hkv, D.hq, D.a, D.V
    amp = ctx.scenario.precision == "amp-bf16"
    e = 2 if amp else ctx.recipe.act_bytes  # the compute dtype
    r = 4 if amp else e  # the residual stream (fp32 weights' dtype under autocast)
    out.per_layer[:] = [
        Term("compiled: residual stream in and after attention", 2 * r * T * h, f"2 x {r} B x T x h (h={h})", 2),
        Term("compiled: RMSNorm outputs (what q/k/v and gate/up read)", 2 * e * T * h, f"2 x {e} B x T x h", 2),
        Term("compiled: RMSNorm rsqrt (fp32)", 2 * 4 * T, "2 x 4 B x T", 2),
        Term("compiled: q after RoPE, attention output", 2 * e * T * hq, f"2 x {e} B x T x a*d, a*d={hq}", 2),
        Term("compiled: k after RoPE and v (KV width)", 2 * e * T * hkv, f"2 x {e} B x T x kv*d, kv*d={hkv}", 2),
        Term("compiled: SDPA logsumexp (fp32)", 4 * T * a, f"4 B x T x heads, heads={a}", 1),
        Term("compiled: gate and up outputs, down_proj input", 3 * e * T * I, f"3 x {e} B x T x I, I={I}", 3),
    ]  # fmt: skip
    _qk_norms(ctx, out, e)
    _sandwich_norms(ctx, out, e)
    if olmo2_layout(ctx):
        _olmo2_terms(ctx, out, e)
    if gemma3_layout(ctx):
        _gemma3_terms(ctx, out, e)
    if amp_layout(ctx):  # the terms in the trace's order, its weight casts among them
        _amp_terms(ctx, out)
    elif (
        amp
    ):  # autocast's 16-bit weight casts become graph values the partitioner saves for the backward's matmuls
        n = _layer_weight_numel(ctx)
        out.per_layer.append(Term("compiled autocast: 16-bit copies of the layer's Linear weights", 2 * n,
                                  f"2 B x {n:,} weights", 7))  # fmt: skip
    ckpt = ctx.scenario.activation_checkpointing == "full"
    # checkpointed (traced): each layer keeps its input; the backward recomputes one layer's compiled saved set
    out.checkpointed_layer[:] = (
        [Term("compiled checkpointed layer input (residual stream)", r * T * h, f"{r} B x T x h", 1)]
        if ckpt
        else []
    )
    out.recomputed_layer[:] = list(out.per_layer) if ckpt else []
    # the cache's k and v are the saved copies above; under autocast the cache's k is RoPE's fp32 output, held
    # until the forward ends (the layer saves its 16-bit copy)
    out.cache_per_layer[:] = (
        [Term("compiled autocast: the KV cache's fp32 k (forward only)", 4 * T * hkv, "4 B x T x kv*d", 1)]
        if amp_layout(ctx)
        else []
    )
    out.pre[:] = []  # RoPE's cos/sin are recomputed
    out.post[:] = [
        Term("compiled: last down_proj output and final norm output, its rsqrt", 2 * e * T * h + 4 * T,
             f"2 x {e} B x T x h + 4 B x T", 3),
        *([Term("compiled autocast: 16-bit copy of the output layer's weight", 2 * V * h, "2 B x V x h", 1)]
          if amp else []),
    ]  # fmt: skip
    if gemma3_layout(
        ctx
    ):  # the last layer's output, the final norm's output and its rsqrt cut by their sizes
        # (the Llama layout's stream keeps equal thirds: cut by size, the 64-token Llama's is one small segment
        # under its trace, not found; Gemma 3's is one over with thirds)
        out.post[0] = replace(out.post[0], shares=_shares(e * h, e * h, 4))
    # the final norm's backward runs fused: its output gradient is the one buffer (eager keeps an fp32 chain)
    out.top_backward[:] = [
        Term("compiled: final norm backward: the hidden-state gradient", r * T * h, f"{r} B x T x h", 1)
    ]
    if amp_layout(
        ctx
    ):  # the last layer's output is the fp32 residual; the final norm's backward writes a row sum
        # in the trace's order: the last layer's output, the norm's rsqrt, the head's weight copy, the norm's output
        out.post[:] = [
            Term("compiled autocast: last layer's output (fp32)", r * T * h, f"{r} B x T x h", 1),
            Term("compiled autocast: the final norm's rsqrt", 4 * T, "4 B x T", 1),
            out.post[1],
            Term("compiled autocast: the final norm's output", e * T * h, f"{e} B x T x h", 1),
        ]  # fmt: skip
        out.top_backward[:] = [
            Term("compiled autocast: the head's input gradient (16-bit), the final norm's row sum (fp32)",
                 e * T * h + 4 * T, f"{e} B x T x h + 4 B x T", 2, shares=_shares(e * h, 4))
        ]  # fmt: skip
    out.loss_forward[:] = []
    out.loss_saved[:] = [
        Term("compiled loss: logits", e * T * V, f"{e} B x T x V, V={V}", 1),
        Term("compiled loss: row max, log-sum-exp (fp32), label index (int64) and mask", 17 * T, "17 B x T", 4),
    ]  # fmt: skip
    _loss_backward(ctx, out, T, V, hkv, e, 4 if amp else e)
    if not ctx.full_training:
        _lora_qv_activations(ctx, out)


def amp_layout(ctx: Context) -> bool:
    """A compiled Llama-layout layer under autocast (amp-bf16; two RMSNorms a layer, per-head q/k norms or none),
    full training, no checkpointing: its terms are listed in the trace's order (``_amp_terms``; the allocation
    stream's steps, ``compiled_amp_steps``)."""
    sc, a = ctx.scenario, ctx.arch
    nf = a.facts.norm
    return bool(
        sc.compile
        and sc.precision == "amp-bf16"
        and sc.method == "full"
        and sc.activation_checkpointing == "none"
        and a.norm == "rmsnorm"
        and not layernorm_rule_applies(sc, a)
        and (nf.per_layer, nf.post_norms) == (2, False)
        and nf.qk in (None, "head")
    )


def _amp_terms(ctx: Context, out: ActivationBudget) -> None:
    """A compiled autocast layer's terms (traced: trace/compiled.py under ``inductor_passes``, ``llama amp-bf16
    sdpa b2 s512``, ``qwen3 amp-bf16 sdpa b2 s512``), one term per run of tensors the compiled forward makes
    together, in its order: the fp32 residual stream at the layer's input; the input norm's rsqrt; q_proj's 16-bit
    weight copy and the norm's 16-bit output; (Qwen3: q_proj's output, q's norm input, and its rsqrt per head)
    k_proj's weight copy; (Qwen3: k_proj's output and its rsqrt) v_proj's weight copy and v; k and q after RoPE
    in 16 bits; the attention output, the logsumexp and o_proj's weight copy; the fp32 residual after attention
    (layer 0 saves o_proj's 16-bit output instead: the residual sum is recomputed from the embedding's output,
    which it saves anyway); the MLP norm's rsqrt; gate_proj's weight copy, the MLP norm's output, gate's output,
    up_proj's weight copy, up's output, their product, down_proj's weight copy. RoPE's fp32 k (the KV cache's k)
    lives until the forward ends (``cache_per_layer``)."""
    D = Dims(ctx)
    T, h, I, hq, hkv, a, kv = D.T, D.h, D.I, D.hq, D.hkv, D.a, D.kv
    e, r = 2, 4
    head = ctx.arch.facts.norm.qk == "head"
    rsqrt = Term("compiled: a norm's rsqrt (fp32)", 4 * T, "4 B x T", 1)
    qn = [Term("compiled autocast: q_proj's output (q's norm input)", e * T * hq, f"{e} B x T x a*d", 1),
          Term("compiled autocast: q's norm rsqrt per head (fp32)", 4 * T * a, "4 B x T x heads", 1),
          ] if head else []  # fmt: skip
    kn = [Term("compiled autocast: k_proj's output (k's norm input)", e * T * hkv, f"{e} B x T x kv*d", 1),
          Term("compiled autocast: k's norm rsqrt per head (fp32)", 4 * T * kv, "4 B x T x kv heads", 1),
          ] if head else []  # fmt: skip
    out.per_layer[:] = [
        Term("compiled autocast: residual stream at the layer's input (fp32)", r * T * h, f"{r} B x T x h", 1),
        rsqrt,
        Term("compiled autocast: q_proj's 16-bit weight, the input norm's output", e * h * hq + e * T * h,
             f"{e} B x h x a*d + {e} B x T x h", 2, shares=_shares(h * hq, T * h)),
        *qn,
        Term("compiled autocast: k_proj's 16-bit weight", e * h * hkv, f"{e} B x h x kv*d", 1),
        *kn,
        Term("compiled autocast: v_proj's 16-bit weight, v", e * h * hkv + e * T * hkv,
             f"{e} B x h x kv*d + {e} B x T x kv*d", 2, shares=_shares(h * hkv, T * hkv)),
        Term("compiled autocast: k and q after RoPE", e * T * (hkv + hq), f"{e} B x T x (kv*d + a*d)", 2,
             shares=_shares(hkv, hq)),
        Term("compiled autocast: attention output, SDPA logsumexp (fp32), o_proj's 16-bit weight",
             e * T * hq + 4 * T * a + e * hq * h, f"{e} B x T x a*d + 4 B x T x heads + {e} B x a*d x h", 3,
             shares=_shares(e * T * hq, 4 * T * a, e * hq * h)),
        Term("compiled autocast: residual after attention (fp32; layer 0: o_proj's 16-bit output)", r * T * h,
             f"{r} B x T x h (layer 0: {e} B x T x h)", 1, skip_first=True, first_bytes=(r - e) * T * h),
        rsqrt,
        Term("compiled autocast: gate_proj's weight, the MLP norm's output, gate's output, up_proj's weight, up's "
             "output, their product, down_proj's weight", 3 * e * h * I + e * T * h + 3 * e * T * I,
             f"3 x {e} B x h x I + {e} B x T x h + 3 x {e} B x T x I", 7,
             shares=_shares(h * I, T * h, T * I, h * I, T * I, T * I, h * I)),
    ]  # fmt: skip


def olmo2_layout(ctx: Context) -> bool:
    """A compiled OLMo 2 layer (post-norms, q/k norms over the whole projection) in bf16 full training, no
    checkpointing: its terms are listed in the trace's order (``_olmo2_terms``; the allocation stream's steps,
    ``compiled_olmo2_steps``)."""
    sc, nf = ctx.scenario, ctx.arch.facts.norm
    return bool(
        nf.post_norms
        and nf.qk == "full"
        and nf.per_layer == 2
        and sc.precision == "bf16"
        and sc.method == "full"
        and sc.activation_checkpointing == "none"
    )


def _olmo2_terms(ctx: Context, out: ActivationBudget, e: int) -> None:
    """OLMo 2's compiled layer terms (the same tensors as the Llama layout's with its q/k norms, traced), one term
    per run of tensors the compiled forward makes together, in its order (trace/compiled.py under
    ``inductor_passes``): the layer's input, q_proj's output and its norm's rsqrt, k_proj's and its rsqrt, v, q and
    k after RoPE, the attention output and logsumexp, o_proj's output (the norm after attention reads it) and its
    rsqrt, the residual after attention, gate's and up's outputs and their product, down_proj's output (the norm
    after the MLP reads it) and its rsqrt."""
    D = Dims(ctx)
    T, h, I, hq, hkv, a = D.T, D.h, D.I, D.hq, D.hkv, D.a
    rsqrt = Term("compiled: a norm's rsqrt (fp32)", 4 * T, "4 B x T", 1)
    out.per_layer[:] = [
        Term("compiled: residual stream at the layer's input, q_proj's output (q's norm input)", e * T * (h + hq),
             f"{e} B x T x (h + a*d)", 2, shares=_shares(h, hq)),
        rsqrt,
        Term("compiled: k_proj's output (k's norm input)", e * T * hkv, f"{e} B x T x kv*d", 1),
        rsqrt,
        Term("compiled: v, q and k after RoPE, the attention output and logsumexp, o_proj's output",
             e * T * (2 * hkv + 2 * hq + h) + 4 * T * a, f"{e} B x T x (2 kv*d + 2 a*d + h) + 4 B x T x heads", 6,
             shares=_shares(e * hkv, e * hq, e * hkv, e * hq, 4 * a, e * h)),
        rsqrt,
        Term("compiled: residual after attention, gate's and up's outputs and their product, down_proj's output",
             e * T * (2 * h + 3 * I), f"{e} B x T x (2 h + 3 I)", 5, shares=_shares(h, I, I, I, h)),
        rsqrt,
    ]  # fmt: skip


def gemma3_layout(ctx: Context) -> bool:
    """A compiled Gemma 3 layer (four norms: before and after attention and the MLP; q/k norms per head) in bf16
    full training, no checkpointing: its terms are listed in the trace's order (``_gemma3_terms``; the allocation
    stream's steps, ``compiled_gemma3_steps``)."""
    sc, nf = ctx.scenario, ctx.arch.facts.norm
    return bool(
        nf.per_layer == 4
        and not nf.post_norms
        and nf.qk == "head"
        and sc.precision == "bf16"
        and sc.method == "full"
        and sc.activation_checkpointing == "none"
    )


def _gemma3_terms(ctx: Context, out: ActivationBudget, e: int) -> None:
    """Gemma 3's compiled layer terms (the same tensors as the Llama layout's with its q/k and sandwich norms,
    traced), one term per run of tensors the compiled forward makes together, in its order (trace/compiled.py
    under ``inductor_passes``): the layer's input; its norm's rsqrt; that norm's output, q_proj's, k_proj's and
    v_proj's outputs; q's and k's norm rsqrts (per head); q and k after RoPE, the attention output and logsumexp,
    o_proj's output; its norm's rsqrt; the residual after attention; its norm's rsqrt; that norm's output, gate's
    and up's outputs and their product, down_proj's output; its norm's rsqrt."""
    D = Dims(ctx)
    T, h, I, hq, hkv, a, kv = D.T, D.h, D.I, D.hq, D.hkv, D.a, D.kv
    rsqrt = Term("compiled: a norm's rsqrt (fp32)", 4 * T, "4 B x T", 1)
    out.per_layer[:] = [
        Term("compiled: residual stream at the layer's input", e * T * h, f"{e} B x T x h", 1),
        rsqrt,
        Term("compiled: the input norm's output, q_proj's, k_proj's and v_proj's outputs",
             e * T * (h + hq + 2 * hkv), f"{e} B x T x (h + a*d + 2 kv*d)", 4, shares=_shares(h, hq, hkv, hkv)),
        Term("compiled: q's norm rsqrt per head (fp32)", 4 * T * a, "4 B x T x heads", 1),
        Term("compiled: k's norm rsqrt per head (fp32)", 4 * T * kv, "4 B x T x kv heads", 1),
        Term("compiled: q and k after RoPE, the attention output and logsumexp, o_proj's output",
             e * T * (2 * hq + hkv + h) + 4 * T * a, f"{e} B x T x (2 a*d + kv*d + h) + 4 B x T x heads", 5,
             shares=_shares(e * hq, e * hkv, e * hq, 4 * a, e * h)),
        rsqrt,
        Term("compiled: residual after attention", e * T * h, f"{e} B x T x h", 1),
        rsqrt,
        Term("compiled: the MLP norm's output, gate's and up's outputs and their product, down_proj's output",
             e * T * (2 * h + 3 * I), f"{e} B x T x (2 h + 3 I)", 5, shares=_shares(h, I, I, I, h)),
        rsqrt,
    ]  # fmt: skip


def _qk_norms(ctx: Context, out: ActivationBudget, e: int, frozen_first_k: bool = False) -> None:
    """Qwen3's per-head and OLMo 2's whole-projection q/k RMSNorms under compile (traced): the partitioner saves
    each norm's input (q_proj's and k_proj's outputs, e bytes) and its fp32 rsqrt per row (per head or per
    token), and recomputes the normalised tensor. ``frozen_first_k`` (LoRA on q and v): layer 0's k norm needs no
    gradient (it reads the frozen embedding through a frozen k_proj) and saves nothing."""
    qk = ctx.arch.facts.norm.qk
    if qk not in ("head", "full"):
        return
    rows_q, rows_k = (Dims(ctx).a, Dims(ctx).kv) if qk == "head" else (1, 1)
    parts = qk_norm_tensors(ctx, e)
    k_bytes = parts[2] + parts[3]
    total = sum(parts)
    out.per_layer.append(
        Term("compiled: q/k norm inputs (q_proj and k_proj outputs) and their rsqrt (fp32)", total,
             f"{e} B x T x (a*d + kv*d) + 4 B x T x {rows_q + rows_k}", 4,
             skip_first=frozen_first_k, first_bytes=k_bytes if frozen_first_k else 0.0,
             shares=tuple(x / total for x in parts))
    )  # fmt: skip


def qk_norm_tensors(ctx: Context, e: int) -> tuple[int, int, int, int]:
    """The bytes of the four tensors the q/k norms save per layer, in the order the trace makes them: q_proj's
    output (e B x T x a*d), its fp32 rsqrt (one per row: per head, or per token for OLMo 2's whole-projection
    norm), k_proj's output, its rsqrt (``_qk_norms``' term; the compiled LoRA stream's places)."""
    D = Dims(ctx)
    rows_q, rows_k = (D.a, D.kv) if ctx.arch.facts.norm.qk == "head" else (1, 1)
    return e * D.T * D.hq, 4 * D.T * rows_q, e * D.T * D.hkv, 4 * D.T * rows_k


def sandwich_norm_tensors(ctx: Context, e: int) -> tuple[int, int, int, int]:
    """The bytes of the four tensors Gemma 3's norms after attention and the MLP save per layer, in the trace's
    order: o_proj's output (e B x T x h), its norm's fp32 rsqrt (4 B x T), down_proj's output, its rsqrt."""
    T, h = Dims(ctx).T, ctx.arch.hidden_size
    return e * T * h, 4 * T, e * T * h, 4 * T


def _sandwich_norms(ctx: Context, out: ActivationBudget, e: int) -> None:
    """Gemma 3's norms after attention and after the MLP, besides the pre-norms (4 per layer; traced): each saves
    its input, o_proj's and down_proj's outputs (e T h), and its fp32 rsqrt."""
    if ctx.arch.facts.norm.per_layer != 4 or ctx.arch.facts.norm.post_norms:
        return
    parts = sandwich_norm_tensors(ctx, e)
    total = sum(parts)
    shares = tuple(x / total for x in parts)
    out.per_layer.append(
        Term("compiled: post-norm inputs (o_proj's and down_proj's outputs) and their rsqrt (fp32)",
             total, f"2 x {e} B x T x h + 2 x 4 B x T", 4, shares=shares)
    )  # fmt: skip


def _returns_cache(ctx: Context) -> bool:
    """The model returns its KV cache (HF's training default), whose zero gradients AOTAutograd makes; not under
    checkpointing, where HF sets ``use_cache=False``."""
    return ctx.arch.facts.attention.use_cache and ctx.scenario.activation_checkpointing == "none"


def _loss_backward(ctx: Context, out: ActivationBudget, T: int, V: int, hkv: int, e: int, kb: int) -> None:
    """The top of backward: the loss's fp32 buffer and the zero gradients AOTAutograd makes for the unused outputs
    (the logits; the returned KV cache's k, in fp32 after autocast's fp32 RoPE, and v)."""
    L = ctx.arch.num_layers
    # HF turns the KV cache off under checkpointing (use_cache=False)
    cache = (kb + e) * T * hkv * L if _returns_cache(ctx) else 0
    out.loss_backward[:] = [
        Term(f"compiled loss backward: one fp32 {LOSS_GRADIENT}", 4 * T * V, "4 B x T x V", 1),
        Term(f"zero gradients AOTAutograd makes for the {LOGITS_TANGENT}", e * T * V, f"{e} B x T x V", 1),
        *(
            [Term(f"zero gradients for the {CACHE_TANGENTS} (k and v of every layer)", cache,
                  f"({kb} + {e}) B x T x kv*d x {L} layers", 2 * L,
                  shares=_shares(e, kb) if kb != e else ())]  # per layer v's, then k's (fp32 under autocast)
            if cache else []
        ),
    ]  # fmt: skip


def compiled_formula_applies(sc: Scenario, arch: Architecture) -> bool:
    """A compiled step no trace backs (``compiled_rule_applies`` is false): the engine gives the untraced formula
    of :func:`compiled_formula`."""
    return bool(sc.compile) and not compiled_rule_applies(sc, arch)


def compiled_loss_formula_applies(ctx: Context) -> bool:
    """The compiled loss's traced terms carry over: a causal LM's standard loss over its vocabulary, SFT on one
    GPU in HF's loop, no final-logit softcapping (Gemma 2's tanh on the logits is not traced compiled)."""
    sc, arch = ctx.scenario, ctx.arch
    return bool(
        Dims(ctx).V
        and arch.causal
        and not arch.encoder_layers
        and not arch.facts.output.mlm_head
        and not arch.facts.output.final_logit_softcapping
        and arch.facts.vision is None
        and sc.loss == "standard"
        and sc.framework == "hf"
        and sc.objective_name == "sft"
        and output_lifetime(sc) == "trainer"
        and _one_replica(sc)
    )


def compiled_formula(ctx: Context, out: ActivationBudget) -> None:
    """``compile: true`` where no compiled trace backs a rule: untraced, a formula. The layers keep eager's terms
    (in every compiled trace so far the partitioner saved no more than eager: 0-27% less on the decoders, within
    1% on BERT and ViT in bf16; docs/fidelity.md); a causal LM's loss takes the compiled loss traced on the
    Llama-layout decoders, which is the same aten graph after the head in every HF causal LM: the e-byte logits
    and 17 B x T saved, one fp32 T x V buffer and the logits' zero gradient at the top of backward, and the zero
    gradients of the returned KV cache (every layer's k and v, the most a trace showed)."""
    if not compiled_loss_formula_applies(ctx):
        return
    D = Dims(ctx)
    T, V, hkv, L = D.T, D.V, D.hkv, ctx.arch.num_layers
    amp = ctx.scenario.precision == "amp-bf16" or ctx.scenario.precision == "amp-fp16"
    e = 2 if amp else ctx.recipe.act_bytes
    out.loss_forward[:] = []
    out.loss_saved[:] = [
        Term("compiled loss (untraced formula): logits", e * T * V, f"{e} B x T x V, V={V}", 1),
        Term("compiled loss (untraced formula): row max, log-sum-exp, label index and mask", 17 * T, "17 B x T", 4),
    ]  # fmt: skip
    kb = 4 if amp else e
    cache = (kb + e) * T * hkv * L if _returns_cache(ctx) else 0
    out.loss_backward[:] = [
        Term("compiled loss backward (untraced formula): one fp32 T x V gradient buffer", 4 * T * V, "4 B x T x V", 1),
        Term(f"compiled (untraced formula): zero gradients of the {LOGITS_TANGENT}", e * T * V,
             f"{e} B x T x V", 1),
        *([Term(f"compiled (untraced formula): zero gradients of the {CACHE_TANGENTS}", cache,
                f"({kb} + {e}) B x T x kv*d x {L} layers", 2 * L)] if cache else []),
    ]  # fmt: skip
