"""Saved activations per layer: the formulas of docs/memory-facts.md#activations, exact for the arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

MHA = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
}


def per_layer(**kw) -> float:
    sc = Scenario.from_dict({"model": MHA, **kw})
    return activations(Context(sc)).layer_bytes()


def test_bf16_mha_sdpa_layer_is_24Th_plus_8TI():
    b, s, h, I, a = 2, 1024, 512, 1376, 8
    T = b * s
    # norms 2 x (4 + 2 + 2)Th + 2 x 4T rsqrt; q, k, v, out 4 x 2Th; SwiGLU 4 x 2TI; fp32 logsumexp 4bas
    assert per_layer(micro_batch_size=b, seq_len=s) == 24 * T * h + 8 * T * I + 8 * T + 4 * b * a * s


def test_fp32_mha_sdpa_layer_is_40Th_plus_16TI():
    b, s, h, I, a = 1, 2048, 512, 1376, 8
    T = b * s
    assert (
        per_layer(micro_batch_size=b, seq_len=s, precision="fp32")
        == 40 * T * h + 16 * T * I + 8 * T + 4 * b * a * s
    )


def test_gqa_saves_k_and_v_at_kv_width():
    gqa = {**MHA, "num_key_value_heads": 2}
    T, h = 2048, 512
    mha = activations(Context(Scenario(model=MHA))).layer_bytes()
    small = activations(Context(Scenario(model=gqa))).layer_bytes()
    assert mha - small == 2 * 2 * T * (h - h // 4)


def test_eager_attention_adds_an_exact_s_squared_term():
    b, s, a = 2, 512, 8
    T, h = b * s, 512
    eager = per_layer(micro_batch_size=b, seq_len=s, attention="eager")
    sdpa = per_layer(micro_batch_size=b, seq_len=s)
    # eager keeps the fp32 softmax and its bf16 cast (6 B x b a s^2) and no logsumexp; q, k, v, out the same
    assert eager - sdpa == 6 * b * a * s * s - 4 * b * a * s + 0 * T * h


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 16), st.sampled_from([64, 256, 1024, 4096]), st.sampled_from(["bf16", "fp32", "amp-bf16"])
)
def test_activations_are_exactly_linear_in_micro_batch(b, s, precision):
    """Linear in b; under autocast plus a constant: the 16-bit weight copies saved for backward."""
    sc = Scenario.from_dict({"model": MHA, "seq_len": s, "precision": precision})
    const = sum(t.bytes for t in activations(Context(sc)).per_layer if "weight copies" in t.name)
    one = per_layer(micro_batch_size=1, seq_len=s, precision=precision) - const
    assert per_layer(micro_batch_size=b, seq_len=s, precision=precision) - const == b * one
    assert (const > 0) == (precision == "amp-bf16")


def test_full_checkpointing_keeps_one_input_per_layer():
    sc = Scenario.from_dict({"model": MHA, "seq_len": 4096, "activation_checkpointing": "full"})
    acts = activations(Context(sc))
    assert sum(t.bytes for t in acts.checkpointed_layer) == 2 * 4096 * 512


def test_tensor_and_sequence_parallel_divide_the_layer_but_the_gathered_block_inputs():
    """Under tp + sp every per-layer tensor is split over the two ranks except the attention and MLP inputs,
    which DTensor all-gathers to the full sequence before the Linears save them (traced)."""
    base = per_layer(seq_len=4096)
    sc = Scenario.from_dict({"model": MHA, "seq_len": 4096})
    gathered = sum(
        t.bytes
        for t in activations(Context(sc)).per_layer
        if t.name.startswith(("attention input", "MLP input"))
    )
    assert gathered == 2 * (2 * 4096 * 512)  # two Linear inputs of 2 B x T x h, T = 1 x 4096
    split = per_layer(seq_len=4096, parallel={"tp": 2, "sequence_parallel": True})
    assert split == (base - gathered) / 2 + gathered


def test_hf_tp_plan_gathers_full_logits_and_loss_parallel_splits_them():
    """transformers' plan gathers the LM head's output on every rank (full-vocabulary loss); torchtitan's loss
    parallel keeps V/tp, with three fp32 buffers in the loss backward instead of two (torch 2.13.0
    ``tensor/parallel/loss.py`` ``_nll_loss_and_log_softmax_backward``: zeros_like, exp and their sum, then the
    sum and its product)."""

    def loss(**kw) -> tuple[int, int]:
        acts = activations(Context(Scenario.from_dict({"model": MHA, "seq_len": 1024, **kw})))
        return sum(t.bytes for t in acts.loss_saved), sum(t.bytes for t in acts.loss_backward)

    one_saved, one_bwd = loss()
    assert loss(parallel={"tp": 2}) == (one_saved, one_bwd)
    tt_saved, tt_bwd = loss(parallel={"tp": 2}, framework="torchtitan", precision="bf16")
    assert (tt_saved, tt_bwd) == (
        one_saved // 2,
        3 * one_bwd // 4,
    )  # 3 x 4 B x T x V/2 against 2 x 4 B x T x V


def test_context_parallel_divides_the_sequence():
    assert per_layer(seq_len=4096, parallel={"cp": 4, "dp": 1}) == per_layer(seq_len=1024)


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (2, 2), (4, 2)])
def test_1f1b_stage_i_holds_min(pp, m):
    """Stage i of a 1F1B pipeline keeps min(m, p - i) micro-batches in flight
    (docs/memory-facts.md#parallel-layouts)."""
    est = estimate(
        Scenario.from_dict({"model": MHA, "seq_len": 1024, "parallel": {"pp": pp, "pp_microbatches": m}})
    )
    one = per_layer(seq_len=1024) * (8 // pp)
    for r in est.ranks:
        m_items = next(x for x in r.moments if x.name == "forward_end").items
        layer_names = {t.name for t in activations(Context(Scenario(model=MHA))).per_layer}
        saved = sum(i.bytes for i in m_items if i.category == "activations" and i.item in layer_names)
        assert saved == pytest.approx(one * min(m, pp - r.stage.index), rel=1e-9)


def test_lora_frozen_layers_save_less_than_full_training():
    full = per_layer(seq_len=2048)
    lora = per_layer(
        seq_len=2048, method="lora", lora={"targets": ["q_proj", "v_proj"], "adapter_dtype": "bf16"}
    )
    assert lora < full


def test_loss_path_holds_fp32_vocab_sized_buffers():
    est = estimate(Scenario.from_dict({"model": MHA, "seq_len": 4096}))
    m = {x.name: x for x in est.ranks[0].moments}
    T, V = 4096, 32000
    bwd = {i.item: i.bytes for i in m["backward_start"].items}
    assert bwd["fp32 log-softmax saved by the loss"] == 4 * T * V
    assert bwd["loss backward: two fp32 T x V gradient buffers"] == 8 * T * V
    fwd = {i.item: i.bytes for i in m["forward_end"].items}
    assert fwd["logits and their fp32 upcast"] == (2 + 4) * T * V


T5_SMALL = {
    "model_type": "t5",
    "d_model": 256,
    "d_ff": 1024,
    "num_layers": 4,
    "num_decoder_layers": 4,
    "num_heads": 8,
    "d_kv": 32,
    "vocab_size": 1000,
    "dropout_rate": 0.0,
}


def _t5_terms(**kw) -> dict[str, float]:
    sc = Scenario.from_dict(
        {"model": {**T5_SMALL, **kw.pop("model", {})}, "micro_batch_size": 2, "seq_len": 512, **kw}
    )
    return {t.name: t.bytes for t in activations(Context(sc)).per_layer}


def _term(terms: dict[str, float], start: str) -> float:
    (hit,) = [v for k, v in terms.items() if k.startswith(start)]
    return hit


def test_t5_self_attention_runs_sdpa_math_path_while_the_position_bias_trains():
    b, s, a, d = 2, 512, 8, 32
    T, bass = b * s, b * a * s * s
    # fp32 copies of q, k, v (T x a*d each) and the fp32 probabilities, in every block of both stacks
    math = 3 * 4 * T * a * d + 4 * bass
    assert _term(_t5_terms(), "self-attention: SDPA math path") == math
    # dropout 0.1: CUDA's 1-byte mask and the dropped fp32 probabilities
    drop = _t5_terms(model={"dropout_rate": 0.1})
    assert _term(drop, "self-attention: SDPA math path") == math + (1 + 4) * bass


def test_t5_frozen_bias_and_cross_attention_use_the_fused_kernel():
    b, s, a, d = 2, 512, 8, 32
    T = b * s
    fused = 4 * 2 * T * a * d + 4 * b * a * s  # q, k, v, output (bf16) and the fp32 logsumexp
    lora = _t5_terms(method="lora", lora={"rank": 8, "targets": ["q", "v"]})
    # the self-attention's float mask (1, a, s, s) is a new tensor per layer
    assert _term(lora, "self-attention: fused SDPA") == fused + 2 * a * s * s
    # cross-attention only in the 4 decoder blocks of 8: averaged per layer
    assert _term(lora, "cross-attention: fused SDPA") == fused * 4 / 8
    assert not any(k.startswith("self-attention: SDPA math path") for k in lora)


def test_t5_norms_are_two_per_encoder_block_three_per_decoder_block():
    b, s, h = 2, 512, 256
    T = b * s
    # fp32 copy, rsqrt, the bf16 input itself, the bf16 normalised tensor (the weight trains)
    per_norm = 4 * T * h + 4 * T + 2 * T * h + 2 * T * h
    assert _term(_t5_terms(), "T5LayerNorm") == (4 * 2 + 4 * 3) * per_norm / 8


def test_t5_feed_forward_saves_relu_once_and_the_gelu_new_chain_when_gated():
    b, s, I = 2, 512, 1024
    T = b * s
    # ReLU: its output is also wo's input, one bf16 T x I tensor
    assert _term(_t5_terms(), "feed-forward: ReLU output") == 2 * T * I
    # gated-gelu runs gelu_new: x, tanh, 0.5 x, 1 + tanh, then the product's operands (gelu out, wi_1 out)
    gated = _t5_terms(model={"feed_forward_proj": "gated-gelu"})
    assert _term(gated, "feed-forward activation internals") == 6 * 2 * T * I
    assert _term(gated, "feed-forward wo input") == 2 * T * I


def _t5_forward_top(**kw) -> dict[str, float]:
    sc = Scenario.from_dict(
        {"model": {**T5_SMALL, **kw.pop("model", {})}, "micro_batch_size": 2, "seq_len": 512, **kw}
    )
    return {t.name: t.bytes for t in activations(Context(sc)).forward_top}


T5_LORA = {"method": "lora", "lora": {"rank": 8, "targets": ["q", "v"]}}


def test_t5_forward_top_under_autocast_lora_is_the_last_wo_matmul_beside_what_the_decoder_stack_holds():
    b, s, h, I, a = 2, 512, 256, 1024, 8
    T = b * s
    top = _t5_forward_top(precision="amp-bf16", **T5_LORA)
    # held to the decoder's end: the fp32 position bias (1, a, s, s), the fp32 encoder output (nothing saves it:
    # autocast's k/v copies are saved instead), the frozen fp32 decoder embeddings, the int64 decoder input ids
    assert _term(top, "decoder position bias") == 4 * a * s * s
    assert _term(top, "encoder output") == 4 * T * h
    assert _term(top, "decoder embeddings") == 4 * T * h
    assert _term(top, "decoder input ids") == 8 * T
    # the frozen wo: the norm's fp32 output, wo's fp32 input copy and autocast's bf16 cast, the bf16 output
    assert _term(top, "last decoder block's wo matmul") == 4 * T * h + 4 * T * I + 2 * T * I + 2 * T * h
    assert len(top) == 5


def test_t5_forward_top_in_bf16_lora_is_the_decoder_final_norm():
    b, s, h, a = 2, 512, 256, 8
    T = b * s
    top = _t5_forward_top(**T5_LORA)
    assert _term(top, "decoder position bias") == 2 * a * s * s
    assert _term(top, "encoder output") == 2 * T * h
    assert _term(top, "decoder embeddings") == 2 * T * h
    # saved: fp32 input copy, rsqrt, the bf16 input; then the variance, x * rsqrt (fp32) and its bf16 cast
    saved = 4 * T * h + 4 * T + 2 * T * h
    assert _term(top, "decoder final T5LayerNorm") == saved + 4 * T + 4 * T * h + 2 * T * h
    assert not any(k.startswith("last decoder block's wo") for k in top)


def test_t5_forward_top_in_full_training_holds_no_saved_tensor_twice_and_none_under_checkpointing():
    top = _t5_forward_top()
    # the trained embeddings are saved by block 0's first norm, the encoder output by every cross-attention k/v
    assert not any(k.startswith(("decoder embeddings", "encoder output")) for k in top)
    assert _term(top, "decoder position bias") == 2 * 8 * 512 * 512
    assert _t5_forward_top(activation_checkpointing="full") == {}


def test_t5_forward_end_takes_the_forward_top_only_where_it_outgrows_the_head_and_loss():
    def forward_end(**kw) -> set[str]:
        sc = Scenario.from_dict(
            {"model": {**T5_SMALL, **kw.pop("model", {})}, "micro_batch_size": 2, "seq_len": 512, **kw}
        )
        m = next(m for m in estimate(sc).worst.moments if m.name == "forward_end")
        return {i.item for i in m.items}

    small = forward_end(precision="amp-bf16", **T5_LORA)  # V = 1000: the loss is smaller than wo's copies
    assert any(i.startswith("last decoder block's wo matmul") for i in small)
    assert not any(i.startswith("logits") for i in small)
    real = forward_end(precision="amp-bf16", model={"vocab_size": 32128}, **T5_LORA)  # t5's vocabulary
    assert any(i.startswith("logits") for i in real)
    assert not any(i.startswith("decoder position bias") for i in real)


def _t5_cache(**kw) -> dict[str, float]:
    sc = Scenario.from_dict(
        {"model": {**T5_SMALL, **kw.pop("model", {})}, "micro_batch_size": 2, "seq_len": 512, **kw}
    )
    return {t.name: t.bytes for t in activations(Context(sc)).cache_per_layer}


def test_t5_decoder_self_attention_cache_is_extra_where_the_math_path_saves_fp32_copies():
    T, hq, n_dec, n = 2 * 512, 8 * 32, 4, 8
    # the EncoderDecoderCache's k and v of every decoder block (torch.cat copies), 16-bit, per layer of 8
    cache = _term(_t5_cache(), "decoder self-attention KV cache")
    assert cache * n == 2 * 2 * T * hq * n_dec
    assert _term(_t5_cache(precision="amp-bf16"), "decoder self-attention KV cache") == cache
    # the fused kernel (a frozen bias) and eager attention save the cache's own k and v; fp32 not traced
    assert _t5_cache(**T5_LORA) == {}
    assert _t5_cache(attention="eager") == {}
    assert _t5_cache(precision="fp32") == {}
    assert _t5_cache(activation_checkpointing="full") == {}


def test_t5_forward_top_under_autocast_full_training_is_the_last_decoder_softmax_less_what_follows_it():
    b, s, h, I, a, hq = 2, 512, 256, 1024, 8, 256
    T = b * s
    top = _t5_forward_top(precision="amp-bf16")
    # made by the softmax: fp32 scores, the fp32 bias + mask and its bf16 cast, fp32 q and k and the scaled q,
    # q's bf16 projection, the norm's fp32 output
    made = 4 * b * a * s * s + (4 + 2) * a * s * s + 3 * 4 * T * hq + 2 * T * hq + 4 * T * h
    # saved by the block after it: the cross-attention's q input, k/v encoder copies and fused SDPA, the o inputs
    # of both attentions, the feed-forward's input, ReLU output (and wo's cast), two norms, the weight copies
    norm = 4 * T * h + 4 * T + 4 * T * h
    weights = 2 * (h * hq + 4 * h * hq + 2 * h * I)
    later = 2 * T * h + 2 * 2 * T * h + 2 * T * 4 * hq + 4 * b * a * s + 2 * 2 * T * hq + 2 * T * h
    later += (2 + 2) * T * I + 2 * norm + weights
    assert _term(top, "last decoder block's self-attention softmax") == made - later
    assert not any(k.startswith(("last decoder block's wo", "decoder final")) for k in top)
