"""The widget's "open a config" (files uploaded as text, read by memsim_widget.importers) and the Verify panel's
"Measure on this GPU" (offered only where a CUDA GPU is likely; never on this CPU-only test machine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memsim_widget.widget import MemSim
from memsim_widget.widget.import_panel import MAX_FILES, cuda_likely

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"


def make() -> MemSim:
    return MemSim({"gpu": "a100-80gb"}, charts_js=False)


def upload(sim: MemSim, *files: tuple[str, str]) -> dict[str, Any]:
    sim._on_front_msg(
        None, {"type": "import_config", "files": [{"name": n, "text": t} for n, t in files]}, None
    )
    return sim.config_import


def test_an_uploaded_config_becomes_the_scenario_and_lists_what_it_does_not_say() -> None:
    sim = make()
    state = upload(sim, ("8B_lora.yaml", (DATA / "torchtune" / "8B_lora.yaml").read_text()))
    assert state["error"] == "" and state["files"] == ["8B_lora.yaml"] and state["id"] == 1
    sc = sim.scenario
    assert (sc.model, sc.method, sc.micro_batch_size, sc.framework) == (
        "llama-3.1-8b",
        "lora",
        2,
        "torchtune",
    )
    assert sc.to_dict()["gpu"] == "a100-80gb"  # no launch config names the card: the widget's is kept
    assert any(line.startswith("seq_len (8B_lora.yaml)") for line in state["unread"])
    assert any("[set by the widget's GPU]" in line for line in state["unread"])


def test_a_config_and_its_deepspeed_json_upload_together() -> None:
    sim = make()
    lf = (DATA / "llamafactory" / "llama3_lora_sft_ds3.yaml").read_text()
    ds = (DATA / "deepspeed" / "ds_z3_config.json").read_text()
    state = upload(sim, ("llama3_lora_sft_ds3.yaml", lf), ("ds_z3_config.json", ds))
    assert state["error"] == ""
    assert (sim.scenario.parallel.zero, sim.scenario.framework) == (3, "deepspeed")


def test_an_uploaded_model_config_stays_inline(tiny_llama: dict) -> None:
    sim = make()
    upload(sim, ("ax.yaml", "base_model: ./\nmicro_batch_size: 2\n"), ("config.json", json.dumps(tiny_llama)))
    assert sim.config_import["error"] == ""
    assert dict(sim.scenario.model)["hidden_size"] == tiny_llama["hidden_size"]  # not a deleted temp path


def test_a_bad_upload_is_shown_as_one_line_and_the_scenario_stays() -> None:
    sim = make()
    before = sim.scenario
    state = upload(sim, ("ax.yaml", "base_model: x\nmicro_batch_size: -3\n"))
    assert state["error"] == "ax.yaml: micro_batch_size: must be an integer >= 1, got -3"
    assert sim.scenario == before
    for content in ({"type": "import_config", "files": []},
                    {"type": "import_config", "files": [{"name": "../", "text": ""}]},
                    {"type": "import_config", "files": [{"name": f"{i}.yaml", "text": ""} for i in range(MAX_FILES + 1)]}):  # fmt: skip
        sim._on_front_msg(None, content, None)
        assert sim.config_import["error"].startswith("files: ")
    assert sim.scenario == before


def test_memsim_import_config_reads_paths() -> None:
    sim = make()
    unread = sim.import_config(DATA / "axolotl" / "qlora-1b.yml")
    assert sim.scenario.method == "qlora" and any(line.startswith("parallel.dp") for line in unread)


@pytest.mark.skipif(cuda_likely(), reason="a CUDA GPU is likely here")
def test_measure_is_not_offered_without_a_gpu() -> None:
    sim = make()
    assert sim.measure["available"] is False
    sim._on_front_msg(None, {"type": "measure"}, None)
    assert sim.measure["state"] == "error" and "no CUDA GPU" in sim.measure["error"]
