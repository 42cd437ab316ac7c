"""engine/counters/alloc_stream under ``compile: true`` and autocast (amp-bf16): a compiled autocast layer's buffers
as the compiled fake-tensor trace makes them (engine/activations/compiled_amp_steps.py; trace/compiled.py under
``inductor_passes``; docs/allocator.md, "Compiled steps")."""

from __future__ import annotations

import pytest
from fidelity_cases import COMPILED_CASES

from memsim_widget import Scenario
from memsim_widget.engine.activations.compiled_amp_steps import (
    compiled_amp_applies,
    compiled_amp_backward,
    compiled_amp_forward,
    params,
    places,
)
from memsim_widget.engine.activations.compiled_backward import CONSTANT, FREE_SAVED, GRADS, TANGENT
from memsim_widget.engine.activations.compiled_olmo2_steps import KEEP, KEEP_SAVED
from memsim_widget.engine.activations.compiled_steps import compiled_steps_written
from memsim_widget.engine.activations.forward import HELD, SAVED_BYTES
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import rank_stream
from memsim_widget.engine.counters.allocator import FREE

#: The small Llama of the fidelity cases under autocast: T = 2 x 512 tokens, h 256, 8 heads of 32, 4 KV heads (kv*d
#: 128), I 688, 4 layers.
LLAMA_AMP = "llama amp-bf16 sdpa b2 s512 compiled"
T, H, KV, I = 1024, 256, 128, 688


def _ctx(name: str) -> Context:
    return Context(Scenario.from_dict({**dict(COMPILED_CASES)[name], "reserved_model": "replay"}))


def _signed(ctx: Context, phase: str) -> list[int]:
    """The stream's events of ``phase`` as signed sizes (a free as minus the freed tensor's bytes)."""
    stream = rank_stream(ctx, ctx.stages[0], traced_only=True)
    sizes: dict[int, int] = {}
    for h, n, _ in stream.events:
        if n != FREE:
            sizes[h] = n
    marks = [j for j, _ in stream.marks] + [len(stream.events)]
    at = next(i for i, (_, label) in enumerate(stream.marks) if label == phase)
    return [n if n != FREE else -sizes[h] for h, n, _ in stream.events[marks[at] : marks[at + 1]]]


def _holds(run: list[int], events: list[int]) -> bool:
    return any(events[j : j + len(run)] == run for j in range(len(events) - len(run) + 1))


def test_a_compiled_autocast_layers_forward_is_its_traces() -> None:
    """Layer 1's forward of step 2 in the trace (``llama amp-bf16 sdpa b2 s512`` under ``inductor_passes``), event
    by event, signed bytes: its fp32 input (the layer below's residual sum, 4 B T h) before that layer's down_proj
    output is freed; the input norm's fp32 mean around its rsqrt; q_proj's 16-bit weight copy (2 B h h), the norm's
    16-bit output, q_proj's output; k_proj's copy and output, v_proj's copy and v (2 B h kv*d, 2 B T kv*d); RoPE's
    fp32 k (4 B T kv*d, held by the returned KV cache until the forward ends); k_proj's output freed; k and q after
    RoPE in 16 bits; q_proj's output freed; the attention output and the logsumexp; o_proj's copy and output; the
    fp32 residual after attention; o_proj's output freed; the MLP norm; gate's copy, the norm's output, gate's
    output, up's copy and output, their product, down's copy and output. The stream writes the same."""
    trace = [
        4 * T * H, -2 * T * H, 4 * T, 4 * T, -4 * T,
        2 * H * H, 2 * T * H, 2 * T * H, 2 * H * KV, 2 * T * KV, 2 * H * KV, 2 * T * KV, 4 * T * KV, -2 * T * KV,
        2 * T * KV, 2 * T * H, -2 * T * H, 2 * T * H, 4 * T * 8, 2 * H * H, 2 * T * H, 4 * T * H, -2 * T * H,
        4 * T, 4 * T, -4 * T,
        2 * H * I, 2 * T * H, 2 * T * I, 2 * H * I, 2 * T * I, 2 * T * I, 2 * H * I, 2 * T * H,
    ]  # fmt: skip
    assert trace[:6] == [1048576, -524288, 4096, 4096, -4096, 131072]  # the trace's bytes, as listed
    assert _holds(trace, _signed(_ctx(LLAMA_AMP), "step 2 forward"))


def test_a_compiled_autocast_layers_backward_is_its_traces() -> None:
    """Layer 2's backward of step 2 in the same trace, event by event: each projection's weight gradient made in
    16 bits (2 B x its elements) and cast to the fp32 parameter's gradient (4 B), each 16-bit weight copy freed
    once its input gradient is made; the input gradients (2 B T h) and the norms' fp32 row sums (4 B T) and weight
    gradients kept (no free in the layer: the residual gradient is summed at the bottom); the KV cache's zero
    gradients freed once dv's and dk's copies are made (v's 16-bit, k's fp32)."""
    trace = [
        524288, 352256, -1409024, 1409024, -352256, -524288, 704512, -352256, 1409024, 352256, 524288, -352256,
        -1409024, 704512, -352256, 1409024, -1409024, -1409024, -1409024, 352256, -524288, 524288, -352256,
        -1409024, 704512, -352256, 1024, 4096, 524288, 131072, 524288, -131072, -524288, 262144, -131072, 524288,
        262144, 262144, -262144, -262144, -524288, -524288, -32768, -524288, 262144, 131072, 262144, -131072,
        262144, -262144, 524288, 262144, 524288, -262144, 524288, -524288, 262144, -262144, -262144, 65536, 524288,
        -65536, -262144, 131072, -65536, 262144, -524288, -262144, -262144, -262144, 65536, 524288, -65536,
        -262144, 131072, -65536, 524288, -524288, -524288, -524288, 131072, -524288, 524288, -131072, -524288,
        262144, -131072, 1024, 4096,
    ]  # fmt: skip
    assert trace[:3] == [
        2 * T * H,
        2 * H * I,
        -2 * T * I,
    ]  # the MLP's 16-bit gradient, down's weight gradient
    assert _holds(trace, _signed(_ctx(LLAMA_AMP), "step 2 backward"))


@pytest.mark.parametrize("model", ["llama-3.2-1b", "qwen3-0.6b", "qwen2.5-0.5b"])
def test_a_compiled_autocast_layers_backward_frees_what_it_makes(model: str) -> None:
    """Every buffer the layer's backward makes is freed in the layer but RoPE's shared zero buffers and what is
    kept to the bottom (``KEEP``: five input gradients, two row sums); each saved tensor is freed or kept once; each
    parameter's gradient is made once (Qwen2's q/k/v biases and Qwen3's q/k norms among them); the KV cache's two
    zero gradients are freed in it."""
    ctx = Context(
        Scenario.from_dict({"model": model, "precision": "amp-bf16", "compile": True, "seq_len": 256})
    )
    assert compiled_amp_applies(ctx)
    steps = compiled_amp_backward(ctx)
    live: dict[str, int] = {}
    kept = []
    for name, size in steps:
        if name.startswith((GRADS, FREE_SAVED, CONSTANT, KEEP_SAVED)) or name == TANGENT:
            continue
        if name.startswith(KEEP):
            kept.append(size)
        elif size > 0:
            assert name not in live
            live[name] = size
        else:
            del live[name]
    assert live == {}
    assert len(kept) == 7
    assert sorted(int(n[len(GRADS) :]) for n, _ in steps if n.startswith(GRADS)) == sorted(
        params(ctx).values()
    )
    freed = [n[len(FREE_SAVED) :] for n, _ in steps if n.startswith(FREE_SAVED)]
    freed += [n[len(KEEP_SAVED) :] for n, _ in steps if n.startswith(KEEP_SAVED)]
    assert sorted(map(int, freed)) == sorted(places(ctx).values())
    assert [n for n, _ in steps if n == TANGENT] == [TANGENT] * 2


def test_qwen3s_autocast_rope_backward_runs_in_fp32() -> None:
    """With Qwen3's q/k norms (an fp32 weight times a 16-bit input) RoPE's backward runs in fp32: its product and
    scatters are 4 B x T x kv*d for k (qwen3-0.6b at b1 x 256: 8 KV heads of 128), the Llama layout's 2 B."""
    for model, width in (("qwen3-0.6b", 4), ("llama-3.2-1b", 2)):
        ctx = Context(
            Scenario.from_dict({"model": model, "precision": "amp-bf16", "compile": True, "seq_len": 256})
        )
        kv = 8 * (128 if model == "qwen3-0.6b" else 64)
        assert (f"{CONSTANT}k", width * 256 * kv) in compiled_amp_backward(ctx)


def test_layer_0_saves_o_projs_16_bit_output_and_the_cache_holds_an_fp32_k() -> None:
    """Layer 0 saves o_proj's 16-bit output (2 B T h) where the others save the fp32 residual after attention
    (4 B T h: the trace's layer 0 recomputes the sum from the embedding's output it saves anyway); every layer's
    RoPE makes an fp32 k (4 B T kv*d) the returned KV cache holds until the forward ends."""
    ctx = _ctx(LLAMA_AMP)
    first, other = compiled_amp_forward(ctx, first=True), compiled_amp_forward(ctx)
    assert [s for s in first if s[0] == SAVED_BYTES] == [(SAVED_BYTES, 2 * T * H)]
    assert [s for s in other if s[0] == SAVED_BYTES] == [(SAVED_BYTES, 4 * T * H)]
    assert [s for s in other if s[0].startswith(HELD)] == [(f"{HELD}kf", 4 * T * KV)]


def test_compiled_autocast_replays_by_default_with_its_weights_in_module_order() -> None:
    """The autocast stream is held to its traces (reserved to the byte on the small Llama, Qwen2, the 64-token Llama
    and Qwen3, tests/engine/test_alloc_stream_compiled.py), so an unset ``reserved_model`` replays it; it writes the
    weights one tensor at a time in the module's order, as the model is built (grouped by kind, one size per
    group, the small Llama's stream was one 2 MiB small segment under its trace)."""
    from memsim_widget.engine.activations.compiled_steps import weights_in_module_order

    ctx = _ctx(LLAMA_AMP)
    assert compiled_amp_applies(ctx) and compiled_steps_written(ctx) and weights_in_module_order(ctx)
    setup = _signed(ctx, "weights")
    # the embedding (V x h), then layer 0's q, k, v, o, gate, up, down and its two norms, in fp32
    assert setup[:10] == [
        4 * 1000 * H,
        4 * H * H,
        4 * KV * H,
        4 * KV * H,
        4 * H * H,
        *[4 * I * H] * 3,
        4 * H,
        4 * H,
    ]
