"""Attention: what SDPA (its fused kernels or its math fallback) or the eager path saves per layer, the masks
some models hand it, and the fused projection outputs its views keep alive (DeepSeek's MLA is mla.py's)."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.activations.linears import ATTN_IN, ATTN_OUT
from memsim_widget.engine.activations.mla import mla_attention
from memsim_widget.engine.activations.output import builds_kv_cache, rope_bytes
from memsim_widget.units import fmt_int


def attention(st: HFLayer) -> None:
    """The layer's attention terms, by kernel; records whether its softmax is fp32 (the backward reads it)."""
    arch, D, add, eager, amp, ec = st.arch, st.D, st.add, st.eager, st.amp, st.ec
    T, b, s, hq, hkv = D.T, D.b, D.s, D.hq, D.hkv
    af = arch.facts.attention
    attn_out = ATTN_OUT | frozenset(af.output_modules)
    # llama-family eager attention runs softmax in fp32 and casts back; GPT-2, BERT, RoBERTa and ViT stay in the
    # compute dtype (the fp32 softmax is then the saved tensor itself) -- except under CUDA autocast, whose
    # op list runs softmax in fp32 for every model (torch.amp docs, "CUDA Ops that can autocast to
    # float32"; CPU autocast, which the tracer uses, keeps it in the input dtype)
    # eager softmax in the compute dtype: GPT-2, BERT, ViT (``softmax_in_compute_dtype``), Llama 4 and GPT-OSS
    # (``eager_softmax_dtype``); CUDA autocast runs it in fp32 for every model
    st.softmax_fp32 = af.softmax_upcast or amp
    mla = af.mla  # DeepSeek multi-head latent attention (families/deepseek.py)
    if mla:
        mla_attention(st.ctx, D, mla, add, st.consumers, attn_out, eager, amp, ec)
    elif not eager and af.sdpa_math_fallback:
        _math_fallback(st, attn_out)
    elif eager:
        _eager(st, attn_out)
    else:
        _sdpa(st, attn_out)

    # GPT-NeoX alike once no KV cache copies v (transformers 5.24 ``modeling_gpt_neox.py``
    # ``GPTNeoXAttention.forward``: ``qkv.chunk(3, dim=-1)``, then ``layer_past.update`` only with a cache, whose
    # ``DynamicLayer.update`` ``torch.cat``s k and v into new tensors, ``cache_utils.py``): under checkpointing
    # the recomputed layer keeps the whole query_key_value output (traced: GPT-NeoX h256 ckpt b2 s512, layer 0's
    # recompute holds the (T, 3h) addmm output beside the two torch.cat copies of q and k)
    kept = af.fused_qkv_kept or (af.fused_qkv_kept_without_cache and not builds_kv_cache(st))
    if kept and not mla and not eager:
        # ModernBERT: q and k leave Wqkv's [q | k | v] output through RoPE (new tensors), but v goes to SDPA as a
        # view of it, so the whole output stays saved: its q and k thirds on top of the tensors above (traced;
        # eager's matmul saves a contiguous copy of v instead and the output is freed)
        add(
            "fused Wqkv output kept alive by the v view (its q and k parts)",
            ec * T * (hq + hkv),
            f"{ec} B x T x (a*d + kv*d)",
            1,
        )
    sliding = af.sliding_layers if af.sliding_mask == "local" else 0
    if sliding and not eager and D.s_full >= (af.sliding_window or 0):
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


def _math_fallback(st: HFLayer, attn_out: frozenset[str]) -> None:
    """Falcon multi-query: k and v keep one head while q has a, which SDPA's fused kernels refuse (CUDA and
    CPU alike); the math fallback upcasts to fp32 and its matmuls save q, k and v expanded to all heads,
    and the fp32 probabilities; its 16-bit output (b, a, s, d) is copied to (b, s, a*d) for the
    out-projection (traced)."""
    # its matmuls broadcast k and v over the heads: with b = 1 the (1, a) batch folds into a stride-0 view,
    # with b > 1 reshaping the expanded tensor copies it (traced: Falcon-7B b1 s2048 and small b2 shapes)
    sc, D, add, consumers = st.sc, st.D, st.add, st.consumers
    T, b, s, hq, hkv, a_loc, ec = D.T, D.b, D.s, D.hq, D.hkv, D.a, st.ec
    kvw = hq if b > 1 else hkv
    add("attention q, k, v (fp32; k and v expanded to all heads when b > 1) saved by SDPA's math fallback",
        4 * T * (hq + 2 * kvw), f"4 B x T x (a*d + 2 x {kvw})", 3)  # fmt: skip
    if sc.activation_checkpointing != "selective":
        scores = b * a_loc * s * D.s_full
        add("attention probabilities (fp32, math SDPA)", 4 * scores,
            f"4 B x b x a x s x s, b={b} a={a_loc} s={s}", 1)  # fmt: skip
    consumers(attn_out, hq, T, ec, "attention output (b, s, a*d) copy", upstream=ATTN_IN)


def _eager(st: HFLayer, attn_out: frozenset[str]) -> None:
    """Eager attention: q, k, v (k, v repeated), the softmax and its cast (or with dropout its mask and output),
    Gemma 2's softcapping tanh, GPT-OSS's sinks; records which terms are the attention output.

    Under Megatron's selective recompute the core (transformers 5.24.0 ``models/llama/modeling_llama.py``
    ``eager_attention_forward``: ``repeat_kv``, the scores, the softmax, the product with v) runs under a
    non-reentrant ``torch.utils.checkpoint`` (torch 2.13.0 ``torch/utils/checkpoint.py``), which saves the core's
    inputs as they come: q and k after RoPE and v, k and v at their own kv heads (``repeat_kv`` runs inside). The
    repeated copies and the s x s tensors come back only in one layer's backward, when the recompute runs
    (``st.recomputed``, counted by backward.attention_backward). Traced on fake tensors with the core checkpointed
    (``tests/engine/test_selective_gqa.py``)."""
    arch, sc, D, add, consumers = st.arch, st.sc, st.D, st.add, st.consumers
    T, b, s, hq, hkv, a_loc, ec = D.T, D.b, D.s, D.hq, D.hkv, D.a, st.ec
    # "(eager: ...)" on the attention terms when the model class has no SDPA path (Gemma 2) and SDPA was asked for
    why = f" (eager: {arch.facts.attention.note})" if sc.attention != "eager" else ""
    softmax_fp32 = st.softmax_fp32
    # GPT-OSS appends one sink logit per head: the softmax covers s + 1 columns (the sink column is dropped
    # after it, a view: the probabilities stay whole), and max-subtraction keeps its int64 argmax per row
    sinks = arch.facts.attention.sinks
    # Falcon multi-query broadcasts its one k/v head in the matmuls: a stride-0 view when b = 1 (traced)
    rkv = hkv if arch.facts.attention.sdpa_math_fallback and b == 1 else hq
    if sc.activation_checkpointing == "selective":
        _selective_inputs(st, rkv, why)
    else:
        add(
            "attention q, k, v (k, v repeated to all heads)" + why,
            ec * T * (hq + 2 * rkv),
            f"{ec} B x T x (a*d + 2 x {rkv})",
            3,
        )
    selective = sc.activation_checkpointing == "selective"

    def recompute(name: str, nbytes: float, *_: object, **__: object) -> None:  # noqa: ARG001
        st.recomputed += nbytes

    core = recompute if selective else add

    scores = b * a_loc * s * (D.s_full + sinks)
    if arch.facts.attention.logit_softcapping:
        # Gemma 2: scores / cap -> tanh -> x cap; tanh saves its output for backward (the divisions
        # and products by a Python scalar save nothing)
        core(
            "attention logit softcapping: tanh output",
            ec * scores,
            f"{ec} B x b x a x s x s, b={b} a={a_loc} s={s}",
            1,
        )
    sm = 4 if softmax_fp32 else ec
    if sinks:
        core(
            "attention sinks: max indices",
            8 * b * a_loc * s,
            f"8 B x b x a x s, b={b} a={a_loc} s={s}",
        )
    if arch.attention_dropout > 0:
        core(
            "attention softmax, dropout mask and output",
            scores * (sm + 1 + ec),
            f"b x a x s x s x ({sm} + 1 + {ec}) B, b={b} a={a_loc} s={s}",
            3,
            shares=(sm / (sm + 1 + ec), 1 / (sm + 1 + ec), ec / (sm + 1 + ec)),
        )
    else:
        extra = ec if sm != ec else 0
        core(
            "attention softmax"
            + (" (fp32) and its 16-bit cast" if extra else "")
            + (" (+ sink column)" if sinks else ""),
            scores * (sm + extra),
            f"b x a x s x {'(s + 1)' if sinks else 's'} x ({sm} + {extra}) B, b={b} a={a_loc} s={s}",
            2 if extra else 1,
            shares=(sm / (sm + extra), extra / (sm + extra)) if extra else (),
        )
    st.ao_from = len(st.L)
    consumers(attn_out, hq, T, ec, "attention output", upstream=ATTN_IN)
    st.ao_to = len(st.L)


def _selective_inputs(st: HFLayer, rkv: int, why: str) -> None:
    """What the checkpointed eager core saves (its inputs: q and k as RoPE returns them, fp32 under autocast; v
    at kv width), and in ``st.recomputed`` what its recompute holds beside them, the s x s tensors aside, when
    the softmax runs backward: the batched product's contiguous copy of q (RoPE's output keeps the per-head
    transposed layout of q_proj's view, so ``matmul`` copies it to fold the heads into the batch; under autocast
    the copy of its 16-bit cast, the cast itself released), and k as the product reads it, ``repeat_kv``'s copy
    or its 16-bit cast (none when k is used as saved: one query head per kv head, no cast). ``repeat_kv``'s copy
    of v and its fp32 repeat of k under autocast are released by then (the probabilities' product with v ran its
    backward first; the cast is what the product saved). Traced, Llama h256 b2 s256: bf16 GQA 2 x 2 B x T x a*d,
    MHA 2 B x T x a*d, amp-bf16 GQA 2 x 2 B x T x a*d (``tests/engine/test_selective_gqa.py``)."""
    D, ec = st.D, st.ec
    T, hq, hkv = D.T, D.hq, D.hkv
    qk = rope_bytes(st)
    st.add(
        "attention q, k, v saved by the checkpointed core (k, v at kv width)" + why,
        qk * T * (hq + hkv) + ec * T * hkv,
        f"{qk} B x T x (a*d + kv*d) + {ec} B x T x kv*d",
        3,
        shares=(qk * hq / (qk * (hq + hkv) + ec * hkv),
                qk * hkv / (qk * (hq + hkv) + ec * hkv), ec * hkv / (qk * (hq + hkv) + ec * hkv)),
    )  # fmt: skip
    if st.arch.causal:
        # the model's one additive causal mask (transformers 5.24.0 masking_utils.eager_mask: b x 1 x s x s in the
        # model's dtype, fp32 weights under autocast), an input of every checkpointed core: saved until layer 0's
        # backward (a model-level tensor: counted once, beside the rotary tables)
        st.out.pre.append(
            Term(
                "eager causal mask saved by the checkpointed cores",
                st.r * D.b * D.s * D.s_full,
                f"{st.r} B x b x s x s, b={D.b} s={D.s}",
            )
        )
    repeated = rkv != hkv
    cast = qk != ec
    st.recomputed = ec * T * (hq + (rkv if cast or repeated else 0))


def _sdpa(st: HFLayer, attn_out: frozenset[str]) -> None:
    """SDPA's fused kernels: q, k, v (k, v at kv width), the output and the fp32 logsumexp, plus the masks some
    models pass it (Llama 4's chunks, Gemma 3's sliding or image layers, Falcon's float bias); records the share
    of masked layers (their KV cache is extra)."""
    arch, D, add, consumers = st.arch, st.D, st.add, st.consumers
    T, b, s, hq, hkv, a_loc, ec = D.T, D.b, D.s, D.hq, D.hkv, D.a, st.ec
    fused_no_rope = "c_attn" in st.modules and arch.position != "rope"
    add(
        "attention q, k, v saved by SDPA",
        ec * T * (hq + 2 * hkv),
        f"{ec} B x T x (a*d + 2 x kv*d) = {ec} x {fmt_int(T)} x ({hq} + 2 x {hkv})",
        3,
        shares=(hq / (hq + 2 * hkv), hkv / (hq + 2 * hkv), hkv / (hq + 2 * hkv)),
    )
    # Llama 4's chunked layers past attention_chunk_size: HF passes SDPA an explicit mask, so k and v are
    # repeated to every head (no GQA in SDPA with a mask) and SDPA keeps the mask converted to the compute
    # dtype (b x s x s), per chunked layer (traced with a small chunk)
    af = arch.facts.attention
    chunk = af.chunk_size
    if chunk and D.s_full > chunk and af.chunked_layers:
        frac = af.chunked_layers / max(arch.num_layers, 1)
        add(
            "chunked attention: SDPA's mask and k, v repeated to all heads",
            frac * (ec * b * s * D.s_full + 2 * ec * T * (hq - hkv)),
            f"{af.chunked_layers}/{arch.num_layers} layers x ({ec} B x b x s x s"
            f" + 2 x {ec} B x T x (a*d - kv*d)), s > chunk {chunk}",
            3,
        )
    if af.sdpa_fused_qkv_view:
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
        shares=(
            ec * T * hq / (ec * T * hq + 4 * b * a_loc * s),
            4 * b * a_loc * s / (ec * T * hq + 4 * b * a_loc * s),
        ),
    )
    # Gemma 3's sliding layers once s >= sliding_window: transformers cannot skip their mask (masking_utils
    # _ignore_causal_mask_sdpa), so it repeats k and v to all heads (use_gqa_in_sdpa needs no mask) and
    # PyTorch turns the boolean mask into an additive one in the compute dtype, b x 1 x s x s, which SDPA
    # saves; per layer, the average over the layers (traced). With one KV head the repeat is a view (no copy).
    kinds, window = af.layer_types, af.sliding_window
    n_sliding = sum(k == "sliding_attention" for k in kinds or ())
    if not (window and D.s_full >= window):
        n_sliding = 0
    # Gemma 3 multimodal, fed token_type_ids as its processor returns them (image tokens attend both ways): the
    # blockwise mask function makes HF build a mask for every layer, with or without images in the batch (traced)
    image_masks = arch.facts.vision is not None and arch.facts.vision.image_mask_all_layers
    if image_masks and kinds:
        n_sliding = len(kinds)
    if af.sliding_mask == "decoder" and n_sliding and kinds:
        frac = n_sliding / len(kinds)
        rep = 2 * ec * T * (hq - hkv) if D.kv > 1 else 0
        st.masked_frac = frac if rep else 0.0
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
    if af.sdpa_float_mask:
        # a model passing an explicit boolean mask (Falcon) gets it cast to a float bias per call, which the
        # fused kernel saves for backward (CPU flash; CUDA's memory-efficient kernel alike)
        add("attention mask cast to a float bias, saved by SDPA", ec * b * s * D.s_full,
            f"{ec} B x b x s x s, b={b} s={s}", 1)  # fmt: skip
    # q built by torch.cat (partial rotary) is contiguous per head: SDPA's output is then (b, a, s, d) in memory
    # and the transpose to (b, s, a*d) is a copy, which the out-projection saves (traced: GPT-NeoX, Phi)
    copied = af.sdpa_output_copy
    label = "attention output" + (" (b, s, a*d) copy" if copied else "")
    consumers(attn_out, hq, T, ec, label, already_saved=not copied, upstream=ATTN_IN)
