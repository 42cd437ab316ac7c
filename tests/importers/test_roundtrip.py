"""Export -> import: every file ``memsim export`` writes reads back to the same scenario and the same peak, for a
grid of scenarios per format; and the keys each reader takes from the files alone (memsim's note ignored) are the
scenario's own values, so the round trip does not rest on the note.

The grid varies method, precision, ZeRO stage and offload, micro-batch, accumulation, sequence, checkpointing
and GPU count; a combination the format refuses to export is skipped (the writers' refusals are tested in
tests/test_export.py), and each format must keep at least ``MIN_PER_FORMAT`` scenarios. The scenario's framework
is the one the file runs under (an export to another framework says in its note that its peak differs).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from memsim_widget.engine.core import estimate
from memsim_widget.errors import ScenarioError
from memsim_widget.export import FORMATS, export
from memsim_widget.importers import import_config, read_files, scenario_dict
from memsim_widget.scenario import Scenario

MIN_PER_FORMAT = 6
#: The framework each format's files run under, per the scenario's layout (export/hf.py ``uses_deepspeed``).
RUNS_AS = {"torchtune": "torchtune", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}
#: Models each format can name (torchtune and torchtitan export presets of their own recipe tables only).
MODELS = {"torchtune": "llama-3.2-1b", "torchtitan": "qwen3-0.6b"}


def _framework(fmt: str, sc: dict[str, Any]) -> str:
    if fmt in RUNS_AS:
        return RUNS_AS[fmt]
    p = sc.get("parallel", {})
    return "deepspeed" if p.get("zero") in (1, 2) or sc["precision"].startswith("mixed-") else "hf"


def grid(fmt: str) -> list[dict[str, Any]]:
    """Scenarios over the knobs every format maps, each with the format's framework."""
    out = []
    methods = ("full",) if fmt == "torchtitan" else ("full", "lora", "qlora")
    precisions = ("bf16", "amp-bf16", "mixed-bf16", "fp32")
    layouts = ({"dp": 1, "zero": 0}, {"dp": 4, "zero": 2, "offload": "optimizer"}, {"dp": 8, "zero": 3},
               {"dp": 2, "zero": 3, "offload": "optimizer+params", "reshard_after_forward": False},
               {"dp": 4, "zero": 1})  # fmt: skip
    shapes = ((1, 1, 1024, "none"), (4, 8, 2048, "full"))
    for method, prec, layout, (mb, acc, seq, ckpt) in itertools.product(methods, precisions, layouts, shapes):
        sc: dict[str, Any] = {
            "model": MODELS.get(fmt, "llama-3.2-1b"),
            "method": method,
            "precision": prec,
            "micro_batch_size": mb,
            "grad_accum_steps": acc,
            "seq_len": seq,
            "activation_checkpointing": ckpt,
            "parallel": dict(layout),
        }
        if method != "full":
            # torchtune's adapters take the model's dtype (export/torchtune.py notes it)
            sc["lora"] = {"rank": 16, "alpha": 32, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"],
                          "adapter_dtype": "bf16" if fmt == "torchtune" and prec == "bf16" else "fp32"}  # fmt: skip
        if fmt in ("llamafactory", "torchtune"):
            sc["padding"] = "longest"  # their collators pad each batch to its longest sample
        sc["framework"] = _framework(fmt, sc)
        out.append(sc)
    return out + [{**out[0], **extra} for extra in EXTRAS.get(fmt, [])]


_SCOPES = ("model", "language")


def _VLM_LORA(scope: str) -> dict[str, Any]:  # noqa: N802 - read as a constant
    """LoRA on a multimodal model with ``lora.target_scope`` ``scope`` (the tower and projector with or without
    adapters: peft's exclude_modules, axolotl's lora_exclude_modules, LLaMA-Factory's freeze_* keys)."""
    return {"method": "lora", "lora": {"rank": 16, "alpha": 32, "targets": ["q_proj", "v_proj"],
                                       "target_scope": scope}}  # fmt: skip


#: Knobs only some formats have a key for, each on the grid's first scenario.
EXTRAS: dict[str, list[dict[str, Any]]] = {
    "torchtitan": [
        {"parallel": {"dp": 2, "zero": 3, "tp": 2, "sequence_parallel": True}},
        {"parallel": {"dp": 2, "zero": 3, "cp": 2}},
        {"parallel": {"pp": 2, "pp_microbatches": 4, "pp_schedule": "gpipe"}},
        {"parallel": {"pp": 2, "pp_microbatches": 4, "pp_schedule": "interleaved", "virtual_stages": 2}},
        {"activation_checkpointing": "selective-op", "loss": "chunked", "compile": True, "optimizer_impl": "fused"},
        {"compile": True, "compile_loss": False},  # compile.components = ["model"]
        {"model": "qwen3-30b-a3b", "parallel": {"dp": 8, "zero": 3, "ep": 8}},
    ],
    "deepspeed": [{"parallel": {"dp": 2, "zero": 1, "tp": 2}, "precision": "mixed-bf16"},
                  {"parallel": {"dp": 2, "zero": 2, "overlap_comm": True, "reduce_bucket_size": "auto"},
                   "precision": "mixed-bf16"},
                  {"parallel": {"dp": 4, "zero": 1, "reduce_bucket_size": 20_000_000}, "precision": "mixed-bf16"}],
    "torchtune": [{"optimizer_in_backward": True}, {"loss": "chunked", "activation_offloading": True},
                  {"optimizer_in_backward": True, "activation_offloading": True, "compile": True,
                   "activation_checkpointing": "full"}],
    "axolotl": [{"loss": "chunked", "activation_offloading": True, "attention": "eager"},
                {"parallel": {"dp": 2, "tp": 2, "zero": 3}, "precision": "bf16"},
                {"compile": True}, *({"model": "qwen2-vl-2b", **_VLM_LORA(scope)} for scope in _SCOPES)],
    "hf": [{"compile": True}, *({"model": "qwen2-vl-2b", **_VLM_LORA(scope)} for scope in _SCOPES)],
    "llamafactory": [{"compile": True}, {"activation_checkpointing": "full", "activation_offloading": True},
                     *({"model": "llava-1.5-7b", **_VLM_LORA(scope)} for scope in _SCOPES)],
}  # fmt: skip


def _exported(fmt: str, sc: dict[str, Any], folder: Path) -> list[Path] | None:
    """The export's files written to ``folder`` (None: the format refuses the scenario)."""
    try:
        files = export(sc, fmt)
    except ScenarioError:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return [folder / n for n in files if not n.endswith(".memsim.txt")]


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_exported_file_reads_back_to_the_same_scenario_and_peak(fmt: str, tmp_path: Path) -> None:
    done = 0
    for n, sc in enumerate(grid(fmt)):
        paths = _exported(fmt, sc, tmp_path / str(n))
        if paths is None:
            continue
        done += 1
        want = Scenario.from_dict(sc)
        got = import_config(paths).scenario
        assert got.to_dict() == want.to_dict(), (fmt, sc)
        assert estimate(got).peak_allocated_bytes == estimate(want).peak_allocated_bytes
        # the files' own keys, memsim's note ignored, are the scenario's values
        reading = read_files(paths)
        own = _flat(scenario_dict(reading, use_note=False))
        expected = _flat(want.to_dict())
        wrong = {k: (own[k], expected[k]) for k in reading.values if k in expected and own[k] != expected[k]}
        assert wrong == {}, (fmt, sc)
    assert done >= MIN_PER_FORMAT, f"{fmt}: only {done} scenarios of the grid exported"


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_export_without_its_note_lists_what_it_could_not_read(fmt: str, tmp_path: Path) -> None:
    """The files alone (the note's line removed) still import, and the unread list names the GPU and more."""
    sc = next(s for s in grid(fmt) if _exported(fmt, s, tmp_path / "probe") is not None)
    paths = _exported(fmt, sc, tmp_path / "bare")
    assert paths is not None
    for p in (tmp_path / "bare").iterdir():
        if p.name.endswith(".memsim.txt"):
            p.unlink()
        else:
            p.write_text("".join(line for line in p.read_text().splitlines(keepends=True)
                                 if "Scenario JSON (memsim" not in line))  # fmt: skip
    imported = import_config(paths)
    assert any(line.startswith("gpu ") for line in imported.unread)
    assert all("memsim's note" not in line for line in imported.unread)


@pytest.mark.parametrize(
    ("parallel", "read"),
    [
        ({"pp": 4, "pp_microbatches": 4}, None),  # even: torchtitan told 0/0 less layers, memsim's default
        ({"pp": 4, "pp_microbatches": 4, "pp_split": "torchtitan"}, "torchtitan"),  # 8/9/8/7: 1/1, said
        (
            {"pp": 3, "pp_microbatches": 3},
            None,
        ),  # 32 layers on 3: torchtitan's split is memsim's default there
    ],
)
def test_a_torchtitan_pipeline_split_reads_back(
    parallel: dict[str, Any], read: str | None, tmp_path: Path
) -> None:
    sc = {"model": "llama-3.1-8b", "framework": "torchtitan", "parallel": parallel}
    paths = _exported("torchtitan", sc, tmp_path)
    assert paths is not None
    # the file's own keys (memsim's note set aside) say the split
    assert scenario_dict(read_files(paths, "auto"), use_note=False)["parallel"].get("pp_split") == read
    got = import_config(paths).scenario
    assert got.to_dict() == Scenario.from_dict(sc).to_dict()
    assert estimate(got).peak_allocated_bytes == estimate(Scenario.from_dict(sc)).peak_allocated_bytes
