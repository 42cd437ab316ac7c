"""The planner's search: which GPU counts, layouts and knobs it tries, and how it ranks what fits.

Each test states a rule of ``memsim_widget.plan`` (``gpu_counts``, ``SearchSpace``, ``layouts``,
``candidates``, ``plan``) and checks it on every candidate of a real search, not on a few remembered
numbers.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.catalog.models import architecture_for
from memsim_widget.engine.context import Context
from memsim_widget.errors import ScenarioError
from memsim_widget.plan import SearchSpace, plan
from memsim_widget.plan.space import GPUS_PER_NODE, gpu_counts, layouts
from memsim_widget.scenario import Scenario

#: The searches below test which candidates a plan holds, how it ranks them and when it offloads: none of that
#: reads how reserved is modelled, so they price reserved by the fitted rule (about 100x faster on a 70B search
#: than the allocator's replay). The replay's figures in plans are held to ``estimate`` by
#: tests/plan/test_plan_replay.py and tests/plan/test_plan_equals_estimate.py.
FAST = {"reserved_model": "fitted"}

# ----- gpu_counts ----------------------------------------------------------------------------------------


def test_one_count_and_a_list():
    assert gpu_counts(8) == (8,)
    assert gpu_counts([16, 2, 2, 8]) == (2, 8, 16)  # sorted, each once
    assert gpu_counts((1, 2, 3)) == (1, 2, 3)  # a tuple of three is a list, not a range
    assert gpu_counts(np.int64(4)) == (4,)


@settings(max_examples=60, deadline=None)
@given(lo=st.integers(1, 600), span=st.integers(0, 3000))
def test_a_range_is_its_ends_and_the_powers_of_two_inside(lo, span):
    hi = lo + span
    counts = gpu_counts((lo, hi))
    powers = {1 << k for k in range(13) if lo <= 1 << k <= hi}
    assert set(counts) == powers | {lo, hi}
    assert list(counts) == sorted(set(counts))
    assert all(type(n) is int for n in counts)


@pytest.mark.parametrize(
    "gpus",
    [0, -4, True, [], [1, 0], [2, "a"], (0, 4), (4, 2), (2.0, 8), 2.5, "8", None, [True]],
    ids=repr,
)
def test_bad_gpu_counts_name_the_field(gpus):
    with pytest.raises(ScenarioError) as err:
        gpu_counts(gpus)
    assert err.value.field == "gpus"


# ----- SearchSpace ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tp", (0,)),
        ("tp", ()),
        ("pp", (2, -1)),
        ("cp", ("2",)),
        ("ep", (1.5,)),
        ("micro_batch", (True,)),
        ("zero", (4,)),
        ("zero", ()),
        ("sequence_parallel", ("yes",)),
        ("checkpointing", ("fast",)),
        ("loss", ("fused",)),
        ("optimizers", ("adamw-9bit",)),
        ("offload", ("disk",)),
        ("max_tp", 0),
        ("max_tp", 2.5),
    ],
)
def test_search_space_errors_name_the_space_field(field, value):
    with pytest.raises(ScenarioError) as err:
        SearchSpace(**{field: value})
    assert err.value.field == f"space.{field}"


def test_a_narrowed_space_is_kept():
    space = SearchSpace(zero=[3], checkpointing=["full"], micro_batch=[2, 4])
    assert space.zero == (3,) and space.checkpointing == ("full",) and space.micro_batch == (2, 4)


# ----- layouts -------------------------------------------------------------------------------------------


def _accepted(base: Scenario, dp: int, tp: int, pp: int, cp: int, ep: int) -> bool:
    """The engine's own judgement of a layout (``Context`` validates it)."""
    try:
        Context(base.replace(parallel={"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep}))
    except ScenarioError:
        return False
    return True


@pytest.mark.parametrize(
    ("model", "counts"),
    [("llama-3.1-70b", (8, 24, 64)), ("qwen2.5-0.5b", (1, 6, 16)), ("mixtral-8x7b", (8, 16))],
)
def test_layouts_are_exactly_the_factorisations_the_engine_accepts(model, counts):
    base = Scenario.from_dict({"model": model, "seq_len": 4096})
    space = SearchSpace(tp=(1, 2, 3, 4, 8, 16))  # tp=16 exceeds a node, tp=3 divides few head counts
    got = {(x.num_gpus, x.dp, x.tp, x.pp, x.cp, x.ep) for x in layouts(base, counts, space)}
    want = set()
    for n in counts:
        for tp, pp, cp, ep in itertools.product(space.tp, space.pp, space.cp, space.ep):
            # ep spans dp x cp, or folds over the TP group beyond it (ParallelConfig.expert_tp)
            if tp > space.max_tp or n % (tp * pp * cp) or (n // pp % ep):
                continue
            dp = n // (tp * pp * cp)
            if _accepted(base, dp, tp, pp, cp, ep):
                want.add((n, dp, tp, pp, cp, ep))
    assert got == want and got


@pytest.mark.parametrize("model", ["llama-3.1-70b", "qwen2.5-0.5b", "mixtral-8x7b"])
def test_every_candidate_respects_the_architecture(model):
    arch = architecture_for(model)
    p = plan(
        model,
        "h100-sxm-80gb",
        (8, 64),
        seq_len=4096,
        space=SearchSpace(tp=(1, 2, 4, 8, 16)),
        top=None,
        **FAST,
    )
    c = p.columns
    assert p.evaluated > 0
    tp, pp, cp, dp, ep = (c[k] for k in ("tp", "pp", "cp", "dp", "ep"))
    assert np.all(dp * tp * pp * cp == c["num_gpus"])
    assert np.all(tp <= GPUS_PER_NODE)
    assert np.all(arch.num_heads % tp == 0)
    kv = arch.num_kv_heads
    assert np.all((tp == 1) | (kv % tp == 0) | (tp % kv == 0))
    # an even split, or torchtitan's (embedding and head count as a layer each) with a layer on every stage
    assert np.all((arch.num_layers % pp == 0) | ((arch.num_layers + 2) // pp >= 2))
    assert np.all(4096 % cp == 0)
    assert np.all((dp * cp * tp) % ep == 0)
    if arch.is_moe:
        assert np.all(arch.num_experts % ep == 0)
    else:
        assert np.all(ep == 1)
    assert np.all((c["zero"] == 0) | (dp * cp > 1) | (c["offload"] > 0))  # ZeRO needs a shard or an offload
    assert np.all((c["sp"] == 0) | (tp > 1))


# ----- global batch --------------------------------------------------------------------------------------


@settings(max_examples=6, deadline=None)
@given(
    sequences=st.sampled_from([1, 3, 8, 12, 48, 64, 96]),
    gpus=st.sampled_from([1, 4, (1, 8), [6, 12]]),
    seq_len=st.sampled_from([1024, 4096]),
)
def test_the_global_batch_is_kept_by_every_candidate(sequences, gpus, seq_len):
    tokens = sequences * seq_len
    p = plan("qwen2.5-0.5b", "a100-80gb", gpus, seq_len=seq_len, global_batch_tokens=tokens, top=None, **FAST)
    c = p.columns
    accum = np.where(c["pp"] > 1, c["pp_microbatches"], c["grad_accum"])
    assert np.all(c["dp"] * c["micro_batch"] * accum * seq_len == tokens)
    assert np.all((c["pp"] > 1) | (c["pp_microbatches"] == 1))
    assert np.all((c["pp"] == 1) | (c["grad_accum"] == 1))
    frame = p.all_frame()
    assert (frame["global_batch_tokens"] == tokens).all()
    for i in p.ranking[:3].tolist():  # the scenarios themselves say so too
        sc = p.scenario(i)
        steps = sc.parallel.pp_microbatches if sc.parallel.pp > 1 else sc.grad_accum_steps
        assert sc.parallel.dp * sc.micro_batch_size * steps * sc.seq_len == tokens


def test_layouts_whose_replicas_cannot_share_the_global_batch_are_left_out():
    base = Scenario.from_dict({"model": "qwen2.5-0.5b", "seq_len": 1024, "gpu": "a100-80gb"})
    every = {lay.dp for lay in layouts(base, (16,), SearchSpace())}
    p = plan(base=base, gpus=16, global_batch_tokens=6 * 1024, top=None)
    dps = set(p.columns["dp"].tolist())
    assert dps == {d for d in every if 6 % d == 0}
    assert dps < every  # dp=4, 8, 16 cannot split 6 sequences


def test_global_batch_errors_name_the_field():
    for bad in (100, 0, 2.5, True):
        with pytest.raises(ScenarioError) as err:
            plan("qwen2.5-0.5b", "a100-80gb", 1, seq_len=1024, global_batch_tokens=bad)
        assert err.value.field == "global_batch_tokens"


# ----- the offload stage ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "gpu", "gpus", "offload"),
    [
        ("llama-3.1-8b", "rtx-4090", (1, 8), ("none", "optimizer")),
        ("llama-3.1-8b", "a100-40gb", (1, 8), ("none", "optimizer", "optimizer+params")),
        ("llama-3.1-70b", "h100-sxm-80gb", [4, 8, 16, 32], ("none", "optimizer")),
    ],
)
def test_offload_is_tried_only_where_nothing_fits_without_it(model, gpu, gpus, offload):
    p = plan(model, gpu, gpus, seq_len=2048, space=SearchSpace(offload=offload), top=None, **FAST)
    c = p.columns
    without = c["offload"] == 0
    tried, needed = set(), set()
    for n in p.gpu_counts:
        mine = c["num_gpus"] == n
        if not (mine & without).any():
            continue  # no layout of this count at all
        if not (mine & without & c["fits"]).any():
            needed.add(n)
        if (mine & ~without).any():
            tried.add(n)
    assert tried == needed
    assert needed and needed != set(p.gpu_counts)  # the stage made a difference on both sides


def test_one_gpu_offload_rides_on_the_lowest_zero_stage():
    p = plan(
        "llama-3.1-8b",
        "a100-40gb",
        1,
        seq_len=2048,
        space=SearchSpace(offload=("none", "optimizer", "optimizer+params")),
        top=None,
    )
    c = p.columns
    off = c["offload"] > 0
    assert off.any() and p.fitting > 0
    assert set(zip(c["offload"][off].tolist(), c["zero"][off].tolist(), strict=True)) == {(1, 1), (2, 3)}
    assert np.all(c["zero"][~off] == 0)


def test_a_space_without_the_none_option_offloads_everywhere():
    p = plan("llama-3.1-8b", "h100-sxm-80gb", (2, 8), space=SearchSpace(offload=("optimizer",)), top=None)
    assert p.evaluated > 0 and np.all(p.columns["offload"] == 1)


# ----- ranking and JSON ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_70b():
    return plan("llama-3.1-70b", "h100-sxm-80gb", (16, 64), seq_len=4096, top=None, **FAST)


def test_only_fitting_candidates_are_ranked(plan_70b):
    p = plan_70b
    c = p.columns
    limit = c["gpu_memory_bytes"] * (1 - p.headroom)
    assert p.fitting == int(np.count_nonzero(c["device_total_bytes"] <= limit)) > 0
    assert np.all(c["device_total_bytes"][p.ranking] <= limit)
    assert set(p.ranking.tolist()) <= set(np.nonzero(c["fits"])[0].tolist())
    assert p.listed == len(p.ranking) <= p.fitting


def _group(c, i):
    return tuple(int(c[k][i]) for k in ("num_gpus", "dp", "tp", "pp", "cp", "ep", "optimizer", "method"))


def test_ranked_list_is_each_layouts_memory_throughput_frontier(plan_70b):
    """A fitting candidate is left out exactly when one of the same layout, method and optimizer is at
    least as fast and uses less memory (or as little, and came first)."""
    c, p = plan_70b.columns, plan_70b
    fits = np.nonzero(c["fits"])[0]
    ranked = set(p.ranking.tolist())
    best: dict[tuple, list[tuple[float, int]]] = {}
    for i in fits.tolist():
        best.setdefault(_group(c, i), []).append(
            (float(c["tokens_per_gpu_s"][i]), int(c["device_total_bytes"][i]))
        )
    for i in fits.tolist():
        tok, mem = float(c["tokens_per_gpu_s"][i]), int(c["device_total_bytes"][i])
        strictly_beaten = any(t >= tok and m < mem for t, m in best[_group(c, i)])
        if strictly_beaten:
            assert i not in ranked
        elif not any(t > tok and m <= mem for t, m in best[_group(c, i)]):
            # undominated: listed, unless an identical (speed, memory) twin is listed instead
            twins = [j for j in ranked if _group(c, j) == _group(c, i)
                     and float(c["tokens_per_gpu_s"][j]) == tok and int(c["device_total_bytes"][j]) == mem]  # fmt: skip
            assert i in ranked or twins


def test_ranking_is_by_the_proxy_then_own_optimizer_then_memory(plan_70b):
    c = plan_70b.columns
    r = plan_70b.ranking
    speed, mem = c["tokens_per_gpu_s"][r], c["device_total_bytes"][r]
    own = np.array([o != plan_70b.base.optimizer for o in plan_70b.space.optimizers])[c["optimizer"][r]]
    assert np.all(np.diff(speed) <= 0)
    ties = np.diff(speed) == 0
    key = own.astype(np.int64) * 2**62 + mem  # on equal speed: own optimizer first, then less memory
    assert np.all(np.diff(key)[ties] >= 0)
    frame = plan_70b.frame
    assert frame["tokens_per_gpu_s"].is_monotonic_decreasing
    assert frame["fits"].all() and (frame["free_gib"] >= 0).all()
    assert plan_70b.best() == plan_70b.scenario(int(r[0]))


def test_top_limits_the_frame_and_the_json(plan_70b):
    p = plan(base=plan_70b.base, gpus=plan_70b.gpu_counts, top=7)
    assert len(p.frame) == 7
    assert len(p.to_dict()["candidates"]) == 7
    assert len(p.to_dict(3)["candidates"]) == 3


def test_to_dict_is_json_and_each_candidate_is_its_own_estimate():
    p = plan("llama-3.1-8b", "a100-80gb", (1, 4), seq_len=4096, top=5)
    data = json.loads(json.dumps(p.to_dict()))
    assert data["fitting"] == p.fitting and data["evaluated"] == p.evaluated
    assert data["gpu_counts"] == [1, 2, 4]
    assert [c["rank"] for c in data["candidates"]] == [1, 2, 3, 4, 5]
    speeds = [c["throughput"]["tokens_per_gpu_s"] for c in data["candidates"]]
    assert speeds == sorted(speeds, reverse=True)
    for cand in data["candidates"]:
        est = p.estimate(cand["candidate"])
        assert Scenario.from_dict(cand["scenario"]) == est.scenario
        assert cand["estimate"]["device_total_bytes"] == est.device_total_bytes
        assert cand["estimate"]["fits"] is True


def test_nothing_fits_is_an_answer_not_an_error():
    p = plan("llama-3.1-405b", "rtx-4090", (1, 4), seq_len=8192, **FAST)
    assert p.evaluated > 0 and p.fitting == 0 and p.best() is None
    data = json.loads(json.dumps(p.to_dict()))
    assert data["candidates"] == [] and data["fitting"] == 0
    assert "0 fit" in p.summary()


def test_headroom_is_checked():
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(ScenarioError) as err:
            plan("qwen2.5-0.5b", "a100-80gb", 1, headroom=bad)
        assert err.value.field == "headroom"


def test_more_headroom_never_lets_more_fit():
    space = SearchSpace(offload=("none",))  # the same candidates at both headrooms (no offload stage)
    loose = plan("llama-3.1-8b", "a100-40gb", (1, 8), seq_len=4096, space=space, headroom=0.0, **FAST)
    tight = plan("llama-3.1-8b", "a100-40gb", (1, 8), seq_len=4096, space=space, headroom=0.25, **FAST)
    assert np.array_equal(loose.columns["device_total_bytes"], tight.columns["device_total_bytes"])
    assert 0 < tight.fitting < loose.fitting
    assert np.all(loose.columns["fits"][tight.columns["fits"]])
