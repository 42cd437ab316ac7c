"""Expert parallelism over dp x cp and folded over the TP group (Megatron-Core's MoE parallel folding,
transformers' expert parallelism on the TP group): accepted, experts whole where EP takes the TP group."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.engine.states.budget import local_groups
from memsim_widget.errors import ScenarioError
from memsim_widget.scenario import ParallelConfig, Scenario


@pytest.mark.parametrize(
    ("par", "etp"),
    [
        ({"tp": 2, "ep": 2}, 1),  # transformers: experts spread over the 2 TP GPUs, each whole
        ({"tp": 2, "dp": 16, "ep": 32}, 1),  # Qwen3-235B-A22B recipe: EP 32 folds over tp 2 x dp 16
        ({"tp": 4, "ep": 2}, 2),  # EP takes 2 of the 4 TP GPUs; experts split by the other 2
        ({"tp": 2, "dp": 4, "ep": 4}, 2),  # EP inside dp: experts split by tp as before
        ({"tp": 8}, 8),
    ],
)
def test_expert_tp_is_what_ep_leaves_of_the_tp_group(par, etp):
    assert ParallelConfig(**par).expert_tp == etp


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_ep_is_accepted_exactly_when_it_divides_dp_cp_tp(dp, tp, ep):
    ok = (dp * tp) % ep == 0
    try:
        par = ParallelConfig(dp=dp, tp=tp, ep=ep)
    except ScenarioError as e:
        assert not ok and e.field == "parallel.ep" and f"dp*cp*tp = {dp * tp}" in str(e)
    else:
        assert ok and tp % par.expert_tp == 0


def _experts(data: dict) -> int:
    ctx = Context(Scenario.from_dict(data))
    return sum(g.numel for g in local_groups(ctx, ctx.stages[0]) if g.group.expert)


def test_folded_experts_are_whole_and_hold_the_same_share_of_expert_weights():
    model = "qwen3-30b-a3b"
    all_experts = _experts({"model": model})
    # ep 2 over the TP group: half the experts, whole; tp 2 alone: every expert, halved; same bytes
    assert _experts({"model": model, "parallel": {"tp": 2, "ep": 2}}) == all_experts // 2
    assert _experts({"model": model, "parallel": {"tp": 2}}) == all_experts // 2
    assert _experts({"model": model, "parallel": {"tp": 2, "dp": 16, "ep": 32}}) == all_experts // 32


def test_published_moe_layouts_are_accepted():
    estimate(Scenario.from_dict({"model": "qwen3-30b-a3b", "parallel": {"tp": 2, "ep": 2}}))
    big = {"tp": 2, "dp": 16, "ep": 32, "zero": 3}
    estimate(Scenario.from_dict({"model": "qwen3-235b-a22b", "parallel": big}))
