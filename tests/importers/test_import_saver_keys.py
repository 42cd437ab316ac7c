"""The frameworks' own keys for the memory savers and LoRA's reach, read from files (the round trip in
test_roundtrip.py covers what memsim writes; these are files a user wrote, with the frameworks' defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memsim_widget.errors import ScenarioError
from memsim_widget.export import export
from memsim_widget.importers import import_config


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_an_older_torchtitan_toml_steps_in_backward_by_its_key(tmp_path: Path) -> None:
    text = "[model]\nname = 'llama3'\nflavor = '8B'\n[optimizer]\nname = 'AdamW'\nearly_step_in_backward = true\n"
    assert import_config(_write(tmp_path, "job.toml", text)).scenario.optimizer_in_backward is True


@pytest.mark.parametrize(
    ("extra", "offloaded"), [("", True), ("disable_gradient_checkpointing: true\n", False)]
)
def test_llamafactory_offloads_through_unsloth_checkpointing_only(
    tmp_path: Path, extra: str, offloaded: bool
) -> None:
    """use_unsloth_gc replaces the checkpoint function: without checkpointing nothing is offloaded."""
    text = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nuse_unsloth_gc: true\n" + extra
    assert import_config(_write(tmp_path, "lf.yaml", text)).scenario.activation_offloading is offloaded


@pytest.mark.parametrize(
    ("keys", "scope"),
    [("", "language"), ("freeze_vision_tower: false\nfreeze_multi_modal_projector: false\n", "model")],
)
def test_llamafactory_lora_on_a_vlm_skips_the_frozen_tower_by_default(
    tmp_path: Path, keys: str, scope: str
) -> None:
    text = "model_name_or_path: llava-hf/llava-1.5-7b-hf\nstage: sft\nfinetuning_type: lora\n" + keys
    assert import_config(_write(tmp_path, "lf.yaml", text)).scenario.lora.target_scope == scope


def test_peft_exclude_modules_reads_as_the_language_scope(tmp_path: Path) -> None:
    sc = {
        "model": "qwen2-vl-2b",
        "method": "lora",
        "lora": {"targets": ["q_proj"], "target_scope": "language"},
    }
    files = export(sc, "axolotl")
    [name] = [n for n in files if n.endswith(".yaml")]
    # the regex covers the tower and the merger, and no language-model module
    assert "visual\\\\.blocks" in files[name] or "visual\\.blocks" in files[name]
    assert import_config(_write(tmp_path, name, files[name])).scenario.lora.target_scope == "language"


def test_llamafactory_refuses_offloading_without_full_checkpointing() -> None:
    with pytest.raises(ScenarioError) as err:
        export({"activation_offloading": True, "activation_checkpointing": "none"}, "llamafactory")
    assert err.value.field == "activation_offloading"
