"""The widget's launch-config export: the ``export`` message writes the current scenario's files into the trait."""

from __future__ import annotations

import json

import yaml

from memsim_widget.export import FORMATS
from memsim_widget.widget import MemSim


def send_export(sim: MemSim, fmt: object) -> dict:
    """What the front end's Export button sends; returns the trait after Python answered."""
    sim._handle_custom_msg({"type": "export", "format": fmt}, [])
    return sim.export


def test_the_trait_offers_every_format_before_any_request() -> None:
    sim = MemSim(charts_js=False)
    assert sim.export["formats"] == list(FORMATS)
    assert sim.export["id"] == 0 and sim.export["files"] == {}


def test_export_follows_the_current_scenario() -> None:
    sim = MemSim(charts_js=False, precision="amp-bf16", micro_batch_size=3, grad_accum_steps=5)
    sim.set(parallel={"dp": 4, "zero": 2})
    state = send_export(sim, "deepspeed")
    assert state["id"] == 1 and state["format"] == "deepspeed" and state["error"] == ""
    ds = json.loads(state["files"]["ds_config.json"])
    assert ds["zero_optimization"]["stage"] == 2
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (3, 5)
    assert state["files"] == sim.export_config("deepspeed")
    sim.set(method="lora", lora={"rank": 64})
    setup = yaml.safe_load(send_export(sim, "hf")["files"]["model_setup.yaml"])
    assert setup["lora"]["r"] == 64 and sim.export["id"] == 2


def test_a_refusal_or_a_bad_format_is_shown_not_raised() -> None:
    sim = MemSim(charts_js=False, method="lora")
    state = send_export(sim, "torchtitan")
    assert state["files"] == {} and state["error"].startswith("method: cannot be exported to torchtitan")
    state = send_export(sim, None)
    assert state["id"] == 2 and state["error"].startswith("format:") and "deepspeed" in state["error"]
    assert sim.error == ""  # the scenario itself stays valid
