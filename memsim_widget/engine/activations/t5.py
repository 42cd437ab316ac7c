"""T5 (encoder-decoder): its blocks' own rules, which replace the decoder-only ones -- per layer averaged over
the encoder's and the decoder's blocks, and under full checkpointing one decoder block recomputed."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import ActivationBudget, Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.activations.linears import ATTN_OUT, MLP_IN, MLP_OUT
from memsim_widget.units import fmt_int


def t5_layer(st: HFLayer) -> None:
    """Replace the layer's terms by T5's blocks; records the decoder softmax backward the backward rules read."""
    ctx, D, add, consumers, out, L, sc = st.ctx, st.D, st.add, st.consumers, st.out, st.L, st.sc
    r, ec, amp, eager = st.r, st.ec, st.amp, st.eager
    del L[:]
    st.t5_sm = t5_blocks(ctx, D, add, consumers, out, r, ec, amp, eager)
    if sc.activation_checkpointing == "full":
        # the layer recomputed in backward is a decoder block (the first run backward), not the average
        kept, scratch = list(L), ActivationBudget()
        del L[:]
        t5_blocks(ctx, D, add, consumers, scratch, r, ec, amp, eager, stacks=(0, 1))
        dec = sum(t.bytes for t in L)
        L[:] = kept
        out.recomputed_layer = [
            Term("recomputed decoder block", dec, f"{fmt_int(dec)} B (one decoder block)", 1)
        ]
    elif out.forward_top:
        _decoder_cache_and_softmax_top(st)
    st.mlp_from = st.ao_from = st.ao_to = st.mlp_to = 0


def _decoder_cache_and_softmax_top(st: HFLayer) -> None:
    """Where the decoder's self-attention runs SDPA's math path (the position bias trains) in 16 bits: the decoder's
    self-attention KV cache (``cache_per_layer``) and, under autocast, the top of the forward at the last decoder
    block's softmax (``forward_top``'s instant where larger than the final norm's and ``wo``'s).

    The cache: ``T5Attention.forward`` (transformers 5.24.0 ``models/t5/modeling_t5.py`` line 331) stores each
    decoder block's k and v in the model output's ``EncoderDecoderCache`` (``DynamicLayer.update``'s ``torch.cat``
    copies them), which the math path does not save (it saves fp32 copies): 2 x 2 B x T x a*d per decoder block,
    held until the outputs are dropped. The softmax: the last decoder block's self-attention has made, beside what
    its earlier ops saved, the fp32 scores (``bmm``, 4 B x b x a x s x s), the position bias plus causal mask
    (4 B x a x s x s) and autocast's 16-bit cast of it, the fp32 copies of q and k and the scaled q (3 x 4 B x T x
    a*d), q's 16-bit projection and the norm's fp32 output (4 B x T x h, held by ``T5LayerSelfAttention``, line
    395); what the block saves after it (its o, cross-attention and feed-forward sub-layers, their norms and
    autocast weight copies) does not exist yet. Traced (t5 h256 amp-bf16 b2 s512, full training) at
    ``_safe_softmax``."""
    ctx, D, out, L, ec, amp = st.ctx, st.D, st.out, st.L, st.ec, st.amp
    arch = ctx.arch
    if not ctx.full_training or st.eager or ec != 2:
        return
    T, h, hq, a, s, b = D.T, D.h, D.hq, D.a, D.s, D.b
    nd, n = arch.decoder_layers, max(arch.num_layers, 1)
    out.cache_per_layer.append(
        Term("decoder self-attention KV cache (EncoderDecoderCache), held by the model output",
             2 * ec * T * hq * nd / n, f"{nd}/{n} layers x 2 x {ec} B x T x a*d", 2)
    )  # fmt: skip
    if not amp:
        return
    # one decoder block's saved tensors (the rules on one decoder block, as under checkpointing)
    kept = list(L)
    del L[:]
    t5_blocks(ctx, D, st.add, st.consumers, ActivationBudget(), st.r, ec, amp, st.eager, stacks=(0, 1))
    block = [(t.name, t.bytes) for t in L]
    L[:] = kept
    later_sub = sum(
        v for k, v in block if k.startswith(("cross-attention", "feed-forward", "attention output"))
    )
    norms = sum(v for k, v in block if k.startswith("T5LayerNorm"))  # its three norms; the first ran
    self_qkv = ("layer.0.SelfAttention.q.", "layer.0.SelfAttention.k.", "layer.0.SelfAttention.v.")
    later_w = sum(
        g.numel // max(g.count, 1)
        for g in arch.params
        if g.scope == "layer" and g.stack == "decoder" and g.module and not any(x in g.name for x in self_qkv)
    )
    later = later_sub + 2 * norms / 3 + 2 * later_w
    made = 4 * b * a * s * D.s_full + (4 + 2) * a * s * D.s_full + 3 * 4 * T * hq + ec * T * hq + 4 * T * h
    top = Term(
        "last decoder block's self-attention softmax (math SDPA), less what the block saves after it",
        made - later,
        f"4 B x b x a x s x s + (4 + 2) B x a x s x s + 3 x 4 B x T x a*d + {ec} B x T x a*d + 4 B x T x h "
        f"- {fmt_int(later)} B saved after it",
        6,
    )
    if top.bytes > out.forward_top[-1].bytes:
        out.forward_top[-1] = top


def t5_blocks(ctx, D, add, consumers, out, r, ec, amp, eager, stacks=None):  # noqa: ANN001, ANN201
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
    t = _T5Blocks(ctx, D, add, consumers, out, r, ec, amp, eager, stacks)
    per_norm = _norms(t)
    _linears(t)
    _attention(t)
    ff = _feed_forward(t)
    if stacks is None and t.sc.activation_checkpointing == "none":
        _forward_top(t)
    return _dropout_final_norm_and_backward(t, per_norm, ff)


class _T5Blocks:
    """What T5's block rules share: sizes, dtypes, the two stacks' block counts and the average over them."""

    def __init__(self, ctx, D, add, consumers, out, r, ec, amp, eager, stacks):  # noqa: ANN001
        arch, sc = ctx.arch, ctx.scenario
        self.ctx, self.arch, self.sc, self.D, self.add, self.consumers, self.out = (
            ctx,
            arch,
            sc,
            D,
            add,
            consumers,
            out,
        )
        self.r, self.ec, self.amp, self.eager, self.stacks = r, ec, amp, eager, stacks
        ne, nd = stacks or (arch.encoder_layers, arch.decoder_layers)
        self.ne, self.nd = ne, nd
        # under checkpointing T5Attention marks the cross-attention's zero bias as needing a gradient: math path too
        self.ckpt = sc.activation_checkpointing == "full"
        self.selective = sc.activation_checkpointing == "selective"
        self.n = n = max(ne + nd, 1)
        self.full = ctx.full_training
        self.targets = {ad.base.module for ad in ctx.adapters}
        self.p = arch.attention_dropout
        self.bass = D.b * D.a * D.s * D.s_full
        self.frozen0 = not self.full and sc.activation_checkpointing in ("none", "selective")
        self.share = f"({ne} encoder x {{e}} + {nd} decoder x {{d}}) / {n} layers"
        self.grad_bias = self.full  # relative_attention_bias trains: position_bias needs a gradient
        self.enc_saved = False  # the encoder output is itself saved (by every cross-attention k/v): _linears

    def avg(
        self, name: str, enc: float, dec: float, formula: str, tensors: int = 1, first: float = 0.0
    ) -> None:
        """Add a term of ``enc`` bytes per encoder block and ``dec`` per decoder block, averaged over the layers."""
        self.add(name, (self.ne * enc + self.nd * dec - first) / self.n, formula, tensors)


def _norms(t: _T5Blocks) -> float:
    """The T5LayerNorms: 2 per encoder block, 3 per decoder block; returns one norm's bytes."""
    D, r, full, frozen0, share, avg = t.D, t.r, t.full, t.frozen0, t.share, t.avg
    T, h = D.T, D.h
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
    return per_norm


def _linears(t: _T5Blocks) -> None:
    """The Linears reading the norms' outputs; the cross-attention's k and v read the encoder output."""
    ctx, D, add, consumers, out = t.ctx, t.D, t.add, t.consumers, t.out
    r, ec, amp, nd, n, full, targets = t.r, t.ec, t.amp, t.nd, t.n, t.full, t.targets
    T, h = D.T, D.h
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
        t.enc_saved = True
    elif hit:
        cb = 2 if amp else ctx.adapter_bytes
        add(
            "cross-attention k/v: copies of the encoder output",
            len(hit) * cb * T * h * nd / n,
            f"{nd}/{n} layers x {len(hit)} x {cb} B x T x h",
            len(hit),
        )


def _attention(t: _T5Blocks) -> None:
    """Self- and cross-attention: eager, fused SDPA, or SDPA's math path when the position bias needs a gradient."""
    arch, D, add, consumers, out = t.arch, t.D, t.add, t.consumers, t.out
    ec, amp, eager, stacks, ne, nd, n = t.ec, t.amp, t.eager, t.stacks, t.ne, t.nd, t.n
    ckpt, selective, full, p, bass = t.ckpt, t.selective, t.full, t.p, t.bass
    share, avg, grad_bias = t.share, t.avg, t.grad_bias
    T, b, s, a, hq = D.T, D.b, D.s, D.a, D.hq
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
    attn_out = ATTN_OUT | frozenset(arch.facts.attention.output_modules)
    consumers(attn_out, hq, T * (ne + 2 * nd) / n, ec, "attention output (b, s, a*d) copy")
    if full:
        # relative position buckets (int64 s x s) kept by each stack's bias embedding
        out.pre.append(Term("relative position buckets (int64), one per stack", 2 * 8 * s * D.s_full,
                            "2 x 8 B x s x s", 2))  # fmt: skip


def _feed_forward(t: _T5Blocks) -> float:
    """The feed-forward (``feed_forward_proj``); returns the bytes its backward releases."""
    ctx, arch, D, add, consumers = t.ctx, t.arch, t.D, t.add, t.consumers
    ec, amp, full, targets, p = t.ec, t.amp, t.full, t.targets, t.p
    T, I = D.T, D.I
    # T5Config's feed_forward_proj: "relu" saves the ReLU output once (the ReLU backward and wo share it);
    # otherwise the activation's own tensors, for gated ones the product's two operands, and wo's input.
    # "gated-gelu" runs gelu_new, a pointwise chain saving x, tanh(.), 0.5 x and 1 + tanh(.) (traced)
    proj = arch.facts.mlp.feed_forward_proj
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
    return ff


def _dropout_final_norm_and_backward(t: _T5Blocks, per_norm: float, ff: float) -> tuple[float, str]:
    """Dropout masks, the encoder's final norm, and the decoder self-attention's softmax backward (math path) as
    (bytes, formula)."""
    D, out, r, ec, eager, full = t.D, t.out, t.r, t.ec, t.eager, t.full
    p, bass, share, avg, grad_bias = t.p, t.bass, t.share, t.avg, t.grad_bias
    T, h, b, s, a, hq = D.T, D.h, D.b, D.s, D.a, D.hq
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


def _forward_top(t: _T5Blocks) -> None:
    """The top of the forward (``forward_top``): what the decoder stack holds until it returns, beside the larger of
    two instants of its last ops (each with what it makes that nothing saved counts yet); where it is larger than
    the head's and the loss's forward (V small beside I, e.g. the fidelity shapes), ``forward_end`` takes it.

    Held (transformers 5.24.0 ``models/t5/modeling_t5.py``): the decoder's position bias, the embedding's
    (q, k, a) output (``compute_bias`` lines 278-279, in the weights' dtype) that ``T5Stack.forward`` passes to
    every block (line 741) until it returns; the encoder output (``hidden_states``, line 1027) unless saved; the
    decoder's embeddings (line 683, alive as ``inputs_embeds`` until line 745) when block 0's first norm saves
    nothing (frozen embeddings); ``_shift_right``'s int64 decoder input ids (line 1031, ``new_zeros``, 8 B x T).
    Instants: (a) the decoder's final ``T5LayerNorm`` (lines 66-73) at its last op: what it saves, the variance
    (4 B x T), ``x * rsqrt`` (4 B x T x h) and its 16-bit cast (16-bit weights) or the fp32 ``weight * x``;
    (b) under autocast, the last block's ``wo`` matmul (``T5DenseActDense.forward`` lines 92-94 and the gated
    one's 120-123: the fp32 weight makes ``.to(fp32)`` a 4 B x T x I copy, autocast casts it back for ``mm``,
    a 2 B x T x I copy saved only when ``wo`` trains), with the feed-forward norm's fp32 output
    (``T5LayerFF.forward`` line 139: ``wi`` saves its own 16-bit copy) and the 2 B x T x h matmul output."""
    ctx, D, out, r, ec, amp, full, frozen0 = t.ctx, t.D, t.out, t.r, t.ec, t.amp, t.full, t.frozen0
    T, h, I, a, s = D.T, D.h, D.I, D.a, D.s
    pb = ctx.recipe.weight_bytes
    held = [Term("decoder position bias (1, a, s, s), held by the decoder stack", pb * a * s * D.s_full,
                 f"{pb} B x a x s x s", 1)]  # fmt: skip
    if not t.enc_saved:
        held.append(Term("encoder output, held by the model's forward", r * T * h, f"{r} B x T x h", 1))
    if frozen0:
        held.append(Term("decoder embeddings (inputs_embeds), held by the decoder stack", pb * T * h,
                         f"{pb} B x T x h", 1))  # fmt: skip
    held.append(Term("decoder input ids (_shift_right of the labels, int64)", 8 * T, "8 B x T", 1))
    # (a) the final norm: its saved tensors (as a block's, _norms) with the variance, x * rsqrt and its output
    w16 = r != 4  # 16-bit norm weights: x * rsqrt is cast to them before the weight multiplies
    saved = 4 * T * h + 4 * T + (r * T * h if w16 else 0)
    norm = saved + 4 * T + 4 * T * h + (ec if w16 else 4) * T * h
    fnorm = (f"4 B x T x h + 4 B x T{f' + {r} B x T x h' if w16 else ''} saved, 4 B x T variance, 4 B x T x h "
             f"x * rsqrt, {ec if w16 else 4} B x T x h output")  # fmt: skip
    top = Term("decoder final T5LayerNorm at its last op", norm, fnorm, 4 if w16 else 3)
    if amp:
        # (b) the last block's wo under autocast: the norm's fp32 output, the fp32 and 16-bit copies, the output
        wo_in = bool(full or (MLP_OUT & set(ctx.linear_modules) & t.targets))
        ff = r * T * h + 4 * T * I + (0 if wo_in else 2 * T * I) + 2 * T * h
        if ff > norm:
            f = f"{r} B x T x h norm output + 4 B x T x I{'' if wo_in else ' + 2 B x T x I'} + 2 B x T x h, I={I}"
            top = Term("last decoder block's wo matmul under autocast: the fp32 input copy and its cast", ff, f,
                       3 if wo_in else 4)  # fmt: skip
    out.forward_top.extend([*held, top])
