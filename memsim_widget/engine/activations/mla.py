"""DeepSeek-V2/V3 multi-head latent attention: the compressed latents and their norms, the up-projected q, k and
v buffer, and what SDPA or the eager path keeps of them."""

from __future__ import annotations


def mla_attention(ctx, D, mla, add, consumers, attn_out, eager, amp, ec):  # noqa: ANN001, ANN201
    """DeepSeek-V2/V3 multi-head latent attention (``DeepseekV3Attention.forward``), per layer.

    The compressed latents: q_a_proj's and kv_a_proj_with_mqa's outputs go through their RMSNorms (fp32
    input, rsqrt, the normalised tensor when the weight trains), whose outputs q_b_proj and kv_b_proj save.
    Then the up-projected tensors attention keeps: q and k at a x (d_nope + d_rope) (both new tensors: a cat
    and the key buffer the k_nope / k_rope halves are copied into), and v, a view of kv_b_proj's output, so
    that whole a x (d_nope + d_v) buffer stays. SDPA adds its output (a x d_v), the fp32 logsumexp and
    o_proj's input, a contiguous copy of the output; eager the fp32 softmax and its 16-bit cast. Under tensor parallel the latents are replicated."""
    full, T, b, s = ctx.full_training, D.T, D.b, D.s
    a = D.a
    qr, kvr = mla.q_lora_rank, mla.kv_lora_rank
    dqk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    dv, nope = mla.v_head_dim, mla.qk_nope_head_dim
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
