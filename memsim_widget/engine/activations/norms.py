"""Norms: each layer's (RMSNorm or LayerNorm, with what the Linears reading their output keep), the q/k norms
some families add, and the model-level ones (final norm, BERT's embedding LayerNorm, ModernBERT's final one)."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.activations.linears import ATTN_IN, ATTN_OUT, MLP_IN
from memsim_widget.engine.activations.mlp import parallel_mlp
from memsim_widget.units import fmt_int


def layer_norms(st: HFLayer) -> None:
    """A layer's norms, then the Linears reading their output (attention input, MLP input)."""
    arch, D, add, consumers = st.arch, st.D, st.add, st.consumers
    T, Tout, h, r, full = D.T, D.Tout, D.h, st.r, st.full
    frozen_first, gemma, cw, onep, targets, modules = (
        st.frozen_first, st.gemma, st.cw, st.onep, st.targets, st.modules
    )  # fmt: skip
    ec, nout = st.ec, st.nout
    nf = arch.facts.norm
    norms = nf.per_layer
    # under LoRA nothing before the first adapter needs a gradient: layer 0's first norm saves nothing
    frozen = "; layer 0's first norm saves nothing (frozen embeddings)" if frozen_first else ""
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
            if frozen_first and not (nf.post_norms and targets & (ATTN_IN | ATTN_OUT))
            else 0,
            # per norm: its fp32 input, then the rsqrt (and Gemma's fp32 1 + w), as the norm makes them
            shares=tuple(x / per_norm for x in (cw * Tout * h, 4 * Tout) + ((onep * h,) if gemma else ())),
        )
        # Gemma and OLMo 2 multiply by the weight in fp32: the normalised tensor they save is fp32
        nb = 4 if gemma or nf.weight_fp32 else r
        # GLM-4's post-norms read 16-bit projection outputs: their normalised tensor is cast back to 16 bits
        n16 = nf.post_norms_16bit if nb == r and not gemma else 0
        if full:
            add(
                "RMSNorm normalised tensors",
                ((norms - n16) * nb + n16 * ec) * Tout * h,
                f"{norms} norms x {nb} B x T x h" + (f" ({n16} of them {ec} B)" if n16 and ec != nb else ""),
                norms,
            )
        late = _late_norms(st)  # the norms after the attention core (GLM-4's two 16-bit ones among them)
        st.late_norm = late * per_norm + (((late - n16) * nb + n16 * ec) * Tout * h if full else 0)
    else:
        per_norm = r * Tout * h + 8 * Tout
        st.late_norm = _late_norms(st) * per_norm
        parallel_branches = parallel_mlp(arch)
        # norms reading one tensor save it once (GPT-NeoX's parallel residual: both norms read the layer input)
        shared = norms - nf.inputs
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
            if frozen_first and not (nf.first_after_attention and targets & (ATTN_IN | ATTN_OUT))
            else (per_norm if nf.first_layer < norms else 0),
        )
    # under sequence parallel the block's input is all-gathered to the full sequence first (DTensor
    # PrepareModuleInput Shard(1) -> Replicate); the Linears save that gathered tensor (traced)
    st.ssm_from = len(st.L)  # state-space layers have neither of the next two Linear inputs
    consumers(ATTN_IN, h, T, nout, "attention input", upstream=frozenset())
    # Phi: one norm's output feeds q, k, v and fc1; saved once when the attention side saved it already
    shared_in = arch.facts.mlp.parallel_attn_mlp and (full or bool(ATTN_IN & modules & targets))
    # BERT-style encoders name three Linears "dense": the one reading the attention block's norm is named by the family
    mlp_in = MLP_IN | frozenset(arch.facts.mlp.input_modules)
    st.mi_from = len(st.L)
    consumers(mlp_in, h, T, nout, "MLP input", already_saved=shared_in, upstream=ATTN_IN | ATTN_OUT)
    st.mi_to = len(st.L)


def _late_norms(st: HFLayer) -> int:
    """The block's norms after its attention core (differentiated before it): all but the input norm in a
    pre-norm block (Llama 1, Gemma 2/3 and GLM-4 3: their post-norms and the MLP's pre-norm), all of them where the
    first norm reads the attention's output (OLMo 2's post-norms, BERT's post-norm block)."""
    nf = st.arch.facts.norm
    return nf.per_layer - (0 if nf.post_norms or nf.first_after_attention else 1)


def qk_norms(st: HFLayer) -> None:
    """Norms on the attention's q and k: Qwen3's per head ("head"), OLMo 2's over the projection ("full"),
    Llama 4's weightless L2 norm, Phi's per-head LayerNorm."""
    arch, D, add = st.arch, st.D, st.add
    T, hq, hkv, ec, full = D.T, D.hq, D.hkv, st.ec, st.full
    frozen_first, gemma, cw, onep, targets = st.frozen_first, st.gemma, st.cw, st.onep, st.targets
    # ----- q/k norms (Qwen3 "head": per head over d; OLMo 2 "full": over the whole projection) ----------------
    # HF RMSNorm on the q_proj / k_proj outputs (compute dtype): its fp32 input, the rsqrt per row and, if its
    # weight trains, the normalised tensor in the compute dtype. Nothing when the projection's output needs no
    # gradient (layer 0 under LoRA unless that projection carries an adapter; traced).
    nf = arch.facts.norm
    qk_norm = nf.qk
    if qk_norm in ("head", "full"):
        for label, width, n_heads, proj in (("q", hq, D.a, "q_proj"), ("k", hkv, D.kv, "k_proj")):
            rows = n_heads if qk_norm == "head" else 1
            nn = 4 if gemma or nf.weight_fp32 else ec
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
                # its fp32 input, the rsqrt per row, the normalised tensor (Gemma 3's (1 + w) rides on the input)
                shares=tuple(
                    x / nb
                    for x in (cw * T * width + onep * D.d, 4 * T * rows) + ((nn * T * width,) if full else ())
                ),
            )

    # Llama 4's qk_norm: a weightless L2 norm per head on RoPE layers only (``qk_norm_layers`` of them): its
    # fp32 input copy and rsqrt per row (traced); averaged over the layers like the MoE parts
    if qk_norm == "l2":
        n_l2 = arch.num_layers if nf.qk_layers is None else nf.qk_layers
        frac = n_l2 / max(arch.num_layers, 1)
        sizes = {"q_proj": 4 * T * hq + 4 * T * D.a, "k_proj": 4 * T * hkv + 4 * T * D.kv}
        # layer 0 (a RoPE layer) keeps nothing for a projection whose output needs no gradient (LoRA; traced)
        free0 = frozen_first and arch.facts.position.rope_layer0
        add(
            "q/k L2 norm fp32 inputs and rsqrt",
            frac * sum(sizes.values()),
            f"{n_l2}/{arch.num_layers} layers x (4 B x T x (a*d + kv*d) + 4 B x T x (a + kv))",
            4,
            first_bytes=sum(nb for proj, nb in sizes.items() if proj not in targets) if free0 else 0,
        )

    # Phi's qk_layernorm: LayerNorm (with bias) per head on the q and k views; it saves its input and, per
    # row, mean and rstd (its output feeds RoPE's multiplies, which save cos/sin only)
    if nf.qk_layernorm and arch.norm == "layernorm":
        nb = ec * T * (hq + hkv) + 8 * T * (D.a + D.kv)
        add(
            "q/k LayerNorm inputs, mean and rstd",
            nb,
            f"{ec} B x T x (a*d + kv*d) + 8 B x T x (a + kv)",
            6,
            first_bytes=nb if frozen_first and not (targets & {"q_proj", "k_proj"}) else 0,
        )


def final_norms(st: HFLayer) -> None:
    """The model-level norms: the final norm (last stage), BERT's embedding LayerNorm, ModernBERT's final one."""
    arch, D, out = st.arch, st.D, st.out
    Tout, h, r, full = D.Tout, D.h, st.r, st.full
    frozen_first, gemma, cw, onep = st.frozen_first, st.gemma, st.cw, st.onep
    if arch.norm == "rmsnorm":
        fnb = 4 if gemma or arch.facts.norm.weight_fp32 else r
        fn = cw * Tout * h + 4 * Tout + (fnb * Tout * h if full else 0) + onep * h
        out.post.append(
            Term(
                "final norm",
                fn,
                "4 B x T x h + 4 B x T"
                + (f" + {fnb} B x T x h" if full else "")
                + (" + 4 B x h" if onep else ""),
                3 if full or onep else 2,
                # its fp32 input, the rsqrt, the normalised tensor: one share per tensor. Under LoRA the frozen
                # weight's product (transformers 5.24.0 LlamaRMSNorm.forward: weight * x.to(dtype)) keeps no
                # normalised tensor (torch 2.13 derivatives.yaml, mul: each factor is saved for the other's
                # gradient only): two tensors, the fp32 input (4 B x T x h, a large-pool block) and the rsqrt,
                # where an even split of three made requests of under 1 MiB on the small Llama (docs/allocator.md,
                # "LoRA under ZeRO-3"); Gemma's fp32 (1 + w) is the third there, its sizes not split
                shares=_final_shares(cw * Tout * h, 4 * Tout, fnb * Tout * h if full else 0, fn)
                if not onep
                else (),
            )
        )
    else:
        out.post.append(Term("final norm", r * Tout * h + 8 * Tout, f"{r} B x T x h + 8 B x T", 3))
    # BERT-style encoders: the embeddings' LayerNorm input (nothing under LoRA: the embeddings need no gradient)
    if arch.facts.norm.embedding and not frozen_first:
        out.pre.append(
            Term(
                "embeddings LayerNorm input, mean and rstd",
                r * Tout * h + 8 * Tout,
                f"{r} B x T x h + 8 B x T",
                3,
            )
        )
    if arch.facts.norm.final:  # ModernBERT: the encoder's own final LayerNorm before the MLM head's
        out.post.append(
            Term(
                "encoder final LayerNorm input, mean and rstd",
                r * Tout * h + 8 * Tout,
                f"{r} B x T x h + 8 B x T",
                3,
            )
        )


def _final_shares(inp: float, rsqrt: float, normed: float, total: float) -> tuple[float, ...]:
    """The final RMSNorm's shares of its bytes ``total``: its fp32 input, the rsqrt and, where the weight trains,
    the normalised tensor (``normed`` 0: none saved)."""
    return tuple(x / total for x in (inp, rsqrt, normed) if x)
