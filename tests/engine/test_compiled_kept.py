"""A compiled autocast backward's buffers in the engine's moments (engine/activations/compiled_kept.py): read from
the steps the allocation stream writes, so the moments' allocated follows the stream, which replays the
``--inductor-passes`` traces."""

from __future__ import annotations

import numpy as np
import pytest
from fidelity_cases import COMPILED_CASES

from memsim_widget import Scenario
from memsim_widget.engine.activations.compiled_backward import CONSTANT, FREE_SAVED, GRADS, RELEASE, TANGENT
from memsim_widget.engine.activations.compiled_kept import backward_peak, kept_to_bottom
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED
from memsim_widget.engine.activations.dispatch import activations
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
from memsim_widget.engine.frameworks import allocator_conf

#: The small Llama of the fidelity cases under autocast: T = 2 x 512 tokens, h 256, 4 KV heads of 32 (kv*d 128).
LLAMA_AMP = "llama amp-bf16 sdpa b2 s512 compiled"
T, H, KV = 1024, 256, 128
#: The compiled autocast cases whose traces the stream replays (docs/allocator.md, compiled steps).
AMP_CASES = [
    LLAMA_AMP,
    "qwen2 amp-bf16 sdpa b2 s512 compiled",
    "llama V64 amp-bf16 b4 s512 compiled",
    "qwen3 amp-bf16 sdpa b2 s512 compiled",
]


def _sc(name: str) -> Scenario:
    return Scenario.from_dict({**dict(COMPILED_CASES)[name], "reserved_model": "replay"})


def test_a_layers_backward_peak_counts_what_it_makes_and_frees() -> None:
    """Over the steps: a buffer of 100 B, a gradient (place 0: 40 B), a saved tensor (place 1: 30 B) freed, a
    kept buffer (20 B), a shared zero buffer (50 B) made, the layer's v zero gradient (10 B) freed, the buffer
    freed. Peak after the shared buffer: 100 + 40 - 30 + 20 + 50 = 180 B. The bottom layer, whose steps start with
    the shared buffer made, released first: 50 B at the start, then 100 + 40 = 140 B."""
    steps = [
        ("a", 100), (f"{GRADS}0", 0), (f"{FREE_SAVED}1", 0), (f"{KEEP}x", 20), (f"{CONSTANT}q", 50),
        (TANGENT, 0), ("a", 0),
    ]  # fmt: skip
    assert backward_peak(steps, [5.0, 30.0], [40], [10.0, 15.0]) == 180
    bottom = [(f"{RELEASE}{CONSTANT}q", 0), *steps[:4]]
    assert backward_peak(bottom, [5.0, 30.0], [40], [10.0, 15.0], {f"{CONSTANT}q": 50}) == 140
    assert backward_peak(bottom[1:], [5.0, 30.0], [40], [10.0, 15.0], {f"{CONSTANT}q": 50}) == 190
    assert kept_to_bottom([*steps, (f"{KEEP_SAVED}0", 0)], [5.0, 30.0]) == 25


def test_a_compiled_autocast_layer_keeps_its_input_gradients_row_sums_and_residuals_to_the_bottom() -> None:
    """Per layer of the small Llama: five input gradients (2 B T h: up's, gate's, v's, k's, q's), two fp32 row
    sums (4 B T), the fp32 layer input and residual after attention (4 B T h each) and their two rsqrts (4 B T):
    18 T h + 16 T bytes; the KV cache's zero gradients: v's 16-bit and RoPE's fp32 k (6 B T kv*d); the top's
    kept: the head's 16-bit input gradient, the final norm's row sum, the last layer's fp32 output, its rsqrt."""
    acts = activations(Context(_sc(LLAMA_AMP)))
    assert [t.bytes for t in acts.kept_backward] == [18 * T * H + 16 * T] == [4_734_976]
    assert [t.bytes for t in acts.cache_tangent_layer] == [6 * T * KV]
    assert [t.bytes for t in acts.kept_top_backward] == [2 * T * H + 4 * T + 4 * T * H + 4 * T]


def test_olmo2_and_gemma3_keep_their_input_gradients_to_the_bottom_too() -> None:
    """Their compiled bf16 streams keep each layer's five input gradients (2 B T h) to the bottom; Gemma 3 also its
    two row sums (4 B T), its input and residual after attention (2 B T h) and their rsqrts, and from the top the
    final norm's input gradient, the last layer's output and the final norm's rsqrt (2 x 2 B T h + 4 B T); OLMo 2's
    stream keeps nothing of the top (compiled_steps.kept_top)."""
    olmo2 = activations(Context(_sc("olmo2 bf16 sdpa b2 s512 compiled")))
    assert [t.bytes for t in olmo2.kept_backward] == [5 * 2 * T * H]
    assert olmo2.kept_top_backward == []
    gemma3 = activations(Context(_sc("gemma3_text bf16 sdpa b2 s512 compiled")))
    assert [t.bytes for t in gemma3.kept_backward] == [7 * 2 * T * H + 4 * 4 * T]
    assert [t.bytes for t in gemma3.kept_top_backward] == [2 * 2 * T * H + 4 * T]


def test_layouts_whose_backward_keeps_nothing_to_the_bottom_hold_none() -> None:
    """Eager, the compiled bf16 Llama layout (Qwen3's too) and its compiled LoRA keep their terms."""
    for d in (
        dict(COMPILED_CASES)["llama bf16 sdpa b2 s512 compiled"],
        dict(COMPILED_CASES)["qwen3 bf16 sdpa b2 s512 compiled"],
        dict(COMPILED_CASES)["llama bf16 lora qv b2 s512 compiled"],
        {**dict(COMPILED_CASES)[LLAMA_AMP], "compile": False},
    ):
        acts = activations(Context(Scenario.from_dict(d)))
        assert acts.kept_backward == acts.cache_tangent_layer == acts.kept_top_backward == []
        assert acts.bottom_layer_backward == []


@pytest.mark.parametrize(
    "name", ["olmo2 bf16 sdpa b2 s512 compiled", "gemma3_text bf16 sdpa b2 s512 compiled"]
)
def test_olmo2_and_gemma3_at_a_64_token_vocabulary_follow_their_streams(name: str) -> None:
    """With a 64-token vocabulary the loss is small and their streams peak in the top layer's backward: the
    estimate is within 0.3% of the stream, not under by more than that (before: Gemma 3 -1.49%, OLMo 2 +0.69%)."""
    from memsim_widget.engine.rl import objectives

    d = {**dict(COMPILED_CASES)[name], "micro_batch_size": 4, "reserved_model": "replay"}
    sc = Scenario.from_dict({**d, "model": {**d["model"], "vocab_size": 64}})
    ctx = Context(objectives.training_scenario(sc))
    stream = replay_stream(rank_stream(ctx, ctx.stages[0], traced_only=True), allocator_conf(ctx))
    err = estimate(sc).peak_allocated_bytes / stream.peak_allocated - 1
    assert -0.003 <= err < 0.003, err


@pytest.mark.parametrize("name", AMP_CASES)
def test_the_estimates_allocated_is_not_under_the_stream(name: str) -> None:
    """The stream replays the compiled autocast traces' (``--inductor-passes``) allocated within 0.3% (Qwen3, the
    64-token Llama: their peak is in the top layer's backward); the estimate's is at most 0.7% under it (Qwen3, whose
    stream is 0.2% over its trace: the tied head's weight gradient, 2 B V h in the trace, 4 B in the stream, is not
    in the first micro-batch's moment at the top of backward, states/gradients.one_gpu_backward) and under 1.5% over
    (the small
    Llama, Qwen2: the loss's fp32 T x V gradient the moments count at the loss's backward, which Inductor's
    joint-graph pass fuses away)."""
    from memsim_widget.engine.rl import objectives

    sc = _sc(name)
    ctx = Context(objectives.training_scenario(sc))
    stream = replay_stream(rank_stream(ctx, ctx.stages[0], traced_only=True), allocator_conf(ctx))
    err = estimate(sc).peak_allocated_bytes / stream.peak_allocated - 1
    assert -0.007 <= err < 0.015, err


def test_the_planner_gives_the_estimates_figures_for_compiled_autocast() -> None:
    """plan/vector reads the new groups from the same table (``moments.MOMENT_TABLE``)."""
    from memsim_widget.plan import plan

    base = {**dict(COMPILED_CASES)["qwen3 amp-bf16 sdpa b2 s512 compiled"], "reserved_model": "fitted"}
    p = plan(base=base, gpu="h100-80gb", gpus=(1, 2), top=10)
    assert p.listed > 0
    assert "backward_top" in set(p.columns["peak_phase"][p.ranking[: p.top]])
    assert p.mismatches(np.arange(p.evaluated)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", AMP_CASES)
def test_the_compiled_autocast_estimate_holds_its_inductor_traces_allocated(name: str) -> None:
    """Against the traces under ``trace/compiled.inductor_passes`` (replayed): the estimate's peak allocated at
    most 0.5% under (before: the 64-token Llama -2.12%, Qwen3 -4.59%) and under 1.5% over (the small Llama
    +1.27%, Qwen2 +1.29%: the loss's fp32 gradient, see above)."""
    from stream_vs_trace import compiled_figures

    r = compiled_figures(name, inductor=True)
    err = estimate(_sc(name)).peak_allocated_bytes / int(r["trace_allocated"]) - 1
    assert -0.005 <= err < 0.015, (err, r)
