"""The planner's vector path under ``reserved_model: replay`` (``plan/vector._replayed_pools``): its one-GPU
candidates take their reserved bytes from the same cached replay as ``estimate`` (``alloc_stream.pool_replay``),
so every candidate, listed or not, equals ``estimate`` of that candidate byte for byte."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from memsim_widget.plan import SearchSpace, plan
from memsim_widget.scenario import ParallelConfig


@pytest.mark.parametrize("conf", [None, "expandable_segments:True"])
def test_every_candidate_equals_estimate_with_the_replay(conf):
    base = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay", "allocator_conf": conf}
    p = plan(base=base, gpu="h100-sxm-80gb", gpus=(1, 2), space=SearchSpace(micro_batch=(1, 2)), top=10)
    assert p.mismatches(np.arange(p.evaluated)) == []
    replayed = [i for i in range(p.evaluated) if "replayed" in p.estimate(i).ranks[0].reserved.formula]
    assert replayed  # the one-GPU candidates without accumulation took the replay


def _tight_card(base: dict, below: int) -> dict:
    """A custom card whose room for the allocator is ``below`` bytes under the micro-batch-1 candidate's
    unlimited replay peak (MiB multiples: the GiB float is exact): some candidates run only by releasing the
    cache, some run out of memory although the capped reserved counter stays inside the card."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.counters.alloc_stream import pool_replay
    from memsim_widget.units import GiB

    est = estimate(base)
    outside = sum(i.bytes for i in est.worst.device)
    ctx = Context(est.scenario)
    peak = pool_replay(ctx, ctx.stages[0]).peak_reserved
    return {"memory_gib": (outside + peak - below) / GiB}


def test_the_planner_follows_the_replay_verdict_on_the_card():
    base = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay"}
    gpu = _tight_card(base, 1000 * 2**20)
    p = plan(base=base, gpu=gpu, gpus=(1,), space=SearchSpace(micro_batch=(1, 2)), top=10, headroom=0.0)
    assert p.mismatches(np.arange(p.evaluated)) == []  # fits included: the planner's verdict is estimate's
    oom = np.flatnonzero(p.columns["oom"])
    assert oom.size and not p.columns["fits"][oom].any()
    for i in oom[:3]:  # inside the card by the capped counter, out of memory in the replay on it
        est = p.estimate(int(i))
        assert est.device_total_bytes <= est.gpu.memory_bytes and est.verdict(0.0) == "does not fit"
        assert est.verdict_reason in ("fragmentation", "total")


def test_candidates_whose_requested_bytes_exceed_the_room_need_no_replay():
    """A card whose room is under micro-batch 1's requested peak: every one-GPU candidate of the base's optimizer
    and checkpointing asks for more bytes than the room at some event, so the planner calls each out of memory
    without replaying it (its peak allocated alone is over the room: no stream is even built, neither for
    ``alloc_stream.stream_asks`` nor for a replay), and still equals ``estimate`` (which replays)."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.core import estimate
    from memsim_widget.engine.counters import alloc_stream
    from memsim_widget.units import GiB

    MiB = 2**20

    base = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay"}
    est = estimate(base)
    outside = sum(i.bytes for i in est.worst.device)
    ctx = Context(est.scenario)
    rep = alloc_stream.pool_replay(ctx, ctx.stages[0])
    room = (outside + rep.peak_requested) // MiB * MiB - MiB  # MiB multiples: the GiB float is exact
    assert rep.peak_requested > room - outside >= 0
    alloc_stream.cache_clear()
    # the base's optimizer and checkpointing: a larger micro-batch only asks for more
    space = SearchSpace(micro_batch=(1, 2), optimizers=("adamw",), offload=("none",), checkpointing=("none",))
    p = plan(
        base=base, gpu={"memory_gib": room / GiB}, gpus=(1,), space=space, top=None, headroom=0.0, widen=False
    )
    assert alloc_stream._replay_cached.cache_info().currsize == 0  # no candidate replayed
    assert alloc_stream._asks_cached.cache_info().currsize == 0  # nor its stream written
    assert p.columns["oom"].all() and p.fitting == 0
    assert p.mismatches(np.arange(p.evaluated)) == []


def test_the_largest_micro_batch_follows_the_replay_verdict():
    from dataclasses import replace

    from memsim_widget.plan.reach import reach
    from memsim_widget.scenario import Scenario

    base = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay"}
    sc = Scenario.from_dict({**base, "gpu": _tight_card(base, 0)})  # room: micro-batch 1's unlimited peak
    space = SearchSpace(optimizers=("adamw",), offload=("none",), checkpointing=("none",))
    r = reach(sc, "micro_batch_size", space, top=8, headroom=0.0)
    fitting, capped_inside, oom = {}, {}, {}
    for k in range(
        1, 9
    ):  # every micro-batch by itself: the planner's verdict, the capped counter's, the replay's
        p = plan(base=sc.to_dict(), gpus=(1,), space=replace(space, micro_batch=(k,)), top=None, headroom=0.0,
                 widen=False)  # fmt: skip
        c = p.columns
        fitting[k] = p.fitting
        capped_inside[k] = int(((c["device_total_bytes"] <= c["gpu_memory_bytes"]) & ~c["overflow"]).sum())
        oom[k] = int(c["oom"].sum())
    assert r is not None and r.estimate.fits(headroom=0.0)
    assert fitting[r.value] and not fitting.get(r.next_stop, 0)
    # the replay decides: one stop further the capped counter alone would have called a candidate inside the
    # card, and its replay on the card runs out of memory
    assert r.next_stop is not None and capped_inside[r.next_stop] > 0 and oom[r.next_stop] > 0


def test_accumulating_candidates_take_the_replay_and_equal_estimate():
    """A global batch of 4 sequences: the one-GPU candidates run 4, 2 or 1 micro-batches a step, each replayed
    with its accumulation (``alloc_stream.step_stream``), each equal to ``estimate`` byte for byte."""
    base = {"model": "qwen2.5-0.5b", "seq_len": 512, "reserved_model": "replay"}
    p = plan(
        base=base, gpu="h100-sxm-80gb", gpus=(1, 2), space=SearchSpace(micro_batch=(1, 2, 4)), top=10,
        global_batch_tokens=4 * 512,
    )  # fmt: skip
    assert p.mismatches(np.arange(p.evaluated)) == []
    accumulated = [
        i for i in range(p.evaluated)
        if p.estimate(i).scenario.grad_accum_steps > 1 and p.estimate(i).scenario.parallel.world_size == 1
    ]  # fmt: skip
    assert accumulated
    for i in accumulated:
        est = p.estimate(i)
        assert "replayed" in est.ranks[0].reserved.formula


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_candidates_take_the_replay_and_equal_estimate(reshard):
    """Untied embeddings, full training: the candidates sharded with FSDP2 over 2 and 4 GPUs replay their rank's
    stream with FSDP2's buffers on its streams (``engine/counters/fsdp_stream.py``), each equal to ``estimate``
    byte for byte; the ZeRO 1/2 candidates keep the fitted rule in both (the ZeRO 0 ones are DDP ranks, replayed
    with DDP's buckets: ``test_ddp_candidates_take_the_replay_and_equal_estimate``)."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {
        "model": LLAMA_H512_V32K, "seq_len": 512, "reserved_model": "replay",
        "parallel": {"reshard_after_forward": reshard},
    }  # fmt: skip
    replayed = 0
    for est in _checked(base, SearchSpace(micro_batch=(1, 2))):
        par = est.scenario.parallel
        alone = _data_parallel_alone(par)
        fsdp2 = alone and par.zero == 3 and est.scenario.grad_accum_steps == 1
        ddp = alone and par.zero == 0
        sc = est.scenario  # a TP rank alone or under FSDP2, one micro-batch, checkpointing none or full
        tp = par.tp > 1 and par.pp * par.cp * par.ep == 1 and sc.grad_accum_steps == 1
        tp = tp and sc.activation_checkpointing in ("none", "full") and (par.dp == 1 or par.zero == 3)
        # a pipeline stage alone under GPipe or 1F1B, one micro-batch a schedule step (engine/counters/pp_stream)
        pp = par.pp > 1 and par.dp * par.tp * par.cp * par.ep == 1 and sc.grad_accum_steps == 1
        assert ("replayed" in est.ranks[0].reserved.formula) == (fsdp2 or ddp or tp or pp)
        replayed += fsdp2
    assert replayed


@pytest.mark.parametrize("framework", ["hf", "torchtitan"])
def test_accumulating_fsdp2_candidates_take_the_replay_and_equal_estimate(framework):
    """A global batch of 8 sequences over 2 and 4 GPUs: the FSDP2 candidates run 1 to 4 micro-batches a step,
    each replayed with its framework's accumulation (HF Trainer's ``no_sync``, torchtitan's reduce-scatter every
    micro-batch: ``fsdp_stream.Fsdp2Units.accumulation``), each equal to ``estimate`` byte for byte."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {"model": LLAMA_H512_V32K, "seq_len": 512, "reserved_model": "replay", "framework": framework}
    space = SearchSpace(micro_batch=(1, 2), zero=(3,), offload=("none",))
    accumulated = []
    for est in _checked(base, space, sequences=8):
        if _data_parallel_alone(est.scenario.parallel) and est.scenario.grad_accum_steps > 1:
            assert "replayed" in est.ranks[0].reserved.formula
            accumulated.append(est.scenario.grad_accum_steps)
    assert len(set(accumulated)) > 1


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_ddp_candidates_take_the_replay_and_equal_estimate(checkpointing):
    """The candidates with DDP over 2 and 4 GPUs (zero 0) replay their rank's stream with DDP's wrap-time
    broadcast and buckets (``engine/counters/ddp_stream.py``; without checkpointing HF Trainer asks for
    ``find_unused_parameters``, so no rebuild; with it the buckets are rebuilt at step 2), accumulation
    included, each equal to ``estimate`` byte for byte."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {
        "model": LLAMA_H512_V32K, "seq_len": 512, "reserved_model": "replay",
        "activation_checkpointing": checkpointing,
    }  # fmt: skip
    space = SearchSpace(micro_batch=(1, 2), zero=(0,), checkpointing=(checkpointing,), offload=("none",))
    ddp = [e for e in _checked(base, space, sequences=8) if _data_parallel_alone(e.scenario.parallel)]
    assert ddp
    for est in ddp:
        formula = est.ranks[0].reserved.formula
        assert "replayed" in formula and "DDP's wrap-time broadcast" in formula


def test_zero12_candidates_take_the_replay_and_equal_estimate():
    """Under DeepSpeed (mixed-bf16) the ZeRO-1 and ZeRO-2 candidates over 2 and 4 GPUs with no other parallelism
    replay their rank's stream with DeepSpeed's buffers (``engine/counters/zero_stream.py``), each equal to
    ``estimate`` byte for byte, the accumulating ones too (held to CPU traces of DeepSpeed's accumulation)."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {
        "model": LLAMA_H512_V32K, "seq_len": 512, "reserved_model": "replay", "framework": "deepspeed",
        "precision": "mixed-bf16",
    }  # fmt: skip
    space = SearchSpace(micro_batch=(1, 2), zero=(1, 2), checkpointing=("none",), offload=("none",))
    p = plan(base=base, gpu="h100-sxm-80gb", gpus=(2, 4), space=space, top=10, global_batch_tokens=8 * 512)
    assert p.mismatches(np.arange(p.evaluated)) == []
    zero = [p.estimate(i) for i in range(p.evaluated)]
    zero = [e for e in zero if e.scenario.parallel.dp > 1 and e.scenario.parallel.zero in (1, 2)]
    zero = [
        e for e in zero if (q := e.scenario.parallel).tp * q.pp * q.cp * q.ep == 1
    ]  # no other parallelism
    assert {e.scenario.parallel.zero for e in zero} == {1, 2}
    for e in zero:
        assert "DeepSpeed ZeRO-1/2" in e.ranks[0].reserved.formula
    assert {e.scenario.grad_accum_steps > 1 for e in zero} == {True, False}


@pytest.mark.parametrize(("tied", "checkpointing"), [(False, "none"), (True, "full")])
def test_zero3_deepspeed_candidates_take_the_replay_and_equal_estimate(tied: bool, checkpointing: str):
    """Under DeepSpeed (mixed-bf16) the ZeRO-3 candidates over 2 and 4 GPUs with no other parallelism replay their
    rank's DeepSpeed stream (``engine/counters/zero3_stream.py``), each equal to ``estimate`` byte for byte, the
    accumulating ones too; tied embeddings under full checkpointing as well."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {
        "model": {**LLAMA_H512_V32K, "tie_word_embeddings": tied}, "seq_len": 512, "reserved_model": "replay", "framework": "deepspeed",
        "precision": "mixed-bf16",
    }  # fmt: skip
    space = SearchSpace(micro_batch=(1, 2), zero=(3,), checkpointing=(checkpointing,), offload=("none",))
    p = plan(base=base, gpu="h100-sxm-80gb", gpus=(2, 4), space=space, top=10, global_batch_tokens=8 * 512)
    assert p.mismatches(np.arange(p.evaluated)) == []
    zero = [p.estimate(i) for i in range(p.evaluated)]
    zero = [
        e
        for e in zero
        if (q := e.scenario.parallel).dp > 1 and q.zero == 3 and q.tp * q.pp * q.cp * q.ep == 1
    ]
    assert zero
    for e in zero:
        assert "DeepSpeed ZeRO-3" in e.ranks[0].reserved.formula
    assert {e.scenario.grad_accum_steps > 1 for e in zero} == {True, False}


def test_tp_candidates_take_the_replay_and_equal_estimate():
    """The candidates with tensor parallelism alone (tp 2 and 4, sequence parallel or not, under transformers'
    plan) replay their rank's stream with TP's all-reduces and gathered logits (``engine/counters/tp_stream.py``),
    each equal to ``estimate`` byte for byte; TP with DDP (zero 0) keeps the fitted rule in both."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {"model": LLAMA_H512_V32K, "seq_len": 512, "reserved_model": "replay"}
    space = SearchSpace(micro_batch=(1, 2), zero=(0,), checkpointing=("none",), offload=("none",))
    tp = []
    for est in _checked(base, space):
        par = est.scenario.parallel
        formula = est.ranks[0].reserved.formula
        if par.tp > 1:
            alone = par.dp * par.pp * par.cp * par.ep == 1 and est.scenario.grad_accum_steps == 1
            assert ("replayed" in formula) == alone  # zero 0: dp > 1 is DDP, not written with TP
            tp += [(par.tp, par.sequence_parallel)] if "replayed" in formula else []
    assert {(2, False), (2, True), (4, False), (4, True)} <= set(tp)


def test_torchtitan_tp_candidates_take_the_replay_and_equal_estimate():
    """torchtitan's loop and plan (loss parallel, the vocab-sharded embedding; ``expandable_segments:True``):
    the candidates with TP alone or under FSDP2 (one micro-batch, bf16) replay their rank's stream
    (``tp_stream.tp_replayable`` accepts torchtitan's plan), each equal to ``estimate`` byte for byte; TP with
    DDP (zero 0) keeps the fitted rule in both."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {"model": LLAMA_H512_V32K, "seq_len": 512, "reserved_model": "replay", "framework": "torchtitan"}
    space = SearchSpace(micro_batch=(1, 2), zero=(0, 3), checkpointing=("none",), offload=("none",))
    tp = []
    for est in _checked(base, space):
        par, sc = est.scenario.parallel, est.scenario
        if par.tp > 1:
            replays = (
                par.pp * par.cp * par.ep == 1 and sc.grad_accum_steps == 1 and (par.dp == 1 or par.zero == 3)
            )
            assert ("replayed" in est.ranks[0].reserved.formula) == replays
            tp += [(par.tp, par.dp)] if replays else []
    assert {(2, 1), (4, 1), (2, 2)} <= set(tp)


def test_lora_fsdp2_candidates_take_the_replay_and_equal_estimate():
    """LoRA under FSDP2 over 2 and 4 GPUs (the frozen base gathered, only the adapters reduce-scattered:
    ``fsdp_stream.fsdp2_units``), with and without accumulation: replayed, each equal to ``estimate`` byte for
    byte."""
    sharded = [e for e in _lora_candidates(zero=3, sequences=4) if _data_parallel_alone(e.scenario.parallel)]
    assert sharded and all("replayed" in e.ranks[0].reserved.formula for e in sharded)
    assert {e.scenario.grad_accum_steps for e in sharded} != {1}


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_lora_ddp_candidates_take_the_replay_and_equal_estimate(checkpointing):
    """LoRA under DDP over 2 and 4 GPUs (zero 0: every parameter broadcast at wrap, only the adapters bucketed,
    ``ddp_stream.rank_buckets``), with and without accumulation: replayed, each equal to ``estimate`` byte for
    byte."""
    ests = _lora_candidates(zero=0, sequences=8, checkpointing=checkpointing)
    ddp = [e for e in ests if _data_parallel_alone(e.scenario.parallel)]
    assert ddp and all("DDP's wrap-time broadcast" in e.ranks[0].reserved.formula for e in ddp)
    assert {e.scenario.grad_accum_steps for e in ddp} != {1}


def test_qlora_ddp_candidates_take_the_replay_and_equal_estimate():
    """QLoRA under DDP over 2 and 4 GPUs (its NF4 codes broadcast as uint8 beside the bf16 rest, only the
    adapters bucketed: ``ddp_stream._tensors``), with and without accumulation: replayed, each equal to
    ``estimate`` byte for byte; its FSDP2 candidates keep the fitted rule (``replayable.fsdp2_replayable``)."""
    ests = _lora_candidates(zero=0, sequences=8, checkpointing="none", method="qlora")
    ddp = [e for e in ests if _data_parallel_alone(e.scenario.parallel)]
    assert ddp and all("DDP's wrap-time broadcast" in e.ranks[0].reserved.formula for e in ddp)
    assert {e.scenario.grad_accum_steps for e in ddp} != {1}
    sharded = _lora_candidates(zero=3, sequences=4, checkpointing="none", method="qlora")
    assert not any("replayed" in e.ranks[0].reserved.formula for e in sharded if e.scenario.parallel.dp > 1)


def _lora_candidates(
    zero: int, sequences: int, checkpointing: str | None = None, method: str = "lora"
) -> list:
    """The planner's candidates for LoRA (``method``: or QLoRA, bf16) r16 on q_proj and v_proj of the small
    Llama at 512 tokens on 2 and 4 H100s under ``zero`` (a global batch of ``sequences``; ``checkpointing``
    fixed, or every setting the planner tries), each checked equal to ``estimate`` (``_checked``): their
    estimates."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {
        "model": LLAMA_H512_V32K, "seq_len": 512, "reserved_model": "replay", "method": method,
        "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]},
        **({"precision": "bf16"} if method == "qlora" else {}),
    }  # fmt: skip
    space = SearchSpace(micro_batch=(1, 2), zero=(zero,), offload=("none",))
    if checkpointing is not None:
        base["activation_checkpointing"] = checkpointing
        space = dataclasses.replace(space, checkpointing=(checkpointing,))
    return _checked(base, space, sequences=sequences)


def _checked(base: dict, space: SearchSpace, sequences: int | None = None) -> list:
    """The planner's candidates for ``base`` on 2 and 4 H100s (a global batch of ``sequences`` of the base's
    length, or the planner's default), after checking that each equals ``estimate`` byte for byte
    (``mismatches``): their estimates."""
    tokens = {"global_batch_tokens": sequences * base["seq_len"]} if sequences else {}
    p = plan(base=base, gpu="h100-sxm-80gb", gpus=(2, 4), space=space, top=10, **tokens)
    assert p.mismatches(np.arange(p.evaluated)) == []
    return [p.estimate(i) for i in range(p.evaluated)]


def _data_parallel_alone(par: ParallelConfig) -> bool:
    """More than one data-parallel rank and no other parallelism (a DDP or FSDP2 rank alone)."""
    return par.dp > 1 and par.tp * par.pp * par.cp * par.ep == 1


def test_pipeline_candidates_replay_by_default_and_equal_estimate():
    """No ``reserved_model`` named: the GPipe and 1F1B candidates without other parallelism replay their stage's
    stream (``pp_stream``; the default since every traced stage came within 1% of its trace), each equal to
    ``estimate`` byte for byte; the interleaved ones keep the fitted rule."""
    from tests.data.fidelity_cases import LLAMA_H512_V32K

    base = {"model": LLAMA_H512_V32K, "seq_len": 512}
    space = SearchSpace(micro_batch=(1, 2), tp=(1,), cp=(1,), ep=(1,), zero=(0,), offload=("none",))
    piped = [e for e in _checked(base, space) if e.scenario.parallel.pp > 1 and e.scenario.parallel.dp == 1]
    assert piped
    for est in piped:
        par, sc = est.scenario.parallel, est.scenario
        replays = par.pp_schedule in ("gpipe", "1f1b") and sc.grad_accum_steps == 1
        assert all(("replayed" in r.reserved.formula) == replays for r in est.ranks)
    assert any("replayed" in e.ranks[0].reserved.formula for e in piped)
