"""``framework: "litgpt"`` in the engine: litgpt 0.5.13's own modules and chunked loss
(engine/activations/litgpt.py), held to a trace of litgpt's code (tests/trace/test_trace_litgpt.py)."""

from __future__ import annotations

from memsim_widget.engine.activations import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.scenario import Scenario

L32 = {"model": "llama-3.2-1b", "micro_batch_size": 2, "seq_len": 512, "framework": "litgpt"}
LORA_QV = {"method": "lora", "lora": {"rank": 8, "targets": ["q_proj", "v_proj"], "adapter_dtype": "bf16"}}


def test_a_litgpt_layer_saves_fp32_norm_products_and_repeated_kv() -> None:
    """Llama 3.2 1B, bf16, b2 s512, full training, counted from litgpt's model.py: per RMSNorm the fp32 input copy,
    the fp32 x_normed (4 + 4 B x T x h), the rsqrt (4 T), the fp32 weight copy (4 h) and the 2-byte output; q after
    RoPE, k and v repeat_interleave'd to 32 heads, the SDPA output and proj's reshaped input (5 x 2 B x T x a d);
    the logsumexp (4 T a); fc_1, fc_2, SiLU and the product (4 x 2 B x T x I)."""
    T, h, I, a, ad, e = 1024, 2048, 8192, 32, 2048, 2
    norm = 4 * T * h + 4 * T * h + 4 * T + 4 * h + e * T * h
    layer = 2 * norm + 5 * e * T * ad + 4 * T * a + 4 * e * T * I
    assert activations(Context(Scenario.from_dict(L32))).layer_bytes() == layer


def test_litgpt_lora_on_q_and_v_saves_no_frozen_linear_input() -> None:
    """LoRA on q and v (LoRAQKVLinear): the norms keep no fp32 x_normed (their weights are frozen), norm_2's output and
    proj's and down's inputs are not saved; the adapters add lora_A's output (2 B x T x 2r), the grouped conv1d's
    output at the q and v widths (2 B x T x (a d + kv d)) and two int64 index vectors of those widths."""
    T, h, I, a, ad, kvd, e, r = 1024, 2048, 8192, 32, 2048, 512, 2, 8
    norm = 4 * T * h + 4 * T + 4 * h
    layer = 2 * norm + e * T * h + 4 * e * T * ad + 4 * T * a + e * T * 2 * r + e * T * (ad + kvd)
    layer += 2 * 8 * (ad + kvd) + 3 * e * T * I
    assert activations(Context(Scenario.from_dict({**L32, **LORA_QV}))).layer_bytes() == layer


def test_litgpts_chunked_loss_saves_every_chunks_log_softmax_in_bf16() -> None:
    """chunked_cross_entropy on bf16 logits: no fp32 upcast; every chunk's log-softmax is saved (2 B x T x V, chunking
    frees nothing before backward), backward holds one 128-token chunk's two gradient buffers, and the loop's
    logits stay referenced through the step."""
    T, V, e = 1024, 128256, 2
    out = activations(Context(Scenario.from_dict(L32)))
    assert sum(t.bytes for t in out.loss_forward) == e * T * V
    assert sum(t.bytes for t in out.loss_saved) == e * T * V
    assert sum(t.bytes for t in out.loss_backward) == 2 * e * 2 * 128 * V
    assert sum(t.bytes for t in out.output_logits) == e * T * V
    assert out.output_through_step


def test_litgpt_holds_a_separate_head_for_a_tied_model() -> None:
    """Llama 3.2 1B ties its head in HF; litgpt's converted checkpoint holds lm_head as its own V x h tensor, so a
    full bf16 AdamW run keeps V x h more weights, gradients and two moments (4 x 2 B x V x h) at the step."""
    V, h = 128256, 2048
    hf = estimate(Scenario.from_dict({**L32, "framework": "hf", "precision": "bf16"}))
    lit = estimate(Scenario.from_dict(L32))
    step = lambda est: next(m for m in est.worst.moments if m.name == "optimizer_step")  # noqa: E731
    model_state = lambda m: sum(  # noqa: E731
        i.bytes for i in m.items if i.category in ("parameters", "gradients", "optimizer_states")
    )
    assert model_state(step(lit)) - model_state(step(hf)) == 4 * 2 * V * h


def test_under_autocast_a_frozen_head_is_recast_for_every_lm_head_chunk() -> None:
    """bf16-mixed LoRA: autocast caches a weight's bf16 cast only for a leaf that requires grad, so the frozen head is
    cast again for each 128-token chunk and each copy is saved by its matmul: ceil(s / 128) x 2 B x V x h (s = 1024:
    8 copies) where HF's single head call keeps one; the loss saves every chunk's fp32 log-softmax."""
    V, h, T = 128256, 2048, 2048
    sc = {
        **L32,
        "seq_len": 1024,
        "precision": "amp-bf16",
        **LORA_QV,
        "lora": {**LORA_QV["lora"], "adapter_dtype": "fp32"},
    }
    lit = activations(Context(Scenario.from_dict(sc)))
    hf = activations(Context(Scenario.from_dict({**sc, "framework": "hf"})))
    head = lambda out: sum(t.bytes for t in out.post if "head" in t.name)  # noqa: E731
    assert head(lit) - head(hf) == (8 - 1) * 2 * V * h
    assert sum(t.bytes for t in lit.loss_saved) == 4 * T * V


def test_the_caveat_says_what_the_litgpt_rule_covers() -> None:
    """The traced rule covers bf16 and amp-bf16, full or LoRA on q/v; anything else keeps HF's rules and says so."""
    assert any("as traced" in c for c in estimate(Scenario.from_dict(L32)).caveats)
    other = estimate(Scenario.from_dict({**L32, "activation_checkpointing": "full"}))
    assert any("litgpt: HF's activation rules" in c for c in other.caveats)
