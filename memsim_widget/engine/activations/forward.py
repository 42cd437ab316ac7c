"""The tensors a decoder layer makes and frees inside its own forward (forward transients): none is saved for
backward, so they never enter the engine's allocated figures (the saved tensors beside them are larger), but
the caching allocator's segments are cut by them, so the allocation stream (``engine/counters/alloc_stream``) replays
them in the order the layer's forward makes and frees them.

Written from the ops of a transformers Llama-style layer (transformers 5.24.0,
``models/llama/modeling_llama.py``: ``LlamaRMSNorm.forward``, ``rotate_half``, ``apply_rotary_pos_emb``,
``LlamaAttention.forward``, ``LlamaMLP.forward``, ``LlamaDecoderLayer.forward``) and of peft's LoRA Linear
(peft 0.21.2, ``tuners/lora/layer.py`` ``Linear.forward``: ``result = base_layer(x)``, then ``result + lora_B(
lora_A(dropout(x))) * scaling`` and ``result.to(torch_result_dtype)``), in 16-bit weights; checked against
fake-tensor traces of llama-3.2-1b and llama-3.1-8b LoRA (benchmarks/allocator_replay.py --compare). Qwen3's
per-head q/k norms in full training (``models/qwen3/modeling_qwen3.py``: ``Qwen3RMSNorm.forward`` lines 59-64,
``Qwen3Attention.forward`` lines 245-250: ``q_norm(q_proj(x).view(...))``, then k's, then ``v_proj``, then
``apply_rotary_pos_emb``), checked op by op against the trace of qwen3-0.6b (b4 x 2048): each norm's fp32
``pow`` and ``x * rsqrt`` come and go, the projection's output goes once normed, the normed q and k once RoPE
has read them. fp32 weights in full training (llama-3.2-1b b2 x 512 traced): the same ops at 4 bytes, but
``x.float()`` and ``.to(input_dtype)`` are no-ops, so each norm saves ``x * rsqrt`` and makes and frees
only ``x.pow(2)``. OLMo 2 in full training (post-norms with fp32 weights, q/k norms over the projection, fp32
RoPE): ``_olmo2_transients``. The final norm (``model.norm``) is the layers' RMSNorm: ``final_norm_transients``.
Other layers (norms or MLPs of other kinds, q/k norms under LoRA, (1 + w) norms, experts, eager attention,
autocast, fp32, checkpointing, QLoRA) get none: the stream keeps only their saved tensors there.
"""

from __future__ import annotations

from typing import Any

from memsim_widget.engine.activations.linears import ATTN_IN, MLP_IN, MLP_OUT

#: A step of a layer's forward: (name, bytes): bytes > 0 allocates ``name``, 0 frees it. ``IN`` is the layer's
#: input (the previous layer's ``OUT``, or the embedding's output), freed when the layer returns; ``OUT`` is
#: its output, alive until the next layer returns; ``SAVED`` (bytes -1) is where the layer's saved tensors
#: are allocated: after the MLP's norm, where gate, act and up make the largest of them (the attention's, a
#: smaller share, come earlier in the real forward; the stream writes the layer's saved items at one place).
#: (``(SAVED, n)``, n > 0: the next n of the layer's saved terms, where a compiled layer makes them one run at a
#: time: engine/activations/compiled_lora_steps.py.) Where they go decides which cached blocks the last layer's
#: saved tensors find: on llama-3.1-8b LoRA the
#: trace puts the last layer's up_proj output and the final norm's input into a cached loss segment, so step
#: 2's loss backward needs a new one (benchmarks/allocator_replay.py --compare llama8b-lora).
Step = tuple[str, int]
IN, OUT, SAVED = "in", "out", "saved"
#: ``SAVED_AT + str(p)``: the layer's saved tensor at place ``p`` (its ``saved`` items' tensors in order,
#: ``alloc_stream.StreamWriter.items``) made here, where the op that saves it runs (``eager_steps``); with bytes
#: > 0, that tensor's own bytes in this layer (a term whose layer 0 differs, ``Term.first_bytes``: not the layers'
#: mean; a place layer 0 does not make is left out of its steps: ``compiled_lora_steps``)
SAVED_AT = "saved at "
#: ``HELD + name``: a buffer the layer's forward makes and the model's output holds until the forward ends (a
#: compiled autocast layer's fp32 k, the returned KV cache's: ``compiled_amp_steps``)
HELD = "held "
#: ``(SAVED_BYTES, n)``: the layer's next saved term made as one tensor of ``n`` bytes (a term whose size differs
#: in layer 0, ``Term.first_bytes``: each layer's own, not the layers' mean)
SAVED_BYTES = "saved bytes"
#: ``(LATER + name, 0)``: the live buffer ``name`` freed once the next saved term is made (the next layer's input,
#: or the final norm's: the fused kernel that writes the residual sum frees down_proj's output after it)
LATER = "later "
#: The Linears a Llama-style TP plan shards by rows (``RowwiseParallel``): their outputs are all-reduced.
_ROWWISE = frozenset({"o_proj", "down_proj"})
_LLAMA_MODULES = frozenset({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})


def applies(ctx: Any) -> bool:
    """Whether ``layer_forward_transients`` describes the layers of ``ctx``: a Llama-style layer in
    transformers, 16-bit weights, full fine-tuning or LoRA, no checkpointing (Qwen3's per-head q/k norms in
    full training), or an OLMo 2 layer in full training (``_olmo2``)."""
    return _llama(ctx) or _olmo2(ctx)


def _common(ctx: Any) -> bool:
    """What both layer kinds ask: transformers, no checkpointing, RMSNorm, SwiGLU, SDPA."""
    return ctx.scenario.activation_checkpointing == "none" and _layout(ctx)


def llama_layout(ctx: Any) -> bool:
    """A Llama-style layer (``_llama``'s) whatever the checkpointing: the layer a tensor-parallel rank's
    stream is held for (``engine/counters/tp_stream.tp_replayable``)."""
    return _layout(ctx) and _llama(ctx, any_checkpointing=True)


def _layout(ctx: Any) -> bool:
    """``_common`` but the checkpointing: transformers, eager, RMSNorm, SwiGLU, SDPA."""
    a, sc = ctx.arch, ctx.scenario
    return (
        # torchtitan's TP rank: its trace builds transformers' layer too (trace/distributed._model_factory),
        # held under tensor parallelism (counters/tp_stream.tp_replayable)
        (sc.framework == "hf" or (sc.framework == "torchtitan" and ctx.par.tp > 1))
        and not sc.compile  # Inductor fuses these ops: no buffer of theirs is allocated
        and a.norm == "rmsnorm"
        and a.mlp_activation == "swiglu"
        and a.facts.norm.per_layer == 2
        and not a.facts.norm.one_plus_weight
        and not a.facts.mlp.parallel_attn_mlp
        and not a.facts.ssm
        and a.num_experts == 0
        and a.attention_kernel(sc.attention) != "eager"
    )


def _llama(ctx: Any, any_checkpointing: bool = False) -> bool:
    """A Llama-style layer (pre-norms, 16-bit norm weights), full or LoRA on its Linears, grouped k/v."""
    a, sc = ctx.arch, ctx.scenario
    nf = a.facts.norm
    targets = {ad.base.module for ad in ctx.adapters}
    return (
        (_layout(ctx) if any_checkpointing else _common(ctx))
        and (sc.method == "full" or (sc.method == "lora" and targets <= _LLAMA_MODULES))
        # 16-bit weights, or fp32 weights in full training without q/k norms (traced on llama-3.2-1b)
        and (
            sc.precision in ("bf16", "fp16")
            or (sc.precision, sc.method, nf.qk) == ("fp32", "full", None)
            or _bf16_under_fsdp2_mixed_precision(ctx)
        )
        and not nf.weight_fp32
        and not nf.post_norms
        and (nf.qk is None or (nf.qk == "head" and sc.method == "full"))  # Qwen3's per-head q/k norms
        and 0 < a.num_kv_heads < a.num_heads  # grouped k/v: SDPA's k and v are copies (traced)
    )


def _bf16_under_fsdp2_mixed_precision(ctx: Any) -> bool:
    """torchtitan's amp-bf16 on a TP rank under FSDP2: ``MixedPrecisionPolicy(param_dtype=bf16)`` gathers bf16
    weights and no autocast runs (``frameworks.uses_autocast``), so the layer's ops are the bf16 layer's (traced,
    tests/engine/test_tp_stream.py). Without FSDP torchtitan computes such a recipe in fp32
    (``frameworks.no_mixed_precision``): not this layout."""
    from memsim_widget.engine.frameworks import fsdp_wraps, profile

    p, sc = ctx.par, ctx.scenario
    return (
        sc.framework == "torchtitan"
        and p.tp > 1
        and sc.precision == "amp-bf16"
        and profile(ctx).fsdp_mixed_precision
        and bool(fsdp_wraps(p.zero, p.dp, p.cp))
    )


def compiled_applies(ctx: Any) -> bool:
    """Whether ``compiled_layer_forward_transients`` describes the layers of ``ctx``: a compiled step of the traced
    Llama-layout rule (``compiled.compiled_rule_applies``) in bf16, full training, no checkpointing, two RMSNorms a
    layer (and per-head q/k norms or none); not the LayerNorm families' rules (GPT-2, BERT, ViT, ModernBERT)."""
    from memsim_widget.engine.activations.compiled import compiled_rule_applies
    from memsim_widget.engine.activations.compiled_layernorm import layernorm_rule_applies

    a, sc = ctx.arch, ctx.scenario
    nf = a.facts.norm
    return (
        compiled_rule_applies(sc, a)
        and not layernorm_rule_applies(sc, a)
        and a.norm == "rmsnorm"
        and sc.precision == "bf16"
        and sc.method == "full"
        and sc.activation_checkpointing == "none"
        and (nf.per_layer, nf.post_norms) == (2, False)
        and nf.qk in (None, "head")
    )


def compiled_layer_forward_transients(ctx: Any) -> tuple[Step, ...]:
    """The buffers a compiled layer's forward makes and frees (Inductor fuses the pointwise ops, so they are the
    outputs of the ops it calls as kernels of their own that no saved tensor is: traced on llama-3.2-1b compiled,
    trace/compiled.py): each RMSNorm's fp32 mean of squares (4 B x T, a reduction's output), q_proj's, k_proj's and
    v_proj's outputs (the fused RoPE and the KV copies read them), and down_proj's output (the fused residual sum
    reads it). With per-head q/k norms (Qwen3, traced on its small case) q_proj's and k_proj's outputs are the
    norms' saved inputs, and each norm's fp32 mean of squares per head (4 B x T x heads) comes and goes instead.
    The layer's saved tensors (the layer input among them) go where ``SAVED`` says, after the projections'
    outputs are freed: the trace's RoPE and KV copies take their blocks. Empty where ``compiled_applies`` is
    false."""
    if not compiled_applies(ctx):
        return ()
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, e = D.T, D.h, ctx.recipe.act_bytes
    proj: tuple[Step, ...] = (
        ("q", e * T * D.hq), ("k", e * T * D.hkv), ("v", e * T * D.hkv), ("q", 0), ("k", 0), ("v", 0),
    )  # fmt: skip
    if ctx.arch.facts.norm.qk == "head":
        proj = (
            ("qn", 4 * T * D.a),
            ("qn", 0),
            ("kn", 4 * T * D.kv),
            ("kn", 0),
            ("v", e * T * D.hkv),
            ("v", 0),
        )
    return (
        ("mean", 4 * T), ("mean", 0),
        *proj,
        ("mean", 4 * T), ("mean", 0),
        (SAVED, -1),
        ("down", e * T * h), ("down", 0),
    )  # fmt: skip


def _olmo2(ctx: Any) -> bool:
    """An OLMo 2 layer (post-norms, fp32 norm weights, q/k norms over the projection) in full training."""
    nf = ctx.arch.facts.norm
    return (
        _common(ctx)
        and ctx.scenario.precision in ("bf16", "fp16")
        and ctx.scenario.method == "full"
        and nf.post_norms
        and nf.weight_fp32
        and nf.qk == "full"
        and not nf.post_norms_16bit
    )


def layer_forward_transients(ctx: Any) -> tuple[Step, ...]:
    """The forward transients of one layer of ``ctx`` in order (``Step``), empty where ``applies`` is false
    (a compiled step: ``compiled_layer_forward_transients``).
    T tokens, width h, q width a*d, k/v width kv*d, MLP width I, 2-byte elements; a LoRA Linear with fp32
    adapters on 16-bit weights adds its base output (2 B x T x out) and three fp32 T x out tensors."""
    if ctx.scenario.compile:
        return compiled_layer_forward_transients(ctx)
    if not applies(ctx):
        return ()
    if _olmo2(ctx):
        return _olmo2_transients(ctx)
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    fp32 = ctx.scenario.precision == "fp32"  # x.float() and .to(input_dtype) are no-ops: x * rsqrt is saved
    T, h, r = D.T, D.h, 4 if fp32 else 2
    full = ctx.full_training
    targets = {ad.base.module for ad in ctx.adapters}
    cast = ctx.adapter_bytes != r  # fp32 adapters: lora_A saves its own fp32 copy of x, not x
    out: list[Step] = []

    def norm(name: str, readers: frozenset[str]) -> None:
        # x.float() is saved (the engine's RMSNorm term); x.pow(2) and x * rsqrt(var) are not; with a frozen
        # weight (LoRA) weight * x.to(bf16) saves nothing, so the cast and, unless a reader saves it, the
        # normed output come and go; the output lives until the sublayer returns (the decoder layer's variable)
        out.extend([("pow", 4 * T * h), ("pow", 0)])
        if fp32:  # weight * x * rsqrt saves x * rsqrt (full training only)
            return
        out.append(("xr", 4 * T * h))
        if not full:
            kept = saved_by(readers)  # a reader saves the normed output itself: not a transient
            out.extend([("cvt", r * T * h), ("", 0) if kept else (name, r * T * h), ("cvt", 0)])
        out.append(("xr", 0))

    def saved_by(readers: frozenset[str]) -> bool:
        return full or (not cast and bool(readers & targets))

    def proj(module: str, width: int, name: str) -> None:
        # peft: the base output, lora_B's fp32 output, * scaling, + the base output (fp32), .to(bf16)
        if (
            module in _ROWWISE and D.tp > 1
        ):  # TP: the partial sums, their all-reduced clone (counters/tp_stream)
            out.extend([(f"{name}_partial", r * T * width), (name, r * T * width), (f"{name}_partial", 0)])
        elif module in targets and cast:
            out.extend([("base", r * T * width), ("B", 4 * T * width), ("scaled", 4 * T * width), ("B", 0)])
            out.extend(
                [("sum", 4 * T * width), ("scaled", 0), ("base", 0), (name, r * T * width), ("sum", 0)]
            )
        else:
            out.append((name, r * T * width))

    def rope(width: int, embed: str) -> None:
        # q * cos, rotate_half(q) = cat(-q2, q1), * sin; their sum, q_embed, is saved by SDPA; k's sum (``embed``)
        # goes once SDPA's copy of it is made (the engine's "q, k, v saved by SDPA")
        out.extend([("m1", r * T * width), ("neg", r * T * width // 2), ("cat", r * T * width), ("neg", 0)])
        out.extend([("m2", r * T * width), ("cat", 0)] + ([(embed, r * T * width)] if embed else []))
        out.extend([("m1", 0), ("m2", 0)])

    def qk_norm(src: str, width: int, name: str) -> None:
        # Qwen3's q_norm / k_norm on the projection's output (full training: the weight trains, so its fp32
        # input and bf16 cast are saved): x.pow(2), x * rsqrt come and go, the normed ``name`` lives until
        # RoPE is done with it; the projection's output ``src`` goes once its fp32 copy is made and normed
        out.extend([("pow", 4 * T * width), ("pow", 0), ("xr", 4 * T * width), (name, r * T * width)])
        out.extend([("xr", 0), (src, 0)])

    qk = ctx.arch.facts.norm.qk == "head"
    norm("n1", ATTN_IN)
    proj("q_proj", D.hq, "q")
    if qk:
        qk_norm("q", D.hq, "qn")
    proj("k_proj", D.hkv, "k")
    if qk:
        qk_norm("k", D.hkv, "kn")
    proj("v_proj", D.hkv, "v")
    rope(D.hq, "")
    rope(D.hkv, "ke")
    out.extend([("qn" if qk else "q", 0), ("kn" if qk else "k", 0), ("ke", 0), ("v", 0)])
    proj("o_proj", h, "o")
    out.extend([("n1", 0), ("res", r * T * h), ("o", 0)])
    norm("n2", MLP_IN)
    out.append((SAVED, -1))
    proj("gate_proj", D.I, "")  # its output and up's are saved (by the activation and the product)
    proj("up_proj", D.I, "")
    # down_proj(act(gate(x)) * up(x)): the product is saved only when down_proj's weight trains
    if not (full or (MLP_OUT & targets)):
        out.append(("prod", r * T * D.I))
    proj("down_proj", h, "down")
    out.extend([("prod", 0), ("n2", 0), (OUT, r * T * h), ("down", 0), ("res", 0), (IN, 0)])
    # frees of what was never allocated (a saved product, a saved norm output) are dropped
    made: set[str] = set()
    steps: list[Step] = []
    for name, size in out:
        if size != 0 and name:
            made.add(name)
            steps.append((name, size))
        elif name in made:
            made.discard(name)
            steps.append((name, size))
        elif name == IN:
            steps.append((name, size))
    return tuple(steps)


def _olmo2_transients(ctx: Any) -> tuple[Step, ...]:
    """An OLMo 2 layer's forward transients (transformers 5.24.0 ``models/olmo2/modeling_olmo2.py``:
    ``Olmo2RMSNorm.forward`` lines 60-65 ``(self.weight * x * rsqrt).to(input_dtype)`` with an fp32 weight,
    ``apply_rotary_pos_emb`` lines 154-177 (bf16 q times fp32 cos: fp32 products and sum, cast back),
    ``Olmo2Attention.forward`` lines 228-229 ``q_norm(q_proj(x))``, ``Olmo2DecoderLayer.forward`` lines
    309-316, post-norms on the attention's and the MLP's outputs), full training, checked op by op against
    the trace of olmo-2-1b (b4 x 1024). Each norm: ``x.pow(2)`` (fp32) comes and goes, ``x * rsqrt`` is saved
    (the weight trains), ``weight * that`` (fp32) lives until its bf16 cast is made; the projection's (or
    sublayer's) output goes once normed. RoPE: q and k's fp32 products and sums, bf16 ``neg`` and ``cat``;
    q's cast is saved by SDPA, k's goes once SDPA's copies are made. The layer's input and the attention's
    residual sum are Linear inputs, so saved (the engine's "attention input" and "MLP input"): the stream
    frees the input when the layer returns, as for Llama, and allocates the sum among the saved items."""
    from memsim_widget.engine.activations.dims import Dims

    D = Dims(ctx)
    T, h, r = D.T, D.h, 2
    out: list[Step] = []

    def norm(src: str, width: int, name: str) -> None:
        out.extend([("pow", 4 * T * width), ("pow", 0), ("wx", 4 * T * width), (name, r * T * width)])
        out.extend([("wx", 0), (src, 0)])

    def rope(width: int, embed: str) -> None:
        out.extend([("m1", 4 * T * width), ("neg", r * T * width // 2), ("cat", r * T * width), ("neg", 0)])
        out.extend([("m2", 4 * T * width), ("cat", 0), (embed, 4 * T * width), ("m1", 0), ("m2", 0)])

    out.append(("q", r * T * D.hq))
    norm("q", D.hq, "qn")
    out.append(("k", r * T * D.hkv))
    norm("k", D.hkv, "kn")
    out.append(("v", r * T * D.hkv))
    rope(D.hq, "qa")
    rope(D.hkv, "ka")
    out.extend([("ke", r * T * D.hkv), ("qa", 0), ("ka", 0), ("qn", 0), ("kn", 0), ("ke", 0), ("v", 0)])
    out.append(("o", r * T * h))
    norm("o", h, "pa")
    out.extend([(SAVED, -1), ("pa", 0), ("down", r * T * h)])
    norm("down", h, "pf")
    out.extend([(OUT, r * T * h), ("pf", 0), (IN, 0)])
    return tuple(out)


def final_norm_transients(ctx: Any) -> tuple[Step, ...]:
    """The final norm's forward (``model.norm``, the layers' RMSNorm: ``LlamaRMSNorm.forward``,
    ``Qwen3RMSNorm.forward`` lines 59-64) where ``applies``, else empty: ``x.pow(2)`` (fp32 T x h) made and
    freed, ``x * rsqrt`` (fp32 T x h) alive until its bf16 output is made, ``SAVED`` where its saved tensors
    (fp32 input, rsqrt, bf16 cast) and the head's input go. The trace makes the fp32 input before ``pow``; the
    blocks are the same size, so best fit hands out the same ones. Without them the last 32 MiB blocks the
    layers' transients leave are taken by the final norm and the loss, and on qwen3-0.6b the autograd
    thread's cuBLAS workspace lands in a cached loss segment for good (benchmarks/allocator_replay.py
    --compare qwen3-06b-bf16)."""
    if not applies(ctx):
        return ()
    from memsim_widget.engine.activations.dims import Dims

    n = 4 * Dims(ctx).T * ctx.arch.hidden_size
    if ctx.scenario.precision == "fp32":  # weight * x * rsqrt saves x * rsqrt
        return (("pow", n), ("pow", 0), (SAVED, -1))
    return (("pow", n), ("pow", 0), ("xr", n), (SAVED, -1), ("xr", 0))
