"""The planner's vectorised engine agrees with ``estimate`` to the byte, for every candidate it returns.

``plan.vector.evaluate`` recombines engine parts on numpy arrays; these tests call ``estimate`` one
scenario at a time and compare allocated, reserved and nvidia-smi bytes, the peak moment and the worst
pipeline stage.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.plan import SearchSpace, plan
from memsim_widget.plan.vector import COLUMNS, candidate_scenario, evaluate
from memsim_widget.scenario import Scenario

OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw-8bit")

#: Base scenarios covering the engine's branches: frameworks, methods, schedules, offloading, MoE, eager.
BASES = [
    {"model": "llama-3.1-8b", "seq_len": 4096},
    {"model": "llama-3.1-8b", "method": "lora", "seq_len": 2048},
    {"model": "llama-3.1-8b", "method": "lora", "precision": "amp-bf16", "seq_len": 2048},
    {
        "model": "llama-3.1-8b",
        "method": "qlora",
        "gpu": "rtx-4090",
        "lora": {"targets": ["all-linear"], "adapter_dtype": "bf16"},
    },
    {"model": "llama-3.1-8b", "framework": "megatron", "seq_len": 4096},
    {"model": "llama-3.1-8b", "framework": "torchtitan", "precision": "amp-bf16"},
    {"model": "llama-3.1-8b", "framework": "torchtitan", "parallel": {"reshard_after_forward": False}},
    {"model": "llama-3.2-1b", "parallel": {"reshard_after_forward": False}, "seq_len": 1024},
    {"model": "llama-3.1-8b", "framework": "torchtune", "activation_offloading": True, "padding": "longest"},
    # the first N of 32 layers offloaded (TransformerEngine / Megatron cpu_offloading_num_layers)
    {
        "model": "llama-3.1-8b",
        "framework": "megatron",
        "activation_offloading": True,
        "activation_offloading_layers": 12,
    },
    {
        "model": "llama-3.2-1b",
        "activation_offloading": True,
        "activation_offloading_layers": 1,
        "seq_len": 1024,
    },
    {"model": "llama-3.1-8b", "framework": "deepspeed", "parallel": {"pp_schedule": "gpipe"}},
    # ZeRO-1/2's two reduce buffers of hidden x hidden elements (parallel.overlap_comm, reduce_bucket_size "auto")
    {
        "model": "llama-3.2-1b",
        "framework": "deepspeed",
        "parallel": {"overlap_comm": True, "reduce_bucket_size": "auto"},
    },
    {"model": "llama-3.1-8b", "parallel": {"pp_schedule": "interleaved", "virtual_stages": 2}},
    {"model": "llama-3.1-8b", "optimizer_in_backward": True},
    {"model": "mixtral-8x7b", "seq_len": 1024},
    {"model": "qwen2.5-0.5b", "attention": "eager", "seq_len": 1024, "cuda_lazy_loading": False},
    {"model": "gpt2", "precision": "fp32", "seq_len": 1024},
    {"model": "llama-3.2-1b", "seq_len": 256, "output_lifetime": "step"},
    {"model": "qwen2.5-0.5b", "precision": "amp-bf16", "attention": "eager", "output_lifetime": "backward"},
]


@st.composite
def knobs(draw: st.DrawFn, base: Scenario) -> dict[str, int]:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.sampled_from([1, 2, 3, 4, 5]))  # 3 and 5: uneven splits of most bases (rules/pipeline_split)
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    moe = isinstance(base.model, str) and "mixtral" in base.model
    ep = draw(st.sampled_from([1, 2])) if moe else 1
    zero = draw(st.sampled_from([0, 1, 2, 3])) if dp * cp > 1 else 0
    offload = draw(st.sampled_from([0, 1, 2] if zero == 3 else [0, 1])) if zero else 0
    m = draw(st.sampled_from([pp, 2 * pp, 3 * pp])) if pp > 1 else 1
    accum = draw(st.sampled_from([1, 4])) if pp == 1 and not base.optimizer_in_backward else 1
    return {
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "ep": ep,
        "zero": zero,
        "sp": draw(st.sampled_from([0, 1])) if tp > 1 else 0,
        "micro_batch": draw(st.sampled_from([1, 2, 3, 4])),
        "grad_accum": accum,
        "pp_microbatches": m,
        "checkpointing": draw(st.sampled_from([0, 1, 2, 3])),
        "loss": draw(st.sampled_from([0, 1])),
        "optimizer": draw(st.sampled_from([0, 1, 2])),
        "offload": offload,
        # hybrid sharding (0: unset): a shard group within dp, under any ZeRO stage (ZeRO-0 ignores it)
        "dp_shard": draw(st.sampled_from([0, *(d for d in (1, 2, 4) if dp % d == 0 and d < dp)])),
    }


def _expected(est) -> tuple:
    return (
        est.peak_allocated_bytes,
        est.peak_reserved_bytes,
        est.device_total_bytes,
        est.peak_phase,
        est.worst.stage.index,
    )


def _got(ev, i: int) -> tuple:
    return (
        int(ev.peak_allocated_bytes[i]),
        int(ev.peak_reserved_bytes[i]),
        int(ev.device_total_bytes[i]),
        str(ev.peak_phase[i]),
        int(ev.worst_stage[i]),
    )


@pytest.mark.parametrize("base_data", BASES, ids=lambda d: "-".join(f"{v}" for v in d.values())[:60])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_vector_engine_equals_estimate_byte_for_byte(base_data, data):
    base = Scenario.from_dict(base_data)
    rows, expected = [], []
    for _ in range(6):  # one evaluate call over several candidates, as the planner makes it
        row = data.draw(knobs(base))
        try:
            est = estimate(candidate_scenario(base, OPTIMIZERS, row))
        except ScenarioError:
            continue
        rows.append(row)
        expected.append(_expected(est))
    if not rows:
        return
    cols = {k: np.array([r[k] for r in rows]) for k in COLUMNS}
    ev = evaluate(base, cols, OPTIMIZERS)
    assert [_got(ev, i) for i in range(len(rows))] == expected


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": "llama-3.1-70b", "gpu": "h100-sxm-80gb", "gpus": 64, "seq_len": 8192,
         "global_batch_tokens": 1 << 20},
        {"model": "llama-3.1-8b", "gpu": "rtx-4090", "gpus": 1, "method": "qlora", "seq_len": 2048},
        {"model": "mixtral-8x7b", "gpu": "h100-sxm-80gb", "gpus": (8, 32), "seq_len": 4096},
    ],
    ids=["70b-64xh100", "8b-qlora-4090", "mixtral-8-32"],
)  # fmt: skip
def test_every_returned_candidate_agrees_with_estimate(kwargs):
    p = plan(**kwargs, top=40)
    assert p.fitting > 0
    frame = p.frame
    for row in frame.itertuples():
        est = p.estimate(int(row.candidate))
        assert est.fits(headroom=p.headroom)
        assert round(est.device_total_bytes / 2**30, 9) == round(row.device_total_gib, 9)
        i = int(row.candidate)
        assert int(p.columns["peak_allocated_bytes"][i]) == est.peak_allocated_bytes
        assert int(p.columns["peak_reserved_bytes"][i]) == est.peak_reserved_bytes
        assert int(p.columns["device_total_bytes"][i]) == est.device_total_bytes
        assert p.columns["peak_phase"][i] == est.peak_phase


def test_candidates_that_do_not_fit_agree_too():
    p = plan("llama-3.1-70b", "h100-sxm-80gb", 16, seq_len=4096, global_batch_tokens=1 << 19, top=None)
    rng = np.random.default_rng(0)
    idx = rng.choice(p.evaluated, size=60, replace=False)
    for i in idx.tolist():
        est = p.estimate(i)
        assert int(p.columns["device_total_bytes"][i]) == est.device_total_bytes
        assert bool(p.columns["fits"][i]) == est.fits(headroom=p.headroom)


def test_a_candidate_whose_allocated_alone_is_over_the_card_builds_no_stream(monkeypatch):
    """A 70B full fine-tune on one 24 GB card: every candidate's peak allocated is over the card's room, so the
    planner writes no allocation stream for any (its reserved is the peak allocated whatever a replay gives), and
    its figures are still the estimate's."""
    from memsim_widget.engine.counters import alloc_stream

    built = []
    real = alloc_stream.rank_stream
    monkeypatch.setattr(alloc_stream, "rank_stream", lambda *a: built.append(a) or real(*a))
    p = plan("llama-3.1-70b", "rtx-4090", 1, seq_len=2048, method="full", top=None, widen=False)
    assert p.evaluated and p.fitting == 0 and not built
    for i in range(0, p.evaluated, max(p.evaluated // 8, 1)):
        est = p.estimate(i)
        assert int(p.columns["peak_reserved_bytes"][i]) == est.peak_reserved_bytes
        assert int(p.columns["device_total_bytes"][i]) == est.device_total_bytes
        assert not est.fits(headroom=p.headroom)


def test_narrowed_space_keeps_only_the_fixed_choices():
    space = SearchSpace(checkpointing=("full",), optimizers=("adamw",), zero=(3,), micro_batch=(1,))
    p = plan("llama-3.1-8b", "a100-80gb", 8, seq_len=4096, space=space, top=None)
    f = p.all_frame()
    assert set(f.activation_checkpointing) == {"full"}
    assert set(f.optimizer) == {"adamw"}
    assert set(f.micro_batch_size) == {1}
    assert set(f.zero) <= {0, 3}  # ZeRO-0 only where a layout has a single replica


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "gpipe"])
def test_first_carrying_stage_is_where_in_flight_first_drops_below_the_micro_batches(schedule):
    """The planner's extra middle stage is the lowest stage >= 1 whose in-flight count (the engine's own
    formula) is below the micro-batch count; every such stage can carry gradients, none below it can."""
    from memsim_widget.engine.parallel.schedule import interleaved_in_flight
    from memsim_widget.plan.vector import _first_carrying_stage

    v = 2 if schedule == "interleaved" else 1
    pps, mbs, expected = [], [], []
    for p in range(2, 17):
        for m in range(1, 33):
            if schedule == "interleaved" and m % p:
                continue

            def f(s: int, p: int = p, m: int = m) -> float:
                if schedule == "interleaved":
                    return interleaved_in_flight(p, v, m, s)
                return float(min(m, p - s))

            below = [s for s in range(1, p) if f(s) < m]
            pps.append(p)
            mbs.append(m)
            expected.append(below[0] if below and schedule != "gpipe" else None)
            if below:
                assert below == list(range(below[0], p))  # once below, it stays below
    got = _first_carrying_stage(np.array(pps), np.array(mbs), schedule, v)
    for p, m, e, g in zip(pps, mbs, expected, got.tolist(), strict=True):
        if e is None:
            assert g < 1 or g >= p, (p, m, g)
        else:
            assert g == e, (p, m, g, e)
