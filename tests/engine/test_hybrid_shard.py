"""Hybrid sharding (``parallel.dp_shard``: HSDP, HYBRID_SHARD, MiCS): ZeRO shards the states over groups of
dp_shard ranks and replicates them over dp / dp_shard groups, so a rank holds what dp_shard-way sharding holds
(Rajbhandari et al. 2020's per-rank terms with N_d the shard group), plus the replicate group's communicator
(torch 2.13 ``_fsdp_collectives.foreach_reduce``: the all-reduce across replicas, in place on the gradient shard)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memsim_widget.catalog.models import architecture_for
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.counters.overhead import NCCL_PER_COMMUNICATOR, communicator_count, communicators
from memsim_widget.engine.states import model_states
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import Scenario

MODEL = "llama-3.2-1b"


def scenario(framework: str = "torchtitan", **par) -> Scenario:
    return Scenario.from_dict({"model": MODEL, "framework": framework, "seq_len": 512, "parallel": par})


def sharded(sc: Scenario) -> dict[str, int]:
    """The rank's sharded state items by name: weights, fp32 master, optimizer states, gradients."""
    ctx = Context(sc)
    st_ = model_states(ctx, ctx.stages[0])
    items = [*st_.persistent, *st_.grads]
    keep = ("weights", "master", "states", "gradients")
    return {i.item: i.bytes for i in items if any(k in i.item for k in keep) and "bucket" not in i.item}


def test_dp8_sharded_4_ways_holds_what_dp4_fully_sharded_holds_to_the_byte() -> None:
    """ZeRO-3 (FSDP2): weights, gradients and AdamW states divide by the shard group (4), not dp (8)."""
    hsdp, four = sharded(scenario(dp=8, dp_shard=4, zero=3)), sharded(scenario(dp=4, zero=3))
    assert hsdp == four
    assert hsdp != sharded(scenario(dp=8, zero=3))
    n = architecture_for(MODEL).parameters
    assert hsdp["adamw states"] == n * 2 * 2 // 4  # bf16: 2 states x 2 B per parameter, over 4 ranks


@pytest.mark.parametrize("zero", [1, 2])
def test_zero12_states_and_gradients_shard_over_the_group(zero: int) -> None:
    hsdp = sharded(scenario("deepspeed", dp=8, dp_shard=2, zero=zero))
    assert hsdp == sharded(scenario("deepspeed", dp=2, zero=zero))


def test_the_replicas_add_one_communicator_and_nothing_else_on_one_micro_batch() -> None:
    """dp 8 as 2 x 4: the same allocated and reserved peaks as dp 4 (FSDP2 over the shard group, replayed;
    traced equal at every phase peak on a CPU 2 x 4 mesh) and one more NCCL communicator, the replicate group."""
    hsdp, four = estimate(scenario(dp=8, dp_shard=4, zero=3)), estimate(scenario(dp=4, zero=3))
    assert (hsdp.peak_allocated_bytes, hsdp.peak_reserved_bytes) == (
        four.peak_allocated_bytes,
        four.peak_reserved_bytes,
    )
    assert hsdp.device_total_bytes - four.device_total_bytes == NCCL_PER_COMMUNICATOR
    assert communicators(Context(scenario(dp=8, dp_shard=4, zero=3))) == ["dp", "dp_replicate"]
    assert communicators(Context(scenario(dp=8, dp_shard=4, zero=0))) == ["dp"]  # ZeRO-0 shards nothing


def test_communicator_count_takes_columns_as_the_planner_passes_them() -> None:
    dp, shard = np.array([8, 8, 8, 8]), np.array([0, 4, 8, 1])
    one = np.ones(4, dtype=np.int64)
    assert communicator_count(dp, one, one, one, one, shard).tolist() == [1, 2, 1, 1]


@settings(max_examples=25, deadline=None)
@given(dp=st.sampled_from([2, 4, 8, 16]), zero=st.sampled_from([1, 2, 3]), cp=st.sampled_from([1, 2]))
def test_sharded_bytes_never_grow_with_the_shard_degree_and_dp_shard_dp_is_unset(
    dp: int, zero: int, cp: int
) -> None:
    """Over the divisors of dp, a larger shard group never holds more of any sharded item; dp_shard = dp is
    the unset key, to the byte, for every counter."""
    fw = "torchtitan" if zero == 3 else "deepspeed"
    divisors = [d for d in range(1, dp + 1) if dp % d == 0]
    rows = [sharded(scenario(fw, dp=dp, cp=cp, dp_shard=d, zero=zero)) for d in divisors]
    assert rows[0], "some item is sharded"
    for small, large in zip(rows, rows[1:], strict=False):
        assert small.keys() == large.keys()
        assert all(large[k] <= small[k] for k in small)
    full, unset = (
        estimate(scenario(fw, dp=dp, cp=cp, dp_shard=dp, zero=zero)),
        estimate(scenario(fw, dp=dp, cp=cp, zero=zero)),
    )
    for counter in ("peak_allocated_bytes", "peak_reserved_bytes", "device_total_bytes"):
        assert getattr(full, counter) == getattr(unset, counter)


@pytest.mark.parametrize(
    ("par", "words"),
    [
        ({"dp": 8, "dp_shard": 3}, "must divide parallel.dp"),
        ({"dp": 8, "dp_shard": 0}, "integer >= 1"),
        ({"dp": 8, "dp_shard": "4"}, "integer >= 1"),
        ({"dp": 8, "dp_shard": 16}, "must divide parallel.dp"),
    ],
)
def test_a_shard_degree_that_does_not_tile_dp_is_one_error_naming_the_field(par: dict, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario(zero=3, **par)
    assert err.value.field == "parallel.dp_shard"
    assert words in str(err.value)


def test_the_cli_flag_sets_it_and_a_bad_value_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memsim_widget.cli import main

    assert main(["estimate", "--model", MODEL, "--dp", "8", "--dp-shard", "4", "--zero", "3", "--json"]) == 0
    assert '"dp_shard": 4' in capsys.readouterr().out
    assert main(["estimate", "--model", MODEL, "--dp", "8", "--dp-shard", "3", "--zero", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "parallel.dp_shard" in err and "\n" not in err


def test_the_formula_says_the_shard_group_and_the_replicas() -> None:
    ctx = Context(scenario(dp=8, dp_shard=4, zero=3))
    st_ = model_states(ctx, ctx.stages[0])
    assert any("dp_shard 4 x 2 replicas" in i.formula for i in st_.persistent)


def test_hsdp_under_reduce_every_micro_batch_says_what_it_does_not_count() -> None:
    """torchtitan reduces every micro-batch: FSDP2 holds a later micro-batch's all-reduce output to the end of
    its backward (torch 2.13 ``FSDPParamGroup._all_reduce_state``), which the figures do not count: a caveat."""
    sc = scenario(dp=8, dp_shard=4, zero=3).replace(grad_accum_steps=2)
    assert any("HSDP" in c for c in estimate(sc).caveats)
    assert not any("HSDP" in c for c in estimate(scenario(dp=8, dp_shard=4, zero=3)).caveats)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hsdp", "shard"),
    [
        ({"dp": 8, "dp_shard": 4, "zero": 3}, {"dp": 4, "zero": 3}),
        ({"dp": 4, "dp_shard": 2, "tp": 2, "zero": 3}, {"dp": 2, "tp": 2, "zero": 3}),  # 2-D dp mesh x tp
    ],
)
def test_a_cpu_trace_of_hsdp_matches_the_engine_and_fsdp_over_the_shard_group(
    hsdp: dict, shard: dict
) -> None:
    """PyTorch's own FSDP2 on a (replicate, shard) CPU mesh (x tp): the traced peak equals that of FSDP2 over
    the shard group alone, and the engine's within 0.1%."""
    from fidelity_cases import LLAMA
    from fidelity_parallel_cases import _case, compare

    got = compare(*_case("llama bf16 hsdp", LLAMA, hsdp))
    alone = compare(*_case("llama bf16 fsdp", LLAMA, shard))
    assert got["trace"] == alone["trace"]
    assert abs(got["error"]) < 0.001
