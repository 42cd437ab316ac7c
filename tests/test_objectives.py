"""Preference and RL objectives: the scenario keys, the engine's extra models and loss terms, and the training
step held within 3% of a fake-tensor trace of TRL's loop (``trace/objectives.py``)."""

from __future__ import annotations

import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.fidelity import LLAMA, OBJECTIVE_CASES
from memsim_widget.scenario import Scenario

BASE = {"model": LLAMA, "micro_batch_size": 2, "seq_len": 512}


def test_sft_is_the_default_and_unchanged():
    plain = Scenario.from_dict(BASE)
    explicit = Scenario.from_dict({**BASE, "objective": "sft"})
    assert "objective" not in plain.to_dict() and "rl" not in plain.to_dict()
    assert estimate(plain).to_dict()["peak_tensor_bytes"] == estimate(explicit).to_dict()["peak_tensor_bytes"]
    assert estimate(plain).to_dict()["breakdown"] == estimate(explicit).to_dict()["breakdown"]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"objective": "rlhf"}, "objective"),
        ({"rl": {"num_generations": 4}}, "rl"),
        ({"objective": "grpo", "rl": {"num_generations": 0}}, "rl.num_generations"),
        ({"objective": "grpo", "rl": {"completion_len": 512}}, "rl.completion_len"),
        ({"objective": "dpo", "rl": {"reference": "shared_base"}}, "rl.reference"),
        ({"objective": "orpo", "rl": {"reference": "gpu"}}, "rl.reference"),
        ({"objective": "dpo", "rl": {"reference": "none"}}, "rl.reference"),
        ({"objective": "dpo", "rl": {"rollout": "vllm_colocate"}}, "rl.rollout"),
        ({"objective": "grpo", "rl": {"gpu_memory_utilization": 1.5}}, "rl.gpu_memory_utilization"),
        ({"objective": "grpo", "rl": {"sleep_mode": 3}}, "rl.sleep_mode"),
        ({"objective": "grpo", "rl": {"num_generation": 4}}, "rl.num_generation"),
    ],
)
def test_bad_objective_keys_name_the_field(data, field):
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict({**BASE, **data})
    assert err.value.field == field


def test_objective_round_trips_through_json():
    sc = Scenario.from_dict(
        {**BASE, "objective": "grpo", "rl": {"num_generations": 4, "completion_len": 256}}
    )
    again = Scenario.from_json(sc.to_json())
    assert again == sc and again.to_dict()["rl"]["num_generations"] == 4
    assert sc.replace(rl={"num_generations": 2}).rl_config.completion_len == 256


def test_dpo_doubles_the_sequences_and_adds_a_reference():
    sft = estimate({**BASE, "micro_batch_size": 4})
    dpo = estimate({**BASE, "objective": "dpo", "rl": {"reference": "precomputed"}})
    ref = estimate({**BASE, "objective": "dpo"})
    # same layers' activations as SFT on 2b sequences; the loss differs (16-bit per-row log-softmax)
    assert dpo.worst.peak_tensor_bytes < sft.worst.peak_tensor_bytes
    assert "reference_forward" in ref.worst.moment_totals()
    ref_w = sum(i.bytes for i in ref.worst.moments[0].items if i.item.startswith("reference model"))
    assert ref_w == 2 * ref.parameters
    shared = estimate({**BASE, "objective": "dpo", "method": "lora", "rl": {"reference": "shared_base"}})
    assert not any(i.item.startswith("reference model") for m in shared.worst.moments for i in m.items)
    offl = estimate({**BASE, "objective": "dpo", "rl": {"reference": "offload"}})
    assert offl.worst.host_bytes == 2 * offl.parameters


def test_grpo_smaller_g_lowers_the_peak():
    peaks = [
        estimate(
            {**BASE, "objective": "grpo", "rl": {"num_generations": g, "completion_len": 256}}
        ).peak_tensor_bytes
        for g in (2, 4, 8)
    ]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


def test_ppo_holds_four_models():
    ppo = estimate({**BASE, "objective": "ppo", "rl": {"completion_len": 256}})
    names = {i.item.split(":")[0] for i in ppo.worst.moments[0].items}
    assert {"value model", "reference model weights (frozen)", "reward model weights (frozen)"} <= names


FAST = [
    "dpo llama V32k bf16 ref gpu b1 s512",
    "dpo llama bf16 ref gpu b2 s512 (V1000: layers dominate)",
    "dpo llama V32k bf16 lora qv ref shared_base b2 s256",
    "orpo llama V32k bf16 b1 s512",
    "grpo llama V32k bf16 G4 C256 b1 s512",
    "grpo llama V32k bf16 lora qv G8 C128 b1 s256",
]


@pytest.mark.parametrize("name", FAST)
def test_objective_step_within_three_percent_of_trace(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memsim_widget.fidelity import compare

    r = compare(name, dict(OBJECTIVE_CASES)[name])
    assert abs(r["error"]) < 0.03, r


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"objective": "kto"}, "objective"),
        ({"objective": "ppo", "rl": {"completion_len": 256}}, "objective"),
        ({"objective": "dpo", "rl": {"reference": "offload"}}, "rl.reference"),
    ],
)
def test_formula_only_objectives_refuse_a_trace(data, field):
    from memsim_widget.trace.api import check_traceable

    with pytest.raises(ScenarioError) as err:
        check_traceable(Scenario.from_dict({**BASE, **data}))
    assert err.value.field == field
