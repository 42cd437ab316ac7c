"""Real example configs from the frameworks' own example folders (tests/data/configs, sources in its README) read
without error, to the values their keys say; what they leave to the launch or the script is listed as unread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memsim_widget.importers import import_config

DATA = Path(__file__).resolve().parents[1] / "data" / "configs"

#: file(s) -> scenario keys the files set, read off the files by hand (dotted keys).
EXPECTED: dict[tuple[str, ...], dict[str, Any]] = {
    ("axolotl/lora-1b.yml",): {
        "model": "llama-3.2-1b", "method": "lora", "lora.rank": 16, "lora.alpha": 32, "seq_len": 2048,
        "padding": "packed", "micro_batch_size": 2, "grad_accum_steps": 2, "optimizer": "adamw-8bit",
        "precision": "bf16", "activation_checkpointing": "full",
    },
    ("axolotl/qlora-1b.yml",): {
        "model": "llama-3.2-1b", "method": "qlora", "lora.rank": 32, "lora.alpha": 16, "micro_batch_size": 2,
        "grad_accum_steps": 4, "optimizer": "adamw-8bit", "attention": "sdpa",
    },
    ("axolotl/fft-8b-fsdp.yml",): {
        "model": "llama-3.1-8b", "method": "full", "seq_len": 8192, "parallel.zero": 3, "parallel.offload": "none",
        "optimizer": "adam", "optimizer_impl": "foreach", "padding": "longest",
    },
    ("llamafactory/llama3_lora_sft.yaml",): {
        "model": "llama-3.1-8b", "method": "lora", "lora.rank": 8, "lora.alpha": 16, "lora.targets": ["all-linear"],
        "seq_len": 2048, "padding": "longest", "micro_batch_size": 1, "grad_accum_steps": 8, "precision": "bf16",
        "lora.adapter_dtype": "fp32", "activation_checkpointing": "full",
    },
    ("llamafactory/llama3_lora_sft_ds3.yaml", "deepspeed/ds_z3_config.json"): {
        "model": "llama-3.1-8b", "method": "lora", "parallel.zero": 3, "framework": "deepspeed", "grad_accum_steps": 2,
        "micro_batch_size": 1,
    },
    ("torchtune/8B_lora.yaml",): {
        "model": "llama-3.1-8b", "method": "lora", "lora.targets": ["q_proj", "v_proj"], "lora.rank": 8,
        "lora.alpha": 16, "micro_batch_size": 2, "grad_accum_steps": 32, "loss": "chunked", "precision": "bf16",
        "optimizer_impl": "fused", "activation_checkpointing": "none", "framework": "torchtune",
    },
    ("torchtune/8B_full.yaml",): {
        "model": "llama-3.1-8b", "method": "full", "micro_batch_size": 2, "optimizer_impl": "for-loop",
        "activation_checkpointing": "full", "loss": "standard",
    },
    ("torchtitan/llama3_8b.toml",): {
        "model": "llama-3.1-8b", "micro_batch_size": 1, "seq_len": 8192, "parallel.zero": 3,
        "activation_checkpointing": "selective-op", "optimizer": "adamw", "framework": "torchtitan",
    },
    ("accelerate/fsdp.yaml",): {
        "parallel.dp": 2, "parallel.zero": 3, "precision": "amp-bf16", "parallel.offload": "none",
    },
    ("accelerate/deepspeed.yaml", "accelerate/zero_stage1_config.json"): {
        "parallel.dp": 2, "parallel.zero": 1, "precision": "mixed-fp16", "optimizer": "adamw",
        "optimizer_impl": "foreach", "framework": "deepspeed", "parallel.overlap_comm": True,
        "parallel.reduce_bucket_size": "auto",
    },
    ("deepspeed/ds_z2_offload_config.json",): {
        "parallel.zero": 2, "parallel.offload": "optimizer",  # overlap_comm false, 5e8: the defaults, unset
    },
    ("hf/zephyr-sft-qlora.yaml",): {
        "model": "mistral-7b", "method": "qlora", "lora.rank": 16, "lora.alpha": 16, "seq_len": 2048,
        "micro_batch_size": 4, "grad_accum_steps": 2, "activation_checkpointing": "full", "precision": "bf16",
        "attention": "sdpa",
    },
}  # fmt: skip


def _get(d: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d


@pytest.mark.parametrize("files", list(EXPECTED), ids=lambda f: f[0])
def test_a_real_example_config_reads_to_what_its_keys_say(files: tuple[str, ...]) -> None:
    imported = import_config([DATA / f for f in files])
    got = imported.scenario.to_dict()
    assert {k: _get(got, k) for k in EXPECTED[files]} == EXPECTED[files]
    assert any(line.startswith("gpu ") for line in imported.unread)  # no launch config names the card


def test_every_example_file_is_covered() -> None:
    listed = {f for files in EXPECTED for f in files}
    present = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"}
    assert present - listed == set()
