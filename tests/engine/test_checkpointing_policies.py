"""Checkpointing policies frameworks run: torchtitan's per-op selective policy (``selective-op``) and full
checkpointing of every N-th layer (``checkpoint_every``). Expected bytes are written from the model's
dimensions, not read from the engine.
"""

from __future__ import annotations

import fidelity_cases
import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.plan import SearchSpace, plan
from memsim_widget.scenario import Scenario
from memsim_widget.trace.traceable import trace_kwargs

#: h=256, I=688, 8 heads of d=32 (a*d=256), 4 kv heads (kv*d=128), 4 layers, V=1000.
LLAMA = fidelity_cases.LLAMA  # h=256, I=688, 8 heads, 4 kv heads, 4 layers, V=1000, untied
B, S, H, I, HQ, HKV, HEADS, LAYERS = 2, 256, 256, 688, 256, 128, 8, 4
T = B * S


def _at(data: dict, moment: str = "forward_end") -> int:
    est = estimate({"model": LLAMA, "micro_batch_size": B, "seq_len": S, **data})
    return next(m.tensor_bytes for m in est.worst.moments if m.name == moment)


def test_selective_op_keeps_every_other_matmul_and_the_sdpa_outputs_per_layer():
    """Llama runs 7 bias-free mm per layer (q, k, v, o, gate, up, down): the 1st, 3rd, 5th and 7th are kept."""
    mm = 2 * T * (HQ + HKV + I + H)  # q_proj, v_proj, gate_proj, down_proj outputs, bf16
    sdpa = 2 * T * HQ + 4 * B * HEADS * S  # the attention output and its fp32 logsumexp
    full = _at({"activation_checkpointing": "full"})
    op = _at({"activation_checkpointing": "selective-op"})
    assert op - full == LAYERS * (mm + sdpa)


def test_selective_op_item_names_the_matmuls_it_keeps():
    est = estimate(
        {"model": LLAMA, "micro_batch_size": B, "seq_len": S, "activation_checkpointing": "selective-op"}
    )
    end = next(m for m in est.worst.moments if m.name == "forward_end")
    item = next(i for i in end.items if i.item == "selective-op: outputs of every other matmul")
    assert "q_proj, v_proj, gate_proj, down_proj" in item.formula


def test_linears_with_a_bias_run_addmm_and_are_not_counted():
    """Qwen2's q, k and v carry a bias: the mm are o, gate, up, down, so o and up are kept."""
    qwen = {**LLAMA, "model_type": "qwen2"}
    data = {"model": qwen, "micro_batch_size": B, "seq_len": S}
    full = estimate({**data, "activation_checkpointing": "full"}).worst.moments[0].tensor_bytes
    op = estimate({**data, "activation_checkpointing": "selective-op"}).worst.moments[0].tensor_bytes
    assert op - full == LAYERS * (2 * T * (H + I) + 2 * T * HQ + 4 * B * HEADS * S)


def test_every_second_layer_keeps_half_the_layers_whole():
    none, full = _at({}), _at({"activation_checkpointing": "full"})
    every2 = _at({"activation_checkpointing": "full", "checkpoint_every": 2})
    assert 2 * every2 == none + full
    assert _at({"activation_checkpointing": "full", "checkpoint_every": 1}) == full
    assert _at({"activation_checkpointing": "full", "checkpoint_every": 8}) == none, "no layer is the 8th"


@pytest.mark.parametrize("policy", [{"activation_checkpointing": "selective-op"},
                                    {"activation_checkpointing": "full", "checkpoint_every": 2}])  # fmt: skip
def test_each_policy_saves_between_full_checkpointing_and_none(policy):
    for moment in ("forward_end", "backward_start"):
        assert _at({"activation_checkpointing": "full"}, moment) < _at(policy, moment) < _at({}, moment)


def test_checkpoint_every_is_validated_and_stays_out_of_files_when_unset():
    with pytest.raises(ScenarioError) as info:
        Scenario(checkpoint_every=2)
    assert info.value.field == "checkpoint_every" and "'full'" in str(info.value)
    with pytest.raises(ScenarioError) as info:
        Scenario(activation_checkpointing="full", checkpoint_every=0)
    assert info.value.field == "checkpoint_every"
    assert "checkpoint_every" not in Scenario().to_dict()
    sc = Scenario(activation_checkpointing="full", checkpoint_every=2)
    assert sc.to_dict()["checkpoint_every"] == 2 and Scenario.from_json(sc.to_json()) == sc
    with pytest.raises(ScenarioError) as info:
        Scenario(activation_checkpointing="selectiv-op")
    assert "selective-op" in str(info.value)


def test_planner_tries_selective_op():
    assert "selective-op" in SearchSpace().checkpointing
    p = plan(
        "llama-3.1-8b", "h100-sxm-80gb", 8, seq_len=8192, space=SearchSpace(checkpointing=("selective-op",))
    )
    assert set(p.frame.activation_checkpointing) == {"selective-op"}
    assert p.estimate(0).scenario.activation_checkpointing == "selective-op"


def test_megatron_refuses_the_torchtitan_policy_and_its_planner_skips_it():
    with pytest.raises(ScenarioError) as info:
        Scenario(framework="megatron", activation_checkpointing="selective-op")
    assert info.value.field == "activation_checkpointing"
    p = plan("llama-3.1-8b", "h100-sxm-80gb", 8, seq_len=4096, framework="megatron")
    assert "selective-op" not in set(p.all_frame().activation_checkpointing)


def test_trace_arguments_per_policy():
    assert "layer_checkpointing" not in trace_kwargs(Scenario(activation_checkpointing="full"))
    assert trace_kwargs(Scenario(activation_checkpointing="selective-op"))["layer_checkpointing"] == (
        "selective-op",
        1,
    )
    kw = trace_kwargs(Scenario(activation_checkpointing="full", checkpoint_every=2))
    assert kw["layer_checkpointing"] == ("full", 2) and kw["gradient_checkpointing"] is False


@pytest.mark.slow
def test_wrapping_every_layer_traces_like_hf_gradient_checkpointing():
    pytest.importorskip("transformers")
    from memsim_widget.trace.hf import trace_hf

    kw = {"micro_batch_size": 1, "seq_len": 128}
    hf = trace_hf(dict(LLAMA), gradient_checkpointing=True, **kw)
    ours = trace_hf(dict(LLAMA), layer_checkpointing=("full", 1), **kw)
    assert (ours.peak_bytes, ours.phase_peaks) == (hf.peak_bytes, hf.phase_peaks)


@pytest.mark.parametrize("name", ["llama bf16 selective-op b2 s512", "llama bf16 ckpt every 2 b2 s512"])
@pytest.mark.slow
def test_engine_within_one_percent_of_the_trace(name):
    pytest.importorskip("transformers")
    from fidelity_cases import CASES, compare

    r = compare(name, dict(CASES)[name])
    assert abs(r["error"]) < 0.01, r
