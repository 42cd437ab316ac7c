"""The routed experts in the allocation stream as transformers 5.24.0 holds them: one fused tensor per projection
and MoE layer (``Qwen3MoeExperts`` / ``MixtralExperts``: ``gate_up_proj`` [E, 2I, h], ``down_proj`` [E, h, I]),
[E/ep, ...] on a rank of expert parallelism (``states/budget.fused_experts``), so that the step's expert
gradients, AdamW states and foreach temporaries are a few large tensors, as the trace's, not E small ones each."""

from __future__ import annotations

import pytest
from fidelity_cases import SMALL

from memsim_widget import Scenario
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import grad_order
from memsim_widget.engine.states.budget import local_groups

#: Two MoE layers of h=512 with the real 32k vocabulary (its loss buffers), bf16 full training with foreach AdamW
TRAIN = {
    "micro_batch_size": 2,
    "seq_len": 512,
    "precision": "bf16",
    "optimizer": "adamw",
    "reserved_model": "replay",
}


def qwen3_moe(experts: int) -> dict:
    return {
        "model_type": "qwen3_moe",
        **SMALL,
        "hidden_size": 512,
        "num_hidden_layers": 2,
        "head_dim": 64,
        "vocab_size": 32000,
        "num_experts": experts,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
        "norm_topk_prob": True,
    }


def mixtral(experts: int) -> dict:
    return {
        "model_type": "mixtral",
        **SMALL,
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_hidden_layers": 2,
        "vocab_size": 32000,
        "num_local_experts": experts,
        "num_experts_per_tok": 2,
    }


def _experts(d: dict) -> list[tuple[str, int, tuple[int, ...]]]:
    ctx = Context(Scenario.from_dict(d))
    return [
        (lg.group.name.rsplit(".", 1)[-1], lg.count, lg.shape)
        for lg in local_groups(ctx, ctx.stages[0])
        if lg.group.expert
    ]


def test_a_rank_holds_one_fused_expert_tensor_per_projection_and_layer() -> None:
    """Qwen3-MoE, 2 layers of 8 experts (I=256, h=512): 2 gate_up tensors [8, 512, 512] and 2 down tensors
    [8, 512, 256]; under ep=2 each rank's are [4, ...] (half the experts, whole)."""
    d = {**TRAIN, "model": qwen3_moe(8)}
    assert _experts(d) == [("gate_up_proj", 2, (8, 512, 512)), ("down_proj", 2, (8, 512, 256))]
    ep = {**d, "parallel": {"dp": 2, "ep": 2}}
    assert _experts(ep) == [("gate_up_proj", 2, (4, 512, 512)), ("down_proj", 2, (4, 512, 256))]


def test_mixtral_lists_its_experts_as_transformers_5_fuses_them() -> None:
    """Mixtral's w1 and w3 are one ``gate_up_proj`` [E, 2I, h] in transformers 5, w2 ``down_proj`` [E, h, I]."""
    assert _experts({**TRAIN, "model": mixtral(8)}) == [
        ("gate_up_proj", 2, (8, 2048, 512)),
        ("down_proj", 2, (8, 512, 1024)),
    ]


def test_the_stream_makes_each_layers_expert_gradients_as_two_tensors() -> None:
    """Backward's per-layer gradient tensors (``grad_order``): q, k, v, o, the q/k norms, the router, the two
    fused expert tensors and the two layer norms: 11, whatever the number of experts."""
    for e in (8, 64):
        ctx = Context(Scenario.from_dict({**TRAIN, "model": qwen3_moe(e)}))
        order = grad_order(ctx, ctx.stages[0])
        assert len(order.layer) == 11
        assert 2 * e * 256 * 512 in order.layer and e * 512 * 256 in order.layer


@pytest.mark.slow
@pytest.mark.parametrize(
    "model",
    [qwen3_moe(8), qwen3_moe(128), mixtral(8), mixtral(64)],
    ids=["qwen3_moe-E8", "qwen3_moe-E128", "mixtral-E8", "mixtral-E64"],
)
def test_the_moe_stream_replays_to_its_traces_peak_reserved(model: dict) -> None:
    """The engine's stream reaches the trace's peak reserved within 1% (per-expert tensors: +5.06%, +4.84%,
    +4.54%, +13.53%; fused: +0.23%, +0.12%, -0.76%, -0.16%) and its peak allocated within 0.5%."""
    pytest.importorskip("transformers")
    from stream_vs_trace import figures

    f = figures({**TRAIN, "model": model}, traced_only=True)
    assert abs(f["stream_traced_only"] / f["trace"] - 1) < 0.01
    assert abs(f["stream_traced_only_allocated"] / f["trace_allocated"] - 1) < 0.005
