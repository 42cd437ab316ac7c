"""The routed experts in the allocation stream as transformers 5.24.0 holds them: one fused tensor per projection
and MoE layer (``Qwen3MoeExperts`` / ``MixtralExperts``: ``gate_up_proj`` [E, 2I, h], ``down_proj`` [E, h, I]),
[E/ep, ...] on a rank of expert parallelism (``states/budget.fused_experts``), so that the step's expert
gradients, AdamW states and foreach temporaries are a few large tensors, as the trace's, not E small ones each."""

from __future__ import annotations

import pytest
from fidelity_cases import QWEN3_MOE_MIXED, SMALL

from memsim_widget import Scenario
from memsim_widget.engine.caches.parts_cache import cached_activation_groups
from memsim_widget.engine.context import Context
from memsim_widget.engine.counters.alloc_stream import grad_order, tensor_sizes
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


#: Qwen3-MoE E=64 under LoRA on q and v, rank 16 (frozen experts)
LORA = {"method": "lora", "lora": {"rank": 16, "targets": ["q_proj", "v_proj"]}}


@pytest.mark.slow
@pytest.mark.parametrize(
    "d",
    [{"model": qwen3_moe(8)}, {"model": qwen3_moe(128)}, {"model": mixtral(8)}, {"model": mixtral(64)}],
    ids=["qwen3_moe-E8", "qwen3_moe-E128", "mixtral-E8", "mixtral-E64"],
)
def test_the_moe_stream_replays_to_its_traces_peak_reserved(d: dict) -> None:
    """The engine's stream reaches the trace's peak reserved within 1% (per-expert tensors: +5.06%, +4.84%,
    +4.54%, +13.53%; fused: +0.23%, +0.12%, -0.76%, -0.16%; the fused gate_up output and the routed terms' own
    tensor sizes: -0.23%, -0.12%, -0.76%, -0.16%) and its peak allocated within 0.5%."""
    pytest.importorskip("transformers")
    from stream_vs_trace import figures

    f = figures({**TRAIN, **d}, traced_only=True)
    assert abs(f["stream_traced_only"] / f["trace"] - 1) < 0.01
    assert abs(f["stream_traced_only_allocated"] / f["trace_allocated"] - 1) < 0.005


@pytest.mark.slow
def test_the_moe_lora_stream_is_not_under_its_trace() -> None:
    """Frozen experts under LoRA: the stream's peak reserved is the trace's to within 1%, not under (per-expert
    tensors -0.73%; fused -1.46%, its 2 MiB routed tensors written as three equal ones per term; with each term's
    own tensor sizes 0.00%)."""
    pytest.importorskip("transformers")
    from stream_vs_trace import figures

    f = figures({**TRAIN, "model": qwen3_moe(64), **LORA}, traced_only=True)
    assert 0 <= f["stream_traced_only"] / f["trace"] - 1 < 0.01
    assert abs(f["stream_traced_only_allocated"] / f["trace_allocated"] - 1) < 0.005


def _layer_tensors(d: dict, name: str) -> list[int]:
    """The bytes of each tensor one layer's ``name`` term saves in the stream (one layer's share: ``own``)."""
    ctx = Context(Scenario.from_dict(d))
    own = cached_activation_groups(ctx, ctx.stages[0])["own"].entries
    return tensor_sizes([i for i in own if i.item == name])


def test_a_moe_layer_saves_its_fused_gate_up_output_and_its_down_output_as_the_trace_does() -> None:
    """Qwen3-MoE E=64 under LoRA, T = 2 x 512 tokens, k=2: 2048 routed rows of h=512, I=256, bf16, as the trace
    keeps them. grouped_mm's fused gate_up output [2048, 2I] is one tensor (gate and up are its views), act(gate)
    [2048, I] another; the router's fp32 probabilities over E (not its logits), the down output [2048, h] and
    grouped_mm's indices (32 B a row under LoRA: four of 8 B) one tensor each. As three equal tensors per term
    the stream wrote its 2 MiB tensors as 1 MiB and 0.8 MiB ones, in the small pool: -1.46% of the trace's
    reserved (now 0.00%)."""
    d = {**TRAIN, "model": qwen3_moe(64), **LORA}
    rows, h, I, T, E = 2048, 512, 256, 1024, 64
    assert _layer_tensors(d, "routed experts: activation internals (swiglu)") == [
        2 * rows * 2 * I,
        2 * rows * I,
    ]
    assert _layer_tensors(d, "routed experts: router (softmax) and routed token copies") == [
        4 * T * E,  # fp32 probabilities
        2 * rows * h,  # the down output, kept by the routing-weight multiply
        *[8 * rows] * 4,  # int64 indices
    ]


def test_a_hybrid_stacks_layers_make_each_groups_gradients_once() -> None:
    """Qwen3-MoE of 4 layers with its experts at layer 1 alone (sparse step 2, mlp_only_layers [3]): 32 experts of
    I=128 (gate_up [32, 256, 256], down [32, 256, 128]) in one layer, the dense MLP (688) in three. Each layer's
    backward makes a quarter of the experts' elements and three quarters of the dense MLP's, so that the step
    makes every gradient once: whole tensors per layer, it made the fused experts' four times (16.0 M elements for
    6.0 M)."""
    ctx = Context(Scenario.from_dict({**TRAIN, "model": QWEN3_MOE_MIXED}))
    stage = ctx.stages[0]
    order = grad_order(ctx, stage)
    total = sum(lg.numel for lg in local_groups(ctx, stage))
    assert sum(order.top) + stage.layers * sum(order.layer) + sum(order.bottom) == total
    assert 32 * 256 * 256 // 4 in order.layer and 688 * 256 * 3 // 4 in order.layer
