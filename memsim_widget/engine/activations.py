"""Activations: the tensors each implementation saves for backward, per layer and per micro-batch.

Built from what a fake-tensor trace of a real HF transformers training step keeps alive
(REFERENCE.md section 3), not from the textbook s*b*h*(34 + 5as/h) of Korthikanti et al. 2022
(arXiv 2205.05198), which is 30-40% off on modern models; Megatron-style fused kernels use that
paper's Table 2 instead. Notation: T tokens of the micro-batch on this rank, h hidden, I MLP width,
hkv = kv heads x head dim, a heads, s sequence, e bytes per compute element.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memsim_widget.engine.context import Context
from memsim_widget.engine.frameworks import (
    loss_parallel,
    output_lifetime,
    profile,
    quantises_module,
    uses_autocast,
    vocab_split,
)
from memsim_widget.engine.items import fmt_int
from memsim_widget.errors import ScenarioError

#: Chunks of the fused linear + cross-entropy loss (torchtune / Liger style) when loss="chunked".
LOSS_CHUNKS = 8


@dataclass
class Term:
    """One kind of saved tensor: ``bytes`` per layer per micro-batch, explained by ``formula``."""

    name: str
    bytes: float
    formula: str
    tensors: int = 1
    level: str = "tensor"
    skip_first: bool = False  # absent in layer 0 (e.g. the first norm when embeddings are frozen)
    first_bytes: float = 0.0  # bytes layer 0 does not hold when ``skip_first``


@dataclass
class ActivationBudget:
    """Saved and transient activation memory of one rank, per micro-batch."""

    per_layer: list[Term] = field(default_factory=list)  # saved by each layer (one micro-batch)
    checkpointed_layer: list[Term] = field(default_factory=list)  # kept per layer under checkpointing
    recomputed_layer: list[Term] = field(
        default_factory=list
    )  # what recomputing one layer adds (default per_layer)
    cache_per_layer: list[Term] = field(default_factory=list)  # held by the output's KV cache until the loss
    ckpt_input_shared: bool = False  # the recomputed layer's first norm saves the checkpointed input itself
    pre: list[Term] = field(default_factory=list)  # before the layers (first stage)
    post: list[Term] = field(default_factory=list)  # final norm, loss's saved log-softmax (last stage)
    loss_forward: list[Term] = field(default_factory=list)  # logits and their fp32 copy, alive in the loss
    loss_saved: list[Term] = field(default_factory=list)  # saved by the loss until its backward
    loss_backward: list[Term] = field(default_factory=list)  # transients at the start of backward
    layer_backward: list[Term] = field(default_factory=list)  # transients while one layer runs backward
    top_backward: list[Term] = field(default_factory=list)  # transients of the final norm's backward
    attention_backward: list[Term] = field(default_factory=list)  # transients of the attention's backward
    bottom_backward: list[Term] = field(
        default_factory=list
    )  # transients of the embedding's backward (calibrated)
    inputs: list[Term] = field(default_factory=list)
    # the model output the loop still holds after the loss (output_lifetime "backward" or "step"):
    output_logits: list[Term] = field(default_factory=list)  # its logits (last stage)
    output_cache: list[Term] = field(default_factory=list)  # per layer: the whole KV cache it references
    output_cache_extra: list[Term] = field(
        default_factory=list
    )  # per layer: the part the layer does not save
    output_through_step: bool = False  # held through the optimizer step too ("step")
    pp_buffer: list[Term] = field(default_factory=list)  # one pipeline receive/send buffer (one micro-batch)
    pp_output: list[Term] = field(default_factory=list)  # a non-last stage's output kept for its backward
    pp_logits: list[Term] = field(default_factory=list)  # the last stage's output (logits) kept likewise

    def layer_bytes(self) -> float:
        return sum(t.bytes for t in self.per_layer)

    def loss_buffer_names(self) -> set[str]:
        """Names of the loss's T x V buffers (the allocator's variable-shape waste is a multiple of them)."""
        return {t.name for t in self.loss_forward + self.loss_saved + self.loss_backward + self.output_logits}


class _Dims:
    """Per-rank sizes after tensor, sequence and context parallel division."""

    def __init__(self, ctx: Context) -> None:
        a, par, sc = ctx.arch, ctx.par, ctx.scenario
        self.b = sc.micro_batch_size
        self.s = ctx.seq_len // par.cp  # local sequence under context parallelism
        self.T = self.b * self.s
        self.tp = par.tp
        self.sp = par.sequence_parallel
        self.h = a.hidden_size
        self.a = a.num_heads // par.tp
        self.d = a.head_dim
        self.hq = self.a * self.d  # local query width
        self.kv = max(1, a.num_kv_heads // par.tp)
        self.hkv = self.kv * self.d
        self.I = a.intermediate_size // par.tp
        # the "hf" plan gathers the full logits on every rank; loss parallel keeps V/tp
        self.V = a.vocab_size // par.tp if vocab_split(ctx) else a.vocab_size
        self.s_full = ctx.seq_len  # keys each query attends to (ring attention passes all)
        # outside tensor-parallel regions tensors are replicated unless sequence parallel
        self.Tout = self.T // self.tp if self.sp else self.T


def activations(ctx: Context) -> ActivationBudget:
    """Saved and transient activations of one micro-batch on one rank."""
    if ctx.arch.extra.get("calibration") is not None:  # a transformers type no family models: fitted terms
        from memsim_widget.engine.calibrated import calibrated_activations

        out = calibrated_activations(ctx)
        _stage_io(ctx, out)
        return out
    _refuse_untraced(ctx)
    if ctx.arch.extra.get("hybrid"):  # attention and Mamba layers in one stack (Jamba; engine/hybrid.py)
        from memsim_widget.engine.hybrid import hybrid_activations

        out = hybrid_activations(ctx, _hf)
    else:
        out = _megatron(ctx) if profile(ctx).activation_model == "megatron" else _hf(ctx)
    if ctx.arch.extra.get("vision"):  # a multimodal model's vision tower and projector (engine/vision.py)
        from memsim_widget.engine.vision import vision_activations

        vision_activations(ctx, out, _hf)
    _stage_io(ctx, out)
    return out


def _refuse_untraced(ctx: Context) -> None:
    """Raise ScenarioError for the Falcon and T5 combinations whose saved tensors no trace has checked (never a
    guess)."""
    arch, sc = ctx.arch, ctx.scenario
    if arch.extra.get("ssm"):
        _refuse_ssm(ctx)
    if arch.family == "t5" and sc.activation_checkpointing == "selective-op":
        raise ScenarioError(
            "activation_checkpointing", "selective-op (torchtitan's per-op policy) is not modelled for T5: "
            "torchtitan has no encoder-decoder model and no trace checks it; use none, selective or full",
        )  # fmt: skip
    if arch.family != "falcon":
        return
    amp = uses_autocast(ctx)
    if arch.extra.get("sdpa_math_fallback") and sc.activation_checkpointing == "selective-op":
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


def _refuse_ssm(ctx: Context) -> None:
    """State-space layers (Mamba): only what a trace or mamba-ssm's source backs -- full training in one
    precision (bf16, fp16, fp32), no checkpointing, the HF activation rules, one rank's whole sequence."""
    sc, par = ctx.scenario, ctx.par
    why = "is not modelled for Mamba's state-space layers (no trace checks it)"
    if uses_autocast(ctx):
        raise ScenarioError("precision", f"{sc.precision} {why}; use bf16, fp16 or fp32")
    if sc.method != "full":
        raise ScenarioError("method", f"{sc.method} {why}; use full")
    if sc.activation_checkpointing != "none":
        raise ScenarioError("activation_checkpointing", f"{sc.activation_checkpointing} {why}; use none")
    if profile(ctx).activation_model == "megatron":
        raise ScenarioError("framework", f"{sc.framework} {why}; use hf")
    if par.tp > 1 or par.cp > 1:
        raise ScenarioError("parallel", f"tensor or context parallelism {why}")


def _stage_io(ctx: Context, out: ActivationBudget) -> None:
    """The tensors a pipeline stage exchanges, one micro-batch each (engine/pipeline.py says how many live):
    hidden states in the residual dtype (fp32 under autocast), logits in the compute dtype."""
    D = _Dims(ctx)
    amp = uses_autocast(ctx)
    r = 4 if amp else ctx.recipe.act_bytes
    hidden = r * D.Tout * D.h
    what = f"{r} B x T x h, T={fmt_int(D.Tout)}"
    out.pp_buffer.append(
        Term("pipeline receive/send buffers (hidden states or their gradient)", hidden, what)
    )
    out.pp_output.append(Term("stage outputs kept by the schedule until their backward", hidden, what))
    if D.V:
        le = 2 if amp else ctx.recipe.act_bytes
        out.pp_logits.append(
            Term(
                "logits (the last stage's output) kept by the schedule until their backward",
                le * D.T * D.V,
                f"{le} B x T x V, V={D.V}",
            )  # fmt: skip
        )


#: Leaf Linear names by the tensor they read, across families (peft matches targets by leaf name).
ATTN_IN = frozenset(
    {"q_proj", "k_proj", "v_proj", "c_attn", "qkv_proj", "query", "key", "value", "q", "k", "v"}
    | {"query_key_value"}
    | {"q_a_proj", "kv_a_proj_with_mqa"}  # DeepSeek MLA: the projections reading the layer's normed input
    | {"Wqkv"}  # ModernBERT
)
ATTN_OUT = frozenset({"o_proj", "c_proj", "out_proj", "o", "Wo"})  # + arch.extra["attention_output_modules"]
MLP_IN = frozenset(
    {
        "gate_proj",
        "up_proj",
        "c_fc",
        "gate_up_proj",
        "fc1",
        "wi",
        "wi_0",
        "wi_1",
        "w1",
        "w3",
        "dense_h_to_4h",
        "Wi",
    }
)
MLP_OUT = frozenset({"down_proj", "c_proj", "fc2", "wo", "w2", "dense_4h_to_h", "Wo"})  # ModernBERT: Wo twice


def gelu_tanh_autocast(ec: int, kf: str, I: int) -> tuple[int, str]:
    """Bytes per element and formula of gelu_new's saved chain under CUDA autocast.

    CUDA autocast runs ``pow`` in fp32 (torch.amp docs, CUDA fp32 op list), so ``pow(x, 3)`` saves an fp32
    copy of x and the rest of the chain is promoted: the fp32 tanh output and ``1 + tanh``, beside the
    16-bit ``0.5 x`` -- 12 + e bytes per element where a 16-bit chain keeps 4 x e. Measured on an H200
    (docs/accuracy.md, GPT-2 medium under amp-bf16: 6 B per T x I element per layer more than the 16-bit
    chain); traced with trace/cuda_autocast.py. gelu_fast and gelu_pytorch_tanh have no pow: over-predicted.
    """
    return 12 + ec, f"(3 x 4 B + {ec} B) x {kf}, I={I} (fp32 pow chain under CUDA autocast)"


#: Tensors an activation function keeps for backward, in units of T x I (GPT-2's gelu_new is a chain of
#: pointwise ops: x, 0.5x, tanh(.), 1 + tanh(.); SwiGLU/GeGLU keep gate, up and act(gate)).
ACT_SAVED = {"swiglu": 3, "geglu": 3, "gelu_tanh": 4, "gelu": 1, "relu": 1, "quick_gelu": 2}
#: GPT-OSS experts' clamped SwiGLU ``(clamp(up) + 1) * clamp(gate) * sigmoid(alpha * clamp(gate))`` on the
#: interleaved gate_up output: that output (2 I), sigmoid, clamp(gate), clamp(up) + 1 and the glu (traced)
ACT_SAVED_PART = {"clamped-swiglu": 6}


def _parallel_mlp(arch: object) -> bool:
    """The MLP reads a norm of the layer input, beside attention (Phi; GPT-NeoX's parallel residual)."""
    extra = getattr(arch, "extra", {})
    norms = extra.get("norms_per_layer", 2)
    return bool(extra.get("parallel_attn_mlp") or extra.get("norm_inputs", norms) < norms)


def _hf(ctx: Context) -> ActivationBudget:
    """HF transformers modules trained with the usual loop (torchtune/torchtitan modules save alike).

    Rules (each checked against a fake-tensor trace, see docs/fidelity.md): a Linear saves its input only
    if its weight is trained or it carries a LoRA adapter (the adapter saves its own cast copy when the
    adapter dtype differs); under autocast every trained Linear saves its own 16-bit input copy and a
    16-bit copy of its weight; HF RMSNorm saves its fp32 input, rsqrt and (if its weight is trained) the
    normalised tensor; SDPA saves q, k, v (k, v at kv width), the output and an fp32 logsumexp.
    """
    arch, sc, recipe = ctx.arch, ctx.scenario, ctx.recipe
    prof = profile(ctx)
    D = _Dims(ctx)
    T, Tout, h, I, hq, hkv, b, s = D.T, D.Tout, D.h, D.I, D.hq, D.hkv, D.b, D.s
    amp = uses_autocast(ctx)  # FSDP2 mixed precision (torchtitan) computes in bf16 without autocast
    ec = recipe.act_bytes  # bytes of a compute-dtype element (16-bit under autocast)
    r = 4 if amp else ec  # residual stream dtype: autocast keeps it fp32
    full = ctx.full_training
    ab = ctx.adapter_bytes
    targets = {ad.base.module for ad in ctx.adapters}
    modules = set(ctx.linear_modules)
    out = ActivationBudget()
    L = out.per_layer

    def add(
        name: str,
        nbytes: float,
        formula: str,
        tensors: int = 1,
        level: str = "tensor",
        first_bytes: float = 0.0,
    ) -> None:
        """Append a per-layer term; ``first_bytes`` of it are absent in layer 0."""
        if nbytes > 0:
            L.append(Term(name, nbytes, formula, tensors, level, first_bytes > 0, first_bytes))

    def consumers(
        role: frozenset[str], width: int, rows: int, dtype: int, label: str, already_saved: bool = False
    ) -> None:
        """What the Linears reading one tensor (rows x width, ``dtype`` bytes) keep of it."""
        present = sorted(role & modules)
        if full:
            if amp and dtype == 4:
                n = len(present)
                add(
                    f"{label}: autocast 16-bit input copies",
                    n * 2 * rows * width,
                    f"{n} Linears x 2 B x T x {width}",
                    n,
                )
            elif not already_saved:
                add(f"{label}: Linear input", dtype * rows * width, f"{dtype} B x T x {width}", 1)
            return
        hit = [m for m in present if m in targets]
        if not hit:
            return
        if amp or ab != dtype:
            cb = 2 if amp else ab
            add(
                f"{label}: LoRA input copies",
                len(hit) * cb * rows * width,
                f"{len(hit)} adapters x {cb} B x T x {width}",
                len(hit),
            )
        elif not already_saved:
            add(f"{label}: LoRA input", dtype * rows * width, f"{dtype} B x T x {width}", 1)

    # ----- norms ---------------------------------------------------------------------------------
    norms = arch.extra.get("norms_per_layer", 2)
    # (Megatron-style "selective" recomputes only inside attention: the layer boundary is as without it)
    frozen_first = not full and sc.activation_checkpointing in ("none", "selective") and not ctx.vision_grad
    gemma = arch.family.startswith("gemma")
    # under LoRA nothing before the first adapter needs a gradient: layer 0's first norm saves nothing
    frozen = "; layer 0's first norm saves nothing (frozen embeddings)" if frozen_first else ""
    # CohereLayerNorm computes x - mean twice: two fp32 centred copies saved (traced)
    cw = 8 if arch.extra.get("norm_centred_copy") else 4
    # Gemma's RMSNorm returns normed(x) * (1 + w.float()): the product saves the fp32 (1 + w) whenever its input
    # needs a gradient, and the fp32 normalised tensor only when w trains (traced, Gemma 2 and 3)
    onep = 4 if gemma else 0
    if arch.norm == "rmsnorm":
        per_norm = cw * Tout * h + 4 * Tout + onep * h
        add(
            "RMSNorm fp32 inputs and rsqrt" + (", fp32 (1 + w)" if gemma else ""),
            norms * per_norm,
            f"{norms} norms x ({cw} B x T x h + 4 B x T{' + 4 B x h' if gemma else ''}), T={fmt_int(Tout)}, "
            f"h={h}{frozen}",
            (3 if gemma else 2) * norms,
            # post-norm blocks (OLMo 2): layer 0's first norm reads the attention output, trained under LoRA
            # as soon as attention carries an adapter (traced)
            first_bytes=per_norm
            if frozen_first and not (arch.extra.get("post_norms") and targets & (ATTN_IN | ATTN_OUT))
            else 0,
        )
        # Gemma and OLMo 2 multiply by the weight in fp32: the normalised tensor they save is fp32
        nb = 4 if gemma or arch.extra.get("norm_weight_fp32") else r
        if full:
            # GLM-4's post-norms read 16-bit projection outputs: their normalised tensor is cast back to 16 bits
            n16 = arch.extra.get("post_norms_16bit", 0) if nb == r and not gemma else 0
            add(
                "RMSNorm normalised tensors",
                ((norms - n16) * nb + n16 * ec) * Tout * h,
                f"{norms} norms x {nb} B x T x h" + (f" ({n16} of them {ec} B)" if n16 and ec != nb else ""),
                norms,
            )
    else:
        per_norm = r * Tout * h + 8 * Tout
        parallel_branches = _parallel_mlp(arch)
        # norms reading one tensor save it once (GPT-NeoX's parallel residual: both norms read the layer input)
        shared = norms - arch.extra.get("norm_inputs", norms)
        add(
            "LayerNorm inputs, mean and rstd",
            norms * per_norm - shared * r * Tout * h,
            f"{norms} norms x ({r} B x T x h + 8 B x T){frozen}"
            + (f" - {shared} x {r} B x T x h (one input read by {shared + 1} norms)" if shared else ""),
            3 * norms - shared,
            # parallel branches (NeoX, Phi): under LoRA every norm of layer 0 reads the gradient-free embeddings
            # ModernBERT's layer 0 has no attn_norm (nn.Identity): one norm fewer there in any case. A post-norm
            # block (BERT) norms the attention output first: trained under LoRA once attention has an adapter
            first_bytes=(norms * per_norm - shared * r * Tout * h if parallel_branches else per_norm)
            if frozen_first
            and not (arch.extra.get("first_norm_after_attention") and targets & (ATTN_IN | ATTN_OUT))
            else (per_norm if arch.extra.get("first_layer_norms", norms) < norms else 0),
        )
    # a norm's output has the residual stream's dtype (Gemma's ``.type_as(x)`` too: fp32 under autocast and in
    # fp32, where every Linear reading it then keeps its own 16-bit copy under autocast; traced)
    nout = r
    # under sequence parallel the block's input is all-gathered to the full sequence first (DTensor
    # PrepareModuleInput Shard(1) -> Replicate); the Linears save that gathered tensor (traced)
    ssm_from = len(L)  # state-space layers have neither of the next two Linear inputs
    consumers(ATTN_IN, h, T, nout, "attention input")
    # Phi: one norm's output feeds q, k, v and fc1; saved once when the attention side saved it already
    shared_in = arch.extra.get("parallel_attn_mlp", False) and (full or bool(ATTN_IN & modules & targets))
    # BERT-style encoders name three Linears "dense": the one reading the attention block's norm is named by the family
    mlp_in = MLP_IN | frozenset(arch.extra.get("mlp_input_modules", ()))
    consumers(mlp_in, h, T, nout, "MLP input", already_saved=shared_in)

    # ----- q/k norms (Qwen3 "head": per head over d; OLMo 2 "full": over the whole projection) ----------------
    # HF RMSNorm on the q_proj / k_proj outputs (compute dtype): its fp32 input, the rsqrt per row and, if its
    # weight trains, the normalised tensor in the compute dtype. Nothing when the projection's output needs no
    # gradient (layer 0 under LoRA unless that projection carries an adapter; traced).
    qk_norm = arch.extra.get("qk_norm")
    if qk_norm in ("head", "full"):
        for label, width, n_heads, proj in (("q", hq, D.a, "q_proj"), ("k", hkv, D.kv, "k_proj")):
            rows = n_heads if qk_norm == "head" else 1
            nn = 4 if gemma or arch.extra.get("norm_weight_fp32") else ec
            # Gemma 3: the per-head norm's (1 + w) [d] in fp32 too
            nb = cw * T * width + 4 * T * rows + (nn * T * width if full else 0) + onep * D.d
            add(
                f"{label}_norm fp32 input and rsqrt" + (", normalised tensor" if full else ""),
                nb,
                f"4 B x T x {width} + 4 B x T x {rows}"
                + (f" + {nn} B x T x {width}" if full else "")
                + (f" + 4 B x {D.d}" if onep else ""),
                3 if full else 2,
                first_bytes=nb if frozen_first and proj not in targets else 0,
            )

    # Llama 4's qk_norm: a weightless L2 norm per head on RoPE layers only (``qk_norm_layers`` of them): its
    # fp32 input copy and rsqrt per row (traced); averaged over the layers like the MoE parts
    if qk_norm == "l2":
        n_l2 = arch.extra.get("qk_norm_layers", arch.num_layers)
        frac = n_l2 / max(arch.num_layers, 1)
        sizes = {"q_proj": 4 * T * hq + 4 * T * D.a, "k_proj": 4 * T * hkv + 4 * T * D.kv}
        # layer 0 (a RoPE layer) keeps nothing for a projection whose output needs no gradient (LoRA; traced)
        free0 = frozen_first and arch.extra.get("rope_layer0", True)
        add(
            "q/k L2 norm fp32 inputs and rsqrt",
            frac * sum(sizes.values()),
            f"{n_l2}/{arch.num_layers} layers x (4 B x T x (a*d + kv*d) + 4 B x T x (a + kv))",
            4,
            first_bytes=sum(nb for proj, nb in sizes.items() if proj not in targets) if free0 else 0,
        )

    # Phi's qk_layernorm: LayerNorm (with bias) per head on the q and k views; it saves its input and, per
    # row, mean and rstd (its output feeds RoPE's multiplies, which save cos/sin only)
    if arch.extra.get("qk_layernorm") and arch.norm == "layernorm":
        nb = ec * T * (hq + hkv) + 8 * T * (D.a + D.kv)
        add(
            "q/k LayerNorm inputs, mean and rstd",
            nb,
            f"{ec} B x T x (a*d + kv*d) + 8 B x T x (a + kv)",
            6,
            first_bytes=nb if frozen_first and not (targets & {"q_proj", "k_proj"}) else 0,
        )

    # ----- attention -----------------------------------------------------------------------------
    ssm = arch.extra.get("ssm")
    eager = arch.attention_kernel(sc.attention) == "eager" and not ssm
    masked_frac = (
        0.0  # layers whose SDPA gets an explicit mask (k, v repeated; Gemma 3 sliding or image tokens)
    )
    ao_from = ao_to = 0  # the eager attention-output term(s) in L (freed before the attention's backward)
    # "(eager: ...)" on the attention terms when the model class has no SDPA path (Gemma 2) and SDPA was asked for
    why = f" (eager: {arch.extra['attention_note']})" if eager and sc.attention != "eager" else ""
    a_loc = D.a
    attn_out = ATTN_OUT | frozenset(arch.extra.get("attention_output_modules", ()))
    fused_no_rope = "c_attn" in modules and arch.position != "rope"
    # llama-family eager attention runs softmax in fp32 and casts back; GPT-2, BERT, RoBERTa and ViT stay in the
    # compute dtype (the fp32 softmax is then the saved tensor itself) -- except under CUDA autocast, whose
    # op list runs softmax in fp32 for every model (torch.amp docs, "CUDA Ops that can autocast to
    # float32"; CPU autocast, which the tracer uses, keeps it in the input dtype)
    # eager softmax in the compute dtype: GPT-2, BERT, ViT (``softmax_in_compute_dtype``), Llama 4 and GPT-OSS
    # (``eager_softmax_dtype``); CUDA autocast runs it in fp32 for every model
    softmax_fp32 = (
        not arch.extra.get("softmax_in_compute_dtype")
        and not arch.extra.get("softmax_compute_dtype")  # Falcon
        and arch.extra.get("eager_softmax_dtype") != "compute"
    ) or amp
    # GPT-OSS appends one sink logit per head: the softmax covers s + 1 columns (the sink column is dropped
    # after it, a view: the probabilities stay whole), and max-subtraction keeps its int64 argmax per row
    sinks = bool(arch.extra.get("attention_sinks"))
    mla = arch.extra.get("mla")  # DeepSeek multi-head latent attention (families/deepseek.py)
    if mla:
        _mla(ctx, D, mla, add, consumers, attn_out, eager, amp, ec)
    elif not eager and arch.extra.get("sdpa_math_fallback"):
        # Falcon multi-query: k and v keep one head while q has a, which SDPA's fused kernels refuse (CUDA and
        # CPU alike); the math fallback upcasts to fp32 and its matmuls save q, k and v expanded to all heads,
        # and the fp32 probabilities; its 16-bit output (b, a, s, d) is copied to (b, s, a*d) for the
        # out-projection (traced)
        # its matmuls broadcast k and v over the heads: with b = 1 the (1, a) batch folds into a stride-0 view,
        # with b > 1 reshaping the expanded tensor copies it (traced: Falcon-7B b1 s2048 and small b2 shapes)
        kvw = hq if b > 1 else hkv
        add("attention q, k, v (fp32; k and v expanded to all heads when b > 1) saved by SDPA's math fallback",
            4 * T * (hq + 2 * kvw), f"4 B x T x (a*d + 2 x {kvw})", 3)  # fmt: skip
        if sc.activation_checkpointing != "selective":
            scores = b * a_loc * s * D.s_full
            add("attention probabilities (fp32, math SDPA)", 4 * scores,
                f"4 B x b x a x s x s, b={b} a={a_loc} s={s}", 1)  # fmt: skip
        consumers(attn_out, hq, T, ec, "attention output (b, s, a*d) copy")
    elif eager:
        # Falcon multi-query broadcasts its one k/v head in the matmuls: a stride-0 view when b = 1 (traced)
        ekv = hkv if arch.extra.get("sdpa_math_fallback") and b == 1 else hq
        add(
            "attention q, k, v (k, v repeated to all heads)" + why,
            ec * T * (hq + 2 * ekv),
            f"{ec} B x T x (a*d + 2 x {ekv})",
            3,
        )
        if sc.activation_checkpointing != "selective":
            scores = b * a_loc * s * (D.s_full + sinks)
            if arch.extra.get("attn_logit_softcapping"):
                # Gemma 2: scores / cap -> tanh -> x cap; tanh saves its output for backward (the divisions
                # and products by a Python scalar save nothing)
                add(
                    "attention logit softcapping: tanh output",
                    ec * scores,
                    f"{ec} B x b x a x s x s, b={b} a={a_loc} s={s}",
                    1,
                )
            sm = 4 if softmax_fp32 else ec
            if sinks:
                add(
                    "attention sinks: max indices",
                    8 * b * a_loc * s,
                    f"8 B x b x a x s, b={b} a={a_loc} s={s}",
                )
            if arch.attention_dropout > 0:
                add(
                    "attention softmax, dropout mask and output",
                    scores * (sm + 1 + ec),
                    f"b x a x s x s x ({sm} + 1 + {ec}) B, b={b} a={a_loc} s={s}",
                    3,
                )
            else:
                extra = ec if sm != ec else 0
                add(
                    "attention softmax"
                    + (" (fp32) and its 16-bit cast" if extra else "")
                    + (" (+ sink column)" if sinks else ""),
                    scores * (sm + extra),
                    f"b x a x s x {'(s + 1)' if sinks else 's'} x ({sm} + {extra}) B, b={b} a={a_loc} s={s}",
                    2 if extra else 1,
                )
        ao_from = len(L)
        consumers(attn_out, hq, T, ec, "attention output")
        ao_to = len(L)
    else:
        add(
            "attention q, k, v saved by SDPA",
            ec * T * (hq + 2 * hkv),
            f"{ec} B x T x (a*d + 2 x kv*d) = {ec} x {fmt_int(T)} x ({hq} + 2 x {hkv})",
            3,
        )
        # Llama 4's chunked layers past attention_chunk_size: HF passes SDPA an explicit mask, so k and v are
        # repeated to every head (no GQA in SDPA with a mask) and SDPA keeps the mask converted to the compute
        # dtype (b x s x s), per chunked layer (traced with a small chunk)
        chunk = arch.extra.get("attention_chunk_size")
        if chunk and D.s_full > chunk and arch.extra.get("chunked_layers"):
            frac = arch.extra["chunked_layers"] / max(arch.num_layers, 1)
            add(
                "chunked attention: SDPA's mask and k, v repeated to all heads",
                frac * (ec * b * s * D.s_full + 2 * ec * T * (hq - hkv)),
                f"{arch.extra['chunked_layers']}/{arch.num_layers} layers x ({ec} B x b x s x s"
                f" + 2 x {ec} B x T x (a*d - kv*d)), s > chunk {chunk}",
                3,
            )
        if arch.extra.get("sdpa_fused_qkv_view"):
            # Falcon's classic multi-head ALiBi layer: q, k, v are views of query_key_value's output, which SDPA
            # keeps whole beside the copies of q and k the CPU kernel saves (traced)
            add("fused query_key_value output kept alive by the v view", ec * T * 2 * hkv,
                f"{ec} B x T x 2 x kv*d (the q and k thirds)", 1)  # fmt: skip
        if fused_no_rope:
            add(
                "fused qkv output kept alive by the q view",
                ec * T * 2 * hkv,
                f"{ec} B x T x 2 x kv*d (k, v copied into the cache)",
                1,
            )
        add(
            "attention output and logsumexp",
            ec * T * hq + 4 * b * a_loc * s,
            f"{ec} B x T x a*d + 4 B x b x a x s (fp32 logsumexp)",
            2,
        )
        # Gemma 3's sliding layers once s >= sliding_window: transformers cannot skip their mask (masking_utils
        # _ignore_causal_mask_sdpa), so it repeats k and v to all heads (use_gqa_in_sdpa needs no mask) and
        # PyTorch turns the boolean mask into an additive one in the compute dtype, b x 1 x s x s, which SDPA
        # saves; per layer, the average over the layers (traced). With one KV head the repeat is a view (no copy).
        kinds, window = arch.extra.get("layer_types"), arch.extra.get("sliding_window")
        n_sliding = sum(k == "sliding_attention" for k in kinds or ())
        if not (window and D.s_full >= window):
            n_sliding = 0
        # Gemma 3 multimodal, fed token_type_ids as its processor returns them (image tokens attend both ways): the
        # blockwise mask function makes HF build a mask for every layer, with or without images in the batch (traced)
        image_masks = bool(arch.extra.get("vision", {}).get("image_mask_all_layers"))
        if image_masks and kinds:
            n_sliding = len(kinds)
        if arch.extra.get("sdpa_sliding_mask") == "decoder" and n_sliding:
            frac = n_sliding / len(kinds)
            rep = 2 * ec * T * (hq - hkv) if D.kv > 1 else 0
            masked_frac = frac if rep else 0.0
            every = n_sliding == len(kinds) and image_masks
            add(
                ("every layer (image tokens attend both ways)" if every else "sliding-window layers")
                + ": SDPA's additive mask"
                + (", k and v repeated to all heads" if rep else ""),
                frac * (rep + ec * b * s * D.s_full),
                f"{n_sliding}/{len(kinds)} layers x ({ec} B x b x s x s"
                + (f" + 2 x {ec} B x T x (a*d - kv*d)" if rep else "")
                + ("), token_type_ids mark image blocks" if every else f"), s >= sliding_window {window}"),
                3 if rep else 1,
            )
        if arch.extra.get("sdpa_float_mask"):
            # a model passing an explicit boolean mask (Falcon) gets it cast to a float bias per call, which the
            # fused kernel saves for backward (CPU flash; CUDA's memory-efficient kernel alike)
            add("attention mask cast to a float bias, saved by SDPA", ec * b * s * D.s_full,
                f"{ec} B x b x s x s, b={b} s={s}", 1)  # fmt: skip
        # q built by torch.cat (partial rotary) is contiguous per head: SDPA's output is then (b, a, s, d) in memory
        # and the transpose to (b, s, a*d) is a copy, which the out-projection saves (traced: GPT-NeoX, Phi)
        copied = bool(arch.extra.get("sdpa_output_copy"))
        label = "attention output" + (" (b, s, a*d) copy" if copied else "")
        consumers(attn_out, hq, T, ec, label, already_saved=not copied)

    if arch.extra.get("fused_qkv_kept") and not mla and not eager:
        # ModernBERT: q and k leave Wqkv's [q | k | v] output through RoPE (new tensors), but v goes to SDPA as a
        # view of it, so the whole output stays saved: its q and k thirds on top of the tensors above (traced;
        # eager's matmul saves a contiguous copy of v instead and the output is freed)
        add(
            "fused Wqkv output kept alive by the v view (its q and k parts)",
            ec * T * (hq + hkv),
            f"{ec} B x T x (a*d + kv*d)",
            1,
        )
    sliding = arch.extra.get("sliding_layers", 0) if arch.extra.get("sdpa_sliding_mask") == "local" else 0
    if sliding and not eager and D.s_full >= arch.extra.get("sliding_window", 0):
        # ModernBERT's local layers: HF builds one boolean (b, 1, s, s) sliding-window mask (no skip once s reaches
        # the half window) and SDPA converts it to an additive mask in the query dtype in every local layer, which
        # the memory-efficient / CPU flash kernel saves for backward (traced); averaged over the layers (the
        # boolean mask itself is saved by nothing and dies with the forward)
        n = arch.num_layers
        add(
            "sliding-window attention mask converted by SDPA (local layers)",
            sliding / n * ec * b * s * D.s_full,
            f"{sliding}/{n} layers x {ec} B x b x s x s",
            1,
        )

    # ----- MLP ------------------------------------------------------------------------------------
    mlp_from = len(L)
    moe = arch.is_moe
    mlp_parts = arch.extra.get("mlp_parts")  # dense + MoE layers, shared experts (architecture/moe.py)
    if mlp_parts:
        Tm, I = _mlp_parts(arch, D, mlp_parts, add, consumers, full, ec, r)
    else:
        k = arch.experts_per_token if moe else 1
        Tm = T * k
        n_act = ACT_SAVED.get(arch.mlp_activation, 3)
        kf = f"k x T x I, k={k}" if moe else "T x I"
        # a parallel MLP (NeoX, Phi) reads the norm of the layer input: gradient-free in layer 0 under LoRA
        # unless an MLP-input Linear carries an adapter
        mlp_free0 = frozen_first and _parallel_mlp(arch) and not (MLP_IN & modules & targets)
        # Falcon's Linear adds its bias after the matmul: under autocast the fp32 bias promotes the output, so the
        # activation works on (and saves) fp32 (traced)
        ab_ = 4 if amp and arch.extra.get("unfused_bias") else ec
        per_elem, formula = n_act * ab_, f"{n_act} x {ab_} B x {kf}, I={I}"
        if amp and arch.mlp_activation == "gelu_tanh" and ab_ == ec:
            per_elem, formula = gelu_tanh_autocast(ec, kf, I)
        add(
            f"MLP activation internals ({arch.mlp_activation})",
            per_elem * Tm * I,
            formula + ("; none in layer 0 (frozen embeddings)" if mlp_free0 else ""),
            n_act,
            first_bytes=per_elem * Tm * I if mlp_free0 else 0,
        )
        consumers(MLP_OUT, I, Tm, ec, "MLP down-projection input")
    if moe and not mlp_parts:
        E = arch.num_experts
        # frozen router and experts (LoRA): no logits (the router's input is saved only for its weight) and
        # no gathered input rows, only the fp32 probabilities and the down output (traced on Mixtral)
        lg, cp = (ec, 2) if full else (0, 1)
        add(
            "MoE router logits, probabilities and routed token copies",
            (lg + 4) * T * E + cp * ec * Tm * h,
            f"({lg} + 4) B x T x E + {cp} x {ec} B x k x T x h, E={E}",
            3,
        )
    mlp_to = len(L)
    if ssm:  # Mamba: no attention, no MLP; the mixer's own tensors (families/mamba.py)
        del L[ssm_from:]
        _ssm_mixer(ctx, D, ssm, add, consumers, ec)
        mlp_from = ao_from = ao_to = mlp_to = len(L)
    if arch.hidden_dropout > 0:
        nm = arch.extra.get("residual_dropout_masks", 2)
        add("residual dropout masks", nm * Tout * h, f"{nm} x 1 B x T x h", nm)
    t5_sm: tuple[float, str] = (0, "")
    if arch.family == "t5":  # encoder-decoder blocks: their own rules replace the decoder-only ones above
        del L[:]
        t5_sm = _t5_blocks(ctx, D, add, consumers, out, r, ec, amp, eager)
        if sc.activation_checkpointing == "full":
            # the layer recomputed in backward is a decoder block (the first run backward), not the average
            kept, scratch = list(L), ActivationBudget()
            del L[:]
            _t5_blocks(ctx, D, add, consumers, scratch, r, ec, amp, eager, stacks=(0, 1))
            dec = sum(t.bytes for t in L)
            L[:] = kept
            out.recomputed_layer = [
                Term("recomputed decoder block", dec, f"{fmt_int(dec)} B (one decoder block)", 1)
            ]
        mlp_from = ao_from = ao_to = mlp_to = 0
    if amp and full:
        # Llama 4's bmm experts and nn.Linear router are autocast too: their 16-bit copies are cached alike
        bmm_experts = arch.extra.get("autocast_expert_copies", False)
        wl = sum(
            g.numel
            for g in ctx.arch.params
            if g.scope == "layer" and (g.module or (bmm_experts and (g.expert or g.kind == "router")))
        ) // max(arch.num_layers, 1)
        wl //= D.tp
        add("autocast 16-bit weight copies", 2 * wl, f"2 B x {fmt_int(wl)} Linear weights per layer", 7)
    elif amp and sc.activation_checkpointing != "full":
        # A frozen Linear gets no autocast cache entry (only trained fp32 leaves are cached), but the matmul
        # it runs keeps the 16-bit weight it was given for the input's gradient: one copy per frozen Linear
        # whose input needs a gradient (torch autocast_mode cached_cast; checked with saved-tensor hooks and
        # against fake-tensor traces, docs/fidelity.md). NF4 Linears dequantise inside bitsandbytes' own
        # autograd Function, which saves the packed weight only. Layer 0's attention input needs no gradient
        # without checkpointing (frozen embeddings), so q, k and v keep no copy there. Under full checkpointing
        # the copies exist only while the recomputed layer's backward runs, freed Linear by Linear; the
        # layer-backward moment already bounds that (traces of amp LoRA with checkpointing agree without them).
        frozen_w = [
            g
            for g in arch.params
            if g.scope == "layer"
            and g.module
            and not (sc.method == "qlora" and quantises_module(ctx, g.module))
        ]
        layers = max(arch.num_layers, 1)
        wl = sum(g.numel for g in frozen_w) // layers // D.tp
        w0 = sum(g.numel for g in frozen_w if g.module in ATTN_IN) // layers // D.tp if frozen_first else 0
        add(
            "autocast 16-bit copies of frozen Linear weights",
            2 * wl,
            f"2 B x {fmt_int(wl)} frozen Linear weights per layer"
            + ("; none for layer 0's attention input" if w0 else ""),
            sum(g.count for g in frozen_w) // layers,
            first_bytes=2 * w0,
        )

    # ----- LoRA adapter internals -------------------------------------------------------------------
    if not full:
        per_layer = [ad for ad in ctx.adapters if ad.base.scope == "layer"]
        layers = max(arch.num_layers, 1)
        mid = sum(ad.rank * ad.base.count for ad in per_layer) / layers
        add(
            "LoRA A outputs (saved by B)",
            ab * Tout * mid,
            f"{ab} B x T x sum(rank)={fmt_int(mid)}",
            len(per_layer),
        )

    # ----- the KV cache HF builds in training (use_cache defaults to true; off under checkpointing) ----------
    # It holds each layer's k and v (after RoPE) until the outputs are dropped. Under SDPA these are the
    # tensors SDPA saves anyway, except autocast's fp32 k (SDPA saves a 16-bit cast); eager saves
    # repeated copies instead, so the cache is extra.
    kb = 4 if amp and arch.position == "rope" else ec  # the cache's k: fp32 after autocast's fp32 RoPE
    if arch.extra.get("rope_keeps_dtype"):  # OLMo 2's RoPE casts q and k back to their input dtype
        kb = ec
    kv_cache = (
        prof.training_kv_cache
        and arch.causal
        and arch.extra.get("use_cache", True)
        and sc.activation_checkpointing not in ("full", "selective-op")
    )
    if kv_cache:
        gqa = arch.num_kv_heads < arch.num_heads  # eager saves repeated copies; with MHA the cache tensors
        # Falcon's unfused bias under autocast makes v fp32 too (the fused projection's output is promoted; traced)
        fp32_kv = 2 if arch.extra.get("unfused_bias") else 1
        extra = (
            ((kb + ec) * T * hkv if gqa else 0)
            if eager
            else (fp32_kv * 4 * T * hkv if amp and kb == 4 else 0)
        )
        formula = (
            f"({kb} + {ec}) B x T x kv*d"
            if eager
            else ("2 x 4 B x T x kv*d (fp32 k and v)" if fp32_kv == 2 else "4 B x T x kv*d (fp32 k)")
        )
        if masked_frac and not eager:
            # a masked layer's SDPA saves repeated copies of k and v: the cache's own k and v are extra (traced)
            extra = masked_frac * (kb + ec) * T * hkv + (1 - masked_frac) * extra
            formula = f"masked layers {masked_frac:.2f} x ({kb} + {ec}) B x T x kv*d, others: {formula}"
        if extra:
            out.cache_per_layer.append(
                Term("KV cache held by the model output (forward only)", extra, formula, 2)
            )
    if amp and V_final_fp32(arch):
        out.loss_forward.append(
            Term("final hidden states (fp32) held by the model output", 4 * Tout * h, "4 B x T x h", 1)
        )

    # ----- checkpointing ----------------------------------------------------------------------------
    # an fp32 residual stream (fp32, autocast) is saved by the first norm as is: no separate copy
    out.ckpt_input_shared = r == 4
    if sc.activation_checkpointing in ("full", "selective-op"):
        out.checkpointed_layer = [
            Term("checkpointed layer inputs", r * Tout * h, f"{r} B x T x h per layer", 1)
        ]
    if sc.activation_checkpointing == "selective-op":
        _selective_op(ctx, D, out, r, 2 if amp else ec, eager, amp)

    # ----- model-level terms ------------------------------------------------------------------------
    V = D.V
    if arch.position == "rope":
        cb = 4 if amp else ec
        rd = arch.extra.get("rotary_dim", D.d)  # partial rotary: cos/sin cover the first rotary_dim channels
        kinds = arch.extra.get(
            "rope_kinds", 1
        )  # one cos/sin pair per layer kind: Gemma 3 (sliding, full), ModernBERT (local, global)
        out.pre.append(
            Term(
                "rotary cos/sin" + (f" ({kinds} layer kinds, one RoPE base each)" if kinds > 1 else ""),
                kinds * 2 * cb * s * rd,
                (f"{kinds} x " if kinds > 1 else "") + f"2 x {cb} B x s x {rd}",
                2 * kinds,
            )
        )
    if arch.extra.get("alibi_bias_saved") and not eager:
        # Falcon ALiBi: the model builds one (b, a, s, s) bias in the embeddings' dtype, the attention mask of every
        # layer, and the fused SDPA kernel saves it (one tensor for all layers; traced)
        out.pre.append(
            Term(
                "ALiBi attention bias (b, a, s, s) saved by SDPA",
                ec * b * D.a * s * D.s_full,
                f"{ec} B x b x a x s x s, b={b} a={D.a} s={s}",
                1,
            )
        )
    if arch.family == "vit":  # pixels in the weight dtype; autocast saves a 16-bit copy for the patch conv
        C, img = arch.extra.get("num_channels", 3), arch.extra.get("image_size", 224)
        px = b * C * img * img
        pb = recipe.weight_bytes
        out.inputs.append(
            Term(
                "pixel values and labels" + (" (+ autocast 16-bit copy)" if amp else ""),
                px * pb + (2 * px if amp else 0) + 8 * b,
                f"b x {C} x {img} x {img} x ({pb}{' + 2' if amp else ''}) B + 8 B x b",
                2,
            )
        )
    else:
        out.inputs.append(Term("input ids and labels", 16 * b * ctx.seq_len, "2 x 8 B x b x s (int64)", 2))
    if arch.norm == "rmsnorm":
        fnb = 4 if gemma or arch.extra.get("norm_weight_fp32") else r
        fn = cw * Tout * h + 4 * Tout + (fnb * Tout * h if full else 0) + onep * h
        out.post.append(
            Term(
                "final norm",
                fn,
                "4 B x T x h + 4 B x T"
                + (f" + {fnb} B x T x h" if full else "")
                + (" + 4 B x h" if onep else ""),
                3,
            )
        )
    else:
        out.post.append(Term("final norm", r * Tout * h + 8 * Tout, f"{r} B x T x h + 8 B x T", 3))
    # BERT-style encoders: the embeddings' LayerNorm input (nothing under LoRA: the embeddings need no gradient)
    if arch.extra.get("embedding_norm") and not frozen_first:
        out.pre.append(
            Term(
                "embeddings LayerNorm input, mean and rstd",
                r * Tout * h + 8 * Tout,
                f"{r} B x T x h + 8 B x T",
                3,
            )
        )
    if arch.extra.get("final_norm"):  # ModernBERT: the encoder's own final LayerNorm before the MLM head's
        out.post.append(
            Term(
                "encoder final LayerNorm input, mean and rstd",
                r * Tout * h + 8 * Tout,
                f"{r} B x T x h + 8 B x T",
                3,
            )
        )
    if arch.extra.get("mlm_head"):  # the MLM head's dense -> gelu -> LayerNorm (its input: "final norm")
        # gelu saves the dense output; the decoder saves the LayerNorm output only if its weight trains (traced)
        # (under autocast the dense keeps a 16-bit copy of its weight, trained or frozen)
        n_mlm = 2 if full else 1
        wcopy = 2 * h * h if amp else 0
        out.post.append(
            Term(
                "MLM head transform: dense output"
                + (" and LayerNorm output" if full else " (frozen decoder)")
                + (", autocast weight copy" if amp else ""),
                n_mlm * ec * T * h + wcopy,
                f"{n_mlm} x {ec} B x T x h" + (" + 2 B x h x h" if amp else ""),
                n_mlm + (1 if amp else 0),
            )
        )
    if V and amp and not full:  # a frozen head keeps the 16-bit copy of its weight for the input's gradient
        out.post.append(Term("head: autocast 16-bit weight copy (frozen head)", 2 * V * h, "2 B x V x h", 1))
    if V and full:  # the head reads the final norm's output
        if amp:
            out.post.append(
                Term(
                    "head: autocast input and weight copies",
                    2 * T * h + 2 * V * h,
                    "2 B x T x h + 2 B x V x h",
                    2,
                )
            )
        else:
            out.post.append(Term("head input", nout * T * h, f"{nout} B x T x h", 1))
    if V:
        le = 4 if recipe.fp32_compute else 2
        # a loss on the logits as they are (BERT, T5, ViT) runs in fp32 under autocast all the same: cross_entropy
        # and log_softmax are on autocast's fp32 list (torch.amp docs), so it saves and frees as an upcast loss (traced)
        upcast_loss = arch.extra.get("loss_upcast", True) or amp
        if sc.loss == "chunked":
            chunk = T * V / LOSS_CHUNKS
            out.loss_backward.append(
                Term(
                    f"one loss chunk's logits and fp32 log-softmax (1/{LOSS_CHUNKS})",
                    (le + 8) * chunk,
                    f"({le} + 2 x 4) B x T x V / {LOSS_CHUNKS}",
                    3,
                )
            )
            out.loss_forward.append(
                Term(
                    f"one loss chunk's logits (1/{LOSS_CHUNKS})",
                    (le + 4) * chunk,
                    f"({le} + 4) B x T x V / {LOSS_CHUNKS}",
                    2,
                )
            )
        elif upcast_loss and prof.fp32_logits_output:
            # torchtune (2024): the model returns fp32 logits (output(h).float(): the 16-bit matmul output
            # dies at once); the recipe shifts them with .contiguous() (a second fp32 T x V, which replaces
            # the first) and keeps that copy referenced through loss.backward().
            shift = " (shifted .contiguous() copy)" if prof.shift_copy else ""
            out.loss_forward.append(
                Term(
                    "fp32 logits returned by the model" + shift,
                    4 * T * V,
                    "4 B x T x V (the copy and the original never both meet the log-softmax)"
                    if prof.shift_copy
                    else "4 B x T x V",
                    1,
                )
            )
            out.loss_saved.append(Term("fp32 log-softmax saved by the loss", 4 * T * V, "4 B x T x V", 1))
            out.loss_backward.append(
                Term("loss backward: two fp32 T x V gradient buffers", 8 * T * V, "2 x 4 B x T x V", 2)
            )
        elif upcast_loss:
            # HF causal LMs (ForCausalLMLoss): logits = lm_head(h) in the compute dtype; the loss upcasts them
            # (.float()) and log_softmax saves its fp32 output. The trainer drops the logits before backward.
            out.loss_forward.append(
                Term(
                    "logits" + (" and their fp32 upcast" if le != 4 else ""),
                    (le + (4 if le != 4 else 0)) * T * V,
                    f"({le}{' + 4' if le != 4 else ''}) B x T x V, V={V}",
                    1 if le == 4 else 2,
                )
            )
            out.loss_saved.append(Term("fp32 log-softmax saved by the loss", 4 * T * V, "4 B x T x V", 1))
            if loss_parallel(sc):  # DTensor's fused nll + log-softmax backward: one buffer (traced)
                out.loss_backward.append(
                    Term(
                        "loss-parallel backward: one fp32 T x V/tp gradient buffer",
                        4 * T * V,
                        "4 B x T x V",
                        1,
                    )
                )
            else:
                out.loss_backward.append(
                    Term("loss backward: two fp32 T x V gradient buffers", 8 * T * V, "2 x 4 B x T x V", 2)
                )
        else:
            # BERT, T5, ViT: nn.CrossEntropyLoss straight on the logits, in the compute dtype
            out.loss_forward.append(Term("logits", le * T * V, f"{le} B x T x V, V={V}", 1))
            out.loss_saved.append(Term("log-softmax saved by the loss", le * T * V, f"{le} B x T x V", 1))
            out.loss_backward.append(
                Term("loss backward: two T x V gradient buffers", 2 * le * T * V, f"2 x {le} B x T x V", 2)
            )
        cap = arch.extra.get("final_logit_softcapping")
        if cap and sc.loss != "chunked":
            # Gemma 2/3: logits = tanh(logits / cap) x cap; tanh saves its output (compute dtype) until its
            # backward, right after the loss's (traced); the scalar division and product save nothing
            out.loss_saved.append(
                Term(f"final logit softcapping ({cap:g}): tanh output", le * T * V, f"{le} B x T x V", 1)
            )

    # ----- the model output the loop still holds -------------------------------------------------
    lifetime = output_lifetime(sc)
    if lifetime != "trainer":
        out.output_through_step = lifetime == "step"
        until = "the optimizer step ends" if out.output_through_step else "backward ends"
        if V and sc.loss != "chunked":  # the chunked loss fuses the head: the model returns no logits
            lb = 4 if upcast_loss and prof.fp32_logits_output else le
            out.output_logits.append(
                Term(
                    "logits held by the loop's model output",
                    lb * T * V,
                    f"{lb} B x T x V, V={V} (output_lifetime {lifetime!r}: alive until {until})",
                    1,
                )
            )
        if kv_cache:
            out.output_cache_extra = [
                Term(
                    f"{t.name.removesuffix(' (forward only)')}, kept by the loop",
                    t.bytes,
                    t.formula,
                    t.tensors,
                )
                for t in out.cache_per_layer
            ]
            out.output_cache.append(
                Term(
                    "KV cache held by the loop's model output",
                    (kb + ec) * T * hkv,
                    f"({kb} + {ec}) B x T x kv*d per layer, kv*d={hkv}: k and v, alive until {until}",
                    2,
                )
            )

    # ----- backward transients ---------------------------------------------------------------------
    # Checked on traces (docs/fidelity.md): in the MLP's backward the layer holds the gradient of the
    # product and the two gradients the product's backward makes (d act(gate), d up), each T x I, while
    # the down-projection input, if it was saved, has just been released; plus the residual gradient.
    # Under checkpointing the same happens inside the recomputed layer. The final RMSNorm's backward works
    # in fp32: about 24 B x T x h at the top of backward.
    if eager and sc.activation_checkpointing != "selective":
        # softmax backward: the gradient of the probabilities and of the scores, s x s per head (measured:
        # about 6 B x b a s^2 in bf16 with the fp32 softmax)
        sm_b = 4 if softmax_fp32 else ec
        tau_attn = (sm_b + ec) * b * a_loc * s * D.s_full
        # by then o_proj's input is released and, in a sequential block, the MLP has run its backward: what they
        # saved is gone (every saved tensor of the layer is still counted at this moment). A parallel MLP (NeoX,
        # Phi, Cohere) runs its backward after the attention's, so its tensors are still there (traced)
        mlp_done = L[mlp_from:mlp_to] if not _parallel_mlp(arch) else []
        freed = sum(t.bytes for t in L[ao_from:ao_to] + mlp_done)
        out.attention_backward.append(
            Term(
                "attention softmax backward (s x s gradients), less the layer's MLP and o_proj input freed",
                max(tau_attn - freed, 0),
                f"({sm_b} + {ec}) B x b x a x s x s - {fmt_int(freed)} B",
                2,
            )
        )
    if t5_sm[0] and sc.activation_checkpointing != "selective":
        # T5's math-path softmax backward in the last decoder block (the first one differentiated): the fp32
        # gradients of the probabilities and scores, while its feed-forward has released what it saved
        out.attention_backward.append(
            Term("T5 decoder self-attention softmax backward (math SDPA)", max(t5_sm[0], 0), t5_sm[1], 2)
        )
    math_sdpa = not eager and arch.extra.get("sdpa_math_fallback")
    if math_sdpa and sc.activation_checkpointing != "selective":
        # the math fallback's softmax backward: fp32 gradients of the probabilities and of the scores, while the
        # layer's MLP and out-projection (run after attention, so differentiated first) have released what they
        # saved, and the gradients of the layer output, of the MLP's input, of dense's input and of the expanded
        # v are alive (traced)
        freed = sum(
            t.bytes
            for t in L
            if t.name.startswith(
                ("MLP activation internals", "MLP down-projection input", "attention output")
            )
        )
        held = r * T * h + ec * T * h + ec * T * hq + 4 * T * (hq if b > 1 else hkv)
        sm_bytes = 8 * b * a_loc * s * D.s_full
        out.attention_backward.append(
            Term(
                "math SDPA softmax backward (fp32 s x s gradients), less the layer's released MLP tensors",
                max(sm_bytes + held - freed, 0),
                f"(4 + 4) B x b x a x s x s + {fmt_int(held)} B of gradients - {fmt_int(freed)} B released",
                2,
            )
        )
    if D.sp:
        # the backward of a sequence-parallel block starts by all-gathering its output gradient (Shard(1) ->
        # Replicate): the collective's output, its wait and the (b, s, h) cat live together (traced). Kept
        # beside the eager softmax terms (a different instant: the sum errs high).
        out.attention_backward.append(
            Term(
                "sequence-parallel all-gather of the block's output gradient",
                3 * ec * T * h,
                f"3 x {ec} B x T x h (gather, wait, cat)",
                3,
            )
        )
    down_saved = bool(full or (MLP_OUT & modules & targets))
    n_ti = (3 if arch.mlp_activation in ("swiglu", "geglu") else 2) - (1 if down_saved else 0)
    if arch.mlp_activation == "gelu_tanh" and arch.extra.get("parallel_attn_mlp"):
        n_ti += 1  # Phi: gelu_new's pointwise chain holds one more T x I gradient in its backward (traced)
    if arch.mlp_activation == "quick_gelu":
        n_ti += 1  # CLIP: x * sigmoid(1.702 x) -- the product's two input gradients beside fc2's (traced)
    out.layer_backward.append(
        Term(
            "activation gradients of the layer in backward",
            n_ti * ec * Tm * I + r * T * h,
            f"{n_ti} x {ec} B x T x I + {r} B x T x h",
            n_ti + 1,
        )
    )
    if arch.norm == "rmsnorm":
        out.top_backward.append(Term("final RMSNorm backward (fp32)", 24 * Tout * h, "24 B x T x h", 4))
    else:
        out.top_backward.append(Term("final LayerNorm backward", 3 * r * Tout * h, f"3 x {r} B x T x h", 3))
    if not eager and not math_sdpa and not t5_sm[0]:
        out.layer_backward.append(
            Term(
                "flash-attention backward dq accumulator (fp32)",
                4 * T * hq,
                "4 B x T x a*d (CUDA kernel scratch)",
                1,
                "allocator",
            )
        )
    if ssm:
        out.layer_backward[:] = [ssm_backward(ctx, D, ssm, ec, r)]
    if sc.method == "qlora":
        biggest = max(
            (g.numel_each for g in arch.params if g.module and g.kind not in ("head", "embedding")), default=0
        )
        out.layer_backward.append(
            Term(
                "QLoRA dequantised weight of the layer in use",
                ec * biggest // D.tp,
                f"{ec} B x largest Linear {fmt_int(biggest)}",
                1,
            )
        )
    return out


def ssm_kernel(ctx: Context) -> str:
    """The scan a state-space layer runs: the scenario's ``ssm_kernel``, by default ``cuda`` (mamba-ssm)."""
    return ctx.scenario.ssm_kernel or "cuda"


#: mamba-ssm's selective_scan_cuda keeps its fp32 (a, b) scan pairs once per chunk of this many steps
#: (csrc/selective_scan/selective_scan_fwd_kernel.cuh: kChunkSize = kNThreads x kNItems = 2048)
SCAN_CHUNK = 2048


def _ssm_mixer(ctx, D, ssm, add, consumers, ec):  # noqa: ANN001, ANN202
    """A Mamba (v1) mixer's saved tensors, per layer (``MambaMixer``, transformers 5.24); T tokens, I inner
    channels, N state size, R time-step rank, K conv kernel.

    ``ssm_kernel: "torch"`` (traced, docs/fidelity.md): transformers' ``slow_forward`` path. in_proj's output
    (b, 2I, s) stays alive through the views the conv and the gate read; the depthwise conv's padded output
    (b, I, s + K - 1), read by SiLU; x_proj's input (a contiguous copy of the transposed SiLU output) and output
    (dt, B, C are views of it); dt + bias and softplus(dt); the discretised A = exp(A dt) and B dt, each
    (b, I, s, N) fp32, with u.float() and B.float(); then the sequential scan keeps every step's state: an fp32
    (b, I, N) saved by the next step's multiply and its compute-dtype copy saved by the matmul with C. These
    s x b x I x N x (4 + e) bytes are what makes this path large.

    ``ssm_kernel: "cuda"`` (formula from mamba-ssm's saved tensors, not traced): ``MambaInnerFn.forward``
    (state-spaces/mamba, mamba_ssm/ops/selective_scan_interface.py, checkpoint_lvl=1) calls
    ``ctx.save_for_backward(xz, conv1d_weight, conv1d_bias, x_dbl, x_proj_weight, delta_proj_weight,
    out_proj_weight, conv1d_out=None, delta=None, A, B, C, D, delta_bias, scan_intermediates, out, ...)``: xz is
    the contiguous copy of in_proj's transposed output (b, 2I, s), x_dbl = x_proj's output (T, R + 2N), B and C
    contiguous (b, 1, N, s) copies, ``out`` (b, I, s) in the compute dtype, and ``scan_intermediates`` from
    ``selective_scan_cuda.fwd``: fp32 (b, I, ceil(s / 2048), 2N), one scan pair per 2048-step chunk. The conv
    output and delta are recomputed in backward. The kernel computes the states in SRAM and keeps none."""
    T, b, s, h = D.T, D.b, D.s, D.h
    inner = ssm["inner"] // D.tp
    N, R, K = ssm["state_size"], ssm["time_step_rank"], ssm["conv_kernel"]
    frac = ssm["layers"] / max(ctx.arch.num_layers, 1)
    kernel = ssm_kernel(ctx)
    consumers(frozenset({"in_proj"}), h, T, ec, "in_proj input")
    share = "" if frac == 1 else f"{ssm['layers']}/{ctx.arch.num_layers} layers x "

    def put(name: str, nbytes: float, formula: str, tensors: int = 1) -> None:
        add(name, frac * nbytes, share + formula, tensors)

    if ssm["version"] == 2:
        _mamba2_mixer(D, ssm, put, ec, kernel)
        return

    if kernel == "cuda":
        chunks = -(-s // SCAN_CHUNK)
        put(
            "Mamba kernel (mamba-ssm MambaInnerFn): xz, x_dbl, B, C, out",
            ec * T * (2 * inner + R + 2 * N + 2 * N + inner),
            f"{ec} B x T x (2I + R + 2N + 2N + I), I={inner} N={N} R={R}",
            5,
        )
        put(
            "Mamba kernel: fp32 scan intermediates (one per 2048-step chunk)",
            4 * b * inner * chunks * 2 * N,
            f"4 B x b x I x ceil(s/{SCAN_CHUNK}) x 2N, chunks={chunks}",
        )
        put("Mamba kernel: A (fp32)", 4 * inner * N, f"4 B x I x N, I={inner} N={N}")
        return
    put(
        "Mamba torch path: in_proj output, conv output, x_proj input copy and output, dt (+ bias, softplus)",
        ec * (T * 2 * inner + b * inner * (s + K - 1) + T * inner + T * (R + 2 * N) + 2 * T * inner),
        f"{ec} B x (T x 2I + b x I x (s + K - 1) + T x I + T x (R + 2N) + 2 x T x I), I={inner} N={N} R={R}",
        6,
    )
    put(
        "Mamba torch path: discretised A and B (fp32), u and B upcasts",
        2 * 4 * T * inner * N + 4 * T * inner + 4 * T * N,
        f"2 x 4 B x T x I x N + 4 B x T x I + 4 B x T x N, N={N}",
        4,
    )
    # counted with saved-tensor hooks: the step multiply saves the previous state (s - 1 fp32 states and the zero
    # initial state in the compute dtype), the matmul with C each state's compute-dtype copy (s of them); in fp32
    # the copy is the state itself, so the last state is saved too
    bin_ = b * inner * N
    if ec == 4:
        states, fs = 4 * bin_ * (s + 1), "4 B x b x I x N x (s + 1)"
    else:
        states, fs = bin_ * (4 * (s - 1) + ec * (s + 1)), f"b x I x N x (4 B x (s - 1) + {ec} B x (s + 1))"
    put("Mamba torch path: per-step scan states (fp32" + (f", {ec} B copies" if ec != 4 else "") + ")",
        states, fs, 2 * s)  # fmt: skip
    put(
        "Mamba torch path: scan output side (u for D, silu(z), the fp32 gated sum, out_proj input)",
        (3 * ec + 4) * T * inner,
        f"(3 x {ec} + 4) B x T x I, I={inner}",
        4,
    )
    put(
        "Mamba torch path: A = -exp(A_log), D (fp32)",
        2 * 4 * inner * N + 4 * inner,
        f"4 B x I x (2N + 1), I={inner}",
        3,
    )


def _mamba2_mixer(D, ssm, put, ec, kernel):  # noqa: ANN001, ANN202
    """A Mamba-2 mixer's saved tensors, per layer (``Mamba2Mixer``, transformers 5.24); I = H x P inner channels,
    H heads of P, G groups, N state, l = chunk_size, c = ceil(s / l) chunks, s' = c x l (padded), K conv kernel.

    ``ssm_kernel: "cuda"`` (formula from mamba-ssm's saved tensors, not traced): transformers calls
    ``mamba_split_conv1d_scan_combined`` (state-spaces/mamba, mamba_ssm/ops/triton/ssd_combined.py), whose
    ``MambaSplitConv1dScanCombinedFn.forward`` runs ``ctx.save_for_backward(zxbcdt, conv1d_weight, conv1d_bias,
    out_x, A, D, dt_bias, initial_states, seq_idx, rmsnorm_weight, rstd, outproj_weight, outproj_bias)``:
    zxbcdt is in_proj's output (T x (2I + 2GN + H)), out_x the scan output (T x I) in the compute dtype, rstd the
    gated RMSNorm's fp32 (T x G); the conv output, the chunk states and the norm output are recomputed in backward.

    ``ssm_kernel: "torch"`` (counted with saved-tensor hooks over chunk sizes, paddings and dtypes, then traced):
    ``mamba2_chunk_scan``'s SSD in fp32 -- per chunk the (l x l) decay L = exp(segsum(A dt)), the C.B scores G and
    M = G x L (b x H x s' x l each), B and C repeated to the H heads and their einsum copies (5 x b x s' x H x N),
    x dt and its einsum layouts (b x s' x I, several), the chunk states (b x (c + 1) x I x N and b x c x I x N),
    plus in_proj's output, the conv's padded output, dt, and the gated RMSNorm's fp32 chain (4 x 4 B x T x I)."""
    T, b, s = D.T, D.b, D.s
    inner, N, K = ssm["inner"], ssm["state_size"], ssm["conv_kernel"]
    H, G, l = ssm["heads"], ssm["groups"], ssm["chunk_size"]
    proj = 2 * inner + 2 * G * N + H
    if kernel == "cuda":
        put(
            "Mamba-2 kernel (mamba-ssm MambaSplitConv1dScanCombinedFn): zxbcdt, out_x, rstd",
            ec * T * (proj + inner) + 4 * T * G,
            f"{ec} B x T x ((2I + 2GN + H) + I) + 4 B x T x G, I={inner} G={G} N={N} H={H}",
            3,
        )
        put("Mamba-2 kernel: A (fp32)", 4 * H, f"4 B x H, H={H}")
        return
    c = -(-s // l)
    sp = c * l
    fp32 = ec == 4
    put(
        "Mamba-2 torch path: in_proj output, conv output, dt (+ bias, softplus)",
        ec * (T * proj + b * (inner + 2 * G * N) * (s + K - 1) + 2 * T * H),
        f"{ec} B x (T x (2I + 2GN + H) + b x (I + 2GN) x (s + K - 1) + 2 x T x H), I={inner} G={G} N={N} H={H}",
        4,
    )
    # fp32: x.float() is the conv's SiLU output itself (b x s x (I + 2GN)); dt.float() is dt (one tensor fewer)
    xf = 4 * T * (inner + 2 * G * N) if fp32 else 4 * b * sp * inner
    put(
        "Mamba-2 torch path: x (fp32, padded), x dt, dt (fp32)",
        xf + 4 * b * sp * inner + (1 if fp32 else 2) * 4 * T * H,
        ("4 B x T x (I + 2GN)" if fp32 else "4 B x b x s' x I") + " + 4 B x b x s' x I"
        + f" + {1 if fp32 else 2} x 4 B x T x H, s'={sp}",
        4,
    )  # fmt: skip
    # a single chunk: the states slice is a view, not a copy (and at some shapes one B/C einsum layout too, which
    # is still counted: up to 4 B x b x s' x H x N high when s <= chunk_size)
    one = c == 1
    hn = 5 * 4 * b * sp * H * N + (0 if one else 4 * b * c * inner * N)
    put(
        "Mamba-2 torch path: SSD chunk tensors (fp32): L, G, M (b x H x s' x l), B/C per head, x layouts, states",
        3 * 4 * b * H * sp * l + 2 * 4 * b * H * sp + hn + 3 * 4 * b * sp * inner
        + 4 * b * (c + 1) * inner * N + 4 * b * H * (c + 1) ** 2 + 2 * l * l + 2 * (c + 1) ** 2,
        "3 x 4 B x b x H x s' x l + 5 x 4 B x b x s' x H x N + 3 x 4 B x b x s' x I"
        + ("" if one else " + 4 B x b x c x I x N") + f" + 4 B x b x (c + 1) x I x N + ..., l={l} c={c}",
        14,
    )  # fmt: skip
    put(
        "Mamba-2 torch path: gated RMSNorm (fp32 chain, rstd) and out_proj input",
        (4 if fp32 else 5) * 4 * T * inner + ec * T * inner + 4 * T * G,
        f"{4 if fp32 else 5} x 4 B x T x I + {ec} B x T x I + 4 B x T x G, I={inner}",
        7,
    )
    put("Mamba-2 torch path: A (fp32)", 8 * H, f"2 x 4 B x H, H={H}", 2)


def _mamba2_backward(ctx, D, ssm, ec, r):  # noqa: ANN001, ANN202
    """Transients of one Mamba-2 layer's backward (see ssm_backward)."""
    T, inner, G, N, H = D.T, ssm["inner"], ssm["groups"], ssm["state_size"], ssm["heads"]
    proj = 2 * inner + 2 * G * N + H
    if ssm_kernel(ctx) == "cuda":
        return Term(
            "Mamba-2 kernel backward: dzxbcdt, recomputed conv output and its gradient, residual gradient",
            ec * T * (proj + 2 * (inner + 2 * G * N)) + r * T * D.h,
            f"{ec} B x T x ((2I + 2GN + H) + 2 x (I + 2GN)) + {r} B x T x h, I={inner}",
            4,
        )
    # not modelled beyond the residual gradient: the V64 trace (peak inside the top layer's backward) is -1.4%
    return Term("Mamba-2 torch path backward: residual gradient", r * T * D.h, f"{r} B x T x h", 1)


def ssm_backward(ctx, D, ssm, ec, r):  # noqa: ANN001, ANN201
    """Transients while one Mamba layer runs backward: torch path, the gradients of the (b, I, s, N) fp32
    discretised tensors (select_backward buffers of the scan and their sum, traced); kernel path, the
    recomputed conv output and delta, dxz and the out-projection gradient (mamba-ssm's backward, not traced)."""
    T, inner, N = D.T, ssm["inner"] // D.tp, ssm["state_size"]
    if ssm["version"] == 2:
        return _mamba2_backward(ctx, D, ssm, ec, r)
    if ssm_kernel(ctx) == "cuda":
        return Term(
            "Mamba kernel backward: recomputed conv output and delta, dxz, dout_y, residual gradient",
            ec * T * 6 * inner + r * T * D.h,
            f"{ec} B x T x 6I + {r} B x T x h, I={inner}",
            5,
        )
    return Term(
        "Mamba torch path backward: fp32 gradients of the (b, I, s, N) scan tensors, residual gradient",
        4 * 4 * T * inner * N + r * T * D.h,
        f"4 x 4 B x T x I x N + {r} B x T x h, I={inner} N={N}",
        5,
    )


def _mla(ctx, D, mla, add, consumers, attn_out, eager, amp, ec):  # noqa: ANN001, ANN202
    """DeepSeek-V2/V3 multi-head latent attention (``DeepseekV3Attention.forward``), per layer.

    The compressed latents: q_a_proj's and kv_a_proj_with_mqa's outputs go through their RMSNorms (fp32
    input, rsqrt, the normalised tensor when the weight trains), whose outputs q_b_proj and kv_b_proj save.
    Then the up-projected tensors attention keeps: q and k at a x (d_nope + d_rope) (both new tensors: a cat
    and the key buffer the k_nope / k_rope halves are copied into), and v, a view of kv_b_proj's output, so
    that whole a x (d_nope + d_v) buffer stays. SDPA adds its output (a x d_v), the fp32 logsumexp and
    o_proj's input, a contiguous copy of the output; eager the fp32 softmax and its 16-bit cast. Under tensor parallel the latents are replicated."""
    full, T, b, s = ctx.full_training, D.T, D.b, D.s
    a = D.a
    qr, kvr = mla["q_lora_rank"], mla["kv_lora_rank"]
    dqk = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    dv, nope = mla["v_head_dim"], mla["qk_nope_head_dim"]
    lat = 4 if amp else ec  # a norm output under autocast: fp32 weight x 16-bit tensor
    for label, rank, module in (("q", qr, "q_b_proj"), ("kv", kvr, "kv_b_proj")):
        if not rank:
            continue
        add(
            f"MLA {label} latent RMSNorm: fp32 input, rsqrt" + (", normalised" if full else ""),
            4 * T * rank + 4 * T + (ec * T * rank if full else 0),
            f"4 B x T x {rank} + 4 B x T" + (f" + {ec} B x T x {rank}" if full else ""),
            3 if full else 2,
        )
        consumers(frozenset({module}), rank, T, lat, f"MLA {label} latent ({module} input)")
    add(
        "MLA q, k (heads x (nope + rope)) and the up-projected k/v buffer (v's base)",
        ec * T * a * (2 * dqk + nope + dv),
        f"{ec} B x T x a x (2 x {dqk} + {nope} + {dv}), a={a}",
        3,
    )
    if eager:
        if ctx.scenario.activation_checkpointing != "selective":
            add(
                "attention softmax (fp32) and its 16-bit cast",
                b * a * s * D.s_full * (4 + ec),
                f"b x a x s x s x (4 + {ec}) B, b={b} a={a} s={s}",
                2,
            )
        consumers(attn_out, a * dv, T, ec, "attention output")
    else:
        add(
            "attention output and logsumexp",
            ec * T * a * dv + 4 * b * a * s,
            f"{ec} B x T x a x {dv} + 4 B x b x a x s (fp32 logsumexp)",
            2,
        )
        # the output follows q's (b, a, s, d) layout (q is a cat, not a transposed view): o_proj saves the
        # (b, s, a*d_v) contiguous copy besides it (traced)
        consumers(attn_out, a * dv, T, ec, "attention output (contiguous copy)")


def _mlp_parts(arch, D, parts, add, consumers, full, ec, r=None):  # noqa: ANN001, ANN202
    """MLP terms of families whose layers run different MLPs (dense first layers, MoE every n-th layer) or
    a shared expert beside the routed ones (``arch.extra["mlp_parts"]``, architecture/moe.py). Per-layer bytes
    are the average over the layers; returns (rows, width) of the largest part for the backward transients.

    A routed part runs transformers 5's default ``grouped_mm`` experts (the eager per-expert loop saves
    alike): the gathered input rows, the gate_up output, act(gate) and the product (saved by down_proj),
    and the down output kept by the routing-weight multiply -- k rows per token in all (frozen experts under
    LoRA: no gathered rows, no down_proj input). A part's ``activation`` (GPT-OSS ``"clamped-swiglu"``)
    overrides the model's for its internals. Its router saves, for ``"softmax"`` (Mixtral, Qwen3-MoE)
    the logits and the fp32 probabilities over E; for ``"sigmoid"`` (DeepSeek-V3) the fp32 copy of its
    input, the fp32 logits' sigmoid and the group mask; for ``"softmax-fp32"`` (DeepSeek-V2) the fp32 input
    copy and the fp32 probabilities; for ``"topk-softmax"`` (GPT-OSS) the softmax over its k top logits
    and the gathered copy; for ``"topk-sigmoid"`` (Llama 4) the fp32 sigmoid over all E (non-chosen logits set
    to -inf) and the top-k indices. A ``dispatch: "dense"`` part (Llama 4: ``rows`` = E, every expert runs every
    token with ``torch.bmm``) keeps the repeated input, its score-scaled copy and the score column instead of
    grouped_mm's gathered rows and int64 bookkeeping (traced)."""
    T, h = D.T, D.h
    layers = max(arch.num_layers, 1)
    worst = (T, 0)
    for part in parts:
        frac = part["layers"] / layers
        rows = T * part.get("rows", 1)
        width = part["width"] // D.tp
        name, share = part["name"], f"{part['layers']}/{layers} layers"
        act = part.get("activation", arch.mlp_activation)
        n_act = ACT_SAVED_PART.get(act, ACT_SAVED.get(act, 3))
        add(
            f"{name}: activation internals ({act})",
            frac * n_act * ec * rows * width,
            f"{share} x {n_act} x {ec} B x {part.get('rows', 1)} x T x {width}",
            n_act,
        )
        if rows * width > worst[0] * worst[1]:
            worst = (rows, width)
        E = part.get("experts", 0)
        if not E:
            consumers(MLP_OUT, width, rows * frac, ec, f"{name}: down-projection input")
            continue
        if full:
            add(
                f"{name}: down-projection input",
                frac * ec * rows * width,
                f"{share} x {ec} B x k x T x {width}",
            )
        kind = part.get("router", "softmax")
        # grouped_mm keeps per routed row the gathered input and the down output (2 copies), plus its
        # bookkeeping: the top-k indices, the sort permutation, the token index (perm // k), the inverse
        # permutation and routing-weight copies (40 B in all, traced on Qwen3-MoE); frozen experts (LoRA) keep no
        # gathered input and one int64 index less (32 B; traced on GPT-OSS). Llama 4 (``dispatch: dense``)
        # keeps the repeated input (residual dtype: fp32 under autocast, where bmm saves a 16-bit cast of the
        # scaled copy), the score-scaled copy (none when the experts are frozen) and the score column.
        dense = part.get("dispatch") == "dense"
        copies = 2 if full else 1
        rb = (r or ec) if dense else ec
        book = ec if dense else (40 if full else 32)
        routed = (rb + (copies - 1) * ec) * rows * h + book * rows
        k = part.get("top_k", part.get("rows", 1))
        # DeepSeek's fp32 router keeps its fp32 input copy only for its own weight's gradient (none under LoRA)
        fp32_in = 4 * T * h if full else 0
        router = {
            "softmax": (ec + 4) * T * E,
            "sigmoid": fp32_in + 5 * T * E,
            "softmax-fp32": fp32_in + 4 * T * E,
            "topk-softmax": 2 * ec * T * k,  # GPT-OSS: softmax over the k top logits, its gathered copy
            # Llama 4: the fp32 sigmoid of the -inf-filled logits and the top-k indices
            "topk-sigmoid": 4 * T * E + 8 * T * k,
        }[kind]
        add(
            f"{name}: router ({kind}) and routed token copies",
            frac * (router + routed),
            f"{share} x (router over E={E} + ({rb}"
            + (f" + {ec}" if copies > 1 else "")
            + ") B x k x T x h + "
            + (f"{ec} B x E x T scores)" if dense else f"{book} B x k x T indices)"),
            3,
        )
    return worst


#: Leaf Linears whose output the layer itself saves for backward when nothing changes it first: SDPA keeps v
#: (a view of v_proj's output), SwiGLU's activation keeps gate_proj's output.
SAVED_AS_IS = {"v_proj": "sdpa", "gate_proj": "gated"}


def layer_matmuls(ctx: Context, D: _Dims, ec: int) -> list[tuple[str, float, int]]:
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


def _selective_op(
    ctx: Context, D: _Dims, out: ActivationBudget, r: int, ec: int, eager: bool, amp: bool
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


def V_final_fp32(arch: object) -> bool:  # noqa: N802
    """Autocast models whose final hidden state stays fp32 while the loss runs (all HF decoders)."""
    return bool(getattr(arch, "vocab_size", 0))


def _megatron(ctx: Context) -> ActivationBudget:
    """Megatron-LM with fused kernels: Korthikanti et al. 2022 Table 2, generalised to any MLP width.

    Per layer s*b*h*(18 + 4*I/h) for a GELU MLP (34 at I = 4h); a gated MLP (SwiGLU) keeps one more
    T x I tensor of 2 bytes, hence 18 + 6*I/h. Without sequence parallelism 10*s*b*h (norm inputs,
    dropout masks) stay outside the tensor-parallel regions. Flash attention and selective
    recomputation drop the 5*a*s^2*b/t attention-score term.
    """
    arch, sc = ctx.arch, ctx.scenario
    D = _Dims(ctx)
    t = D.tp
    s, b, h = D.s, D.b, arch.hidden_size
    gated = arch.mlp_activation in ("swiglu", "geglu")
    mlp = 18 + (6 if gated else 4) * arch.intermediate_size / h
    out = ActivationBudget()
    sel = sc.activation_checkpointing in ("selective", "full") or sc.attention == "sdpa"
    if D.sp:
        per = s * b * h * mlp / t
        f = f"s x b x h x ({mlp:.1f})/t"
    else:
        per = s * b * h * (10 + (mlp - 10) / t)
        f = f"s x b x h x (10 + {mlp - 10:.1f}/t)"
    out.per_layer.append(Term("layer activations (Korthikanti Table 2)", per, f, 10))
    if not sel:
        att = 5 * arch.num_heads * s * s * b / t
        out.per_layer.append(Term("attention scores, softmax, dropout", att, "5 x a x s^2 x b / t", 3))
    if sc.activation_checkpointing == "full":
        out.checkpointed_layer = [
            Term("checkpointed layer inputs", 2 * s * b * h / (t if D.sp else 1), "2 B x s x b x h", 1)
        ]
    out.inputs.append(Term("input ids and labels", 16 * b * ctx.seq_len, "2 x 8 B x b x s", 2))
    V = D.V
    out.post.append(Term("logits (fp32, vocab-parallel cross-entropy)", 4 * D.T * V, "4 B x T x V/t", 1))
    out.loss_backward.append(Term("cross-entropy backward buffer", 4 * D.T * V, "4 B x T x V/t", 1))
    out.layer_backward.append(
        Term(
            "activation gradients of the layer in backward",
            4 * D.T * h + 2 * D.T * D.I,
            "4 B x T x h + 2 B x T x I",
            3,
        )
    )
    return out


def _t5_blocks(ctx, D, add, consumers, out, r, ec, amp, eager, stacks=None):  # noqa: ANN001, ANN202
    """T5 (``T5ForConditionalGeneration``, transformers 5.x), per layer averaged over the encoder's and the
    decoder's blocks (``arch.num_layers`` counts both). Returns the extra tensors a decoder block's
    self-attention backward holds (the softmax backward), as (bytes, formula).

    Each block is sub-layers: self-attention, (decoder) cross-attention, feed-forward, each behind a
    T5LayerNorm: ``x.to(fp32).pow(2)`` saves an fp32 copy of the input, ``x * rsqrt(...)`` saves the input
    itself (in the residual dtype; the same tensor as the fp32 copy in fp32 and under autocast) and the rsqrt,
    ``weight * normed`` the normalised tensor when the weight trains.

    Attention runs SDPA with the relative position bias folded into a float mask (1, a, s, s)
    (transformers' ``create_position_bias_mask``). When the bias needs a gradient (its embedding trains:
    full training), the fused kernels are not used (traced on CPU; on the H200 the allocated peak agrees only
    with it): SDPA's math path upcasts to fp32 and saves q, k, v (fp32 copies) and the fp32 probabilities,
    and with dropout p > 0 the dropout mask (CUDA's 1 B) and the dropped fp32 probabilities. A frozen bias
    (LoRA) or the cross-attention's zero bias go to a fused kernel: q, k, v, the output, the fp32 logsumexp
    and the float mask it reads (one per decoder layer for the causal self-attention: ``torch.where`` builds
    it; the encoder's bias and the cross-attention's zeros are one tensor per stack). The output
    (b, a, s, d) is copied to (b, s, a*d) for ``o``. The decoder's causal self-attention keeps its
    boolean (1, 1, s, s) causal mask for ``torch.where``'s backward.

    Cross-attention: q from the decoder, k and v from the encoder output, which every decoder block's k and v
    Linears read: one tensor kept for them all (16-bit copies per Linear under autocast, LoRA copies per
    adapter). The ReLU feed-forward saves its output once (the ReLU backward and ``wo`` share it); dropout
    adds its mask (1 B) and the dropped tensor ``wo`` reads. Residual dropout masks: one per sub-layer.
    """
    arch, sc = ctx.arch, ctx.scenario
    T, h, b, s, a, hq, I = D.T, D.h, D.b, D.s, D.a, D.hq, D.I
    ne, nd = stacks or (arch.encoder_layers, arch.decoder_layers)
    # under checkpointing T5Attention marks the cross-attention's zero bias as needing a gradient: math path too
    ckpt = sc.activation_checkpointing == "full"
    selective = sc.activation_checkpointing == "selective"
    n = max(ne + nd, 1)
    full = ctx.full_training
    targets = {ad.base.module for ad in ctx.adapters}
    p = arch.attention_dropout
    bass = b * a * s * D.s_full
    frozen0 = not full and sc.activation_checkpointing in ("none", "selective")
    share = f"({ne} encoder x {{e}} + {nd} decoder x {{d}}) / {n} layers"

    def avg(name: str, enc: float, dec: float, formula: str, tensors: int = 1, first: float = 0.0) -> None:
        add(name, (ne * enc + nd * dec - first) / n, formula, tensors)

    # ----- norms: 2 per encoder block, 3 per decoder block ------------------------------------------------
    per_norm = 4 * T * h + 4 * T + (r * T * h if r != 4 else 0) + (r * T * h if full else 0)
    # under LoRA the first norm of each stack's block 0 reads the frozen embeddings: nothing saved there
    avg(
        "T5LayerNorm: fp32 input copy, rsqrt, the input" + (", normalised" if full else ""),
        2 * per_norm,
        3 * per_norm,
        share.format(e=2, d=3)
        + f" x (4 B x T x h + 4 B x T{f' + {r} B x T x h' if r != 4 else ''}{f' + {r} B x T x h' if full else ''})"
        + ("; none in block 0's first norm of each stack (frozen embeddings)" if frozen0 else ""),
        4 if full else 3,
        first=2 * per_norm if frozen0 else 0,
    )
    # ----- Linears reading the norms' outputs ------------------------------------------------------------
    q_only = frozenset({"q"})
    consumers(frozenset({"q", "k", "v"}), h, T, r, "self-attention input")
    consumers(q_only, h, T * nd / n, r, f"cross-attention q input ({nd}/{n} layers)")
    consumers(MLP_IN, h, T, r, "feed-forward input")
    # cross-attention k, v read the encoder output: one tensor for all blocks, else copies per block
    kv = frozenset({"k", "v"}) & set(ctx.linear_modules)
    hit = kv if full else kv & targets
    if hit and not amp and (full or ctx.adapter_bytes == ec):
        out.pre.append(
            Term("encoder output, read by every cross-attention k/v", ec * T * h, f"{ec} B x T x h", 1)
        )
    elif hit:
        cb = 2 if amp else ctx.adapter_bytes
        add(
            "cross-attention k/v: copies of the encoder output",
            len(hit) * cb * T * h * nd / n,
            f"{nd}/{n} layers x {len(hit)} x {cb} B x T x h",
            len(hit),
        )
    # ----- attention ---------------------------------------------------------------------------------
    grad_bias = full  # relative_attention_bias trains: position_bias needs a gradient
    if eager:
        # T5's eager softmax runs in the compute dtype; CUDA autocast runs it in fp32 and the matmul with v saves
        # a 16-bit cast of the (dropped) probabilities
        sm = (4 + (1 if p > 0 else 0) + ec) if amp else (ec + ((1 + ec) if p > 0 else 0))
        sm = 0 if selective else sm
        per = ec * T * 3 * hq + sm * bass
        f = f"{ec} B x T x 3 x a*d + {sm} B x b x a x s x s"
        avg("attention (eager): q, k, v copies, softmax" + (", dropout mask and output" if p else ""),
            per, 2 * per, share.format(e=1, d=2) + " x (" + f + ")", 5 if p else 4)  # fmt: skip
    else:
        fused = ec * T * 4 * hq + 4 * b * a * s
        ff = f"{ec} B x T x 4 x a*d + 4 B x b x a x s"
        # Megatron-style "selective" recomputes the attention core: its s x s tensors are not kept
        math_x = 4 * T * 3 * hq + (0 if selective else 4 * bass + ((1 + 4) * bass if p > 0 else 0))
        fm_x = "4 B x T x 3 x a*d" + (
            " (s x s recomputed: selective)"
            if selective
            else " + 4 B x b x a x s x s" + (" + (1 + 4) B x b x a x s x s" if p else "")
        )
        if grad_bias:
            math_, fm = math_x, fm_x
            avg(
                "self-attention: SDPA math path (the bias needs a gradient): fp32 q, k, v, probabilities"
                + (", dropout mask and dropped probabilities" if p else ""),
                math_,
                math_,
                f"{fm}, b={b} a={a} s={s}",
                6 if p else 4,
            )
        else:
            # the float mask is a new (1, a, s, s) tensor per layer in both stacks: the encoder's permuted bias
            # made .contiguous(), the decoder's torch.where with the causal mask (traced)
            add(
                "self-attention: fused SDPA q, k, v, output, logsumexp and its float mask",
                fused + ec * a * s * D.s_full,
                f"{ff} + {ec} B x a x s x s",
                6,
            )
        if ckpt:
            avg("cross-attention: SDPA math path (its zero bias needs a gradient under checkpointing)", 0,
                math_x, f"{nd}/{n} layers x ({fm_x})", 4)  # fmt: skip
        else:
            avg("cross-attention: fused SDPA q, k, v, output, logsumexp", 0, fused,
                f"{nd}/{n} layers x ({ff})", 5)  # fmt: skip
        # the zero bias of the cross-attention, and the encoder's bias under LoRA: one per stack
        # the cross-attention's zero bias: one contiguous tensor for the whole decoder, saved by the fused SDPA
        out.pre.append(
            Term(
                "cross-attention zero bias (the float mask its fused SDPA saves)",
                ec * a * s * D.s_full,
                f"{ec} B x a x s x s",
                1,
            )  # fmt: skip
        )
        if grad_bias:
            avg(
                "decoder causal mask (bool) kept by torch.where",
                0,
                s * D.s_full,
                f"{nd}/{n} layers x 1 B x s x s",
            )
    if ckpt and grad_bias and not eager and not stacks:
        # each stack's position bias is an input of every checkpointed block that needs a gradient: kept (traced)
        out.pre.append(Term("position biases (1, a, s, s) kept as checkpointed block inputs, one per stack",
                            2 * ec * a * s * D.s_full, f"2 x {ec} B x a x s x s", 2))  # fmt: skip
    attn_out = ATTN_OUT | frozenset(arch.extra.get("attention_output_modules", ()))
    consumers(attn_out, hq, T * (ne + 2 * nd) / n, ec, "attention output (b, s, a*d) copy")
    if full:
        # relative position buckets (int64 s x s) kept by each stack's bias embedding
        out.pre.append(Term("relative position buckets (int64), one per stack", 2 * 8 * s * D.s_full,
                            "2 x 8 B x s x s", 2))  # fmt: skip
    # ----- feed-forward --------------------------------------------------------------------------------
    # T5Config's feed_forward_proj: "relu" saves the ReLU output once (the ReLU backward and wo share it);
    # otherwise the activation's own tensors, for gated ones the product's two operands, and wo's input.
    # "gated-gelu" runs gelu_new, a pointwise chain saving x, tanh(.), 0.5 x and 1 + tanh(.) (traced)
    proj = arch.extra.get("feed_forward_proj", "relu")
    relu = proj == "relu"
    wo_in = bool(full or (MLP_OUT & set(ctx.linear_modules) & targets))
    wo_cast = 2 if amp else 0  # wo is kept in fp32 under autocast: the .to(fp32) input is cast back for mm
    if relu:
        nb = ec + ((1 + ec) if p > 0 else 0) + (wo_cast if wo_in else 0)
        ff = nb * T * I
        add(
            "feed-forward: ReLU output (also wo's input)" + (", dropout mask and output" if p else ""),
            ff,
            f"({ec}{f' + 1 + {ec}' if p else ''}{f' + {wo_cast}' if wo_cast and wo_in else ''}) B x T x I, I={I}",
            3 if p else 1,
        )
    else:
        own = {"gelu": 1, "gated-gelu": 4, "gated-silu": 1, "gated-relu": 1}.get(proj, 1)
        gated = proj.startswith("gated-")
        # gated: act(wi_0 x) and wi_1 x saved by their product (ReLU's output is the one it saves itself)
        n_act = own + (2 if gated else 0) - (1 if proj == "gated-relu" else 0)
        ff = (n_act + (1 if p > 0 else 0) / ec + (1 if wo_in else 0)) * ec * T * I
        add(
            f"feed-forward activation internals ({proj})" + (", dropout mask" if p else ""),
            (n_act * ec + (1 if p > 0 else 0)) * T * I,
            f"({n_act} x {ec}{' + 1' if p else ''}) B x T x I, I={I}",
            n_act + (1 if p else 0),
        )
        consumers(MLP_OUT, I, T, ec, "feed-forward wo input")
    if p > 0:
        avg("residual dropout masks", 2 * T * h, 3 * T * h, share.format(e=2, d=3) + " x 1 B x T x h", 3)
        # the embeddings' and the final dropouts of each stack
        out.pre.append(
            Term("embedding and final dropout masks (both stacks)", 4 * T * h, "4 x 1 B x T x h", 4)
        )
    # the encoder's final norm (the decoder's is the model's final norm)
    enc_norm = 4 * T * h + 4 * T + (r * T * h if r != 4 else 0) + (r * T * h if full else 0)
    out.pre.append(Term("encoder final T5LayerNorm", enc_norm, "as a block's norm", 3))
    # the decoder self-attention's softmax backward (math path): fp32 gradients of the probabilities and scores
    if grad_bias and not eager:
        # the last decoder block runs backward first: by its self-attention's softmax backward its feed-forward
        # and cross-attention sub-layers (their norms included) and o's input copy have released what they saved;
        # alive: the fp32 gradients of the probabilities and of the scores, the residual gradient (r B x T x h),
        # the fp32 gradient of the attention output and of v
        ff_in = (ec if full else 0) * T * h
        cross = ec * T * 4 * hq + 4 * b * a * s + (ec if full else 0) * T * h
        freed = ff + ff_in + cross + 2 * per_norm + (ec if full else 0) * T * hq
        held = r * T * h + 2 * 4 * T * hq
        return (
            8 * bass + held - freed,
            f"(4 + 4) B x b x a x s x s + {fmt_int(held)} B of gradients - {fmt_int(freed)} B released "
            "(the block's feed-forward, cross-attention, their norms, o's input)",
        )
    return 0, ""
