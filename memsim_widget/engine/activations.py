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
from memsim_widget.engine.items import Item, fmt_int

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


@dataclass
class ActivationBudget:
    """Saved and transient activation memory of one rank, per micro-batch."""

    per_layer: list[Term] = field(default_factory=list)  # saved by each layer (one micro-batch)
    checkpointed_layer: list[Term] = field(default_factory=list)  # kept per layer under checkpointing
    pre: list[Term] = field(default_factory=list)  # before the layers (first stage)
    post: list[Term] = field(default_factory=list)  # final norm, loss's saved log-softmax (last stage)
    loss_forward: list[Term] = field(default_factory=list)  # logits and their fp32 copy, alive in the loss
    loss_backward: list[Term] = field(default_factory=list)  # transients at the start of backward
    layer_backward: list[Term] = field(default_factory=list)  # transients while one layer runs backward
    inputs: list[Term] = field(default_factory=list)

    def layer_bytes(self) -> float:
        return sum(t.bytes for t in self.per_layer)


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
        self.V = a.vocab_size // par.tp if par.tp > 1 else a.vocab_size
        self.s_full = ctx.seq_len  # keys each query attends to (ring attention passes all)
        # outside tensor-parallel regions tensors are replicated unless sequence parallel
        self.Tout = self.T // self.tp if self.sp else self.T


def activations(ctx: Context) -> ActivationBudget:
    """Saved and transient activations of one micro-batch on one rank."""
    if ctx.scenario.framework == "megatron":
        return _megatron(ctx)
    return _hf(ctx)


def _hf(ctx: Context) -> ActivationBudget:
    """HF transformers eager modules trained with the usual loop (and torchtune/torchtitan alike)."""
    arch, sc, recipe = ctx.arch, ctx.scenario, ctx.recipe
    D = _Dims(ctx)
    T, Tout, h, I, hq, hkv = D.T, D.Tout, D.h, D.I, D.hq, D.hkv
    amp = recipe.autocast
    e = recipe.act_bytes  # compute dtype bytes
    r = 4 if amp else e  # residual stream dtype (autocast keeps it fp32)
    lora = not ctx.full_training
    out = ActivationBudget()
    L = out.per_layer

    def add(name: str, nbytes: float, formula: str, tensors: int = 1, level: str = "tensor") -> None:
        if nbytes > 0:
            L.append(Term(name, nbytes, formula, tensors, level))

    # ----- norms ---------------------------------------------------------------------------------
    norms = arch.extra.get("norms_per_layer", 2)
    if arch.norm == "rmsnorm":
        # x.float() (or the fp32 residual itself), x*rsqrt, the cast back, the output the Linears read
        per = 4 * Tout * h + r * Tout * h + r * Tout * h + 4 * Tout
        add("RMSNorm inputs and outputs", norms * per,
            f"{norms} norms x (4 B x T x h fp32 copy + 2 x {r} B x T x h + 4 B x T rsqrt), T={fmt_int(Tout)}, "
            f"h={h}", 4 * norms)
    else:
        per = r * Tout * h + r * Tout * h + 8 * Tout
        add("LayerNorm inputs and outputs", norms * per,
            f"{norms} norms x (2 x {r} B x T x h + 8 B x T mean/rstd), T={fmt_int(Tout)}, h={h}", 4 * norms)
    if amp:
        # every Linear reading an fp32 tensor under autocast gets its own 16-bit copy
        n_in = 3 + (2 if arch.mlp_activation in ("swiglu", "geglu") else 1)
        add("autocast 16-bit input copies", n_in * 2 * T * h,
            f"{n_in} Linear inputs x 2 B x T x h", n_in)

    # ----- attention -----------------------------------------------------------------------------
    eager = sc.attention == "eager"
    a_loc, s = D.a, D.s
    if eager:
        add("attention q, k, v (k, v repeated to all heads)", 3 * e * T * hq,
            f"3 x {e} B x T x a*d, a*d={hq}", 3)
        sel = sc.activation_checkpointing == "selective"
        if not sel:
            probs = 4 * D.b * a_loc * s * D.s_full + (e * D.b * a_loc * s * D.s_full if e != 4 else 0)
            add("attention scores softmax (fp32) and its cast", probs,
                f"b x a x s x s x ({4} + {e if e != 4 else 0}) B, b={D.b} a={a_loc} s={s}", 2)
            if arch.attention_dropout > 0:
                add("attention dropout mask and output", D.b * a_loc * s * D.s_full * (1 + e),
                    "b x a x s x s x (1 B mask + e B output)", 2)
        add("attention output (o_proj input)", e * T * hq, f"{e} B x T x a*d", 1)
    else:
        add("attention q, k, v saved by SDPA", e * T * (hq + 2 * hkv),
            f"{e} B x T x (a*d + 2 x kv*d) = {e} x {fmt_int(T)} x ({hq} + 2 x {hkv})", 3)
        add("attention output and logsumexp", e * T * hq + 4 * D.b * a_loc * s,
            f"{e} B x T x a*d + 4 B x b x a x s (fp32 logsumexp)", 2)

    # ----- MLP ------------------------------------------------------------------------------------
    moe = arch.is_moe
    k = arch.experts_per_token if moe else 1
    Tm = T * k
    if arch.mlp_activation in ("swiglu", "geglu"):
        add("MLP gate, up, act(gate), product" + (" (top-k routed)" if moe else ""), 4 * e * Tm * I,
            f"4 x {e} B x {'k x ' if moe else ''}T x I, I={I}" + (f", k={k}" if moe else ""), 4)
    else:
        add("MLP fc1 output, activation internals, fc2 input", 5 * e * Tm * I if arch.mlp_activation ==
            "gelu_tanh" else 2 * e * Tm * I, f"{5 if arch.mlp_activation == 'gelu_tanh' else 2} x {e} B x T x I",
            2)
    if moe:
        E = arch.num_experts
        add("MoE router logits, probabilities and routed token copies",
            (e + 4) * T * E + 2 * e * Tm * h,
            f"({e} + 4) B x T x E + 2 x {e} B x k x T x h, E={E}", 3)
    if arch.hidden_dropout > 0:
        add("residual dropout masks and outputs", 2 * (1 + e) * Tout * h, f"2 x (1 + {e}) B x T x h", 4)

    # ----- LoRA adapters --------------------------------------------------------------------------
    if lora:
        ab = ctx.adapter_bytes
        per_layer = [ad for ad in ctx.adapters if ad.base.scope == "layer"]
        layers = max(arch.num_layers, 1)
        in_copy = sum(ad.in_features * ad.base.count for ad in per_layer) / layers
        mid = sum(ad.rank * ad.base.count for ad in per_layer) / layers
        cast = ab != e or amp
        add("LoRA adapter inputs" + (" (cast copies)" if cast else ""), (ab if cast else 0) * T * in_copy,
            f"{ab} B x T x sum(in_features)={fmt_int(in_copy)} per layer", len(per_layer))
        add("LoRA A outputs", ab * T * mid, f"{ab} B x T x sum(rank)={fmt_int(mid)}", len(per_layer))
        if sc.method == "qlora":
            pass

    # ----- checkpointing ----------------------------------------------------------------------------
    if sc.activation_checkpointing == "full":
        out.checkpointed_layer = [Term("checkpointed layer inputs", r * Tout * h,
                                       f"{r} B x T x h per layer", 1)]

    # ----- model-level terms ------------------------------------------------------------------------
    V = D.V
    if arch.position == "rope":
        out.pre.append(Term("rotary cos/sin", 2 * e * D.b * s * D.d, f"2 x {e} B x b x s x d", 2))
    out.inputs.append(Term("input ids and labels", 16 * D.b * ctx.seq_len, "2 x 8 B x b x s (int64)", 2))
    if arch.norm == "rmsnorm":
        out.post.append(Term("final norm", 4 * Tout * h + 2 * r * Tout * h + 4 * Tout,
                             f"4 B x T x h + 2 x {r} B x T x h + 4 B x T", 4))
    else:
        out.post.append(Term("final norm", 2 * r * Tout * h + 8 * Tout, f"2 x {r} B x T x h + 8 B x T", 3))
    if V:
        le = 4 if recipe.fp32_compute else 2
        if sc.loss == "chunked":
            chunk = T * V / LOSS_CHUNKS
            out.post.append(Term("head input kept by the fused chunked loss", le * T * h, f"{le} B x T x h", 1))
            out.loss_backward.append(Term(f"one loss chunk's logits and fp32 log-softmax (1/{LOSS_CHUNKS})",
                                          (le + 8) * chunk, f"({le} + 2 x 4) B x T x V / {LOSS_CHUNKS}", 3))
        else:
            # HF: logits = lm_head(h) in the compute dtype; the loss upcasts them (.float()) and
            # log_softmax saves its fp32 output. The trainer drops the logits before backward.
            out.loss_forward.append(Term("logits" + (" and their fp32 upcast" if le != 4 else ""),
                                         (le + (4 if le != 4 else 0)) * T * V,
                                         f"({le}{' + 4' if le != 4 else ''}) B x T x V, V={V}", 1 if le == 4 else 2))
            out.post.append(Term("fp32 log-softmax saved by the loss", 4 * T * V, "4 B x T x V", 1))
            out.loss_backward.append(Term("loss backward: two fp32 T x V gradient buffers", 8 * T * V,
                                          "2 x 4 B x T x V", 2))

    # ----- backward transients of one layer --------------------------------------------------------
    out.layer_backward.append(Term("activation gradients of the layer in backward", 2 * e * T * I + 3 * e * T * h,
                                   f"2 x {e} B x T x I + 3 x {e} B x T x h", 5))
    if not eager:
        out.layer_backward.append(Term("flash-attention backward dq accumulator (fp32)", 4 * T * hq,
                                       "4 B x T x a*d (CUDA kernel scratch)", 1, "allocator"))
    if sc.method == "qlora":
        big = max((ad.base for ad in ctx.adapters), key=lambda g: g.numel_each, default=None)
        biggest = max((g.numel_each for g in arch.params if g.module and g.kind not in ("head", "embedding")),
                      default=0)
        if big is not None:
            out.layer_backward.append(Term("QLoRA dequantised weight of the layer in use", e * biggest,
                                           f"{e} B x largest Linear {fmt_int(biggest)}", 1))
    return out


def _megatron(ctx: Context) -> ActivationBudget:
    """Megatron-LM with fused kernels: Korthikanti et al. 2022 Table 2, generalised to any MLP width."""
    arch, sc = ctx.arch, ctx.scenario
    D = _Dims(ctx)
    t = D.tp
    s, b, h = D.s, D.b, arch.hidden_size
    mlp = 18 + 4 * arch.intermediate_size / h if arch.mlp_activation not in ("swiglu", "geglu") else \
        10 + 6 * arch.intermediate_size / h + 2
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
        out.checkpointed_layer = [Term("checkpointed layer inputs", 2 * s * b * h / (t if D.sp else 1),
                                       "2 B x s x b x h", 1)]
    out.inputs.append(Term("input ids and labels", 16 * b * ctx.seq_len, "2 x 8 B x b x s", 2))
    V = D.V
    out.post.append(Term("logits (fp32, vocab-parallel cross-entropy)", 4 * D.T * V, "4 B x T x V/t", 1))
    out.loss_backward.append(Term("cross-entropy backward buffer", 4 * D.T * V, "4 B x T x V/t", 1))
    out.layer_backward.append(Term("activation gradients of the layer in backward", 4 * D.T * h + 2 * D.T * D.I,
                                   "4 B x T x h + 2 B x T x I", 3))
    return out
