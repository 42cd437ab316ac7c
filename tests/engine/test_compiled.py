"""``compile: true`` in the engine: the saved set of Inductor's partitioner for the HF Llama layout
(engine/activations/compiled.py), held to a trace of the compiled step (tests/trace/test_trace_compiled.py)."""

from __future__ import annotations

from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario


def test_the_engine_counts_the_partitioners_saved_set_for_a_compiled_llama() -> None:
    """Llama 3.2 1B, bf16, b4 s1024 (the H200 run's scenario), counted by hand from the compiled trace's saved
    tensors (docs/fidelity.md): per layer 4 e T h (residuals, norm outputs) + 2 e T h (q, attention output)
    + 2 e T kv d (k, v) + 3 e T I (gate, up, down input) + 4 T a (logsumexp) + 8 T (rsqrt); the loss's backward
    at the top of backward with every saved tensor alive."""
    sc = Scenario.from_dict(
        {"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 1024, "compile": True}
    )
    T, h, I, kvd, a, V, L, e = 4096, 2048, 8192, 512, 32, 128256, 16, 2
    per_layer = 4 * e * T * h + 2 * e * T * h + 2 * e * T * kvd + 3 * e * T * I + 4 * T * a + 8 * T
    post = 2 * e * T * h + 4 * T
    loss_saved = e * T * V + 17 * T
    loss_backward = 4 * T * V + e * T * V + L * 2 * e * T * kvd
    params = 1_235_814_400
    states = 3 * e * params  # bf16 weights and AdamW's two bf16 moments (no gradient yet at the loss)
    inputs = 16 * T  # input ids and labels (int64)
    est = estimate(sc)
    start = next(m for m in est.worst.moments if m.name == "backward_start")
    assert start.tensor_bytes == states + inputs + L * per_layer + post + loss_saved + loss_backward
    assert est.peak_tensor_bytes == start.tensor_bytes
    assert any("partitioner" in c for c in est.caveats)
    # what no compiled trace covers gets the untraced formula and says so
    other = estimate(sc.replace(attention="eager"))
    assert any(c.startswith("compile: untraced for this scenario, a formula") for c in other.caveats)


def test_under_autocast_the_partitioner_saves_fp32_residuals_and_16_bit_weight_casts() -> None:
    """amp-bf16: the residual stream is fp32 (2 x 4 B x T x h per layer instead of 2 x 2 B), and each Linear
    weight's 16-bit cast is saved (2 B per weight: q, k, v, o, gate, up, down), so a layer keeps
    4 T h + 2 x (layer's Linear weights) bytes more than in bf16; the KV cache's zero gradient holds k in fp32."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    base = {"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 1024, "compile": True}
    bf16 = activations(Context(Scenario.from_dict(base)))
    amp = activations(Context(Scenario.from_dict({**base, "precision": "amp-bf16"})))
    T, h, I, kvd = 4096, 2048, 8192, 512
    weights = 2 * h * h + 2 * kvd * h + 3 * I * h  # q, o; k, v; gate, up, down
    assert amp.layer_bytes() - bf16.layer_bytes() == 2 * 2 * T * h + 2 * weights
    cache = lambda b: sum(t.bytes for t in b.loss_backward if "KV cache" in t.name)  # noqa: E731
    assert cache(amp) - cache(bf16) == 2 * T * kvd * 16  # k: 4 B instead of 2, 16 layers


def test_compiled_lora_on_q_and_v_saves_no_frozen_projections_input() -> None:
    """peft's default LoRA (fp32 adapters on q_proj, v_proj) compiled, Llama 3.2 1B b2 s512 r16: per layer the
    residual stream (2 e T h), the fp32 cast of the attention norm's output for lora_A (4 T h), two fp32 lora_A
    outputs (2 x 4 T r), q and the attention output (2 e T h), k and v (2 e T kv d), the logsumexp (4 T a), the rsqrts
    (8 T), gate's and up's outputs (2 e T I); the KV cache's zero gradients for every v and k from layer 1 on."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    sc = Scenario.from_dict(
        {"model": "llama-3.2-1b", "micro_batch_size": 2, "seq_len": 512, "method": "lora", "compile": True}
    )
    act = activations(Context(sc))
    T, h, I, kvd, a, r, V, L, e = 1024, 2048, 8192, 512, 32, 16, 128256, 16, 2
    per = (
        2 * e * T * h
        + 4 * T * h
        + 2 * 4 * T * r
        + 2 * e * T * h
        + 2 * e * T * kvd
        + 4 * T * a
        + 8 * T
        + 2 * e * T * I
    )
    assert act.layer_bytes() == per
    assert sum(t.bytes for t in act.post) == 0
    assert sum(t.bytes for t in act.loss_backward) == 4 * T * V + e * T * V + (2 * L - 1) * e * T * kvd
    assert any("partitioner" in c for c in estimate(sc).caveats)


def test_q_k_norms_under_compile_save_the_projections_outputs_and_rsqrts() -> None:
    """Qwen3 (per-head q/k RMSNorm, a x d = 1024 wider than h = 256), compiled, as the trace's saved tensors list
    them (benchmarks/compiled_saved.py "qwen3 bf16 sdpa b2 s512"): per layer the residual stream and the two norm
    outputs (4 e T h), their rsqrts (8 T), q_proj's and k_proj's outputs (the q/k norms' inputs, e T (a d + kv d)),
    the q/k norms' rsqrts per head (4 T (a + kv)), q after RoPE and the attention output (2 e T a d), k and v
    (2 e T kv d), the logsumexp (4 T a), gate's and up's outputs and down's input (3 e T I)."""
    from fidelity_cases import CASES

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    act = activations(
        Context(Scenario.from_dict({**dict(CASES)["qwen3 bf16 sdpa b2 s512"], "compile": True}))
    )
    T, h, a, d, kv, I, e = 1024, 256, 8, 128, 4, 688, 2
    per = (
        4 * e * T * h
        + 8 * T
        + e * T * (a * d + kv * d)
        + 4 * T * (a + kv)
        + 2 * e * T * a * d
        + 2 * e * T * kv * d
        + 4 * T * a
        + 3 * e * T * I
    )
    assert act.layer_bytes() == per


def test_gemma_and_olmo2_save_what_llama_saves_besides_the_q_k_norms() -> None:
    """Gemma's GeGLU saves gate's and up's outputs as SwiGLU does (the tanh GeLU recomputed); OLMo 2's post-norms
    save as many T x h tensors as Llama's pre-norms and its whole-projection q/k norms add q_proj's and k_proj's
    outputs and two fp32 rsqrts per token (traced: docs/fidelity.md)."""
    from fidelity_cases import CASES

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    def layer(name: str) -> int:
        return activations(Context(Scenario.from_dict({**dict(CASES)[name], "compile": True}))).layer_bytes()

    T, hq, hkv, e = 1024, 256, 128, 2
    assert layer("gemma bf16 sdpa b2 s512") == layer("llama bf16 sdpa b2 s512")
    assert (
        layer("olmo2 bf16 sdpa b2 s512") == layer("llama bf16 sdpa b2 s512") + e * T * (hq + hkv) + 2 * 4 * T
    )


def test_an_untraced_compiled_step_is_a_labelled_formula_eager_layers_and_the_compiled_loss() -> None:
    """Phi compiled (no traced rule): the layers keep eager's terms, an upper bound on its compiled trace
    (docs/fidelity.md), and the loss is the compiled loss of the traced decoders: the e-byte logits and 17 B x T
    saved; one fp32 T x V buffer, the logits' zero gradient and the KV cache's (every layer's k and v) at the top
    of backward. Every term and the caveat say the formula is untraced."""
    from fidelity_cases import CASES

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    data = dict(CASES)["phi bf16 sdpa b2 s512"]
    eager = activations(Context(Scenario.from_dict(data)))
    sc = Scenario.from_dict({**data, "compile": True})
    act = activations(Context(sc))
    T, V, hkv, L, e = 1024, 1000, 256, 4, 2
    assert act.layer_bytes() == eager.layer_bytes()
    assert act.loss_forward == []
    assert sum(t.bytes for t in act.loss_saved) == e * T * V + 17 * T
    assert sum(t.bytes for t in act.loss_backward) == 4 * T * V + e * T * V + L * 2 * e * T * hkv
    assert all("untraced formula" in t.name for t in act.loss_saved + act.loss_backward)
    assert any(c.startswith("compile: untraced for this scenario, a formula") for c in estimate(sc).caveats)
    # an encoder's loss is no causal LM's: all eager's (BERT in fp32: no compiled trace)
    bert = {**dict(CASES)["bert bf16 sdpa b4 s256 (no dropout)"], "precision": "fp32"}
    assert (
        estimate(Scenario.from_dict({**bert, "compile": True})).peak_tensor_bytes
        == estimate(Scenario.from_dict(bert)).peak_tensor_bytes
    )


def test_a_memory_budget_below_one_keeps_the_default_figure_and_says_it_is_untraced() -> None:
    """activation_memory_budget < 1 is not modelled by the engine: the default budget's figure, an upper bound on
    the compiled traces at 0.5, 0.2 and 0 (docs/fidelity.md), with a caveat naming the key."""
    base = {"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 1024, "compile": True}
    full = estimate(Scenario.from_dict(base))
    half = estimate(Scenario.from_dict({**base, "activation_memory_budget": 0.5}))
    assert half.peak_tensor_bytes == full.peak_tensor_bytes
    assert any(c.startswith("activation_memory_budget 0.5: untraced") for c in half.caveats)
    assert not any(c.startswith("activation_memory_budget") for c in full.caveats)


def test_compiled_full_checkpointing_keeps_layer_inputs_and_recomputes_the_compiled_layer() -> None:
    """Full checkpointing compiled (traced, docs/fidelity.md): each layer keeps its input, the residual stream
    (e T h); the backward recomputes one layer's compiled saved set; HF turns the KV cache off, so no zero
    gradients for it at the top of backward."""
    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    base = {"model": "llama-3.2-1b", "micro_batch_size": 4, "seq_len": 1024, "compile": True}
    plain = activations(Context(Scenario.from_dict(base)))
    ckpt = activations(Context(Scenario.from_dict({**base, "activation_checkpointing": "full"})))
    T, h, V, e = 4096, 2048, 128256, 2
    assert sum(t.bytes for t in ckpt.checkpointed_layer) == e * T * h
    assert ckpt.recomputed_layer == plain.per_layer
    assert sum(t.bytes for t in ckpt.loss_backward) == 4 * T * V + e * T * V
    # LoRA or autocast with checkpointing are not traced compiled: the formula says so
    lora = Scenario.from_dict({**base, "activation_checkpointing": "full", "method": "lora"})
    assert any(c.startswith("compile: untraced for this scenario") for c in estimate(lora).caveats)


def test_compiled_lora_on_qwen3_saves_the_q_k_norms_but_layer_zeros_k_norm() -> None:
    """Qwen3 with LoRA on q and v, compiled (traced: docs/fidelity.md): the q/k norms save their inputs and rsqrts
    as in full training, at the query width a x d, except layer 0's k norm, which reads the frozen embedding
    through a frozen k_proj and needs no gradient."""
    from fidelity_cases import CASES

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    act = activations(
        Context(Scenario.from_dict({**dict(CASES)["qwen3 bf16 lora qv b2 s512"], "compile": True}))
    )
    T, a, d, kv, e = 1024, 8, 128, 4, 2
    (qk,) = [t for t in act.per_layer if "q/k norm" in t.name]
    assert qk.bytes == e * T * (a * d + kv * d) + 4 * T * (a + kv)
    assert qk.skip_first and qk.first_bytes == e * T * kv * d + 4 * T * kv
    # q after RoPE and the attention output (each a x d wide) are terms of their own, in the order the compiled
    # forward makes them (the allocation stream writes them there: compiled_lora_steps)
    (q_roped,) = [t for t in act.per_layer if "q after RoPE" in t.name]
    assert q_roped.bytes == e * T * a * d
    (attn,) = [t for t in act.per_layer if "attention output" in t.name]
    assert attn.bytes == e * T * a * d + 4 * T * a


def test_gemma3s_sandwich_norms_save_their_inputs_on_top_of_gemmas_set() -> None:
    """Gemma 3 (text) compiled: Gemma's set, the per-head q/k norms' inputs and rsqrts (a x d = 512 here), and its
    norms after attention and after the MLP: o_proj's and down_proj's outputs (2 e T h) and two fp32 rsqrts."""
    from fidelity_cases import CASES

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    def terms(name: str) -> dict[str, float]:
        sc = Scenario.from_dict({**dict(CASES)[name], "compile": True})
        return {t.name: t.bytes for t in activations(Context(sc)).per_layer}

    g3 = terms("gemma3_text bf16 sdpa b2 s512")
    sc = Scenario.from_dict({**dict(CASES)["gemma3_text bf16 sdpa b2 s512"], "compile": True})
    per_layer = activations(Context(sc)).per_layer  # four norms' rsqrts: four terms of one name
    T, h, a, d, kv, e, I = 1024, 256, 8, 64, 4, 2, 688
    gemma = 4 * e * T * h + 2 * 4 * T + 2 * e * T * a * d + 2 * e * T * kv * d + 4 * T * a + 3 * e * T * I
    qk = e * T * (a * d + kv * d) + 4 * T * (a + kv)
    sandwich = 2 * e * T * h + 2 * 4 * T
    assert sum(t.bytes for t in per_layer) == gemma + qk + sandwich
    # the terms are listed in the order the compiled forward makes them (the allocation stream writes them there:
    # compiled_gemma3_steps): the per-head rsqrts, and o_proj's output (the norm after attention reads it) made
    # with q and k after RoPE and the attention's outputs
    assert g3["compiled: q's norm rsqrt per head (fp32)"] == 4 * T * a
    assert g3["compiled: k's norm rsqrt per head (fp32)"] == 4 * T * kv
    assert g3["compiled: q and k after RoPE, the attention output and logsumexp, o_proj's output"] == (
        e * T * (2 * a * d + kv * d + h) + 4 * T * a
    )


def test_compiled_vit_under_autocast_saves_one_16_bit_cast_per_layernorm_and_fp32_normalised_tensors() -> (
    None
):
    """ViT amp-bf16 compiled (compiled_layernorm.py), counted from the partitioner's saved set
    (benchmarks/compiled_saved.py): per layer each LayerNorm's fp32 normalised tensor (2 x 4 T h) and fp32
    1/sigma (2 x 4 T), one 16-bit cast of each LayerNorm's output (2 x 2 T h: q, k and v share one where eager
    autocast casts it three times), q, k, v and SDPA's output (4 x 2 T h), the logsumexp (4 T a), fc1's output and
    the GeLU's (2 x 2 T I), and the 16-bit casts of the six Linear weights (2 B each)."""
    from fidelity_cases import CASES

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.activations.compiled_layernorm import HELD_BACK, layernorm_activations
    from memsim_widget.engine.context import Context

    data = {**dict(CASES)["vit amp-bf16 sdpa b8 (no dropout)"], "compile": True}
    ctx = Context(Scenario.from_dict(data))
    T, h, I, a = 8 * 197, 256, 1024, 8
    weights = 4 * h * h + 2 * h * I
    # held back from the engine (the H200 allocated more than eager), so the rule is applied here by hand
    assert ("amp-bf16", "full") in HELD_BACK["vit"]
    act = activations(ctx)
    assert (
        act.layer_bytes()
        == activations(Context(Scenario.from_dict({**data, "compile": False}))).layer_bytes()
    )
    layernorm_activations(ctx, act, weights)
    assert (
        act.layer_bytes()
        == 2 * 4 * T * h
        + 2 * 4 * T
        + 2 * 2 * T * h
        + 4 * 2 * T * h
        + 4 * T * a
        + 2 * 2 * T * I
        + (2 * weights)
    )
    eager = activations(Context(Scenario.from_dict({**data, "compile": False})))
    # eager autocast: three more 16-bit casts of the attention norm's output, mean and rstd per norm (16 T)
    assert eager.layer_bytes() - act.layer_bytes() == 2 * 2 * T * h + 2 * 8 * T - 2 * 4 * T


def test_compiled_vit_on_cudas_math_sdpa_saves_fp32_probabilities_instead_of_the_logsumexp() -> None:
    """ViT amp-bf16 compiled on CUDA under transformers 5.17 (compiled_layernorm.CUDA_MATH_SDPA, traced on fake CUDA
    tensors: tests/trace/test_trace_fake_cuda.py): its all-visible mask has last-dim stride 0, CUDA's fused kernels
    refuse it, and the math composite's fp32 probabilities (4 b a s^2) replace the logsumexp (4 T a) in every layer;
    one layer saves its scores with their row max, sum and mask row instead (9 T a more), and one layer's attention
    backward holds the fp32 gradients of probabilities and scores (8 b a s^2). Held back from the engine's default
    (HELD_BACK: which transformers runs is not in the scenario)."""
    from fidelity_cases import CASES

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.activations.compiled_layernorm import (
        CUDA_MATH_SDPA,
        HELD_BACK,
        layernorm_activations,
    )
    from memsim_widget.engine.context import Context

    data = {**dict(CASES)["vit amp-bf16 sdpa b8 (no dropout)"], "compile": True}
    b, s, a, h, I = 8, 197, 8, 256, 1024
    T = b * s
    weights = 4 * h * h + 2 * h * I
    assert ("vit", "amp-bf16") in CUDA_MATH_SDPA and ("amp-bf16", "full") in HELD_BACK["vit"]
    fused, math = (activations(Context(Scenario.from_dict(data))) for _ in range(2))
    layernorm_activations(Context(Scenario.from_dict(data)), fused, weights)
    layernorm_activations(Context(Scenario.from_dict(data)), math, weights, math_sdpa=True)
    assert math.layer_bytes() - fused.layer_bytes() == 4 * b * a * s * s - 4 * T * a
    assert sum(t.bytes for t in math.post) - sum(t.bytes for t in fused.post) == 9 * T * a
    assert [t.bytes for t in math.attention_backward] == [8 * b * a * s * s]
    # the default engine keeps eager's layers for this pair (held back)
    eager = activations(Context(Scenario.from_dict({**data, "compile": False})))
    assert activations(Context(Scenario.from_dict(data))).layer_bytes() == eager.layer_bytes()


def test_gpt2_bert_and_vit_compiled_say_traced_and_their_untraced_variants_say_formula() -> None:
    """The traced pairs (GPT-2, BERT and RoBERTa in bf16, amp-bf16 and amp-fp16, with hidden dropout or without;
    GPT-2 in bf16 with full checkpointing; ViT in bf16 without dropout) carry the traced caveat; an untraced
    precision (fp32), ViT with dropout, checkpointing every other layer or a held-back pair (ViT in amp-bf16) fall
    back to the labelled formula."""
    from fidelity_cases import CASES

    gpt2 = {**dict(CASES)["gpt2 bf16 sdpa b2 s512"], "compile": True}
    vit = {**dict(CASES)["vit bf16 sdpa b8 (no dropout)"], "compile": True}
    for case in (
        gpt2,
        {**gpt2, "precision": "amp-bf16"},
        {**gpt2, "precision": "amp-fp16", "model": {**gpt2["model"], "resid_pdrop": 0.1, "embd_pdrop": 0.1}},
        {**gpt2, "activation_checkpointing": "full"},
        {**dict(CASES)["bert bf16 sdpa b4 s256 (no dropout)"], "compile": True},
        vit,
    ):
        caveats = estimate(Scenario.from_dict(case)).caveats
        assert any("partitioner's saved tensors" in c for c in caveats), case
    for other in (
        {**dict(CASES)["vit amp-bf16 sdpa b8 (no dropout)"], "compile": True},
        {**gpt2, "precision": "fp32"},
        {**vit, "model": {**vit["model"], "hidden_dropout_prob": 0.1}},
        {**gpt2, "activation_checkpointing": "full", "checkpoint_every": 2},
    ):
        caveats = estimate(Scenario.from_dict(other)).caveats
        assert any(c.startswith("compile: untraced for this scenario, a formula") for c in caveats), other
    roberta = Scenario.from_dict({"model": {**dict(CASES)["bert bf16 sdpa b4 s256 (no dropout)"]["model"],
                                            "model_type": "roberta"}, "micro_batch_size": 4, "seq_len": 256,
                                  "compile": True})  # fmt: skip
    assert any("partitioner's saved tensors" in c for c in estimate(roberta).caveats)


def test_compiled_hidden_dropout_saves_one_boolean_mask_per_dropout_and_nothing_else() -> None:
    """Hidden dropout compiled (traced): ``native_dropout`` decomposes to ``rand_like(x) > p``, a random op the
    partitioner never recomputes, so each dropout's boolean mask is saved, 1 B per element: two per layer (after
    attention, after the MLP) and the embeddings' one. The traces of GPT-2 (b2 s512) and BERT (b4 s256) with
    dropout 0.1 peak (2 L + 1) x T x h bytes above the same step without, in bf16 and amp-bf16 alike."""
    from fidelity_cases import BERT, GPT2

    for model, shape, drop in (
        (GPT2, (2, 512), {"resid_pdrop": 0.1, "embd_pdrop": 0.1}),
        (BERT, (4, 256), {"hidden_dropout_prob": 0.1}),
    ):
        for precision in ("bf16", "amp-bf16"):
            base = {"model": model, "micro_batch_size": shape[0], "seq_len": shape[1], "compile": True,
                    "precision": precision}  # fmt: skip
            T, h, L = shape[0] * shape[1], 256, 4
            plain = estimate(Scenario.from_dict(base)).peak_tensor_bytes
            dropped = estimate(Scenario.from_dict({**base, "model": {**model, **drop}})).peak_tensor_bytes
            assert dropped - plain == (2 * L + 1) * T * h, (model["model_type"], precision)


def test_attention_dropout_compiled_is_the_fused_kernels_and_says_so() -> None:
    """Attention dropout (the presets' default) runs inside CUDA's fused SDPA kernel, which saves its Philox seed and
    offset, no mask: the same saved set as without it, with a caveat that a CPU trace cannot show it (SDPA takes the
    math kernel there)."""
    from fidelity_cases import GPT2

    base = {"model": {**GPT2, "resid_pdrop": 0.1}, "micro_batch_size": 2, "seq_len": 512, "compile": True}
    with_attn = estimate(Scenario.from_dict({**base, "model": {**base["model"], "attn_pdrop": 0.1}}))
    assert with_attn.peak_tensor_bytes == estimate(Scenario.from_dict(base)).peak_tensor_bytes
    assert any("attention dropout runs inside CUDA's fused SDPA kernel" in c for c in with_attn.caveats)


def test_amp_fp16_compiled_saves_what_amp_bf16_saves() -> None:
    """amp-fp16 and amp-bf16 compile to the same graph with another 16-bit dtype (BERT's traces: 99,077,136 B
    both), so the engine gives them the same bytes."""
    from fidelity_cases import BERT, GPT2

    for model in (GPT2, BERT):
        base = {"model": model, "micro_batch_size": 2, "seq_len": 256, "compile": True}
        fp16, bf16 = (
            estimate(Scenario.from_dict({**base, "precision": p})) for p in ("amp-fp16", "amp-bf16")
        )
        assert fp16.peak_tensor_bytes == bf16.peak_tensor_bytes
        assert any("partitioner's saved tensors" in c for c in fp16.caveats)


def test_compiled_gpt2_under_autocast_saves_fp32_normalised_tensors_and_16_bit_casts() -> None:
    """GPT-2 amp-bf16 compiled, counted from the partitioner's saved set (benchmarks/compiled_saved.py, b2 s512):
    per layer each LayerNorm's fp32 normalised tensor (2 x 4 T h) and 1/(h sigma) (2 x 4 T), the 16-bit casts of
    the LayerNorm outputs c_attn and c_fc read (2 x 2 T h), q, k, v and SDPA's output (4 x 2 T h), the fused c_attn
    output q views (its k and v thirds, 2 x 2 T h), the returned KV cache held with the output (2 x 2 T h), the
    logsumexp (4 T a), c_fc's output and the GeLU's (2 x 2 T I) and the four weights' 16-bit casts;
    before the layers the fp32 embedding sum (4 T h), after them the final norm's fp32 normalised tensor, its
    16-bit cast and 1/sigma and the head weight's cast. At the top of backward the larger of the loss's backward (its
    fp32 buffer and a second copy of the logits) and the head's (the 16-bit logits gradient, the KV cache's 16-bit
    zero gradients, no RoPE upcasting k, the hidden output's and the head weight's gradients): the head's at V
    1000, the loss's at GPT-2's 50,257 (both traced to within 0.5%)."""
    from fidelity_cases import GPT2

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    sc = Scenario.from_dict({"model": GPT2, "micro_batch_size": 2, "seq_len": 512, "compile": True,
                             "precision": "amp-bf16"})  # fmt: skip
    act = activations(Context(sc))
    T, h, I, a, V, L = 1024, 256, 1024, 8, 1000, 4
    weights = 3 * h * h + h * h + 2 * h * I
    per_layer = (
        2 * 4 * T * h + 2 * 4 * T + 2 * 2 * T * h + 4 * 2 * T * h + 2 * 2 * T * h + 2 * 2 * T * h + 4 * T * a
        + 2 * 2 * T * I + 2 * weights
    )  # fmt: skip
    assert act.layer_bytes() == per_layer
    assert sum(t.bytes for t in act.pre) == 4 * T * h
    assert sum(t.bytes for t in act.post) == 4 * T * h + 2 * T * h + 4 * T + 2 * V * h
    loss_top, head = 4 * T * V + 2 * T * V, 2 * T * V + L * 2 * 2 * T * h + 2 * T * h + 2 * V * h
    assert head > loss_top and sum(t.bytes for t in act.loss_backward) == head
    real = {**GPT2, "n_embd": 768, "n_head": 12, "n_layer": 2, "vocab_size": 50257}
    big = activations(Context(Scenario.from_dict({**sc.to_dict(), "model": real, "micro_batch_size": 4,
                                                  "seq_len": 1024})))  # fmt: skip
    T, h, V = 4096, 768, 50257
    assert sum(t.bytes for t in big.loss_backward) == 4 * T * V + 2 * T * V
    assert not any("untraced" in t.name for t in act.loss_saved + act.loss_backward)


def test_compiled_gpt2_full_checkpointing_keeps_layer_inputs_and_recomputes_the_compiled_layer() -> None:
    """GPT-2 in bf16 with HF's full checkpointing compiled (traced): each layer keeps its input (e T h), the backward
    recomputes one layer's compiled saved set, and HF turns the KV cache off (no held cache, no zero gradients for
    it). BERT's checkpointed step (a rule was +8.4% over its trace, the formula +7.0%) and autocast with
    checkpointing (not traced) keep the labelled formula."""
    from fidelity_cases import BERT, GPT2

    from memsim_widget.engine.activations import activations
    from memsim_widget.engine.context import Context

    base = {"model": GPT2, "micro_batch_size": 2, "seq_len": 512, "compile": True}
    T, h = 1024, 256
    plain = activations(Context(Scenario.from_dict(base)))
    ckpt = activations(Context(Scenario.from_dict({**base, "activation_checkpointing": "full"})))
    assert sum(t.bytes for t in ckpt.checkpointed_layer) == 2 * T * h
    assert ckpt.recomputed_layer == ckpt.per_layer
    assert ckpt.layer_bytes() == plain.layer_bytes() - 2 * 2 * T * h  # no returned KV cache
    assert not any("KV cache" in t.name for t in ckpt.loss_backward)
    for other in (
        {**base, "activation_checkpointing": "full", "precision": "amp-bf16"},
        {**base, "model": BERT, "activation_checkpointing": "full"},
    ):
        caveats = estimate(Scenario.from_dict(other)).caveats
        assert any(c.startswith("compile: untraced for this scenario, a formula") for c in caveats), other


def test_compiled_modernbert_counts_the_partitioners_saved_set_and_says_traced() -> None:
    """ModernBERT bf16 b2 s512 compiled (compiled_modernbert.py), counted from the partitioner's saved tensors
    (benchmarks/compiled_saved.py "modernbert bf16 sdpa b2 s512"): per layer the two residual sums and the two
    norm outputs (4 e T h), q and k after RoPE, Wqkv's whole output (v's view keeps it: 3 e T h) and SDPA's output
    (6 e T h), the logsumexp (4 T a), Wi's output and the GeGLU product (3 e T I), 16-bit mean and rstd per norm
    (layer 0 has one norm: its attn_norm is an identity); before the layers the token embedding and its norm's
    statistics, one (b, 1, s, s) mask shared by the local layers; after them three T x h tensors and four
    statistics; the loss's e-byte logits and 8 T, its fp32 T x V buffer and the logits' zero gradient at the top
    of backward, with AdamW's two bf16 moments and the bf16 weights. Before this rule it was eager's formula,
    15.7% over the trace."""
    from fidelity_cases import CASES

    sc = Scenario.from_dict({**dict(CASES)["modernbert bf16 sdpa b2 s512"], "compile": True})
    e, b, s, h, I, a, V, L = 2, 2, 512, 256, 384, 8, 1000, 4
    T = b * s
    params = 1000 * h + h + L * (3 * h * h + h * h + 2 * I * h + h * I + h) + (L - 1) * h + h + h * h + h + V
    per_layer = 4 * e * T * h + 6 * e * T * h + 4 * T * a + 3 * e * T * I + 2 * 2 * e * T
    first = 2 * e * T  # layer 0: no attn_norm statistics
    pre = e * T * h + 2 * e * T + e * b * s * s
    post = 3 * e * T * h + 4 * e * T
    loss = e * T * V + 8 * T + 4 * T * V + e * T * V
    est = estimate(sc)
    start = next(m for m in est.worst.moments if m.name == "backward_start")
    assert start.tensor_bytes == 3 * e * params + 16 * T + L * per_layer - first + pre + post + loss
    assert est.peak_tensor_bytes == start.tensor_bytes
    assert any("partitioner's saved tensors" in c for c in est.caveats)
    # amp-bf16, LoRA and checkpointing are not traced: the labelled formula
    for other in ({"precision": "amp-bf16"}, {"activation_checkpointing": "full"}):
        caveats = estimate(Scenario.from_dict({**sc.to_dict(), **other})).caveats
        assert any(c.startswith("compile: untraced for this scenario, a formula") for c in caveats), other


def test_a_compiled_vit_under_autocast_says_what_transformers_before_5_24_adds_on_cuda() -> None:
    """The caveat of a compiled ViT in amp-bf16 names the fp32 probabilities CUDA's math SDPA saves under
    transformers 5.17's compile mask (traced on fake CUDA tensors), filled in: 4 B x b x heads x s x s per layer;
    in bf16 (not listed in ``CUDA_MATH_SDPA``) there is no such note."""
    from memsim_widget.engine.core import estimate
    from memsim_widget.scenario import Scenario

    base = {"model": "vit-base-patch16-224", "micro_batch_size": 64, "compile": True}
    amp = estimate(Scenario.from_dict({**base, "precision": "amp-bf16"}))
    note = next(c for c in amp.caveats if c.startswith("compile:"))
    assert f"about {4 * 64 * 12 * 197 * 197 * 12 / 2**30:.2f} GiB more allocated" in note
    assert "4 x 64 x 12 x 197 x 197 x 12" in note
    bf16 = estimate(Scenario.from_dict({**base, "precision": "bf16"}))
    assert not any("math kernel" in c for c in bf16.caveats)
