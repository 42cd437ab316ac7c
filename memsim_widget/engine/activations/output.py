"""What the model output holds: the KV cache HF builds in training (``use_cache``), held until the outputs are
dropped, and under ``output_lifetime`` "backward"/"step" the logits and cache the loop keeps alive beyond."""

from __future__ import annotations

from memsim_widget.engine.activations.budget import Term
from memsim_widget.engine.activations.layer import HFLayer
from memsim_widget.engine.frameworks import output_lifetime


def rope_bytes(st: HFLayer) -> int:
    """Bytes of a q or k element after RoPE (the cache's k): fp32 after autocast's fp32 RoPE, else the compute
    dtype (OLMo 2's RoPE casts q and k back to their input dtype)."""
    if st.arch.facts.position.rope_keeps_dtype:
        return st.ec
    return 4 if st.amp and st.arch.position == "rope" else st.ec


def builds_kv_cache(st: HFLayer) -> bool:
    """Whether the training forward builds a KV cache: the framework's model returns one (HF: ``use_cache`` on)
    for a causal model, which HF turns off under gradient checkpointing (the tracer's torchtitan-style
    ``selective-op`` too)."""
    return (
        st.prof.training_kv_cache
        and st.arch.causal
        and st.arch.facts.attention.use_cache
        and st.sc.activation_checkpointing not in ("full", "selective-op")
    )


def training_kv_cache(st: HFLayer) -> None:
    """The part of the training KV cache the layer does not save anyway (per layer, until the loss)."""
    arch, sc, out, amp, ec, eager = st.arch, st.sc, st.out, st.amp, st.ec, st.eager
    T, hkv, masked_frac = st.D.T, st.D.hkv, st.masked_frac
    # It holds each layer's k and v (after RoPE) until the outputs are dropped. Under SDPA these are the
    # tensors SDPA saves anyway, except autocast's fp32 k (SDPA saves a 16-bit cast); eager saves
    # repeated copies instead, so the cache is extra.
    kb = rope_bytes(st)
    kv_cache = builds_kv_cache(st)
    if kv_cache:
        # eager saves repeated copies; with MHA the cache tensors, and under Megatron's selective recompute the
        # checkpointed core's inputs, are the very k and v saved (attention._eager)
        gqa = arch.num_kv_heads < arch.num_heads and sc.activation_checkpointing != "selective"
        # Falcon's unfused bias under autocast makes v fp32 too (the fused projection's output is promoted; traced)
        fp32_kv = 2 if arch.facts.linear.unfused_bias else 1
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
    st.kb, st.kv_cache = kb, kv_cache


def loop_output(st: HFLayer) -> None:
    """The logits and KV cache the loop's model output keeps alive past the loss (``output_lifetime``)."""
    sc, prof, out, ec, kb, kv_cache = st.sc, st.prof, st.out, st.ec, st.kb, st.kv_cache
    T, V, hkv, upcast_loss, le = st.D.T, st.D.V, st.D.hkv, st.upcast_loss, st.le
    lifetime = output_lifetime(sc)
    if lifetime != "trainer":
        out.output_through_step = lifetime == "step"
        until = "the optimizer step ends" if out.output_through_step else "backward ends"
        if V and sc.loss != "chunked":  # the chunked loss fuses the head: the model returns no logits
            # fp32 when the model returns them so: torchtune's decoder, or a family's own ``.float()`` (Mamba,
            # Mamba-2: ``lm_head(h).float()``, transformers 5.24 ``modeling_mamba2.py``; traced)
            fp32 = prof.fp32_logits_output or st.arch.facts.output.fp32_logits
            lb = 4 if upcast_loss and fp32 else le
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
