"""The widget's objective controls and phase chart (issue 16 item 4)."""

from __future__ import annotations

from memsim_widget.scenario import RLConfig
from memsim_widget.widget import MemSim
from memsim_widget.widget.scenario_edits import merge


def make(**kwargs) -> MemSim:
    return MemSim(charts_js=False, **kwargs)


def test_picking_an_objective_fills_its_knobs_and_the_phase_chart():
    sim = make()
    assert "phases" not in sim.charts
    assert sim.options["disabled"]["rl.num_generations"].startswith("applies to objective")
    sim.scenario_data = merge(
        sim.scenario_data, {"objective": "grpo", "model": "qwen2.5-1.5b", "method": "lora"}
    )
    assert sim.error == "", sim.error
    assert sim.scenario_data["rl"] == {**RLConfig().to_dict(), "reference": None}
    assert "phases" in sim.charts and "rl.num_generations" not in sim.options["disabled"]
    assert sim.options["disabled"]["rl.sleep_mode"].startswith("sleep mode applies")
    sim.scenario_data = merge(sim.scenario_data, {"rl": {"rollout": "vllm_colocate"}})
    assert sim.error == "" and "rl.sleep_mode" not in sim.options["disabled"]
    layers = sim.charts["phases"]["layer"]
    phases = {r["phase"].split(" ")[0] for r in layers[2]["data"]["values"]}
    assert phases == {"training", "rollout"}
    assert set(sim.result.get("caveats", [])) >= {
        "rollout phase: formula-only, vLLM's documented arithmetic (engine/rl/rollout.py)"
    }


def test_back_to_sft_drops_the_rl_block():
    sim = make()
    sim.set(objective="dpo")
    assert sim.scenario.objective == "dpo" and "rl" in sim.scenario_data
    sim.scenario_data = merge(sim.scenario_data, {"objective": None})
    assert sim.error == "" and "rl" not in sim.scenario_data and "phases" not in sim.charts


def test_an_objective_switch_resets_what_no_longer_applies():
    sim = make(scenario={"objective": "grpo", "seq_len": 2048, "rl": {"rollout": "vllm_colocate"}})
    sim.scenario_data = merge(sim.scenario_data, {"objective": "dpo"})
    assert sim.error == "", sim.error
    assert sim.scenario.rl_config.rollout == "none"
    sim.scenario_data = merge(sim.scenario_data, {"objective": "grpo", "seq_len": 512})
    assert sim.error == "" and sim.scenario.rl_config.completion_len < 512


def test_a_bad_rl_value_names_its_field():
    sim = make(scenario={"objective": "grpo"})
    sim.scenario_data = merge(sim.scenario_data, {"rl": {"gpu_memory_utilization": 2}})
    assert sim.error_field == "rl.gpu_memory_utilization"
