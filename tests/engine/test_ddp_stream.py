"""The allocation stream of a DDP rank (``engine/counters/ddp_stream.py``): torch 2.13's bucket assignment, the
wrap-time broadcast and buckets, the rebuild at the second step, held to real DDP run on the CPU
(``benchmarks/ddp_trace.py``)."""

from __future__ import annotations

import sys

import pytest
from fidelity_cases import LLAMA_H512_V32K
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget import Scenario, estimate
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import StreamWriter, rank_stream
from memsim_widget.engine.counters.allocator import FREE
from memsim_widget.engine.counters.ddp_stream import (
    BUCKET_CAP_BYTES,
    FIRST_BUCKET_BYTES,
    DdpBuckets,
    DdpWriter,
    broadcast_buffers,
    bucket_assignment,
    layer_use_order,
    rank_buckets,
    typed_bucket_assignment,
)
from memsim_widget.engine.counters.replayable import replayable

MiB = 2**20
BASE = {"model": LLAMA_H512_V32K, "micro_batch_size": 2, "seq_len": 512, "reserved_model": "replay"}


def ddp(checkpointing: str = "none", dp: int = 2, **keys: object) -> dict:
    """``BASE`` in fp32 with DDP over ``dp`` ranks (HF Trainer: ``find_unused_parameters`` unless checkpointing)."""
    return {
        **BASE,
        "precision": "fp32",
        "activation_checkpointing": checkpointing,
        "parallel": {"dp": dp},
        **keys,
    }


def test_a_bucket_closes_once_it_reaches_its_limit_and_the_limits_advance():
    # 0.6 + 0.6 MiB reach the 1 MiB first limit; then 25 MiB buckets: 10 + 10 + 10 closes at 30, the rest is open
    sizes = [6 * MiB // 10, 6 * MiB // 10, 10 * MiB, 10 * MiB, 10 * MiB, 3 * MiB]
    assert bucket_assignment(sizes, [FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES]) == (
        2 * (6 * MiB // 10),
        30 * MiB,
        3 * MiB,
    )
    assert bucket_assignment(sizes, [sys.maxsize]) == (
        sum(sizes),
    )  # find_unused_parameters=False: one bucket


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 40 * MiB), min_size=1, max_size=60))
def test_buckets_hold_every_byte_and_only_the_last_is_under_its_limit(sizes):
    out = bucket_assignment(sizes, [FIRST_BUCKET_BYTES, BUCKET_CAP_BYTES])
    assert sum(out) == sum(sizes)
    limits = [FIRST_BUCKET_BYTES] + [BUCKET_CAP_BYTES] * len(out)
    assert all(b >= limit for b, limit in zip(out[:-1], limits, strict=False))


#: The Llama of ``LLAMA_H512_V32K`` in fp32, its tensors' bytes (4 layers; untied 32000 x 512 embeddings and
#: head; q and o 512 x 512, k and v 256 x 512 (4 of 8 heads), gate, up and down 1376 x 512, norms 512)
EMB = 32000 * 512 * 4
Q, KV, MLP, NORM = 512 * 512 * 4, 256 * 512 * 4, 1376 * 512 * 4, 512 * 4
LAYER = 2 * Q + 2 * KV + 3 * MLP + 2 * NORM


def test_the_buckets_at_wrap_are_the_ones_real_ddp_made():
    """``find_unused_parameters=True``: module order, the embeddings alone reach the 1 MiB first limit, then
    25 MiB buckets; allocated in reverse. DDP's ``bucket_sizes`` on the CPU (benchmarks/ddp_trace.py):
    85,600,256, 26,353,664 and 65,536,000 in that order."""
    ctx = Context(Scenario.from_dict(ddp()))
    b = rank_buckets(ctx, ctx.stages[0])
    # module order: embeddings | layers 0-1 and layer 2's q, k, v, o (reach 25 MiB) | the rest and the head
    second = 2 * LAYER + 2 * Q + 2 * KV
    assert second == 26_353_664
    total = 2 * EMB + 4 * LAYER + NORM
    assert b.initial == (total - EMB - second, second, EMB) == (85_600_256, 26_353_664, 65_536_000)
    assert b.rebuilt == ()  # no rebuild with find_unused_parameters
    assert b.used_map == 4 * (2 + 4 * 9 + 1)  # an int32 per parameter tensor
    assert b.broadcast == (2 * EMB + 4 * LAYER + NORM,)  # every parameter, under 250 MiB: one flat buffer


def test_the_rebuild_assigns_buckets_in_the_order_gradients_became_ready():
    """Checkpointing: ``find_unused_parameters=False``, one bucket at wrap, rebuilt at the second forward over the
    ready order: the head alone passes 1 MiB; then the final norm, layers 3 and 2 (each down, up, gate, the
    post-attention norm, o, v, k, q, the input norm) and layer 1's down and up reach 25 MiB. The rebuild traced
    on the CPU allocated 65,536,000, 28,846,080 and 83,107,840 bytes."""
    ctx = Context(Scenario.from_dict(ddp("full")))
    b = rank_buckets(ctx, ctx.stages[0])
    total = 2 * EMB + 4 * LAYER + NORM
    assert b.initial == (total,)
    second = NORM + 2 * LAYER + 2 * MLP
    assert b.rebuilt == (EMB, second, total - EMB - second) == (65_536_000, 28_846_080, 83_107_840)
    assert b.used_map == 0


#: LoRA of rank 64 on every Linear of the layers (fp32 adapters): A is 64 x in, B out x 64, 4 B each
R = 64 * 4
ATTN_AD = 2 * R * 512 + R * (512 + 256) * 2 + R * 512 * 2  # q and o: A and B of 512; k and v: A 512, B 256
MLP_AD = 3 * R * (512 + 1376)  # gate, up (A 512, B 1376), down (A 1376, B 512)
LORA = {"method": "lora", "lora": {"rank": 64, "targets": ["all-linear"]}}


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_under_lora_only_the_adapters_are_bucketed_as_real_ddp_did(checkpointing):
    """DDP buckets the parameters that require a gradient (``_build_params_for_reducer``): peft's adapters,
    in module order (A then B after each frozen base); layer 0's q, k, v, o adapters (896 KiB) and gate's A
    (128 KiB) reach the 1 MiB first limit exactly, the rest (under 25 MiB) is one bucket; allocated in reverse.
    HF Trainer asks a peft model (no ``PreTrainedModel``) for ``find_unused_parameters`` even when
    checkpointing: no rebuild, an int32 map entry per adapter. The broadcast still syncs every parameter,
    frozen ones too. Real DDP on the CPU (benchmarks/ddp_trace.py --lora) made buckets of 8,421,376 and
    1,048,576 B, a 224 B map and a 186,960,128 B flat buffer (with RoPE's 256 B buffer)."""
    ctx = Context(Scenario.from_dict(ddp(checkpointing, **LORA)))
    b = rank_buckets(ctx, ctx.stages[0])
    adapters = 4 * (ATTN_AD + MLP_AD)
    first = ATTN_AD + R * 512
    assert first == FIRST_BUCKET_BYTES
    assert b.initial == (adapters - first, first) == (8_421_376, 1_048_576)
    assert b.rebuilt == ()
    assert b.used_map == 4 * (4 * 7 * 2) == 224
    assert b.broadcast == (2 * EMB + 4 * LAYER + NORM + adapters,) == (186_960_128 - 256,)


def test_each_dtype_has_its_own_buckets_sorted_by_their_first_tensor():
    """``compute_bucket_assignment_by_size``: per dtype, its own limits; then sorted by first tensor index."""
    tensors = [(6, "bf16"), (2, "fp32"), (5, "bf16"), (9, "fp32"), (1, "bf16"), (4, "fp32")]
    # bf16: 6 + 5 reaches 10 at tensor 2 -> [0, 2], then 1 open; fp32: 2 + 9 at tensor 3 -> [1, 3], then 4 open
    assert typed_bucket_assignment(tensors, [10]) == (11, 11, 1, 4)
    assert typed_bucket_assignment([(n, "") for n, _ in tensors], [10]) == bucket_assignment(
        [n for n, _ in tensors], [10]
    )


def test_a_bf16_base_and_fp32_adapters_are_broadcast_in_two_flat_buffers():
    """peft keeps the adapters fp32 over a bf16 base (``autocast_adapter_dtype``): the broadcast's bf16 buffer
    opens at the embeddings, the fp32 one at layer 0's first adapter, in that order. Traced on the CPU
    (benchmarks/ddp_trace.py --lora --bf16): 88,745,088 B (RoPE's 128 B buffer with it) and 9,469,952 B."""
    ctx = Context(Scenario.from_dict(ddp(precision="bf16", **LORA)))
    b = rank_buckets(ctx, ctx.stages[0])
    assert (
        b.broadcast == ((2 * EMB + 4 * LAYER + NORM) // 2, 4 * (ATTN_AD + MLP_AD)) == (88_744_960, 9_469_952)
    )
    assert b.initial == (8_421_376, 1_048_576)


#: QLoRA over the same layers (bf16 compute): each Linear of a layer quantised, bitsandbytes' ``Params4bit``
#: holding ceil(n / 2) uint8 NF4 codes; q 512 x 512, k and v 256 x 512, o 512 x 512, gate, up, down 1376 x 512
LAYER_LINEARS = 2 * 512 * 512 + 2 * 256 * 512 + 3 * 1376 * 512
QLORA = {"method": "qlora", "precision": "bf16", "lora": {"rank": 64, "targets": ["all-linear"]}}


def test_under_qlora_the_nf4_codes_are_broadcast_in_a_uint8_flat_buffer_of_their_own():
    """DDP's broadcast syncs every parameter, frozen ones too, per dtype (``compute_bucket_assignment_by_size``):
    the bf16 buffer opens at the embeddings and holds what bitsandbytes leaves unquantised (embeddings, norms,
    head), the uint8 one opens at layer 0's q_proj (its packed NF4 codes, half a byte per weight; the absmax
    and code of its ``QuantState`` are no parameters), the fp32 one at its first adapter; the buckets are the
    adapters' as under LoRA. Real DDP over bitsandbytes 0.50.2's Linear4bit on the CPU
    (benchmarks/ddp_trace.py --qlora) made flat buffers of 65,545,344 B (RoPE's 128 B buffer with it),
    5,799,936 B and 9,469,952 B, then buckets of 8,421,376 and 1,048,576 B and a 224 B map."""
    ctx = Context(Scenario.from_dict(ddp(**QLORA)))
    b = rank_buckets(ctx, ctx.stages[0])
    unquantised = 2 * 32000 * 512 + (2 * 4 + 1) * 512  # embeddings, head; two norms per layer, the final one
    assert b.broadcast == (2 * unquantised, 4 * LAYER_LINEARS // 2, 4 * (ATTN_AD + MLP_AD))
    assert b.broadcast == (65_545_344 - 128, 5_799_936, 9_469_952)
    assert b.initial == (8_421_376, 1_048_576)
    assert b.rebuilt == ()
    assert b.used_map == 224


def test_a_broadcast_bucket_of_one_tensor_allocates_no_flat_buffer_but_holds_its_place_in_flight():
    """``flatten_dense_tensors`` views a lone tensor instead of concatenating (``tensor_flatten.h``): an embedding
    of 250 MiB or more fills a broadcast bucket alone and is sent as itself, yet its ``BroadcastWork`` is one of
    the two in flight, so the next real buffer waits for it, not for the one before."""
    big = 300 * MiB
    tensors = [(big, "bf16"), (MiB, "uint8"), (MiB, "bf16"), (MiB, "uint8"), (big, "bf16"), (MiB, "fp32")]
    # bf16: the embedding alone (a view), then a MiB and the head together; uint8: two; fp32: one (a view too)
    assert broadcast_buffers(tensors) == (0, 2 * MiB, big + MiB, 0)
    s = StreamWriter()
    DdpWriter(s, DdpBuckets((100, 0, 50), (), ())).wrap()
    assert _sized(s) == [100, "free 100", 50, "free 50"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 400 * MiB), st.sampled_from(["bf16", "fp32", "uint8"])),
        min_size=1,
        max_size=30,
    )
)
def test_the_broadcast_copies_every_tensor_once_but_the_lone_ones(tensors):
    """Each broadcast bucket is a flat copy of its tensors or, alone in its bucket, the tensor itself: the flat
    buffers and the lone tensors add up to every tensor's bytes, one entry per bucket, and a flat buffer holds
    at least two tensors so it is never smaller than the smallest tensor twice over."""
    flat = broadcast_buffers(tensors)
    buckets = typed_bucket_assignment(tensors, [250 * MiB])
    assert len(flat) == len(buckets)
    lone = [n for n, f in zip(buckets, flat, strict=True) if f == 0]
    assert sum(flat) + sum(lone) == sum(n for n, _ in tensors)
    assert all(f == n for n, f in zip(buckets, flat, strict=True) if f)
    assert all(f >= 2 * min(n for n, _ in tensors) for f in flat if f)


def test_under_lora_the_stream_writes_the_adapters_buckets_and_its_formula_says_so():
    ctx = Context(Scenario.from_dict(ddp(**LORA)))
    s = rank_stream(ctx, ctx.stages[0])
    wrap = [label for _, label in s.marks].index("DDP wrap")
    made = [size for _, size, _ in s.events[s.marks[wrap][0] : s.marks[wrap + 1][0]] if size != FREE]
    assert made[:4] == [186_959_872, 8_421_376, 1_048_576, 224]
    assert "DDP's wrap-time broadcast" in estimate(Scenario.from_dict(ddp(**LORA))).ranks[0].reserved.formula


def test_a_layers_norms_run_before_their_block():
    names = [
        "a.q_proj",
        "a.k_proj",
        "a.mlp.gate_proj",
        "a.mlp.down_proj",
        "input_layernorm",
        "post_attention_layernorm",
    ]
    assert layer_use_order(names) == [4, 0, 1, 5, 2, 3]


def test_tied_embeddings_are_the_last_gradient_ready():
    ctx = Context(Scenario.from_dict(ddp("full", model="qwen2.5-0.5b", seq_len=256)))
    b = rank_buckets(ctx, ctx.stages[0])
    emb = 151936 * 896 * 4
    assert b.rebuilt[-1] >= emb and b.rebuilt[0] < emb  # the final norm opens the first bucket, not the head


def _sized(s: StreamWriter) -> list[int | str]:
    sizes = {h: size for h, size, _ in s.events if size != FREE}
    return [size if size != FREE else f"free {sizes[h]}" for h, size, _ in s.events]


def test_the_wrap_broadcasts_two_flat_buffers_at_a_time_then_makes_the_buckets():
    s = StreamWriter()
    w = DdpWriter(s, DdpBuckets((300, 300, 100), (50, 60), (), 8))
    w.wrap()
    assert _sized(s) == [300, 300, "free 300", 100, "free 300", "free 100", 50, 60, 8]
    w.rebuild()  # no rebuild
    assert len(s.events) == 9


def test_the_rebuild_frees_the_old_buckets_before_making_the_new_ones():
    s = StreamWriter()
    w = DdpWriter(s, DdpBuckets((110,), (110,), (10, 100)))
    w.wrap()
    w.rebuild()
    assert _sized(s)[2:] == [110, "free 110", 10, 100]


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_the_stream_writes_the_buckets_once_and_rebuilds_at_step_2(checkpointing):
    """The buckets' item (``states/gradients``) is written by the DDP writer only: the stream holds the engine's
    bytes of it once, at wrap, and without ``find_unused_parameters`` the rebuild comes before step 2's
    forward."""
    ctx = Context(Scenario.from_dict(ddp(checkpointing)))
    s = rank_stream(ctx, ctx.stages[0])
    b = rank_buckets(ctx, ctx.stages[0])
    labels = [label for _, label in s.marks]
    assert "DDP wrap" in labels
    wrap = labels.index("DDP wrap")
    start, end = s.marks[wrap][0], s.marks[wrap + 1][0]
    made = [size for _, size, _ in s.events[start:end] if size != FREE]
    ddp_made = [*b.broadcast, *b.initial, *([b.used_map] if b.used_map else [])]
    assert (
        made[: len(ddp_made)] == ddp_made
    )  # then the forward thread's cuBLAS workspace, at the first forward
    assert made[len(ddp_made) :] == [32 * MiB]
    assert ("step 2 DDP bucket rebuild" in labels) == (checkpointing == "full")
    one = rank_stream(
        Context(Scenario.from_dict({**ddp(checkpointing), "parallel": {"dp": 1}})), ctx.stages[0]
    )
    # beside the one-GPU stream: the broadcast, the buckets, the map and the rebuild only
    extra = len(b.broadcast) * 2 + len(b.initial) + bool(b.used_map) + (len(b.initial) + len(b.rebuilt))
    assert len(s.events) - len(one.events) == extra - (0 if b.rebuilt else len(b.initial))


@pytest.mark.parametrize(
    ("d", "ok"),
    [
        (ddp(), True),
        (ddp("full", grad_accum_steps=3), True),
        ({**ddp(), "parallel": {"dp": 2, "zero": 1}}, False),
        ({**ddp(), "parallel": {"dp": 2, "tp": 2}}, False),
        (ddp(method="lora"), True),  # fp32 adapters beside fp32 weights
        (ddp("full", method="lora", precision="amp-bf16"), True),  # autocast: the weights fp32
        (ddp(method="lora", precision="bf16"), True),  # fp32 adapters beside bf16 weights: two dtypes
        (ddp(method="lora", precision="bf16", lora={"adapter_dtype": "bf16"}), True),
        (ddp(method="lora", precision="mixed-bf16"), False),  # a base dtype the recipe does not name
        (ddp(**QLORA), True),  # NF4 codes (uint8) beside a bf16 rest and fp32 adapters: three dtypes
        (ddp(method="qlora"), True),  # the rest fp32
        ({**ddp(**QLORA), "precision": "mixed-bf16"}, False),  # a base dtype the recipe does not name
        (ddp(compile=True), False),
        (ddp(framework="torchtitan"), False),
    ],
)
def test_the_stream_models_plain_ddp_ranks_only(d: dict, ok: bool) -> None:
    ctx = Context(Scenario.from_dict(d))
    assert replayable(ctx) == ok
    formula = estimate(Scenario.from_dict(d)).ranks[0].reserved.formula
    assert ("DDP's wrap-time broadcast" in formula) == ok


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_ddp_adds_what_it_added_to_the_traced_run(checkpointing):
    """Real DDP on the CPU (benchmarks/ddp_trace.py, this model at 2 x 512, fp32, two steps): the trace replayed
    with the wrapper reserves 178,257,920 B more than without, with either ``find_unused_parameters``: the
    buckets' 177,489,920 B rounded to a 2 MiB multiple, their one segment (the broadcast's freed flat buffer,
    as large, is where they are cut from). The engine's stream adds the same."""
    from memsim_widget.engine.counters.alloc_stream import replay_stream
    from memsim_widget.engine.frameworks import allocator_conf

    peaks = []
    for dp in (2, 1):
        ctx = Context(Scenario.from_dict({**ddp(checkpointing), "parallel": {"dp": dp}}))
        peaks.append(replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx)).peak_reserved)
    assert peaks[0] - peaks[1] == 178_257_920 == -(-177_489_920 // (2 * MiB)) * 2 * MiB


@pytest.mark.slow
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16-base"])
def test_under_lora_the_engines_ddp_buffers_on_the_traced_steps_reserve_what_real_ddp_did(bf16):
    """Real DDP over a peft LoRA model on the CPU (benchmarks/ddp_trace.py --lora: gloo, world size 1, two
    steps): its ``bucket_sizes`` are the engine's, and the traced steps without DDP with the engine's DDP buffers
    written after the weights (as the stream writes them) replay to the traced DDP run's peak reserved byte for
    byte (a bf16 base too: its two flat buffers). What DDP adds depends on which steps reuse the broadcast's
    freed segment around the small buckets (fp32: +155,189,248 B on the CPU trace's ops, +8,388,608 B on the
    engine's CUDA stream), so only this is compared."""
    pytest.importorskip("peft")
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import ddp_trace

    plain = ddp_trace.traced_run(None, 29631, ddp_trace.LORA_RANK, bf16)
    real = ddp_trace.traced_run(True, 29632, ddp_trace.LORA_RANK, bf16)
    ctx = Context(Scenario.from_dict(ddp(**LORA, **({"precision": "bf16"} if bf16 else {}))))
    b = rank_buckets(ctx, ctx.stages[0])
    assert tuple(real["bucket_sizes"]) == b.initial
    assert ddp_trace.with_engine_ddp(plain, b) == ddp_trace.replayed(real["events"])


#: Qwen2.5-0.5B's vocabulary and width on two layers, untied: its bf16 embedding (272 MB) fills a broadcast
#: bucket alone (``broadcast_buffers``)
QWEN_V152K_L2 = {
    **LLAMA_H512_V32K, "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 2,
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("model", [None, QWEN_V152K_L2], ids=["llama-h512-v32k", "qwen-v152k-l2"])
def test_under_qlora_the_engines_ddp_buffers_on_the_traced_steps_reserve_what_real_ddp_did(model):
    """Real DDP over a peft QLoRA model on the CPU (benchmarks/ddp_trace.py --qlora: bitsandbytes 0.50.2's NF4
    Linear4bit with real tensors, gloo, world size 1, two steps): its ``bucket_sizes`` are the engine's, its
    flat buffers the engine's (the bf16 one with RoPE's 128 B buffer; none for a lone embedding), and the
    traced steps without DDP with the engine's DDP buffers written after the weights replay to the traced DDP
    run's peak reserved byte for byte (3,074,424,832 B for the Qwen-vocabulary one: 260,047,872 B less than
    when the stream wrote a flat copy of the lone embedding)."""
    pytest.importorskip("bitsandbytes")
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import ddp_trace

    plain = ddp_trace.traced_run(None, 29641, ddp_trace.LORA_RANK, qlora=True, model_config=model)
    real = ddp_trace.traced_run(True, 29642, ddp_trace.LORA_RANK, qlora=True, model_config=model)
    ctx = Context(Scenario.from_dict(ddp(**QLORA, **({"model": model} if model else {}))))
    b = rank_buckets(ctx, ctx.stages[0])
    assert tuple(real["bucket_sizes"]) == b.initial
    made = [n for n in b.broadcast if n]
    flat = [size for _, size, _ in real["wrap"] if size >= MiB][: len(made)]
    assert flat == [n + 128 if n == b.broadcast[0] else n for n in made]
    assert ddp_trace.with_engine_ddp(plain, b) == ddp_trace.replayed(real["events"])


@pytest.mark.parametrize(
    ("name", "traced"),
    [("ddp-dp4-eager", (1_166_016_512, 1_026_397_696)), ("ddp-dp4-eager-ckpt", (1_008_730_112, 831_464_960))],
)
def test_eager_attention_on_a_ddp_rank_replays_as_its_recorded_trace(name: str, traced: tuple) -> None:
    """transformers' eager attention on a DDP rank of the small Llama with its 32k vocabulary (dp 4, 2 x 512
    tokens, without and with full checkpointing; ``stream_vs_trace.RECORDED``, traced by
    ``benchmarks/allocator_replay_fsdp.py --record``): the engine's stream, its layers the engine's items, replays
    within 1% reserved and 0.5% allocated of the recorded trace (a guard: measured -0.18% / -0.18% and
    +0.83% / -0.08% when it was first recorded; the peak is the loss's, after the layers)."""
    from stream_vs_trace import recorded_figures

    t, ours = recorded_figures(name)
    assert (t.peak_reserved, t.peak_allocated) == traced
    assert abs(ours.peak_reserved / t.peak_reserved - 1) < 0.01, (ours.peak_reserved, t.peak_reserved)
    assert abs(ours.peak_allocated / t.peak_allocated - 1) < 0.005, (ours.peak_allocated, t.peak_allocated)
