"""Preference and RL objectives: the scenario keys, the engine's extra models and loss terms, and the training
step held within 3% of a fake-tensor trace of TRL's loop (``trace/objectives.py``)."""

from __future__ import annotations

import pytest
from fidelity_cases import LLAMA, OBJECTIVE_CASES

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
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


def test_ppo_value_and_reward_models_are_sequence_classifiers():
    ppo = estimate({**BASE, "objective": "ppo", "rl": {"completion_len": 256}})
    items = {i.item: i.bytes for i in ppo.worst.moments[0].items}
    assert "value model: head weights" not in items and "value model: score head (h x 1)" in items
    assert "reward model weights (frozen): head weights" not in items
    assert items["reference model weights (frozen): head weights"] == items["head weights"]
    # beside a LoRA policy the value model is fully trained (TRL applies PEFT to the policy only)
    lora = estimate({**BASE, "objective": "ppo", "method": "lora", "rl": {"completion_len": 256}})

    def value_states(e):
        return sum(i.bytes for i in e.worst.moments[0].items if i.item == "value model: adamw states")

    assert value_states(lora) == value_states(ppo) > 0


FAST = [
    "dpo llama V32k bf16 ref gpu b1 s512",
    "dpo llama bf16 ref gpu b2 s512 (V1000: layers dominate)",
    "dpo llama V32k bf16 lora qv ref shared_base b2 s256",
    "orpo llama V32k bf16 b1 s512",
    "kto llama V32k bf16 ref gpu b2 s256",
    "kto llama V32k bf16 ref precomputed b2 s256",
    "kto llama V32k bf16 lora qv ref shared_base b2 s256",
    "ppo llama V32k bf16 C256 b2 s512",
    "ppo llama V32k bf16 lora qv (full value model) C256 b2 s512",
    "grpo llama V32k bf16 G4 C256 b1 s512",
    "grpo llama V32k bf16 lora qv G8 C128 b1 s256",
    "grpo llama V32k bf16 G8 C256, 4 completions per micro-batch, s512",
]


@pytest.mark.parametrize("name", FAST)
@pytest.mark.slow
def test_objective_step_within_three_percent_of_trace(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fidelity_cases import compare

    r = compare(name, dict(OBJECTIVE_CASES)[name])
    assert abs(r["error"]) < 0.03, r


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"objective": "dpo", "rl": {"reference": "offload"}}, "rl.reference"),
    ],
)
def test_formula_only_objectives_refuse_a_trace(data, field):
    from memsim_widget.trace.traceable import check_traceable

    with pytest.raises(ScenarioError) as err:
        check_traceable(Scenario.from_dict({**BASE, **data}))
    assert err.value.field == field


# ----- the rollout phase: vLLM's documented arithmetic (formula-only) ------------------------------------------
GRPO = {
    "model": "qwen2.5-1.5b",
    "objective": "grpo",
    "micro_batch_size": 1,
    "seq_len": 1024,
    "method": "lora",
    "gpu": "h100-sxm-80gb",
}


def _grpo(**rl):
    return estimate({**GRPO, "rl": {"num_generations": 8, "completion_len": 512, **rl}})


def _items(est, moment):
    m = next(m for m in est.worst.moments if m.name == moment)
    return {i.item: i.bytes for i in m.items}


def test_kv_cache_blocks_follow_vllm_paged_attention():
    from memsim_widget.engine.rl.rollout import BLOCK_SIZE

    est = _grpo(rollout="vllm_colocate", kv_cache="needed", sleep_mode=1)
    a = est.arch
    per_token = 2 * a.num_layers * a.num_kv_heads * a.head_dim * 2  # K and V, every layer, 16-bit
    seqs = 1 * 8 * 1  # micro-batch prompts x G x grad_accum_steps
    blocks = seqs * -(-1024 // BLOCK_SIZE)
    assert (
        _items(est, "rollout_generate")["vLLM KV cache (blocks needed) (generating)"]
        == blocks * 16 * per_token
    )


def test_gpu_memory_utilization_is_the_engines_whole_budget():
    """vLLM: budget = utilization x card; KV cache = budget - weights - activation peak - CUDA graphs."""
    est = _grpo(rollout="vllm_colocate", gpu_memory_utilization=0.4)
    items = _items(est, "rollout_generate")
    engine = sum(v for k, v in items.items() if k.startswith("vLLM"))
    budget = 0.4 * est.gpu.memory_bytes
    assert budget - 2 * 16 * 28672 <= engine <= budget  # within one block of the budget
    assert items["vLLM weights (bf16) (generating)"] == 2 * est.parameters
    assert (
        _grpo(rollout="vllm_colocate", gpu_memory_utilization=0.2).peak_allocated_bytes
        < est.peak_allocated_bytes
    )


def test_sleep_mode_frees_the_engine_during_the_training_step():
    awake = _grpo(rollout="vllm_colocate", sleep_mode=0)
    lvl1 = _grpo(rollout="vllm_colocate", sleep_mode=1)
    lvl2 = _grpo(rollout="vllm_colocate", sleep_mode=2)
    t_awake, t_lvl1, t_lvl2 = (e.phases()["training"]["allocated_bytes"] for e in (awake, lvl1, lvl2))
    assert t_awake > t_lvl1 == t_lvl2
    # level 1 keeps the weights in host RAM, level 2 discards them; only the CUDA graphs stay on the GPU
    assert lvl1.worst.host_bytes - lvl2.worst.host_bytes == 2 * lvl1.parameters
    assert any(i.item == "vLLM CUDA graphs (kept asleep)" for i in lvl1.worst.moments[0].items)
    assert (
        _grpo(rollout="vllm_colocate", sleep_mode=1, cuda_graphs=False).phases()["training"][
            "allocated_bytes"
        ]
        < t_lvl1
    )


def test_peak_is_the_larger_phase_and_both_are_reported():
    for rl in ({"rollout": "vllm_colocate"}, {"rollout": "vllm_colocate", "sleep_mode": 1}):
        est = _grpo(**rl)
        phases = est.phases()
        assert set(phases) == {"training", "rollout"}
        assert est.peak_allocated_bytes == max(p["allocated_bytes"] for p in phases.values())
        assert est.to_dict()["phases"] == phases
        assert set(est.phase_frame["phase"]) == {"training", "rollout"}


def test_a_separate_rollout_group_leaves_the_training_gpus_alone():
    sep = _grpo(rollout="vllm_separate", gpu_memory_utilization=0.9)
    none = _grpo()
    assert sep.peak_allocated_bytes == none.peak_allocated_bytes
    assert sep.phases()["rollout_group"]["allocated_bytes"] <= 0.9 * sep.gpu.memory_bytes


def test_a_utilization_too_low_for_the_weights_is_flagged():
    est = estimate(
        {**GRPO, "model": "llama-3.1-8b", "rl": {"rollout": "vllm_colocate", "gpu_memory_utilization": 0.1}}
    )
    assert any("would not start" in c for c in est.caveats)


def test_cli_estimate_shows_both_phases(capsys):
    import json

    from memsim_widget.cli import main

    flags = [
        "estimate",
        "--model",
        "qwen2.5-1.5b",
        "--objective",
        "grpo",
        "--method",
        "lora",
        "--seq-len",
        "1024",
    ]
    flags += ["--completion-len", "512", "--rollout", "vllm_colocate", "--gpu-memory-utilization", "0.3"]
    assert main([*flags, "--sleep-mode", "1"]) == 0
    text = capsys.readouterr().out
    assert "rollout phase at rollout_generate" in text and "training phase at forward_end" in text
    assert "<- peak" in text
    assert main([*flags, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["phases"]) == {"training", "rollout"} and out["scenario"]["objective"] == "grpo"


def test_recommend_knows_the_levers_of_rl_jobs():
    from memsim_widget.plan.recommend import levers

    grpo = Scenario.from_dict(
        {
            **GRPO,
            "rl": {
                "num_generations": 8,
                "completion_len": 512,
                "rollout": "vllm_colocate",
                "reference": "gpu",
            },
        }
    )
    found = levers(grpo)
    assert {"generations", "reference", "gpu_memory_utilization", "sleep_mode", "rollout"} <= set(found)
    refs = {o.changes["rl.reference"] for o in found["reference"]}
    assert refs == {"shared_base", "offload"}
    dpo = levers(Scenario.from_dict({**BASE, "objective": "dpo"}))
    assert {o.changes["rl.reference"] for o in dpo["reference"]} == {"precomputed", "offload"}
    assert "reference" not in levers(Scenario.from_dict({**BASE, "objective": "orpo"}))


def test_recommend_fixes_a_colocated_grpo_run():
    from memsim_widget.plan.recommend import recommend

    rec = recommend(
        {
            **GRPO,
            "model": "llama-3.1-8b",
            "seq_len": 2048,
            "rl": {
                "num_generations": 16,
                "completion_len": 1024,
                "rollout": "vllm_colocate",
                "gpu_memory_utilization": 0.5,
            },
        }
    )
    assert not rec.fits and rec.changes and all(c.fits for c in rec.changes)
    assert any("rl.rollout" in c.changes or "rl.sleep_mode" in c.changes for c in rec.changes)
    assert rec.max_seq_len is None or rec.max_seq_len > 1024


def test_the_layout_search_refuses_an_objective_it_does_not_model():
    from memsim_widget.plan.search import plan

    with pytest.raises(ScenarioError) as err:
        plan(base={**BASE, "objective": "grpo", "rl": {"completion_len": 256}}, gpus=2)
    assert err.value.field == "objective"


def test_export_refuses_an_objective_it_cannot_write():
    from memsim_widget.export import export

    with pytest.raises(ScenarioError) as err:
        export({**BASE, "objective": "dpo"}, "hf")
    assert err.value.field == "objective"


def test_kv_block_arithmetic_matches_a_vllm_startup_log():
    """vllm-project/vllm#12330 (Llama 3 8B, A100 40 GB, gpu_memory_utilization 0.9): "the rest of the memory
    reserved for KV Cache is 11.12GiB" and "# GPU blocks: 5691": 16-token blocks of 2 x 32 layers x 8 kv heads x
    128 x 2 B per token."""
    from memsim_widget.engine.context import Context
    from memsim_widget.engine.rl.rollout import BLOCK_SIZE, kv_bytes_per_token

    ctx = Context(Scenario.from_dict({"model": "llama-3.1-8b"}))
    per_token = kv_bytes_per_token(ctx)
    assert per_token == 2 * 32 * 8 * 128 * 2
    blocks = int(11.12 * 2**30) // (BLOCK_SIZE * per_token)
    assert abs(blocks - 5691) <= 3  # the log rounds the GiB to two decimals


def test_grpo_groups_can_split_over_micro_batches():
    """TRL's per_device_train_batch_size counts completions: G = 8 split 4 per micro-batch trains like 4 whole."""
    split = estimate(
        {
            **BASE,
            "objective": "grpo",
            "rl": {"num_generations": 8, "completion_len": 256, "completions_per_micro_batch": 4},
        }
    )
    whole = estimate(
        {
            **BASE,
            "micro_batch_size": 1,
            "objective": "grpo",
            "rl": {"num_generations": 4, "completion_len": 256},
        }
    )
    assert split.peak_tensor_bytes == whole.peak_tensor_bytes
    with pytest.raises(ScenarioError) as err:
        Scenario.from_dict({**BASE, "objective": "dpo", "rl": {"completions_per_micro_batch": 4}})
    assert err.value.field == "rl.completions_per_micro_batch"
    from memsim_widget.plan.recommend import levers

    opt = levers(Scenario.from_dict({**BASE, "objective": "grpo", "rl": {"completion_len": 256}}))[
        "completions"
    ][0]
    assert opt.changes == {"rl.completions_per_micro_batch": 8, "grad_accum_steps": 2}


def test_a_multimodal_model_refuses_preference_objectives_naming_the_field() -> None:
    with pytest.raises(ScenarioError, match=r"objective: 'dpo' is not modelled for the multimodal 'llava'"):
        estimate(Scenario.from_dict({"model": "llava-1.5-7b", "objective": "dpo"}))
