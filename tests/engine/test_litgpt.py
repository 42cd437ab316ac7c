"""``framework: "litgpt"`` in the engine: litgpt 0.5.13's own modules and chunked loss
(engine/activations/litgpt.py), held to a trace of litgpt's code (tests/trace/test_trace_litgpt.py)."""

from __future__ import annotations

from memsim_widget.engine.activations import activations
from memsim_widget.engine.activations.loss import NLL_FP32_COPY
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.alloc_stream import FREE, rank_stream
from memsim_widget.engine.rl import objectives
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
    8 copies) where HF's single head call keeps one; the loss saves every chunk's bf16 log-softmax and nll_loss's
    fp32 copy of it (CUDA autocast's cross-entropy)."""
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
    assert sum(t.bytes for t in lit.loss_saved) == (2 + 4) * T * V


AMP_LORA = {**L32, "seq_len": 1024, "precision": "amp-bf16", **LORA_QV,
            "lora": {**LORA_QV["lora"], "adapter_dtype": "fp32"}}  # fmt: skip


def test_under_autocast_each_chunks_loss_runs_as_cuda_autocast_runs_cross_entropy() -> None:
    """bf16-mixed: chunked_cross_entropy calls F.cross_entropy once per 128-token chunk on its bf16 logits. CUDA's
    autocast has no cross_entropy entry (trace/cuda_autocast.py): log_softmax keeps bf16 and nll_loss casts it to
    fp32; both are saved, per chunk, until backward (8 chunks at s1024: (2 + 4) B x T x V), and nothing else of the
    loss is alive in forward but the bf16 logits (2 B x T x V). Backward runs one chunk at a time: its start holds
    that chunk's fp32 nll_loss gradient, 4 B x b x 128 x V (CPU autocast's rule held two fp32 buffers of a chunk
    beside an fp32 log-softmax of 4 B x T x V)."""
    T, V, b = 2048, 128256, 2
    out = activations(Context(Scenario.from_dict(AMP_LORA)))
    assert sum(t.bytes for t in out.loss_forward) == 2 * T * V
    assert [(t.bytes, t.tensors) for t in out.loss_saved] == [(2 * T * V, 8), (4 * T * V, 8)]
    assert out.loss_saved[-1].name.startswith(NLL_FP32_COPY)  # what the allocation stream pairs per chunk
    assert sum(t.bytes for t in out.loss_backward) == 4 * b * 128 * V


def test_the_stream_runs_the_chunked_loss_chunk_by_chunk() -> None:
    """The allocation stream of that step makes each chunk's bf16 log-softmax then its fp32 copy (as the trace does:
    2 and 4 B x b x 128 x V, eight times), and in the loss's backward, chunk after chunk, makes nll_loss's fp32
    gradient, frees the copy, casts the gradient to bf16, frees it, makes the logits' bf16 gradient and frees the
    cast and the log-softmax: its highest point is the first chunk's fp32 gradient over all that was saved."""
    V, c = 128256, 2 * 128
    ctx = Context(objectives.training_scenario(Scenario.from_dict(AMP_LORA)))
    s = rank_stream(ctx, ctx.stages[0])
    marks = [k for k, label in s.marks if label in ("step 2 loss", "step 2 loss backward", "step 2 backward")]
    sizes: dict[int, int] = {}
    live, trail = 0, []
    for k, (h, size, _) in enumerate(s.events):
        if size == FREE:
            live -= sizes.pop(h)
        else:
            sizes[h] = size
            live += size
        trail.append((k, size, live))
    made = [
        size for k, size, _ in trail[marks[0] : marks[1]] if c * V <= size < 2 * 2048 * V
    ]  # not the logits
    assert made == [2 * c * V, 4 * c * V] * 8
    loss_end = trail[marks[1] - 1][2]
    back = trail[marks[1] : marks[2]]
    assert max(x for _, _, x in back) == loss_end + 4 * c * V
    assert back[-1][2] == loss_end - 8 * (2 + 4) * c * V + 8 * 2 * c * V  # each chunk's bf16 gradient left


def test_the_caveat_says_what_the_litgpt_rule_covers() -> None:
    """The traced rule covers bf16 and amp-bf16, full or LoRA on q/v; anything else keeps HF's rules and says so."""
    assert any("as traced" in c for c in estimate(Scenario.from_dict(L32)).caveats)
    other = estimate(Scenario.from_dict({**L32, "activation_checkpointing": "full"}))
    assert any("litgpt: HF's activation rules" in c for c in other.caveats)
