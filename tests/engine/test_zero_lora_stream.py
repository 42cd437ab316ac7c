"""peft's LoRA on DeepSpeed ZeRO-1/2 ranks in the replay (``engine/counters/zero_lora.py``; docs/allocator.md
"DeepSpeed ZeRO-1/2 ranks"): only the adapters are flattened, partitioned and reduced, the frozen bf16 base
stays as it is, and the engine's stream is held to a CPU run of the real optimizer on a peft model
(``benchmarks/zero_trace.py --lora 16``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.alloc_stream import rank_stream, replay_stream
from memsim_widget.engine.counters.allocator import FREE, AllocatorConf, CachingAllocator
from memsim_widget.engine.counters.replayable import replayable
from memsim_widget.engine.counters.zero_lora import lora_zero3_units, lora_zero12

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
from fidelity_cases import DEEPSPEED_SMALL_LLAMA  # noqa: E402

#: the small Llama of benchmarks/zero_trace.py under LoRA r 16 on q and v (LLaMA-Factory's default targets):
#: per layer q's A and B 16 x 512 and 512 x 16 (8,192 elements each), v's A 16 x 512 and B 256 x 16 (4,096)
SCENARIO = {
    **DEEPSPEED_SMALL_LLAMA,
    "method": "lora",
    "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]},
    "parallel": {"dp": 4, "zero": 2},
    "reserved_model": "replay",
}
#: the adapters' elements in module order: per layer q's A, q's B, v's A, v's B
ADAPTERS_QV = (8_192, 8_192, 8_192, 4_096) * 4


def _ctx(**over: object) -> Context:
    return Context(estimate({**SCENARIO, **over}).scenario)


def test_the_adapters_are_the_only_group() -> None:
    """One optimizer group of the 16 adapters in module order (114,688 elements; HF Trainer's no-decay group is
    empty once the norms are frozen), padded to 2 x 4 and split four ways: rank 0's 28,672-element partition is
    layer 0's four adapters whole, so grads_in_partition is 28,672 elements; backward makes layer 3's first, v's B
    before its A before q's B."""
    ctx = _ctx()
    numels, order, z = lora_zero12(ctx, ctx.stages[0])
    assert numels == ADAPTERS_QV and z.groups == (ADAPTERS_QV,)
    assert z.partitions == (28_672,) and z.grads_in_partition == 28_672
    assert z.slices == (((0, 8_192), (1, 8_192), (2, 8_192), (3, 4_096)),)
    assert z.ready[:4] == ((0, 15), (0, 14), (0, 13), (0, 12)) and order[1] == (4_096, 8_192, 8_192, 8_192)
    assert z.cast_from == 4 and z.model_bytes == 2


def test_stream_casts_the_adapters_and_flattens_them_alone() -> None:
    """The wrap as the traced run makes it: each fp32 adapter (peft's ``autocast_adapter_dtype``) copied to bf16
    and freed (16 copies: 12 of 16,384 B, 4 of 8,192 B), the flat bf16 buffer of the adapters (229,376 B), the
    partition's clone (57,344 B) and fp32 master (114,688 B); the base's 32,768,000 B embedding and head are
    never freed."""
    ctx = _ctx()
    s = rank_stream(ctx, ctx.stages[0])
    wrap = dict(s.marks)
    at = next(i for i, label in wrap.items() if label == "ZeRO wrap")
    size = {h: n for h, n, _ in s.events if n != FREE}
    cast = [n for _, n, _ in s.events[at : at + 32] if n != FREE]
    assert cast == [16_384] * 3 + [8_192] + [16_384] * 3 + [8_192] + [16_384] * 3 + [8_192] + [16_384] * 3 + [
        8_192
    ]
    after = [n for _, n, _ in s.events[at + 32 :] if n != FREE]
    assert after[:3] == [229_376, 57_344, 114_688]
    embedding = [h for h, n, _ in s.events if n == 32_768_000]
    assert len(embedding) == 2 and not any(n == FREE and size[h] == 32_768_000 for h, n, _ in s.events)


def test_lora_zero12_replays_by_default_and_qlora_keeps_the_fitted_rule() -> None:
    """LoRA on ZeRO-1 and ZeRO-2 ranks replays by default (its adapters in fp32 or bf16: DeepSpeed casts them
    to bf16); QLoRA (an NF4 base) keeps the fitted rule."""
    base = {k: v for k, v in SCENARIO.items() if k != "reserved_model"}
    for zero in (1, 2):
        for dtype in ("fp32", "bf16"):
            lora = {"rank": 16, "targets": ["q_proj", "v_proj"], "adapter_dtype": dtype}
            sc = {**base, "lora": lora, "parallel": {"dp": 4, "zero": zero}}
            assert replayable(Context(estimate(sc).scenario))
    assert not replayable(Context(estimate({**base, "method": "qlora"}).scenario))


def _items(over: dict) -> dict[str, object]:
    """The rank's items by name for an all-linear LoRA of rank 16 on the small Llama (b 2 x s 512: T = 1,024)."""
    sc = {**SCENARIO, "lora": {"rank": 16, "targets": ["all-linear"]}, **over}
    return {i.item: i for i in estimate(sc).ranks[0].items}


def test_deepspeed_runs_peft_adapters_in_bf16_and_hf_in_fp32() -> None:
    """DeepSpeed's wrap casts peft's fp32 adapters to bf16 (deepspeed 0.19.8 ``_cast_module_mixed_precision``), so
    under ZeRO-1/2 the adapters keep no fp32 copy of their input: the attention input is saved once in bf16 (4
    layers x 2 B x 1,024 x 512 = 4,194,304 B), the 591,872 adapter elements are 2 B each with a 4 B master
    partition (a quarter at dp 4). Under HF's Trainer (no cast) and ZeRO-3 (``zero.Init``: no cast) q, k and v's
    adapters each save an fp32 copy: 4 layers x 3 x 4 B x 1,024 x 512 = 25,165,824 B, the weights 4 B; HF keeps
    no master, ZeRO-3 a quarter of them at dp 4 (147,968 elements) with an fp32 master partition the same size
    (``_create_fp32_partitions``' clone of an fp32 partition: the recorded wrap makes the 114,688 B flat buffer
    then a 114,688 B master at world 4 q,v, no second copy)."""
    for zero in (1, 2):
        ds = _items({"parallel": {"dp": 4, "zero": zero}})
        assert not any(name.endswith("LoRA input copies") for name in ds)
        assert ds["attention input: LoRA input"].bytes == 4_194_304
        assert ds["LoRA adapter weights"].bytes == 591_872 * 2
        assert ds["fp32 master weights"].bytes == 591_872 * 4 // 4
        ds_bf16 = _items({"parallel": {"dp": 4, "zero": zero}, "lora": {"rank": 16, "targets": ["all-linear"],
                                                                       "adapter_dtype": "bf16"}})  # fmt: skip
        assert {k: i.bytes for k, i in ds_bf16.items()} == {k: i.bytes for k, i in ds.items()}
    hf, z3 = (
        _items({"framework": "hf", "parallel": {"dp": 4, "zero": 0}}),
        _items({"parallel": {"dp": 4, "zero": 3}}),
    )
    for peft in (hf, z3):
        assert peft["attention input: LoRA input copies"].bytes == 25_165_824
    assert hf["LoRA adapter weights"].bytes == 591_872 * 4
    assert "fp32 master weights" not in hf
    assert z3["LoRA adapter weights"].bytes == z3["fp32 master weights"].bytes == 591_872 // 4 * 4


def test_the_activation_cache_tells_zero_3_from_zero_2_on_one_rank() -> None:
    """The activations' cache leaves the data-parallel layout out of its key, but DeepSpeed's cast depends on the
    stage: on one rank (dp 1, no FSDP wrap to tell them apart) ZeRO-2's adapters are bf16 and ZeRO-3's
    (``zero.Init``) fp32, whichever is estimated first."""
    one = {"parallel": {"dp": 1, "zero": 2}}
    three = {"parallel": {"dp": 1, "zero": 3}}
    for first, second in ((one, three), (three, one)):
        a, b = _items(first), _items(second)
        assert ("attention input: LoRA input copies" in a) == (first is three)
        assert ("attention input: LoRA input copies" in b) == (second is three)


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([1, 2]),
    st.sampled_from([2, 4, 8]),
    st.sampled_from([4, 16, 64]),
    st.sampled_from([256, 512, 1024]),
    st.sampled_from([["q_proj", "v_proj"], ["all-linear"]]),
)
def test_lora_reserves_no_more_than_full_training(
    zero: int, dp: int, rank: int, seq: int, targets: list
) -> None:
    """At the same shape a LoRA rank's replay (q,v or all-linear) reserves no more than the full-training rank's:
    its flat buffers, masters, states and gradients are the adapters' (a small fraction of the base) beside the
    same frozen bf16 weights, and its activations save no fp32 copy of an adapter's input (DeepSpeed casts
    peft's fp32 adapters to bf16 at the wrap: ``context.deepspeed_casts_adapters``)."""
    par = {"dp": dp, "zero": zero}
    lora = {"rank": rank, "targets": targets}
    full = estimate({**SCENARIO, "method": "full", "seq_len": seq, "parallel": par}).ranks[0]
    low = estimate({**SCENARIO, "lora": lora, "seq_len": seq, "parallel": par}).ranks[0]
    assert low.peak_reserved_bytes <= full.peak_reserved_bytes


#: (zero, world, targets, bound): the traced shapes (benchmarks/zero_trace.py --lora 16 --targets qv|all, peft's
#: fp32 adapters, which the engine runs in bf16 as DeepSpeed's cast leaves them). q,v is held within 1%
#: (-0.25%); all-linear within 2%: measured -1.75% on reserved at ZeRO-2 world 4 (-0.38% at ZeRO-1 world 2),
#: though allocated is the trace's to 0.1% (+0.01%, +0.00%); what the allocator caches differently is not found yet
TRACED = [
    (2, 4, "qv", 0.01),
    (1, 4, "qv", 0.01),
    (2, 2, "qv", 0.01),
    (2, 4, "all", 0.02),
    (1, 2, "all", 0.02),
]


def _zero_trace() -> None:
    """Put benchmarks/ (``zero_trace``: the real runs and their recordings) on the import path."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


@pytest.mark.parametrize(("zero", "world", "targets", "bound"), TRACED)
def test_lora_replays_as_its_cpu_trace(zero: int, world: int, targets: str, bound: float) -> None:
    """The engine's stream without the cuBLAS workspaces, which a CPU run never makes (``zero_trace.
    without_workspaces``: the peak is in the forward, where the two 32 MiB workspaces add on top: +1.66% with
    them for ZeRO-2 q,v at world 4), within ``bound`` of the reserved of DeepSpeed's real optimizer run on the
    CPU on a peft model (fake process group, two steps; measured -0.25% for q,v; the fitted rule was +30.8% over
    the same run; its recorded trace, ``test_the_recorded_traces_are_deepspeeds``)."""
    _zero_trace()
    from zero_trace import BUCKET, TARGET_SETS, engine_stream, recorded

    names = tuple(TARGET_SETS[targets])
    t = recorded(zero, world, BUCKET, False, 1, 16, targets=names)
    a = CachingAllocator(None)
    a.run(t["events"])
    ours = replay_stream(
        engine_stream(zero, world, BUCKET, False, 1, cpu=True, lora=16, targets=names), AllocatorConf()
    )
    assert abs(ours.peak_reserved / a.peak_reserved - 1) < bound, (ours.peak_reserved, a.peak_reserved)


@pytest.mark.slow
def test_the_recorded_traces_are_deepspeeds() -> None:
    """The LoRA tests here read recorded runs (tests/data/zero_traces, refused under other versions of deepspeed,
    torch, transformers or peft than recorded); one, ZeRO-3 at world 4 with bf16 adapters on q and v (peft's
    model made after the base's ``zero.Init``, partitioned by ``deepspeed.initialize``), is run again here, the
    real optimizer on the CPU, and must be its recording event for event."""
    _zero_trace()
    from zero_trace import BUCKET, TARGET_SETS, difference, recorded, traced_apart

    args = (3, 4, BUCKET, False, 1, 16)
    peft = {"targets": tuple(TARGET_SETS["qv"]), "adapter_dtype": "bf16"}
    gap = difference(traced_apart(*args, **peft), recorded(*args, **peft))
    assert not gap, gap


@pytest.mark.slow
def test_the_fp32_adapter_recording_is_deepspeeds() -> None:
    """ZeRO-3 at world 4 with peft's default fp32 adapters on q and v (left fp32: ``zero.Init``'s model is not
    cast) run again, the real optimizer on the CPU: event for event its recording
    (``zero3-lora16-targetsqv.json.gz``, which ``test_zero3_lora_replays_as_its_cpu_trace`` replays)."""
    _zero_trace()
    from zero_trace import BUCKET, TARGET_SETS, difference, recorded, traced_apart

    args = (3, 4, BUCKET, False, 1, 16)
    peft = {"targets": tuple(TARGET_SETS["qv"])}
    gap = difference(traced_apart(*args, **peft), recorded(*args, **peft))
    assert not gap, gap


#: ZeRO-3 under LoRA: bf16 adapters (peft's fp32 ones, which stay fp32 under ``zero.Init``, are written too)
ZERO3 = {
    "lora": {"rank": 16, "targets": ["q_proj", "v_proj"], "adapter_dtype": "bf16"},
    "parallel": {"dp": 4, "zero": 3},
}


def _phase_allocs(ctx: Context, first: str, stop: str) -> list[int]:
    """The bytes of the stream's allocations from the mark starting ``first`` to the next one starting ``stop``."""
    s = rank_stream(ctx, ctx.stages[0])
    marks = dict(s.marks)
    on, out = False, []
    for i, (_, n, _) in enumerate(s.events):
        if i in marks:
            on = marks[i].startswith(first) or (on and not marks[i].startswith(stop))
        if on and n != FREE:
            out.append(n)
    return out


def test_zero3_units_put_each_adapter_after_its_base() -> None:
    """A layer's tensors in module order, q's base then its A and B, k's base, v's base then its A and B, o, the
    MLP and the norms; the one optimizer group the 16 adapters; the frozen embedding has no backward."""
    ctx = _ctx(**ZERO3)
    u = lora_zero3_units(ctx, ctx.stages[0])
    assert u.layer == (262_144, 8_192, 8_192, 131_072, 131_072, 8_192, 4_096, 262_144) + (704_512,) * 3 + (
        512,
        512,
    )
    assert u.pre == (16_384_000,) and u.post == (512, 16_384_000)
    assert len(u.groups) == 1 and [u.numels[p] for p in u.groups[0]] == list(ADAPTERS_QV)
    assert not u.bottom_backward


def test_zero3_stream_flattens_the_adapters_alone() -> None:
    """The wrap's flat buffers are the adapters' partitions (28,672 bf16 elements: 57,344 B, the parameters' and
    the gradients'), with a 114,688 B fp32 master, where full training's are the whole model's (44,367,872 B
    master); the base's partitions stay (the embedding's 8,192,000 B never freed)."""
    lora, full = _ctx(**ZERO3), _ctx(**{**ZERO3, "method": "full"})
    wrap = _phase_allocs(lora, "ZeRO-3 wrap", "step 1")
    assert wrap.count(57_344) == 2 and wrap.count(114_688) == 3 and 44_367_872 not in wrap
    assert 44_367_872 in _phase_allocs(full, "ZeRO-3 wrap", "step 1")
    s = rank_stream(lora, lora.stages[0])
    size = {h: n for h, n, _ in s.events if n != FREE}
    assert not any(n == FREE and size[h] == 8_192_000 for h, n, _ in s.events)


def test_zero3_frozen_embedding_is_not_fetched_in_the_backward() -> None:
    """Full training's first backward gathers the embedding again (32,768,000 B) and makes its gradient and the
    head's (32,768,000 B each); under LoRA nothing of that size is made in the backward (no base gradient, and
    autograd never reaches the frozen embedding: traced, benchmarks/zero_trace.py --stage 3 --lora 16)."""
    full = _ctx(**{**ZERO3, "method": "full"})
    assert _phase_allocs(full, "step 1 backward", "step 1 optimizer").count(32_768_000) == 3
    assert 32_768_000 not in _phase_allocs(_ctx(**ZERO3), "step 1 backward", "step 1 optimizer")


def test_zero3_lora_replays_by_default() -> None:
    """ZeRO-3 under LoRA replays DeepSpeed's stream by default, its adapters in bf16 or in peft's fp32 (which stay
    fp32 under ``zero.Init``; both held to their CPU traces within 1% on reserved: the slow test); offloaded, it
    keeps the fitted rule."""
    ctx = _ctx(**ZERO3)
    assert replayable(ctx)
    assert "DeepSpeed ZeRO-3" in estimate({**SCENARIO, **ZERO3}).ranks[0].reserved.formula
    fp32 = {**ZERO3, "lora": {**ZERO3["lora"], "adapter_dtype": "fp32"}}
    assert replayable(_ctx(**fp32))
    assert "DeepSpeed ZeRO-3" in estimate({**SCENARIO, **fp32}).ranks[0].reserved.formula
    offloaded = {**fp32, "parallel": {**ZERO3["parallel"], "offload": "optimizer"}}
    assert not replayable(_ctx(**offloaded))


def _z3_items(zero: int, targets: list[str], framework: str = "deepspeed") -> dict[str, int]:
    """The activation items' bytes by name of the small Llama under LoRA r 16 with bf16 adapters at dp 4."""
    sc = {**SCENARIO, "framework": framework, "lora": {"rank": 16, "targets": targets, "adapter_dtype": "bf16"},
          "parallel": {"dp": 4, "zero": zero}}  # fmt: skip
    return {i.item: i.bytes for i in estimate(sc).ranks[0].items}


def test_zero3_linear_keeps_every_frozen_linears_input() -> None:
    """DeepSpeed's ZeRO-3 replaces ``F.linear`` by ``LinearFunctionForZeroStage3``, which saves its input whatever
    trains (deepspeed 0.19.8 runtime/zero/linear.py): under LoRA on q and v the frozen gate/up keep the MLP input
    (bf16 T x h: 2 B x 1,024 x 512 = 1,048,576 B a layer, 4 layers), the frozen down_proj its input (2 B x 1,024 x
    1,376 = 2,818,048 B a layer, 4 layers) and the frozen head the final norm's output (1,048,576 B); o_proj reads
    SDPA's output, already saved. Layer 0's MLP input needs a gradient (q and v's adapters come before it). None of
    these under ZeRO-2 (torch's linear) or FSDP2's ZeRO-3 (hf: PyTorch's fully_shard)."""
    z3 = _z3_items(3, ["q_proj", "v_proj"])
    assert z3["MLP input: frozen Linear input (DeepSpeed ZeRO-3 linear)"] == 4 * 1_048_576
    assert z3["MLP down-projection input: frozen Linear input (DeepSpeed ZeRO-3 linear)"] == 4 * 2_818_048
    assert z3["head input (DeepSpeed ZeRO-3 linear)"] == 1_048_576
    assert not any("attention output" in k and "frozen" in k for k in z3)
    for zero, framework in ((2, "deepspeed"), (3, "hf")):
        assert not any("ZeRO-3 linear" in k for k in _z3_items(zero, ["q_proj", "v_proj"], framework))
    # every Linear targeted: their inputs are saved by the adapters already; only the frozen head adds its own
    assert [k for k in _z3_items(3, ["all-linear"]) if "ZeRO-3 linear" in k] == [
        "head input (DeepSpeed ZeRO-3 linear)"
    ]


def test_zero3_linear_layer0_frozen_inputs_wait_for_an_adapter() -> None:
    """With adapters on the MLP alone (gate, up, down) the attention's frozen o_proj (eager attention: its input a
    copy, not SDPA's saved output) reads a tensor that needs no gradient in layer 0, so only layers 1-3 keep it
    (3 x 1,048,576 B); gate and up's adapters save the MLP input themselves."""
    sc = {**SCENARIO, "attention": "eager", "lora": {"rank": 16, "targets": ["gate_proj", "up_proj", "down_proj"],
          "adapter_dtype": "bf16"}, "parallel": {"dp": 4, "zero": 3}}  # fmt: skip
    items = {i.item: i.bytes for i in estimate(sc).ranks[0].items}
    assert items["attention output: frozen Linear input (DeepSpeed ZeRO-3 linear)"] == 3 * 1_048_576


def test_lora_final_norm_and_layer_norms_keep_their_tensor_sizes() -> None:
    """Under LoRA the final RMSNorm saves two tensors (its fp32 input, 4 B x 1,024 x 512 = 2,097,152 B, and the
    rsqrt, 4,096 B; the frozen weight's product keeps no normalised tensor), and layer 0's first norm saves
    nothing: the stream writes every norm input whole (2,097,152 B: 7 of them in the layers, the final one) and
    layer 0's missing pair as empty requests, where it used to split the bytes evenly (3 x 700,416 B for the final
    norm, 8 x 1,835,008 B in the layers: blocks no run makes)."""
    ctx = _ctx(**ZERO3)
    s = rank_stream(ctx, ctx.stages[0])
    marks = dict(s.marks)
    start = next(i for i, label in marks.items() if label == "step 1 forward")
    end = next(i for i, label in marks.items() if label == "step 1 loss")
    made = [n for _, n, _ in s.events[start:end] if n != FREE]
    assert made.count(2_097_152) == 8 and made.count(4_096) >= 8
    assert 1_835_008 not in made and 700_416 not in made and made.count(0) == 2


@pytest.mark.parametrize(("world", "targets"), [(4, "qv"), (2, "all")])
@pytest.mark.parametrize("adapter", ["bf16", "fp32"])
def test_zero3_lora_replays_as_its_cpu_trace(world: int, targets: str, adapter: str) -> None:
    """The engine's ZeRO-3 stream under LoRA without the cuBLAS workspaces a CPU run never makes, held to
    DeepSpeed's real run on the CPU (the runs' recorded traces): reserved within 1%, allocated within 0.5%. bf16
    adapters: reserved -0.24% at world 4 q,v, -0.38% at world 2 all-linear (-1.54% and +6.41% before the final
    norm's 2 MiB fp32 input, the layers' norm inputs and the frozen Linears' inputs kept by DeepSpeed's linear),
    allocated +0.07%, +0.08% (-1.06% and +0.09% before); the fitted rule is +21.9% and +29.6% over these runs.
    peft's fp32 adapters (uncast under ``zero.Init``; their partitions, flat buffer, gathers and gradients fp32,
    each adapter's input cast to fp32 in peft's forward): reserved -0.25% and -0.11%, allocated +0.07% and +0.10%;
    +6.21% and -0.90%, +1.02% and +0.92% before they were written as ZeRO-3 (``zero3_lora_modelled`` refused
    them)."""
    _zero_trace()
    from zero_trace import BUCKET, TARGET_SETS, engine_stream, recorded

    names = tuple(TARGET_SETS[targets])
    dtype = (
        {} if adapter == "fp32" else {"adapter_dtype": adapter}
    )  # fp32: peft's default, the recording's name
    t = recorded(3, world, BUCKET, False, 1, 16, targets=names, **dtype)
    a = CachingAllocator(None)
    a.run(t["events"])
    s = engine_stream(3, world, BUCKET, False, 1, cpu=True, lora=16, targets=names, adapter_dtype=adapter)
    ours = replay_stream(s, AllocatorConf())
    assert abs(ours.peak_reserved / a.peak_reserved - 1) < 0.01, (ours.peak_reserved, a.peak_reserved)
    assert abs(ours.peak_allocated / a.peak_allocated - 1) < 0.005, (ours.peak_allocated, a.peak_allocated)
