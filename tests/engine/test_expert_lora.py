"""LoRA on the fused routed experts as peft 0.21.2 applies it: the checkpoint's expert names (Mixtral w1/w3/w2,
Qwen3-MoE and DeepSeek gate_proj/up_proj/down_proj, the router's ``gate``) and ``all-linear`` become
``target_parameters`` on transformers 5.24's fused ``gate_up_proj`` (twice the rank: two names fused), ``down_proj``
and the router weight; each forward folds the adapter into a merged weight that the matmul saves with its input
(engine/activations/mlp.expert_lora; the traces are in tests/trace/test_expert_lora_trace.py)."""

from __future__ import annotations

import pytest
from fidelity_cases import MIXTRAL, QWEN3_MOE, QWEN3_MOE_MIXED

from memsim_widget import Scenario
from memsim_widget.engine.context import Context
from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.plan import SearchSpace, plan

#: Qwen3-30B-A3B: h 2048, 48 layers of 128 experts (8 per token) of width 768, 32 query and 4 kv heads of 128
QWEN = "qwen3-30b-a3b"
H, L, E, I, R = 2048, 48, 128, 768, 16


def lora(targets: list[str], model: object = QWEN, **keys: object) -> dict:
    return {
        "model": model,
        "method": "lora",
        "precision": "bf16",
        "micro_batch_size": 1,
        "seq_len": 2048,
        "lora": {"rank": R if model == QWEN else 8, "targets": targets},
        **keys,
    }


def test_all_linear_adapts_the_attention_the_experts_and_the_router_at_pefts_ranks() -> None:
    """q, k, v, o as Linears; gate_up_proj at rank 2r over E experts ([2r E, h] and [2I, 2r E]), down_proj at r,
    the router's [E, h] weight at r: the parameter count of the trace to the element (Qwen3-30B-A3B)."""
    ctx = Context(Scenario.from_dict(lora(["all-linear"])))
    attention = R * ((H + 4096) + 2 * (H + 512) + (4096 + H))
    experts = 2 * R * E * (H + 2 * I) + R * E * (I + H)
    router = R * (H + E)
    assert ctx.trainable_parameters == L * (attention + experts + router)


def test_expert_names_adapt_the_fused_parameters_and_no_linear_of_the_same_name() -> None:
    """peft moves the names to ``target_parameters``: the dense layer's ``gate_proj``/``up_proj``/``down_proj``
    Linears (``mlp_only_layers``) get no adapter (traced)."""
    d = lora(["q_proj", "gate_proj", "up_proj", "down_proj"], model=QWEN3_MOE_MIXED)
    ranks = {ad.base.name: ad.rank for ad in Context(Scenario.from_dict(d)).adapters}
    assert ranks == {
        "model.layers.*.self_attn.q_proj.weight": 8,
        "model.layers.*.mlp.experts.gate_up_proj": 16,
        "model.layers.*.mlp.experts.down_proj": 8,
    }


def _item(est: object, moment: str, start: str) -> int:
    (m,) = [m for m in est.worst.moments if m.name == moment]  # type: ignore[attr-defined]
    return sum(it.bytes for it in m.items if it.item.startswith(start))


def test_each_layer_saves_the_merged_weights_the_adapter_casts_and_the_routers_input() -> None:
    """Per MoE layer in bf16 with peft's fp32 adapters: the merged gate_up [E, 2I, h] and down [E, h, I], both
    factors of each cast to bf16, the merged router [E, h] and the router's input (T x h); with the down projection
    adapted its input (k x T x I) is saved too, and the gradient of the larger merged weight is made in backward."""
    T, k = 2048, 8
    est = estimate(Scenario.from_dict(lora(["all-linear"])))
    merged = 2 * E * (2 * I * H + H * I)
    casts = 2 * E * (2 * R * (H + 2 * I) + R * (I + H))
    router = 2 * E * H + 2 * T * H
    assert _item(est, "forward_end", "LoRA on the fused experts: merged") == L * (merged + casts + router)
    assert _item(est, "forward_end", "routed experts: down-projection input") == L * 2 * k * T * I
    ckpt = estimate(Scenario.from_dict(lora(["all-linear"], activation_checkpointing="full")))
    assert (
        _item(ckpt, "backward_end", "LoRA on the fused experts: the merged weight's gradient")
        == 2 * E * 2 * I * H
    )


@pytest.mark.parametrize(
    ("model", "targets", "missing"),
    [
        (MIXTRAL, ["q_proj", "w1"], "w1 needs w3"),
        (QWEN3_MOE, ["up_proj", "down_proj"], "up_proj needs gate_proj"),
    ],
)
def test_half_of_a_fused_pair_is_refused_as_peft_refuses_it(
    model: dict, targets: list[str], missing: str
) -> None:
    with pytest.raises(ScenarioError) as err:
        Context(Scenario.from_dict(lora(targets, model=model)))
    assert err.value.field == "lora.targets" and missing in err.value.message


@pytest.mark.parametrize(
    "change",
    [
        {"precision": "amp-bf16"},
        {"precision": "fp32"},
        {"method": "qlora"},
        {"parallel": {"tp": 2}},
        {"parallel": {"dp": 2, "ep": 2}},
        {"activation_checkpointing": "selective"},
        {"compile": True},
    ],
)
def test_what_no_trace_covers_is_refused_naming_the_targets(change: dict) -> None:
    """bf16 only (grouped_mm takes bf16; autocast or a mixed recipe would save cast copies no trace showed), no
    QLoRA, tp = ep = cp = 1, no or full checkpointing, eager: otherwise one error on ``lora.targets`` that names
    the Linear modules allowed; the same change with attention targets alone is not refused on that field."""
    with pytest.raises(ScenarioError) as err:
        Context(Scenario.from_dict(lora(["q_proj", "w1", "w2", "w3"], model=MIXTRAL, **change)))
    assert err.value.field == "lora.targets" and "q_proj" in err.value.message.split("only:")[1]
    try:
        Context(Scenario.from_dict(lora(["q_proj", "v_proj"], model=MIXTRAL, **change)))
    except ScenarioError as other:
        assert other.field != "lora.targets"


@pytest.mark.parametrize("ckpt", ["none", "full"])
def test_adapting_more_of_the_experts_never_lowers_the_peak(ckpt: str) -> None:
    peaks = [
        estimate(Scenario.from_dict(lora(t, activation_checkpointing=ckpt))).peak_allocated_bytes
        for t in (
            ["q_proj", "v_proj"],
            ["q_proj", "v_proj", "down_proj"],
            ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"],
            ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj", "gate"],
        )
    ]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def test_a_plan_lists_what_estimate_gives() -> None:
    """The planner's figures for LoRA on the experts are ``estimate``'s, byte for byte, over its layouts (the
    expert-parallel ones refused by the rule above, never listed)."""
    p = plan(
        base=lora(["all-linear"], model=QWEN3_MOE, seq_len=512),
        gpu="rtx-4090",
        gpus=(1, 2),
        space=SearchSpace(micro_batch=(1, 2)),
        top=10,
    )
    assert p.mismatches() == []
    assert all(p.scenario(int(i)).parallel.ep == 1 for i in p.ranking[: p.top])
