"""engine/counters/alloc_stream: the allocation stream the engine builds from its own groups and replays for the reserved
counter. These tests hold the stream to what it claims to be: well formed, holding the engine's tensors, in the
order a PyTorch step runs (checked against the fake-tensor traces in docs/allocator.md)."""

from __future__ import annotations

import pytest
from fidelity_cases import LLAMA_H512_V32K

from memsim_widget import Scenario, estimate
from memsim_widget.engine.activations.forward import (
    IN,
    OUT,
    SAVED,
    final_norm_transients,
    layer_forward_transients,
)
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import (
    STEPS,
    grad_order,
    pool_replay,
    rank_stream,
    replay_stream,
)
from memsim_widget.engine.counters.allocator import FREE, SMALL_BUFFER, replay
from memsim_widget.engine.frameworks import allocator_conf
from memsim_widget.engine.items import Item
from memsim_widget.engine.rl import objectives
from memsim_widget.scenario import DEFAULT_RESERVED_MODEL, RESERVED_MODELS

LLAMA = {
    "model": "llama-3.2-1b",
    "micro_batch_size": 4,
    "seq_len": 1024,
    "precision": "bf16",
    "reserved_model": "replay",
}


def _stream(d: dict, steps: int = STEPS) -> list:
    ctx = Context(objectives.training_scenario(Scenario.from_dict(d)))
    return rank_stream(ctx, ctx.stages[0], steps).events


#: Accumulating steps (3 micro-batches): tied embeddings, full checkpointing, LoRA.
ACCUMULATING = [
    {**LLAMA, "grad_accum_steps": 3},
    {**LLAMA, "grad_accum_steps": 3, "activation_checkpointing": "full"},
    {**LLAMA, "grad_accum_steps": 3, "method": "lora", "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]}},
]


@pytest.mark.parametrize("d", [LLAMA, *ACCUMULATING])
def test_every_free_follows_its_allocation_once(d: dict) -> None:
    """Every handle is allocated once and freed at most once, after it; every allocation has bytes but, under
    LoRA, the empty requests of layer 0's first norm (its fp32 input and rsqrt: nothing before the first adapter
    needs a gradient), which keep every layer's handles alike for the copied layers (``tensor_sizes``)."""
    live: set[object] = set()
    empty = 0
    for handle, size, _ in _stream(d):
        if size == FREE:
            assert handle in live
            live.remove(handle)
        else:
            assert handle not in live and size >= 0
            empty += size == 0
            live.add(handle)
    assert (empty > 0) == (d.get("method") == "lora")


@pytest.mark.parametrize("d", [LLAMA, *ACCUMULATING])
def test_the_stream_holds_the_engines_tensors(d: dict) -> None:
    """The replayed peak allocated is the engine's peak allocated within 1%: the same items, cut into tensors
    (each rounded to 512 B on its own) and ordered per layer instead of summed per moment."""
    got = replay(_stream(d)).peak_allocated
    want = estimate(Scenario.from_dict(d)).ranks[0].peak_allocated_bytes
    assert abs(got / want - 1) < 0.01


def test_checkpointing_replays_the_layer_in_forward_and_backward() -> None:
    """Under full checkpointing each layer's saved terms are allocated twice per step (forward, dropped; its
    recompute in backward) beside the checkpointed inputs: more events than without (the plain stream's forward
    transients set aside: its layers' forwards list them, the checkpointed stream's do not), a lower allocated
    peak."""
    plain = _stream(LLAMA, steps=1)
    ckpt = _stream({**LLAMA, "activation_checkpointing": "full"}, steps=1)
    ctx = Context(objectives.training_scenario(Scenario.from_dict(LLAMA)))
    fwd = layer_forward_transients(ctx)
    transients = ctx.arch.num_layers * sum(name != SAVED for name, _ in fwd) + 2  # + the embeddings' output
    assert fwd and not layer_forward_transients(
        Context(
            objectives.training_scenario(Scenario.from_dict({**LLAMA, "activation_checkpointing": "full"}))
        )
    )
    assert len(ckpt) > len(plain) - transients
    assert replay(ckpt).peak_allocated < replay(plain).peak_allocated


def test_gradients_follow_backward_by_parameter_tensor() -> None:
    """Llama 3.2 1B ties its head to the input embeddings: backward makes the embeddings' gradient at the head
    (the top), then each layer's 9 tensors (2 norms, 4 attention and 3 MLP projections), nothing at the bottom;
    every parameter tensor once."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(LLAMA)))
    order = grad_order(ctx, ctx.stages[0])
    h, v = ctx.arch.hidden_size, ctx.arch.vocab_size
    assert v * h in order.top and order.bottom == ()
    assert len(order.layer) == 9
    n_params = sum(order.top) + ctx.arch.num_layers * sum(order.layer) + sum(order.bottom)
    assert n_params == ctx.arch.parameters


def test_parameter_order_is_the_modules():
    """``model.parameters()`` of a Llama: the embeddings first (tied: the head adds no tensor), each layer's 9
    tensors in turn, the final norm last; the same tensors as the backward order, every one once."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(LLAMA)))
    order = grad_order(ctx, ctx.stages[0])
    h, v, n = ctx.arch.hidden_size, ctx.arch.vocab_size, ctx.arch.num_layers
    assert order.params[0] == v * h and order.top_pre == 1
    assert order.params[1 : 1 + 9 * n] == order.layer * n
    assert order.params[-1] == h
    assert sorted(order.params) == sorted(order.top + order.layer * n + order.bottom)


def test_the_optimizer_step_runs_parameter_by_parameter():
    """Adam's first step makes both states of a parameter before the next (``_init_group``: ``exp_avg``, then
    ``exp_avg_sq``), the foreach step's temporaries in parameter order are freed last first, and
    ``zero_grad(set_to_none=True)`` frees the gradients in parameter order: the embeddings' (tied) first."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(LLAMA)))
    order = grad_order(ctx, ctx.stages[0])
    s = rank_stream(ctx, ctx.stages[0], steps=1)
    start = next(n for n, label in s.marks if label == "step 1 optimizer step")
    ev = s.events[start:]
    sizes = {h: size for h, size, _ in s.events if size != FREE}
    emb = sizes[ev[0][0]]
    # the states: two per parameter, in the parameters' order (the embeddings' pair first)
    states = [size for _, size, _ in ev[: 2 * len(order.params)]]
    assert states[0] == states[1] == emb and states[2] == states[3] != emb
    # the temporaries: one per parameter, freed in reverse
    temps = [h for h, size, _ in ev[2 * len(order.params) : 3 * len(order.params)]]
    assert all(sizes[h] != FREE for h in temps)
    freed = [h for h, size, _ in ev[3 * len(order.params) : 4 * len(order.params)]]
    assert freed == temps[::-1]
    # then the gradients: the first freed is the embeddings' gradient
    first_grad = ev[4 * len(order.params)][0]
    assert sizes[first_grad] == emb and ev[4 * len(order.params)][1] == FREE


def test_tied_embeddings_sum_their_two_gradients_out_of_place():
    """A tied weight gets two gradients: the head's (made first, at the top of backward) and the embeddings'
    (made last); autograd sums them into a third tensor and frees the two (traced: ``embedding_dense_backward``,
    ``add``, then the ``mm`` and the embedding gradient freed). Three V x h gradients are alive at once."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(LLAMA)))
    s = rank_stream(ctx, ctx.stages[0], steps=1)
    start = next(n for n, label in s.marks if label == "step 1 backward")
    end = next(n for n, label in s.marks if label == "step 1 optimizer step")
    grad = 2 * ctx.arch.vocab_size * ctx.arch.hidden_size  # bf16
    big = [(h, size) for h, size, _ in s.events[start:end] if size == grad]
    assert len(big) == 3  # the head's, the embeddings', the sum
    head, emb, summed = (h for h, _ in big)
    frees = [h for h, size, _ in s.events[start:end] if size == FREE]
    assert head in frees and emb in frees and summed not in frees


def test_tensor_shares_cut_each_term_exactly():
    """Where a term's tensors differ in size (``shares``), one repeat's shares sum to one and the term's tensors
    are whole repeats of them, so the stream's tensors add up to the term's bytes (within int rounding)."""
    from memsim_widget.engine.caches.parts_cache import cached_activation_groups

    for d in (
        LLAMA,
        {**LLAMA, "model": "qwen3-0.6b"},
        {**LLAMA, "model": "gemma-2-2b", "attention": "eager"},
        {**LLAMA, "model": "gpt2-medium", "precision": "amp-bf16", "attention": "eager"},
        {**LLAMA, "activation_checkpointing": "full"},
    ):
        ctx = Context(objectives.training_scenario(Scenario.from_dict(d)))
        for name, group in cached_activation_groups(ctx, ctx.stages[0]).items():
            for item in group.entries:
                if not item.shares or item.bytes <= 0:
                    continue
                assert abs(sum(item.shares) - 1) < 1e-9, (d["model"], name, item.item)
                assert item.tensors % len(item.shares) == 0, (d["model"], name, item.item)


def test_softcapping_saves_its_tanh_before_the_loss_upcasts():
    """Gemma 2 caps its logits (tanh) in the head, before the loss's fp32 upcast: the stream allocates the
    tanh output (16-bit T x V) before the fp32 upcast (twice its size)."""
    d = {**LLAMA, "model": "gemma-2-2b", "attention": "eager", "micro_batch_size": 2}
    ctx = Context(objectives.training_scenario(Scenario.from_dict(d)))
    s = rank_stream(ctx, ctx.stages[0], steps=1)
    start = next(n for n, label in s.marks if label == "step 1 loss")
    tv = 2 * d["micro_batch_size"] * d["seq_len"] * ctx.arch.vocab_size
    sizes = [size for _, size, _ in s.events[start:] if size != FREE and size >= tv]
    assert sizes[:3] == [tv, tv, 2 * tv]  # the tanh output, the capped logits, their fp32 upcast


def test_the_estimate_reports_the_replay() -> None:
    """The engine's reserved counter is the replay's peak (at least the peak allocated), its formula says where."""
    sc = Scenario.from_dict(LLAMA)
    rank = estimate(sc).ranks[0]
    ctx = Context(objectives.training_scenario(sc))
    rep = pool_replay(ctx, ctx.stages[0])
    assert rank.peak_reserved_bytes == max(rep.peak_reserved, rank.peak_allocated_bytes)
    assert rep.at in rank.reserved.formula and "replayed" in rank.reserved.formula


def test_a_third_step_adds_nothing_here() -> None:
    """The replay stops after two steps: the third step's stream reaches the same peak reserved."""
    two, three = (replay(_stream(LLAMA, steps=n)).peak_reserved for n in (2, 3))
    assert two == three


def _fragmentation_by_model(scenario: dict) -> tuple[Item, dict[str, Item]]:
    """The fragmentation item of ``scenario`` with ``reserved_model`` unset, and under each reserved model."""
    frag = "allocator fragmentation (reserved - allocated)"
    unset = {k: v for k, v in scenario.items() if k != "reserved_model"}

    def item(d: dict) -> Item:
        return {i.item: i for i in estimate(Scenario.from_dict(d)).ranks[0].items}[frag]

    return item(unset), {m: item({**unset, "reserved_model": m}) for m in RESERVED_MODELS}


def test_an_unset_reserved_model_is_the_default_one_and_the_two_models_differ():
    # one constant decides the default (scenario.DEFAULT_RESERVED_MODEL): an unset key gives its figures
    unset, by = _fragmentation_by_model(LLAMA)
    assert unset == by[DEFAULT_RESERVED_MODEL]
    assert by["fitted"].formula.startswith("largest pool")
    assert "replayed" in by["replay"].formula
    assert by["fitted"].bytes != by["replay"].bytes


def test_a_card_with_the_same_stream_reuses_the_replay() -> None:
    """The H100 and the H200 build the same stream (the states' shape key differs: it holds the GPU): the second
    card's replay comes from the per-stream cache, its figures those of a replay made afresh."""
    from memsim_widget.engine.counters import alloc_stream

    h100, h200 = ({**LLAMA, "gpu": g} for g in ("h100-sxm-80gb", "h200"))
    ctx100, ctx200 = (Context(objectives.training_scenario(Scenario.from_dict(d))) for d in (h100, h200))
    assert rank_stream(ctx100, ctx100.stages[0]).events == rank_stream(ctx200, ctx200.stages[0]).events
    alloc_stream.cache_clear()
    pool_replay(ctx100, ctx100.stages[0])
    reused = pool_replay(ctx200, ctx200.stages[0])
    assert alloc_stream._replay_same_stream.cache_info().hits == 1
    alloc_stream.cache_clear()
    assert alloc_stream._replay_same_stream.cache_info().currsize == 0
    assert pool_replay(ctx200, ctx200.stages[0]) == reused


LORA = {**LLAMA, "method": "lora", "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]}}
#: The H200 Qwen3-0.6B run (benchmarks/gpu_measure.py qwen3-06b-bf16): h = 1024, 16 q heads and 8 k/v heads
#: of 128 (q width 2048 > h), I = 3072, per-head q_norm / k_norm.
QWEN3 = {**LLAMA, "model": "qwen3-0.6b", "gpu": "h200", "micro_batch_size": 4, "seq_len": 2048}
#: The H200 OLMo-2-1B run (benchmarks/gpu_measure.py olmo2-1b-bf16): h = 2048, 16 heads of 128 for q, k and
#: v, post-norms with fp32 weights, q/k norms over the whole projection.
OLMO2 = {**LLAMA, "model": "olmo-2-1b", "gpu": "h200"}


def _forward(d: dict) -> tuple[Context, tuple]:
    ctx = Context(objectives.training_scenario(Scenario.from_dict(d)))
    return ctx, layer_forward_transients(ctx)


def test_a_layers_forward_transients_come_and_go_within_it() -> None:
    """Every transient a layer's forward allocates it frees before it returns, but its output; its input is
    freed once; its saved tensors are allocated once, after the MLP's norm."""
    for d in (LLAMA, LORA, QWEN3, OLMO2):
        _, steps = _forward(d)
        live: set[str] = set()
        for name, size in steps:
            if name in (SAVED, IN):
                continue
            assert (name in live) == (size == 0)
            (live.add if size else live.discard)(name)
        assert live == {OUT}
        assert [n for n, _ in steps].count(SAVED) == 1 and [n for n, _ in steps].count(IN) == 1


def test_lora_forward_transients_follow_the_ops() -> None:
    """Llama 3.2 1B (h = a*d = 2048, 8 k/v heads of 64, I = 8192) under LoRA on q and v, fp32 adapters on bf16
    weights: each RMSNorm makes two fp32 T x h tensors (x.pow(2), x * rsqrt) and, its weight frozen, the bf16
    cast and the normed output (nothing saves them: lora_A saves its own fp32 copy); peft's q_proj path three
    fp32 T x a*d (lora_B's output, * scaling, + the base output) and v_proj's three fp32 T x kv*d; the frozen
    down_proj leaves act(gate) * up (bf16 T x I) unsaved."""
    ctx, steps = _forward(LORA)
    T, h, hkv, i = 4 * 1024, 2048, 8 * 64, 8192
    made = [(name, size) for name, size in steps if size > 0]
    assert [s for n, s in made if n in ("pow", "xr")] == [4 * T * h] * 4
    assert [s for n, s in made if n in ("cvt", "n1", "n2")] == [2 * T * h] * 4
    assert [s for n, s in made if n in ("B", "scaled", "sum")] == [4 * T * h] * 3 + [4 * T * hkv] * 3
    assert [s for n, s in made if n == "prod"] == [2 * T * i]
    assert ctx.arch.hidden_size == h and ctx.arch.intermediate_size == i


def test_full_training_saves_what_lora_frees() -> None:
    """Full fine-tuning: the norms' weights train (their bf16 input is saved), q/k/v save the normed output and
    down_proj the T x I product, so none of them is a transient; no fp32 adapter path either."""
    _, steps = _forward(LLAMA)
    T, h = 4 * 1024, 2048
    made = [(name, size) for name, size in steps if size > 0]
    assert [s for n, s in made if n in ("pow", "xr")] == [4 * T * h] * 4
    assert not [n for n, _ in made if n in ("cvt", "n1", "n2", "prod", "B", "scaled", "sum")]


def test_forward_transients_only_where_traced() -> None:
    """Layers the rule was not written from get none, nor a final norm: autocast, checkpointing, eager
    attention, another MLP, Gemma 3's (1 + w) norms, Qwen3's and OLMo 2's q/k norms under LoRA (traced only
    in full training)."""
    for change in (
        {"precision": "amp-bf16"},
        {"activation_checkpointing": "full"},
        {"attention": "eager"},
        {"model": "gpt2-medium", "method": "full"},
        {"model": "gemma-3-1b", "method": "full"},
        {"model": "qwen3-0.6b"},
        {"model": "olmo-2-1b"},
        {"model": "olmo-2-1b", "method": "full", "precision": "amp-bf16"},
    ):
        ctx, steps = _forward({**LORA, **change})
        assert steps == () and final_norm_transients(ctx) == ()
    for d in (LLAMA, LORA, QWEN3, OLMO2):
        ctx, steps = _forward(d)
        assert steps and final_norm_transients(ctx)


def test_qwen3_qk_norms_follow_the_ops() -> None:
    """Qwen3Attention.forward: ``q_norm(q_proj(x).view(...))``, then k's, then v_proj, RoPE on both. Each q/k
    norm (full training, its weight trains) makes and frees an fp32 ``x.pow(2)`` and keeps ``x * rsqrt``
    until its bf16 output is made; the projection's output goes then (the norm saved its fp32 copy), the
    normed q and k once RoPE has read them. T = 8192 tokens: q's fp32 tensors 4 B x T x 2048, k's x 1024."""
    ctx, steps = _forward(QWEN3)
    T, hq, hkv = 4 * 2048, 16 * 128, 8 * 128
    assert (ctx.arch.hidden_size, ctx.arch.facts.norm.qk) == (1024, "head")
    names = [n for n, _ in steps]
    q, k, v = names.index("q"), names.index("k"), names.index("v")
    assert steps[q + 1 : q + 7] == (
        ("pow", 4 * T * hq),
        ("pow", 0),
        ("xr", 4 * T * hq),
        ("qn", 2 * T * hq),
        ("xr", 0),
        ("q", 0),
    )
    assert steps[k + 1 : k + 7] == (
        ("pow", 4 * T * hkv),
        ("pow", 0),
        ("xr", 4 * T * hkv),
        ("kn", 2 * T * hkv),
        ("xr", 0),
        ("k", 0),
    )
    assert q < k < v < names.index("m1") < names.index("qn", q + 5 + 1) < names.index("o")


def test_olmo2_post_norms_and_fp32_rope_follow_the_ops() -> None:
    """Olmo2RMSNorm returns ``(weight * x * rsqrt).to(bf16)`` with an fp32 weight: per norm an fp32
    ``x.pow(2)`` and an fp32 ``weight * ...`` come and go (x * rsqrt is saved): five norms a layer (q, k,
    after attention, after the MLP), and Olmo2's RoPE multiplies bf16 q and k by fp32 cos and sin: two fp32
    products and an fp32 sum each, a bf16 ``neg`` and ``cat``. T = 4096, all widths 2048."""
    ctx, steps = _forward(OLMO2)
    T, h = 4 * 1024, 2048
    assert (ctx.arch.hidden_size, ctx.arch.facts.norm.qk, ctx.arch.facts.norm.post_norms) == (h, "full", True)
    made = [(n, s) for n, s in steps if s > 0]
    assert [s for n, s in made if n in ("pow", "wx")] == [4 * T * h] * 8
    assert [s for n, s in made if n in ("m1", "m2", "qa", "ka")] == [4 * T * h] * 6
    assert [s for n, s in made if n in ("neg", "cat")] == [T * h, 2 * T * h] * 2
    names = [n for n, _ in steps]
    # the post-norms read the attention's and the MLP's outputs; the saved items follow the first
    assert names.index("o") < names.index("pa") < names.index(SAVED) < names.index("down") < names.index(OUT)


def test_olmo2_stream_replays_as_its_trace() -> None:
    """The H200 olmo-2-1b run: its fake-tensor trace replays to 25,291,653,120 B reserved (benchmarks/
    allocator_replay_h200.json). Without its forward transients the engine's stream reached 23.45 GiB (-0.5%
    of the measured, -0.5% of the trace); with them within 0.2% (+0.07%)."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(OLMO2)))
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    assert abs(rep.peak_reserved / 25_291_653_120 - 1) < 0.002


def test_fp32_llama_keeps_only_the_norms_pow_and_the_16_bit_ops_at_4_bytes() -> None:
    """fp32 weights (full training): RMSNorm's ``x.to(float32)`` and ``.to(input_dtype)`` are no-ops, so
    ``weight * (x * rsqrt)`` saves ``x * rsqrt``: each norm makes and frees only ``x.pow(2)``; the
    projections' outputs and RoPE's products, ``neg`` and ``cat`` are the bf16 layer's at 4 bytes an element
    (traced on llama-3.2-1b b2 x 512). The final norm likewise."""
    fp32 = {**LLAMA, "precision": "fp32"}
    ctx, steps = _forward(fp32)
    _, bf16 = _forward(LLAMA)
    T, h = 4 * 1024, 2048
    assert [n for n, _ in steps].count("xr") == 0
    assert [s for n, s in steps if n == "pow"] == [4 * T * h, 0] * 2
    for name in ("q", "k", "v", "m1", "neg", "cat", "ke", "o", "res", "down", OUT):
        assert [2 * s for n, s in bf16 if n == name] == [s for n, s in steps if n == name]
    assert final_norm_transients(ctx) == (("pow", 4 * T * h), ("pow", 0), (SAVED, -1))
    assert _forward({**LORA, "precision": "fp32"})[1] == ()  # LoRA on fp32 weights: not traced


def test_the_final_norm_makes_its_fp32_transients_around_its_saved_tensors() -> None:
    """model.norm is the layers' RMSNorm: x.pow(2) comes and goes, x * rsqrt lives while its output is made;
    the final norm's saved tensors and the head's input are allocated in between (two fp32 T x h each)."""
    ctx, _ = _forward(QWEN3)
    n = 4 * 4 * 2048 * 1024
    assert final_norm_transients(ctx) == (("pow", n), ("pow", 0), ("xr", n), (SAVED, -1), ("xr", 0))


def test_qwen3_stream_replays_as_its_trace() -> None:
    """The H200 qwen3-0.6b run: its fake-tensor trace replays to 35,343,302,656 B reserved
    (benchmarks/allocator_replay_h200.json), the last segment made in step 1's backward. Without the q/k
    norms' and the final norm's transients the engine's stream reached 37.55 GiB (+14%): the last layer's
    transients left no free 32 MiB block, so the autograd thread's cuBLAS workspace (32 MiB, made at the head's
    backward matmul) split a cached 4748 MiB loss segment for good and step 2's loss backward cut a new one.
    With them the workspace finds a free block as in the trace: within 1%, peaking in step 1."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(QWEN3)))
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    assert abs(rep.peak_reserved / 35_343_302_656 - 1) < 0.01
    assert rep.at.startswith("step 1")


@pytest.mark.parametrize("d", [LORA, QWEN3, OLMO2], ids=["lora", "qwen3", "olmo2"])
def test_stream_with_transients_holds_the_engines_tensors(d: dict) -> None:
    """With its forward transients (LoRA's, Qwen3's q/k norms', OLMo 2's post-norms and fp32 RoPE, the final
    norm's) the stream's peak allocated is still the engine's within 1%: they are freed before the tensors at
    the engine's peak are made."""
    got = replay(_stream(d)).peak_allocated
    want = estimate(Scenario.from_dict(d)).ranks[0].peak_allocated_bytes
    assert abs(got / want - 1) < 0.01


def test_llama8b_lora_stream_replays_as_its_trace() -> None:
    """The H200 llama-3.1-8b LoRA run (benchmarks/gpu_measure.py): its fake-tensor trace replays to a peak
    reserved of 53,171,191,808 B (benchmarks/allocator_replay_h200.json); without the layers' forward
    transients the engine's stream reached 47.34 GiB (-4.4%): the trace's step 2 puts the last layer's up_proj
    output and the final norm's input into a cached 2004 MiB loss segment, and its loss backward cuts a new
    one. With them the stream does the same, within 1%."""
    d = {
        **LLAMA,
        "model": "llama-3.1-8b",
        "gpu": "h200",
        "micro_batch_size": 2,
        "seq_len": 2048,
        "method": "lora",
        "lora": {"rank": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
    }
    ctx = Context(objectives.training_scenario(Scenario.from_dict(d)))
    rep = replay_stream(rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx))
    assert abs(rep.peak_reserved / 53_171_191_808 - 1) < 0.01
    assert rep.at == "step 2 loss backward"


#: A 4-layer Llama at a real vocabulary (its T x V loss buffers dominate as in the real models), untied.
SMALL_LLAMA = LLAMA_H512_V32K
ACCUM = {**LLAMA, "model": SMALL_LLAMA, "micro_batch_size": 2, "seq_len": 512, "grad_accum_steps": 3}


def _phases(stream) -> dict[str, list]:
    """Each phase's events (``StreamWriter.mark``)."""
    ends = [n for n, _ in stream.marks[1:]] + [len(stream.events)]
    return {label: stream.events[n:end] for (n, label), end in zip(stream.marks, ends, strict=True)}


def test_each_micro_batch_runs_forward_and_backward_before_the_optimizer_step() -> None:
    """With 3 micro-batches a step, each step's phases are the micro-batches' forward, loss, loss backward and
    backward in turn, then one optimizer step; each micro-batch's forward allocates what a step's forward does
    without accumulation (the same tensors, made again); one micro-batch a step keeps the plain phase names."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(ACCUM)))
    stream = rank_stream(ctx, ctx.stages[0])
    parts = ("forward", "loss", "loss backward", "backward")
    want = ["weights"] + [
        *(
            label
            for s in (1, 2)
            for label in (
                *(f"step {s} micro-batch {m} {p}" for m in (1, 2, 3) for p in parts),
                f"step {s} optimizer step",
            )
        )
    ]
    assert [label for _, label in stream.marks] == want
    plain = rank_stream(Context(Scenario.from_dict({**ACCUM, "grad_accum_steps": 1})), ctx.stages[0])
    assert [label for _, label in plain.marks] == ["weights"] + [
        f"step {s} {p}" for s in (1, 2) for p in (*parts, "optimizer step")
    ]
    once = [size for _, size, _ in _phases(plain)["step 2 forward"]]
    phases = _phases(stream)
    for m in (1, 2, 3):
        assert [size for _, size, _ in phases[f"step 2 micro-batch {m} forward"]] == once


def test_a_later_micro_batch_adds_each_new_gradient_in_place() -> None:
    """From the second micro-batch on, backward makes each parameter's new gradient apart (bf16 weights: 2 B
    per element, ``states/gradients.new_gradient``) and frees it before the next is made, as ``AccumulateGrad``
    adds it to ``.grad`` in place: one transient per parameter tensor, in backward order (the head and final
    norm, each layer's 9 tensors from the top layer down in autograd's order, the embeddings). The first micro-batch keeps its
    gradients, freed only by ``zero_grad`` after the optimizer step."""
    ctx = Context(objectives.training_scenario(Scenario.from_dict(ACCUM)))
    order = grad_order(ctx, ctx.stages[0])
    stream = rank_stream(ctx, ctx.stages[0])
    phases = _phases(stream)

    def made_and_freed(events: list) -> list[int]:
        return [
            a[1] for a, b in zip(events, events[1:], strict=False) if a[1] != FREE and b == (a[0], FREE, a[2])
        ]

    # a layer's in the order autograd makes them (activations/eager_steps.eager_layer_backward_transients):
    # down, up, gate, the norm after attention, o, v, k, q, the input norm; beside them the final norm's backward
    # makes and frees its weight's ``grad * x`` (2 B x T x h) after the head's gradients, and each layer's SDPA
    # backward its fp32 dq accumulator (4 B x T x h, ``eager_steps.CUDA_SCRATCH``) between o's gradient and v's
    gw = (2 * 512 * ctx.arch.hidden_size,)  # T x h elements
    accum = 4 * gw[0]  # fp32
    layer = tuple(2 * order.layer[j] for j in (6, 5, 4, 8, 3)) + (accum,)
    layer += tuple(2 * order.layer[j] for j in (2, 1, 0, 7))
    backward_order = [2 * x for x in order.top + gw] + list(layer * ctx.arch.num_layers)
    backward_order += [2 * x for x in order.bottom]
    for m in (2, 3):
        assert made_and_freed(phases[f"step 2 micro-batch {m} backward"]) == backward_order
    first = made_and_freed(phases["step 2 micro-batch 1 backward"])
    assert first == [2 * gw[0]] + [accum] * ctx.arch.num_layers
    # the first micro-batch's gradients live until zero_grad: the second one's loss (the plain step's peak,
    # where no gradient exists) meets every one of them (requested bytes: allocated adds what the blocks round up,
    # which moves with where the blocks land)
    plain = replay(_stream({**ACCUM, "grad_accum_steps": 1})).peak_requested
    assert replay(stream.events).peak_requested >= plain + 2 * ctx.arch.parameters


def test_an_unset_reserved_model_is_the_default_one_under_accumulation() -> None:
    """A step with accumulation: an unset ``reserved_model`` gives the default's figures; the replay replays."""
    unset, by = _fragmentation_by_model(ACCUM)
    assert unset == by[DEFAULT_RESERVED_MODEL]
    assert by["fitted"].formula.startswith("largest pool") and "replayed" in by["replay"].formula


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    [
        {},  # full training, 3 micro-batches: replays to the trace's peak reserved exactly
        {"model": {**SMALL_LLAMA, "tie_word_embeddings": True}},  # the tied sum added in place: exactly too
        {  # the brief's real-size case: 1B LoRA, +0.20%
            "model": "llama-3.2-1b",
            "micro_batch_size": 1,
            "seq_len": 1024,
            "method": "lora",
            "lora": {"rank": 16, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        },
        {  # full checkpointing: -4.00% before the autograd thread's workspaces entered the stream, -0.11%
            "model": "llama-3.2-1b",
            "micro_batch_size": 1,
            "seq_len": 1024,
            "activation_checkpointing": "full",
        },
    ],
    ids=["full", "tied", "llama1b-lora", "llama1b-ckpt"],
)
def test_an_accumulating_stream_replays_as_its_trace(change: dict) -> None:
    """The fake-tensor trace of the same accumulating step (``trace/run._train_step``: 3 micro-batches a
    step, each loss scaled) replayed through the allocator: the engine's stream reaches its peak reserved
    within 1% (docs/allocator.md lists the figures), and the peak allocated within 1%."""
    pytest.importorskip("transformers")
    from stream_vs_trace import stream_and_trace

    r = stream_and_trace({**ACCUM, **change})
    assert abs(r.stream.peak_reserved / r.traced.peak_reserved - 1) < 0.01
    assert abs(r.stream.peak_allocated / r.traced.peak_allocated - 1) < 0.01
    # the estimate reads this replay
    assert (
        estimate(Scenario.from_dict({**ACCUM, **change})).ranks[0].peak_reserved_bytes
        == r.stream.peak_reserved
    )


def test_the_autograd_threads_workspace_is_made_at_the_heads_backward(monkeypatch) -> None:
    """Of the two cuBLAS workspaces (``overhead.CUBLAS_HANDLES``), the forward thread's is made before the
    first forward and the autograd thread's (``AUTOGRAD_HANDLES``) in step 1's backward, right after the
    head's gradients, never freed (CublasHandlePool.cpp keeps one per handle and stream)."""
    from memsim_widget.engine.counters import alloc_stream
    from memsim_widget.engine.counters.overhead import AUTOGRAD_HANDLES, CUBLAS_HANDLES

    ctx = Context(objectives.training_scenario(Scenario.from_dict(LLAMA)))
    s = rank_stream(ctx, ctx.stages[0])
    monkeypatch.setattr(alloc_stream, "AUTOGRAD_HANDLES", 0)  # every workspace at the start, as before
    at_start = rank_stream(ctx, ctx.stages[0])
    assert (CUBLAS_HANDLES, AUTOGRAD_HANDLES) == (2, 1)
    assert sorted(e[1] for e in s.events) == sorted(e[1] for e in at_start.events)  # the same requests

    def before(stream: object, label: str) -> int:
        n = next(n for n, mark in stream.marks if mark == label)  # type: ignore[attr-defined]
        return sum(1 for e in stream.events[:n] if e[1] != FREE)  # type: ignore[attr-defined]

    assert before(s, "step 1 forward") == before(at_start, "step 1 forward") - 1
    assert before(s, "step 2 forward") == before(at_start, "step 2 forward")
    head = 2 * ctx.arch.vocab_size * ctx.arch.hidden_size  # the tied head's bf16 gradient
    start = next(n for n, mark in s.marks if mark == "step 1 backward")
    n = next(n for n in range(start, len(s.events)) if s.events[n][1] == head)
    freed = {e[0] for e in s.events if e[1] == FREE}
    ws = ctx.gpu.cublas_workspace_bytes
    w = next(k for k in range(n, len(s.events)) if s.events[k][1] == ws and s.events[k][0] not in freed)
    # between them only the head's other gradients (the final norm's weight): allocations, no frees
    assert 0 < w - n <= 2 and all(e[1] != FREE for e in s.events[n:w])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "llama bf16 sdpa b2 s512",  # -2.56% before the eager step's buffers (activations/eager_steps)
        "llama bf16 lora qv bf16 b2 s512",  # -2.99%
        "mistral bf16 lora all-linear b2 s512",  # -1.11%
    ],
)
def test_a_tiny_models_small_pool_replays_as_its_trace(name: str) -> None:
    """The 4-layer h 256 Llama (every activation in the small pool, where one 2 MiB segment is 1-2% of reserved):
    the one-GPU stream reaches its trace's peak reserved to the byte (docs/allocator.md, "The small pool on tiny
    models")."""
    got, traced = _tiny_replays(name)
    assert got == traced


#: Checkpointed (-4.84%, -4.76% and -3.33% before the eager step's buffers): one small segment under their traces
#: since flash attention's dq accumulator is made where its kernel runs (``eager_steps.CUDA_SCRATCH``); at the
#: start of each layer's backward, held to the layer's end, it filled the segment the recomputed forward (written
#: as the ``saved`` items, not op by op as the trace makes them) leaves short. Without the accumulator
#: (``rank_stream(traced_only=True)``) the stream was that segment short before too (docs/allocator.md).
CKPT_ONE_SEGMENT_UNDER = [
    "llama bf16 ckpt b2 s512",
    "llama bf16 ckpt offload b2 s512",  # torchtune's offloading
    "llama bf16 ckpt offload opt-in-bwd b2 s512",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", CKPT_ONE_SEGMENT_UNDER)
def test_a_tiny_checkpointed_model_is_one_small_segment_under_its_trace(name: str) -> None:
    got, traced = _tiny_replays(name)
    assert traced - got == SMALL_BUFFER  # one small-pool segment


def _tiny_replays(name: str) -> tuple[int, int]:
    """(the one-GPU stream's peak reserved, its trace's) of the fidelity case ``name``."""
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, TORCHTUNE_CASES

    from memsim_widget.trace.api import trace_config
    from memsim_widget.trace.replay import replay_trace

    sc = Scenario.from_dict({**{**dict(CASES), **dict(TORCHTUNE_CASES)}[name], "reserved_model": "replay"})
    traced, _ = replay_trace(trace_config(sc, progress=False).tracker, sc)
    ctx = Context(objectives.training_scenario(sc))
    return replay_stream(
        rank_stream(ctx, ctx.stages[0]), allocator_conf(ctx)
    ).peak_reserved, traced.peak_reserved
