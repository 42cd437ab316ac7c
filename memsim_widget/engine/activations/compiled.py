"""``compile: true``: what a ``torch.compile``d step saves, where a trace of the compiled step backs it.

Dynamo captures the HF model and AOTAutograd splits forward and backward with Inductor's min-cut partitioner
(``min_cut_rematerialization_partition`` at torch's default ``activation_memory_budget``), which saves the
cheapest set of tensors to rebuild the backward from and recomputes the pointwise rest; Inductor fuses the
pointwise ops, so their intermediates never get a buffer. Traced (trace/compiled.py, docs/fidelity.md) on HF
Llama, Mistral and Qwen2 decoders (RMSNorm, SwiGLU, RoPE, SDPA), the partitioner keeps per layer, with e the dtype's bytes:

- the residual stream at the layer's input and after attention (2 r T h) and each RMSNorm's output (the
  normalised tensor times its weight, what q/k/v and gate/up read: 2 e T h) and its fp32 rsqrt (2 x 4 T);
- q after RoPE and the attention output (2 e T h), k after RoPE and v as contiguous copies at the KV width
  (2 e T kv d; the KV cache HF returns is these), SDPA's fp32 logsumexp (4 T a);
- gate_proj's and up_proj's outputs and down_proj's input (3 e T I), the SiLU recomputed in backward;
- after the layers: the last layer's down_proj output and the final norm's output (2 e T h), its rsqrt (4 T);
- under autocast (amp-bf16: the residual stream is fp32, r = 4 instead of e) the 16-bit casts of every Linear weight,
  which the partitioner saves for the backward's matmuls (2 B per weight; the output layer's too);
- the loss: the e-byte logits (e T V), not the fp32 log-softmax eager keeps: the row max and log-sum-exp (2 x 4 T),
  the labels' int64 gather index and valid mask (9 T), recomputing the softmax in backward.

At the top of backward the loss's backward fills one fp32 T x V buffer (zeros and a scatter at the labels, one
fused buffer) and AOTAutograd materialises zero gradients for the outputs the loss does not use: the logits
(e T V) and, with HF's training KV cache, each layer's k and v (2 e T kv d). With these the engine equals the
compiled trace to the byte on the small Llama and Llama 3.2 1B (b4 s1024) and is 3.5% over the H200 run's
``max_memory_allocated``. The layers' backward transients stay eager's and the final norm's backward holds one
hidden-state gradient: not traced moment by moment (the compiled traces peak at the loss's backward, also with a
64-token vocabulary, where the engine is 0.02% over).
"""

from __future__ import annotations

from memsim_widget.architecture import Architecture
from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.dims import Dims
from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import output_lifetime
from memsim_widget.scenario import Scenario


def compiled_rule_applies(sc: Scenario, arch: Architecture) -> bool:
    """The scenario compiles a step the traced rule covers: an HF Llama-layout decoder whose family declares
    ``coverage.compiled`` (llama, mistral, qwen2: q/k/v biases change nothing the partitioner saves; traced),
    bf16 or amp-bf16, full training (or peft's default LoRA on q/v in bf16), no checkpointing, the standard loss, SDPA, HF Trainer's output lifetime, one GPU."""
    return bool(
        sc.compile
        and arch.facts.coverage.compiled
        and arch.norm == "rmsnorm"
        and arch.mlp_activation == "swiglu"
        and arch.position == "rope"
        and not arch.is_moe
        and arch.facts.vision is None
        and arch.facts.calibration is None
        and sc.precision in ("bf16", "amp-bf16")
        and (sc.method == "full" or _lora_qv(sc))
        and sc.activation_checkpointing == "none"
        and sc.loss == "standard"
        and sc.attention == "sdpa"
        and sc.framework == "hf"
        and output_lifetime(sc) == "trainer"
        and sc.objective_name == "sft"
        and sc.parallel.world_size == 1
        and sc.parallel.ep == 1
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
    logsumexp, gate's and up's outputs (down_proj's input is not: its weight is frozen) and the rsqrts; nothing
    after the layers (the final norm and head are frozen). The zero gradients of the returned KV cache exist only
    for what needs a gradient: every v, and k from layer 1 on (layer 0's k reads the frozen embedding through a
    frozen k_proj)."""
    D = Dims(ctx)
    T, h, I, hkv, a, V = D.T, D.h, D.I, D.hkv, D.a, D.V
    e, r, L = ctx.recipe.act_bytes, ctx.scenario.lora.rank, ctx.arch.num_layers
    out.per_layer[:] = [
        Term("compiled LoRA: residual stream in and after attention", 2 * e * T * h, f"2 x {e} B x T x h (h={h})", 2),
        Term("compiled LoRA: attention norm output cast to fp32 for lora_A", 4 * T * h, "4 B x T x h", 1),
        Term("compiled LoRA: lora_A outputs of q and v (fp32)", 2 * 4 * T * r, f"2 x 4 B x T x r, r={r}", 2),
        Term("compiled LoRA: q after RoPE, attention output", 2 * e * T * h, f"2 x {e} B x T x h", 2),
        Term("compiled LoRA: k after RoPE and v (KV width)", 2 * e * T * hkv, f"2 x {e} B x T x kv*d, kv*d={hkv}", 2),
        Term("compiled LoRA: SDPA logsumexp (fp32), RMSNorm rsqrt", 4 * T * a + 8 * T, "4 B x T x heads + 8 B x T", 3),
        Term("compiled LoRA: gate and up outputs", 2 * e * T * I, f"2 x {e} B x T x I, I={I}", 2),
    ]  # fmt: skip
    out.post[:] = []
    tangents = (2 * L - 1) * e * T * hkv if ctx.arch.facts.attention.use_cache else 0
    out.loss_backward[:] = [
        Term("compiled loss backward: one fp32 T x V gradient buffer", 4 * T * V, "4 B x T x V", 1),
        Term("zero gradients AOTAutograd makes for the unused logits output", e * T * V, f"{e} B x T x V", 1),
        *([Term("zero gradients for the returned KV cache (every v, k from layer 1 on)", tangents,
                f"(2 x {L} - 1) x {e} B x T x kv*d", 2 * L - 1)] if tangents else []),
    ]  # fmt: skip


def _layer_weight_numel(ctx: Context) -> int:
    """Elements of one decoder layer's Linear weights (what autocast casts to 16 bits per layer)."""
    return sum(
        g.shape[0] * g.shape[1] // max(ctx.par.tp if g.tp_dim is not None else 1, 1)
        for g in ctx.arch.params
        if g.scope == "layer" and g.module and len(g.shape) == 2 and g.kind != "embedding"
    )


def compiled_activations(ctx: Context, out: ActivationBudget) -> None:
    """Replace the eager HF terms of ``out`` by the compiled step's (see the module docstring)."""
    D = Dims(ctx)
    T, h, I, hkv, a, V = D.T, D.h, D.I, D.hkv, D.a, D.V
    amp = ctx.scenario.precision == "amp-bf16"
    e = 2 if amp else ctx.recipe.act_bytes  # the compute dtype
    r = 4 if amp else e  # the residual stream (fp32 weights' dtype under autocast)
    out.per_layer[:] = [
        Term("compiled: residual stream in and after attention", 2 * r * T * h, f"2 x {r} B x T x h (h={h})", 2),
        Term("compiled: RMSNorm outputs (what q/k/v and gate/up read)", 2 * e * T * h, f"2 x {e} B x T x h", 2),
        Term("compiled: RMSNorm rsqrt (fp32)", 2 * 4 * T, "2 x 4 B x T", 2),
        Term("compiled: q after RoPE, attention output", 2 * e * T * h, f"2 x {e} B x T x h", 2),
        Term("compiled: k after RoPE and v (KV width)", 2 * e * T * hkv, f"2 x {e} B x T x kv*d, kv*d={hkv}", 2),
        Term("compiled: SDPA logsumexp (fp32)", 4 * T * a, f"4 B x T x heads, heads={a}", 1),
        Term("compiled: gate and up outputs, down_proj input", 3 * e * T * I, f"3 x {e} B x T x I, I={I}", 3),
    ]  # fmt: skip
    if (
        amp
    ):  # autocast's 16-bit weight casts become graph values the partitioner saves for the backward's matmuls
        n = _layer_weight_numel(ctx)
        out.per_layer.append(Term("compiled autocast: 16-bit copies of the layer's Linear weights", 2 * n,
                                  f"2 B x {n:,} weights", 7))  # fmt: skip
    out.checkpointed_layer[:] = []
    out.recomputed_layer[:] = []
    out.cache_per_layer[:] = []  # the cache's k and v are the saved copies above
    out.pre[:] = []  # RoPE's cos/sin are recomputed
    out.post[:] = [
        Term("compiled: last down_proj output and final norm output, its rsqrt", 2 * e * T * h + 4 * T,
             f"2 x {e} B x T x h + 4 B x T", 3),
        *([Term("compiled autocast: 16-bit copy of the output layer's weight", 2 * V * h, "2 B x V x h", 1)]
          if amp else []),
    ]  # fmt: skip
    # the final norm's backward runs fused: its output gradient is the one buffer (eager keeps an fp32 chain)
    out.top_backward[:] = [
        Term("compiled: final norm backward: the hidden-state gradient", r * T * h, f"{r} B x T x h", 1)
    ]
    out.loss_forward[:] = []
    out.loss_saved[:] = [
        Term("compiled loss: logits", e * T * V, f"{e} B x T x V, V={V}", 1),
        Term("compiled loss: row max, log-sum-exp (fp32), label index (int64) and mask", 17 * T, "17 B x T", 4),
    ]  # fmt: skip
    _loss_backward(ctx, out, T, V, hkv, e, 4 if amp else e)
    if not ctx.full_training:
        _lora_qv_activations(ctx, out)


def _loss_backward(ctx: Context, out: ActivationBudget, T: int, V: int, hkv: int, e: int, kb: int) -> None:
    """The top of backward: the loss's fp32 buffer and the zero gradients AOTAutograd makes for the unused outputs
    (the logits; the returned KV cache's k, in fp32 after autocast's fp32 RoPE, and v)."""
    L = ctx.arch.num_layers
    cache = (kb + e) * T * hkv * L if ctx.arch.facts.attention.use_cache else 0
    out.loss_backward[:] = [
        Term("compiled loss backward: one fp32 T x V gradient buffer", 4 * T * V, "4 B x T x V", 1),
        Term("zero gradients AOTAutograd makes for the unused logits output", e * T * V, f"{e} B x T x V", 1),
        *(
            [Term("zero gradients for the returned KV cache (k and v of every layer)", cache,
                  f"({kb} + {e}) B x T x kv*d x {L} layers", 2 * L)]
            if cache else []
        ),
    ]  # fmt: skip
